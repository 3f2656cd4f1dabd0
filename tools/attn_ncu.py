"""Decode attention (issue 21) under Nsight Compute: one launch of each chosen configuration and
of each SDPA backend at (B, L) points, inside the profiler's range only (the inputs, the
buffers, the compiles and a warm-up launch of each are made before it), so that

    ncu --profile-from-start off --clock-control none --section ... python3 tools/attn_ncu.py ...

profiles exactly the kernels compared: their grids, registers, occupancy, DRAM throughput and
where their warps stall. Each launch sits in an NVTX range named `point/arm` (ncu --nvtx prints
it beside the kernel). Without ncu it prints each arm's median time by graph replay (as
tools/attn_probe.py times), so a run under ncu and one without it name the same launches.

    python tools/attn_ncu.py --points 6x5150,2x1735 --config SPLIT=128,NW=8,VEC=8,WAVES=1,STAGES=2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from attn_probe import SPEC, Probe, label, points_arg  # noqa: E402


def config_arg(text: str) -> dict:
    """SPLIT=128,NW=8: the parameters that differ from the spec's start."""
    out = {}
    for part in text.split(","):
        name, _, val = part.partition("=")
        if not name or not val.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"expected NAME=INT joined by commas, e.g. SPLIT=128,NW=8; got {text!r}")
        out[name.strip()] = int(val)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--points", type=points_arg, required=True, metavar="BxL,BxL")
    ap.add_argument("--config", type=config_arg, action="append", default=[], metavar="NAME=V,...",
                    help="a configuration: the spec's start with these changed (repeatable)")
    ap.add_argument("--arms", default="flash,cudnn", help="SDPA backends launched beside (default flash,cudnn)")
    a = ap.parse_args(argv)

    import torch

    p = Probe(Path(a.spec))
    space = list(p.spec.space)
    cfgs = []
    for c in a.config:
        cfg = {**p.spec.start, **c}
        if cfg not in space:
            print(f"not in the spec's space: {label(cfg)}")
            return 2
        cfgs.append(cfg)
    keep = p.compile(cfgs)
    if len(keep) != len(cfgs):
        return 1
    for cfg, _, res in keep:
        print(f"  {label(cfg)}: registers {res.get('registers')}", flush=True)
    want = [x for x in a.arms.split(",") if x]
    launches = []  # (name, call): made and warmed before the profiler's range
    hold = []  # the tensors the launches read by address: alive until the end
    for B, L in a.points:
        shape = {"B": B, "L": L}
        q, k, v, lens = p.inputs(B, L, 7, ragged=False)
        arms = p.sdpa_arms(q, k, v, lens)
        for name in want:
            if arms.get(name) is not None:
                launches.append((f"{B}x{L}/{name}", arms[name]))
        for cfg, art, _ in keep:
            if not p.served(cfg, shape):
                print(f"  {B}x{L}: not served by {label(cfg)}")
                continue
            out = torch.empty(B, 32, 128, device="cuda").bfloat16()
            ws = torch.zeros(*p.ws_shape(cfg, shape), device="cuda")
            hold.append((q, k, v, lens, out, ws))
            geo = p.pack(cfg, shape, {"q": q, "k": k, "v": v, "lens": lens, "out": out, "ws": ws})[1]
            call = p.prepare(cfg, art, shape, {"q": q, "k": k, "v": v, "lens": lens, "out": out, "ws": ws},
                             mode="graph")
            launches.append((f"{B}x{L}/{label(cfg)} grid {geo['grid']} block {geo['block']}", call))
    for name, call in launches:
        call()
    torch.cuda.synchronize()
    for name, call in launches:
        t = p.time(call, reps=20)
        print(f"  {name}: {t * 1e6:.2f} us (median of 20, graph replay as timed)", flush=True)
    from ncu_range import profiled

    profiled(launches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
