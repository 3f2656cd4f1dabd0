"""How often the judge's value sets hold two bitwise-equal rows that are not all zero (a user's batch
holds them wherever a token repeats at layer 0, a prompt is batched twice, or a batch is padded
by repeating a row)."""
import torch
from tests.conftest import shipped_spec, PIPELINES
from runner.judge.inputs import make_inputs
spec = shipped_spec(PIPELINES / "rmsnorm-range-cpu.yaml")
op = spec.op
def dup_rows(x):
    r = x.reshape(-1, x.shape[-1])
    nz = r.abs().sum(1) != 0
    r = r[nz]
    return r.shape[0] - torch.unique(r, dim=0).shape[0]
n = hits = 0
for seed in range(300):
    for shape in ({"M": 64, "N": 1024}, {"M": 300, "N": 96}, {"M": 17, "N": 4096}):
        for rnd in range(2):
            for timed in (False, True):
                v = make_inputs(op, shape, 1000 + seed, rnd, "cpu", timed=timed, subnormal=not timed, structured=not timed)
                n += 1; hits += dup_rows(v["x"]) > 0
print(f"value sets with a repeated nonzero row of x: {hits} of {n}")
