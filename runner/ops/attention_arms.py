"""pipe compare's arms for decode attention (`op.arms` of pipelines/decode-attention-*.yaml):
what a user of torch would call instead of the tuned kernel.

Each is called like the reference, `fn(q, k, v, lens)` with q [B, HQ, D], k and v
[B, L, HKV, D] (bf16), and returns out [B, HQ, D].

- `sdpa_flash`, `sdpa_cudnn`, `sdpa_efficient`: torch's scaled_dot_product_attention forced to
  one backend (enable_gqa), over the whole buffer of L tokens. These fused kernels take no
  per-sequence lengths (flash takes no mask at all), so they do not read `lens`: they are exact
  when every sequence fills the buffer, which is how pipe compare times every point (the
  spec's `lens` is L in timed calls), and each is checked against the float64 reference on
  those inputs before its time counts. A backend that cannot run the shape (the efficient
  kernel has no GQA path) raises, and pipe compare shows it n/a with the reason.
- `flex`: FlexAttention compiled by torch.compile (dynamic shapes), with the lengths as a
  score mod: exact for any lengths, as the reference.

The paged specs (pipelines/decode-attention-paged*-h200.yaml) call theirs like their reference,
`fn(q, k_cache, v_cache, block_table, lens)`. SDPA reads no block table, so:

- `paged_sdpa_flash`: the pages gathered into contiguous [B, MAXP * PAGE, HKV, D] buffers (one
  index_select each, K and V read and written once more), then `sdpa_flash`: what a user of
  torch without a paged kernel runs at full lengths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _sdpa(backend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    return o[:, :, 0, :]


def sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention import SDPBackend

    return _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v)


def sdpa_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention import SDPBackend

    return _sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v)


def sdpa_efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    from torch.nn.attention import SDPBackend

    return _sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v)


_FLEX = None


def _flex_fn():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        def attend(q, k, v, lens):
            def score_mod(score, b, h, q_idx, kv_idx):
                return torch.where(kv_idx < lens[b], score, -float("inf"))

            return flex_attention(q, k, v, score_mod=score_mod, enable_gqa=True)

        _FLEX = torch.compile(attend, dynamic=True)
    return _FLEX


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    o = _flex_fn()(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), lens)
    return o[:, :, 0, :]


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[NP, PAGE, HKV, D] through [B, MAXP] -> [B, MAXP * PAGE, HKV, D] (reference.gather_pages;
    this module stands alone)."""
    B, maxp = block_table.shape
    _, page, hkv, d = cache.shape
    idx = block_table.reshape(-1).to(device=cache.device, dtype=torch.int64)
    return cache.index_select(0, idx).view(B, maxp * page, hkv, d)


def paged_sdpa_flash(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     lens: torch.Tensor) -> torch.Tensor:
    return sdpa_flash(q, _gather(k_cache, block_table), _gather(v_cache, block_table), lens)
