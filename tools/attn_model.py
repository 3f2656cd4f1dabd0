"""A CPU model of kernel_templates/decode_attention.cu.j2's index arithmetic and algorithm.

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
    end = min(tok0 + split, len_b)
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
    B, HQ, _ = q.shape
    L, hkv = k.shape[1], k.shape[2]
    group = HQ // hkv
    qf, kf, vf = q.float(), k.float(), v.float()
    out = torch.full((B, HQ, D), float("nan"))
    recs: dict = {}
    counters: dict = {}
    combined: dict = {}
    blist = list(blocks(B, L, hkv, split))
    order = finish_order if finish_order is not None else range(len(blist))
    for idx in order:
        _, b, s, kvh = blist[idx]
        len_b = min(max(int(lens[b]), 0), L)
        warps = block_tiles(len_b, s, split, nw, tw)
        if warps is None:
            continue
        ns = -(-len_b // split)
        qg = qf[b, kvh * group:(kvh + 1) * group]  # [G, D]
        states = []
        for tiles in warps:  # each warp's online softmax over its tiles, in tile order
            m = torch.full((group,), float("-inf"))
            l = torch.zeros(group)
            acc = torch.zeros(group, D)
            for t0, toks in tiles:
                kt = kf[b, toks, kvh]  # [n, D]
                vt = vf[b, toks, kvh]
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
