"""PF = 3 of softmax_rt (the long rows through the bulk-copy engine, common/row_bulk.cuh.j2)
without a GPU: the host model of its run-time cut, slot schedule, mbarrier protocol and
stores (tools/bulk_model.py) on odd N and rows at every offset, the fit of every N of every
PF = 3 bucket, the kernel's float32 arithmetic of a row against float64, the spec's geometry
against the H200's limits, and the rendered sources. The GPU check is
`tools/range_check.py --ops softmax --only PF=3` on the H200."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import bulk_model  # noqa: E402


@pytest.fixture(scope="module")
def geos():
    return bulk_model.bulk_geometries()


# -- the spec ----------------------------------------------------------------------------------

def test_the_space_has_the_pf3_configurations_for_long_rows(geos):
    assert 10 <= len(geos) <= 180
    r = geos[0][0]
    assert len(r.configs) == 478  # the fill buckets (ITEMS 5 and 7) and the rows read twice (PF 4)
    # every PF = 3 geometry with plain and with bulk stores; line-aligned copies (ALIGN = 1), the
    # lagged cluster merge (LAG = 1), part of the exponentials as a polynomial (EXPOLY = 2) and one
    # block reduction a row (ONLINE = 1) are the template's, out of the space (no gain measured:
    # sessions 21 and 22, 53 on an H100; slower without stores on an H100, session 55)
    pf3 = [(c["TPR"], c["ITEMS"], c["CL"], c["STORE"]) for c in r.configs if c["PF"] == 3]
    assert len(pf3) == 177 and len({p[:3] for p in pf3}) == 17 and len(set(pf3)) == 34  # 68 of them INLINE
    assert not any(c["EXPOLY"] or c["ONLINE"] for c in r.configs)
    # the one-FFMA exponent (FUSE) and the chunk tests worked out once a row (HOIST), in the space
    # since the H200 measured them (session 56), on PF = 3 only, and together only where it fits
    # in registers (ITEMS 6 or less: at ITEMS 8 the pair spilled at 96 registers; with INLINE, no
    # producer warp, a thread has 128 and the pair fits). INLINE since the H200 measured it (session
    # 65), on PF = 3 with plain stores and LAG 0 only
    both = [c for c in r.configs if c["FUSE"] and c["HOIST"]]
    assert all(c["PF"] == 3 for c in r.configs if c["FUSE"] or c["HOIST"])
    assert len([c for c in r.configs if c["HOIST"]]) == 75 and both
    assert all(c["ITEMS"] <= 6 or c["INLINE"] for c in both) and any(c["ITEMS"] == 8 for c in both)
    inline = [c for c in r.configs if c["INLINE"]]
    assert len(inline) == 68 and all(c["PF"] == 3 and c["STORE"] == "default" and not c["LAG"] for c in inline)
    # clusters of 16 (past the portable size) only for PF = 3's two-blocks-an-SM geometry, TPR 256
    assert {p[:3] for p in pf3 if p[2] == 16} == {(256, 6, 16), (256, 8, 16)}
    assert all(c["PF"] == 3 and c["TPR"] == 256 for c in r.configs if c["CL"] == 16)
    assert set(pf3) == {p[:3] + (s,) for p in pf3 for s in ("default", "bulk")}
    assert all(c["LAG"] == 0 for c in r.configs)
    assert all(c["ALIGN"] == 0 for c in r.configs)
    caps = sorted({g[-1] for g in geos})
    assert caps[0] >= 16384 and caps[-1] == 262144
    for r, cfg, tpr, items, cl, slot, nslot, bulk, cap in geos:
        assert cfg["STORE"] in ("default", "bulk") and tpr in (256, 512) and items in (6, 8)
        # the bulk hold is the only path with STORE = bulk
    assert all(c["PF"] == 3 for c in r.configs if c["STORE"] == "bulk")


def test_pf3_geometry_fits_the_h200(geos):
    assert any(g[1].get("INLINE") for g in geos + bulk_model.inlined(geos))
    for r, cfg, tpr, items, cl, slot, nslot, bulk, cap in geos + bulk_model.inlined(geos):
        env = r.env(cfg, {"M": 1000, "N": cap})
        minb = int(env["MINB"])
        # a producer warp besides the compute warps; slots of whole multiples of the block's chunks
        assert slot % (tpr * 16) == 0
        submax = -(-(tpr * items * 16) // slot)
        assert nslot >= 2 * submax
        # the ring (ALIGN: 128 bytes more a slot) and a few KiB of static arrays: 227 KiB a block,
        # MINB blocks in the SM's 228 KiB
        ring = nslot * (slot + 128 * cfg["ALIGN"])
        assert ring + 3072 <= 232448
        assert minb * (ring + 3072) <= 233472
        # registers: the f32 hold of ITEMS * 8 floats under the launch bound's cap
        warps = (tpr + (0 if cfg.get("INLINE") else 32)) // 32 * minb  # INLINE: no producer warp
        cap_regs = 65536 // (warps * 32) // 8 * 8
        assert items * 8 + 24 <= cap_regs, (cfg, cap_regs)
        # clusters of 4 and 8 on 120 SMs, 2 and 1 on 132; M = 1 and M not a multiple of the grid
        for m in (1, 3, 37, 2 ** 27 // cap, 2 ** 27 // cap + 5):
            e = r.env(cfg, {"M": m, "N": cap})
            from runner.core.expr import compile_expr
            spec = r.raw["kernel"]
            grid = compile_expr(spec["grid"])(e)
            block = compile_expr(spec["block"])(e)
            smem = compile_expr(spec["shared_mem"])(e)
            # INLINE: no producer warp; ALIGN: the spill's 128 bytes a slot
            assert block == tpr + (0 if cfg.get("INLINE") else 32) and smem == nslot * (slot + 128 * cfg["ALIGN"])
            # clusters of 16: 14 resident at two blocks an SM (cuda.core on an H100, session 54)
            assert grid % cl == 0 and grid // cl == min(m, (132 if cl <= 2 else 120 if cl <= 8 else 112) * minb // cl)


def test_every_n_of_every_pf3_bucket_fits_its_cut(geos):
    seen = set()
    for r, cfg, tpr, items, cl, slot, nslot, bulk, cap in geos:
        if (tpr, items, cl) in seen:
            continue
        seen.add((tpr, items, cl))
        lo, hi = max(r.lo, cap // 4 + 1), min(r.hi, cap)
        ns = np.arange(lo, hi + 1, dtype=np.int64)
        nv = (ns + 8 - np.minimum(8, ns & -ns) + 7) // 8
        served = ns[(nv <= cap // 8) & (4 * ns > cap)]
        # the spec's serves agrees with that at the bucket's edges
        for n in list(served[:3]) + list(served[-9:]):
            assert r.serves(cfg, int(n))
        for n in (int(served[-1]) + 1, lo - 1):
            if r.lo <= n <= r.hi and n not in set(served.tolist()):
                assert not r.serves(cfg, n)
        bulk_model.check_fit(tpr, items, cl, served)


def test_the_kernels_cut_counts_the_chunks_of_the_worst_placed_row():
    for n in list(range(1, 200)) + [16383, 16385, 23170, 46341, 92682, 185364, 262143, 262144]:
        low = n & -n
        assert (n + 8 - min(low, 8) + 7) >> 3 == bulk_model.max_nv(n)


# -- the protocol, on small geometries (the template's arithmetic with TPR 32 to 64) -----------

SMALL = [  # (TPR, ITEMS, CL, SLOT, NSLOT): SLOT a multiple of TPR * 16, NSLOT >= 2 * SUBMAX
    (64, 4, 1, 1024, 8),
    (64, 6, 2, 1024, 12),
    (32, 8, 4, 512, 16),
    (64, 8, 8, 2048, 9),
    (32, 6, 2, 1536, 5),   # a piece of 3 chunks a thread: parts cut mid-piece
]


def small_sizes(tpr, items, cl, rng):
    cap = tpr * cl * items * 8
    lo, hi = cap // 4 + 1, cap
    ns = {hi, hi - 1, hi - 2, hi - 6, hi - 7, hi - 8, hi - 9, lo, lo + 1}
    ns |= {rng.randint(lo, hi) | 1 for _ in range(3)} | {(rng.randint(lo, hi) & ~3) | 2 for _ in range(2)}
    out = []
    for n in sorted(ns):
        nv = (n + 8 - min(8, n & -n) + 7) // 8
        if nv <= cap // 8 and 4 * n > cap:
            out.append(n)
    return out


@pytest.mark.parametrize("bulk, align, lag, inline", [(False, False, False, False), (True, False, False, False),
                                                      (False, True, False, False), (False, False, True, False),
                                                      (False, False, False, True), (False, True, False, True)],
                         ids=["plain", "bulk", "aligned", "lag", "inline", "inline-aligned"])
@pytest.mark.parametrize("geo", SMALL, ids=lambda g: "T{}-I{}-CL{}-S{}x{}".format(*g))
def test_ring_reads_every_chunk_once_and_stores_every_element_once(geo, bulk, align, lag, inline):
    tpr, items, cl, slot, nslot = geo
    if lag and cl == 1:
        with pytest.raises(bulk_model.BulkError, match="LAG takes a cluster"):
            bulk_model.check(tpr, items, cl, slot, nslot, bulk, tpr * items * 8, 1, lag=True)
        return
    rng = random.Random(tpr * 7 + items * 3 + cl)
    ns = small_sizes(tpr, items, cl, rng)
    assert len(ns) >= 6
    for n in ns:
        _, sub = bulk_model.cut_of(n, cl, slot // 16)
        wrap = 2 * (nslot // max(sub, 1) + 2) + 1  # rows enough to wrap the ring twice a cluster
        for m, G, seed in ((1, 2, n), (3, 2, n + 1), (wrap, 2, n + 2), (wrap + 2, 3, n + 3)):
            bulk_model.check(tpr, items, cl, slot, nslot, bulk, n, m, G=G, seed=seed, align=align, lag=lag,
                             inline=inline)


@pytest.mark.parametrize("seed", range(6))
def test_ring_is_correct_under_many_schedules(seed):
    # rows at every offset within a chunk (N odd), the ring wrapping several times
    for bulk, lag, inline in ((False, False, False), (True, False, False), (False, True, False),
                              (False, False, True)):
        bulk_model.check(64, 8, 2, 2048, 8, bulk, 8185 - 2 * seed, 23, G=2, seed=seed, lag=lag, inline=inline)


@pytest.mark.parametrize("broken, bulk, why", [
    ((), True, None),
    (("no_spill",), "aligned", "holds"),               # ALIGN: the last piece without the shift's spill
    (("release_early",), True, "bulk store of slot"),   # slots back before their store read them
    (("partial_bulk",), True, "bulk store of slot|y written"),  # the row's partial last chunk in bulk
    (("parity",), False, "holds|deadlock|lapped"),      # a full wait one phase off
    (("no_mask",), False, "seen"),                      # the neighbours' elements kept
    ((), "lag", None),
    (("lag_release_early",), "lag", "holds"),           # LAG: slots back before the part's second read
    (("lag_send_early",), "lag", "merged the pairs"),   # LAG: a pair sent before every warp read the last
    ((), "inline", None),
    (("inline_early",), "inline", "holds|lapped"),      # INLINE: a refill before the barriers
])
def test_the_model_catches_a_protocol_out_of_step(broken, bulk, why):
    kw = dict(broken=frozenset(broken))
    if bulk == "lag":
        bulk, kw["lag"] = False, True
    if bulk == "inline":
        bulk, kw["inline"] = False, True
    if bulk == "aligned":  # full parts (N = 4089: 256 chunks a block) start anywhere in a line
        bulk, kw["align"] = False, True
        for seed in range(3):  # the same without the mistake passes
            bulk_model.check(64, 4, 2, 1024, 8, bulk, 4089, 19, G=2, seed=seed, align=True)
    if why is None:
        for seed in range(3):
            bulk_model.check(64, 4, 2, 1024, 8, bulk, 4089, 19, G=2, seed=seed, **kw)
        return
    with pytest.raises(bulk_model.BulkError, match=why):
        for seed in range(3):
            bulk_model.check(64, 4, 2, 1024, 8, bulk, 4089, 19, G=2, seed=seed, **kw)


def test_the_model_finds_a_ring_too_small_for_bulk_stores():
    # two parts of 4 slots need 8; with 7 the producer waits for a slot whose store waits for it
    with pytest.raises(bulk_model.BulkError, match="deadlock"):
        bulk_model.check(64, 4, 2, 1024, 7, True, 4096, 9, G=1, broken=frozenset({"small_ring"}))


def test_an_mbarrier_wait_that_laps_is_an_error():
    b = bulk_model.MBar(1, "b")
    b.expect_arrive(0)
    b.expect_arrive(0)  # two phases completed: a wait for phase 0 by parity would pass wrongly
    with pytest.raises(bulk_model.BulkError, match="lapped"):
        b.passed(0, 0)


def test_a_row_longer_than_the_parts_is_refused_as_the_kernel_traps():
    with pytest.raises(bulk_model.BulkError, match="exceeds"):
        bulk_model.check(64, 4, 2, 1024, 8, False, 4097, 1)


@pytest.mark.slow
def test_ring_on_the_specs_own_geometries(geos):
    rng = random.Random(3)
    done = set()
    for r, cfg, tpr, items, cl, slot, nslot, bulk, cap in geos + bulk_model.lagged(geos) + bulk_model.inlined(geos):
        align, lag, inline = cfg["ALIGN"] == 1, cfg["LAG"] == 1, cfg.get("INLINE") == 1
        if cl == 8 and (tpr, items, bulk, align, lag, inline) in done:
            continue  # the largest clusters are slow to model: one each
        done.add((tpr, items, bulk, align, lag, inline))
        lo, hi = max(r.lo, cap // 4 + 1), min(r.hi, cap)
        ns = [n for n in (hi, hi - 7, lo, rng.randint(lo, hi) | 1) if r.serves(cfg, n)]
        for n in ns:
            _, sub = bulk_model.cut_of(n, cl, slot // 16)
            bulk_model.check(tpr, items, cl, slot, nslot, bulk, n, 1, G=1, seed=n, align=align, lag=lag,
                             inline=inline)
            bulk_model.check(tpr, items, cl, slot, nslot, bulk, n, nslot // sub + 4, G=2, seed=n + 1, align=align,
                             lag=lag, inline=inline)


# -- the arithmetic of a row ---------------------------------------------------------------------

def bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16 (nearest even), as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
        return e / e.sum()


def rows(n: int, rng: np.random.Generator):
    yield "normal", rng.standard_normal(n)
    yield "large", rng.standard_normal(n) * 30
    x = rng.standard_normal(n)
    x[rng.random(n) < 0.25] = -np.inf
    yield "masked", x
    x = rng.standard_normal(n)
    x[: n * 7 // 8] = -np.inf  # every block's part but the last one's: only -inf
    yield "masked-parts", x
    x = rng.standard_normal(n)
    x[rng.integers(n)] = 80.0
    yield "spike", x
    yield "huge", 3.0e38 - rng.random(n) * 1e37
    yield "offset", rng.standard_normal(n) + 1e4


@pytest.mark.parametrize("cl, tpr, items, n, row", [
    (1, 256, 8, 16384, 0), (2, 256, 6, 23170, 3), (4, 512, 6, 46341, 5), (8, 256, 8, 92682, 1),
    (8, 512, 8, 262137, 7), (8, 512, 6, 185364, 2),
])
@pytest.mark.parametrize("online, fuse", [(False, False), (True, False), (False, True), (True, True)])
def test_row_arithmetic_matches_float64(cl, tpr, items, n, row, online, fuse):
    rng = np.random.default_rng(n)
    for name, x in rows(n, rng):
        x = bf16(x.astype(np.float32))
        y = bf16(bulk_model.row_softmax(x, cl, tpr, items, row=row, online=online, fuse=fuse)).astype(np.float64)
        ref = reference(x)
        assert np.isfinite(y).all(), name
        err = np.abs(y - ref)
        assert np.all(err <= 1.0e-3 + 1.6e-2 * np.abs(ref)), (name, float(err.max()))
        assert abs(y.sum() - 1) < 0.02, name


def test_a_row_of_minus_inf_gives_nan_as_the_reference():
    for cl in (1, 2, 8):
        for online in (False, True):
            y = bulk_model.row_softmax(np.full(50001, -np.inf, np.float32), cl, 256, 8, row=3, online=online)
            assert np.isnan(y).all()


def test_fuse_stays_within_a_hair_of_the_two_step_exponent():
    """FUSE's exponent (one FMA against m * log2 e rounded once) against the two-step form, at
    maxima up to FUSE_MAX: every output within 1e-4 relative (a few hundredths of a bf16 unit),
    and no lean either way; past FUSE_MAX (and for a non-finite max) the two-step form itself."""
    rng = np.random.default_rng(11)
    n = 46341
    for shift in (0.0, 3.0, -40.0, 200.0, 255.0, 300.0, 1e4):
        x = bf16((rng.standard_normal(n) * 4 + shift).astype(np.float32))
        a = bulk_model.row_softmax(x, 4, 512, 6, row=5).astype(np.float64)
        b = bulk_model.row_softmax(x, 4, 512, 6, row=5, fuse=True).astype(np.float64)
        big = a > 1e-30
        rel = (b[big] - a[big]) / a[big]
        assert np.abs(rel).max() < 1e-4, (shift, np.abs(rel).max())
        if abs(shift) >= 300:
            assert np.array_equal(a, b)  # the two-step form
    x[7] = np.inf
    assert np.isnan(bulk_model.row_softmax(x, 4, 512, 6, row=5, fuse=True)).all()


def test_hoist_picks_the_chunks_the_per_chunk_tests_pick():
    """HOIST (common/row_bulk.cuh.j2's mine_of): a thread's chunks in the part (it < mine) and its
    partial ones (bit it of edges), worked out once a row, are those part_chunk's tests pick a
    chunk at a time (q < pc, !whole) for every block and thread, at rows starting anywhere, long
    and short, full and part-filled parts. The expressions emulated are the rendered source's."""
    from runner.build.builder import Builder

    r = bulk_model.bulk_geometries()[0][0]
    cfg = next(c for c in r.configs if c["PF"] == 3 and c["STORE"] == "default")
    src = Builder(r.spec).render_all(dict(cfg, HOIST=1), shapes=[r.shape(16384, 1)])[0]
    for text in ("m.mine = pc > t ? (pc - t + TPR - 1) / TPR : 0;", "if (sp.off && a + t == 0) m.edges |= 1u;",
                 "const int last = sp.nv - 1 - a - t;",
                 "if (((sp.off + N) & 7) && last >= 0 && last % TPR == 0 && last / TPR < ITEMS) "
                 "m.edges |= 1u << (last / TPR);",
                 "const Mine mm = mine_of(sp, a, pc, N);",
                 "part_store(v, row_scale(m, s, mb), y, ring, s0, sh, sp, a, pc, N, &mm);"):
        assert text in src, text
    # RMSNorm's reads and stores take the same tests (session 57: its stores had kept them a chunk at a time)
    rr = bulk_model.bulk_geometries("rmsnorm")[0][0]
    rcfg = next(c for c in rr.configs if c["PF"] == 3 and c["STORE"] != "bulk" and not c["ALIGN"])
    rsrc = Builder(rr.spec).render_all(dict(rcfg, HOIST=1), shapes=[rr.shape(16384, 1)])[0]
    for text in ("part_chunk(ring, s0, it, sh, sp, a, pc, N, 0u, &mm);",
                 "part_rms(r, ws, y, ring, s0, sh, sp, a, pc, N, rsqrtf(ss / (float)N + eps), &mm);",
                 "if (mm ? (mm->edges >> it & 1u) == 0u : whole(sp, qq, N)) {"):
        assert text in rsrc, text

    def mine_of(off, nv, n, a, pc, t, tpr, items):
        mine = -(-(pc - t) // tpr) if pc > t else 0
        edges = 1 if (off and a + t == 0) else 0
        last = nv - 1 - a - t
        if ((off + n) & 7) and last >= 0 and last % tpr == 0 and last // tpr < items:
            edges |= 1 << (last // tpr)
        return mine, edges

    def whole(off, q, n):
        return q * 8 >= off and q * 8 + 8 <= off + n

    for tpr, items, cl in ((4, 3, 2), (8, 2, 4), (32, 8, 1), (512, 8, 8)):
        cap = tpr * items * 8 * cl
        for n in sorted({cap, cap - 1, cap - 7, cap // 2 + 1, cap * 3 // 4 + 5, 17, 8}):
            if n < 8:
                continue
            p, _ = bulk_model.cut_of(n, cl, 1024)
            if p > tpr * items:
                continue
            for row in range(8):
                base, off, nv = bulk_model.span_of(row, n)
                for rank in range(cl):
                    a = rank * p
                    pc = bulk_model.part_len(nv, a, p)
                    for t in range(tpr):
                        mine, edges = mine_of(off, nv, n, a, pc, t, tpr, items)
                        for it in range(items):
                            q = it * tpr + t
                            assert (it < mine) == (q < pc), (tpr, items, cl, n, row, rank, t, it)
                            if q < pc:
                                assert bool(edges >> it & 1) == (not whole(off, a + q, n)), (n, row, rank, t, it)


def test_inline_sources_issue_the_copies_the_host_model_issues():
    """INLINE (no producer warp): the rendered sources of both ops issue the ring's first NSLOT
    pieces from warp 0 before the first row and a row's refill after its block reductions (a
    cluster: inside cluster_pair, between the send and the wait), as bulk_model's `inline` does;
    no warp gives slots back through the empty mbarriers, and the block is TPR threads."""
    from runner.build.builder import Builder

    first = "if (warp == 0) bulk_issue(ring, full, x, cid, G, mine, N, c, rank, 0, NSLOT);"
    refill = "if (warp == 0) bulk_issue(ring, full, x, cid, G, mine, N, c, rank, n0 + NSLOT, c.sub);"
    for op, pair in (("softmax", "cluster_pair<RPAIR>(m, s, clv, clb, rank, jc++, refill);"),
                     ("rmsnorm", "cluster_pair<RSUM>(unused, ss, clv, clb, rank, jc++, refill);")):
        r = bulk_model.bulk_geometries(op)[0][0]
        cfg = next(c for c in r.configs if c["PF"] == 3 and c["STORE"] != "bulk" and c["CL"] == 8)
        on = Builder(r.spec).render_all(dict(cfg, INLINE=1), shapes=[r.shape(131072, 1)])[0]
        off = Builder(r.spec).render_all(dict(cfg, INLINE=0), shapes=[r.shape(131072, 1)])[0]
        assert "#define INLINE 1" in on and "#define INLINE 0" in off
        for text in (first, refill, pair):
            assert text in on, (op, text)
        body = on[on.index("rmsnorm_bf16(" if op == "rmsnorm" else "softmax_bf16("):]
        # the refill comes after the row's block reductions, never between its reads and them
        assert body.index("block_reduce<RSUM>") < body.index(refill)
        hook = on[on.index("__device__ __forceinline__ void cluster_pair("):]
        assert hook.index("hook();") < hook.index("mbar_wait_cluster(cb")
        for inline, threads in ((1, cfg["TPR"]), (0, cfg["TPR"] + 32)):
            assert Builder(r.spec).geometry(dict(cfg, INLINE=inline), [r.shape(131072, 1)])[0]["block"] == [threads]


def test_online_threads_of_only_minus_inf_hold_zeros_and_nan_spreads():
    # ONLINE: a thread whose chunks are all -inf carries (-inf, 0) into the block's merge and
    # scales its exponentials (0) by 0; the others' come out as the reference's
    n, rng = 40000, np.random.default_rng(5)
    x = bf16(rng.standard_normal(n).astype(np.float32))
    x[8 * 3:8 * 4] = -np.inf           # thread 3's first chunk
    x[: 8 * 256 * 2] = -np.inf         # every thread's first two chunks of block 0
    y = bulk_model.row_softmax(x, 2, 256, 8, row=0, online=True).astype(np.float64)
    ref = reference(x)
    assert np.all(y[x == -np.inf] == 0) and np.isfinite(y).all()
    assert np.all(np.abs(bf16(y) - ref) <= 1.0e-3 + 1.6e-2 * np.abs(ref))
    # a NaN element makes the whole row NaN, as exp2f's NaN in the sum does without ONLINE
    x[n // 2] = np.nan
    for online in (False, True):
        assert np.isnan(bulk_model.row_softmax(x, 2, 256, 8, row=0, online=online)).all()


# -- the rendered sources ------------------------------------------------------------------------

def test_pf3_sources_render_and_earlier_paths_do_not_carry_it(geos):
    from runner.build.builder import Builder

    r = geos[0][0]
    b = Builder(r.spec)
    for _, cfg, tpr, items, cl, slot, nslot, bulk, cap in geos[:4] + geos[-2:]:
        s = b.render_all(cfg, shapes=[r.shape(cap, 1)])[0]
        assert "{{" not in s and "{%" not in s
        assert f"#define SLOT {slot}" in s and f"#define NSLOT {nslot}" in s and f"#define BULK {int(bulk)}" in s
        assert "cp.async.bulk.shared::cluster.global" in s and "bar.sync 1" in s
        assert "bulk_store_part(y" in s and "#if BULK" in s  # STORE = bulk: BULK 1 picks the slots' store
        # one source serves every N of the bucket: the launch's sizes are arguments
        assert s == b.render_all(cfg, shapes=[r.shape(cap // 4 + 1, 37)])[0]
    # LAG (out of the space, the template's): a row's pair goes out only after the barrier of its
    # sum's block reduction, which every warp reaches after reading the row before's pairs (the
    # host model's order)
    # (never with EXPOLY, which the template refuses beside LAG)
    assert bulk_model.lagged(geos) and not any(g[1].get("EXPOLY") for g in bulk_model.lagged(geos))
    for _, cfg, *_, cap in bulk_model.lagged(geos)[::3]:
        s = b.render_all(cfg, shapes=[r.shape(cap, 1)])[0]
        body = s.split("softmax_bf16(")[1]
        assert "#define LAG 1" in s and "cluster_pair<RPAIR>" not in body
        i_recv = body.index("cluster_recv<RPAIR>(m, s, clv, clb, jc++)")
        i_red = body.index("block_reduce<RSUM>(m, s, red, jb++);\n    cluster_send(m, s, clv, clb, rank, jc);")
        assert body.index("block_reduce<RMAX>(m1, unused, red, jb++)") < i_recv < i_red
    others = [c for c in r.configs if c["PF"] != 3][::25]
    for cfg in others:
        s = b.render_all(cfg, shapes=[r.shape(r.lo, 1)])[0]
        assert "PF = 3" not in s and "mbarrier" not in s and "bulk" not in s.lower()


@pytest.mark.slow
def test_pf3_sources_compile_without_spills(geos):
    from runner.build.builder import Builder

    r = geos[0][0]
    b = Builder(r.spec)
    pick = [g for g in geos + bulk_model.lagged(geos) if (g[2], g[3], g[4]) in {(256, 8, 8), (512, 8, 8), (512, 6, 1)}]
    # the template's variants out of the space: ONLINE 1 on every pick without LAG, EXPOLY 2 at ITEMS 6
    plain = [g for g in pick if not g[1]["LAG"] and not g[1]["FUSE"] and not g[1]["HOIST"]]
    pick += [(g[0], dict(g[1], ONLINE=1)) + tuple(g[2:]) for g in plain]
    pick += [(g[0], dict(g[1], EXPOLY=2, ONLINE=o)) + tuple(g[2:]) for g in plain if g[3] == 6 for o in (0, 1)]
    pick += [(g[0], dict(g[1], FUSE=1, ONLINE=o)) + tuple(g[2:]) for g in plain for o in (0, 1)]
    # (HOIST with FUSE, or with STORE bulk, at ITEMS 8: 8 to 32 bytes spilled at the 96 registers,
    # so the spec refuses them there)
    pick += [(g[0], dict(g[1], HOIST=1, FUSE=f)) + tuple(g[2:]) for g in plain for f in (0, 1)
             if g[3] <= 6 or (f == 0 and g[1]["STORE"] == "default")]
    srcs = [b.render_all(g[1], shapes=[r.shape(g[-1], 1)])[0] for g in pick]
    for g, c in zip(pick, b._compile_all(srcs)):
        assert c.ok, (g[1], c.reason)
        res = c.resources
        assert not res.get("spill_stores") and not res.get("spill_loads"), (g[1], res)
