"""A CPU model of kernel_templates/decode_attention.cu.j2's index arithmetic and algorithm,
and of decode_attention_paged.cu.j2's page addressing (`warp_pages`, `run_paged`).

It mirrors the kernel line for line where the kernel decides which tokens a block, a warp and
a tile read, where a split's record lies in the workspace, which block combines and in which
order; the arithmetic (online softmax per warp, the warps' merge, the splits' combine) runs in
float32 with torch on the CPU. tests/test_decode_attention.py checks it: every token below
lens[b] read exactly once, nothing at or past it, records inside the spec's workspace and
disjoint, and the result against the float64 reference.
"""

from __future__ import annotations

import math

import torch

D = 128
MAXS = 128
REC = 132
SCALE_LOG2 = 1 / math.sqrt(D) * math.log2(math.e)


def ws_row(L: int, group: int) -> int:
    return 4 + min(-(-L // 128), MAXS) * group * REC


def blocks(B: int, L: int, hkv: int, split: int):
    """(blockIdx.x, b, s, kvh) for the grid B * HKV * ceil(L / SPLIT), as the kernel decodes it."""
    ns_all = -(-L // split)
    for x in range(B * hkv * ns_all):
        kvh = x % hkv
        s = (x // hkv) % ns_all
        b = x // (hkv * ns_all)
        yield x, b, s, kvh


def block_tiles(len_b: int, s: int, split: int, nw: int, tw: int):
    """Per warp, the tiles (t0, tokens read) of block split s of a sequence of len_b tokens; None
    when the block returns at once (s >= ns_b). Tokens past `end` are zero-filled, not read."""
    ns = -(-len_b // split)
    if len_b == 0 or s >= ns:
        return None
    tok0 = s * split
    return segment_tiles(tok0, min(tok0 + split, len_b), nw, tw)


def segment_tiles(tok0: int, end: int, nw: int, tw: int):
    """Per warp, the tiles (t0, tokens read) of the tokens [tok0, end): warp w takes tiles w,
    w + NW, ... of TW tokens."""
    ntiles = -(-(end - tok0) // tw)
    out = []
    for w in range(nw):
        nmine = -(-(ntiles - w) // nw) if ntiles > w else 0
        tiles = []
        for i in range(nmine):
            t0 = tok0 + (w + i * nw) * tw
            tiles.append((t0, [t for t in range(t0, t0 + tw) if t < end]))
        out.append(tiles)
    return out


def lean_segments(B: int, L: int, hkv: int, grid: int, tw: int, lens):
    """LEAN (stream-K): per block, in launch order, its segments (b, kvh, s, ns, tok0, end) as
    the kernel finds them: the TW-token chunks of every (b, kvh) end to end, block x taking
    [x * PC / G, (x + 1) * PC / G); s is the segment's index among its pair's, ns the pair's
    live segments. Segments with no token below lens[b] are left out, as the kernel skips them."""
    C = -(-L // tw)
    PC, G = B * hkv * C, grid
    out = []
    for x in range(G):
        c0, c1 = x * PC // G, (x + 1) * PC // G
        segs = []
        if c0 == c1:  # no chunk: the kernel returns (the spec's grid never makes one)
            out.append(segs)
            continue
        pr = c0 // C
        while pr * C < c1:
            b, kvh, pc0 = pr // hkv, pr % hkv, pr * C
            n = min(max(int(lens[b]), 0), L)
            gfirst = ((pc0 + 1) * G - 1) // PC  # the block holding the pair's first chunk
            tok0 = (max(c0, pc0) - pc0) * tw
            if n and tok0 < n:
                ns = ((pc0 + -(-n // tw)) * G - 1) // PC - gfirst + 1
                segs.append((b, kvh, x - gfirst, ns, tok0, min((min(c1, pc0 + C) - pc0) * tw, n)))
            pr += 1
        out.append(segs)
    return out


def record_offset(b: int, kvh: int, s: int, h: int, L: int, hkv: int, group: int) -> int:
    """Flat float index of record (b, kvh, s, h) in ws [B, HKV, WSROW]."""
    return (b * hkv + kvh) * ws_row(L, group) + 4 + (s * group + h) * REC


def counter_offset(b: int, kvh: int, L: int, hkv: int, group: int) -> int:
    return (b * hkv + kvh) * ws_row(L, group)


def run(q, k, v, lens, split: int, nw: int, tw: int, finish_order=None):
    """The kernel's answer, float32 arithmetic: out [B, HQ, D] (float32, before the bf16
    rounding) and the order in which each (b, kvh) combined its splits. `finish_order`, a
    permutation of the blocks, is the order the blocks take their tickets (default: launch
    order); the answer must not depend on it."""
    return _run(q, contiguous_rows(k, v), lens, k.shape[1], k.shape[2], split, nw, tw, finish_order)


def contiguous_rows(k, v):
    """`rows(b, s, w, tiles, kvh)` of the contiguous layout: each tile's K and V rows, the tokens
    it reads of sequence b."""
    kf, vf = k.float(), v.float()
    return lambda b, s, w, tiles, kvh: [(kf[b, toks, kvh], vf[b, toks, kvh]) for _, toks in tiles]


def _run(q, rows, lens, L: int, hkv: int, split: int, nw: int, tw: int, finish_order=None):
    """`run` with the K and V rows of a warp's tiles from `rows(b, s, w, tiles, kvh)` (the
    layout's addressing): [(K rows [n, D], V rows [n, D]) per tile]."""
    units = []
    for _, b, s, kvh in blocks(q.shape[0], L, hkv, split):
        len_b = min(max(int(lens[b]), 0), L)
        warps = block_tiles(len_b, s, split, nw, tw)
        units.append([] if warps is None else [(b, kvh, s, -(-len_b // split), warps)])
    return _finish(q, rows, hkv, units, finish_order)


def run_lean(q, k, v, lens, grid: int, nw: int, tw: int, finish_order=None):
    """The LEAN kernel's answer (as `run`) on a grid of `grid` blocks; `finish_order` permutes
    the blocks (a block takes its segments' tickets in its own order)."""
    B, L, hkv, _ = k.shape
    units = [[(b, kvh, s, ns, segment_tiles(t0, end, nw, tw)) for b, kvh, s, ns, t0, end in segs]
             for segs in lean_segments(B, L, hkv, grid, tw, lens)]
    return _finish(q, contiguous_rows(k, v), hkv, units, finish_order)


def _finish(q, rows, hkv: int, units, finish_order=None):
    """Each block's segments (b, kvh, s, ns, tiles per warp), block by block in `finish_order`
    (default launch order): the warps' online softmax, their merge in warp order, then one split
    writes out, the others their record and ticket, and the last of a pair combines in order."""
    B, HQ, _ = q.shape
    group = HQ // hkv
    qf = q.float()
    out = torch.full((B, HQ, D), float("nan"))
    recs: dict = {}
    counters: dict = {}
    combined: dict = {}
    order = finish_order if finish_order is not None else range(len(units))
    for idx in order:
        for b, kvh, s, ns, warps in units[idx]:
            qg = qf[b, kvh * group:(kvh + 1) * group]  # [G, D]
            states = []
            for w, tiles in enumerate(warps):  # each warp's online softmax over its tiles, in tile order
                m = torch.full((group,), float("-inf"))
                l = torch.zeros(group)
                acc = torch.zeros(group, D)
                for kt, vt in rows(b, s, w, tiles, kvh):  # [n, D] each
                    sc = (qg @ kt.T) * SCALE_LOG2  # [G, n]
                    mn = torch.maximum(m, sc.max(dim=1).values)
                    alpha = torch.exp2(m - mn)
                    p = torch.exp2(sc - mn[:, None])
                    l = l * alpha + p.sum(dim=1)
                    acc = acc * alpha[:, None] + p @ vt
                    m = mn
                states.append((m, l, acc))
            mm = torch.stack([st[0] for st in states]).max(dim=0).values
            ll = torch.zeros(group)
            a = torch.zeros(group, D)
            for m, l, acc in states:  # warp order
                f = torch.exp2(m - mm)
                ll = ll + l * f
                a = a + acc * f[:, None]
            if ns == 1:
                out[b, kvh * group:(kvh + 1) * group] = a / ll[:, None]
                continue
            recs[(b, kvh, s)] = (mm, ll, a)
            c = counters.get((b, kvh), 0)
            counters[(b, kvh)] = c + 1
            if c != ns - 1:
                continue
            # the last block: splits in order 0 .. ns - 1
            ms = torch.stack([recs[(b, kvh, x)][0] for x in range(ns)])  # [ns, G]
            M = ms.max(dim=0).values
            f = torch.exp2(ms - M)
            Ls = sum(recs[(b, kvh, x)][1] * f[x] for x in range(ns))
            wgt = f / Ls
            o = torch.zeros(group, D)
            for x in range(ns):
                o = o + recs[(b, kvh, x)][2] * wgt[x][:, None]
            out[b, kvh * group:(kvh + 1) * group] = o
            combined[(b, kvh)] = list(range(ns))
            counters[(b, kvh)] = 0  # reset for the next call
    return out, combined, counters


# ----------------------------------------------------------------------------- paged KV

def warp_pages(table_row, len_b: int, s: int, w: int, split: int, nw: int, tw: int, page: int, stages: int):
    """The pool page of each of warp w's tiles in block split s, as the paged kernel finds it,
    and the table slots it reads. The kernel's start, before lens[b] is known: lane x of the warp
    loads the slot of tile 32 c + x into pg[c], for every tile the split would have at full
    length (i < SPLIT / (NW * TW)) whose slot is inside the row. Then, if the block has work, its
    tiles i < nmine are issued in order, the first STAGES - 1 in the prologue and one a step in
    the refill, each page a shuffle of pg[0] from lane i % 32, pg shifted down (pg[c] = pg[c + 1])
    before every 32nd tile's. Returns ([page of tile i for i < nmine], [slots read])."""
    maxp = len(table_row)
    maxt = split // (nw * tw)
    nch = -(-maxt // 32)  # NCH
    pg = [[0] * 32 for _ in range(nch)]
    slots = []
    for c in range(nch):
        for x in range(32):
            i = 32 * c + x
            slot = (s * split + (w + i * nw) * tw) // page
            if i < maxt and slot < maxp:
                slots.append(slot)
                pg[c][x] = int(table_row[slot])
    warps = block_tiles(len_b, s, split, nw, tw)
    if warps is None:
        return [], slots
    tiles = warps[w]
    nmine = len(tiles)
    issued = {}
    for i in range(stages - 1):  # the prologue
        if i < nmine:
            issued[i] = pg[0][i & 31]
    for i in range(nmine):  # the refill of step i issues tile i + STAGES - 1
        ia = i + stages - 1
        if ia < nmine:
            if nch > 1 and ia & 31 == 0:
                pg = pg[1:] + [pg[-1]]
            issued[ia] = pg[0][ia & 31]
    return [issued[i] for i in range(nmine)], slots


def tile_pool_rows(pg: int, t0: int, n: int, page: int) -> list[int]:
    """Rows of the pool (in tokens: page * PAGE + row) of a tile's first n tokens: tile_at's
    base (page pg, row t0 % PAGE) and the layout's stride. A tile never straddles a page."""
    assert t0 % page + n <= page, "a tile straddles a page"
    return [pg * page + t0 % page + r for r in range(n)]


def run_paged(q, k_cache, v_cache, table, lens, split: int, nw: int, tw: int, stages: int = 2,
              finish_order=None, trace=None):
    """The paged kernel's answer (as `run`), its K and V rows found by `warp_pages` and
    `tile_pool_rows`: k_cache, v_cache [NP, PAGE, HKV, D], table [B, MAXP]. `trace`, a dict,
    gets {(b, kvh, s, w): (slots read, [(token, pool row) ...])}."""
    npages, page, hkv, _ = k_cache.shape
    maxp = table.shape[1]
    kp = k_cache.float().reshape(npages * page, hkv, D)
    vp = v_cache.float().reshape(npages * page, hkv, D)

    def rows(b, s, w, tiles, kvh):
        len_b = min(max(int(lens[b]), 0), maxp * page)
        pages, slots = warp_pages(table[b], len_b, s, w, split, nw, tw, page, stages)
        out, seen = [], []
        for (t0, toks), pg in zip(tiles, pages):
            pool = tile_pool_rows(pg, t0, len(toks), page)
            seen += list(zip(toks, pool))
            out.append((kp[pool, kvh], vp[pool, kvh]))
        if trace is not None:
            trace[(b, kvh, s, w)] = (slots, seen)
        return out

    return _run(q, rows, lens, maxp * page, hkv, split, nw, tw, finish_order)
