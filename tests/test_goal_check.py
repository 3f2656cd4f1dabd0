"""A goal is met only on a figure beyond its noise: the kernels whose recorded figures look
as if they meet it are timed again, in paired rounds with the baseline's torch arm, and the
conservative quartile of those rounds decides. Torch is timed on the thread count the spec
gives kernels."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from runner.core import figures
from runner.core.records import Trial
from runner.ledger.summary import goal_check_line
from runner.loop import Session
from runner.search.core import goal_picks as _goal_picks, stop_reason as _stop_reason
from runner.loop import run as run_loop
from runner.spec.spec import load_spec
from runner.judge.evaluator import Evaluator

ROOT = Path(__file__).resolve().parents[1]
_CPU = load_spec(ROOT / "pipelines" / "rmsnorm-cpu.yaml")
SPEC = dataclasses.replace(_CPU, goal=dataclasses.replace(_CPU.goal, metric="speedup", at_least=3.0, at_most=None))
BASELINE = [30e-6, 30e-6]


def trial(i: int, times: list[float]) -> Trial:
    shapes = figures.per_shape(SPEC, times, BASELINE)
    return Trial(params={"ACC": i, "THREADS": 1, "UNROLL": 1}, status="ok", times=times, id=i, kept=True,
                 objective=figures.geomean(times), metric=figures.metric(SPEC, shapes))


def test_a_goal_that_looks_met_stops_the_run_only_once_confirmed():
    a = trial(1, [9e-6, 9e-6])  # 3.3x on both shapes by its recorded figures
    asked = []

    def refuse(picks):
        asked.append([t.id for t in picks])
        return False

    assert _stop_reason(SPEC, [a], a, None, None, 0.0, baseline=BASELINE) == "goal met"  # figures alone
    assert _stop_reason(SPEC, [a], a, None, None, 0.0, baseline=BASELINE, confirm=refuse) is None
    assert asked == [[1, 1]]  # the best configuration serves both shapes
    assert _stop_reason(SPEC, [a], a, None, None, 0.0, baseline=BASELINE, confirm=lambda p: True) == "goal met"


def test_the_dispatch_table_is_confirmed_with_each_shapes_own_kernel():
    a = trial(1, [9e-6, 12e-6])  # the best overall, too slow on shape 1
    b = trial(2, [20e-6, 9.5e-6])  # the fastest on shape 1
    picks = _goal_picks(SPEC, [a, b], a, BASELINE)
    assert [[t.id for t in p] for p in picks] == [[1, 2]]
    seen = []
    _stop_reason(SPEC, [a, b], a, None, None, 0.0, baseline=BASELINE, confirm=lambda p: seen.append(p) or False)
    assert [[t.id for t in p] for p in seen] == [[1, 2]]


def test_a_domain_with_one_listed_shape_confirms_that_shapes_fastest_kernel():
    """With op.domain the best configuration is ranked over the tuning grid, so the listed
    shape's fastest trial may be another one: the goal is checked on it."""
    cpu = load_spec(ROOT / "pipelines" / "rmsnorm-range-cpu.yaml")
    spec = dataclasses.replace(cpu, goal=dataclasses.replace(cpu.goal, metric="speedup", at_least=3.0))
    assert spec.op.named == 1 and len(spec.op.shapes) > 1
    base = [30e-6] * len(spec.op.shapes)

    def ranged(i, times):
        return Trial(params={"ACC": i}, status="ok", times=times, id=i, kept=True, objective=figures.geomean(times),
                     metric=figures.metric(spec, figures.per_shape(spec, times, base)))

    rest = len(spec.op.shapes) - 1
    a = ranged(1, [12e-6] + [5e-6] * rest)  # the best over the grid, 2.5x on the listed shape
    b = ranged(2, [9e-6] + [20e-6] * rest)  # 3.3x on the listed shape, slow elsewhere
    assert not spec.goal.met(a.metric) and spec.goal.met(b.metric)
    assert [[t.id for t in p] for p in _goal_picks(spec, [a, b], a, base)] == [[2]]
    assert _goal_picks(spec, [a], a, base) == []  # nothing meets it: nothing to confirm
    c = ranged(3, [8e-6] + [4e-6] * rest)  # the best everywhere: one pick, not the same one twice
    assert [[t.id for t in p] for p in _goal_picks(spec, [a, b, c], c, base)] == [[3]]


class _Rounds:
    """The worker's answer to a paired re-timing: medians[round][job][shape]."""

    def __init__(self, rounds):
        self.rounds, self.asked = rounds, []

    def request(self, msg, timeout):
        self.asked.append(msg)
        return {"status": "ok", "medians": self.rounds}


