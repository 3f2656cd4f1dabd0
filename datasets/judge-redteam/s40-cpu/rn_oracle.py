"""A suggested repair, measured: take the error against the reference ROUNDED TO NEAREST in the
output dtype (RN(ref)) instead of against ref. An honest round-to-nearest kernel then matches
RN(ref) on nearly every element whatever the data's structure (the softmax/offset false
positive disappears), while a narrowed intermediate leaves a high mismatch rate and RMS in ulps
even when its bias was cancelled (the fudge/normaliser cheats). Prints, per case: the lean as
verify.lean takes it, the lean against RN(ref), the fraction of elements != RN(ref), and the
RMS of (out - RN(ref)) in ulps, each clipped to +-2 as the lean clips."""
import torch, sys, os
sys.path.insert(0, os.path.dirname(__file__))
from runner.judge.verify import lean
from runner.spec.spec import load_spec
from runner.judge.inputs import make_inputs
import attn_py as A

def stats(out, ref):
    r = ref.double(); rn = ref.to(torch.bfloat16).double(); o = out.double()
    keep = r.abs() >= 2.0 ** -126
    _, e = torch.frexp(r[keep]); ulp = torch.ldexp(torch.ones_like(r[keep]), e - 8)
    d = (o[keep] - rn[keep]) * torch.sign(r[keep]) / ulp
    l = lean(out, ref, torch.bfloat16)
    return (round(l[0], 3) if l else None, round(float(d.clamp(-2, 2).mean()), 3),
            round(float((d != 0).double().mean()), 4), round(float(d.clamp(-2, 2).pow(2).mean().sqrt()), 3))

print("case                                        lean    lean_vs_RN  mismatch  rms_ulps_vs_RN(clipped)")
op = load_spec("pipelines/softmax-h200.yaml").op
for s in range(3):
    x = make_inputs(op, {"M": 37, "N": 33}, s, 4, "cpu")["x"]
    ref = torch.softmax(x.double(), -1).float()
    print(f"softmax 37x33 offset, honest (seed {s})        ", stats(torch.softmax(x.float(), -1).to(torch.bfloat16), ref))
g = torch.Generator().manual_seed(0)
q, k, v, lens = A.draw(4, 4096, "normal", "normal", g)
lens[:] = 4096
ref = A.ref_attn(q, k, v, lens)
for name, kw in [("attn honest fp32 P", {}), ("attn P RN bf16", dict(prn=True)),
                 ("attn P cut, l from fp32 P", dict(pcut=7)), ("attn P cut, l from cut P", dict(pcut=7, lcut=True)),
                 ("attn P cut + fudge 1/362", dict(pcut=7, fudge=1 / 362))]:
    print(f"{name:44s}", stats(A.attn(q, k, v, lens, **kw), ref))
x = torch.randn(32, 4096, generator=g).bfloat16(); w = torch.randn(96, 4096, generator=g).bfloat16()
acc = x.double() @ w.double().T
y = x.float() @ w.float().T
cut = lambda t: (t.view(torch.int32) & ~0xffff).view(torch.float32)
for name, out in [("gemm K=4096 honest fp32", y.bfloat16()), ("gemm output *(1+1/362) then cut", cut(y * (1 + 1 / 362)).bfloat16())]:
    print(f"{name:44s}", stats(out, acc.float()))
