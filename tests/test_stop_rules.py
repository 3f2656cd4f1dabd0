"""When a run stops: the goal met by the dispatch table (each shape's fastest kernel), and
patience that counts a faster kernel for one shape as progress."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runner.core import figures
from runner.core.records import Trial
from runner.search.core import goal_met as _goal_met, stop_reason as _stop_reason
from runner.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
# two timed shapes; the goal set here to speedup >= 3 on the worst (whatever the example's)
_CPU = load_spec(ROOT / "pipelines" / "rmsnorm-cpu.yaml")
SPEC = dataclasses.replace(_CPU, goal=dataclasses.replace(_CPU.goal, metric="speedup", at_least=3.0, at_most=None))
BASELINE = [30e-6, 30e-6]


def trial(i: int, times: list[float] | None, status: str = "ok") -> Trial:
    shapes = figures.per_shape(SPEC, times, BASELINE) if times else []
    return Trial(params={"i": i}, status=status, times=times, id=i,
                 objective=figures.geomean(times) if times else None,
                 metric=figures.metric(SPEC, shapes) if times else None)


def with_patience(n: int):
    return dataclasses.replace(SPEC, goal=dataclasses.replace(SPEC.goal, patience=n))


def test_last_progress_counts_a_shape_beaten_by_more_than_the_tolerance():
    h = [trial(1, [10e-6, 10e-6]),  # first ok: progress
         trial(2, [9.98e-6, 10e-6]),  # 0.2% on shape 0: noise, not progress
         trial(3, [12e-6, 9e-6]),  # 10% on shape 1: progress, though slower overall
         trial(4, [11e-6, 11e-6]),
         trial(5, None, status="wrong")]
    assert figures.progress_marks(h) == [True, False, True, False, False]
    assert figures.last_progress(h, best_index=0) == 2
    assert figures.last_progress(h, best_index=3) == 3  # the best itself is progress
    assert figures.last_progress(h[:2], best_index=0) == 0
    assert figures.last_progress([trial(9, None, status="compile_error")], best_index=-1) == -1


def test_patience_waits_while_a_shape_keeps_getting_faster():
    spec = with_patience(2)
    best = trial(1, [20e-6, 20e-6])  # all far from the goal (10 us a shape)
    h = [best, trial(2, [24e-6, 18e-6]), trial(3, [26e-6, 16e-6]), trial(4, [28e-6, 28e-6])]
    # trials 2 and 3 are slower overall but each beats shape 1: one trial since progress
    assert _stop_reason(spec, h, best, None, None, 0.0, baseline=BASELINE) is None
    h.append(trial(5, [28e-6, 28e-6]))
    reason = _stop_reason(spec, h, best, None, None, 0.0, baseline=BASELINE)
    assert reason is not None and reason.startswith("patience ran out (2 trials")


def test_goal_met_by_the_dispatch_table_not_by_one_kernel():
    # speedup >= 3 on the worst shape: 30 us of baseline needs 10 us or less on each shape
    a = trial(1, [9e-6, 12e-6])  # the best single configuration (geomean), fails on shape 1
    b = trial(2, [20e-6, 9.5e-6])  # slower overall, fast on shape 1
    assert not SPEC.goal.met(a.metric) and not SPEC.goal.met(b.metric)
    assert figures.table_metric(SPEC, [a, b], BASELINE) == 30 / 9.5
    assert _goal_met(SPEC, [a, b], a, BASELINE)
    assert _stop_reason(SPEC, [a, b], a, None, None, 0.0, baseline=BASELINE) == "goal met"
    # without the second kernel the table is the best alone: not met
    assert not _goal_met(SPEC, [a], a, BASELINE)
    assert _stop_reason(SPEC, [a], a, None, None, 0.0, baseline=BASELINE) is None


def test_table_metric_needs_every_shape():
    assert figures.table_metric(SPEC, [trial(1, None, status="wrong")], BASELINE) is None
    assert figures.table_metric(SPEC, [], BASELINE) is None


def test_replay_stops_where_the_loop_would():
    """runner.search.replay's PatienceStop and the loop's patience agree, trial for trial, on a
    history where the best moves, shapes get beaten and trials fail."""
    import random

    from runner.search.agents import Seen
    from runner.search.core import PatienceStop

    rng = random.Random(7)
    spec = with_patience(5)
    stopped = 0
    for _ in range(20):
        hist: list[Trial] = []
        stopper = PatienceStop(5)
        for i in range(1, 80):
            ok = rng.random() > 0.15
            times = [rng.uniform(20e-6, 40e-6), rng.uniform(20e-6, 40e-6)] if ok else None
            t = trial(i, times, "ok" if ok else "wrong")
            hist.append(t)
            stops = stopper.add(Seen(t.params, t.status, "", t.objective, times=tuple(times) if times else None))
            oks = [x for x in hist if x.status == "ok"]
            best = min(oks, key=lambda x: x.objective) if oks else None
            reason = _stop_reason(spec, hist, best, None, None, 0.0, baseline=BASELINE)
            assert (reason is not None and reason.startswith("patience")) == stops, (i, reason, stops)
            if stops:
                stopped += 1
                break
    assert stopped >= 15  # the rule did fire, mostly well before the 79th trial


def test_pipe_replay_patience_reports_the_stop_and_the_table(tmp_path):
    import json
    import subprocess
    import sys

    # two shapes that prefer different configurations; P in 0..19
    trials = [{"params": {"P": p}, "status": "ok", "reason": "",
               "times": [1.0 + abs(p - 3) * 0.1, 1.0 + abs(p - 16) * 0.1],
               "objective": ((1.0 + abs(p - 3) * 0.1) * (1.0 + abs(p - 16) * 0.1)) ** 0.5} for p in range(20)]
    ds = tmp_path / "two.json"
    ds.write_text(json.dumps({"format": "pipe-dataset/1", "spec": "two", "spec_hash": "x", "hardware": "cpu",
                              "params": {"P": list(range(20))}, "constraints": [], "shapes": [{"M": 1}, {"M": 2}],
                              "timed_shapes": 2, "trials": trials}))
    from runner.search.replay import replay_patience

    few = replay_patience(ds, "pattern", 5, patience=2)
    many = replay_patience(ds, "pattern", 5, patience=19)
    assert few["evals"]["median"] < many["evals"]["median"] <= 20
    assert many["table"]["median"] <= few["table"]["median"] and many["table"]["median"] >= 1.0
    r = subprocess.run([sys.executable, "-m", "runner.cli", "replay", str(ds), "--agent", "pattern",
                        "--seeds", "3", "--patience", "4"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "two pattern patience 4: stops after" in r.stdout and "worst shape" in r.stdout


def test_a_met_goal_need_not_stop_the_run():
    a = trial(1, [9e-6, 9.5e-6])  # meets speedup >= 3 on both shapes
    assert _stop_reason(SPEC, [a], a, None, None, 0.0, baseline=BASELINE) == "goal met"
    spec = dataclasses.replace(SPEC, goal=dataclasses.replace(SPEC.goal, stop_when_met=False, patience=2))
    assert _goal_met(spec, [a], a, BASELINE)  # still met (the exit code says so)
    assert _stop_reason(spec, [a], a, None, None, 0.0, baseline=BASELINE) is None
    h = [a, trial(2, [20e-6, 20e-6]), trial(3, [20e-6, 20e-6])]
    assert _stop_reason(spec, h, a, None, None, 0.0, baseline=BASELINE).startswith("patience")
    assert _stop_reason(spec, h, a, 3, None, 0.0, baseline=BASELINE) == "trial budget spent (3)"


def test_trials_that_all_fail_to_compile_alike_are_a_warning_never_a_stop():
    """The first BROKEN_AFTER trials failing to compile with one error, word for word, give a
    warning, not a stop: a parameter-dependent static_assert fails alike at every value it
    refuses (a review's case: ACC >= 16 asserted, ACC 16 and 32 building). Different errors (a
    resource limit's sizes) or one trial that built give none."""
    from runner.search.core import BROKEN_AFTER, broken_reason

    def broken(i, why="kernel.cpp:44:1: error: 'x' unknown"):
        return dataclasses.replace(trial(i, None, status="compile_error"), reason=why)

    h = [broken(i) for i in range(1, BROKEN_AFTER + 1)]
    why = broken_reason(h)
    assert why and "failed to compile alike" in why and "kernel.cpp:44:1: error" in why and "goes on" in why
    assert _stop_reason(SPEC, h, None, None, None, 0.0, baseline=BASELINE) is None  # no stop
    assert broken_reason(h[:-1]) is None  # too few yet
    sized = [broken(i, f"ptxas error: uses too much shared data (0x{i}c000 bytes)")
             for i in range(1, BROKEN_AFTER + 1)]
    assert broken_reason(sized) is None
    built = trial(9, [20e-6, 20e-6])
    assert broken_reason([built] + h) is None and broken_reason(h + [built]) is None
    # a template that fails to render alike (a division by zero in a Jinja expression) warns too,
    # and a mix of render and compile errors does not (the parameters matter)
    why0 = "template l2norm.cpp.j2:3: ZeroDivisionError: integer division or modulo by zero"
    rendered = [dataclasses.replace(trial(i, None, status="render_error"), reason=why0)
                for i in range(1, BROKEN_AFTER + 1)]
    why = broken_reason(rendered)
    assert why and "failed to render alike" in why and "ZeroDivisionError" in why
    assert broken_reason(rendered[:2] + h[:2]) is None


def test_a_run_whose_template_never_builds_warns_once_and_names_the_templates_line(tmp_path):
    """A real CPU run of the example with one line of its template broken: the warning after four
    trials, once, with g++'s error and that line of the template; the run goes on to its budget."""
    import json
    import os

    from .conftest import PIPELINES, pipe_main

    proj = tmp_path / "proj"
    (proj / "pipelines").mkdir(parents=True)
    (proj / "kernel_templates").mkdir()
    os.symlink(ROOT / "hw_profiles", proj / "hw_profiles")
    lines = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text().splitlines(keepends=True)
    at = max(i for i, ln in enumerate(lines) if ln.strip() == "}")  # the last brace: a line of the entry
    lines.insert(at, "  not_a_declared_name;\n")
    (proj / "kernel_templates" / "rmsnorm.cpp.j2").write_text("".join(lines))
    (proj / "pipelines" / "b.yaml").write_text((PIPELINES / "rmsnorm-cpu.yaml").read_text())
    r = pipe_main("run", "pipelines/b.yaml", "--run-dir", "run", "--max-trials", "6", cwd=proj)
    assert r.returncode == 1, r.stderr[-2000:]
    doc = json.loads((proj / "run" / "run.json").read_text())
    assert doc["trials"] == 6 and doc["stop"] == "trial budget spent (6)"
    warned = [ln for ln in r.stdout.splitlines() if ln.startswith("warning: the first 4 trials failed to compile")]
    assert len(warned) == 1 and "not_a_declared_name" in warned[0], r.stdout
    assert f"[template kernel_templates/rmsnorm.cpp.j2:{at + 1}]" in warned[0]
    assert "template.may_not_build" not in r.stderr  # the progress line is the terminal's one copy
    # a log for machines still gets the event
    r = pipe_main("--log-json", "run", "pipelines/b.yaml", "--run-dir", "run2", "--max-trials", "4", cwd=proj)
    events = [json.loads(ln) for ln in r.stderr.splitlines() if ln.startswith("{")]
    assert [e["reason"] for e in events if e["event"] == "template.may_not_build"] == [warned[0][len("warning: "):]]
