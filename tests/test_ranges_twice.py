"""PF = 4 of softmax_rt and rmsnorm_rt (a row read twice: the reduction from a first read, the
output from a second that finds the part in L2; common/row_twice.cuh.j2) without a GPU: the
specs' configurations, their rendered sources, and a host model of the kernel's cut of a row
into rounds and partial edge chunks and of its online (max, sum) arithmetic, on rows at every
16-byte offset. The GPU check is `tools/range_check.py --ops softmax,rmsnorm --only PF=4 --all`
on the H200 (notebook, "The long rows read twice")."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import range_check  # noqa: E402
from test_ranges_long import bf16, reference, rows  # noqa: E402

L2E = np.float32(1.4426950408889634)


@pytest.fixture(scope="module", params=["softmax", "rmsnorm"])
def spec(request):
    return range_check.Range(request.param, ROOT / range_check.SPECS[request.param])


# -- the specs ------------------------------------------------------------------------------------

def launch(spec):
    """The spec's grid, block and shared-memory expressions."""
    from runner.core.expr import compile_expr

    return (compile_expr(spec.raw["kernel"][f]) for f in ("grid", "block", "shared_mem"))


def twice_configs(spec, pf: int, count: int, items: tuple[int, ...]) -> list[dict]:
    """The spec's PF = pf configurations: count of them, blocks of 256 threads or more, ITEMS
    among items, y stored streaming."""
    cfgs = [c for c in spec.configs if c["PF"] == pf]
    assert len(cfgs) == count
    for c in cfgs:
        assert c["TPR"] >= 256 and c["ITEMS"] in items and c["STORE"] == "cs", c
    return cfgs


