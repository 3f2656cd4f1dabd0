"""The run's baseline keeps each shape's steadiest timing over its tries (loop.steadier): a
whole try's steadiest, as before session 55, kept a shape timed at 11.5 ms with a spread of
134% beside another try's 0.18 ms, and `pipe show` then printed a 27x speedup for a kernel
2x slower than torch (the first-hour trial, on a loaded machine)."""

from runner.loop import steadier


def _t(median, spread):
    return {"median": median, "spread": spread, "n": 20, "min": median * 0.9}


def test_each_shape_keeps_its_own_steadiest_timing():
    first = [_t(11.5e-3, 1.34), _t(181e-6, 0.05)]   # shape 0 preempted
    second = [_t(176e-6, 0.04), _t(240e-6, 0.60)]   # shape 1 preempted
    got = steadier(steadier(None, first), second)
    assert [g["median"] for g in got] == [176e-6, 181e-6]
    # a whole try's steadiest (its worst shape the least bad) would have kept one preempted shape
    whole = min((first, second), key=lambda t: max(s["spread"] for s in t))
    assert max(s["spread"] for s in whole) > 0.5 and max(s["spread"] for s in got) <= 0.05


def test_a_tie_keeps_the_earlier_timing_and_the_first_try_stands_alone():
    a, b = [_t(1e-3, 0.1)], [_t(2e-3, 0.1)]
    assert steadier(steadier(None, a), b) == a
    assert steadier(None, b) == b
