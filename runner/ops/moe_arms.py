"""pipe compare's arms for the MoE experts' grouped GEMM (`op.arms` of the MoE specs,
docs/moe.md): what a user of torch or Triton would call instead of the tuned kernel.

Each is called like the reference, `fn(x, w, offs)` with x [R, K] bf16 (rows sorted by
expert), w [E, N, K] bf16 (each expert's weight as nn.Linear keeps it) and offs int32 [E]
(the cumulative END row of each expert's group, torch._grouped_mm's convention), and returns
y [R, N] (the `_swiglu` arms: y [R, N / 2] = silu(g) * u, g and u the two halves of the
columns of x @ w^T).

- `loop`: what a model without a grouped kernel runs: the ends copied to the host, then one
  torch.mm per non-empty expert into a preallocated output. The copy is a host sync, which
  a CUDA graph cannot capture: the function says so (`capturable = False`) and pipe compare
  times it as direct launches (its host work, the sync and E launches, counts, as it does
  for a model that calls it), whatever mode the other arms of the shape run in (docs/moe.md).
- `grouped_mm`: torch._grouped_mm (CUTLASS on Hopper), one launch, no host sync.
- `triton_grouped`: a Triton grouped GEMM in the style of the fused-MoE kernels of vLLM and
  SGLang: a 1-D grid over (M tiles of the expert-sorted rows, N tiles), each program finding
  its expert and its tile's first row from offs on the device (the tile counts per expert and
  their running sum, worked out in the program: no host sync, no preprocessing launch), then
  tl.dot over K in BLOCK_K steps with fp32 accumulation, masks at the group's edges and at K,
  a bf16 store. The grid is sized for the worst case (ceil(R / BLOCK_M) + E M tiles); the
  programs past the last tile do nothing. `triton.autotune` picks among a few configurations
  for few rows (decode: a handful of rows per expert) and many (prefill), keyed on R, N and K.
- `loop_swiglu`, `grouped_mm_swiglu`, `triton_grouped_swiglu`: the same with the SwiGLU
  epilogue: the first two unfused (the GEMM's bf16 output, then silu and the product in bf16),
  the Triton one fused (each program holds g's and u's tiles in fp32 and stores silu(g) * u).

Triton is imported on first use of the Triton arms: without it they raise ImportError, which
pipe compare shows as `n/a` with the reason; the torch arms need only torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _swiglu(y: torch.Tensor) -> torch.Tensor:
    g, u = y.chunk(2, dim=-1)
    return F.silu(g) * u


# ----------------------------------------------------------------------------- loop


def loop(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    R, N = x.shape[0], w.shape[1]
    y = torch.empty((R, N), dtype=x.dtype, device=x.device)
    start = 0
    for e, end in enumerate(offs.tolist()):  # the host sync
        if end > start:
            torch.mm(x[start:end], w[e].t(), out=y[start:end])
        start = max(start, end)
    return y


loop.capturable = False  # a host sync: pipe compare times it as direct launches


def loop_swiglu(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _swiglu(loop(x, w, offs))


loop_swiglu.capturable = False


# ----------------------------------------------------------------------------- grouped_mm


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(x, w.transpose(1, 2), offs=offs.to(torch.int32))


def grouped_mm_swiglu(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _swiglu(grouped_mm(x, w, offs))


# ----------------------------------------------------------------------------- Triton

try:
    import triton
    import triton.language as tl
except ImportError as e:  # the torch arms still work; the Triton ones raise this
    triton = tl = None
    _NO_TRITON = e

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): small M tiles for a few rows per expert (decode),
# large ones for prefill
CONFIGS = [(16, 64, 128, 4, 4), (16, 128, 64, 4, 4), (32, 128, 64, 4, 4), (64, 128, 64, 4, 3),
           (64, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3)]

if triton is not None:
    def _configs():
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=wp, num_stages=st)
                for m, n, k, wp, st in CONFIGS]

    @triton.jit
    def _tile(offs_ptr, pid_m, E: tl.constexpr, E_P2: tl.constexpr, BLOCK_M: tl.constexpr):
        """(expert, first row of the tile, end of the expert's rows, whether the tile exists)
        for M tile `pid_m` of the expert-sorted rows: the tiles each expert needs and their
        running sum, worked out from offs."""
        e = tl.arange(0, E_P2)
        ends = tl.load(offs_ptr + e, mask=e < E, other=0).to(tl.int32)
        starts = tl.load(offs_ptr + e - 1, mask=(e > 0) & (e < E), other=0).to(tl.int32)
        count = tl.where(e < E, tl.maximum(ends - starts, 0), 0)
        tiles = (count + BLOCK_M - 1) // BLOCK_M
        after = tl.cumsum(tiles, 0)  # the tiles of experts 0 .. e
        live = pid_m < tl.sum(tiles, 0)
        expert = tl.minimum(tl.sum((after <= pid_m).to(tl.int32), 0), E - 1)
        mine = e == expert
        first = tl.sum(tl.where(mine, after - tiles, 0), 0)
        row0 = tl.sum(tl.where(mine, starts, 0), 0) + (pid_m - first) * BLOCK_M
        row_end = tl.sum(tl.where(mine, ends, 0), 0)
        return expert, row0, row_end, live

    @triton.jit
    def moe_plain_kernel(x_ptr, w_ptr, offs_ptr, y_ptr, R, N, K: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         UPCAST: tl.constexpr):
        pid = tl.program_id(0)
        m_tiles = tl.cdiv(R, BLOCK_M) + E
        pid_n = pid // m_tiles  # consecutive programs: an expert's M tiles on one N tile (its weights in L2)
        pid_m = pid % m_tiles
        expert, row0, row_end, live = _tile(offs_ptr, pid_m, E, E_P2, BLOCK_M)
        if live:
            rows = row0 + tl.arange(0, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            ks = tl.arange(0, BLOCK_K)
            rmask = rows < row_end
            cmask = cols < N
            xp = x_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :]
            wp = w_ptr + expert.to(tl.int64) * N * K + cols.to(tl.int64)[None, :] * K + ks[:, None]
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kmask = (k0 + ks) < K
                a = tl.load(xp, mask=rmask[:, None] & kmask[None, :], other=0.0)
                b = tl.load(wp, mask=kmask[:, None] & cmask[None, :], other=0.0)
                if UPCAST:  # the interpreter's bf16 dot multiplies the bit patterns (Triton 3.6)
                    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
                else:
                    acc = tl.dot(a, b, acc)
                xp += BLOCK_K
                wp += BLOCK_K
            yp = y_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
            tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])

    @triton.jit
    def moe_swiglu_kernel(x_ptr, w_ptr, offs_ptr, y_ptr, R, N, K: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         UPCAST: tl.constexpr):
        # N: the weight's rows (g's, then u's); the output has N // 2 columns
        pid = tl.program_id(0)
        H = N // 2
        m_tiles = tl.cdiv(R, BLOCK_M) + E
        pid_n = pid // m_tiles
        pid_m = pid % m_tiles
        expert, row0, row_end, live = _tile(offs_ptr, pid_m, E, E_P2, BLOCK_M)
        if live:
            rows = row0 + tl.arange(0, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            ks = tl.arange(0, BLOCK_K)
            rmask = rows < row_end
            cmask = cols < H
            xp = x_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :]
            gp = w_ptr + expert.to(tl.int64) * N * K + cols.to(tl.int64)[None, :] * K + ks[:, None]
            up = gp + H * K
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kmask = (k0 + ks) < K
                a = tl.load(xp, mask=rmask[:, None] & kmask[None, :], other=0.0)
                bg = tl.load(gp, mask=kmask[:, None] & cmask[None, :], other=0.0)
                bu = tl.load(up, mask=kmask[:, None] & cmask[None, :], other=0.0)
                if UPCAST:
                    acc_g = tl.dot(a.to(tl.float32), bg.to(tl.float32), acc_g)
                    acc_u = tl.dot(a.to(tl.float32), bu.to(tl.float32), acc_u)
                else:
                    acc_g = tl.dot(a, bg, acc_g)
                    acc_u = tl.dot(a, bu, acc_u)
                xp += BLOCK_K
                gp += BLOCK_K
                up += BLOCK_K
            out = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
            yp = y_ptr + rows.to(tl.int64)[:, None] * H + cols[None, :]
            tl.store(yp, out.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])

    moe_plain = triton.autotune(configs=_configs(), key=["R", "N", "K"])(moe_plain_kernel)
    moe_swiglu = triton.autotune(configs=_configs(), key=["R", "N", "K"])(moe_swiglu_kernel)


def _interpreted() -> bool:
    """Under TRITON_INTERPRET=1 (the CPU tests): the interpreter cannot autotune (no driver to
    time on), its bf16 tl.dot multiplies bit patterns and its fp32 -> bf16 cast truncates (Triton
    3.6), so the kernels run at one configuration, convert their tiles to fp32 before the dot
    (exact products either way) and store fp32, rounded to bf16 by torch."""
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def _kernels(tuned: bool = True):
    """The plain and SwiGLU kernels: autotuned, or the bare ones (`tuned` false, a config
    given at the launch: the tests under TRITON_INTERPRET)."""
    if triton is None:
        raise ImportError(f"the Triton arms need triton: {_NO_TRITON}")
    return (moe_plain, moe_swiglu) if tuned and not _interpreted() else (moe_plain_kernel, moe_swiglu_kernel)


def _launch(kernel, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, cols: int, **config) -> torch.Tensor:
    """One launch: the grid for the worst case of M tiles, ceil(R / BLOCK_M) + E (each expert's
    last tile may be partial), times the N tiles of the output's `cols` columns. `config`:
    BLOCK_M, BLOCK_N, BLOCK_K for a bare kernel (the autotuned one picks its own)."""
    R, K = x.shape
    E, N, _ = w.shape
    interp = _interpreted()  # the interpreter's fp32 -> bf16 cast truncates: round in torch instead
    y = torch.empty((R, cols), dtype=torch.float32 if interp else x.dtype, device=x.device)
    x, w = x.contiguous(), w.contiguous()
    offs = offs.to(torch.int32)

    def grid(meta):
        return ((triton.cdiv(R, meta["BLOCK_M"]) + E) * triton.cdiv(cols, meta["BLOCK_N"]),)

    kernel[grid](x, w, offs, y, R, N, K, E=E, E_P2=triton.next_power_of_2(E), UPCAST=interp, **config)
    return y.to(x.dtype) if interp else y


INTERPRETED_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}  # the one configuration interpreted


def triton_grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _launch(_kernels()[0], x, w, offs, w.shape[1], **(INTERPRETED_CONFIG if _interpreted() else {}))


def triton_grouped_swiglu(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _launch(_kernels()[1], x, w, offs, w.shape[1] // 2, **(INTERPRETED_CONFIG if _interpreted() else {}))


def triton_untuned(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, swiglu: bool = False,
                   block_m: int = 16, block_n: int = 32, block_k: int = 32) -> torch.Tensor:
    """The Triton kernels at one configuration, without autotuning (tests under
    TRITON_INTERPRET, where every configuration would be run)."""
    cols = w.shape[1] // 2 if swiglu else w.shape[1]
    return _launch(_kernels(False)[int(swiglu)], x, w, offs, cols, BLOCK_M=block_m, BLOCK_N=block_n,
                   BLOCK_K=block_k)
