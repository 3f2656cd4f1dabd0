"""Timing statistics and the bench loop, with a fake clock-free workload."""

import pytest

from runner.judge.timing import bench, stats


def test_stats_median_and_spread():
    s = stats([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.n == 5 and s.min == 1.0
    assert s.spread == pytest.approx((4.0 - 2.0) / 3.0)  # IQR over median: the outlier does not move it
    assert stats([2.0, 2.0]).spread == 0.0


def test_bench_runs_hooks_and_checks_one_call():
    calls, befores, checks = [], [], []
    fake = iter(range(1, 10_000))

    def timer(call, sync):
        call()
        return next(fake) * 1e-6

    times = bench(lambda: calls.append(1), lambda: None, warmup_ms=0.0, rep_ms=0.05, before=lambda: befores.append(1),
                  timer=timer, min_reps=7, max_reps=50, checks=[(0.5, lambda: checks.append(len(befores)))])
    assert len(times) >= 7
    assert len(befores) == len(times)  # one hook per timed call, none for the warm-up
    assert len(calls) == len(times) + 2  # two warm-up calls at least
    # checked right after one call past the probe (3 calls), at half of the rest
    assert checks == [3 + min(len(times) - 4, int(0.5 * (len(times) - 3))) + 1]


def test_bench_budget_counts_the_whole_repetition():
    """rep_ms bounds the timed loop's wall time, hooks included: a 2 ms hook ahead of a
    call that takes no time gives about rep_ms / 2 ms repetitions, not max_reps."""
    import time

    times = bench(lambda: None, lambda: None, warmup_ms=0.0, rep_ms=40.0, before=lambda: time.sleep(0.002),
                  min_reps=5, max_reps=2000)
    assert 5 <= len(times) <= 25  # the budget, not 2000 repetitions of 2 ms


def test_bench_checks_when_the_probe_is_all_there_is():
    seen = []
    times = bench(lambda: None, lambda: None, warmup_ms=0.0, rep_ms=1e-9, min_reps=3,
                  before=lambda: seen.append("call"), checks=[(0.9, lambda: seen.append("check"))])
    assert len(times) == 3 and seen == ["call", "call", "call", "check"]


def test_bench_warmup_waits_for_the_device_not_the_launches():
    """A launch returns at once and its kernel runs later (here 1 ms of device time a call,
    paid at the next synchronisation): the warm-up must stop near its budget of device time,
    not queue a budget's worth of launches (thousands of calls) and then wait for them."""
    import time

    pending, launched, deepest = [0.0], [0], [0.0]

    def call():
        launched[0] += 1
        pending[0] += 1e-3

    def sync():
        deepest[0] = max(deepest[0], pending[0])
        time.sleep(pending[0])
        pending[0] = 0.0

    t = time.perf_counter()
    times = bench(call, sync, warmup_ms=10.0, rep_ms=20.0, min_reps=5, max_reps=100)
    wall = time.perf_counter() - t
    warm = launched[0] - len(times)
    assert 2 <= warm <= 12  # about 10 ms of 1 ms calls
    # no sync ever found more than one call queued: each was waited for on its own (the old
    # warm-up queued about a thousand); the wall bound only catches gross regressions
    assert deepest[0] <= 1e-3 + 1e-12 and all(x >= 1e-3 for x in times)
    assert wall < 2.0