def _confirm(rounds) -> tuple[dict, list]:
    ev = Evaluator(SPEC, _Rounds(rounds), BASELINE)
    a = trial(1, [9e-6, 9e-6])
    ev.artifacts[a.key] = ["k0.so", "k1.so"]
    return ev.confirm_goal([a, a], rounds=len(rounds)), ev.worker.asked


def test_the_lower_quartile_of_the_paired_rounds_decides():
    # kernel 20 us (above the CPU profile's floor of 16.8); torch eager 66 us in most rounds, 48 us
    # in two: median 3.3x, lower quartile 2.4x
    rounds = [[[20e-6, 20e-6], [b, b]] for b in (66e-6, 66e-6, 48e-6, 66e-6, 48e-6, 66e-6, 66e-6)]
    c, asked = _confirm(rounds)
    assert c["metric"] == pytest.approx(3.3) and c["low"] == pytest.approx(2.85)
    assert not c["met"] and c["against"] == "reference" and c["kernels"] == [1, 1]
    kind, jobs, n, _seed, budget, only = asked[0]
    assert kind == "retime" and n == 7 and jobs[1] == {"torch": "reference"}  # the baseline's arm, paired
    assert only is None  # every timed shape (a spec with op.domain names its listed ones)
    assert budget == 1.0  # each arm for the whole timing budget, as pipe compare times it
    assert (c["min"], c["max"]) == (pytest.approx(2.4), pytest.approx(3.3))
    assert jobs[0]["artifacts"] == ["k0.so", "k1.so"]
    assert "not met" in goal_check_line(SPEC, c) and "quartiles 2.850-3.300, range 2.400-3.300" in goal_check_line(SPEC, c)
    assert goal_check_line(None, c) == goal_check_line(SPEC, c)  # a check carries its goal's words
    steady = [[[20e-6, 20e-6], [66e-6, 66e-6]]] * 7
    c, _ = _confirm(steady)
    assert c["met"] and c["low"] == pytest.approx(3.3)


def test_torch_is_timed_on_the_thread_count_the_spec_gives_kernels():
    import torch

    from runner.build.backends import cpu

    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            cpu.Runtime(SPEC.hw, dataclasses.replace(SPEC.runtime, threads=n))
            assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(before)
    assert _CPU.runtime.threads == 1 and _CPU.space.params[1].name == "THREADS"
    assert max(_CPU.space.params[1].values) <= _CPU.runtime.threads  # the example compares like with like


