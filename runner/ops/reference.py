"""Reference implementations: what production torch calls for each op.

Each is called twice by the judge: on float64 copies of the inputs for the
verdict (so the whole computation runs in float64; a function's `widens` names
inputs it gets in their own dtype and widens itself), and on the op's own dtype
for the baseline timing (so it is the kernel a user would otherwise run).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Loss per row in float32 (float64 when the logits are float64)."""
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return F.cross_entropy(logits.to(acc), targets, ignore_index=ignore_index, reduction="none")


# ----------------------------------------------------------------------------- decode attention
# One query token per sequence (issue 21). q [B, HQ, D], k and v [B, L, HKV, D] (the serving
# layout: the L axis before the heads), lens int [B] with 1 <= lens[b] <= L: sequence b attends
# to its first lens[b] tokens. Query head h reads KV head h // (HQ // HKV) (enable_gqa, as
# repeat_interleave). The scale is SDPA's, 1 / sqrt(D).


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """out [B, HQ, D] in q's dtype. On float64 inputs (the verdict) the whole computation is
    float64 with the positions at and past lens[b] masked out; on bf16 or fp16 inputs (the
    baseline) torch's SDPA with enable_gqa and a boolean mask built on the device (no host
    sync, so a CUDA graph captures it): the kernel a user would call for ragged lengths."""
    B, HQ, D = q.shape
    L, HKV = k.shape[1], k.shape[2]
    pos = torch.arange(L, device=q.device)
    keep = pos[None, :] < lens.to(device=q.device, dtype=torch.int64)[:, None]  # [B, L]
    if q.dtype != torch.float64:
        mask = keep[:, None, None, :]  # [B, 1, 1, L] over the heads and the one query
        o = F.scaled_dot_product_attention(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, enable_gqa=True)
        return o[:, :, 0, :]
    g = HQ // HKV
    qf = q.to(torch.float64).view(B, HKV, g, D)
    kf = k.to(torch.float64)
    vf = v.to(torch.float64)
    s = torch.einsum("bhgd,blhd->bhgl", qf, kf) / math.sqrt(D)  # [B, HKV, G, L]
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    # V rows at and past lens[b] are memory the op does not read: a weight of 0 times what they
    # hold (NaN or Inf in verification's serving draws, `serving` below) must not reach the answer
    vf = torch.where(keep[:, :, None, None], vf, torch.zeros((), dtype=vf.dtype, device=vf.device))
    o = torch.einsum("bhgl,blhd->bhgd", p, vf)
    return o.reshape(B, HQ, D)


# Paged KV (issue 21, item 2), the layout of vLLM's and FlashInfer's "NHD" caches: a pool of
# NP pages of PAGE tokens, k_cache and v_cache [NP, PAGE, HKV, D]; block_table int [B, MAXP],
# entry j of sequence b the pool page holding its tokens j * PAGE .. j * PAGE + PAGE - 1;
# lens[b] <= MAXP * PAGE. Only the first ceil(lens[b] / PAGE) entries of a row mean anything.


