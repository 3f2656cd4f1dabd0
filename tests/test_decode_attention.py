"""Decode attention (issue 21) on the CPU: the float64 reference against a naive loop and
torch's SDPA, and the model of the split kernel's index arithmetic (tools/attn_model.py)."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runner.ops.reference import decode_attention, decode_attention_ws_row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import attn_model  # noqa: E402


def _inputs(B, L, hq, hkv, d=128, seed=0, ragged=True, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, hq, d, generator=g, dtype=dtype)
    k = torch.randn(B, L, hkv, d, generator=g, dtype=dtype)
    v = torch.randn(B, L, hkv, d, generator=g, dtype=dtype)
    lens = torch.randint(1, L + 1, (B,), generator=g, dtype=torch.int32) if ragged else \
        torch.full((B,), L, dtype=torch.int32)
    return q, k, v, lens


def _naive(q, k, v, lens):
    B, hq, d = q.shape
    hkv = k.shape[2]
    out = torch.empty(B, hq, d, dtype=torch.float64)
    for b in range(B):
        n = int(lens[b])
        for h in range(hq):
            kk = k[b, :n, h // (hq // hkv)].double()
            vv = v[b, :n, h // (hq // hkv)].double()
            s = kk @ q[b, h].double() / math.sqrt(d)
            p = torch.exp(s - s.max())
            out[b, h] = (p / p.sum()) @ vv
    return out


@pytest.mark.parametrize("B,L,hq,hkv", [(1, 1, 4, 1), (3, 37, 32, 8), (2, 130, 64, 8), (4, 5, 8, 8)])
def test_reference_against_naive_loop(B, L, hq, hkv):
    q, k, v, lens = _inputs(B, L, hq, hkv, seed=B * 1000 + L)
    ref = decode_attention(q, k, v, lens)
    assert ref.dtype == torch.float64 and ref.shape == (B, hq, 128)
    torch.testing.assert_close(ref, _naive(q, k, v, lens), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("B,L,hq,hkv", [(2, 17, 32, 8), (3, 64, 64, 8), (1, 200, 8, 2)])
def test_reference_against_sdpa(B, L, hq, hkv):
    """Full lengths: SDPA with enable_gqa, no mask; ragged: each sequence cut to its length."""
    q, k, v, lens = _inputs(B, L, hq, hkv, seed=7 + L, ragged=False)
    sd = F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)[:, :, 0]
    torch.testing.assert_close(decode_attention(q, k, v, lens), sd, rtol=1e-12, atol=1e-12)
    q, k, v, lens = _inputs(B, L, hq, hkv, seed=11 + L)
    ref = decode_attention(q, k, v, lens)
    for b in range(B):
        n = int(lens[b])
        sd = F.scaled_dot_product_attention(q[b:b + 1, :, None], k[b:b + 1, :n].transpose(1, 2),
                                            v[b:b + 1, :n].transpose(1, 2), enable_gqa=True)[0, :, 0]
        torch.testing.assert_close(ref[b], sd, rtol=1e-12, atol=1e-12)


def test_baseline_path_masks_on_the_device():
    """The bf16 path (the timed baseline): SDPA with the boolean mask, close to float64."""
    q, k, v, lens = _inputs(3, 50, 32, 8, seed=3)
    out = decode_attention(q.float(), k.float(), v.float(), lens)
    torch.testing.assert_close(out.double(), decode_attention(q, k, v, lens), rtol=1e-4, atol=1e-5)


def test_workspace_row_matches_the_spec_scratch():
    """The spec's kernel.scratch row and the reference module's count agree (the probe sizes
    its workspace by the latter)."""
    from .conftest import shipped_spec

    sp = shipped_spec(ROOT / "pipelines/decode-attention-h200.yaml")
    assert decode_attention_ws_row(131072, 4) == 4 + 128 * 4 * 132
    for L in (128, 129, 1000, 16384, 131072):
        env = {"B": 3, "L": L, **sp.start}
        env.update(sp.kernel.derived(env))
        assert sp.kernel.scratch_shapes(env) == {"ws": [3, 8, decode_attention_ws_row(L, 4)]}


# ----------------------------------------------------------------------------- the kernel's model

CONFIGS = [(128, 2, 16), (128, 8, 16), (256, 4, 32), (512, 4, 16), (1024, 8, 64), (8192, 2, 64)]


@pytest.mark.parametrize("split,nw,tw", CONFIGS)
def test_every_token_below_lens_read_once(split, nw, tw):
    rng = random.Random(split * 31 + nw * 7 + tw)
    for L in (128, 129, 255, 1000, 4099, 20000):
        if -(-L // split) > attn_model.MAXS:
            continue
        lens = sorted({1, 2, tw - 1, tw, tw + 1, split - 1, split, split + 1, L - 1, L,
                       *(rng.randint(1, L) for _ in range(12))})
        for n in (x for x in lens if 1 <= x <= L):
            seen = []
            ns = -(-n // split)
            active = set()
            for _, b, s, kvh in attn_model.blocks(1, L, 1, split):
                warps = attn_model.block_tiles(n, s, split, nw, tw)
                if warps is None:
                    assert s >= ns
                    continue
                active.add(s)
                for tiles in warps:
                    for t0, toks in tiles:
                        assert t0 < min((s + 1) * split, n), "a tile starts at or past its end"
                        assert all(s * split <= t < min((s + 1) * split, n) for t in toks)
                        seen.extend(toks)
            assert sorted(seen) == list(range(n)), (L, n)
            assert active == set(range(ns))  # warp 0 of each active block has a tile
            for s in active:
                assert attn_model.block_tiles(n, s, split, nw, tw)[0], "warp 0 without a tile"


def test_grid_decoding_is_a_bijection():
    for B, L, hkv, split in [(1, 8192, 8, 512), (3, 1000, 8, 128), (16, 131072, 8, 1024), (5, 129, 8, 8192)]:
        got = [(b, s, kvh) for _, b, s, kvh in attn_model.blocks(B, L, hkv, split)]
        ns = -(-L // split)
        assert sorted(got) == [(b, s, h) for b in range(B) for s in range(ns) for h in range(hkv)]
        # the KV heads of one split are neighbours in launch order
        assert got[:hkv] == [(0, 0, h) for h in range(hkv)]


@pytest.mark.parametrize("L,group", [(128, 4), (129, 4), (8192, 4), (131072, 4), (40000, 8), (1 << 20, 4)])
def test_records_inside_the_workspace_and_disjoint(L, group):
    hkv, B = 8, 2
    row = attn_model.ws_row(L, group)
    assert row == decode_attention_ws_row(L, group)
    total = B * hkv * row
    for split in (128, 256, 1024, 8192):
        ns = -(-L // split)
        if ns > attn_model.MAXS:
            continue
        spans = []
        for b in range(B):
            for kvh in range(hkv):
                c = attn_model.counter_offset(b, kvh, L, hkv, group)
                spans.append((c, c + 4))
                for s in range(ns):
                    for h in range(group):
                        o = attn_model.record_offset(b, kvh, s, h, L, hkv, group)
                        assert o % 4 == 0  # 16-byte aligned records
                        spans.append((o, o + attn_model.REC))
        spans.sort()
        assert spans[0][0] >= 0 and spans[-1][1] <= total
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "overlapping records"


# The model runs a block at a time in small torch ops: 8 query heads on 2 KV heads keep the GQA
# group of 4 (the pipelines' 32 on 8) and a split's KV heads side by side in launch order, for a
# quarter of the blocks.

@pytest.mark.parametrize("split,nw,tw", [(128, 2, 16), (128, 4, 32), (256, 8, 16), (1024, 4, 64)])
def test_model_matches_reference_and_is_order_independent(split, nw, tw):
    q, k, v, lens = _inputs(3, 700, 8, 2, seed=split + nw + tw)
    lens[0] = 1
    lens[1] = 700
    ref = decode_attention(q, k, v, lens)
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    refb = decode_attention(*(x.double() for x in (qb, kb, vb)), lens)
    out, combined, counters = attn_model.run(qb, kb, vb, lens, split, nw, tw)
    torch.testing.assert_close(out.double(), refb, rtol=1e-5, atol=1e-6)
    assert (out.double() - ref).abs().max() < 0.1  # the bf16 inputs' rounding only
    assert all(c == 0 for c in counters.values()), "a counter left non-zero"
    for (b, kvh), order in combined.items():
        assert order == list(range(-(-int(lens[b]) // split)))
    # another finishing order of the blocks: bitwise the same answer
    n = len(list(attn_model.blocks(3, 700, k.shape[2], split)))
    perm = list(range(n))
    random.Random(1).shuffle(perm)
    out2, _, _ = attn_model.run(qb, kb, vb, lens, split, nw, tw, finish_order=perm)
    assert torch.equal(out, out2)


def test_model_result_independent_of_the_batch():
    """The deterministic mode: a sequence alone or among others, bitwise the same."""
    q, k, v, lens = _inputs(4, 600, 8, 2, seed=9)
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    out, _, _ = attn_model.run(qb, kb, vb, lens, 128, 4, 16)
    for b in range(4):
        # alone, in a buffer of another L (the grid changes, the sequence's tokens do not)
        n = int(lens[b])
        alone, _, _ = attn_model.run(qb[b:b + 1], kb[b:b + 1, :max(n, 300)], vb[b:b + 1, :max(n, 300)],
                                     lens[b:b + 1], 128, 4, 16)
        assert torch.equal(alone[0], out[b])
