"""Decode attention's LEAN launches (issue 21): the (sequence, KV head, token) work cut evenly
over one wave of blocks (stream-K). The spec's grid, the kernel's segment arithmetic (its lines
are the ones tools/attn_model.py's `lean_segments` mirrors) and the model's answer."""

from __future__ import annotations

import random
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from runner.ops.reference import decode_attention

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import attn_model  # noqa: E402

from .conftest import shipped_spec  # noqa: E402
from .test_decode_waves import launch  # noqa: E402
from .test_decode_waves import sizes as waves_sizes  # noqa: E402

SPEC = shipped_spec(ROOT / "pipelines/decode-attention-h200.yaml")
LEAN = [dict(c) for c in SPEC.space if c["LEAN"]]
SMS = 132
TEMPLATE = (ROOT / "kernel_templates/decode_attention.cu.j2").read_text()


def sizes(seed: int, n: int) -> list[tuple[int, int]]:
    """The WAVES tests' sizes that LEAN serves (L >= 512), and the points the probes timed."""
    out = [(1, 512), (1, 513), (64, 512), (6, 5150), (2, 1735), (1, 8192), (7, 6958), (16, 131072), (3, 777)]
    return out + [(B, L) for B, L in waves_sizes(seed, 2 * n) if L >= 512][:n - len(out)]


def test_the_space_holds_the_lean_configurations():
    assert len(LEAN) == 3
    assert sorted((c["NW"], c["VEC"], c["PVM"]) for c in LEAN) == [(8, 8, 1), (8, 8, 2), (8, 16, 1)]
    assert all(c["STAGES"] == 2 and c["SPLIT"] == 128 and c["WAVES"] == 0 and c["BULK"] == 0 for c in LEAN)
    # the kernel's lines are the ones the model mirrors
    for line in ("const long long c0 = blockIdx.x * PC / G, c1 = (blockIdx.x + 1) * PC / G;",
                 "const long long gfirst = ((pc0 + 1) * G - 1) / PC;",
                 "const int ns = (int)(((pc0 + (len + TW - 1) / TW) * G - 1) / PC - gfirst) + 1;",
                 "const int tok0 = (int)(max(c0, pc0) - pc0) * TW;",
                 "const int end = min((int)(min(c1, pc0 + C) - pc0) * TW, len);"):
        assert line in TEMPLATE, line
    # a segment's early exits go on to the block's next segment
    combine = (ROOT / "kernel_templates/common/decode_attn_combine.cuh.j2").read_text()
    assert "return" not in combine.replace("LEAVE_SPLIT", "")


def test_lean_serves_from_512_tokens_and_a_lean_kernel_serves_every_point_there():
    for B, L in sizes(3, 200):
        for cfg in LEAN:
            env, _ = launch(cfg, B, L)
            assert SPEC.kernel.serves({**env})
    for cfg in LEAN:
        env, _ = launch(cfg, 4, 511)
        assert not SPEC.kernel.serves({**env})


@pytest.mark.parametrize("cfg", LEAN, ids=lambda c: f"NW{c['NW']}-VEC{c['VEC']}")
def test_a_lean_grid_is_one_wave_of_even_blocks_and_covers_every_live_token_once(cfg):
    rng = random.Random(cfg["NW"] * 100 + cfg["VEC"])
    for B, L in sizes(cfg["NW"] + cfg["VEC"], 120):
        env, grid = launch(cfg, B, L)
        tw = cfg["TW"]
        # at most the blocks resident at once (the LEAN kernels' 208 registers, their rings)
        per_sm = min(233472 // (env["RING"] + 2048), 65536 // (cfg["NW"] * 32 * 208))
        assert 1 <= grid <= SMS * per_sm
        C = -(-L // tw)
        shares = [(x + 1) * B * 8 * C // grid - x * B * 8 * C // grid for x in range(grid)]
        assert max(shares) - min(shares) <= 1 and min(shares) * tw >= 256, (B, L, grid)
        lens = [L] * B if rng.random() < 0.5 else [rng.randint(1, L) for _ in range(B)]
        lens[0] = L
        segs = attn_model.lean_segments(B, L, 8, grid, tw, lens)
        by_pair = defaultdict(list)
        for x, bsegs in enumerate(segs):
            pairs = [(b, kvh) for b, kvh, *_ in bsegs]
            assert len(set(pairs)) == len(pairs), "a block with two segments of one pair"
            for b, kvh, s, ns, t0, end in bsegs:
                by_pair[(b, kvh)].append((s, ns, t0, end))
        assert set(by_pair) == {(b, h) for b in range(B) for h in range(8)}
        cap = min(-(-L // 128), attn_model.MAXS)
        for (b, kvh), got in by_pair.items():
            got.sort()
            ns = got[0][1]
            # the live segments are 0 .. ns - 1, all agree on ns, inside the workspace's records
            assert [g[0] for g in got] == list(range(ns)) and {g[1] for g in got} == {ns}
            assert ns <= cap, (B, L, ns, cap)
            # end to end from token 0 to lens[b], each token in one segment
            assert got[0][2] == 0 and got[-1][3] == lens[b]
            assert all(a[3] == c[2] for a, c in zip(got, got[1:]))
            assert all(t0 < end for _, _, t0, end in got)


def test_a_segments_tiles_cover_it_once():
    for t0, end in ((0, 1), (0, 256), (48, 300), (4096, 4099), (16, 17), (0, 2048)):
        for nw in (4, 8):
            seen = [t for tiles in attn_model.segment_tiles(t0, end, nw, 16) for _, toks in tiles for t in toks]
            assert sorted(seen) == list(range(t0, end))
            assert attn_model.segment_tiles(t0, end, nw, 16)[0], "warp 0 without a tile"


def test_the_lean_model_is_exact_and_independent_of_the_finishing_order():
    """The model at a grid where blocks cross pairs (B 3, L 1000, 2 KV heads: 378 chunks over
    7 blocks of 54), at ragged lengths with one sequence of a single token, against the
    float64 reference; bitwise the same when the blocks take their tickets in another order."""
    B, L, grid = 3, 1000, 7
    g = torch.Generator().manual_seed(11)
    qb, kb, vb = (torch.randn(*shape, generator=g, dtype=torch.float64).to(torch.bfloat16)
                  for shape in ((B, 8, 128), (B, L, 2, 128), (B, L, 2, 128)))
    lens = torch.tensor([1000, 1, 613], dtype=torch.int32)
    want = decode_attention(*(x.double() for x in (qb, kb, vb)), lens)
    out, combined, counters = attn_model.run_lean(qb, kb, vb, lens, grid, 4, 16)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)
    assert all(c == 0 for c in counters.values())
    segs = attn_model.lean_segments(B, L, 2, grid, 16, lens)
    assert max(len(s) for s in segs) >= 2, "no block crosses into a second pair"
    assert any(len(order) > 1 for order in combined.values())
    perm = list(range(grid))
    random.Random(5).shuffle(perm)
    assert torch.equal(out, attn_model.run_lean(qb, kb, vb, lens, grid, 4, 16, finish_order=perm)[0])
