"""The judge: inputs, verification and timing, run inside an isolated worker.

Nothing here trusts the candidate: the runner makes the inputs, puts a
plausible wrong answer in the outputs and a sentinel in their guard bands,
computes the float64 reference only after the candidate is done with those
values (from inputs made again from their seed), checks every element against a
budget scaled to the output, checks that inputs were not changed, caps what the
worker may print, and times with its own clock. See JUDGE.md for the hacks this defends against.
"""
