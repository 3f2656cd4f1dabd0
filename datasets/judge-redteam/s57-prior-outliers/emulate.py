"""Honest-kernel emulations on verification value sets with outlier channels vs without.
usage: emulate.py SPEC N_SEEDS [M_CAP]"""
import sys
import numpy as np
import torch
import torch.nn.functional as F
from runner.spec.spec import load_spec
from runner.judge.inputs import make_inputs
from runner.judge.verify import Budget, compare

spec = load_spec(sys.argv[1]); op = spec.op
nseeds = int(sys.argv[2]); mcap = int(sys.argv[3]) if len(sys.argv) > 3 else 64
name = spec.name
DT = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def honest(inp):
    if name.startswith("rmsnorm-cpu"):
        x, w = inp["x"].numpy(), inp["w"].numpy()
        s = np.cumsum(x * x, axis=1, dtype=np.float32)[:, -1]  # ACC=1: one sequential fp32 chain
        r = np.float32(1) / np.sqrt(s / np.float32(x.shape[1]) + np.float32(1e-6), dtype=np.float32)
        return {"out": torch.from_numpy((x * r[:, None]).astype(np.float32) * w)}
    if name.startswith("rmsnorm"):
        x = inp["x"].float(); w = inp["w"].float()
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return {"y": (x * r * w).to(torch.bfloat16)}
    if name.startswith("softmax"):
        return {"y": torch.softmax(inp["x"].float(), -1).to(torch.bfloat16)}
    if name.startswith("cross-entropy"):
        x = inp["logits"].float(); t = inp["targets"]
        m = x.amax(-1); s = torch.exp(x - m[:, None]).sum(-1)
        ok = t != -100; tt = torch.where(ok, t, 0)
        xt = x.gather(1, tt[:, None])[:, 0]
        tmpl = torch.where(ok, (m - xt) + torch.log(s), 0.0)      # the template's formula
        naive = torch.where(ok, (m + torch.log(s)) - xt, 0.0)     # lse - x_t
        return {"loss": tmpl, "loss_naive": naive}
    raise SystemExit("no emulation for " + name)


def ref(inp):
    d = {k: (v.double() if v.is_floating_point() else v) for k, v in inp.items()}
    if name.startswith("rmsnorm"):
        return F.rms_norm(d["x"], (d["x"].shape[-1],), d["w"], 1e-6)
    if name.startswith("softmax"):
        return torch.softmax(d["x"], -1)
    return F.cross_entropy(d["logits"], d["targets"], ignore_index=-100, reduction="none")


out_t = op.outputs[0]

shapes = list(op.all_shapes)
res = {}
for shape in shapes:
    shape = dict(shape)
    first = list(shape)[0]
    shape[first] = min(shape[first], mcap)
    for seed in range(nseeds):
        for rnd in range(6):
            for ol in (False, True):
                inp = make_inputs(op, shape, 1000 + seed, rnd, "cpu", structured=True, outliers=ol)
                dist = op.inputs[0].dists[rnd % len(op.inputs[0].dists)]
                r = ref(inp)
                got = honest(inp)
                for k, o in got.items():
                    b = Budget(r, op.atol, op.rtol, o.dtype, op.ulps, op.floor)
                    ok, why, _ = compare(o, r, op.atol, op.rtol, bound=b)
                    key = (k, ol, dist)
                    n, f = res.get(key, (0, 0))
                    res[key] = (n + 1, f + (not ok))
                    if not ok and (res[key][1] <= 2):
                        print(name, shape, seed, rnd, dist, "outliers" if ol else "plain", k, why[:200])
for k in sorted(res):
    print(name, k, "evaluated %d wrong %d" % res[k])
