"""The judge's clock sampler (runner/judge/clocks.py): summaries of the SM clock and power over a
timed window, and how pipe compare reports a point or shape that ran below full clock."""
import threading
import time

import pytest

from runner.judge import clocks
from runner.ship.compare import _clock_lines
from runner.ship.ranges import clock_notes


def s(mhz, watts=500.0, mask=0, t=0.0):
    return (t, float(mhz), float(watts), mask)


def test_summary_of_a_full_clock_window_is_not_throttled():
    got = clocks.summarize([s(1980), s(1980), s(1965)], 1980)
    assert got["sm_mhz"] == 1980 and got["sm_mhz_low"] == 1965
    assert got["throttled"] is False and got["reasons"] == [] and got["samples"] == 3


def test_summary_below_full_clock_or_with_a_reason_is_throttled():
    low = clocks.summarize([s(1700), s(1750), s(1800)], 1980)
    assert low["throttled"] is True and low["sm_mhz"] == 1750 and low["reasons"] == []
    # the clock at full, but NVML says the power cap held it: throttled, and said why
    capped = clocks.summarize([s(1980, 699, 0x4), s(1980, 640, 0)], 1980)
    assert capped["throttled"] is True and capped["reasons"] == ["power cap"] and capped["power_w_high"] == 699
    # the idle bit (0x1) is no reason a busy clock fell
    assert clocks.summarize([s(1980, 100, 0x1)], 1980)["throttled"] is False
    # without the device's maximum, only a reason marks a window
    assert clocks.summarize([s(1200)], None)["throttled"] is False
    assert clocks.summarize([], 1980) is None


def test_merge_takes_the_median_the_lowest_the_highest_and_every_reason():
    a = clocks.summarize([s(1900, 600, 0x40)], 1980)
    b = clocks.summarize([s(1500, 700, 0x4), s(1600, 690)], 1980)
    c = clocks.summarize([s(1980, 400)], 1980)
    m = clocks.merge([a, None, b, c])
    assert m["sm_mhz"] == 1900 and m["sm_mhz_low"] == 1500 and m["power_w_high"] == 700
    assert m["reasons"] == ["power cap", "hw thermal"]  # NVML's bit order
    assert m["throttled"] is True and m["samples"] == 4
    assert clocks.merge([None, None]) is None
    assert clocks.describe(m) == "1.90 GHz (low 1.50, 700 W, power cap, hw thermal)"
    assert clocks.describe(None) == ""


class SlowingBoard:
    """Stands in for NVML on a machine with no GPU (this one): the SM clock at 1980 MHz until
    `slow` is set, then 1500 MHz under the power cap."""
    NVML_CLOCK_SM = 1

    def __init__(self):
        self.slow = threading.Event()

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1500 if self.slow.is_set() else 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return 700_000 if self.slow.is_set() else 300_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4 if self.slow.is_set() else 0


def test_a_window_holds_only_the_samples_taken_inside_it():
    board = SlowingBoard()
    w = clocks.ClockWatch(handle=None, nvml=board, period_s=0.002)
    w._thread.start()
    try:
        t0 = time.monotonic()
        time.sleep(0.06)
        t1 = time.monotonic()
        board.slow.set()
        time.sleep(0.005)  # a sample may straddle the switch: the slow window starts after it
        t2 = time.monotonic()
        time.sleep(0.06)
        t3 = time.monotonic()
    finally:
        w.stop()
    fast, slow = w.window(t0, t1), w.window(t2, t3)
    assert fast["sm_mhz"] == 1980 and fast["sm_mhz_low"] == 1980 and fast["throttled"] is False
    assert slow["sm_mhz"] == 1500 and slow["power_w_high"] == 700 and slow["reasons"] == ["power cap"]
    assert slow["throttled"] is True and fast["samples"] >= 5 and slow["samples"] >= 5
    whole = w.window(t0, t3)
    assert whole["sm_mhz_low"] == 1500 and whole["samples"] >= fast["samples"] + slow["samples"]


def test_a_window_shorter_than_a_period_gets_the_nearest_sample():
    board = SlowingBoard()
    w = clocks.ClockWatch(handle=None, nvml=board, period_s=0.05)
    w._thread.start()
    try:
        time.sleep(0.02)
        t = time.monotonic()
        got = w.window(t, t + 1e-6)
    finally:
        w.stop()
    assert got is not None and got["samples"] >= 1 and got["sm_mhz"] == 1980


