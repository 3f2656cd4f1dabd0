"""The ledger: the append-only SQLite record of a run, the run folder around it
(locks, checks, run.json's summary) and what a run's verdicts depend on
(provenance)."""