def test_a_recorded_baseline_that_flatters_every_kernel_meets_no_goal(tmp_path, monkeypatch):
    """The baseline a run keeps says torch takes a second a call, so every trial's recorded
    speedup is in the hundreds and the goal (50x) looks met at the first trial; the paired
    re-timing against torch eager measures the real ratio, and the run goes on to its budget."""
    import yaml

    from .conftest import FEW_ROWS

    d = yaml.safe_load((ROOT / "pipelines" / "rmsnorm-cpu.yaml").read_text())
    d["op"]["shapes"] = FEW_ROWS  # the paired rounds' ratio is what counts, not the rows' number
    d["runtime"].update(warmup_ms=2, rep_ms=10)  # and not how long each is timed (from 10 and 50)
    (tmp_path / "rmsnorm-cpu.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    cpu = load_spec(tmp_path / "rmsnorm-cpu.yaml")
    spec = dataclasses.replace(cpu, goal=dataclasses.replace(cpu.goal, at_least=50.0, patience=None))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    s = Session(spec, run_dir)
    fake = [{"median": 1.0, "spread": 0.0, "n": 10, "min": 1.0}] * 2
    s.ledger.set_meta("baseline", json.dumps({"mode": "reference", "times": [1.0, 1.0], "shapes": fake}))
    s.close()
    out = run_loop(spec, run_dir, max_trials=3)
    assert out.exit_code == 1 and out.trials == 3 and out.stop.startswith("trial budget")
    assert out.best is not None and out.best.metric > 50  # what the recorded figures said
    doc = json.loads((run_dir / "run.json").read_text())
    check = doc["goal_check"]
    assert check["met"] is False and check["against"] == "reference" and check["rounds"] == 7
    assert 0 < check["low"] <= check["metric"] <= check["high"] < 50  # the real ratio, paired
    assert doc["status"] != "goal met"
    # resumed, the run never times the same kernels against the goal again: a failed check
    # stands (interrupting and resuming until the noise says "met" re-rolled it before)
    calls, real = [], Evaluator.confirm_goal

    def spy(self, picks):
        calls.append(tuple(t.id for t in picks))
        return real(self, picks)

    monkeypatch.setattr(Evaluator, "confirm_goal", spy)
    run_loop(spec, run_dir, max_trials=4)
    assert tuple(check["kernels"]) not in calls, calls
    import sqlite3

    db = sqlite3.connect(f"file:{run_dir / 'ledger.db'}?mode=ro", uri=True)
    try:
        kept = [tuple(c["kernels"]) for c in
                json.loads(db.execute("select value from meta where key='goal_checks'").fetchone()[0])]
    finally:
        db.close()
    assert len(kept) == len(set(kept)), kept  # once per set of kernels


def test_a_retiming_below_the_physical_floor_is_impossible():
    """The physical floor holds in every loop that times a candidate: a candidate whose paired
    re-timing (the keep decision) runs faster than the hardware can is `impossible`, not kept,
    and a goal check whose kernels do is not met."""
    from runner.judge.evaluator import RETIME_ROUNDS

    floor = [f["floor"] for f in figures.floors(SPEC)]
    fast = [[[f / 10 for f in floor], [30e-6, 30e-6]]] * RETIME_ROUNDS
    ev = Evaluator(SPEC, _Rounds(fast), BASELINE)
    best, cand = trial(1, [20e-6, 20e-6]), trial(2, [10e-6, 10e-6])
    ev.artifacts[best.key], ev.artifacts[cand.key] = ["b0.so", "b1.so"], ["c0.so", "c1.so"]
    ev.decide(cand, best)
    assert cand.status == "impossible" and not cand.kept
    assert "below the physical floor" in cand.reason and cand.details["retime"]["status"] == "impossible"
    # the same re-timing at the floor's own pace is an honest, faster kernel: kept
    honest = [[[f * 1.5 for f in floor], [f * 3 for f in floor]]] * RETIME_ROUNDS
    ev = Evaluator(SPEC, _Rounds(honest), BASELINE)
    cand = trial(2, [10e-6, 10e-6])
    ev.artifacts[best.key], ev.artifacts[cand.key] = ["b0.so", "b1.so"], ["c0.so", "c1.so"]
    ev.decide(cand, best)
    assert cand.status == "ok" and cand.kept
    c, _ = _confirm([[[f / 10 for f in floor], [33e-6, 33e-6]]] * 7)
    assert not c["met"] and c["error"].startswith("impossible")


def test_the_runs_last_line_names_the_kernels_that_met_the_goal(tmp_path, monkeypatch, capsys):
    """The paired keep decisions may keep one configuration as the best while each shape's
    fastest trial (what pipe export ships) is another, and the goal check confirms those: the
    README's first run once ended "goal check of #3: speedup 2.839 ... met", then "goal met: 3
    trials; best #2 ... metric 1.42", a best below the goal, as if it had met it."""
    from runner import cli, loop
    from runner.ledger.summary import goal_by_text

    best = trial(2, [9e-6, 9e-6])
    check = {"kernels": [3, 3], "met": True, "metric": 2.839, "low": 2.52, "high": 2.96, "rounds": 7}
    assert goal_by_text(check, 2) == "the goal was met by #3 on every shape, which pipe export ships"
    assert "dispatch table (#3, #4)" in goal_by_text({**check, "kernels": [3, 4]}, 2)
    assert goal_by_text({**check, "kernels": [2, 2]}, 2) is None  # the best met it: nothing to add
    assert goal_by_text({**check, "met": False}, 2) is None
    assert goal_by_text(None, 2) is None

    def fake_run(spec, run_dir, *a, **k):
        return loop.Outcome(0, "goal met", best, 3, goal_check=check, goal_check_shown=True)

    monkeypatch.setattr(loop, "run", fake_run)
    assert cli.main(["run", str(ROOT / "pipelines" / "rmsnorm-cpu.yaml"), "--run-dir", str(tmp_path / "r")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("goal met: 3 trials; best #2 ") and "the goal was met by #3 on every shape" in last
    assert last.endswith(f"run folder {tmp_path / 'r'}")


def test_show_lists_each_shapes_fastest_where_it_is_not_the_best(monkeypatch, capsys):
    """pipe show: each shape's fastest trial (what pipe export ships) is listed where any of
    them is not the best, also where one trial is the fastest on every shape."""
    from runner import cli

    def summary(per):
        return {"ledger": {"intact": True, "note": None}, "first_ok": None, "spec": "m", "spec_path": "m.yaml",
                "status": "done", "trials": 3, "by_status": {"ok": 3}, "baseline": None, "goal_check": None,
                "best": {"trial": 2, "params": {"ACC": 32}, "objective_s": 4.2e-4, "metric": 1.42},
                "best_per_shape": [{"trial": t, "params": {"ACC": 32}, "time_s": 3.5e-4} for t in per]}

    for per, listed in [([3, 3], True), ([2, 3], True), ([2, 2], False)]:
        monkeypatch.setattr(cli, "_summary", lambda run, per=per: summary(per))
        assert cli.main(["show", "some-run"]) == 0
        out = capsys.readouterr().out
        assert ("best per shape" in out) == listed, (per, out)
        if listed:
            assert f"shape 1: trial #{per[1]} " in out
