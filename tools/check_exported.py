"""Check the exported softmax, RMSNorm and cross-entropy packages on every shape their
dispatch table names (tuned and held-out), on the GPU: the call takes the shipped kernel,
and its output matches torch in float32 within the specs' tolerances. Run on the GPU
machine after `pipe export` of the three runs into one folder:
    python3 tools/check_exported.py /tmp/exported
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def main(root: str) -> int:
    sys.path.insert(0, root)
    import cross_entropy_h200 as ce
    import rmsnorm_h200 as rn
    import softmax_h200 as sm

    g = torch.Generator(device="cuda").manual_seed(0)
    bad = 0
    for pkg in (sm, rn, ce):
        table = json.loads((Path(pkg.__file__).parent / "table.json").read_text())
        for e in table["entries"]:
            if e["use"] != "kernel":
                continue
            s = e["shape"]
            before = pkg.op.calls["kernel"]
            if pkg is sm:
                x = torch.randn(s["M"], s["N"], device="cuda", generator=g).bfloat16()
                got, ref, tol = sm.softmax(x).float(), torch.softmax(x.float(), -1), (1e-3, 1.6e-2)
            elif pkg is rn:
                x = torch.randn(s["M"], s["N"], device="cuda", generator=g).bfloat16()
                w = (torch.rand(s["N"], device="cuda", generator=g) + 0.5).bfloat16()
                got = rn.rmsnorm(x, w, 1e-6).float()
                ref, tol = F.rms_norm(x.float(), (s["N"],), w.float(), 1e-6), (1e-2, 1.6e-2)
            else:
                x = (torch.randn(s["M"], s["V"], device="cuda", generator=g) * 2).bfloat16()
                t = torch.randint(0, s["V"], (s["M"],), device="cuda", generator=g)
                t[::7] = -100
                got = ce.cross_entropy(x, t, -100)
                ref, tol = F.cross_entropy(x.float(), t, ignore_index=-100, reduction="none"), (1e-3, 1e-3)
            torch.cuda.synchronize()
            used = pkg.op.calls["kernel"] - before
            ok = used == 1 and torch.allclose(got, ref, atol=tol[0], rtol=tol[1])
            bad += not ok
            print(f"{table['op']:<36} {'x'.join(map(str, s.values())):<12} trial #{e['trial']:<4} "
                  f"{e['evidence']:<30} kernel calls {used}  max |diff| {(got - ref).abs().max().item():.3g}  "
                  f"{'ok' if ok else 'FAILED'}")
    print("all ok" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the folder `pipe export` wrote the three packages into")
    sys.exit(main(ap.parse_args().root))
