"""A host model of PF = 3, the bulk-copy ring of softmax_rt (common/row_bulk.cuh.j2 and the
template's PF = 3 kernel): the run-time cut of a row into block parts and pieces, the producer
warp's bulk copies into the ring's slots, the mbarrier protocol (full, empty, the cluster's
st.async pairs), the compute warps' reads, their stores and the bulk stores from the slots;
and the kernel's float32 arithmetic on one row against float64.

    python tools/bulk_model.py            # every PF = 3 geometry of the softmax range spec, sampled N
    python tools/bulk_model.py --every    # ... and the fit of every N of each bucket
    python tools/bulk_model.py --op rmsnorm   # rmsnorm_rt's PF = 3: the same ring and stores

`simulate` transliterates the template's integer arithmetic (cut_of, span_of, part_len,
bulk_slot, bulk_at, bulk_produce, bulk_wait, bulk_release, bulk_release_all,
bulk_store_part, whole, the row loop) and runs every agent of a cluster (each block's
producer lane and its compute warps, one agent a warp) under a seeded random schedule, the
asynchronous copies landing (and the bulk stores reading their slots) at random later steps.
An mbarrier is modelled by its phase, pending arrivals and transaction bytes; a wait on a
parity passes when the phase of that parity completed, and the model checks that the phase
it passed on is the one the template meant (no lapping). It checks:
- a bulk copy never writes a slot that a warp may still read or a bulk store still has to
  read (the slot holds garbage from the copy's issue until its bytes land);
- every read finds in its slot position exactly the chunk of x the template's index names
  (the row's chunk a + q, a the block's first, q = it * TPR + t), and every bulk store finds
  the output of exactly the chunks it writes;
- no copy reads outside x's chunks; every agent finishes (no deadlock);
- the row's elements, the neighbours' masked by index, go to exactly one thread each, and
  y's elements are written exactly once (16-byte stores, bulk stores of whole chunks, the
  partial chunks element by element) and nothing outside y;
- the cluster's pairs: every block merges the pairs of the same row from every block.
`row_softmax` is the kernel's arithmetic on one row (block maxima, exponentials against
them, the block sums, the cluster's log-depth merge of (max, sum) pairs, the scale) in
float32; tests/test_ranges_long.py compares it with float64 on masked rows, rows of -inf, a
block's part of only -inf and rows near bf16's largest values.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from ring_model import sample_sizes, span_of  # noqa: E402  (the row's span and sizes, as the ring's model)


class BulkError(AssertionError):
    pass


# ----------------------------------------------------------------------------- the arithmetic


def cut_of(n: int, cl: int, sc: int) -> tuple[int, int]:
    """(P, slots the part's chunks span): row_bulk's P; its pieces a part are SUBMAX, of which
    the ones past the part's chunks are empty."""
    low = n & -n
    nvm = (n + 8 - min(low, 8) + 7) >> 3
    p = (nvm + cl - 1) // cl
    return p, (p + sc - 1) // sc


def part_len(nv: int, a: int, p: int) -> int:
    return max(0, min(nv - a, p))


def max_nv(n: int) -> int:
    """The most chunks a row of n touches, over every row offset (brute force)."""
    return max(span_of(r, n)[2] for r in range(8))


# ----------------------------------------------------------------------------- the protocol


class MBar:
    """An mbarrier: phase, pending arrivals, transaction bytes."""

    def __init__(self, count: int, name: str):
        self.count, self.pending, self.tx, self.phase, self.name = count, count, 0, 0, name

    def arrive(self, c: int = 1) -> None:
        self.pending -= c
        if self.pending < 0:
            raise BulkError(f"{self.name}: more arrivals than its count in phase {self.phase}")
        self._step()

    def expect_arrive(self, tx: int) -> None:  # mbarrier.arrive.expect_tx
        self.tx += tx
        self.arrive(1)

    def complete(self, tx: int) -> None:  # complete_tx of a copy's bytes
        self.tx -= tx
        self._step()

    def _step(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity: int, meant: int) -> bool:
        """try_wait.parity: the phase of that parity completed; `meant` is the phase the
        template means to wait for, which must be the one that completed."""
        if self.phase > meant + 1:  # by parity alone the wait would hang or pass on a later phase
            raise BulkError(f"{self.name}: a wait for phase {meant} came at phase {self.phase} (lapped)")
        if (self.phase & 1) == parity:
            return False
        if self.phase != meant + 1:
            raise BulkError(f"{self.name}: a wait for phase {meant} passed at phase {self.phase}")
        return True


GARBAGE = -(1 << 62)


class Sim:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.events: list = []  # pending asynchronous completions (callables)

    def run(self, agents: list) -> None:
        """agents: generators yielding wait predicates. Runs until all finish."""
        waits = {}
        live = list(agents)
        for a in live:
            waits[a] = lambda: True
        steps = 0
        while live or self.events:
            ready = [a for a in live if waits[a]()]
            choices = len(ready) + len(self.events)
            if not choices:
                raise BulkError(f"deadlock: {len(live)} agents waiting, no copy in flight")
            i = self.rng.randrange(choices)
            if i < len(ready):
                a = ready[i]
                try:
                    waits[a] = next(a)
                except StopIteration:
                    live.remove(a)
                    del waits[a]
            else:
                ev = self.events.pop(i - len(ready))
                ev()
            steps += 1
            if steps > 5_000_000:
                raise BulkError("no progress")


class Barrier:
    """bar.sync among `count` agents (the compute warps' named barrier)."""

    def __init__(self, count: int):
        self.count, self.arrived, self.gen = count, 0, 0

    def sync(self):
        g = self.gen
        self.arrived += 1
        if self.arrived == self.count:
            self.arrived = 0
            self.gen += 1
        return lambda: self.gen != g


def simulate(tpr: int, items: int, cl: int, slot: int, nslot: int, bulk: bool, n: int, m: int, G: int = 2,
             seed: int = 0, broken: frozenset = frozenset(), align: bool = False, lag: bool = False,
             inline: bool = False) -> np.ndarray:
    """Runs clusters 0 ... G - 1 of a persistent grid over m rows of n; returns how many times
    each element of y (its 16-byte chunks' elements) was written. `broken` names mistakes the
    tests make on purpose: "release_early" (the bulk path gives a row's slots back as soon as
    it is read), "parity" (the full wait one phase off), "partial_bulk" (the bulk store takes
    the row's partial last chunk), "no_mask" (the neighbours' elements not masked), "no_spill"
    (ALIGN: the last piece does not carry the shift's spill). `align`: ALIGN = 1, each part's
    stream starting at the 128-byte line of its first chunk (plain stores only). `lag`: LAG = 1
    (a cluster, plain stores, ALIGN = 0): each row's slots read twice, its pairs received and
    its output stored after the next row's first read; "lag_release_early" gives the slots
    back after the first read, "lag_send_early" sends a row's pair with no barrier after the
    block's reads of the row before's pairs. `inline`: INLINE = 1 (plain stores, LAG 0): no producer
    warp; warp 0 issues the ring's first NSLOT pieces, then a row's refill once both block
    barriers followed its reads (a cluster: between its send and its wait); "inline_early"
    issues the refill before the barriers."""
    if inline and (bulk or lag):
        raise BulkError("INLINE takes plain stores and LAG = 0")
    if align and bulk:
        raise BulkError("ALIGN takes plain stores")
    if lag and (bulk or align or cl == 1):
        raise BulkError("LAG takes a cluster, plain stores and ALIGN = 0")
    sc = slot // 16
    if slot % (tpr * 16) or tpr % 32:
        raise BulkError("SLOT must be a whole multiple of the block's chunks")
    nw = tpr // 32
    P, _ = cut_of(n, cl, sc)
    sub = -(-(tpr * items) // sc)  # the template's pieces a part: SUBMAX, empty past the part's chunks
    if P > tpr * items:
        raise BulkError(f"N={n}: a part of {P} chunks exceeds TPR * ITEMS = {tpr * items} (the kernel traps)")
    if nslot < 2 * sub and "small_ring" not in broken:
        raise BulkError(f"NSLOT {nslot} < 2 * SUBMAX {2 * sub}")
    nchunks = (m * n + 7) >> 3
    written = np.zeros(nchunks * 8, np.int64)
    seen_all = np.zeros(m * n, np.int64)
    sim = Sim(seed)
    lanes = np.arange(32)

    for cid in range(G):
        mine = (m - 1 - cid) // G + 1 if cid < m else 0
        # the cluster's blocks
        rings = [np.full((nslot, sc + (8 if align else 0)), GARBAGE, np.int64) for _ in range(cl)]
        full = [[MBar(1, f"block {r} full[{i}]") for i in range(nslot)] for r in range(cl)]
        empty = [[MBar(nw, f"block {r} empty[{i}]") for i in range(nslot)] for r in range(cl)]
        clb = [[MBar(1, f"block {r} clb[{i}]") for i in range(2)] for r in range(cl)]
        clv = [np.full((2, cl), -1, np.int64) for _ in range(cl)]
        bars = [Barrier(nw) for _ in range(cl)]
        # slot positions a warp may still read: (block, slot) -> outstanding readers of the piece
        groups = [[] for _ in range(cl)]  # thread 0's bulk groups: [read?] flags, oldest first

        def bulk_slot(s: int, i: int) -> int:
            return s + i if s + i < nslot else s + i - nslot

        def shift(base: int, a: int, pc: int) -> int:
            """part_shift: chunks the stream starts ahead of the part (ALIGN)."""
            return (base + a) & 7 if align and pc else 0

        def fill(rank: int, nn: int) -> None:
            """bulk_fill: piece nn of the block's stream (row nn // sub's piece nn % sub) into
            slot nn % nslot, its bytes expected on the slot's full mbarrier."""
            a = rank * P
            k, i = divmod(nn, sub)
            base, off, nv = span_of(cid + k * G, n)
            pc = part_len(nv, a, P)
            sh = shift(base, a, pc)
            sl = nn % nslot
            q = sh + pc - i * sc
            most = sc + 8 if align and i == sub - 1 and "no_spill" not in broken else sc
            ln = 0 if q <= 0 else min(q, most)
            full[rank][sl].expect_arrive(ln * 16)
            if ln:
                src = base + a - sh + i * sc + np.arange(ln)
                if src[0] < 0 or src[-1] >= nchunks:
                    raise BulkError(f"a copy from outside x: chunks {src[0]}..{src[-1]} of {nchunks}")
                if ln > rings[rank].shape[1]:
                    raise BulkError(f"a copy of {ln} chunks into a slot of {rings[rank].shape[1]}")
                rings[rank][sl, :ln] = GARBAGE  # in flight: nobody may rely on these bytes

                def land(rank=rank, sl=sl, ln=ln, src=src):
                    rings[rank][sl, :ln] = src + 1  # x's chunk c is held as c + 1
                    full[rank][sl].complete(ln * 16)
                sim.events.append(land)

        def producer(rank: int):
            for nn in range(mine * sub):
                sl = nn % nslot
                if nn >= nslot:
                    e = empty[rank][sl]
                    ph = nn // nslot - 1
                    yield (lambda e=e, ph=ph: e.passed(ph & 1, ph))
                fill(rank, nn)

        def issue(rank: int, n0: int, cnt: int) -> None:
            """INLINE's bulk_issue (warp 0's lanes): pieces n0 ... n0 + cnt - 1 of the rows there are."""
            for nn in range(n0, min(n0 + cnt, mine * sub)):
                fill(rank, nn)

        def wait_full(rank: int, n0: int, s0: int):
            """bulk_wait: every piece of the part from n0 (slot s0) landed."""
            for i in range(sub):
                sl = bulk_slot(s0, i)
                ph = (n0 + i) // nslot
                par = (ph & 1) ^ (1 if "parity" in broken else 0)
                b = full[rank][sl]
                yield (lambda b=b, par=par, ph=ph: b.passed(par, ph) if "parity" not in broken
                       else (b.phase & 1) != par)

        def read(rank: int, w: int, k: int, s0: int, seen: bool) -> list:
            """The warp's chunks of row k's part from its slots (each checked against x); with
            `seen`, the row's elements counted as taken (once a row: LAG reads the part twice)."""
            a, t = rank * P, w * 32 + lanes
            row = cid + k * G
            base, off, nv = span_of(row, n)
            pc = part_len(nv, a, P)
            sh = shift(base, a, pc)
            held = []
            for it in range(items):
                q = it * tpr + t
                on = q < pc
                if align:  # bulk_at: the place in the stream, past the last piece's SC its spill
                    p = q + sh
                    pi = np.minimum(p // sc, sub - 1)
                    sl = np.array([bulk_slot(s0, int(i)) for i in pi])
                    pos = p - pi * sc
                    if np.any(pos >= rings[rank].shape[1]):
                        raise BulkError(f"N={n} row {row}: a read past the slot's {rings[rank].shape[1]} chunks")
                else:
                    sl = np.full(32, bulk_slot(s0, it * tpr // sc))
                    pos = it * tpr % sc + t
                got = rings[rank][sl, pos]
                want = base + a + q + 1
                if np.any(on & (got != want)):
                    bad = int(np.argmax(on & (got != want)))
                    raise BulkError(f"N={n} row {row} block {rank} warp {w}: slot {sl[bad]} position {pos[bad]} "
                                    f"holds {got[bad]}, not x chunk {want[bad] - 1}")
                held.append((it, q[on], sl[on], pos[on]))
                # the row's elements of these chunks, the neighbours' masked by index
                qq = a + q[on]
                e = 8 * qq[:, None] - off + np.arange(8)[None, :]
                inrow = (e >= 0) & (e < n)
                whole = (qq * 8 >= off) & (qq * 8 + 8 <= off + n)
                if np.any(whole != inrow.all(axis=1)):
                    raise BulkError("whole() disagrees with the mask")
                if "no_mask" in broken:
                    inrow = (e >= -8) & (e < n + 8)
                    e = np.clip(e, 0, n - 1)
                if seen:
                    np.add.at(seen_all, row * n + e[inrow], 1)
            return held

        def release(rank: int, s0: int) -> None:
            """bulk_release: this warp is done with the part's slots."""
            for i in range(sub):
                empty[rank][bulk_slot(s0, i)].arrive(1)

        def send(rank: int, w: int, jc: int, row: int, expect: bool) -> None:
            """cluster_send: threads b < CL (warp 0) send the block's pair of `row` to block b;
            `expect`: thread 0's arrive.expect_tx here (cluster_pair), else in recv (LAG)."""
            if w:
                return
            for dst in range(cl):
                def deliver(dst=dst, rank=rank, jc=jc, row=row):
                    clv[dst][jc & 1, rank] = row
                    clb[dst][jc & 1].complete(8)
                sim.events.append(deliver)
            if expect:
                clb[rank][jc & 1].expect_arrive(cl * 8)

        def recv(rank: int, w: int, jc: int, row: int, expect: bool):
            """cluster_recv: the CL pairs of reduction jc arrived, all of `row`."""
            if expect and w == 0:
                clb[rank][jc & 1].expect_arrive(cl * 8)
            cb = clb[rank][jc & 1]
            yield (lambda cb=cb, jc=jc: cb.passed((jc >> 1) & 1, jc >> 1))
            if np.any(clv[rank][jc & 1] != row):
                raise BulkError(f"row {row} block {rank}: merged the pairs of rows {clv[rank][jc & 1]}")

        def output(rank: int, k: int, held: list) -> None:
            """The row's plain and partial stores (STORE bulk: its whole chunks put back into
            their slots for the bulk store)."""
            a = rank * P
            base, off, nv = span_of(cid + k * G, n)
            for it, q, sl, pos in held:
                qq = a + q
                whole = (qq * 8 >= off) & (qq * 8 + 8 <= off + n)
                e = 8 * qq[:, None] - off + np.arange(8)[None, :]
                inrow = (e >= 0) & (e < n)
                ge = (base + qq)[:, None] * 8 + np.arange(8)[None, :]
                np.add.at(written, ge[~whole[:, None] & inrow], 1)  # store_part
                if bulk:
                    rings[rank][sl[whole], pos[whole]] = -(base + qq[whole] + 1)  # y's chunk c as -(c + 1)
                else:
                    np.add.at(written, ge[whole].ravel(), 1)

        def warp_lag(rank: int, w: int):
            """LAG: row k's pairs received, and row k's output stored, only after row k + 1's
            first read of its slots and block max; its second read computes the exponentials."""
            n0 = s0 = 0
            held = []
            for k in range(mine + 1):
                if k < mine:
                    yield from wait_full(rank, n0, s0)
                    read(rank, w, k, s0, seen=False)  # the block max, straight from the slots
                    if "lag_release_early" in broken:
                        release(rank, s0)
                    yield bars[rank].sync()
                if k > 0:
                    yield from recv(rank, w, k - 1, cid + (k - 1) * G, expect=True)
                    output(rank, k - 1, held)
                if k == mine:
                    break
                held = read(rank, w, k, s0, seen=True)  # the exponentials, held
                if "lag_release_early" not in broken:
                    release(rank, s0)
                if "lag_send_early" not in broken:
                    yield bars[rank].sync()
                send(rank, w, k, cid + k * G, expect=False)
                n0 += sub
                s0 = bulk_slot(s0, sub)

        def warp(rank: int, w: int):
            if lag:
                yield from warp_lag(rank, w)
                return
            a = rank * P
            n0 = s0 = 0
            pend = -1
            jc = 0
            if inline and w == 0:
                issue(rank, 0, nslot)  # the ring's first pieces
            for k in range(mine):
                row = cid + k * G
                base, off, nv = span_of(row, n)
                pc = part_len(nv, a, P)
                yield from wait_full(rank, n0, s0)
                held = read(rank, w, k, s0, seen=True)
                if inline:
                    if "inline_early" in broken and w == 0:
                        issue(rank, n0 + nslot, sub)  # before the barriers: a slow warp may still read
                elif not bulk or "release_early" in broken:
                    release(rank, s0)
                # block_reduce twice: two named barriers
                yield bars[rank].sync()
                yield bars[rank].sync()
                refill = inline and w == 0 and "inline_early" not in broken
                if cl > 1:
                    send(rank, w, jc, row, expect=True)
                    if refill:
                        issue(rank, n0 + nslot, sub)  # cluster_pair's hook: between the send and the wait
                    yield from recv(rank, w, jc, row, expect=False)
                    jc += 1
                elif refill:
                    issue(rank, n0 + nslot, sub)
                output(rank, k, held)
                if bulk:
                    yield bars[rank].sync()
                    if w == 0:
                        w0 = 1 if off else 0
                        w1 = nv - 1 if (off + n) & 7 else nv
                        if "partial_bulk" in broken:
                            w1 = nv
                        copies = []
                        for i in range(sub):
                            b0 = a + i * sc
                            e0 = a + min(pc, (i + 1) * sc)
                            lo, hi = max(b0, w0), min(e0, w1)
                            if hi > lo:
                                copies.append((bulk_slot(s0, i), lo - b0, lo, hi))
                        grp = {"read": False}
                        groups[rank].append(grp)

                        def store_read(rank=rank, copies=copies, grp=grp, base=base, row=row):
                            for sl, p0, lo, hi in copies:
                                got = rings[rank][sl, p0:p0 + hi - lo]
                                if np.any(got != -(base + np.arange(lo, hi) + 1)):
                                    raise BulkError(f"N={n} row {row} block {rank}: the bulk store of slot {sl} "
                                                    f"read something other than the row's output")
                                ge = (base + np.arange(lo, hi))[:, None] * 8 + np.arange(8)[None, :]
                                np.add.at(written, ge.ravel(), 1)
                            grp["read"] = True
                        sim.events.append(store_read)
                        # cp.async.bulk.wait_group.read 1: every group but the newest has read
                        yield (lambda rank=rank: all(g["read"] for g in groups[rank][:-1]))
                        if pend >= 0 and "release_early" not in broken:
                            for i in range(sub):
                                empty[rank][bulk_slot(pend, i)].arrive(nw)
                    pend = s0
                n0 += sub
                s0 = bulk_slot(s0, sub)
            if bulk and w == 0:
                yield (lambda rank=rank: all(g["read"] for g in groups[rank]))

        agents = []
        for rank in range(cl):
            if not inline:
                agents.append(producer(rank))
            agents += [warp(rank, w) for w in range(nw)]
        sim.run(agents)
    if np.any(seen_all != 1):
        bad = int(np.argmax(seen_all != 1))
        raise BulkError(f"N={n}: x element {bad} (row {bad // n}) seen {seen_all[bad]} times")
    return written


def check(tpr: int, items: int, cl: int, slot: int, nslot: int, bulk: bool, n: int, m: int, G: int = 2,
          seed: int = 0, broken: frozenset = frozenset(), align: bool = False, lag: bool = False,
          inline: bool = False) -> None:
    w = simulate(tpr, items, cl, slot, nslot, bulk, n, m, G, seed, broken, align, lag, inline)
    if np.any(w[: m * n] != 1) or np.any(w[m * n:] != 0):
        bad = int(np.argmax(w[: m * n] != 1)) if np.any(w[: m * n] != 1) else m * n
        raise BulkError(f"TPR={tpr} ITEMS={items} CL={cl} N={n} M={m}: y written {w[: m * n].min()}.."
                        f"{w[: m * n].max()} times (element {bad}), {int(w[m * n:].sum())} past it")


def check_fit(tpr: int, items: int, cl: int, served: np.ndarray) -> None:
    """Every served N (array): the launch's cut fits (P <= TPR * ITEMS: the kernel would trap)
    and covers every row's chunks at every offset within a chunk (CL * P >= nv)."""
    served = served.astype(np.int64)
    low = served & -served
    nvm = (served + 8 - np.minimum(low, 8) + 7) >> 3
    p = (nvm + cl - 1) // cl
    bad = served[p > tpr * items]
    if bad.size:
        raise BulkError(f"TPR={tpr} ITEMS={items} CL={cl}: N={int(bad[0])} cuts parts of {int(p.max())} chunks")
    for r in range(8):  # every offset a row of n can start at, within a chunk
        nv = (((r * served) & 7) + served + 7) >> 3
        short = served[nv > cl * p]
        if short.size:
            raise BulkError(f"N={int(short[0])}: a row at offset {r} touches more chunks than the cut covers")


# ----------------------------------------------------------------------------- the arithmetic of a row

L2E = np.float32(1.4426950408889634)


def _f32(x):
    return np.float32(x)


def _ex(v: np.ndarray, m: np.float32) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.exp2(((v - m).astype(np.float32) * L2E).astype(np.float32)).astype(np.float32)


FUSE_MAX = 256.0  # softmax_rt.cu.j2's: below it the exponent is one FFMA (FUSE)


def _ex_fused(v: np.ndarray, m) -> np.ndarray:
    """FUSE's exponentials: 2^fma(v, log2 e, -m * log2 e), the product m * log2 e rounded once to
    float32 and the FMA rounded once (the exact product of two floats fits a double), where
    |m| < FUSE_MAX; elsewhere `_ex`'s two steps. `m` a scalar or one a value of v."""
    m = np.broadcast_to(np.asarray(m, np.float32), v.shape)
    ml = (m * L2E).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        t = (v.astype(np.float64) * np.float64(L2E) - ml.astype(np.float64)).astype(np.float32)
        fused = np.exp2(t).astype(np.float32)
        plain = np.exp2(((v - m).astype(np.float32) * L2E).astype(np.float32)).astype(np.float32)
    return np.where(np.abs(m) < FUSE_MAX, fused, plain).astype(np.float32)


def _merge(m, s, m2, s2):
    """common/row_reduce.cuh.j2's merge, in float32."""
    first = m >= m2
    big, small = (s, s2) if first else (s2, s)
    d = _f32(0) if m == m2 else _f32(abs(_f32(m - m2)))
    with np.errstate(invalid="ignore", over="ignore"):
        s = _f32(_f32(small * np.exp2(_f32(-d * L2E))) + big)
    return _f32(max(m, m2)) if not (np.isnan(m) or np.isnan(m2)) else _f32(np.fmax(m, m2)), s


def _pairs(mt: np.ndarray, st: np.ndarray) -> tuple:
    """(max, sum) of the threads' pairs, merged as a log-depth tree (the block's shuffles and its
    warps' slots: the same merges, another order)."""
    cur = list(zip(mt, st))
    while len(cur) > 1:
        cur = [_merge(*cur[i], *cur[i + 1]) if i + 1 < len(cur) else cur[i] for i in range(0, len(cur), 2)]
    return cur[0]


def row_softmax(x: np.ndarray, cl: int, tpr: int, items: int, slot: int = 8192, row: int = 0,
                online: bool = False, fuse: bool = False) -> np.ndarray:
    """The PF = 3 kernel's output for one row x (float32 values of bf16), as the row at index
    `row` of a tensor of rows of len(x) (its offset within a chunk), cut as the launch cuts it.
    The sums add in a different order from the kernel's (rounding only). online: ONLINE 1, each
    thread's exponentials against its own max (thread t holds the part's chunks t, t + TPR, ...),
    the block's pair merged from the threads' pairs, the scale exp(thread max - row max) / sum.
    fuse: FUSE 1, the exponent as one FMA where the max it is taken against is below FUSE_MAX."""
    ex = _ex_fused if fuse else _ex
    n = len(x)
    base, off, nv = span_of(row, n)
    P, _ = cut_of(n, cl, slot // 16)
    padded = np.full(nv * 8, -np.inf, np.float32)
    padded[off:off + n] = x
    pairs, parts = [], []
    for rank in range(cl):
        a = rank * P
        pc = part_len(nv, a, P)
        v = padded[a * 8:(a + pc) * 8]
        if online:  # the thread of each element (chunk q of the part: thread q % TPR)
            t = (np.arange(v.size) // 8) % tpr
            mt = np.full(tpr, -np.inf, np.float32)
            np.fmax.at(mt, t, v)
            mtl = np.where(mt == -np.inf, np.float32(0), mt).astype(np.float32)
            e = ex(v, mtl[t])
            st = np.zeros(tpr, np.float32)
            np.add.at(st, t, e)
            pairs.append(_pairs(mt, st))
            parts.append((mt[t], e))
            continue
        mb = _f32(v.max()) if v.size else _f32(-np.inf)
        mbl = _f32(0) if mb == -np.inf else mb
        e = ex(v, mbl)
        pairs.append((mb, _f32(e.sum(dtype=np.float32))))
        parts.append((mb, e))
    # the cluster's log-depth merge (combine<RPAIR, CL>): lane l brings pair l % CL
    cur = list(pairs)
    o = cl // 2
    while o:
        cur = [_merge(*cur[i], *cur[i ^ o]) for i in range(cl)]
        o //= 2
    m, s = cur[0]
    out = []
    for mb, e in parts:
        if m == -np.inf:
            f = _f32(np.nan)
        elif online:  # a scale an element (its thread's)
            with np.errstate(invalid="ignore", over="ignore"):
                f = np.where(mb == -np.inf, np.float32(0),
                             (np.exp2(((mb - m).astype(np.float32) * L2E).astype(np.float32)) / s)).astype(np.float32)
        elif cl > 1:
            f = _f32(0) if mb == -np.inf else _f32(np.exp2(_f32((mb - m) * L2E)) / s)
        else:
            f = _f32(_f32(1) / s)
        with np.errstate(invalid="ignore"):
            out.append((e * f).astype(np.float32))
    y = np.concatenate(out) if out else np.zeros(0, np.float32)
    return y[off:off + n]


# ----------------------------------------------------------------------------- the spec


def bulk_geometries(op: str = "softmax"):
    """(Range, cfg, TPR, ITEMS, CL, SLOT, NSLOT, bulk, CAP) for every PF = 3 configuration of
    the op's range spec (softmax or rmsnorm: the same ring, the same stores)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
    from range_check import SPECS, Range

    r = Range(op, ROOT / SPECS[op])
    out = []
    for cfg in r.configs:
        if cfg.get("PF") != 3:
            continue
        env = r.env(cfg, {"M": 1, r.sym: r.lo})
        out.append((r, cfg, cfg["TPR"], cfg["ITEMS"], cfg["CL"], int(env["SLOT"]), int(env["NSLOT"]),
                    cfg["STORE"] == "bulk", int(env["CAP"])))
    return out


def takes_lag(cfg: dict) -> bool:
    """A PF = 3 configuration the template lets take LAG = 1: a cluster, stores not from the
    slots, the part's stream from its first chunk (ALIGN = 0), every exponential `exp2f`'s (no
    EXPOLY, ONLINE or FUSE: the template refuses each beside LAG), the chunks' tests a chunk at a
    time (no HOIST, which only the unlagged path takes), a producer warp (no INLINE)."""
    return (cfg.get("PF") == 3 and cfg["CL"] > 1 and cfg["STORE"] != "bulk" and not cfg.get("ALIGN")
            and not cfg.get("EXPOLY") and not cfg.get("ONLINE") and not cfg.get("FUSE") and not cfg.get("HOIST")
            and not cfg.get("INLINE"))


def with_lag(cfgs: list[dict]) -> list[dict]:
    """The configurations that may take LAG = 1, with it: the template's, out of the range specs'
    spaces since session 53 (an H100 measured it slower)."""
    return [dict(c, LAG=1) for c in cfgs if takes_lag(c)]


def lagged(geos: list) -> list:
    """bulk_geometries' entries that may take LAG = 1, with it."""
    return [(g[0], dict(g[1], LAG=1)) + tuple(g[2:]) for g in geos if takes_lag(g[1])]


def takes_inline(cfg: dict) -> bool:
    """A PF = 3 configuration the template lets take INLINE = 1 (no producer warp): the unlagged
    path with plain or streaming stores."""
    return cfg.get("PF") == 3 and not cfg.get("LAG") and cfg["STORE"] != "bulk"


def inlined(geos: list) -> list:
    """bulk_geometries' entries that may take INLINE = 1, with it (those not already with it, and
    not already in `geos` with it: the spaces hold INLINE 1 where it measured faster)."""
    have = {tuple(sorted(g[1].items())) for g in geos}
    out = [(g[0], dict(g[1], INLINE=1)) + tuple(g[2:]) for g in geos if takes_inline(g[1]) and not g[1].get("INLINE")]
    return [g for g in out if tuple(sorted(g[1].items())) not in have]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", action="store_true", help="also check the fit of every N of each bucket")
    ap.add_argument("--sizes", type=int, default=2, help="random sizes a geometry (and as many odd ones)")
    ap.add_argument("--op", default="softmax", choices=("softmax", "rmsnorm"))
    a = ap.parse_args()
    rng = random.Random(0)
    fails = 0
    for r, cfg, tpr, items, cl, slot, nslot, bulk, cap in bulk_geometries(a.op):
        ns = sample_sizes(r, cfg, cap, rng, a.sizes)
        try:
            for n in ns:
                P, sub = cut_of(n, cl, slot // 16)
                rows = 2 * (nslot // max(sub, 1) + 2) + 1  # the ring wraps twice in a cluster
                for m in (1, rows):
                    check(tpr, items, cl, slot, nslot, bulk, n, m, G=2, seed=n + m, align=cfg.get("ALIGN") == 1,
                          lag=cfg.get("LAG") == 1, inline=cfg.get("INLINE") == 1)
            if a.every:
                lo, hi = max(r.lo, cap // 4 + 1), min(r.hi, cap)
                ns_all = np.arange(lo, hi + 1, dtype=np.int64)
                nv = (ns_all + 8 - np.minimum(8, ns_all & -ns_all) + 7) // 8
                check_fit(tpr, items, cl, ns_all[(nv <= cap // 8) & (4 * ns_all > cap)])
            print(f"ok   TPR={tpr} ITEMS={items} CL={cl} STORE={cfg['STORE']} ALIGN={cfg.get('ALIGN', 0)} "
                  f"LAG={cfg.get('LAG', 0)} INLINE={cfg.get('INLINE', 0)} (CAP {cap}, NSLOT {nslot}): N {ns}")
        except BulkError as e:
            fails += 1
            print(f"FAIL TPR={tpr} ITEMS={items} CL={cl} STORE={cfg['STORE']} LAG={cfg.get('LAG', 0)}: {e}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
