"""Timing: warm up, repeat to a wall-clock budget, median and spread.

`bench` times each call on its own with the backend's timer (wall clock on
the CPU, events on a GPU), after a hook that runs outside the timed region
(fresh input values, a cache flush), so one slow call cannot hide in an
average. One repetition chosen at random is checked right after it runs: the
timed calls are the same code path as the checked ones.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..build.backends import wall_timer


@dataclass(frozen=True)
class Stats:
    median: float  # seconds
    spread: float  # interquartile range over the median
    n: int
    min: float

    def as_dict(self) -> dict:
        return {"median": self.median, "spread": self.spread, "n": self.n, "min": self.min}


def stats(times: Sequence[float]) -> Stats:
    ts = sorted(times)
    med = statistics.median(ts)
    if len(ts) >= 4:
        q = statistics.quantiles(ts, n=4, method="inclusive")
        spread = (q[2] - q[0]) / med if med > 0 else 0.0
    else:
        spread = (ts[-1] - ts[0]) / med if med > 0 else 0.0
    return Stats(med, spread, len(ts), ts[0])


def bench(call: Callable[[], None], sync: Callable[[], None], warmup_ms: float, rep_ms: float,
          before: Callable[[], None] | None = None, timer=wall_timer,
          min_reps: int = 5, max_reps: int = 2000,
          checks: Sequence[tuple[float, Callable[[], None]]] = (), probe: int = 3,
          after: Callable[[], None] | None = None,
          plan: Callable[[int, int], None] | None = None,
          guard: Callable[[], None] | None = None) -> list[float]:
    """Per-call times in seconds.

    `before` runs ahead of every timed call, outside the timed region (new input
    values, a cache flush). Each of `checks` = (u in [0, 1), fn): fn runs right
    after the timed call at that fraction of the repetitions, to check its output.

    `rep_ms` is the wall-clock budget of the timed loop, hooks and host overhead
    included. `after` runs right after every timed call, outside the timed region (the
    judge samples each call's output there); `plan(reps, probe)` is told how many timed
    calls there will be once the probe has run (the judge salts the last one's inputs).
    `guard` runs right after every call, warm-up ones included, before anything else
    (the judge's thread census: no thread of the kernel may outlive a call).
    The first `probe` timed calls measure what one repetition costs (the fastest of them; for
    a 150 us kernel behind a 256 MiB input refresh and an L2 flush, about 1 ms, where
    the kernel alone would have suggested 7 times more repetitions than the budget
    holds), and the count follows from it, at least `min_reps`.
    """
    # Warm-up calls wait for the device one by one: a launch returns long before its kernel
    # ends, so a host clock alone would queue the whole warm-up budget's worth of launches
    # (a thousand 150 us kernels for 10 ms) and then wait for all of them.
    sync()
    t0 = time.perf_counter()
    n = 0
    while n < 2 or (time.perf_counter() - t0) * 1e3 < warmup_ms:
        call()
        sync()
        if guard is not None:
            guard()
        n += 1
    times: list[float] = []

    def one() -> None:
        if before is not None:
            before()
        t = timer(call, sync)
        if guard is not None:
            guard()
        times.append(t)
        if after is not None:
            after()

    probe = max(1, min(probe, min_reps))
    walls = []
    for _ in range(probe):
        t1 = time.perf_counter()
        one()
        walls.append(time.perf_counter() - t1)
    # the fastest probe call: a host that was paused during one (a busy machine) would
    # otherwise cut the timed calls to the minimum, and the checks that need many with them
    per = max(min(walls), 1e-7)
    reps = int(min(max_reps, max(min_reps, rep_ms / 1e3 / per)))
    if plan is not None:
        plan(reps, probe)
    at: dict[int, list] = {}
    for u, fn in checks:  # checked calls come after the probe, at their fraction of the rest
        at.setdefault(probe + min(reps - probe - 1, int(u * (reps - probe))), []).append(fn)
    for fn in at.pop(probe - 1, ()):  # (only when the probe is all there is)
        fn()
    for i in range(probe, reps):
        one()
        for fn in at.get(i, ()):
            fn()
    return times
