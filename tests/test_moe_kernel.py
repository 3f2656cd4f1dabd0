"""The MoE grouped-GEMM kernel side (issue 22), without a GPU: the tile lookup's host model
covers every row of every expert once on skewed routings, the template renders for every
configuration of every MoE spec (one source for every T), the launch geometry and workspace
match what the kernel addresses, the byte count's form, the float64 answer's budget against a
model of the kernel's arithmetic; NVRTC compiles a sample (slow). The GPU test runs the probe's
verification of each spec's start configuration."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import moe_spec  # noqa: E402

from runner.core.expr import compile_expr  # noqa: E402
from runner.judge.inputs import routing_counts  # noqa: E402

SPECS = [ROOT / "pipelines" / s for s in moe_spec.SPECS]


def small_cfg(**kw):
    cfg = {"E": 64, "N": 2816, "K": 2048, "TOPK": 6, "BM": 16, "BN": 128, "SPLITK": 1, "GM": 1}
    cfg.update(kw)
    return cfg


# -- the tile lookup -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["uniform", "one", "first", "last", "empty", "single", "ragged"])
@pytest.mark.parametrize("T", [1, 3, 16, 77])
def test_tiles_cover_every_row_once_fine(kind, T):
    offs = moe_spec.routing(kind, T, 64, 6, seed=T)
    for bm, gm, sk in ((16, 1, 1), (32, 1, 2), (128, 8, 1), (64, 1, 1)):
        # a narrow N keeps the host model quick; the lookup does not depend on N's size
        cfg = small_cfg(N=512, BM=bm, GM=gm, SPLITK=sk)
        assert moe_spec.coverage(offs, T, cfg) is None, (kind, T, cfg)


@pytest.mark.parametrize("kind", ["uniform", "one", "empty", "single", "ragged", "last"])
@pytest.mark.parametrize("T", [1, 2, 50, 300])
def test_tiles_cover_every_row_once_coarse(kind, T):
    offs = moe_spec.routing(kind, T, 8, 2, seed=T)
    for bm, gm, sk in ((16, 1, 4), (128, 8, 1), (64, 8, 1), (32, 1, 1)):
        cfg = {"E": 8, "N": 1024, "K": 4096, "TOPK": 2, "BM": bm, "BN": 128, "SPLITK": sk, "GM": gm}
        assert moe_spec.coverage(offs, T, cfg) is None, (kind, T, cfg)


@pytest.mark.parametrize("kind", ["uniform", "one", "empty", "single", "ragged"])
def test_persistent_blocks_cover_every_tile_once(kind):
    """PERSIST: 132 blocks at most, block b taking tiles b, b + grid, ...; every row of every
    column tile once, on the coarse shape (few row tiles) and the fine one (many)."""
    for E, topk, N, T in ((8, 2, 28672, 256), (8, 2, 28672, 3000), (64, 6, 2816, 256)):
        offs = moe_spec.routing(kind, T, E, topk, seed=T)
        cfg = {"E": E, "N": N, "K": 4096, "TOPK": topk, "BM": 128, "BN": 256, "SPLITK": 1, "GM": 8, "PERSIST": 1}
        tiles = moe_spec.mt_bound(T, cfg) * (N // 256)
        assert moe_spec.grid_size(T, cfg) == min(tiles, 132)
        got = moe_spec.block_tiles(T, cfg)
        assert sorted(got) == list(range(tiles))  # each tile once, whatever block takes it
        assert moe_spec.coverage(offs, T, cfg) is None, (kind, E, T)


def test_a_persistent_block_whose_first_tile_is_empty_still_has_work():
    """Why the persistent kernel may not leave on its first tile (as a block-a-tile kernel does):
    with empty experts the row tiles are fewer than the bound, and on the coarse shape at T = 256
    some block's first tile lies past them while a later tile of the same block does not."""
    T, E, N = 256, 8, 28672
    offs = moe_spec.routing("empty", T, E, 2, seed=T)
    cfg = {"E": E, "N": N, "K": 4096, "TOPK": 2, "BM": 128, "BN": 256, "SPLITK": 1, "GM": 8, "PERSIST": 1}
    g, tiles = moe_spec.grid_size(T, cfg), moe_spec.mt_bound(T, cfg) * (N // 256)
    rows = lambda t: moe_spec.find_tile(t, offs, T, cfg)[2]  # noqa: E731
    stranded = [b for b in range(g) if rows(b) <= 0 and any(rows(t) > 0 for t in range(b + g, tiles, g))]
    assert stranded, "the routing no longer strands a block: pick one that does"


def test_row_tile_bound_is_tight_enough():
    # the bound is reached: every expert with BM + 1 rows needs 2 tiles each
    cfg = small_cfg(E=8, TOPK=2, BM=16)
    T = 8 * 17 // 2
    offs = [17 * (e + 1) for e in range(8)]
    assert offs[-1] == T * 2
    assert moe_spec.mt_bound(T, cfg) == 16
    assert moe_spec.coverage(offs, T, {**cfg, "N": 256}) is None
    # and never below what a routing needs
    for T in (1, 5, 40, 333):
        for kind in ("uniform", "ragged", "single", "empty"):
            offs = moe_spec.routing(kind, T, 64, 6, seed=1)
            prev, need = 0, 0
            for o in offs:
                need += -(-(o - prev) // 16)
                prev = o
            assert need <= moe_spec.mt_bound(T, small_cfg())


def test_blocks_past_the_last_tile_have_no_work():
    offs = moe_spec.routing("one", 4, 64, 6)
    cfg = small_cfg(N=256, BN=128, BM=16)
    works = [moe_spec.find_tile(b, offs, 4, cfg)[2] > 0 for b in range(moe_spec.grid_size(4, cfg))]
    assert sum(works) == 2 * 2  # 24 rows on one expert: 2 row tiles x 2 column tiles
    assert not any(works[4:])   # the raster puts them first (GM 1: a row tile's column tiles in turn)


def test_routings():
    for kind in ("uniform", "one", "first", "last", "empty", "single", "ragged"):
        for T in (1, 7, 100):
            offs = moe_spec.routing(kind, T, 64, 6)
            assert len(offs) == 64 and offs[-1] == 6 * T
            assert all(b >= a for a, b in zip([0] + offs, offs))
    assert moe_spec.active_experts(moe_spec.routing("one", 9, 64, 6)) == 1
    assert moe_spec.active_experts(moe_spec.routing("uniform", 1, 64, 6)) == 6
    assert moe_spec.active_experts(moe_spec.routing("empty", 50, 64, 6)) <= 16


# -- the specs and the template -------------------------------------------------------------------
def test_spaces(moe_specs):
    for name, ms in moe_specs.items():
        cfgs = ms.cfgs
        assert 30 <= len(cfgs) <= 260, (name, len(cfgs))  # a grid of the whole space stays a few hundred trials
        assert dict(ms.spec.start) in cfgs, name
        # the template's one signature for every path: the tensor maps, then the pointers
        assert tuple(ms.spec.kernel.args) == ("xmap", "wmap", "x", "w", "offs", "y", "ws", "T"), name
        maps = {m.name: m for m in ms.spec.kernel.tensor_maps}
        assert (maps["xmap"].tensor, maps["wmap"].tensor) == ("x", "w"), name


def test_every_configuration_renders_one_source_for_every_T(moe_specs):
    from runner.build.builder import Builder

    for name, ms in moe_specs.items():
        b = Builder(ms.spec)
        for cfg in ms.cfgs:
            s1, s2 = b.render_all(dict(cfg), shapes=[{"T": 1}, {"T": 4097}])
            assert s1 == s2, (name, cfg)
            assert "{{" not in s1 and "{%" not in s1
            assert f"#define BM {cfg['BM']}\n" in s1 and f"#define K {cfg['K']}\n" in s1
            assert ("#define SWIGLU 1" in s1) == (cfg["ACT"] == "swiglu")


def test_geometry_and_workspace_match_the_kernel(moe_specs):
    from runner.build.builder import Builder

    for name, ms in moe_specs.items():
        b = Builder(ms.spec)
        cfgs = ms.cfgs
        for cfg in cfgs[:: max(1, len(cfgs) // 12)]:
            cfg = dict(cfg)
            for T in (1, 16, 129, 4096):
                geo = b.geometry(cfg, [{"T": T}])[0]
                assert geo["grid"] == [moe_spec.grid_size(T, cfg)]
                # wgmma_tma_ws: and a producer warpgroup after the consumers' warps
                assert geo["block"] == [cfg["WM"] * cfg["WN"] * 32 + (128 if cfg["MMA"] == "wgmma_tma_ws" else 0)]
                pad = 1024 if cfg["MMA"] != "sync" else 0  # the wgmma paths round their base up to 1024 bytes
                # PERSIST: the epilogue's own staging after the stages, 128 columns a pass
                stage_out = cfg["BM"] * min(cfg["BN"], 128) * 2 if cfg.get("PERSIST") else 0
                assert geo["shared_mem"] == cfg["STAGES"] * (cfg["BM"] + cfg["BN"]) * cfg["BK"] * 2 + pad + stage_out \
                    <= 232448 - 2048
                R, nt = T * cfg["TOPK"], cfg["N"] // cfg["BN"]
                want = 1 if cfg["SPLITK"] == 1 else -(-moe_spec.mt_bound(T, cfg) * nt // 4) * 4 + cfg["SPLITK"] * R * cfg["N"]
                assert geo["scratch"] == {"ws": [want]}
                # a map's box where the configuration reads it (the tensor-copy paths), none elsewhere
                tma = cfg["MMA"] in ("wgmma_tma", "wgmma_tma_ws")
                nb = cfg["BN"] // 2 if cfg["ACT"] == "swiglu" else cfg["BN"]
                assert (geo.get("tensor_maps") or {}) == ({"xmap": [cfg["BM"], 64], "wmap": [1, nb, 64]} if tma else {})


def test_serves_covers_the_domain(moe_specs):
    for name, ms in moe_specs.items():
        k = ms.spec.kernel
        cfgs = ms.cfgs
        for T in (1, 2, 15, 16, 100, 512, 513, 1024, 1025, 4096, 8192):
            assert any(k.serves_shape(c, {"T": T}, 2) for c in cfgs), (name, T)
        assert k.serves_shape(dict(ms.spec.start), {"T": 16}, 2)


def test_bytes_expression():
    """x, y and the weights of the experts the timed routing uses: the expected count
    E (1 - (1 - k/E)^T) rounded half up, as many as the routing draw makes non-empty."""
    import yaml

    for p in SPECS:
        d = yaml.safe_load(p.read_text())
        e = compile_expr(d["op"]["bytes"])
        E, N, K = d["op"]["inputs"]["w"]["shape"]
        topk = d["op"]["inputs"]["offs"]["topk"]
        xin = d["op"]["inputs"]["x"]["shape"][1]
        yout = d["op"]["outputs"]["y"]["shape"][1]
        prev = 0
        for T in (1, 2, 3, 16, 64, 65, 128, 1000, 4096, 4097, 8192):
            got = e({"T": T, "elem": 2})
            used = min(E, T * topk, math.floor(E * (1 - (1 - topk / E) ** T) + 0.5))
            want = 2 * T * topk * (xin + yout) + 2 * N * K * used
            assert math.isclose(got, want, rel_tol=1e-12), (p.name, T, got, want)
            offs = routing_counts("routing", E, T * topk, topk, torch.Generator().manual_seed(T))
            assert int((offs > 0).sum()) == used, (p.name, T)  # the draw realizes the count
            assert got > prev
            prev = got


def test_budget_holds_for_a_model_of_the_kernel():
    """grouped_ref's budget against the kernel's arithmetic modelled on the CPU: fp32 partial
    sums over k-tiles of 64 in split order, one rounding to bf16 (SwiGLU in fp32 first)."""
    import torch

    torch.manual_seed(0)
    E, N, K, T, topk = 4, 64, 512, 9, 2
    x = (torch.randn(T * topk, K) * 3).bfloat16()
    w = (torch.randn(E, N, K) / 20).bfloat16()
    offs = torch.tensor(moe_spec.routing("ragged", T, E, topk, seed=3), dtype=torch.int32)
    for act in ("none", "swiglu"):
        ref, bound = moe_spec.grouped_ref(x, w, offs, act)
        h = torch.zeros(T * topk, N, dtype=torch.float32)
        prev = 0
        for e, end in enumerate(offs.tolist()):
            for k0 in range(0, K, 64):
                h[prev:end] += x[prev:end, k0:k0 + 64].float() @ w[e, :, k0:k0 + 64].float().T
            prev = end
        y = h if act == "none" else torch.nn.functional.silu(h[:, : N // 2]) * h[:, N // 2:]
        y = y.bfloat16().double()
        assert bool(((y - ref).abs() <= bound).all()), act
        # and it is no blank cheque: a wrong expert's rows fall outside it
        bad = y.clone()
        bad[: offs[0]] *= 1.05
        assert offs[0] == 0 or not bool(((bad - ref).abs() <= bound).all())


def test_the_probe_names_each_draws_rows_an_expert():
    """moe_probe --draws: the fewest and the most rows an expert in use gets, empty experts
    left out, for the routings it times at one T."""
    probe = __import__("moe_probe")
    assert probe.draw_rows([3, 3, 10, 10, 12]) == (2, 7)  # counts 3, 0, 7, 0, 2
    offs = [moe_spec.routing("uniform", 1700, 8, 2, seed=s) for s in (7, 8, 9)]
    spans = [probe.draw_rows(o) for o in offs]
    assert all(lo <= 1700 * 2 // 8 <= hi for lo, hi in spans) and len(set(spans)) > 1  # the draws differ


# -- the compiler (slow) ---------------------------------------------------------------------------
@pytest.mark.slow
def test_nvrtc_compiles_a_sample_without_spills(moe_specs):
    pytest.importorskip("cuda.core")
    from runner.build.builder import Builder

    for name, ms in moe_specs.items():
        b = Builder(ms.spec)
        cfgs = ms.cfgs
        sample = [dict(ms.spec.start), cfgs[-1]]
        srcs = [b.render_all(c, shapes=[{"T": 16}])[0] for c in sample]
        for cfg, c in zip(sample, b._compile_all(srcs)):
            assert c.ok, (name, cfg, c.reason)
            r = c.resources
            assert not (r.get("spill_stores") or r.get("spill_loads") or r.get("stack_bytes")), (name, cfg, r)


# -- on the GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_probe_verifies_each_start_configuration():
    probe = __import__("moe_probe")
    argv = []
    for p in SPECS:
        argv += ["--spec", str(p)]
    assert probe.main(argv + ["--sample", "1", "--no-timing"]) == 0


# -- the data path, emulated ------------------------------------------------------------------------
def _swz(r: int, c: int, ch: int, rowb: int) -> int:
    """moe_tile.cuh.j2's swz."""
    return r * rowb + ((c ^ ((r >> 1) & 3)) << 4) if ch == 4 else r * rowb + ((c ^ (r & 7)) << 4)


def _d_fragment(wm: int, i: int, j: int, TM: int):
    """The m16n8 accumulator fragment of warp row wm, m16 tile i, n8 tile j, as the PTX ISA lays
    it out: (lane, register, the tile's row, the n8 tile's first column of the register pair
    within the warp's columns, 0 or 1 within the pair) for each of a lane's four registers."""
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for h in range(2):
            for q in range(2):
                yield lane, 2 * h + q, wm * TM + i * 16 + h * 8 + g, j * 8 + 2 * t, q


def _b_row(i: int, nt: int, cfg: dict) -> int:
    """moe_tile.cuh.j2's b_row."""
    BN, TN, swiglu = cfg["BN"], cfg["BN"] // cfg["WN"], cfg["ACT"] == "swiglu"
    if not swiglu:
        return nt * BN + i
    pw, j = divmod(i, TN)
    c = nt * (BN // 2) + pw * (TN // 2) + (j if j < TN // 2 else j - TN // 2)
    return c if j < TN // 2 else cfg["N"] // 2 + c


def _ldmatrix_x4(sm, addrs):
    """ldmatrix.sync.aligned.m8n8.x4.b16 as the PTX ISA defines it: lanes 8j .. 8j + 7 give the
    row addresses of matrix j; lane l receives of each matrix row l / 4, elements 2 (l % 4) and
    2 (l % 4) + 1. Returns regs[lane][j] = (lo, hi)."""
    out = [[None] * 4 for _ in range(32)]
    for j in range(4):
        rows = [sm[addrs[8 * j + q] // 2: addrs[8 * j + q] // 2 + 8] for q in range(8)]
        for lane in range(32):
            row = rows[lane // 4]
            out[lane][j] = (row[2 * (lane % 4)], row[2 * (lane % 4) + 1])
    return out


def _mma(acc, a, b):
    """mma.m16n8k16.row.col with the ISA's fragment layouts: acc[lane] (4 floats) += A B, A from
    a[lane] (4 registers of 2), B from b[lane] (2 registers of 2)."""
    import numpy as np

    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for e in range(2):
            A[g, 2 * t + e] = a[lane][0][e]
            A[g + 8, 2 * t + e] = a[lane][1][e]
            A[g, 8 + 2 * t + e] = a[lane][2][e]
            A[g + 8, 8 + 2 * t + e] = a[lane][3][e]
            B[2 * t + e, g] = b[lane][0][e]
            B[8 + 2 * t + e, g] = b[lane][1][e]
    C = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        acc[lane] += [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]


def emulate(cfg: dict, x, w, offs: list[int], T: int):
    """The kernel run on the host, block by block, with its own index arithmetic: find_tile,
    load_stage's copies into a byte-addressed shared stage (swizzled, zero-filled rows),
    compute_stage's ldmatrix addresses and mma fragments, the ordered split-K sum and the
    epilogue's stores. Values in float64 (the arithmetic's order is not what is checked)."""
    import numpy as np

    E, N, K, BM, BN, BK = (cfg[k] for k in ("E", "N", "K", "BM", "BN", "BK"))
    WM, WN, SPLITK = cfg["WM"], cfg["WN"], cfg["SPLITK"]
    swiglu = cfg["ACT"] == "swiglu"
    TM, TN = BM // WM, BN // WN
    MI, NJ, CH, ROWB = TM // 16, TN // 8, BK // 8, BK * 2
    THREADS = WM * WN * 32
    NO = N // 2 if swiglu else N
    R = T * cfg["TOPK"]
    KT = K // SPLITK // BK
    y = np.full((R, NO), np.nan)
    partial = {}
    for bid in range(moe_spec.grid_size(T, cfg)):
        e, row0, rows, mt, nt, split = moe_spec.find_tile(bid, offs, T, cfg)
        if rows <= 0:
            continue
        acc = {(wm, wn, i, j): np.zeros((32, 4)) for wm in range(WM) for wn in range(WN)
               for i in range(MI) for j in range(NJ)}
        for kt in range(KT):
            sm = np.zeros((BM + BN) * ROWB // 2)
            k0 = split * (K // SPLITK) + kt * BK
            for tid in range(THREADS):
                c, r0 = tid % CH, tid // CH
                for u in range(-(-BM * CH // THREADS)):
                    r = r0 + u * (THREADS // CH)
                    if r < BM:
                        d = _swz(r, c, CH, ROWB) // 2
                        sm[d:d + 8] = x[row0 + r, k0 + 8 * c: k0 + 8 * c + 8] if r < rows else 0
                for u in range(-(-BN * CH // THREADS)):
                    r = r0 + u * (THREADS // CH)
                    if r < BN:
                        d = (BM * ROWB + _swz(r, c, CH, ROWB)) // 2
                        sm[d:d + 8] = w[e, _b_row(r, nt, cfg), k0 + 8 * c: k0 + 8 * c + 8]
            for wm in range(WM):
                for wn in range(WN):
                    for ks in range(BK // 16):
                        a = [_ldmatrix_x4(sm, [_swz(wm * TM + i * 16 + (l & 15), 2 * ks + (l >> 4), CH, ROWB)
                                               for l in range(32)]) for i in range(MI)]
                        b = []
                        for p in range(NJ // 2):
                            regs = _ldmatrix_x4(sm, [BM * ROWB + _swz(wn * TN + p * 16 + (l & 7) + ((l >> 4) << 3),
                                                                      2 * ks + ((l >> 3) & 1), CH, ROWB)
                                                     for l in range(32)])
                            b.append([(rg[0], rg[1]) for rg in regs])
                            b.append([(rg[2], rg[3]) for rg in regs])
                        for i in range(MI):
                            for j in range(NJ):
                                _mma(acc[wm, wn, i, j], a[i], b[j])
        # split-K: partials by (row, weight column); the last split adds them in split order
        for (wm, wn, i, j), v in acc.items():
            for lane, k, r, c0, q in _d_fragment(wm, i, j, TM):
                if r < rows:
                    partial[split, row0 + r, _b_row(wn * TN + c0, nt, cfg) + q] = v[lane, k]
        if split != SPLITK - 1:  # the emulation runs splits in order: the last one combines
            continue
        for (wm, wn, i, j), v in acc.items():
            for lane, k, r, c0, q in _d_fragment(wm, i, j, TM):
                if r < rows:
                    col = _b_row(wn * TN + c0, nt, cfg) + q
                    v[lane, k] = sum(partial.pop((s, row0 + r, col)) for s in range(SPLITK))
        for (wm, wn, i, j), v in acc.items():  # the epilogue, once every sum is in
            if swiglu and j >= NJ // 2:
                continue
            for lane, k, r, c0, q in _d_fragment(wm, i, j, TM):
                if r >= rows:
                    continue
                if swiglu:
                    gate, up = v[lane, k], acc[wm, wn, i, j + NJ // 2][lane, k]
                    y[row0 + r, nt * (BN // 2) + wn * (TN // 2) + c0 + q] = gate / (1 + np.exp(-gate)) * up
                else:
                    y[row0 + r, nt * BN + wn * TN + c0 + q] = v[lane, k]
    assert not partial, "partials never summed"
    return y


@pytest.mark.parametrize("cfg", [
    dict(BM=16, BN=64, BK=64, WM=1, WN=4, SPLITK=1, GM=1, ACT="none"),
    dict(BM=32, BN=64, BK=32, WM=1, WN=2, SPLITK=2, GM=1, ACT="swiglu"),
    dict(BM=32, BN=128, BK=32, WM=2, WN=4, SPLITK=1, GM=8, ACT="swiglu"),
    dict(BM=16, BN=64, BK=128, WM=1, WN=2, SPLITK=2, GM=1, ACT="none"),
])
def test_emulated_data_path_matches_float64(cfg):
    """The kernel's addressing (swizzle, ldmatrix lanes, fragments, gate/up pairing, epilogue
    columns, split-K slabs) on the host against the float64 answer, on a ragged routing with an
    empty expert and a group longer than a tile."""
    import numpy as np
    import torch

    cfg = {"E": 4, "N": 128, "K": 256, "TOPK": 2, **cfg}
    T = 13
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T * 2, cfg["K"]))
    w = rng.standard_normal((4, cfg["N"], cfg["K"])) / 16
    offs = [0, 9, 9 + 17, 26]  # expert 0 empty, 17 rows (past a tile of 16), 0 rows, the rest
    assert offs[-1] == T * 2
    y = emulate(cfg, x, w, offs, T)
    ref, _ = moe_spec.grouped_ref(torch.tensor(x), torch.tensor(w), torch.tensor(offs), cfg["ACT"])
    assert not np.isnan(y).any()
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-9, atol=1e-9)
