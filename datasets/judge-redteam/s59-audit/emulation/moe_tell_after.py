"""moe_tell.py with session 59's plans: round_indices and feature_plan (routing_empty's structure
counted through per trial). P(no verified value set of a trial has 2 <= live < E experts with every
group >= 2 rows). Run from the repository root: PYTHONPATH=. python datasets/judge-redteam/s59-audit/emulation/moe_tell_after.py N"""
import sys

from runner.judge import domain, inputs
from runner.judge.worker import _seed, feature_plan, largest_shape, round_indices
from runner.spec.spec import load_spec
from tests.conftest import PIPELINES

sp = load_spec(PIPELINES / "moe-cpu.yaml")
op = sp.op


def tell(offs, E=4):
    s = live = 0
    least = 1 << 30
    for e in offs.tolist():
        c = e - s
        s = max(s, e)
        if c > 0:
            live += 1
            least = min(least, c)
    return 2 <= live < E and least >= 2


N = int(sys.argv[1])
miss = 0
for t in range(N):
    seed = 1000003 * t + 17
    shapes = list(op.shapes) + list(op.extra_shapes) + domain.draws(op, lambda sh: True, 7 * t + 5)
    big = largest_shape(op, shapes)
    rounds = [round_indices(op, seed, si, sp.runtime.checks, si == big) for si in range(len(shapes))]
    plan = feature_plan(op, shapes, rounds, True, True)
    hit = False
    for si, sh in enumerate(shapes):
        for r, i in enumerate(rounds[si]):
            ins = inputs.make_inputs(op, sh, _seed(seed, si, r), i, "cpu", shares=plan.get((si, r)))
            hit |= tell(ins["offs"])
    miss += not hit
print(f"trials {N}: verification misses {miss} ({miss / N:.4f})")
