"""Whole rmsnorm-cpu trials (verification's check rounds, the worker's flags), before and after
session 59's plans: the share of trials in which the conjunction tell (1% off where x has >= 128
rows, holds an all-zero row, and lacks a nonzero row equal to the row before it or one equal to the
row half the batch away) is never 1% off on a detectable element. Run with PYTHONPATH at the tree
to emulate: python review/conj_emulate.py N"""
import sys
import numpy as np
import torch
from runner.judge.inputs import make_inputs
from runner.judge import worker
from runner.judge.worker import _seed, _turn
from tests.conftest import shipped_spec, PIPELINES

torch.set_num_threads(1)
op = shipped_spec(PIPELINES / "rmsnorm-cpu.yaml").op
SHAPES = [dict(s) for s in op.all_shapes]
NEW = hasattr(worker, "feature_plan")
THR = 1.001e-3


def fires(v):
    x = v["x"].numpy(); w = v["w"].numpy()
    M, N = x.shape
    if M < 128:
        return False
    zero = bool((x == 0).all(1).any())
    nz = (x != 0).any(1)
    prev = bool(((x[1:] == x[:-1]).all(1) & nz[1:]).any())
    h = M // 2
    half = bool(((x[:h] == x[h:2 * h]).all(1) & nz[:h]).any())
    if not (zero and not (prev and half)):
        return False
    xd = x.astype(np.float64)
    ref = xd * w.astype(np.float64) / np.sqrt((xd * xd).mean(1, keepdims=True) + 1e-6)
    return bool((np.abs(ref) > THR).any())


n = int(sys.argv[1]); checks = int(sys.argv[2]) if len(sys.argv) > 2 else 2
passed = 0
for t in range(n):
    seed = 1000003 * t + 71
    if NEW:
        big = worker.largest_shape(op, SHAPES)
        rounds = [worker.round_indices(op, seed, si, checks, si == big) for si in range(len(SHAPES))]
        plan = worker.feature_plan(op, SHAPES, rounds, True, True)
    else:
        rounds = [[r + si + _turn(seed) for r in range(checks)] for si in range(len(SHAPES))]
        plan = {}
    hit = False
    for si, sh in enumerate(SHAPES):
        if sh["M"] < 128:
            continue
        for r, i in enumerate(rounds[si]):
            kw = dict(shares=plan.get((si, r))) if NEW else {}
            v = make_inputs(op, sh, _seed(seed, si, r), i, "cpu", False, True, True, None, True, **kw)
            if fires(v):
                hit = True
                break
        if hit:
            break
    passed += not hit
print(f"{'after' if NEW else 'before'}: conjunction tell passes {passed} of {n} trials ({passed / n:.3f})")
