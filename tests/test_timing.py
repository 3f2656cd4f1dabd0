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
    assert checks == [min(len(times) - 1, int(0.5 * len(times))) + 1]  # checked right after that call
