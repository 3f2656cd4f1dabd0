"""Honest-kernel emulations (fp32 math, output rounded to the output dtype) on verification value sets,
HEAD's inputs.py against a2a25d8's, judged by verify.Budget/compare. usage: emulate2.py SPEC N_SEEDS"""
import math
import sys
import torch
import torch.nn.functional as F
from runner.spec.spec import load_spec
from runner.judge import inputs as head
from runner.judge.verify import Budget, compare
from runner.ops.reference import decode_attention
sys.path.insert(0, "/tmp/rv58/review")
import inputs_a2a25d8 as old

spec = load_spec(sys.argv[1]); op = spec.op; name = spec.name
nseeds = int(sys.argv[2])


def honest(inp):
    if name.startswith("layernorm"):  # two-pass fp32: mean, centred variance, then the output
        x, w, b = inp["x"], inp["w"], inp["b"]
        m = x.mean(-1, keepdim=True); c = x - m
        r = torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-5)
        return (c * r * w + b).float()
    q, k, v, lens = (inp[n] for n in ("q", "k", "v", "lens"))  # decode attention: fp32 math, bf16 out
    B, HQ, D = q.shape; L, HKV = k.shape[1], k.shape[2]; g = HQ // HKV
    s = torch.einsum("bhgd,blhd->bhgl", q.float().view(B, HKV, g, D), k.float()) / math.sqrt(D)
    keep = torch.arange(L)[None, :] < lens.long()[:, None]
    p = torch.softmax(s.masked_fill(~keep[:, None, None, :], float("-inf")), -1)
    vf = torch.where(keep[:, :, None, None], v.float(), 0.0)
    return torch.einsum("bhgl,blhd->bhgd", p, vf).reshape(B, HQ, D).to(q.dtype)


def ref(inp):
    d = {n: (t.double() if t.is_floating_point() else t) for n, t in inp.items()}
    if name.startswith("layernorm"):
        return F.layer_norm(d["x"], (d["x"].shape[-1],), d["w"], d["b"], 1e-5)
    return decode_attention(d["q"], d["k"], d["v"], d["lens"])


shapes = [dict(s) for s in op.all_shapes]
if not name.startswith("layernorm"):
    shapes = [{"B": 4, "L": 2048}, {"B": 1, "L": 8192}]
res = {}
for mod, tag in ((old, "a2a25d8"), (head, "HEAD")):
    for shape in shapes:
        for seed in range(nseeds):
            for rnd in range(4):
                inp = mod.make_inputs(op, shape, 3000 + seed, rnd, "cpu", structured=True, outliers=True,
                                      subnormal=True)
                r, o = ref(inp), honest(inp)
                bud = Budget(r, op.atol, op.rtol, o.dtype, op.ulps, op.floor)
                ok, why, _ = compare(o, r, op.atol, op.rtol, bound=bud)
                n, f = res.get(tag, (0, 0))
                res[tag] = (n + 1, f + (not ok))
                if not ok:
                    print(tag, shape, seed, rnd, why[:200])
for k in res:
    print(name, k, "evaluated %d wrong %d" % res[k])
