"""How far an honest decode-attention kernel sits from the judge's error budget, by value set.

    python tools/attn_numerics.py [--sets 48] [--cfg SPLIT=512,NW=8,PVM=1] [--shape 2x2048] ...

For each configuration given (the spec's start where none is), each shape and each of --sets
verification value sets (the judge's own draws: structured rows, subnormal witness rows, the
reference's serving draw, and outlier channels planned per input: none, q alone, k alone, v
alone, q and k, all three), the kernel's output against the float64 reference under the spec's
budget (runner.judge.verify.Budget): the largest |error| / budget of the value set. Beside it, on
the same inputs, two references a user has: an fp32 attention (scores, softmax and P V in fp32,
TF32 off) and torch's bf16 SDPA (the spec's baseline). Prints, per (round, channel plan), the
worst ratio of each, and the ten worst value sets with their largest |score| (scaled by
1/sqrt(D)). A ratio above 1 is a `wrong` verdict; SDPA's is inf where the serving draw's poison
(NaN in rows past a sequence's length) reaches its output through the mask's zero weights, as
it would in a serving engine's. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

PLANS = {"none": (False, False, False), "q": (True, False, False), "k": (False, True, False),
         "v": (False, False, True), "qk": (True, True, False), "qkv": (True, True, True)}


def fp32_attention(q, k, v, lens):
    import torch

    B, HQ, D = q.shape
    L, HKV = k.shape[1], k.shape[2]
    g = HQ // HKV
    s = torch.einsum("bhgd,blhd->bhgl", q.float().view(B, HKV, g, D), k.float()) * D ** -0.5
    keep = torch.arange(L, device=q.device)[None, :] < lens.long()[:, None]
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    vf = torch.where(keep[:, :, None, None], v.float(), torch.zeros((), device=q.device))
    o = torch.einsum("bhgl,blhd->bhgd", torch.softmax(s, -1), vf).reshape(B, HQ, D)
    return o.to(q.dtype), float(s.masked_fill(~keep[:, None, None, :], 0).abs().max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "pipelines/decode-attention-h200.yaml"))
    ap.add_argument("--cfg", action="append", default=[], help="K=V,... over the spec's start (repeatable)")
    ap.add_argument("--shape", action="append", default=[], help="BxL (repeatable; default 2x2048 and 4x4096)")
    ap.add_argument("--sets", type=int, default=48, help="value sets per (configuration, shape, plan)")
    ap.add_argument("--plans", default=",".join(PLANS), help="channel plans, from " + ",".join(PLANS))
    a = ap.parse_args()

    import torch

    from kernel_launch import Launcher, parse_cfg
    from runner.core.userpath import load_callable
    from runner.judge.inputs import TORCH_DTYPES, make_inputs
    from runner.judge.verify import Budget, reference_dtype
    from runner.spec.spec import load_spec

    torch.backends.cuda.matmul.allow_tf32 = False
    spec = load_spec(a.spec)
    op = spec.op
    ref_fn = load_callable(op.reference, spec.home)
    serving = getattr(ref_fn, "serving", None)
    cfgs = [parse_cfg(spec, text) for text in a.cfg or [""]]
    shapes = [dict(zip("BL", map(int, s.split("x")))) for s in (a.shape or ["2x2048", "4x4096"])]
    rng = random.Random(7)
    rows = []
    t = op.outputs[0]
    for cfg in cfgs:
        label = " ".join(f"{k}={v}" for k, v in sorted(cfg.items()))
        for shape in shapes:
            k = Launcher(spec, cfg, shape)
            for plan in a.plans.split(","):
                share = tuple(enumerate(PLANS[plan]))
                for i in range(a.sets):
                    seed, round_ = rng.getrandbits(40), i % 2
                    x = make_inputs(op, shape, seed, round_, "cuda", subnormal=True, structured=True,
                                    serving=serving, outliers=True, shares=(None, share, None, None, None))
                    (out,), _ = k.run(x)
                    wide = {n: (v.double() if v.is_floating_point() else v) for n, v in x.items()}
                    ref = ref_fn(**wide).to(reference_dtype(TORCH_DTYPES[t.dtype]))
                    bound = Budget(ref, op.atol, op.rtol, TORCH_DTYPES[t.dtype], op.ulps, op.floor).tensor()
                    f32, smax = fp32_attention(x["q"], x["k"], x["v"], x["lens"])
                    sdpa = ref_fn(**x)

                    def ratio(o):
                        return float(((o.double() - ref).abs() / bound).nan_to_num(float("inf")).max())

                    rows.append((label, f"{shape['B']}x{shape['L']}", plan, round_, ratio(out.view), ratio(f32),
                                 ratio(sdpa), smax, seed))
            print(f"{label} {shape}: {a.sets} value sets a plan done", flush=True)
    print("\nworst |error| / budget by (configuration, shape, plan, round): kernel, fp32 attention, bf16 SDPA")
    groups: dict = {}
    for r in rows:
        g = groups.setdefault(r[:4], [0.0, 0.0, 0.0, 0, 0])
        g[0], g[1], g[2] = max(g[0], r[4]), max(g[1], r[5]), max(g[2], r[6])
        g[3] += r[4] > 1
        g[4] += 1
    for k, g in groups.items():
        print(f"  {k[0][:60]:60s} {k[1]:>8s} {k[2]:>4s} r{k[3]}  {g[0]:7.3f} {g[1]:7.3f} {g[2]:7.3f}"
              f"  over 1: {g[3]}/{g[4]}")
    print("\nthe ten worst value sets (kernel ratio): shape, plan, round, kernel, fp32, sdpa, max |score|, seed")
    for r in sorted(rows, key=lambda r: -r[4])[:10]:
        print(f"  {r[1]:>8s} {r[2]:>4s} r{r[3]} {r[4]:7.3f} {r[5]:7.3f} {r[6]:7.3f} {r[7]:10.4g} {r[8]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
