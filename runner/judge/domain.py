"""Shapes drawn in secret from an op's domain (op.domain), for verification.

A configuration that takes its sizes at run time must be right at every size it
serves, not only at the tuning points. Every trial is verified on a few shapes
drawn after its build from a seed the runner draws then (and records): the
edges of what the configuration serves, found by bisection, odd sizes, primes,
powers of two and their neighbours, and random points, log-uniform. The
non-axis symbols (`tune` ones, the rows) are drawn small, where bugs in the
edges of a grid live and verification is cheap, or, in about half the shapes,
across all that the op serves (`wide_rows`: above 64, next to the tuning
value, at the top, log-uniform up to the symbol's max or its cap, op.row_cap),
since a kernel may serve its few rows right and its many rows wrong. Every
shape satisfies op.domain_where (sizes outside it are outside the domain).
"""

from __future__ import annotations

import math
import random

DRAWS = 4  # shapes per trial
WIDE = 0.5  # of the drawn shapes, those whose rows are drawn across what the op serves (wide_rows)
SMALL = 63  # few rows: from a non-axis symbol's min to min + SMALL


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    r = int(math.isqrt(n))
    return all(n % f for f in range(3, r + 1, 2))


def _next_prime(n: int) -> int:
    while not _is_prime(n):
        n += 1
    return n


# Sizes users call, which a kernel could be wrong at alone: the hidden, FFN, head and vocabulary
# sizes and context lengths of common models (powers of two are drawn anyway). Session 55's red
# team had a kernel wrong only at 768, 1536, ..., 14336 listed by `pipe compare`: a trial's
# draws met those sizes 0.3% of the time, the table's sweep 7.7%.
COMMON = (
    768, 896, 1280, 1536, 1600, 2304, 2560, 2816, 3072, 3584, 4608, 5120, 6144, 7168, 9216, 10240,
    11008, 12288, 13696, 13824, 14336, 18432, 18944, 20480, 24576, 27648, 28672, 29568, 53248,
    1408, 1792, 4864, 8960,  # MoE experts' and small models' FFN sizes
    32000, 32064, 32256, 49152, 50257, 50304, 51200, 64000, 92416, 100352, 102400, 128000,
    128256, 129280, 151643, 151936, 152064, 163840, 200064, 201088, 256000, 256206,  # vocabularies
    1000, 2000, 4000, 8000, 10000, 100000, 96, 160, 192, 320, 384, 640,  # round counts; head dims
)


def round_sizes(lo: int, hi: int, rng: random.Random, k: int, met=()) -> list[int]:
    """Up to k sizes users call in [lo, hi], none of `met`: the COMMON ones there (a random
    choice of k where more), then random multiples of 64, 128 or 256 (log-uniform), the padded
    widths of real tensors."""
    out = [v for v in COMMON if lo <= v <= hi and v not in met]
    rng.shuffle(out)
    for _ in range(4 * k):
        if len(out) >= k:
            break
        step = rng.choice((64, 128, 256))
        v = int(round(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(max(hi, 1)))) / step)) * step
        if lo <= v <= hi and v not in out and v not in met:
            out.append(v)
    return out[:k]


