"""Cheaper GEMM arithmetic against verify.GemmBudget (moe-cpu's sizes, K = 64, bf16 out): the
share of 32x96 outputs that pass, per scheme (failed attempts of this folder's README)."""
import sys, torch
sys.path.insert(0, "/work/main")
from runner.judge.verify import GemmBudget

def rnd(t):  # to bf16 and back
    return t.to(torch.bfloat16).to(torch.float64)

g = torch.Generator().manual_seed(0)
schemes = {
    "honest fp32 sum": lambda x, w: (x.float() @ w.float().T).double(),
    "two bf16 halves (K 32+32)": lambda x, w: rnd(x[:, :32] @ w[:, :32].T) + rnd(x[:, 32:] @ w[:, 32:].T),
    "fp32 sum, smallest 4 |x_k w_k| per output dropped": None,
    "fp32 sum, last 4 k dropped": lambda x, w: x[:, :60] @ w[:, :60].T,
    "truncate to bf16 instead of rounding": "trunc",
}
for name, f in schemes.items():
    ok = 0
    for trial in range(200):
        scale = [1, 30, 1][trial % 3]
        x = (torch.randn(32, 64, generator=g) * scale).to(torch.bfloat16).double()
        w = torch.randn(96, 64, generator=g).to(torch.bfloat16).double()
        acc = x @ w.T
        parts = {"out": acc, "acc": acc, "abs": x.abs() @ w.abs().T}
        b = GemmBudget(parts, 64, torch.bfloat16)
        if f == "trunc":
            s = (x.float() @ w.float().T)
            out = (s.view(torch.int32) & ~0xFFFF).view(torch.float32).double()
        elif f is None:
            p = x[:, None, :] * w[None, :, :]
            thr = p.abs().kthvalue(4, dim=-1, keepdim=True).values
            out = torch.where(p.abs() <= thr, 0.0, p).sum(-1)
        else:
            out = f(x, w)
        ok += b.holds(rnd(out))
    print(f"{name:52s} passes {ok}/200 sets")
