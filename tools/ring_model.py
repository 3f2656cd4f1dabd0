"""A numpy model of the PF = 2 ring of softmax_rt and rmsnorm_rt (common/row_ring.cuh.j2):
which aligned 16-byte chunks each thread copies into which of its slots, in which commit
group, what it reads back for each row after cp.async.wait_group SLOTS - ITEMS, which
elements it masks and which it stores.

    python tools/ring_model.py              # every PF = 2 geometry of both range specs, sampled N
    python tools/ring_model.py --every      # ... and every N of each bucket (spans and fit only)

The model transliterates the template's integer arithmetic (span_of, ring_start, ring_take,
ring_refill, ring_slot, whole, the row loop of a persistent cluster) for all T threads of a
row at once and checks, for every cluster of a small persistent grid (G clusters, M rows):
- a copy never overwrites a slot whose last copy the thread has not read yet;
- every read finds in its slot the copy of exactly that row's chunk, in a commit group the
  wait has completed; every copy is read once; nothing is copied from outside x;
- the rows' chunks, masked by index, give every element of x to exactly one thread's row,
  and the stores (16 bytes for a whole chunk, element by element for a partial one) write
  every element of y exactly once and nothing outside it.
`check_fit` checks, for every N of a bucket and rows at every offset within a chunk, that a
served row's chunks fit the row's T * ITEMS places (the spec's serves against span_of).
tests/test_ring_model.py runs both on a sample.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class RingError(AssertionError):
    pass


def span_of(row: int, n: int) -> tuple[int, int, int]:
    """(base, off, nv) as common/row_span.cuh.j2's span_of."""
    start = row * n
    off = start & 7
    return start >> 3, off, (off + n + 7) >> 3


