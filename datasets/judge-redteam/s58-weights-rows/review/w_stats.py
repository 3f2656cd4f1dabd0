"""Statistics of 1-D weight vectors over verification value sets (make_inputs, structured=True).
usage: w_stats.py SPEC N_SEEDS"""
import sys
import torch
from runner.spec.spec import load_spec
from runner.judge.inputs import make_inputs

spec = load_spec(sys.argv[1]); op = spec.op
n = int(sys.argv[2])
shape = dict(op.all_shapes[0])
small_share, med, zeros, big = [], [], [], []
for seed in range(n):
    for rnd in range(6):
        w = make_inputs(op, shape, 5000 + seed, rnd, "cpu", structured=True, outliers=True)["w"].double()
        if float(w.abs().max()) < 1e-30:  # the `tiny` draw
            continue
        small_share.append(float((w.abs() < 0.25).double().mean()))
        med.append(float(w.abs().median()))
        zeros.append(int((w == 0).sum()))
        big.append(float(w.abs().max()))
print(spec.name, "sets", len(med), "max share |w|<0.25: %.3f" % max(small_share),
      "min median|w|: %.3f" % min(med), "max zeros:", max(zeros), "max |w|: %.3f" % max(big))
# a trained gamma of a model's first layers (most of it below 0.1, the project's notebook): log-normal around 0.05
g = torch.Generator().manual_seed(0)
u = torch.exp(torch.randn(shape["N"], generator=g, dtype=torch.float64) * 0.8) * 0.05
print("layer-0-like gamma: share |w|<0.25 %.3f median %.3f" % (float((u < 0.25).double().mean()), float(u.median())))
