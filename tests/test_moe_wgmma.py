"""The MoE grouped GEMM's wgmma path (issue 22, MMA wgmma), without a GPU: the kernel's data
path emulated on the host with its own index arithmetic (load_stage's copies into the 128-byte
swizzled stage, wg_desc's descriptors read back the way the PTX ISA says the tensor core reads a
K-major 128B-swizzled operand, the m64nNk16 D fragment, the epilogue's swizzled staging tile and
16-byte stores) against float64, with deliberately broken variants that must fail; the
pipeline's schedule (which stage is written while which is read); every wgmma configuration
renders the instruction it declares; NVRTC compiles a sample for sm_90a (slow)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = ROOT / "pipelines"
sys.path.insert(0, str(ROOT / "tools"))

import moe_spec  # noqa: E402


# -- the kernel's functions, in Python ------------------------------------------------------------
def swz(r: int, c: int) -> int:
    """moe_tile.cuh.j2's swz at CH 8 (BK 64): chunk c of row r, the 128-byte swizzle."""
    return r * 128 + ((c ^ (r & 7)) << 4)


def swz_plain(r: int, c: int) -> int:
    """A broken copy layout: rows of 128 bytes, no XOR (what the descriptor does not describe)."""
    return r * 128 + (c << 4)


def swz_pairs(r: int, c: int) -> int:
    """A broken copy layout: the sync path's BK 32 pattern (XOR with (r / 2) % 4) on 128-byte rows."""
    return r * 128 + ((c ^ ((r >> 1) & 3)) << 4)


def wg_desc(addr: int, sbo: int = 1024) -> int:
    """moe_wgmma_ops.cuh.j2's wg_desc (`sbo` only for the broken variant)."""
    return ((addr >> 4) & 0x3FFF) | (1 << 16) | ((sbo >> 4) << 32) | (1 << 62)