def axis_candidates(lo: int, hi: int, rng: random.Random, k: int = 96) -> list[int]:
    """Values of one axis worth testing: the ends, powers of two and their neighbours, sizes
    users call (COMMON and multiples of 64, 128 or 256: round_sizes), and random log-uniform
    values (some made odd, some prime)."""
    out = {lo, hi}
    p = 1
    while p <= hi:
        out.update(v for v in (p - 1, p, p + 1) if lo <= v <= hi)
        p *= 2
    out.update(round_sizes(lo, hi, rng, k // 3))
    for _ in range(k):
        v = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        kind = rng.random()
        if kind < 0.3:
            v |= 1
        elif kind < 0.45:
            v = _next_prime(v)
        if lo <= v <= hi:
            out.add(v)
    return sorted(out)


def _edge(ok, a: int, b: int) -> int:
    """The last value from a (ok) towards b (not ok) that is still ok, by bisection."""
    while abs(b - a) > 1:
        mid = (a + b) // 2
        if ok(mid):
            a = mid
        else:
            b = mid
    return a


def small_rows(op, s: str, rng: random.Random) -> int:
    """A non-axis size (the rows) among the few: its min, or up to SMALL above it."""
    d = op.domain[s]
    hi = d.min + SMALL if d.max is None else min(d.max, d.min + SMALL)
    return rng.choice([d.min, rng.randint(d.min, hi)])


def wide_rows(op, shape: dict, rng: random.Random) -> dict:
    """`shape` with its non-axis sizes (the rows) drawn across all that the op serves at its
    axis values, up to the symbol's max or, with none, its cap (op.row_cap: ROWS_CAP times the
    tuning value; the table and the exported op serve no further): just above the few, next to
    the tuning value, at the top, or log-uniform, half of those odd. A kernel that serves its
    few rows and its tuning rows right and the rest wrong (a grid-stride loop that stops early,
    a path for M > 64, an index that overflows near the top) was verified nowhere before session
    38's red teams showed two shipped by `pipe compare`: one wrong above 64 rows while the rows
    were drawn up to 64, one wrong above twice the tuning rows while they were drawn up to
    there."""
    tuned = op.point({a: shape[a] for a in op.axes if a in shape})
    out = dict(shape)
    for s in op.symbols:
        d = op.domain.get(s)
        if d is None or s in op.axes:
            continue
        t = max(d.min, int(tuned[s]))
        hi = d.max if d.max is not None else op.row_cap(s, shape)
        lo = min(hi, d.min + SMALL + 1)
        kind = rng.random()
        if kind < 0.2:
            v = rng.randint(lo, min(hi, lo + SMALL))
        elif kind < 0.4:
            v = t + rng.choice([-3, -2, -1, 1, 2, 3])
        elif kind < 0.55:
            v = hi - rng.randint(0, 3)
        else:
            v = int(round(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(max(hi, 1))))))
            if rng.random() < 0.5:
                v |= 1
        out[s] = max(d.min, min(hi, v))
    return out


def widened(op, shape: dict, rng: random.Random, serves, taken: list[dict]) -> dict:
    """About WIDE of the time, `shape` with its rows drawn across what the op serves (wide_rows),
    where that shape is served, holds op.domain_where and is not taken yet; else `shape`."""
    if rng.random() < WIDE:
        wide = wide_rows(op, shape, rng)
        if wide not in taken and op.where_holds(wide) and serves(wide):
            return wide
    return shape


def draws(op, serves, seed: int, n: int = DRAWS) -> list[dict]:
    """Up to n distinct shapes of the domain that `serves(shape)` accepts, drawn from `seed`.
    With op.domain_where, only shapes where it holds: the edges found by bisection are then
    those of what is served inside the constraint (B * L <= C: the longest L served at a B)."""
    if op.domain_where is not None:
        served = serves

        def serves(shape: dict) -> bool:
            return op.where_holds(shape) and bool(served(shape))

    rng = random.Random(seed)
    symbols = op.symbols
    axes = op.axes
    out: list[dict] = []

    def complete(env: dict) -> dict:
        shape = {}
        for s in symbols:
            d = op.domain[s]
            if s in env:
                shape[s] = env[s]
            else:  # a non-axis size (the rows): small, from its min (wide_rows below)
                shape[s] = small_rows(op, s, rng)
        return shape

    # each axis in turn (the others random): the edges of what is served, then random picks
    for attempt in range(4 * n):
        a = axes[attempt % len(axes)]
        d = op.domain[a]
        base = {x: int(round(math.exp(rng.uniform(math.log(op.domain[x].min), math.log(op.domain[x].max)))))
                for x in axes if x != a}
        fixed = complete(base)

        def ok(v: int, fixed=fixed, a=a) -> bool:
            return bool(serves({**fixed, a: v}))

        cands = axis_candidates(d.min, d.max, rng)
        good = [v for v in cands if ok(v)]
        if not good:
            continue
        picks = []
        if attempt < 2 * len(axes):  # the served set's ends, exactly
            lo_i = cands.index(good[0])
            hi_i = cands.index(good[-1])
            lo = good[0] if lo_i == 0 else _edge(ok, good[0], cands[lo_i - 1])
            hi = good[-1] if hi_i == len(cands) - 1 else _edge(ok, good[-1], cands[hi_i + 1])
            picks = [hi, lo] if attempt % 2 == 0 else [lo, hi]
        picks.append(rng.choice(good))
        for v in picks:
            shape = widened(op, {**fixed, a: v}, rng, serves, out)
            if shape not in out and serves(shape):
                out.append(shape)
            if len(out) >= n:
                return out
    return out


SWEEP = 48  # shapes a kernel is verified at over each range a dispatch table lists it for
RUN = 16  # consecutive sizes at each end of a range: a tail's every residue up to RUN once
LARGE = 2  # of them at the tuning value of the other sizes (the rows), the rest with few


