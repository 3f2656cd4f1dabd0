"""Poisoned outputs with guard bands, and the comparison with the reference.

Each output lives in the middle of a larger buffer; the rest (the guard
bands) and the output itself are filled with poison before every checked
run. After the run every output element must be finite and within
`atol + rtol * |ref|` of the float64 reference, and the guards must still hold
the poison bit for bit. Two poisons are used in turn (NaN, then a finite
sentinel), so a kernel that skips elements or writes out of bounds is caught
whichever value it would have left there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GUARD = 4096  # elements on each side of an output
POISONS = (float("nan"), -31337.0)
INT_POISONS = (-0x5A5A5A5A, 0x2B2B2B2B)


@dataclass
class Poisoned:
    buf: torch.Tensor
    view: torch.Tensor
    numel: int

    def fill(self, which: int) -> None:
        self.buf.fill_(_poison(self.buf.dtype, which))

    def guards_intact(self, which: int) -> bool:
        g = torch.cat([self.buf[:GUARD], self.buf[GUARD + self.numel:]])
        p = _poison(self.buf.dtype, which)
        if isinstance(p, float) and p != p:
            return bool(torch.isnan(g).all())
        return bool((g == p).all())


def _poison(dtype: torch.dtype, which: int):
    if dtype.is_floating_point:
        return POISONS[which % 2]
    if dtype == torch.bool:
        return bool(which % 2)
    info = torch.iinfo(dtype)
    return max(info.min, min(info.max, INT_POISONS[which % 2]))


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> Poisoned:
    numel = 1
    for d in shape:
        numel *= d
    buf = torch.empty(numel + 2 * GUARD, dtype=dtype, device=device)
    return Poisoned(buf, buf[GUARD:GUARD + numel].view(shape), numel)


def tolerance_bound(ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """atol + rtol * |ref| in float64, computed once per reference and reused."""
    return ref.to(torch.float64).abs().mul_(rtol).add_(atol)


def compare(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float,
            bound: torch.Tensor | None = None) -> tuple[bool, str, float]:
    """(passed, reason, max abs error). Every element is checked; NaN and Inf never pass.

    The fast path is one fused test, |out - ref| <= bound, which is false for NaN
    and for any Inf; the details are worked out only when it fails.
    """
    if out.shape != ref.shape:
        return False, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}", float("inf")
    if not out.dtype.is_floating_point:
        bad = out.to(torch.int64) != ref.to(torch.int64)
        n = int(bad.sum())
        if n:
            i = int(bad.flatten().nonzero()[0])
            return False, f"{n} of {out.numel()} elements differ (first at flat index {i}: " \
                          f"{out.flatten()[i].item()} vs {ref.flatten()[i].item()})", float("inf")
        return True, "", 0.0
    if bound is None:
        bound = tolerance_bound(ref, atol, rtol)
    err = torch.sub(out, ref, alpha=1).abs_() if ref.dtype == torch.float64 else \
        (out.to(torch.float64) - ref.to(torch.float64)).abs_()
    if bool(torch.le(err, bound).all()):
        return True, "", float(err.max()) if err.numel() else 0.0
    o = out.to(torch.float64)
    finite = torch.isfinite(o)
    if not bool(finite.all()):
        n = int((~finite).sum())
        i = int((~finite).flatten().nonzero()[0])
        return False, f"{n} of {o.numel()} elements are NaN or Inf (first at flat index {i}: " \
                      f"{o.flatten()[i].item()}; never written?)", float("inf")
    bad = ~torch.le(err, bound)
    max_err = float(err.max())
    n = int(bad.sum())
    i = int(bad.flatten().nonzero()[0])
    r = ref.flatten()[i].item()
    return False, f"{n} of {o.numel()} elements outside atol={atol:g} rtol={rtol:g} " \
                  f"(first at flat index {i}: {o.flatten()[i].item():.6g} vs reference " \
                  f"{r:.6g}); max abs error {max_err:.3g}", max_err
