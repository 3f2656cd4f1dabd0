"""Why an honest RMSNorm rewrite can be refused at a one-row shape on rows of few significant
bits (session 49's H100 call): one row, one scale; a scale one fp32 unit apart puts a share of
the bf16 outputs on the other side of a tie when the inputs are subnormal or `tiny` (their
products have few bits, so many land exactly on ties), none on normal rows. Prints, for four
rows of each kind, the mean |error| in units of bf16 rounding against rn(ref) of two builds whose
scales differ by one unit, and the share of outputs where they differ.

    python3 datasets/judge-redteam/s49-h200/ties.py      (CPU, seconds)
"""
import torch

torch.manual_seed(0)
N = 65536
TINY = torch.finfo(torch.bfloat16).tiny


def subnormal_row(n):  # inputs._subnormal's row: a scale 2^-6..2^2 times the normal minimum, each element within 2
    u, e = torch.rand(1, dtype=torch.float64), torch.rand(n, dtype=torch.float64)
    s = torch.where(torch.rand(n) < 0.5, -1.0, 1.0).double()
    return (s * TINY * torch.exp2(8 * u - 6) * torch.exp2(2 * e - 1)).to(torch.bfloat16)


def tiny_row(n):  # the `tiny` dist: 2^-6..2^6 times the normal minimum
    u, s = torch.rand(n, dtype=torch.float64), torch.where(torch.rand(n) < 0.5, -1.0, 1.0).double()
    return (s * TINY * torch.exp2(12 * u - 6)).to(torch.bfloat16)


def normal_row(n):
    return torch.randn(n).to(torch.bfloat16)


def units(y, rn):
    e = torch.frexp(rn.abs().clamp(min=TINY))[1]
    return (y - rn).abs() / torch.ldexp(torch.ones_like(rn), e - 8)


def main():
    w = (torch.rand(N) + 0.5).to(torch.bfloat16)
    for name, make in (("subnormal witness row", subnormal_row), ("tiny dist", tiny_row), ("normal", normal_row)):
        out = []
        for _ in range(4):
            x = make(N)
            xf = x.float()
            a = torch.rsqrt((xf * xf).sum() / N + torch.tensor(1e-6))
            b = torch.nextafter(a, torch.tensor(float("inf")))  # the same scale one unit up
            ref = x.double() * w.double() / torch.sqrt((x.double() ** 2).mean() + 1e-6)
            rn = ref.to(torch.bfloat16).double()
            ya, yb = [(xf * s * w.float()).to(torch.bfloat16).double() for s in (a, b)]
            out.append(f"{float(units(ya, rn).mean()):.4f}/{float(units(yb, rn).mean()):.4f} "
                       f"differ {float((ya != yb).double().mean()):.4f}")
        print(f"{name:>22}: " + " | ".join(out))


if __name__ == "__main__":
    main()
