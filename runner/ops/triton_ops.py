"""Triton kernels for `pipe compare`: the alternative a user would otherwise write.

Each is a plain, well-known Triton formulation with `triton.autotune` over block
size and warps (keyed on the row length), and the same signature as the op's
torch reference, so the judge calls both the same way. Rows that fit one block
are held in registers (one read); longer rows loop over blocks (an online pass,
then a second read, as the Triton tutorials and Liger kernels do).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCKS = (1024, 2048, 4096, 8192, 16384, 32768)
_WARPS = (4, 8, 16)
_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in _BLOCKS for w in _WARPS]


def _prune(configs, named_args, **kwargs):
    """No block much longer than the row: BLOCK up to the row length rounded up to a power of two."""
    n = named_args.get("N", named_args.get("V"))
    top = triton.next_power_of_2(n)
    kept = [c for c in configs if c.kwargs["BLOCK"] <= max(top, _BLOCKS[0])]
    return kept or configs[:1]


def _one(args):
    return args["BLOCK"] >= args.get("N", args.get("V", 0))


@triton.autotune(configs=_CONFIGS, key=["N"], prune_configs_by={"early_config_prune": _prune})
@triton.heuristics({"ONE": _one})
@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr, ONE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr = x_ptr + row * N
    yr = y_ptr + row * N
    cols = tl.arange(0, BLOCK)
    if ONE:
        x = tl.load(xr + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(yr + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=cols < N)
    else:
        m = tl.full([BLOCK], -float("inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, N, BLOCK):
            c = start + cols
            x = tl.load(xr + c, mask=c < N, other=-float("inf")).to(tl.float32)
            mn = tl.maximum(m, x)
            s = s * tl.exp(tl.where(m == -float("inf"), 0.0, m - mn)) + tl.where(x == -float("inf"), 0.0, tl.exp(x - mn))
            m = mn
        mx = tl.max(m, axis=0)
        total = tl.sum(s * tl.exp(tl.where(m == -float("inf"), -float("inf"), m - mx)), axis=0)
        for start in range(0, N, BLOCK):
            c = start + cols
            x = tl.load(xr + c, mask=c < N, other=-float("inf")).to(tl.float32)
            tl.store(yr + c, (tl.exp(x - mx) / total).to(y_ptr.dtype.element_ty), mask=c < N)


def softmax(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.shape[-1]
    _softmax_kernel[(x.numel() // n,)](x, y, n)
    return y


@triton.autotune(configs=_CONFIGS, key=["N"], prune_configs_by={"early_config_prune": _prune})
@triton.heuristics({"ONE": _one})
@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK: tl.constexpr, ONE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr = x_ptr + row * N
    yr = y_ptr + row * N
    cols = tl.arange(0, BLOCK)
    if ONE:
        x = tl.load(xr + cols, mask=cols < N, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(yr + cols, (x * r * w).to(y_ptr.dtype.element_ty), mask=cols < N)
    else:
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, N, BLOCK):
            c = start + cols
            x = tl.load(xr + c, mask=c < N, other=0.0).to(tl.float32)
            acc += x * x
        r = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
        for start in range(0, N, BLOCK):
            c = start + cols
            x = tl.load(xr + c, mask=c < N, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
            tl.store(yr + c, (x * r * w).to(y_ptr.dtype.element_ty), mask=c < N)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.shape[-1]
    _rmsnorm_kernel[(x.numel() // n,)](x, w, y, n, eps)
    return y


@triton.autotune(configs=_CONFIGS, key=["V"], prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _xent_kernel(x_ptr, t_ptr, loss_ptr, V, ignore, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr = x_ptr + row * V
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, V, BLOCK):  # online logsumexp: one max and one exp per element
        c = start + cols
        x = tl.load(xr + c, mask=c < V, other=-float("inf")).to(tl.float32)
        mn = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - mn) + tl.sum(tl.exp(x - mn), axis=0)
        m = mn
    t = tl.load(t_ptr + row)
    keep = t != ignore
    xt = tl.load(xr + tl.where(keep, t, 0)).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(keep, m + tl.log(s) - xt, 0.0))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    logits = logits.contiguous()
    rows, v = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _xent_kernel[(rows,)](logits, targets, loss, v, ignore_index)
    return loss