def gather_pages(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[NP, PAGE, HKV, D] through [B, MAXP] -> the contiguous [B, MAXP * PAGE, HKV, D] (one
    index_select on the device: no host sync, so a CUDA graph captures it)."""
    B, maxp = block_table.shape
    _, page, hkv, d = cache.shape
    idx = block_table.reshape(-1).to(device=cache.device, dtype=torch.int64)
    return cache.index_select(0, idx).view(B, maxp * page, hkv, d)


def live_table(block_table: torch.Tensor, lens: torch.Tensor, page: int) -> torch.Tensor:
    """The table with every entry past a sequence's last page (slot j >= ceil(lens[b] / PAGE)) set
    to page 0: those entries may hold anything (-1, a page past the pool, a stale page; a serving
    engine leaves them so), and an index_select through them faults. On the device, no host sync."""
    maxp = block_table.shape[1]
    used = (lens.to(device=block_table.device, dtype=torch.int64) + page - 1) // page
    slot = torch.arange(maxp, device=block_table.device)
    return torch.where(slot[None, :] < used[:, None], block_table, torch.zeros((), dtype=block_table.dtype,
                                                                              device=block_table.device))


def decode_attention_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """decode_attention over paged K and V: the pages gathered into contiguous [B, L, HKV, D]
    buffers (L = MAXP * PAGE), then `decode_attention`. The bf16 path (the baseline) is what a
    user without a paged kernel runs: a gather of the whole cache, then the masked SDPA. The
    float64 path (the verdict) gathers a few sequences at a time, so that it holds at most
    about 2^18 tokens of gathered float64 K and V beside the cache (4 GiB at 8 heads of 128);
    the caches may come in any floating dtype (the judge's copies keep theirs: `widens`)."""
    B, maxp = block_table.shape
    block_table = live_table(block_table, lens, k_cache.shape[1])  # entries past the last page: never used
    if q.dtype != torch.float64:
        return decode_attention(q, gather_pages(k_cache, block_table), gather_pages(v_cache, block_table), lens)
    step = max(1, (1 << 18) // (maxp * k_cache.shape[1]))
    outs = []
    for b0 in range(0, B, step):
        t = block_table[b0:b0 + step]
        outs.append(decode_attention(q[b0:b0 + step], gather_pages(k_cache, t), gather_pages(v_cache, t),
                                     lens[b0:b0 + step]))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


# The judge hands a reference private float64 copies of its floating inputs, but those it names
# here in their own dtype: the float64 path above widens each gathered part (decode_attention's
# .to(float64)), so the caches are never whole in float64 (32 GiB at 2^21 tokens of 8 x 128).
decode_attention_paged.widens = ("k_cache", "v_cache")


# Verification's value sets as a serving engine hands them (`serving`, called by the judge on
# every verification value set after it is drawn: judge/inputs.make_inputs; never on timed calls,
# which hold every sequence at its full length). The judge's own draws kept three properties no
# serving engine promises (red team, session 56): memory a sequence does not own (K and V rows at
# and past lens[b], table entries past its last page) always held finite values of the spec's
# distributions and in-pool pages, and no two sequences shared a page (a permutation). A kernel
# that read past the length (whole last tiles, every page of a split, a prefetch through the next
# entry) or that keyed its work by the physical page was `ok` and faults, or is wrong, for users.
# Each draw below poisons what the op does not read and, in the paged op, shares prefixes.

POISON_ROWS = (float("nan"), float("inf"), float("-inf"))


def _poison(n: int, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """n poison values for rows the op does not read: NaN, +Inf, -Inf and the dtype's extremes."""
    big = torch.finfo(dtype).max
    vals = torch.tensor([*POISON_ROWS, big, -big], dtype=torch.float64)
    return vals[torch.randint(0, len(vals), (n,), generator=gen)].to(dtype)


def _poison_rows(x: torch.Tensor, rows: torch.Tensor, gen: torch.Generator) -> None:
    """x [..., H, D] with each row of `rows` (a bool mask of x's leading dimensions) poisoned
    whole, each row its own poison value (in place)."""
    n = int(rows.sum())
    if n:
        vals = _poison(n, gen, x.dtype).to(x.device)
        x[rows.to(x.device)] = vals.view(n, *([1] * (x.dim() - rows.dim())))


def _serving_contiguous(inputs: dict, gen: torch.Generator) -> None:
    """K and V rows at and past lens[b]: poisoned (the op never reads them)."""
    k, v, lens = inputs["k"], inputs["v"], inputs["lens"]
    L = k.shape[1]
    past = torch.arange(L)[None, :] >= lens.cpu().long()[:, None]  # [B, L]
    if not _poisons(gen):  # a user's memory past the length: stale finite rows, as drawn
        return
    _poison_rows(k, past, gen)
    _poison_rows(v, past, gen)


POISON_SHARE = 0.5  # value sets whose unread memory is poisoned; the others keep the draws' values


def _poisons(gen: torch.Generator) -> bool:
    """Whether this value set's unread memory is poisoned (a draw of its own). Never always: with
    every unread row NaN, Inf or the dtype's largest in every verification value set, a kernel that
    finds an ordinary finite value at row lens[b] (a user's stale cache) knew it was not judged
    (review of session 56)."""
    return bool(torch.rand((), generator=gen) < POISON_SHARE)


decode_attention.serving = _serving_contiguous

# out-of-pool values a serving engine's table may hold past a sequence's last page
OUT_OF_POOL = ("-1", "pool", "pool + 2^20", "INT32_MAX", "INT32_MIN")


def _serving_paged(inputs: dict, gen: torch.Generator) -> None:
    """Shared prefixes (in half the value sets, each sequence but the first, at a coin's toss, has
    its first j live entries pointing at the full pages of an earlier sequence's, as prefix caching
    and parallel sampling map them), then every entry past a sequence's last page out of the pool
    (-1, the pool's size, beyond it, INT32_MAX, INT32_MIN), then every pool slot no live entry
    reads (slots past lens[b] in a last page, pages nobody's table names) poisoned in K and V."""
    table, lens, kc, vc = inputs["block_table"], inputs["lens"], inputs["k_cache"], inputs["v_cache"]
    B, maxp = table.shape
    npool, page = kc.shape[:2]
    t = table.cpu().long()
    ln = lens.cpu().long()
    used = (ln + page - 1) // page  # live entries of each row
    full = ln // page  # full pages of each row (a shareable prefix)
    if B > 1 and bool(torch.rand((), generator=gen) < 0.5):
        for b in range(1, B):
            if bool(torch.rand((), generator=gen) < 0.5):
                d = int(torch.randint(0, b, (), generator=gen))
                top = min(int(full[d]), int(used[b]))
                if top >= 1:
                    j = int(torch.randint(1, top + 1, (), generator=gen))
                    t[b, :j] = t[d, :j]
    slot = torch.arange(maxp)
    live = slot[None, :] < used[:, None]  # [B, maxp]
    past = ~live
    n = int(past.sum())
    if n and _poisons(gen):
        kinds = torch.randint(0, len(OUT_OF_POOL), (n,), generator=gen)
        vals = torch.tensor([-1, npool, npool + (1 << 20), 2 ** 31 - 1, -2 ** 31], dtype=torch.int64)[kinds]
        t[past] = vals
    elif n:  # stale in-pool pages (a serving engine's table keeps freed pages' ids): never always out of pool
        t[past] = torch.randint(0, npool, (n,), generator=gen)
    table.copy_(t.to(table.dtype))
    if not _poisons(gen):  # the unread slots keep the draws' finite values, as a user's stale cache does
        return
    # the pool slots some live entry reads: rows 0 .. n - 1 of page t[b, j], n its tokens there
    toks = (ln[:, None] - slot[None, :] * page).clamp(0, page)  # [B, maxp]
    reads = (torch.arange(page)[None, None, :] < toks[:, :, None]) & live[:, :, None]  # [B, maxp, page]
    read = torch.zeros(npool, page, dtype=torch.int32)
    pages = t[live]
    read.index_add_(0, pages, reads[live].to(torch.int32))
    unread = read == 0  # [npool, page]
    _poison_rows(kc, unread, gen)
    _poison_rows(vc, unread, gen)


decode_attention_paged.serving = _serving_paged


# The kernel's workspace (kernel_templates/decode_attention.cu.j2, the spec's kernel.scratch):
# per (b, KV head) a counter and up to WS_MAX_SPLITS records of GROUP * 132 floats. The kernel
# finds it zero and leaves it zero; the judge checks that after every checked call.
WS_MIN_SPLIT = 128
WS_MAX_SPLITS = 128
WS_RECORD = 132


def decode_attention_ws_row(L: int, group: int) -> int:
    """Floats of one (b, KV head) row of the workspace."""
    return 4 + min(-(-L // WS_MIN_SPLIT), WS_MAX_SPLITS) * group * WS_RECORD


# ----------------------------------------------------------------------------- MoE experts
# The grouped GEMM of a mixture-of-experts layer (issue 22, docs/moe.md). x [R, K], its rows
# sorted by expert (R = tokens x topk); w [E, N, K], each expert's weight as nn.Linear keeps it
# (K contiguous); offs int32 [E], the cumulative END row of each expert's group (torch's
# _grouped_mm convention: non-decreasing, offs[E - 1] == R, a group empty where two ends are
# equal). y [R, N] with y[r] = x[r] @ w[e(r)]^T, e(r) the expert whose group holds row r. The
# SwiGLU variant fuses the activation: y [R, N / 2] = silu(g) * u, g the columns [0, N / 2) and
# u the columns [N / 2, N) of x @ w^T.


def _grouped_bf16(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """What a user calls: torch._grouped_mm on w^T (column-major B, no copy) and int32 offs,
    fp32 accumulation, no host sync (a CUDA graph captures it). On CPU tensors a torch without
    a CPU _grouped_mm gets a loop over the experts instead (2.13 has one)."""
    offs = offs.to(torch.int32)
    try:
        return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
    except (RuntimeError, NotImplementedError, AttributeError):
        if x.is_cuda:
            raise
    return _loop(x, w, offs, x.dtype)


def _loop(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype, mag: bool = False):
    """The grouped GEMM one expert at a time (the ends to the host), into one output of
    `dtype`; with `mag`, also |x| @ |w|^T. Each expert's slice of x and its weight are the only
    temporaries, so a float64 verdict on the largest shapes holds one expert's weight twice
    (|w| for the magnitudes) beside the output."""
    R, N = x.shape[0], w.shape[1]
    y = torch.zeros((R, N), dtype=dtype, device=x.device)
    m = torch.zeros((R, N), dtype=dtype, device=x.device) if mag else None
    start = 0
    for e, end in enumerate(offs.tolist()):
        end = min(int(end), R)
        if end > start:
            xe, we = x[start:end].to(dtype), w[e].to(dtype)
            torch.mm(xe, we.t(), out=y[start:end])
            if mag:
                torch.mm(xe.abs(), we.abs().t(), out=m[start:end])
            del xe, we
        start = max(start, end)
    return (y, m) if mag else y


def _swiglu(y: torch.Tensor) -> torch.Tensor:
    g, u = y.chunk(2, dim=-1)
    return F.silu(g) * u


def moe_gemm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, parts: bool = False):
    """y [R, N] = x[r] @ w[e(r)]^T per row. On float64 inputs (the verdict) a float64 loop over
    the experts on the inputs' device; on bf16 or fp16 inputs (the baseline) torch._grouped_mm.
    `parts` (float64 inputs, op.tolerance.gemm_k): the judge's error budget needs the
    magnitudes too, {"out": y, "acc": y, "abs": |x| @ |w|^T, "epilogue": None}
    (judge/verify.GemmBudget)."""
    if x.dtype != torch.float64 and not parts:
        return _grouped_bf16(x, w, offs)
    if parts:
        y, m = _loop(x, w, offs, torch.float64, mag=True)
        return {"out": y, "acc": y, "abs": m, "epilogue": None}
    return _loop(x, w, offs, torch.float64)


def moe_gemm_swiglu(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, parts: bool = False):
    """y [R, N / 2] = silu(g) * u with [g | u] = x[r] @ w[e(r)]^T. On float64 inputs the whole
    computation is float64; on bf16 inputs torch._grouped_mm, then silu and the product in bf16
    (torch's unfused path: g, u and silu(g) each rounded to bf16). `parts`: {"out": y, "acc":
    [g | u], "abs": |x| @ |w|^T, "epilogue": "swiglu"} (judge/verify.GemmBudget)."""
    if x.dtype != torch.float64 and not parts:
        return _swiglu(_grouped_bf16(x, w, offs))
    if parts:
        acc, m = _loop(x, w, offs, torch.float64, mag=True)
        return {"out": _swiglu(acc), "acc": acc, "abs": m, "epilogue": "swiglu"}
    return _swiglu(_loop(x, w, offs, torch.float64))
