"""The judge: inputs, verification and timing, run inside an isolated worker.

Nothing here trusts the candidate: the runner makes the inputs, computes the
reference on private float64 copies, poisons outputs and guard bands, checks
every element, checks that inputs were not changed, and times with its own
clock. See JUDGE.md for the hacks this defends against.
"""
