"""Decode attention's WAVES launches (issue 21): the splits sized at the launch so that the
grid fills whole waves. The spec's derived values, the kernel's own recomputation of a split
from its grid, and the split kernel's model (tools/attn_model.py) at those splits."""

from __future__ import annotations

import math
import random
import re
import sys
from pathlib import Path

import pytest
import torch

from runner.build.builder import Builder
from runner.ops.reference import decode_attention

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import attn_model  # noqa: E402

from .conftest import shipped_spec  # noqa: E402

SPEC = shipped_spec(ROOT / "pipelines/decode-attention-h200.yaml")
CONFIGS = [dict(c) for c in SPEC.space]
WAVED = [c for c in CONFIGS if c["WAVES"]]
SMS = 132


def kernel_split(L: int, grid: int, B: int, hkv: int) -> tuple[int, int]:
    """The kernel's lines (common/decode_attn_block.cuh.j2, WAVES > 0): (ns_all, split)."""
    ns_all = grid // (B * hkv)
    return ns_all, ((L + ns_all - 1) // ns_all + 127) // 128 * 128


def launch(cfg: dict, B: int, L: int) -> tuple[dict, int]:
    env = {"B": B, "L": L, **cfg}
    env.update(SPEC.kernel.derived(env))
    return env, Builder(SPEC).geometry(cfg, [{"B": B, "L": L}])[0]["grid"][0]


def sizes(seed: int, n: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = [(1, 128), (1, 131072), (64, 32768), (19, 2930), (5, 15139), (13, 13521), (9, 4504),
           (1, 129), (64, 128), (3, 40000)]
    while len(out) < n:
        B = rng.randint(1, 64)
        L = int(round(math.exp(rng.uniform(math.log(128), math.log(131072)))))
        if B * L <= 2 ** 21:
            out.append((B, L))
    return out


def test_the_space_holds_the_waved_configurations():
    assert len(CONFIGS) == 95 and len(WAVED) == 15
    assert {c["WAVES"] for c in WAVED} == {1, 2, 4}
    assert all(c["STAGES"] == 2 and c["SPLIT"] == 128 for c in WAVED)
    # the kernel's lines are the ones this file models
    text = (ROOT / "kernel_templates/common/decode_attn_block.cuh.j2").read_text()
    assert "const int ns_all = gridDim.x / (B * HKV);" in text
    assert "const int split = ((L + ns_all - 1) / ns_all + 127) / 128 * 128;" in text
    split_text = (ROOT / "kernel_templates/common/decode_attn_split.cuh.j2").read_text()
    assert not re.search(r"\bSPLIT\b", split_text), "a split's tokens come from `split` alone"


@pytest.mark.parametrize("cfg", WAVED, ids=lambda c: f"NW{c['NW']}-VEC{c['VEC']}-W{c['WAVES']}")
def test_a_waved_launch_covers_the_context_and_its_kernel_finds_the_same_split(cfg):
    for B, L in sizes(cfg["NW"] * 100 + cfg["VEC"] + cfg["WAVES"], 300):
        env, grid = launch(cfg, B, L)
        spl, ns = env["SPL"], env["NS"]
        # a split is a whole number of 128-token chunks, and every warp has a tile of it
        assert spl % 128 == 0 and spl >= cfg["NW"] * cfg["TW"]
        # every token of the longest sequence in exactly one split, none empty
        assert (ns - 1) * spl < L <= ns * spl, (B, L, spl, ns)
        # the workspace's records (at most 128, at most one a 128 tokens) hold the splits
        assert ns <= min(128, -(-L // 128))
        assert SPEC.kernel.serves is None or SPEC.kernel.serves({**env})
        assert grid == B * 8 * ns
        # the kernel works out the same split from its grid
        assert kernel_split(L, grid, B, 8) == (ns, spl), (B, L)


@pytest.mark.parametrize("waves", [1, 2, 4])
def test_waved_grids_fill_their_waves(waves):
    """Where the context has room for the splits (no cap), the grid fills at least WAVES
    waves, and no more waves than WAVES' worth of splits needs; at the secret points where
    session 22's fixed SPLIT ran 1.15 to 1.64 waves, some waved grid fills 0.84 or more of its
    waves, 0.15 more than the fixed one."""
    for cfg in (c for c in WAVED if c["WAVES"] == waves):
        for B, L in sizes(waves, 300):
            env, grid = launch(cfg, B, L)
            wave = SMS * env["PER_SM"]
            need = -(-(B * 8 * env["NSW"]) // wave)  # the waves WAVES' fewest splits take
            assert -(-grid // wave) <= need, (B, L)
            if env["NSF"] < min(128, -(-L // 128)) and env["NS"] == env["NSF"]:
                assert grid >= waves * wave
                assert grid + B * 8 > need * wave  # one more split a sequence would not fit
    # session 22's compare: (B, L) and the fixed SPLIT its table chose there (NW 8, one block
    # an SM): 1.15 to 1.64 waves of blocks, 0.58 to 0.82 of them filled
    for B, L, fixed in [(19, 2930, 4096), (5, 15139, 4096), (13, 13521, 8192), (9, 4504, 2048),
                        (19, 495, 512), (5, 1697, 512)]:
        blocks = B * 8 * -(-L // fixed)
        was = blocks / (-(-blocks // SMS) * SMS)
        fills = []
        for cfg in WAVED:
            env, grid = launch(cfg, B, L)
            wave = SMS * env["PER_SM"]
            fills.append(grid / (-(-grid // wave) * wave))
        assert was <= 0.82 and max(fills) >= max(0.84, was + 0.15), (B, L, was, max(fills))


def test_the_model_is_exact_at_waved_splits():
    """The split kernel's model (every index the kernel computes) at a split that is not a
    power of two, as WAVES launches make them (384 tokens at 5x5000, NW 4, one wave), against
    the float64 reference at ragged lengths, and bitwise the same in another finishing order."""
    cfg = next(c for c in WAVED if c["NW"] == 4 and c["WAVES"] == 1 and c["VEC"] == 16)
    B, L = 5, 5000
    env, grid = launch(cfg, B, L)
    split = env["SPL"]
    assert (split, env["NS"], grid) == (384, 14, B * 8 * 14)
    # the model on 8 query heads and 2 KV heads (the spec's GQA group of 4, a quarter of its
    # blocks): the split, the tiles and the combine are each KV head's alike
    g = torch.Generator().manual_seed(7)
    qb, kb, vb = (torch.randn(*shape, generator=g, dtype=torch.float64).to(torch.bfloat16)
                  for shape in ((B, 8, 128), (B, L, 2, 128), (B, L, 2, 128)))
    lens = torch.tensor([L, 1, split, split + 1, 2999], dtype=torch.int32)
    want = decode_attention(*(x.double() for x in (qb, kb, vb)), lens)
    out, combined, counters = attn_model.run(qb, kb, vb, lens, split, cfg["NW"], cfg["TW"])
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)
    assert all(c == 0 for c in counters.values())
    for (b, kvh), order in combined.items():
        assert order == list(range(-(-int(lens[b]) // split)))
    perm = list(range(len(list(attn_model.blocks(B, L, 2, split)))))
    random.Random(2).shuffle(perm)
    assert torch.equal(out, attn_model.run(qb, kb, vb, lens, split, cfg["NW"], cfg["TW"], finish_order=perm)[0])


def test_the_probe_takes_the_points_it_times():
    from .conftest import load_script

    probe = load_script("tools/attn_probe.py")
    assert probe.points_arg("19x2930,5X15139") == [(19, 2930), (5, 15139)]
    for bad in ("19x2930x3", "19-2930", "0x128", ""):
        with pytest.raises(Exception, match="BxL pairs"):
            probe.points_arg(bad)