def simulate(T: int, items: int, slots: int, n: int, m: int, G: int, wait: int | None = None,
             ahead: int | None = None) -> np.ndarray:
    """Runs the clusters 0 ... G - 1 of a persistent grid over m rows of n; returns how many
    times each element of y (m * n, and the rest of its last chunk) was stored. `wait` (the
    template's SLOTS - ITEMS) and `ahead` (its SLOTS / ITEMS) are there to be broken by the tests."""
    wait = slots - items if wait is None else wait
    ahead = slots // items if ahead is None else ahead
    if not (items < slots <= 16):
        raise RingError(f"SLOTS {slots} against ITEMS {items}")
    nchunks = (m * n + 7) >> 3  # x's 16-byte chunks (the last one may be partly past x)
    written = np.zeros(nchunks * 8, np.int64)
    g = np.arange(T)
    for cid in range(G):
        held = np.full((slots, T), -1, np.int64)   # the x chunk of the slot's last copy (-1: none)
        group = np.full((slots, T), -1, np.int64)  # that copy's commit group
        unread = np.zeros((slots, T), bool)
        groups = 0  # commit groups so far (the same in every thread)

        def copy(sl: int, base: int, q: np.ndarray, on: np.ndarray) -> None:
            nonlocal groups
            if not 0 <= sl < slots:
                raise RingError(f"slot {sl}")
            if np.any(on & unread[sl]):
                raise RingError(f"cluster {cid}: a copy into slot {sl} overwrites one not read yet")
            c = base + q
            if np.any(on & ((c < 0) | (c >= nchunks))):
                raise RingError(f"cluster {cid}: a copy from outside x")
            held[sl] = np.where(on, c, held[sl])
            group[sl] = np.where(on, groups, group[sl])
            unread[sl] |= on
            groups += 1  # ring_copy commits a group, empty or not

        def ring_slot(b: int, i: int) -> int:
            return b + i if b + i < slots else b + i - slots

        # ring_start
        for j in range(slots):
            row = cid + (j // items) * G
            base, _, nv = span_of(row, n)
            q = (j % items) * T + g
            copy(j, base, q, (row < m) & (q < nv))
        b, k, row = 0, 0, cid
        while row < m:
            # ring_take: cp.async.wait_group SLOTS - ITEMS
            done = groups - wait
            base, off, nv = span_of(row, n)
            if groups != k * items + slots:
                raise RingError(f"cluster {cid}: {groups} groups before row {k}")
            chunks = []
            for it in range(items):
                q = it * T + g
                on = q < nv
                sl = ring_slot(b, it)
                if np.any(on & ~unread[sl]) or np.any(on & (held[sl] != base + q)):
                    raise RingError(f"cluster {cid}, row {row}: slot {sl} does not hold chunk it={it}")
                if np.any(on & (group[sl] >= done)):
                    raise RingError(f"cluster {cid}, row {row}: slot {sl} read before its group completed")
                unread[sl] &= ~on
                chunks.append((q, on))
            # ring_refill: stream chunks k * ITEMS + SLOTS + i into slots b + i
            r1 = row + ahead * G
            r2 = r1 + G
            for i in range(items):
                q = ((slots + i) % items) * T + g
                rr = r1 if slots % items + i < items else r2
                bb, _, nn = span_of(rr, n)
                copy(ring_slot(b, i), bb, q, (rr < m) & (q < nn))
            b = ring_slot(b, items)
            if b != ((k + 1) * items) % slots:
                raise RingError("first slot of the next row")
            # the row's elements, masked by index, and the stores (softmax_held / rms_row)
            seen = np.zeros(n, np.int64)
            for q, on in chunks:
                qq = q[on]
                e = 8 * qq[:, None] - off + np.arange(8)[None, :]  # the chunk's elements, row-relative
                inrow = (e >= 0) & (e < n)
                np.add.at(seen, e[inrow], 1)
                whole = (qq * 8 >= off) & (qq * 8 + 8 <= off + n)
                if np.any(whole != inrow.all(axis=1)):
                    raise RingError(f"row {row}: whole() disagrees with the mask")
                ge = (base + qq)[:, None] * 8 + np.arange(8)[None, :]  # y's element index
                st = np.where(whole[:, None], True, inrow)
                np.add.at(written, ge[st], 1)
            if np.any(seen != 1):
                raise RingError(f"N={n}, row {row}: elements seen {seen.min()}..{seen.max()} times")
            row += G
            k += 1
        if np.any(unread):
            raise RingError(f"cluster {cid}: copies never read")
    return written


def check(T: int, items: int, slots: int, n: int, m: int, G: int = 3, **broken) -> None:
    w = simulate(T, items, slots, n, m, G, **broken)
    if np.any(w[: m * n] != 1) or np.any(w[m * n:] != 0):
        raise RingError(f"T={T} ITEMS={items} SLOTS={slots} N={n} M={m}: y written "
                        f"{w[: m * n].min()}..{w[: m * n].max()} times, {int(w[m * n:].sum())} past it")


def check_fit(T: int, items: int, served: np.ndarray, rows: list[int]) -> None:
    """Every served N (array) fits: nv <= T * ITEMS for rows at each index given (all offsets)."""
    for r in rows:
        start = r * served.astype(np.int64)
        nv = ((start & 7) + served + 7) >> 3
        bad = served[nv > T * items]
        if bad.size:
            raise RingError(f"T={T} ITEMS={items}: N={int(bad[0])} at row {r} needs {int(nv.max())} chunks")


# ----------------------------------------------------------------------------- the specs


def ring_geometries():
    """(spec name, Range, cfg, T, ITEMS, SLOTS, CAP) for every PF = 2 geometry of the range specs."""
    sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
    from range_check import SPECS, Range

    out, seen = [], set()
    for name in ("softmax", "rmsnorm"):
        r = Range(name, ROOT / SPECS[name])
        for cfg in r.configs:
            if cfg.get("PF") != 2:
                continue
            env = r.env(cfg, {"M": 1, r.sym: r.lo})
            key = (name, cfg["TPR"] * cfg["CL"], cfg["ITEMS"], int(env["SLOTS"]))
            if key in seen:
                continue
            seen.add(key)
            out.append((name, r, cfg, key[1], key[2], key[3], int(env["CAP"])))
    return out


def sample_sizes(r, cfg, cap: int, rng: random.Random, k: int) -> list[int]:
    lo, hi = max(r.lo, cap // 4 + 1), min(r.hi, cap)
    cand = {lo, lo + 1, hi, hi - 1, hi - 7, hi - 8, hi - 9, hi - 2, hi - 6}
    cand |= {rng.randint(lo, hi) for _ in range(k)} | {rng.randint(lo, hi) | 1 for _ in range(k)}
    return sorted(x for x in cand if r.serves(cfg, x))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", action="store_true", help="also check the fit of every N of each bucket")
    ap.add_argument("--sizes", type=int, default=4, help="random sizes a geometry (and as many odd ones)")
    a = ap.parse_args()
    rng = random.Random(0)
    fails = 0
    for name, r, cfg, T, items, slots, cap in ring_geometries():
        ns = sample_sizes(r, cfg, cap, rng, a.sizes)
        try:
            for n in ns:
                for m in (1, 2, 3 * (slots // items + 2) + 1):
                    check(T, items, slots, n, m)
            if a.every:
                lo, hi = max(r.lo, cap // 4 + 1), min(r.hi, cap)
                ns_all = np.arange(lo, hi + 1, dtype=np.int64)
                nv = (ns_all + 8 - np.minimum(8, ns_all & -ns_all) + 7) // 8  # the spec's NV
                every = ns_all[(nv <= cap // 8) & (4 * ns_all > cap)]         # and its serves
                for x in rng.sample(range(lo, hi + 1), 200):
                    if r.serves(cfg, x) != bool(np.isin(x, every)):
                        raise RingError(f"the spec's serves and the model's disagree at N={x}")
                check_fit(T, items, every, list(range(16)) + [2 ** 27 // hi - 1, 1_000_003])
            print(f"{name}: T={T} ITEMS={items} SLOTS={slots} CAP={cap}: ok ({len(ns)} sizes"
                  f"{', every N' if a.every else ''})", flush=True)
        except RingError as e:
            fails += 1
            print(f"FAIL {name}: T={T} ITEMS={items} SLOTS={slots}: {e}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
