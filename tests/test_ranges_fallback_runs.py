"""A range that falls back is cut only where another fallback holds at FB_RUN measured sizes in
a row (runner/ship/ranges.py, _refine_fallbacks): a one-size run of another arm (the stock arms
trade places from size to size under the H200's power cap, session 30) merges into its
neighbours, its stretch taking the fallback fastest over its size and the two beside it (a run
of two likewise, over its sizes and theirs)."""

import copy

import pytest
import yaml

from runner.ship import ranges
from runner.spec.spec import load_spec

from .conftest import PIPELINES
from .test_ranges import spec_from

OWN = "loop"  # the range's own fallback (its point's choice)


@pytest.fixture
def spec(project):
    """moe-cpu.yaml over T = 1..4096: the range 1000..2000 is timed at 1000, 1189, 1414, 1682 and
    2000, far enough apart that a size's twins (the next three sizes) never reach the next."""
    data = yaml.safe_load((PIPELINES / "moe-cpu.yaml").read_text())
    data["op"]["domain"] = {"T": {"min": 1, "max": 4096, "typical": [1, 16]}}
    return load_spec(spec_from(project, data, "moe-wide.yaml"))


class _Arms:
    """Prober.time for the fallbacks alone: each arm's time (us) at T is `base`'s, but inside a
    span (lo, hi, {arm: time}) that span's; two rounds each."""
    fallbacks = {"loop": "m:loop", "gm": "m:gm", "cc": "m:cc"}

    def __init__(self, base: dict, *spans):
        self.base, self.spans, self.asked = base, spans, []

    def at(self, t: int) -> dict:
        got = dict(self.base)
        for lo, hi, arms in self.spans:
            if lo <= t < hi:
                got.update(arms)
        return got

    def time(self, shapes, kernels, others=False, mode_of=None):
        self.asked.append([s["T"] for s in shapes])
        d = lambda t: {"median": t, "rounds": [t, t], "error": None, "mode": None}  # noqa: E731
        return [{n: d(t * 1e-6) for n, t in self.at(s["T"]).items()} for s in shapes]


RANGE = {"lo": {"T": 1000}, "hi": {"T": 2001}, "point": {"T": 1024}, "use": [], "times_s": {},
         "eager_s": 1e-6, "fallback": OWN, "nearest": {"trial": 3, "time_s": 2e-6}}


def refine(spec, prober, log=None):
    """The parts, without what each measured (checked in test_each_part_keeps_what_it_measured)."""
    out = ranges._refine_fallbacks(spec, "T", [copy.deepcopy(RANGE)], prober, log)
    return [{k: v for k, v in p.items() if k != "measured"} for p in out]


def test_the_sizes_are_where_the_tests_expect_them():
    assert ranges._fallback_sizes(1000, 2001) == [1000, 1189, 1414, 1682, 2000]
    assert ranges.FB_RUN == 3


@pytest.mark.parametrize("at", [1000, 1414, 2000])  # the range's low edge, its middle, its high edge
def test_another_arm_faster_at_one_size_cuts_nothing(spec, at):
    """Arm "gm" 10% ahead of the range's own loop at one measured size (and its twins), 8% behind
    at every other: the old rule gave that size's stretch to "gm"; over the size and its
    neighbours the loop is fastest, so the range stays whole, at an edge as in the middle."""
    arms = _Arms({"torch eager": 1.5, "loop": 1.0, "gm": 1.08, "cc": 1.3}, (at, at + 4, {"gm": 0.9}))
    lines = []
    assert refine(spec, arms, lines.append) == [RANGE]
    assert f"{at} gm (held: loop)" in lines[0]  # the size chose "gm"; the loop holds it
    assert len(arms.asked) > 1  # the change of choice was bisected before it was judged


def test_a_one_size_run_within_the_noise_over_its_neighbours_keeps_the_range_s_own(spec):
    """Over the size and its two neighbours "gm" is 0.7% ahead of the loop (2.98 against 3.0):
    within NOISE of the range's own fallback, which stays."""
    arms = _Arms({"torch eager": 1.5, "loop": 1.0, "gm": 1.04, "cc": 1.3}, (1414, 1418, {"gm": 0.9}))
    assert refine(spec, arms) == [RANGE]


@pytest.mark.parametrize("span", [(1189, 1686), (1300, 1418)])
def test_a_choice_that_holds_at_three_sizes_in_a_row_still_cuts(spec, span):
    """"gm" fastest at 1189, 1414 and 1682 (three of the grid's sizes), or at 1414 and the
    bisection's midpoints below it (the midpoints count): its stretch is cut out of the loop's
    range."""
    lo, hi = span
    arms = _Arms({"torch eager": 1.5, "loop": 1.0, "gm": 1.3, "cc": 1.3}, (lo, hi, {"gm": 0.9}))
    out = refine(spec, arms)
    assert [p["fallback"] for p in out] == ["loop", "gm", "loop"]
    assert out[0]["lo"] == {"T": 1000} and out[-1]["hi"] == {"T": 2001}
    assert all(a["hi"] == b["lo"] for a, b in zip(out, out[1:]))
    gm = out[1]
    assert lo - 40 < gm["lo"]["T"] < lo + 40 and hi - 40 < gm["hi"]["T"] < hi + 40  # bisected close
    assert gm["eager_s"] == pytest.approx(0.9e-6)  # "gm"'s time at its part's point
    assert out[0]["nearest"] == RANGE["nearest"] and out[0]["point"] == RANGE["point"]