def test_pf4_configurations_stream_whole_rows_of_16384_and_more(spec):
    pf4 = twice_configs(spec, 4, 23, (4, 6))
    grid, block, smem = launch(spec)
    for cfg in pf4:
        cap = spec.cap(cfg)
        # no bucket caps the row: every N from 16384 (or CAP / 2) to the domain's end
        lo = max(16384, (cap + 1) // 2)
        assert lo <= spec.hi
        for n in (lo, lo + 1, lo + 7, 131071, spec.hi - 1, spec.hi):
            if n >= lo:
                assert spec.serves(cfg, n), (cfg, n)
        assert not spec.serves(cfg, lo - 1)
        # a block (or cluster) a row, never persistent; nothing in shared memory but the reductions
        for m in (1, 37, 2011):
            e = spec.env(cfg, {"M": m, "N": lo})
            assert grid(e) == m * cfg["CL"] and block(e) == cfg["TPR"] and smem(e) == 0
    # every long row has several to choose from
    for n in (16384, 23170, 46341, 66719, 131072, 185364, 262144):
        assert sum(spec.serves(c, n) for c in pf4) >= 4, n


def test_pf4_sources_carry_the_l2_hints_and_other_paths_do_not(spec):
    from runner.build.builder import Builder

    b = Builder(spec.spec)
    pf4 = [c for c in spec.configs if c["PF"] == 4]
    for cfg in pf4[::5]:
        s = b.render_all(cfg, shapes=[spec.shape(65536, 1)])[0]
        assert "{{" not in s and "{%" not in s
        assert "createpolicy.fractional.L2::evict_last" in s and "L2::cache_hint" in s and "ld.global.cs" in s
        assert "row_at(x, y, blockIdx.x / CL, M, N, g)" in s and "__stcs(" in s
        # one source serves every N: the sizes are launch arguments
        assert s == b.render_all(cfg, shapes=[spec.shape(262139, 37)])[0]
    for cfg in [c for c in spec.configs if c["PF"] < 4][::20]:
        s = b.render_all(cfg, shapes=[spec.shape(spec.lo, 1)])[0]
        assert "createpolicy" not in s and "whole_of" not in s


@pytest.mark.slow
def test_pf4_sources_compile_without_spills(spec):
    from runner.build.builder import Builder

    b = Builder(spec.spec)
    pick = [c for c in spec.configs if c["PF"] == 4 and c["ITEMS"] == 6][::2]
    srcs = [b.render_all(c, shapes=[spec.shape(65536, 1)])[0] for c in pick]
    for cfg, c in zip(pick, b._compile_all(srcs)):
        assert c.ok, (cfg, c.reason)
        assert not c.resources.get("spill_stores") and not c.resources.get("spill_loads"), (cfg, c.resources)


# -- the host model of a row -----------------------------------------------------------------------

def whole_of(off: int, nv: int, n: int, g: int, t: int) -> tuple[int, int, int]:
    """common/row_twice.cuh.j2's whole_of: the whole chunks qa <= q < qb and thread g's edge."""
    qa = 1 if off != 0 else 0
    qb = nv - 1 if nv > 0 and (off + n) % 8 != 0 else nv
    if nv > 0 and g == 0 and qa == 1:
        edge = 0
    elif g == t - 1 and qb < nv and nv - 1 >= qa:
        edge = nv - 1
    else:
        edge = -1
    return qa, qb, edge


def ex(v, m):
    with np.errstate(invalid="ignore", over="ignore"):
        return np.exp2((np.asarray(v, np.float32) - np.float32(m)) * L2E).astype(np.float32)


def merge(m, s, m2, s2):
    """row_reduce.cuh.j2's merge of online pairs."""
    big, small = (s, s2) if m >= m2 else (s2, s)
    d = np.float32(0) if m == m2 else np.float32(abs(m - m2))
    return max(m, m2), np.float32(small * np.exp2(-d * L2E) + big)


def twice_softmax(x: np.ndarray, off: int, t: int, items: int):
    """The PF = 4 softmax of one row whose first element sits at `off` in its first 16-byte chunk,
    over T = t threads with ITEMS chunks a round, in float32 as the kernel computes it. The
    neighbours' elements of the partial chunks are NaN, so any that leaks in shows. Returns
    the output and how often each chunk was read in each pass and each element written."""
    n = len(x)
    nv = (off + n + 7) // 8
    buf = np.full(nv * 8, np.nan, np.float32)
    buf[off:off + n] = x
    ch = buf.reshape(nv, 8)
    reads = np.zeros((2, nv), int)
    m = np.full(t, -np.inf, np.float32)
    s = np.zeros(t, np.float32)
    for g in range(t):
        qa, qb, edge = whole_of(off, nv, n, g, t)
        for q0 in range(g, nv, items * t):
            q = q0 + np.arange(items) * t
            ok = (q >= qa) & (q < qb)
            reads[0, q[ok]] += 1
            v = np.where(ok[:, None], ch[np.minimum(q, nv - 1)], np.float32(-np.inf))
            mn = max(m[g], np.float32(v.max()))
            if mn != m[g]:
                s[g] *= ex(m[g], mn)
            m[g] = mn
            s[g] += ex(v, 0.0 if m[g] == -np.inf else m[g]).sum(dtype=np.float32)
        if edge >= 0:
            reads[0, edge] += 1
            lo, hi = off - 8 * edge, off + n - 8 * edge
            v = np.where((np.arange(8) >= lo) & (np.arange(8) < hi), ch[edge], np.float32(-np.inf))
            cm = np.float32(v.max())
            cs = ex(v, 0.0 if cm == -np.inf else cm).sum(dtype=np.float32)
            m[g], s[g] = merge(m[g], s[g], cm, cs)
    # the row's merge: a butterfly, as row_reduce joins the partials
    mm, ss = list(m), list(s)
    while len(mm) > 1:
        half = len(mm) // 2
        for i in range(half):
            mm[i], ss[i] = merge(mm[i], ss[i], mm[i + half], ss[i + half])
        mm, ss = mm[:half], ss[:half]
    with np.errstate(divide="ignore"):  # a row of -inf alone: sum 0, as the kernel
        ml, inv = mm[0], np.float32(1) / ss[0]
    # the second pass: the chunks each thread reads, in the order it reads them, thread after
    # thread; their outputs computed and stored all at once (elementwise, the same float32
    # values a chunk at a time gives), each read and each element's store counted
    qs = []
    for g in range(t):
        qa, qb, edge = whole_of(off, nv, n, g, t)
        q = (np.arange(g, nv, items * t)[:, None] + np.arange(items) * t).ravel()
        qs += [q[(q >= qa) & (q < qb)], np.array([edge] if edge >= 0 else [], int)]
    q = np.concatenate(qs)
    np.add.at(reads[1], q, 1)
    o = bf16(ex(ch[q], ml) * inv)  # [chunks, 8]
    e = 8 * q[:, None] + np.arange(8)
    keep = (e >= off) & (e < off + n)  # store_part keeps the neighbours' elements
    out = np.full(nv * 8, np.nan, np.float32)
    out[e[keep]] = o[keep]
    written = np.bincount(e[keep], minlength=nv * 8)
    return out[off:off + n], reads, written[off:off + n]


@pytest.mark.parametrize("t, items", [(4, 2), (8, 3), (32, 4)])
def test_every_chunk_is_read_once_a_pass_and_every_element_written_once(t, items):
    rng = np.random.default_rng(t)
    for n in list(range(1, 40)) + [t * items * 8 - 1, t * items * 8, t * items * 8 + 9, 1000, 1001]:
        for off in range(8):
            x = bf16(rng.standard_normal(n).astype(np.float32))
            y, reads, written = twice_softmax(x, off, t, items)
            assert (reads == 1).all(), (n, off)
            assert (written == 1).all(), (n, off)
            assert np.isfinite(y).all(), (n, off)  # no neighbour (NaN) leaked into the row


@pytest.mark.parametrize("t, items, n, off", [
    (256, 4, 16384, 0), (256, 6, 23170, 3), (512, 6, 46341, 5), (64, 4, 66719, 1), (128, 6, 262139, 7),
])
def test_row_arithmetic_matches_float64(t, items, n, off):
    rng = np.random.default_rng(n)
    for name, x in rows(n, rng):
        x = bf16(x.astype(np.float32))
        y, _, _ = twice_softmax(x, off, t, items)
        ref = reference(x)
        assert np.isfinite(y).all(), name
        err = np.abs(y.astype(np.float64) - ref)
        assert np.all(err <= 1.0e-3 + 1.6e-2 * np.abs(ref)), (name, float(err.max()))


def test_a_row_of_minus_inf_gives_nan_and_a_lone_finite_edge_counts():
    y, _, _ = twice_softmax(np.full(1001, -np.inf, np.float32), 3, 8, 3)
    assert np.isnan(y).all()
    # the only finite element in a partial edge chunk (thread T - 1's): it gets all the mass
    x = np.full(1001, -np.inf, np.float32)
    x[-1] = 2.0
    y, _, _ = twice_softmax(x, 3, 8, 3)
    assert y[-1] == 1.0 and (y[:-1] == 0).all()
    x = np.full(1001, -np.inf, np.float32)
    x[0] = -5.0  # ... and in the first (thread 0's)
    y, _, _ = twice_softmax(x, 5, 8, 3)
    assert y[0] == 1.0 and (y[1:] == 0).all()


def test_range_check_verifies_a_configuration_no_bucket_caps_at_sizes_it_serves(spec):
    # PF = 4 serves every row from 16384 up, past its CAP: the tool's sizes are drawn where
    # `serves` holds across the domain (before, a CAP under 16384 left none, and such a
    # configuration was compiled and timed but never verified); and --sizes 1 keeps one
    import random

    for cfg in [c for c in spec.configs if c["PF"] == 4][:6]:
        got = range_check.test_sizes(spec, cfg, random.Random(3), 5)
        assert len(got) == 5 and all(spec.serves(cfg, n) and spec.lo <= n <= spec.hi for n in got), (cfg, got)
        assert any(n > spec.cap(cfg) for n in got) or spec.cap(cfg) >= spec.hi
        assert range_check.test_sizes(spec, cfg, random.Random(3), 1) == [max(
            range_check.test_sizes(spec, cfg, random.Random(3), 100))]
