"""False positives: honest fp32 rmsnorm-cpu kernels (ACC=1: one sequential chain; ACC=32: 32 strided
partial sums, then summed in order) on whole trials' verification value sets at HEAD (round_indices,
feature_plan with the worker's flags), held to verify.compare with the spec's Budget.
python review/fp_emulate.py N [CHECKS]"""
import sys
import numpy as np
import torch
import torch.nn.functional as F
from runner.judge.inputs import make_inputs
from runner.judge import worker
from runner.judge.worker import _seed
from runner.judge.verify import Budget, compare
from tests.conftest import shipped_spec, PIPELINES

torch.set_num_threads(1)
op = shipped_spec(PIPELINES / "rmsnorm-cpu.yaml").op
SHAPES = [dict(s) for s in op.all_shapes]


def honest(x, w, acc):
    M, N = x.shape
    full = N // acc * acc
    parts = np.zeros((M, acc), np.float32)
    for i in range(0, full, acc):
        parts += x[:, i:i + acc] * x[:, i:i + acc]
    s = np.zeros(M, np.float32)
    for j in range(acc):
        s += parts[:, j]
    for i in range(full, N):
        s += x[:, i] * x[:, i]
    r = np.float32(1) / np.sqrt(s / np.float32(N) + np.float32(1e-6), dtype=np.float32)
    return torch.from_numpy((x * r[:, None]).astype(np.float32) * w)


n = int(sys.argv[1]); checks = int(sys.argv[2]) if len(sys.argv) > 2 else 2
sets = wrong = 0
for t in range(n):
    seed = 7777 * t + 1
    big = worker.largest_shape(op, SHAPES)
    rounds = [worker.round_indices(op, seed, si, checks, si == big) for si in range(len(SHAPES))]
    plan = worker.feature_plan(op, SHAPES, rounds, True, True)
    for si, sh in enumerate(SHAPES):
        for r, i in enumerate(rounds[si]):
            v = make_inputs(op, sh, _seed(seed, si, r), i, "cpu", False, True, True, None, True, plan.get((si, r)))
            ref = F.rms_norm(v["x"].double(), (sh["N"],), v["w"].double(), 1e-6)
            for acc in (1, 32):
                o = honest(v["x"].numpy(), v["w"].numpy(), acc)
                ok, why, _ = compare(o, ref, op.atol, op.rtol, bound=Budget(ref, op.atol, op.rtol, o.dtype, op.ulps, op.floor))
                sets += 1
                if not ok:
                    wrong += 1
                    print("WRONG", t, sh, i, acc, plan.get((si, r)), why[:200], flush=True)
print(f"honest fp32 rmsnorm-cpu (ACC 1 and 32): {wrong} wrong of {sets} value-set verdicts over {n} trials")