def test_a_merged_size_takes_the_arm_fastest_over_it_and_its_neighbours(spec):
    """At 1414 "gm" is fastest (0.80; "cc" 0.85, the loop 1.0); beside it the loop (1.0, "cc"
    1.01, "gm" 1.3). Over the three sizes "cc" is fastest (2.87 against the loop's 3.0 and "gm"'s
    3.4): the stretch 1414 chose takes "cc", neither its own choice nor the range's."""
    arms = _Arms({"torch eager": 1.5, "loop": 1.0, "gm": 1.3, "cc": 1.01}, (1414, 1418, {"gm": 0.8, "cc": 0.85}))
    lines = []
    out = refine(spec, arms, lines.append)
    assert [p["fallback"] for p in out] == ["loop", "cc", "loop"]
    cc = out[1]
    assert cc["point"] == {"T": 1414} and cc["lo"]["T"] <= 1414 < cc["hi"]["T"]
    assert cc["eager_s"] == pytest.approx(0.85e-6)  # "cc"'s own time there, not "gm"'s
    assert "1414 gm (held: cc)" in lines[0]
    table = {"axes": ["T"], "exact": [], "ranges": out}
    assert ranges.fallback_of(table, {"T": 1414}) == "cc" and ranges.fallback_of(table, {"T": 1200}) == "loop"


def test_one_size_runs_side_by_side_are_each_judged_from_the_sizes_own_choices():
    """Session 30's stretch (T = 710 to 771 on the H200): torch ahead at the sizes on either side,
    and between them the loop, torch._grouped_mm and the loop again, one size each, by a few
    percent. Each one-size run is judged over its size and its neighbours as they chose (not as
    a run beside it merged): torch, fastest over every three, takes them all."""
    fast = {None: (1.0, 1.0), "loop": (1.10, 1.10), "gm": (1.10, 1.10)}
    gots = [fast, fast,
            {None: (1.03, 1.03), "loop": (1.0, 1.0), "gm": (1.10, 1.10)},
            {None: (0.96, 0.96), "loop": (1.12, 1.12), "gm": (0.95, 0.95)},
            {None: (1.03, 1.03), "loop": (1.0, 1.0), "gm": (1.10, 1.10)},
            fast, fast]
    chosen, held = ranges._held_choices(gots, "loop")
    assert chosen == [None, None, "loop", "gm", "loop", None, None]
    assert held == [None] * 7
    # a size where no fallback ran keeps the range's own; a one-size run beside it has no arm
    # timed at all its sizes and keeps the range's own too; a run of three holds
    chosen, held = ranges._held_choices([fast, {}, fast, fast, fast], "loop")
    assert chosen == [None, "loop", None, None, None] and held == ["loop", "loop", None, None, None]


def test_two_sizes_in_a_row_are_not_enough():
    """Session 30's T = 675..716: torch eager ahead at two sizes (682, 710) between sizes where
    the loop was, and 5.5% behind the loop at T = 691 in every round of the compare: a run of two
    is judged with its neighbours, where the loop is fastest."""
    loop = {None: (1.04, 1.04), "loop": (1.0, 1.0)}
    torch_ = {None: (0.98, 0.98), "loop": (1.0, 1.0)}
    chosen, held = ranges._held_choices([loop, loop, torch_, torch_, loop, loop], "loop")
    assert chosen == ["loop", "loop", None, None, "loop", "loop"]
    assert held == ["loop"] * 6


def test_each_part_keeps_what_it_measured(spec):
    """Each part of a cut range (and a range left whole) carries its sizes and every fallback's
    time at each, in microseconds: the table's evidence, beside pipe compare's curve."""
    arms = _Arms({"torch eager": 1.5, "loop": 1.0, "gm": 1.3, "cc": 1.3}, (1189, 1686, {"gm": 0.9}))
    out = ranges._refine_fallbacks(spec, "T", [copy.deepcopy(RANGE)], arms, None)
    assert [p["fallback"] for p in out] == ["loop", "gm", "loop"]
    for p in out:
        sizes = [v for v, _ in p["measured"]]
        assert sizes and all(p["lo"]["T"] <= v < p["hi"]["T"] for v in sizes)
        for v, times in p["measured"]:
            best = min(times, key=times.get)
            assert best == ("gm" if 1189 <= v < 1686 else "loop")
            assert times["torch"] == pytest.approx(1.5)
    whole = ranges._refine_fallbacks(spec, "T", [copy.deepcopy(RANGE)], _Arms({"torch eager": 1.5, "loop": 1.0}), None)
    assert [v for v, _ in whole[0]["measured"]] == [1000, 1189, 1414, 1682, 2000]
