"""Scale out: a run's trials over several judge workers (slots), one driver keeping the ledger."""