def b_row(i: int, nt: int, BN: int, N: int, swiglu: bool) -> int:
    """moe_tile.cuh.j2's b_row with the wgmma path's TN = BN (WN 1)."""
    if not swiglu:
        return nt * BN + i
    c = nt * (BN // 2) + (i if i < BN // 2 else i - BN // 2)
    return c if i < BN // 2 else N // 2 + c


# -- the hardware, as the PTX ISA describes it ------------------------------------------------------
def read_operand(sm, desc: int, rows: int):
    """The rows x 16 K-major bf16 operand that a matrix descriptor names, as wgmma reads it:
    start address, stride byte offset (between groups of 8 rows), the 128-byte swizzle (layout
    1: address bits 4-6 XOR bits 7-9, atoms of 8 rows x 128 bytes on 1024-byte boundaries, base
    offset 0); the leading byte offset is unused by swizzled K-major layouts."""
    import numpy as np

    start = (desc & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    assert desc >> 62 == 1 and (desc >> 49) & 7 == 0, "128B swizzle, base offset 0"
    m = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    logical = start + (m // 8) * sbo + (m % 8) * 128 + 2 * k
    phys = logical ^ (((logical >> 7) & 7) << 4)
    return sm[phys // 2]


def d_fragment(t: int, i: int, transposed: bool = False) -> tuple[int, int]:
    """wgmma m64nNk16 f32 D: thread t of the warpgroup, register i -> (row, column). Warp t / 32
    owns rows 16 (t / 32) .. + 15; per n8 column block i / 4, registers as mma.m16n8's C: row
    lane / 4 (+ 8 for i % 4 >= 2), columns 2 (lane % 4) + i % 2. `transposed`: a wrong mapping
    (the + 8 rows and the column pairs swapped) for the broken variant."""
    w, lane = divmod(t, 32)
    h, e = (i // 2) % 2, i % 2
    if transposed:
        h, e = e, h
    return 16 * w + lane // 4 + 8 * h, 8 * (i // 4) + 2 * (lane % 4) + e


def tma_boxes(cfg: dict, e: int, row0: int, nt: int, kt: int, up_at=None) -> list:
    """The tensor copies of MMA wgmma_tma's tma_stage for one stage, as (part, byte offset in it,
    tensor, coordinates outermost first, box rows): x's box at (row0, kt * 64), then w's at
    (e, nt * BN, kt * 64), or under SwiGLU the gate box at (e, nt * BNO, ...) and the up box at
    (e, NO + nt * BNO, ...) BN / 2 rows on (`up_at` moves the up box's first row: a broken
    variant)."""
    BM, BN, N, BK = cfg["BM"], cfg["BN"], cfg["N"], cfg["BK"]
    out = [("A", 0, "x", (row0, kt * BK), BM)]
    if cfg["ACT"] == "swiglu":
        NO, BNO = N // 2, BN // 2
        out.append(("B", 0, "w", (e, nt * BNO, kt * BK), BN // 2))
        out.append(("B", BN // 2 * 128, "w", (e, (NO if up_at is None else up_at) + nt * BNO, kt * BK), BN // 2))
    else:
        out.append(("B", 0, "w", (e, nt * BN, kt * BK), BN))
    return out


def emulate(cfg: dict, x, w, offs: list[int], T: int, copy=swz, sbo: int = 1024, transposed=False, tma=None):
    """The wgmma kernel on the host, block by block: find_tile, load_stage's copies (all THREADS,
    the same thread-to-chunk map, zero-filled rows) into a 1024-aligned stage, the 4 k16 slices'
    descriptors for each warpgroup's A and the shared B, the products added into each thread's
    fragment, then the epilogue's staging tile and its 16-byte chunks to y. Float64.
    With `tma` (a function as tma_boxes), the stage is filled as the wgmma_tma path's tensor
    copies fill it instead: each box's rows as they lie in the tensor (a group's following rows
    too; rows past the tensor read zero), in the 128-byte swizzle."""
    import numpy as np

    E, N, K, BM, BN, BK = (cfg[k] for k in ("E", "N", "K", "BM", "BN", "BK"))
    assert BK == 64 and cfg["SPLITK"] == 1 and cfg["WM"] == BM // 16 and cfg["WN"] == 1
    swiglu = cfg["ACT"] == "swiglu"
    THREADS, CH, ROWB = BM * 2, 8, 128
    NO, BNO = (N // 2, BN // 2) if swiglu else (N, BN)
    ABYTES, STAGEB = BM * ROWB, (BM + BN) * ROWB
    ROWO, CPR = BNO * 2, BNO // 8
    base = 1024 * 5  # any 1024-byte boundary
    R = T * cfg["TOPK"]
    y = np.full((R, NO), np.nan)
    frag = [[d_fragment(t, i, transposed) for i in range(BN // 2)] for t in range(128)]
    frag_r = np.array([[rc[0] for rc in row] for row in frag])
    frag_c = np.array([[rc[1] for rc in row] for row in frag])
    assert len(set(zip(frag_r.flat, frag_c.flat))) == 64 * BN  # every element of D once
    for bid in range(moe_spec.grid_size(T, cfg)):
        e, row0, rows, mt, nt, split = moe_spec.find_tile(bid, offs, T, cfg)
        if rows <= 0:
            continue
        acc = np.zeros((BM // 64, 128, BN // 2))
        for kt in range(K // BK):
            sm = np.full((base + STAGEB) // 2, np.nan)  # a stage's bytes as bf16 slots
            for part, at, name, (o0, o1, *o2), nrows in (tma(cfg, e, row0, nt, kt) if tma else ()):
                src = x if name == "x" else w[o0]
                r0_, k0 = (o0, o1) if name == "x" else (o1, o2[0])
                for r in range(nrows):
                    row = src[r0_ + r, k0:k0 + BK] if r0_ + r < src.shape[0] else np.zeros(BK)
                    for c in range(CH):
                        d = (base + (0 if part == "A" else ABYTES) + at + copy(r, c)) // 2
                        sm[d:d + 8] = row[8 * c:8 * c + 8]
            for tid in range(THREADS if tma is None else 0):
                c, r0 = tid % CH, tid // CH
                for u in range(-(-BM * CH // THREADS)):
                    r = r0 + u * (THREADS // CH)
                    if r < BM:
                        d = (base + copy(r, c)) // 2
                        sm[d:d + 8] = x[row0 + r, kt * BK + 8 * c: kt * BK + 8 * c + 8] if r < rows else 0
                for u in range(-(-BN * CH // THREADS)):
                    r = r0 + u * (THREADS // CH)
                    if r < BN:
                        d = (base + ABYTES + copy(r, c)) // 2
                        sm[d:d + 8] = w[e, b_row(r, nt, BN, N, swiglu), kt * BK + 8 * c: kt * BK + 8 * c + 8]
            for wg in range(BM // 64):
                D = np.zeros((64, BN))
                for ks in range(BK // 16):
                    a = read_operand(sm, wg_desc(base + wg * 64 * ROWB + ks * 32, sbo), 64)
                    b = read_operand(sm, wg_desc(base + ABYTES + ks * 32, sbo), BN)
                    D += a @ b.T
                acc[wg] += D[frag_r, frag_c]
        # the epilogue: each warp's rows through its slice of the staging tile
        stg = np.full(BM * ROWO // 2, np.nan)
        for warp in range(BM // 16):
            wg, t0 = divmod(warp, 4)
            stw = warp * 16 * ROWO
            for lane in range(32):
                g, t4 = lane // 4, lane % 4
                a = acc[wg, t0 * 32 + lane]
                for j in range(CPR):
                    for h in range(2):
                        if swiglu:
                            ga, up = a[4 * j + 2 * h: 4 * j + 2 * h + 2], a[4 * (j + CPR) + 2 * h: 4 * (j + CPR) + 2 * h + 2]
                            v = ga / (1 + np.exp(-ga)) * up
                        else:
                            v = a[4 * j + 2 * h: 4 * j + 2 * h + 2]
                        off = stw + (g + 8 * h) * ROWO + ((j ^ g) << 4) + t4 * 4
                        stg[off // 2: off // 2 + 2] = v
            rw = warp * 16
            for it in range(CPR // 2):
                for lane in range(32):
                    q = it * 32 + lane
                    r, c = divmod(q, CPR)
                    if rw + r < rows:
                        off = (stw + r * ROWO + ((c ^ (r & 7)) << 4)) // 2
                        y[row0 + rw + r, nt * BNO + c * 8: nt * BNO + c * 8 + 8] = stg[off: off + 8]
    return y


def _case(cfg: dict, T: int = 45):
    """x, w, offs for E = 4 experts with K = 256: an empty expert, a group longer than a 64-row
    tile, a group of one row, the rest."""
    import numpy as np

    rng = np.random.default_rng(1)
    R = T * cfg["TOPK"]
    x = rng.standard_normal((R, cfg["K"]))
    w = rng.standard_normal((cfg["E"], cfg["N"], cfg["K"])) / 16
    offs = [0, 70, 71, R]
    return x, w, offs


def _ref(x, w, offs, act):
    import torch

    return moe_spec.grouped_ref(torch.tensor(x), torch.tensor(w), torch.tensor(offs), act)[0].numpy()


WG_CFGS = [
    dict(BM=64, BN=128, ACT="none", GM=1),
    dict(BM=128, BN=256, ACT="none", GM=8),
    dict(BM=64, BN=256, ACT="swiglu", GM=1),
    dict(BM=128, BN=128, ACT="swiglu", GM=8),
]


def _full(c: dict) -> dict:
    return {"E": 4, "N": 512, "K": 256, "TOPK": 2, "BK": 64, "SPLITK": 1, "WM": c["BM"] // 16, "WN": 1, **c}


@pytest.mark.parametrize("cfg", WG_CFGS, ids=lambda c: f"BM{c['BM']}-BN{c['BN']}-{c['ACT']}")
def test_emulated_wgmma_data_path_matches_float64(cfg):
    import numpy as np

    cfg = _full(cfg)
    x, w, offs = _case(cfg)
    y = emulate(cfg, x, w, offs, 45)
    assert not np.isnan(y).any(), "a row never written"
    np.testing.assert_allclose(y, _ref(x, w, offs, cfg["ACT"]), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("cfg", WG_CFGS, ids=lambda c: f"BM{c['BM']}-BN{c['BN']}-{c['ACT']}")
def test_emulated_tma_data_path_matches_float64(cfg):
    # the wgmma_tma path's stages: its boxes' coordinates, the rows past a group (the next
    # expert's, or zero past x) computed and never stored
    import numpy as np

    cfg = _full(cfg)
    x, w, offs = _case(cfg)
    y = emulate(cfg, x, w, offs, 45, tma=tma_boxes)
    assert not np.isnan(y).any(), "a row never written"
    np.testing.assert_allclose(y, _ref(x, w, offs, cfg["ACT"]), rtol=1e-9, atol=1e-9)
    if cfg["ACT"] == "swiglu":  # the up rows right after the gate rows: wrong
        broken = emulate(cfg, x, w, offs, 45, tma=lambda *a: tma_boxes(*a, up_at=cfg["BN"] // 2))
        assert not np.allclose(broken, _ref(x, w, offs, cfg["ACT"]))


@pytest.mark.parametrize("broken", ["no-xor", "pair-xor", "sbo-512", "fragment"])
def test_broken_layouts_fail(broken):
    """The emulation is no rubber stamp: a copy layout the descriptor does not describe, a
    wrong stride between 8-row groups, or a wrong D fragment give wrong answers."""
    import numpy as np

    cfg = _full(dict(BM=64, BN=128, ACT="none", GM=1))
    x, w, offs = _case(cfg)
    kw = {"no-xor": dict(copy=swz_plain), "pair-xor": dict(copy=swz_pairs), "sbo-512": dict(sbo=512),
          "fragment": dict(transposed=True)}[broken]
    y = emulate(cfg, x, w, offs, 45, **kw)
    ref = _ref(x, w, offs, "none")
    assert np.isnan(y).any() or not np.allclose(y, ref, rtol=1e-6, atol=1e-6)


def test_swizzle_is_the_128_byte_mode():
    """load_stage's chunk address (swz, CH 8) on a 1024-byte-aligned base is the 128-byte
    swizzle of the dense K-major address (bits 4-6 ^= bits 7-9), and a warp's 8-row phases of
    16-byte chunks hit 8 distinct bank groups."""
    for base in (0, 1024, 7 * 1024):
        for r in range(256):
            for c in range(8):
                dense = base + r * 128 + c * 16
                assert base + swz(r, c) == dense ^ (((dense >> 7) & 7) << 4)
    for c in range(8):
        for r0 in range(0, 64, 8):
            assert len({(swz(r, c) >> 4) & 7 for r in range(r0, r0 + 8)}) == 8


def test_descriptor_fields():
    d = wg_desc(0x1C400 + 96)
    assert d & 0x3FFF == (0x1C400 + 96) >> 4
    assert (d >> 16) & 0x3FFF == 1 and (d >> 32) & 0x3FFF == 64 and (d >> 49) & 7 == 0 and d >> 62 == 1
    assert wg_desc(227 * 1024) & 0x3FFF == (227 * 1024) >> 4  # every shared address fits 14 bits


def test_staging_tile_is_conflict_free():
    """The epilogue's fragment stores: for each (chunk j, half h), a warp's 32 lanes write 4 bytes
    each into 32 distinct banks; its 16-byte reads, a quarter warp (8 lanes) at a time, cover
    the 32 banks once."""
    for BNO in (64, 128, 256):
        ROWO, CPR = BNO * 2, BNO // 8
        for j in range(CPR):
            for h in range(2):
                banks = {(((g + 8 * h) * ROWO + ((j ^ g) << 4) + t4 * 4) // 4) % 32 for g in range(8) for t4 in range(4)}
                assert len(banks) == 32
        for it in range(CPR // 2):
            for quarter in range(4):
                groups = set()
                for lane in range(8 * quarter, 8 * quarter + 8):
                    r, c = divmod(it * 32 + lane, CPR)
                    groups.add(((r * ROWO + ((c ^ (r & 7)) << 4)) // 16) % 8)
                assert len(groups) == 8


@pytest.mark.parametrize("stages", [3, 4, 5, 6])
@pytest.mark.parametrize("kt_total", [1, 2, 3, 5, 22, 64])
def test_pipeline_schedule(stages, kt_total):
    """The main loop's order on a model of the groups: cp.async groups complete in order
    (wait_group n: all but the newest n), wgmma groups likewise; at every iteration the k-tile
    computed has landed, and the stage the copies refill is read by no wgmma that may still run
    (the current and the previous k-tile's) in any warpgroup (the barrier orders them)."""
    PD = stages - 2
    cp_groups = []        # k-tiles per committed group (None: empty)
    landed = set()
    in_flight = []        # k-tiles whose wgmmas may still read their stage

    def cp_wait(n):
        done = cp_groups[: max(0, len(cp_groups) - n)]
        landed.update(k for k in done if k is not None)

    for s in range(PD):
        cp_groups.append(s if s < kt_total else None)
    for kt in range(kt_total):
        cp_wait(PD - 1)
        assert kt in landed, (kt, cp_groups)
        # __syncthreads here: every warpgroup has done wait_group 1 of the previous iteration
        nk = kt + PD
        if nk < kt_total:
            assert nk % stages not in {k % stages for k in in_flight}, (kt, nk, in_flight)
            assert nk % stages != kt % stages
            cp_groups.append(nk)
        else:
            cp_groups.append(None)
        in_flight.append(kt)
        in_flight = in_flight[-1:]  # wgmma.wait_group 1: only the newest group may still run
    assert len({k for k in landed}) == kt_total


# -- the template and the specs ------------------------------------------------------------------
def test_wgmma_configurations(moe_specs):
    """Every spec holds 20 to 40 wgmma configurations, each within the constraints the kernel's
    static asserts state, served from T = 256 on; the sync configurations render no wgmma."""
    for name, ms in moe_specs.items():
        wg = [c for c in ms.cfgs if c["MMA"] == "wgmma"]
        assert 20 <= len(wg) <= 40, (name, len(wg))
        for c in wg:
            assert c["BM"] in (64, 128) and c["BN"] in (128, 256) and c["BK"] == 64 and c["SPLITK"] == 1
            assert c["WM"] == c["BM"] // 16 and c["WN"] == 1
            smem = c["STAGES"] * (c["BM"] + c["BN"]) * 128 + 1024
            assert smem <= 232448 - 2048 and c["STAGES"] >= 3
            k = ms.spec.kernel
            assert not k.serves_shape(c, {"T": 255}, 2) and k.serves_shape(c, {"T": 256}, 2)
        assert {(c["BM"], c["BN"]) for c in wg} == {(64, 128), (64, 256), (128, 128), (128, 256)}
        assert all(c["WM"] <= 4 and c["STAGES"] != 5 for c in ms.cfgs if c["MMA"] == "sync")


def test_every_wgmma_configuration_renders(moe_specs):
    from runner.build.builder import Builder

    for name, ms in moe_specs.items():
        b = Builder(ms.spec)
        assert "--arch=sm_90a" in ms.spec.kernel.options
        sync = [c for c in ms.cfgs if c["MMA"] == "sync"]
        for cfg in sync[::9] + [c for c in ms.cfgs if c["MMA"] == "wgmma"]:
            s1, s2 = b.render_all(dict(cfg), shapes=[{"T": 1}, {"T": 4097}])
            assert s1 == s2
            if cfg["MMA"] == "sync":
                assert "wgmma" not in s1 and "moe_wgmma" not in s1
                continue
            assert "{{" not in s1 and "{%" not in s1
            bn = cfg["BN"]
            m = re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16 \"\s*\"\{ ([^}]*) \}, \"\s*\""
                          r"%(\d+), %(\d+), p, 1, 1, 0, 0;", s1)
            assert m and int(m.group(1)) == bn, name
            assert m.group(2).split(", ") == [f"%{i}" for i in range(bn // 2)]
            assert (int(m.group(3)), int(m.group(4))) == (bn // 2, bn // 2 + 1)
            fn = s1[s1.index("void wgmma_tile("):]
            fn = fn[: fn.index("\n}\n")]
            assert fn.count('"+f"(d[') == bn // 2 and f'"+f"(d[{bn // 2 - 1}])' in fn
            assert f"setp.ne.b32 p, %{bn // 2 + 2}, 0;" in s1
            assert s1.count("extern \"C\" __global__") == 1
            geo = b.geometry(dict(cfg), [{"T": 4096}])[0]
            assert geo["block"] == [cfg["BM"] * 2]
            assert geo["shared_mem"] == cfg["STAGES"] * (cfg["BM"] + cfg["BN"]) * 128 + 1024
            assert geo["grid"] == [moe_spec.grid_size(4096, cfg)]


@pytest.mark.slow
def test_nvrtc_compiles_wgmma_for_sm_90a(moe_specs):
    """NVRTC (the runner's Builder, options --arch=sm_90a) compiles the largest and the smallest
    wgmma tile of each spec: no spills, no stack, wgmma in the PTX."""
    pytest.importorskip("cuda.core")
    from runner.build.builder import Builder

    for name, ms in moe_specs.items():
        b = Builder(ms.spec)
        wg = [c for c in ms.cfgs if c["MMA"] == "wgmma"]
        sample = [min(wg, key=lambda c: (c["BM"] * c["BN"], c["STAGES"])),
                  max(wg, key=lambda c: (c["BM"] * c["BN"], c["STAGES"]))]
        srcs = [b.render_all(c, shapes=[{"T": 4096}])[0] for c in sample]
        for cfg, c in zip(sample, b._compile_all(srcs)):
            assert c.ok, (name, cfg, c.reason)
            r = c.resources
            assert not (r.get("spill_stores") or r.get("spill_loads") or r.get("stack_bytes")), (name, cfg, r)
            assert "sm_90a" in c.log and "wgmma" not in c.log.lower(), c.log  # no serialization warning
            assert not (c.ptx or {}).get("asm"), c.ptx  # the inline asm holds no forbidden-class instruction
    # the PTX of one: the warpgroup MMA and its fences are there
    from cuda.core import Program

    from runner.build.backends import cuda

    ms = moe_specs["moe-fine-swiglu-h200.yaml"]
    cfg = next(c for c in ms.cfgs if c["MMA"] == "wgmma" and c["BN"] == 256)
    src = Builder(ms.spec).render_all(cfg, shapes=[{"T": 16}])[0]
    prog = Program(src, "c++", cuda._options(ms.spec.kernel.options, "sm_90", "wg.cu"))
    prog.compile("cubin")
    ptx = cuda._ptx_text(prog)
    for op in ("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "wgmma.fence.sync.aligned",
               "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned", "fence.proxy.async.shared::cta",
               ".target sm_90a"):
        assert op in ptx, op


def test_the_tma_spec_passes_x_and_w_as_tensor_maps():
    # moe-fine-tma-h200: the kernel takes x and w only through maps whose boxes are its stages'
    from runner.build.builder import Builder
    from .conftest import shipped_spec

    s = shipped_spec(PIPELINES / "moe-fine-tma-h200.yaml")
    # the template's one signature; ws the other paths' workspace, one float here
    assert s.kernel.args == ("xmap", "wmap", "x", "w", "offs", "y", "ws", "T")
    assert [(sc.name, [d.text for d in sc.shape]) for sc in s.kernel.scratch] == [("ws", ["1"])]
    maps = {m.name: m for m in s.kernel.tensor_maps}
    assert (maps["xmap"].tensor, maps["wmap"].tensor) == ("x", "w") and {m.swizzle for m in maps.values()} == {128}
    b = Builder(s)
    cfgs = [dict(c) for c in s.space]
    assert cfgs and all(c["MMA"] in ("wgmma_tma", "wgmma_tma_ws") and c["WM"] == c["BM"] // 16 for c in cfgs)
    assert {c["MMA"] for c in cfgs} == {"wgmma_tma", "wgmma_tma_ws"}
    for cfg in cfgs:
        geo = b.geometry(cfg, [{"T": 4096}])[0]
        assert geo["tensor_maps"] == {"xmap": [cfg["BM"], 64], "wmap": [1, cfg["BN"], 64]}
        assert geo["shared_mem"] == cfg["STAGES"] * (cfg["BM"] + cfg["BN"]) * 128 + 1024
        # wgmma_tma_ws: the consumers' warps and one producer warpgroup after them
        assert geo["block"] == [cfg["BM"] * 2 + (128 if cfg["MMA"] == "wgmma_tma_ws" else 0)], (cfg, geo)
    for cfg in cfgs[:1] + [c for c in cfgs if c["MMA"] == "wgmma_tma_ws"][:1]:
        src = b.render_all(cfg, shapes=[{"T": 4096}])[0]
        assert "const __grid_constant__ TmaDesc xmap, const __grid_constant__ TmaDesc wmap" in src
        assert f"#define PROD {int(cfg['MMA'] == 'wgmma_tma_ws')}" in src
        body = src.split("moe_gemm_bf16(")[1]
        assert "tma_stage(" in body and "load_stage(" not in body  # the tensor copies, not every thread's


@pytest.mark.slow
def test_nvrtc_compiles_every_tma_configuration():
    """NVRTC for sm_90a, every configuration of moe-fine-tma-h200: no spills, no stack, the
    tensor copies and the mbarrier waits in the PTX."""
    pytest.importorskip("cuda.core")
    from runner.build.builder import Builder
    from .conftest import shipped_spec

    s = shipped_spec(PIPELINES / "moe-fine-tma-h200.yaml")
    b = Builder(s)
    cfgs = [dict(c) for c in s.space]
    srcs = [b.render_all(c, shapes=[{"T": 4096}])[0] for c in cfgs]
    for cfg, c in zip(cfgs, b._compile_all(srcs)):
        assert c.ok, (cfg, c.reason)
        r = c.resources
        assert not (r.get("spill_stores") or r.get("spill_loads") or r.get("stack_bytes")), (cfg, r)
        assert not (c.ptx or {}).get("asm"), c.ptx
    from cuda.core import Program

    from runner.build.backends import cuda

    for mma in ("wgmma_tma", "wgmma_tma_ws"):
        src = srcs[max(i for i, c in enumerate(cfgs) if c["MMA"] == mma)]
        prog = Program(src, "c++", cuda._options(s.kernel.options, "sm_90", "tma.cu"))
        prog.compile("cubin")
        ptx = cuda._ptx_text(prog)
        for op in ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64",
                   "wgmma.mma_async.sync.aligned"):
            assert op in ptx, (mma, op)
        # the producer warpgroup's path: per-stage empty barriers and the consumers' own barrier
        ws = mma == "wgmma_tma_ws"
        assert ("mbarrier.arrive.shared::cta.b64" in ptx) == ws, mma
        assert ("bar.sync \t1" in ptx or "bar.sync 1" in ptx or "barrier.sync 1" in ptx) == ws, mma
