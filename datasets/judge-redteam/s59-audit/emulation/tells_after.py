"""Whole trials of rmsnorm-cpu with session 59's plans (round_indices, feature_plan): for each tell
of emulate_tells.analyse, the share of trials in which no verification value set would show it
(an upper bound: the paired-error route is ignored). Run from the repository root:
PYTHONPATH=. python datasets/judge-redteam/s59-audit/emulation/tells_after.py N [CHECKS]"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from emulate_tells import SHAPES, analyse, op  # noqa: E402

from runner.judge.inputs import make_inputs  # noqa: E402
from runner.judge.worker import _seed, feature_plan, largest_shape, round_indices  # noqa: E402

N = int(sys.argv[1])
CHECKS = int(sys.argv[2]) if len(sys.argv) > 2 else 2  # rmsnorm-cpu's runtime.checks
misses: dict = {}
for t in range(N):
    seed = 1000003 * t + 29
    big = largest_shape(op, SHAPES)
    rounds = [round_indices(op, seed, si, CHECKS, si == big) for si in range(len(SHAPES))]
    plan = feature_plan(op, SHAPES, rounds, True, True)
    hit: dict = {}
    for si, sh in enumerate(SHAPES):
        for r, i in enumerate(rounds[si]):
            v = make_inputs(op, sh, _seed(seed, si, r), i, "cpu", False, True, True, None, True, plan.get((si, r)))
            for k, b in analyse(v).items():
                hit[k] = hit.get(k, False) or b
    for k, b in hit.items():
        misses[k] = misses.get(k, 0) + (not b)
print(f"trials {N}, checks {CHECKS}, shapes {SHAPES}:", {k: f"{m} ({m / N:.4f})" for k, m in misses.items()})
