"""Fresh, seeded inputs from several distributions; never zeros.

Besides the everyday ones (normal, uniform, positive, large, masked, outliers),
some exist to stress the numerics, and each op's spec lists those that apply:
`offset` (each row a large common offset, 1e3 to 1e4 times its spread: E[x^2] -
E[x]^2 and other cancellations fail), `spike` (one element of each row 1e2 to 1e4
times the rest), `huge` (magnitudes up to a quarter of the dtype's largest: safe
for ops that subtract the row maximum first, not for squares) and `tiny` (around
the dtype's smallest normal, subnormals included). Integer tensors take `randint` (low,
high) or `perm`: a random permutation of 0 .. numel - 1 laid out in the tensor's shape, so
that every value appears once (a block table over a pool of pages, each page owned by one
sequence, in shuffled order).
"""

from __future__ import annotations

import math

import torch

from .verify import NARROW

TORCH_DTYPES = {
    "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool,
}


def shape_of(t, env: dict) -> tuple[int, ...]:
    return tuple(int(d(env)) for d in t.shape)


def make_tensor(t, env: dict, dist: str, gen: torch.Generator, device: str) -> torch.Tensor:
    x = _draw(t, env, dist, gen, device)
    special = getattr(t, "special", None)
    if special is not None:  # e.g. ignore indices among targets: a random share of the elements
        value, fraction = special
        mask = torch.rand(x.shape, generator=gen, device=device) < fraction
        x = torch.where(mask, torch.full_like(x, value), x)
    return x


def _draw(t, env: dict, dist: str, gen: torch.Generator, device: str) -> torch.Tensor:
    dtype = TORCH_DTYPES[t.dtype]
    shape = shape_of(t, env)
    # the everyday distributions are drawn in a 16-bit dtype directly (a third of the bytes
    # of drawing in float32 and rounding); the numerics' own ones in float32 or float64
    direct = dtype if dtype in NARROW else torch.float32
    if dist == "randint":
        lo, hi = int(t.low(env)), int(t.high(env))
        return torch.randint(lo, hi, shape, generator=gen, device=device, dtype=torch.int64).to(dtype)
    if dist == "perm":  # 0 .. numel - 1 in random order, row-major in the shape: a shuffled page table
        n = math.prod(shape)
        return torch.randperm(n, generator=gen, device=device, dtype=torch.int64).view(shape).to(dtype)
    if dist == "uniform":  # [-1, 1) pushed away from zero
        x = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) * 2 - 1
        x = torch.where(x.abs() < 1e-3, torch.full_like(x, 0.5), x)
    elif dist == "positive":
        x = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) + 0.5
    elif dist == "large":
        x = torch.randn(shape, generator=gen, device=device, dtype=direct).mul_(30)
    elif dist == "masked":  # normal, a quarter of the values -inf (attention masks); the first column never
        x = torch.randn(shape, generator=gen, device=device, dtype=direct)
        mask = torch.rand(shape, generator=gen, device=device, dtype=direct) < 0.25
        if len(shape) >= 1 and shape[-1] > 0:
            mask[..., 0] = False  # every row keeps a finite value
        x = x.masked_fill(mask, float("-inf"))
    elif dist == "offset":  # rows: a common offset of 1e3 to 1e4 spreads, either sign
        rows = (*shape[:-1], 1) if len(shape) >= 1 else ()
        off = torch.rand(rows, generator=gen, device=device, dtype=torch.float32) * 9e3 + 1e3
        sign = torch.where(torch.rand(rows, generator=gen, device=device) < 0.5, -1.0, 1.0)
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) + off * sign
    elif dist == "spike":  # normal, and one element of each row 1e2 to 1e4 times larger, either sign
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        if len(shape) >= 1 and shape[-1] > 0 and x.numel():
            rows = (*shape[:-1], 1)
            col = torch.randint(0, shape[-1], rows, generator=gen, device=device)
            mag = 10 ** (torch.rand(rows, generator=gen, device=device) * 2 + 2)
            sign = torch.where(torch.rand(rows, generator=gen, device=device) < 0.5, -1.0, 1.0)
            x.scatter_(-1, col, (mag * sign).to(x.dtype))
    elif dist in ("huge", "tiny"):  # in float64, so that the target dtype's extremes are reachable
        info = torch.finfo(dtype)
        u = torch.rand(shape, generator=gen, device=device, dtype=torch.float64)
        sign = torch.where(torch.rand(shape, generator=gen, device=device) < 0.5, -1.0, 1.0).to(torch.float64)
        if dist == "huge":  # |x| in [max/64, max/4]
            x = sign * info.max / 4 * torch.exp2(-4 * u)
        else:  # |x| in [smallest normal / 64, smallest normal * 64]
            x = sign * info.tiny * torch.exp2(12 * u - 6)
    elif dist == "outliers":  # mostly normal, 0.1% of values 50x larger
        x = torch.randn(shape, generator=gen, device=device, dtype=direct)
        mask = torch.rand(shape, generator=gen, device=device) < 1e-3
        x = torch.where(mask, x * 50, x)
    else:  # normal
        x = torch.randn(shape, generator=gen, device=device, dtype=direct)
    return x.to(dtype)


def make_inputs(op, shape: dict, seed: int, round_: int, device: str,
                timed: bool = False) -> dict[str, torch.Tensor]:
    """One value set of the op's inputs. `timed`: the values of timed calls (the candidate's
    timed loop, the baseline's, pipe compare's arms and the checks on their outputs), where an
    input's `timed` override gives its own dist, low or high (say, every sequence at its full
    length, as op.bytes counts it); otherwise verification's. Shapes, dtypes and the draws'
    order are the same either way: only the values differ."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    env = op.shape_env(shape)
    out = {}
    for t in op.inputs:
        v = t.drawn(timed)
        out[t.name] = make_tensor(v, env, v.dists[round_ % len(v.dists)], gen, device)
    return out
