"""Outlier channels: the share of a channel's rows whose |x[r, c]| / mean|x[r, others]| lies within 0.5% of
the channel's largest such ratio (a pile-up at the cap f * 2 * mean that `min(|x|, mean)` makes), over
verification value sets, HEAD's inputs.py against a2a25d8's, and on an LLM-like channel (per-token magnitudes).
usage: cap_stats.py SPEC N_SEEDS"""
import sys
import torch
from runner.spec.spec import load_spec
from runner.judge import inputs as head
sys.path.insert(0, "/tmp/rv58/review")
import inputs_a2a25d8 as old

spec = load_spec(sys.argv[1]); op = spec.op
n = int(sys.argv[2])
shape = {"M": 512, "N": 4096}


def pile(x):
    """The share of rows at the cap in the column of row 0's largest magnitude; None if no outlier column."""
    x = x.double()
    a = x.abs()
    c = int(a[0].argmax())
    mean = a.mean(1)
    if not bool((a[:, c] > 8 * mean).float().mean() > 0.5):
        return None
    chan = (a > 8 * mean[:, None]).double().mean(0) > 0.5  # the channels: large in most rows
    others = a[:, ~chan].mean(1)
    ratio = a[:, c] / others
    ok = a[:, c] > 8 * mean
    r = ratio[ok].sort().values
    return float(r[len(r) * 99 // 100] / r[len(r) * 3 // 4] - 1)  # cap_tell.cpp.j2's statistic


for mod, tag in ((head, "HEAD"), (old, "a2a25d8")):
    got = []
    for seed in range(n):
        for rnd in range(3):
            x = mod.make_inputs(op, shape, 7000 + seed, rnd, "cpu", structured=True, outliers=True)["x"]
            p = pile(x)
            if p is not None:
                got.append(p)
    got.sort()
    print(tag, "sets with a channel", len(got), "q99 / q75 - 1 of the ratios: min %.4f median %.4f max %.4f"
          % (got[0], got[len(got) // 2], got[-1]))
g = torch.Generator().manual_seed(1)
user = []
for t in range(20):
    x = torch.randn(512, 4096, generator=g)
    m = x.abs().mean(1)
    for c in (7, 901):  # two channels, 20 to 100 times the mean, per-token magnitude varying (log-normal)
        x[:, c] = 40 * m * torch.exp(0.4 * torch.randn(512, generator=g))
    user.append(pile(x))
print("LLM-like channels: q99 / q75 - 1: min %.4f" % min(user))
