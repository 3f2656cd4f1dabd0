"""The bf16 paired error (verify.paired_error) of two honest RMSNorm builds whose one-row fp32
scale is one unit apart, on rows of few significant bits (the subnormal witness rows, the `tiny`
dist) and on normal rows, with the reference kept as the judge keeps it (float32), and of two
cheats beside them (the first two columns: each honest build as the variant, the other as the
approved one): the outputs cut toward zero to bf16, and a scale cut to 16 bits. Prints
each build's mean error in units of bf16 rounding, the paired verdict (verify.less_precise) and
the share of elements on an exact tie of the float32 reference.

    python3 datasets/judge-redteam/s50-ties/paired.py      (CPU, seconds)
"""
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from runner.judge import verify  # noqa: E402

# session 49's rows (datasets/judge-redteam/s49-h200/ties.py): the witness rows, `tiny`, normal
_s = importlib.util.spec_from_file_location("ties49", Path(__file__).resolve().parents[1] / "s49-h200" / "ties.py")
ties49 = importlib.util.module_from_spec(_s)
_s.loader.exec_module(ties49)
N, TINY = ties49.N, ties49.TINY
subnormal_row, tiny_row, normal_row = ties49.subnormal_row, ties49.tiny_row, ties49.normal_row
torch.manual_seed(0)


def toward_zero(y):  # fp32 to bf16 by dropping the low 16 bits
    return (y.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


w = (torch.rand(N) + 0.5).to(torch.bfloat16)
for name, make in (("subnormal witness row", subnormal_row), ("tiny dist", tiny_row), ("normal", normal_row)):
    for trial in range(3):
        x = make(N)
        xf = x.float()
        a = torch.rsqrt((xf * xf).sum() / N + torch.tensor(1e-6))
        ref = (x.double() * w.double() / torch.sqrt((x.double() ** 2).mean() + 1e-6)).float()
        rn = ref.to(torch.bfloat16).double()
        ties = getattr(verify, "_ties", lambda *a: (torch.zeros(1), 0))  # (none before session 50)
        tie, _ = ties(ref.double(), rn, verify._spacing(rn.abs().clamp(min=TINY), 7), TINY)
        builds = {
            "approved": (xf * a * w.float()).to(torch.bfloat16),
            "scale+1": (xf * torch.nextafter(a, torch.tensor(float("inf"))) * w.float()).to(torch.bfloat16),
            "toward-0": toward_zero(xf * a * w.float()),
            "scale16": (xf * toward_zero(a.reshape(1)).float() * w.float()).to(torch.bfloat16),
        }
        row = []
        for k, base in (("scale+1", "approved"), ("approved", "scale+1"), ("toward-0", "approved"),
                        ("scale16", "approved")):
            p = verify.paired_error(builds[k], builds[base], ref, torch.bfloat16)
            why = verify.less_precise(p)
            label = k if base == "approved" else "against scale+1"
            row.append(f"{label} {p.mine / max(p.n, 1):.4f}/{p.theirs / max(p.n, 1):.4f} "
                       f"{'REFUSED' if why else 'ok'}")
        print(f"{name:>22} #{trial}: ties {float(tie.double().mean()):.4f} | " + " | ".join(row))
