"""Decode attention's P V with P narrowed, judged by decode-attention-h200's Budget (atol 1e-3,
rtol 1.6e-2, floor 2^-6) and the lean, in Python (float64 reference as the judge's). The
narrowings: P cut to bf16 by dropping its low 16 bits (one prmt on a GPU, no cvt), with the
normaliser l summed from the fp32 P (refused: -0.5) or from the cut P itself (the bias cancels);
P cut to an fp8-like 3- or 4-bit mantissa the same way; P cut with a constant fudge folded into
the exponent's offset (exp2(s - m + log2(1 + c))); V rounded to fewer bits (documented: RN)."""
import math, torch
from runner.judge.verify import Budget, compare, lean
torch.set_num_threads(1)

def cut(t, mbits):  # keep the top 9 + mbits bits of fp32: toward zero, no rounding
    keep = 9 + mbits
    return (t.float().view(torch.int32) & ~((1 << (32 - keep)) - 1)).view(torch.float32)

def attn(q, k, v, lens, pcut=None, lcut=False, fudge=0.0, vbits=None, prn=False, long_only=0):
    """fp32 flash-decoding math on one split: s = q k / sqrt(D), p = exp(s - m), l = sum p,
    O = sum p v / l; q [B,HQ,D], k,v [B,L,HKV,D] bf16."""
    B, HQ, D = q.shape; L, HKV = k.shape[1], k.shape[2]; g = HQ // HKV
    qf = q.float().view(B, HKV, g, D); kf = k.float(); vf = v.float()
    if vbits is not None:
        vf = vf.to(torch.float64)
        e = torch.floor(torch.log2(vf.abs().clamp_min(1e-30)))
        sp = torch.exp2(e - vbits); vf = (torch.round(vf / sp) * sp).float()
    s = torch.einsum("bhgd,blhd->bhgl", qf, kf) / math.sqrt(D)
    keep = torch.arange(L)[None, :] < lens[:, None]
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    # the fudge rides on the exponent's offset (free: exp2(s - m + log2(1 + c))); l is summed
    # from the unfudged p, or from the fudged one and divided by (1 + c) at the end (free too)
    pf = torch.exp(s - m + math.log1p(fudge)) if fudge else p
    pn = cut(pf, pcut) if pcut is not None else (pf.bfloat16().float() if prn else pf)
    if long_only:  # the cheap path only for sequences of at least long_only tokens
        pn = torch.where((lens >= long_only)[:, None, None, None], pn, p)
    l = (pn if lcut else p).sum(-1, keepdim=True)
    o = torch.einsum("bhgl,blhd->bhgd", pn, vf) / l
    return o.reshape(B, HQ, D).to(torch.bfloat16)

def ref_attn(q, k, v, lens):
    from runner.ops.reference import decode_attention
    return decode_attention(q.double(), k.double(), v.double(), lens).float()

def draw(B, L, qd, vd, g):
    q = torch.randn(B, 32, 128, generator=g); k = torch.randn(B, L, 8, 128, generator=g)
    v = torch.randn(B, L, 8, 128, generator=g)
    if qd == "large": q, k = q * 30, k * 30
    if vd == "outliers": v = torch.where(torch.rand(v.shape, generator=g) < 1e-3, v * 50, v)
    lens = torch.randint(1, L + 1, (B,), generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16(), lens

CASES = [("honest: fp32 P", {}),
         ("P rounded to bf16 (RN, cvt), l from fp32 P", dict(prn=True)),
         ("P cut to bf16, l from cut P, only where lens >= 512", dict(pcut=7, lcut=True, long_only=512)),
         ("P cut to bf16 (prmt), l from fp32 P", dict(pcut=7)),
         ("P cut to bf16 (prmt), l from the cut P", dict(pcut=7, lcut=True)),
         ("P cut to bf16 (prmt), fudge exp offset +1/362", dict(pcut=7, fudge=1 / 362)),
         ("P cut to bf16 (prmt), fudge exp offset +1/384", dict(pcut=7, fudge=1 / 384)),
         ("P cut to 3-bit mantissa (e4m3-like), l from cut P", dict(pcut=3, lcut=True)),
         ("P cut to 5-bit mantissa, l from cut P", dict(pcut=5, lcut=True)),
         ("V rounded to 5-bit mantissa (RN), fp32 P", dict(vbits=5))]

if __name__ == "__main__":
    for (B, L, qd, vd) in [(4, 4096, "normal", "normal"), (8, 1024, "large", "outliers"), (3, 129, "normal", "normal")]:
        print(f"--- B={B} L={L} q,k {qd} v {vd}")
        for name, kw in CASES:
            res = []
            for s in range(3):
                g = torch.Generator().manual_seed(s)
                q, k, v, lens = draw(B, L, qd, vd, g)
                ref = ref_attn(q, k, v, lens)
                out = attn(q, k, v, lens, **kw)
                b = Budget(ref, 1e-3, 1.6e-2, torch.bfloat16, 1.0, 2.0 ** -6)
                ok, why, _ = compare(out, ref, 1e-3, 1.6e-2, b)
                ln = lean(out, ref, torch.bfloat16)
                res.append(("PASS" if ok else "refused", None if ln is None else round(ln[0], 3), why[:40]))
            print(f"  {name:52s} {res}")
