"""Emulate test_moe_runner::test_a_kernel_wrong_only_on_routings_with_no_single_row_group_is_caught:
P(no verified value set of a trial has 2 <= live < E experts with every group >= 2 rows)."""
import sys, torch
from runner.spec.spec import load_spec
from runner.judge import inputs, domain
from runner.judge.worker import _seed, _turn
from tests.conftest import PIPELINES
sp = load_spec(PIPELINES / "moe-cpu.yaml"); op = sp.op
print("shapes", op.shapes, "extra", op.extra_shapes, "checks", sp.runtime.checks)
def tell(offs, E=4):
    ends = offs.tolist(); s = 0; live = 0; least = 1 << 30
    for e in ends:
        c = e - s; s = max(s, e)
        if c > 0: live += 1; least = min(least, c)
    return live >= 2 and live < E and least >= 2
N = int(sys.argv[1]); miss = 0; miss_v = 0; per_shape = {}
for t in range(N):
    seed = 1000003 * t + 17; dseed = 7 * t + 5
    shapes = list(op.shapes) + list(op.extra_shapes)
    n_timed = len(op.shapes)
    draws = domain.draws(op, lambda sh: True, dseed)
    allsh = shapes + draws
    hit_v = False
    for si, sh in enumerate(allsh):
        for r in range(sp.runtime.checks):
            ins = inputs.make_inputs(op, sh, _seed(seed, si, r), r + si + _turn(seed), "cpu")
            if tell(ins["offs"]): hit_v = True
    hit_t = False
    for si in range(n_timed):
        for k in (0, 1):
            ins = inputs.make_inputs(op, allsh[si], _seed(seed, si, "timing", k), k + si, "cpu", timed=True)
            if tell(ins["offs"]): hit_t = True
    miss_v += not hit_v; miss += not (hit_v or hit_t)
    if t < 3: print(allsh)
print(f"trials {N}: verification misses {miss_v} ({miss_v/N:.4f}); verification+timed misses {miss} ({miss/N:.4f})")
