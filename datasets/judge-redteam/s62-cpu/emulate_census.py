"""Over many of the judge's value sets (make_inputs with every feature on, and timed ones), count
the rows of x that are bf16-exact with more than 5 significant bits (bf16_row_tell), w vectors so
(bf16_w_tell), all-zero rows holding a -0.0 (negzero_tell); and for moe-cpu, value sets where half
the rows of x or more have a bitwise twin in another expert's group (moe_topk_twin_tell).
Usage: /tmp/rt62/.venv/bin/python redteam/emulate_census.py [SEEDS]"""
import sys, torch
from runner.spec.spec import load_spec
from runner.judge import inputs as I
n = int(sys.argv[1]) if len(sys.argv) > 1 else 200

def bf16_rows(x):
    b = x.contiguous().view(torch.int32)
    lo = (b & 0xFFFF) == 0
    mid = (b & 0x70000) != 0
    return (lo.all(-1) & mid.any(-1))

spec = load_spec("pipelines/rmsnorm-cpu.yaml"); op = spec.op
hits = {"x_rows": 0, "w": 0, "negzero_rows": 0}; rows = sets = 0
for seed in range(n):
    for shape in [{"M": 7, "N": 33}, {"M": 3, "N": 1000}, {"M": 64, "N": 256}]:
        for kw in (dict(structured=True, subnormal=True, outliers=True), dict(timed=True), dict(shares=(None, None, None, None, True))):
            v = I.make_inputs(op, shape, seed, seed % 4, "cpu", **kw)
            x, w = v["x"], v["w"]
            hits["x_rows"] += int(bf16_rows(x).sum()); hits["w"] += int(bf16_rows(w[None]).sum())
            b = x.view(torch.int32)
            hits["negzero_rows"] += int((((b & 0x7FFFFFFF) == 0).all(-1) & (b < 0).any(-1)).sum())
            rows += x.shape[0]; sets += 1
print(f"rmsnorm-cpu: {sets} value sets, {rows} rows: {hits}")

spec = load_spec("pipelines/moe-cpu.yaml"); op = spec.op
tw = 0; sets = 0
for seed in range(n):
    for T in (3, 16, 37):
        for kw in (dict(structured=True, subnormal=True, outliers=True), dict(timed=True)):
            v = I.make_inputs(op, {"T": T}, seed, seed % 4, "cpu", **kw)
            x, offs = v["x"], v["offs"].tolist()
            R = x.shape[0]; grp = []
            s = 0
            for e, end in enumerate(offs):
                grp += [e] * (end - s); s = max(s, end)
            keys = [bytes(x[r].contiguous().view(torch.int16).numpy().tobytes()) for r in range(R)]
            twins = sum(any(q != r and grp[q] != grp[r] and keys[q] == keys[r] for q in range(R)) for r in range(R))
            tw += 2 * twins >= R and R >= 4; sets += 1
print(f"moe-cpu: {sets} value sets, sets with half the rows twinned across groups: {tw}")
