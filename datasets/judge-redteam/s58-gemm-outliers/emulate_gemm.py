"""Honest MoE GEMM emulations (bf16 in, fp32 products and sums in several orders, output rounded to
bf16; swiglu in fp32) on verification value sets with the GEMM outlier channels, judged by
verify.GemmBudget/compare as the worker does. usage: emulate_gemm.py SPEC N_SEEDS [SHAPE_JSON]"""
import json
import sys

import torch
import torch.nn.functional as F

from runner.judge.inputs import make_inputs
from runner.judge.verify import GemmBudget, compare
from runner.ops.reference import moe_gemm, moe_gemm_swiglu
from runner.spec.spec import load_spec

spec = load_spec(sys.argv[1]); op = spec.op
nseeds = int(sys.argv[2])
shapes = [json.loads(sys.argv[3])] if len(sys.argv) > 3 else [dict(s) for s in op.all_shapes]
swiglu = "swiglu" in spec.name
ref = moe_gemm_swiglu if swiglu else moe_gemm


def acc(x, w, offs, order):
    """fp32 x @ w[e]^T per expert: `seq` one sum over k in order, `rev` reversed, `split4` four
    partial sums over K's quarters added at the end, `mm` torch's fp32 matmul."""
    x, w = x.float(), w.float()
    out = torch.zeros(x.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            a, b = x[start:end], w[e]
            if order == "mm":
                out[start:end] = a @ b.T
            else:
                ks = list(range(a.shape[1]))
                if order == "rev":
                    ks = ks[::-1]
                if order == "split4":
                    q = len(ks) // 4
                    parts = []
                    for j in range(4):
                        s = torch.zeros(end - start, b.shape[0])
                        for k in ks[j * q:(j + 1) * q]:
                            s += a[:, k:k + 1] * b[:, k][None, :]
                        parts.append(s)
                    out[start:end] = (parts[0] + parts[1]) + (parts[2] + parts[3])
                else:
                    s = torch.zeros(end - start, b.shape[0])
                    for k in ks:
                        s += a[:, k:k + 1] * b[:, k][None, :]
                    out[start:end] = s
        start = max(start, end)
    return out


orders = ("seq", "rev", "split4", "mm") if op.gemm_k_at(shapes[0]) <= 256 else ("mm",)
res = {}
for shape in shapes:
    k = op.gemm_k_at(shape)
    for seed in range(nseeds):
        for rnd in range(4):
            inp = make_inputs(op, shape, 5000 + seed, rnd, "cpu", structured=True, outliers=True, subnormal=True)
            x, w, offs = inp["x"], inp["w"], inp["offs"]
            b = GemmBudget(ref(x.double(), w.double(), offs, parts=True), k, torch.bfloat16)
            for order in orders:
                y = acc(x, w, offs, order)
                if swiglu:
                    g, u = y.chunk(2, dim=-1)
                    y = F.silu(g) * u
                ok, why, _ = compare(y.to(torch.bfloat16), b.ref, 0, 0, b)
                n, f = res.get(order, (0, 0))
                res[order] = (n + 1, f + (not ok))
                if not ok:
                    print("FAIL", shape, seed, rnd, order, why[:200])
for o, (n, f) in res.items():
    print(spec.name, o, "value sets %d outside the budget %d" % (n, f))
