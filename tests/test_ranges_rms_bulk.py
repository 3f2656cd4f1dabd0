"""PF = 3 of rmsnorm_rt (softmax_rt's bulk-copy ring, common/row_bulk.cuh.j2, with RMSNorm's sum
of squares and weight) without a GPU: the spec's configurations and launches, the rendered
sources, and their compile. The ring's protocol and its cut of a row are softmax's, modelled by
tools/bulk_model.py (tests/test_ranges_long.py); the GPU check is `tools/range_check.py --ops
rmsnorm --only PF=3 --all` on the H200."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import bulk_model  # noqa: E402
from range_check import Range  # noqa: E402


@pytest.fixture(scope="module")
def rms():
    return Range("rmsnorm", ROOT / "pipelines/rmsnorm-range-h200.yaml")


def launch(r):
    from runner.core.expr import compile_expr

    return (compile_expr(r.raw["kernel"][f]) for f in ("grid", "block", "shared_mem"))


def test_pf3_configurations_and_their_launch(rms):
    pf3 = [c for c in rms.configs if c["PF"] == 3]
    assert len(rms.configs) == 464 and len(pf3) == 59  # HOIST on the reads: in the space (session 56)
    assert {(c["TPR"], c["ITEMS"]) for c in rms.configs if c["CL"] == 16} == {(256, 6), (256, 8)}
    assert all(c["PF"] == 3 for c in rms.configs if c["CL"] == 16)
    assert {c["ALIGN"] for c in pf3} == {0, 1} and all(c["ALIGN"] == 0 for c in rms.configs if c["PF"] != 3)
    assert all(c["LAG"] == 0 for c in rms.configs)  # LAG = 1: the template's, out of the space (session 53)
    # line-aligned copies with streaming stores only; bulk stores only on PF = 3, where the ring
    # holds three parts (TPR 512 ITEMS 6)
    assert all(c["STORE"] == "cs" for c in pf3 if c["ALIGN"])
    bulk = [c for c in rms.configs if c["STORE"] == "bulk"]
    assert len(bulk) == 8 and all(c["PF"] == 3 and c["ALIGN"] == 0 for c in bulk)  # HOIST 0 and 1
    grid, block, smem = launch(rms)
    for c in pf3:
        assert c["TPR"] in (256, 512) and c["ITEMS"] in (6, 8) and c["STORE"] in ("cs", "bulk") and c["WH"] == 0
        cap = rms.cap(c)
        assert cap >= 16384
        e = rms.env(c, {"M": 2 ** 27 // cap, "N": cap})
        minb, slot, nslot = int(e["MINB"]), int(e["SLOT"]), int(e["NSLOT"])
        assert minb == 512 // c["TPR"]
        # the producer warp; the ring of whole 16 KiB slots (ALIGN: 128 bytes more each) and the
        # weight's columns in the SM's 228 KiB with MINB blocks; two parts of SUBMAX pieces at least
        assert block(e) == c["TPR"] + 32
        ring = nslot * (slot + 128 * c["ALIGN"])
        weight = (c["TPR"] * c["ITEMS"] + 1) * 16  # the block's columns: a part and the chunk before
        assert smem(e) == ring + weight and minb * (ring + weight + 3072) <= 233472
        sub = -(-(c["TPR"] * c["ITEMS"] * 16) // slot)
        # two parts at least; with bulk stores three (a row's slots come back once the next
        # row's store is issued: the row after that loads meanwhile)
        assert nslot >= (3 if c["STORE"] == "bulk" else 2) * sub
        # a persistent grid: the clusters that fit at once, every row taken once
        for m in (1, 3, 37, 2 ** 27 // cap + 5):
            g = grid(rms.env(c, {"M": m, "N": cap})) // c["CL"]
            assert g == min(m, (132 if c["CL"] <= 2 else 120 if c["CL"] <= 8 else 112) * minb // c["CL"])
            assert sorted(r for k in range(g) for r in range(k, m, g)) == list(range(m))
        # the bucket: rows that fit, and fill more than a quarter of it
        assert rms.serves(c, cap) and rms.serves(c, cap // 4 + 1) and not rms.serves(c, cap // 4)
    # the long rows have several to choose from
    for n in (16384, 46341, 131071, 262144):
        assert sum(rms.serves(c, n) for c in pf3) >= 2, n


def test_pf3_sources_carry_the_ring_the_sums_and_the_weight(rms):
    from runner.build.builder import Builder

    b = Builder(rms.spec)
    pf3 = [c for c in rms.configs if c["PF"] == 3]
    for c in pf3[::4] + [c for c in pf3 if c["STORE"] == "bulk"][::2] + bulk_model.with_lag(pf3)[::5]:
        cap = rms.cap(c)
        s = b.render_all(c, shapes=[rms.shape(cap, 1)])[0]
        assert "{{" not in s and "{%" not in s
        assert "cp.async.bulk.shared::cluster.global" in s and "bar.sync 1" in s
        assert f"#define ALIGN {c['ALIGN']}" in s and f"#define BULK {int(c['STORE'] == 'bulk')}" in s
        assert "rsqrtf(ss / (float)N + eps)" in s and f"#define LAG {c['LAG']}" in s
        # the cluster's exchange of the sums, compiled where CL > 1; LAG: sent once every warp
        # received the row before's, and received a row later
        assert f"#define CL {c['CL']}" in s
        if c["LAG"]:
            assert "block_reduce<RSUM>(unused, s1" in s and "cluster_pair<RSUM>(unused, ss" not in s
            assert "compute_sync();\n    ss = s1;\n    cluster_send(unused, ss" in s
            assert "cluster_recv<RSUM>(unused, ss, clv, clb, jc++)" in s
        else:
            assert "block_reduce<RSUM>(unused, ss" in s and "#if CL > 1\n    cluster_pair<RSUM>(unused, ss" in s
            assert "cluster_send(" not in s.split("rmsnorm_bf16(")[1]
        # the weight's columns from shared memory, after the ring, shifted on unaligned rows
        assert "ring + NSLOT * SSTRIDE" in s and "w_shift(as_pack(ws[q]), as_pack(ws[q + 1]), wsh)" in s
        assert ("__stcs(" in s) == (c["STORE"] == "cs") and "bulk_store_part(y, ring" in s
        # one source serves every N of its bucket
        assert s == b.render_all(c, shapes=[rms.shape(cap // 4 + 1, 37)])[0]
    for c in [c for c in rms.configs if c["PF"] != 3][::40]:
        s = b.render_all(c, shapes=[rms.shape(rms.lo, 1)])[0]
        assert "mbarrier" not in s and "ALIGN" not in s


@pytest.mark.slow
def test_pf3_sources_compile_without_spills(rms):
    from runner.build.builder import Builder

    b = Builder(rms.spec)
    pick = [c for c in rms.configs + bulk_model.with_lag(rms.configs) if c["PF"] == 3 and (c["CL"] in (1, 8))]
    # HOIST: its reads on every pick without LAG or ALIGN
    pick += [dict(c, HOIST=1) for c in pick if not c["LAG"] and not c["ALIGN"] and not c["HOIST"]]
    assert all(c["PF"] == 3 and not c["ALIGN"] for c in rms.configs if c["HOIST"])
    srcs = [b.render_all(c, shapes=[rms.shape(rms.cap(c), 1)])[0] for c in pick]
    for cfg, res in zip(pick, b._compile_all(srcs)):
        assert res.ok, (cfg, res.reason)
        assert not res.resources.get("spill_stores") and not res.resources.get("spill_loads"), (cfg, res.resources)


@pytest.mark.slow
def test_pf3_ring_protocol_on_the_specs_own_geometries():
    """The host model of the ring (tools/bulk_model.py: copies, mbarriers, reads, 16-byte and bulk
    stores) on RMSNorm's PF = 3 geometries, with its own NSLOT (the weight's columns take part
    of the shared memory): every element of y written once, no slot overwritten while read."""
    import random

    rng = random.Random(5)
    geos = bulk_model.bulk_geometries("rmsnorm")
    assert len(geos) == 59 and any(g[7] for g in geos) and any(g[4] == 16 for g in geos)
    geos += bulk_model.lagged(geos)
    done = set()
    for r, cfg, tpr, items, cl, slot, nslot, bulk, cap in geos:
        align, lag = cfg["ALIGN"] == 1, cfg["LAG"] == 1
        if cl >= 4 or (tpr, items, bulk, align, lag) in done:
            continue  # clusters of 4 and 8 are slow to model: the geometry once at CL 1 or 2
        done.add((tpr, items, bulk, align, lag))
        lo, hi = max(r.lo, cap // 4 + 1), min(r.hi, cap)
        for n in [n for n in (hi, hi - 7, rng.randint(lo, hi) | 1) if r.serves(cfg, n)]:
            _, sub = bulk_model.cut_of(n, cl, slot // 16)
            bulk_model.check(tpr, items, cl, slot, nslot, bulk, n, nslot // sub + 4, G=2, seed=n, align=align,
                             lag=lag)
    assert len(done) >= 6 and any(d[-1] for d in done)