def sweep(op, serves, box: dict, seed: int, n: int = SWEEP) -> list[dict]:
    """Up to n distinct shapes inside `box` (axis -> inclusive (lo, hi)) that `serves` accepts
    and op.domain_where holds at: the sizes a dispatch table's kernel is verified at over a
    range it is listed for, beyond the few its trial was verified at. Every size of the box
    where it holds no more than n; else, axis by axis (the others random inside the box), the
    box's ends and the ends of what is served in it, the RUN sizes at each end (a tail's every
    residue up to RUN), powers of two and their neighbours, then random log-uniform sizes (some
    odd, some prime), and beyond n a quarter of the axis's share more (2 at least) of the sizes
    users call (round_sizes: COMMON ones, then multiples of 64, 128 or 256). The other symbols
    are small (few rows: where the edges of a grid are and verification is cheap) or, in about
    half the shapes, across what the op serves (`wide_rows`), and LARGE shapes are at their
    tuning value."""
    rng = random.Random(seed)
    axes = [a for a in op.axes if a in box]
    out: list[dict] = []
    missed: list[dict] = []  # axis values whose few-rows shape it does not serve
    extras = 0  # shapes of sizes users call, beyond the quota n

    def add(env: dict, large: bool = False, extra: bool = False) -> None:
        shape = op.point(env) if large else {}
        for s in op.symbols:
            if s in env:
                shape[s] = env[s]
            elif not large:
                shape[s] = small_rows(op, s, rng)
        if not large:
            shape = widened(op, shape, rng, serves, out)
        if shape in out or not (len(out) - extras < n or large or extra):
            return
        if op.where_holds(shape) and serves(shape):
            out.append(shape)
        elif not large:
            missed.append(env)

    sizes = math.prod(box[a][1] - box[a][0] + 1 for a in axes)
    if sizes <= n:  # the whole box
        envs = [{}]
        for a in axes:
            envs = [{**e, a: v} for e in envs for v in range(box[a][0], box[a][1] + 1)]
        for e in envs:
            add(e)
    else:
        def at_random(a: str) -> dict:
            env = {}
            for x in axes:
                if x != a:
                    lo, hi = box[x]
                    env[x] = min(hi, max(lo, int(round(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(hi)))))))
            return env

        per = max(1, (n - LARGE) // len(axes))
        for a in axes:
            lo, hi = box[a]
            fixed = at_random(a)

            def ok(v: int, fixed=fixed, a=a) -> bool:
                sh = {**fixed, a: v}
                for s in op.symbols:
                    sh.setdefault(s, op.domain[s].min)
                return op.where_holds(sh) and bool(serves(sh))

            good = [v for v in (lo, (lo + hi) // 2, hi) if ok(v)]
            slo, shi = lo, hi  # the ends of what is served in the box, by bisection
            if good and not ok(lo):
                slo = _edge(ok, good[0], lo)
            if good and not ok(hi):
                shi = _edge(ok, good[-1], hi)
            # the ends and the sizes next to them at the other axes' values the ends were found
            # at (where one axis's served edge moves with another's: B * L <= C); the rest anywhere
            edges = [slo, shi] + [v for k in range(1, RUN) for v in (shi - k, slo + k)] + [lo, hi]
            more = [v for v in axis_candidates(max(slo, 1), shi, rng, k=4 * per) if v not in edges]
            rng.shuffle(more)  # those the quota leaves room for, from all over the served part
            start = len(out)
            for i, v in enumerate(edges + more):
                if len(out) - start >= per:
                    break
                if lo <= v <= hi:
                    add({**(fixed if i < len(edges) else at_random(a)), a: v})
            # and, beyond the quota (counted apart: the next axis keeps its share), a quarter of
            # it more (2 at least) of the sizes users call not met yet (round_sizes)
            for v in round_sizes(max(slo, 1), shi, rng, max(2, per // 4), met={sh[a] for sh in out}):
                before = len(out)
                add({**at_random(a), a: v}, extra=True)
                extras += len(out) - before
    # the rows at their tuning value (a grid of many blocks), at axis values found served above,
    # else where few rows were not served (a kernel that serves many rows only)
    envs = list({tuple((a, sh[a]) for a in axes): None for sh in out}) or \
        list({tuple((a, e[a]) for a in axes): None for e in missed})
    for env in rng.sample(envs, min(LARGE, len(envs))):
        add(dict(env), large=True)
    return out