def test_start_without_nvml_gives_no_watch(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_nvml(name, *a, **k):
        if name == "pynvml":
            raise ImportError("no nvidia-ml-py here")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_nvml)
    assert clocks.ClockWatch.start(0) is None


def _row(shape, table_clock=None, best_clock=None):
    arms = {"loop": {"time_s": 1e-3, "error": None, **({"clock": best_clock} if best_clock else {})},
            "torch eager": {"time_s": 2e-3, "error": None}}
    return {"shape": shape, "arms": arms, "best_arm": "loop",
            **({"table_clock": table_clock} if table_clock else {})}


def test_the_curve_names_the_points_that_ran_below_full_clock():
    full = clocks.summarize([s(1980)], 1980)
    capped = clocks.summarize([s(1710, 698, 0x4), s(1410, 700, 0x4)], 1980)
    rows = [_row({"T": 572}, full, full), _row({"T": 4375}, capped, full), _row({"T": 6081}, full, capped),
            _row({"T": 99})]
    lines = clock_notes(rows)
    assert lines[0].startswith("below full clock at 2 of 4 points")
    assert lines[1] == "  4375: table 1.56 GHz (low 1.41, 700 W, power cap); loop 1.98 GHz (low 1.98, 500 W)"
    assert lines[2].startswith("  6081: table 1.98 GHz") and "loop 1.56 GHz" in lines[2]
    assert clock_notes([_row({"T": 572}, full, full)]) == []


def test_the_named_shapes_table_names_the_shapes_that_ran_below_full_clock():
    full = clocks.summarize([s(1980)], 1980)
    capped = clocks.summarize([s(1700, 699, 0x4)], 1980)
    shapes = [{"label": "T=4096", "tuned": {"trial": 51}, "candidates": {"51": {"clock": capped}},
               "arms": {"torch eager": {"clock": full}, "loop": {"error": "unavailable: x"}}},
              {"label": "T=1024", "tuned": {"trial": 52}, "candidates": {52: {"clock": full}},
               "arms": {"torch eager": {"clock": full}}}]
    lines = _clock_lines(shapes)
    assert len(lines) == 2 and lines[0].startswith("below full clock")
    assert lines[1] == "  T=4096: tuned 1.70 GHz (low 1.70, 699 W, power cap); torch eager 1.98 GHz (low 1.98, 500 W)"


@pytest.mark.gpu
def test_the_watch_reads_the_real_clock_while_the_gpu_works():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("pynvml")
    w = clocks.ClockWatch.start(torch.cuda.current_device())
    assert w is not None, "NVML is there but the watch did not start"
    try:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:
            for _ in range(8):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
        got = w.window(t0, time.monotonic())
    finally:
        w.stop()
    assert got is not None and got["samples"] >= 10
    assert 300 <= got["sm_mhz_low"] <= got["sm_mhz"] <= (w.max_mhz or 5000)
    assert got["power_w_high"] > 50  # a busy H200 draws hundreds of watts


def test_show_gives_the_clock_of_a_shape_timed_below_full_clock(monkeypatch, capsys):
    """pipe show: a best trial's shape timed under the power cap says at what clock; a shape at
    full clock, or one with no clock sampled (no NVML), says nothing more."""
    from runner import cli

    capped = clocks.summarize([s(1710, 698, 0x4), s(1650, 700, 0x4)], 1980)
    full = clocks.summarize([s(1980, 400)], 1980)
    shape = {"time_s": 2.7e-3, "bytes_per_s": 9e11, "limit_fraction": 0.897}
    summary = {"ledger": {"intact": True, "note": None}, "first_ok": None, "spec": "m", "spec_path": "m.yaml", "status": "done", "trials": 1,
               "by_status": {"ok": 1}, "baseline": None, "goal_check": None,
               "best": {"trial": 51, "params": {"BM": 128}, "objective_s": 1.3e-3, "metric": 0.69,
                        "spreads": [0.02, 0.01, 0.0], "shapes": [shape, shape, shape], "clocks": [capped, full, None]}}
    monkeypatch.setattr(cli, "_summary", lambda run: summary)
    assert cli.main(["show", "some-run"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  shape")]
    assert lines[0].endswith("0.897 of the limit, at 1.68 GHz (low 1.65, 700 W, power cap)")
    assert lines[1].endswith("0.897 of the limit") and lines[2].endswith("0.897 of the limit")
