"""Which of verification's value sets a configuration fails, and what the failing rows hold.

    python tools/verify_probe.py SPEC --cfg K=V,... --shape M=4096/N=32768 [--sets 4] [--shape ...]

For each shape, each round index (the spec's dists in turn) and --sets seeds, one launch on the
judge's own draws made three ways: plain (make_inputs alone), structured (structured witness
rows, subnormal witness rows, the reference's serving draw) and full (those and outlier
channels, every input planned to take them), each checked against the float64 reference under
the spec's budget. Prints one line per failing launch: the mode, the round's dists, the verdict,
and for the first few failing rows of the first output (by the leading index) each input's row
statistics there (finite share, min, max, mean |x|). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))


def row_stats(x, r: int) -> str:
    import torch

    if x.dim() < 2 or not x.is_floating_point():
        return "-"
    row = x.reshape(x.shape[0], -1)[r].double()
    fin = torch.isfinite(row)
    f = row[fin]
    if not f.numel():
        return f"finite 0/{row.numel()}"
    return (f"finite {int(fin.sum())}/{row.numel()} min {float(f.min()):.4g} max {float(f.max()):.4g} "
            f"mean|x| {float(f.abs().mean()):.4g} distinct {int(torch.unique(f).numel())}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--cfg", default="", help="K=V,... over the spec's start")
    ap.add_argument("--shape", action="append", required=True, help="K=V/K=V (repeatable)")
    ap.add_argument("--sets", type=int, default=4, help="seeds per (shape, round, mode)")
    a = ap.parse_args()

    import torch

    from kernel_launch import Launcher, parse_cfg, parse_shape
    from runner.core.userpath import load_callable
    from runner.judge.inputs import TORCH_DTYPES, make_inputs
    from runner.judge.verify import Budget, compare, reference_dtype
    from runner.spec.spec import load_spec

    spec = load_spec(a.spec)
    op = spec.op
    ref_fn = load_callable(op.reference, spec.home)
    serving = getattr(ref_fn, "serving", None)
    cfg = parse_cfg(spec, a.cfg)
    rounds = max(len(t.dists) for t in op.inputs)
    rng = random.Random(11)
    bad = total = 0
    for text in a.shape:
        shape = parse_shape(spec, text)
        k = Launcher(spec, cfg, shape)
        for round_ in range(rounds):
            dists = {t.name: t.dists[round_ % len(t.dists)] for t in op.inputs}
            for _ in range(a.sets):
                seed = rng.getrandbits(40)
                for mode in ("plain", "structured", "full"):
                    kw = {} if mode == "plain" else dict(subnormal=True, structured=True, serving=serving)
                    if mode == "full":
                        kw.update(outliers=True, shares=(None, True, None, None, None))
                    x = make_inputs(op, shape, seed, round_, "cuda", **kw)
                    outs, ws = k.run(x)
                    wide = {n: (v.double() if v.is_floating_point() else v) for n, v in x.items()}
                    refs = ref_fn(**wide, **k.scalars)
                    refs = list(refs) if isinstance(refs, (tuple, list)) else [refs]
                    total += 1
                    for t, o, rr in zip(op.outputs, outs, refs):
                        dt = TORCH_DTYPES[t.dtype]
                        rr = rr.to(reference_dtype(dt)) if rr.is_floating_point() else rr
                        ok, why, _ = compare(o.view, rr, op.atol, op.rtol,
                                             Budget(rr, op.atol, op.rtol, dt, op.ulps, op.floor))
                        ok = ok and o.guards_intact()
                        ws_bad = [w.problem() for w in ws if w.problem()]
                        if ok and not ws_bad:
                            continue
                        bad += 1
                        print(f"{text} round {round_} {dists} {mode} seed {seed}: {why or 'guards'} {ws_bad}",
                              flush=True)
                        if o.view.dim() >= 2 and o.view.is_floating_point():
                            v, r64 = o.view.reshape(o.view.shape[0], -1).double(), rr.reshape(rr.shape[0], -1)
                            err = ((v - r64).abs() > 0.01 * r64.abs() + 1e-3) | ~torch.isfinite(v)
                            for r in err.any(1).nonzero().flatten()[:4].tolist():
                                print(f"    row {r}: out {row_stats(o.view, r)}; ref {row_stats(rr, r)}")
                                for n, xv in x.items():
                                    print(f"      {n}: {row_stats(xv, r)}")
                        break
    print(f"\n{bad} of {total} launches failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
