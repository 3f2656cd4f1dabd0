"""The search core (runner.search.core) is the loop's and the replay bench's, and a strategy
is whatever the registry (runner.search.agents) holds: one defined here works in spec
validation, pipe replay and pipe run with no other edit."""

import json
import re
import subprocess
import sys

import pytest
import yaml

from runner.core.records import Trial
from runner.ledger.ledger import Ledger
from runner.search import dataset, replay
from runner.search.agents import STRATEGIES, Option
from runner.search.space import config_key
from runner.spec.spec import load_spec

from .conftest import FEW_ROWS, PIPELINES, ROOT, pipe_main

RUNS = sorted((ROOT / "tests" / "data").glob("*-run"))


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_replaying_a_recorded_run_stops_where_the_run_stopped(run, tmp_path, monkeypatch):
    """The trials of a run on the H200, replayed through the bench in the order the run judged
    them, stop after the same trial for the same reason (the run's budget was its
    --max-trials, which run.json's stop names; its patience is the spec's)."""
    doc = json.loads((run / "run.json").read_text())
    led = Ledger.read(run)
    try:
        trials: list[Trial] = led.trials()
    finally:
        led.close()
    spec = load_spec(next((run / "project" / "pipelines").glob("*.yaml")))
    path = tmp_path / f"{run.name}.json"
    path.write_text(json.dumps(dataset.export(spec, trials)))
    order = [dict(t.params) for t in trials]

    class Recorded:  # proposes what the run judged next
        pure = True
        OPTIONS: dict = {}
        name = "recorded"

        def __init__(self, space, seed, options):
            pass

        def propose(self, history, n):
            return [order[len(history)]] if len(history) < len(order) else []

    monkeypatch.setitem(STRATEGIES, "recorded", Recorded)
    budget = int(re.fullmatch(r"trial budget spent \((\d+)\)", doc["stop"]).group(1))
    history, stop = replay.simulate(dataset.load(path), "recorded", 0, budget=budget, patience=spec.goal.patience)
    assert stop == doc["stop"]
    assert len(history) == doc["trials"] == len(trials)
    assert [dict(h.params) for h in history] == order
    assert [h.status for h in history] == [t.status for t in trials]


def test_a_patience_stop_in_the_bench_is_the_loops_rule(tmp_path):
    """With a patience shorter than the run, the bench stops where the loop's stop rule says."""
    from runner.search.core import patience_reason

    trials = [{"params": {"P": p}, "status": "ok", "reason": "", "times": [1.0 + abs(p - 3) * 0.1],
               "objective": 1.0 + abs(p - 3) * 0.1} for p in range(20)]
    ds = tmp_path / "one.json"
    ds.write_text(json.dumps({"format": "pipe-dataset/1", "spec": "one", "spec_hash": "x", "hardware": "cpu",
                              "params": {"P": list(range(20))}, "constraints": [], "shapes": [{"M": 1}],
                              "timed_shapes": 1, "trials": trials}))
    history, stop = replay.simulate(dataset.load(ds), "grid", 0, patience=4)
    assert stop.startswith("patience ran out") and len(history) == 8  # best at P=3, then four more
    best = min(history, key=lambda h: h.objective)
    assert patience_reason(history, best, 4) == stop
    assert patience_reason(history[:-1], best, 4) is None


class Walk:
    """A strategy of this file: every `step`-th point of the space, in order."""

    pure = True
    OPTIONS = {"step": Option(1, int)}

    def __init__(self, space, seed, options):
        self.space, self.step = space, options["step"]  # the declared default when the spec has none

    def propose(self, history, n):
        seen = {config_key(h.params) for h in history}
        return [c for c in list(self.space)[::self.step] if config_key(c) not in seen][:n]


def register_walk():
    """Registration, as a plug-in strategy does it."""
    from runner.search.agents import register

    register("walk")(Walk)


def _spec(project, options, file: str = "walk.yaml") -> str:
    d = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())
    d.update(name="walk", baseline="none", goal={"budget": {"trials": 2}},
             agent={"strategy": "walk", "seed": 0, "options": options})
    d["runtime"]["rep_ms"] = 5
    d["op"]["shapes"] = FEW_ROWS  # what is checked is which points the strategy proposes
    d["search"].pop("start", None)
    p = project / "pipelines" / file
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return str(p)


def test_a_strategy_defined_here_validates_replays_and_runs(project, tmp_path, monkeypatch):
    monkeypatch.setitem(STRATEGIES, "walk", Walk)
    monkeypatch.setattr(Walk, "name", "walk", raising=False)
    ok = _spec(project, {"step": 2})
    assert load_spec(ok).agent.strategy == "walk"
    register_walk()  # as a plug-in does (the monkeypatches above undo it after the test)
    # validate, replay and run through the CLI's entry in this process (conftest.pipe_main)
    r = pipe_main("validate", ok, cwd=project)
    assert r.returncode == 0, r.stderr
    bad = _spec(project, {"step": -1}, "bad.yaml")
    r = pipe_main("validate", bad, cwd=project)
    assert r.returncode == 2 and "agent.options.step: expected a non-negative integer, got -1" in r.stderr
    # without the strategy (a fresh process), the spec names an unknown one
    r = subprocess.run([sys.executable, "-m", "runner.cli", "validate", ok], cwd=project, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "unknown strategy 'walk'" in r.stderr

    trials = [{"params": {"P": p}, "status": "ok", "reason": "", "times": [1.0 + abs(p - 7) * 0.1],
               "objective": 1.0 + abs(p - 7) * 0.1} for p in range(12)]
    ds = tmp_path / "twelve.json"
    ds.write_text(json.dumps({"format": "pipe-dataset/1", "spec": "twelve", "spec_hash": "x", "hardware": "cpu",
                              "params": {"P": list(range(12))}, "constraints": [], "shapes": [{"M": 1}],
                              "timed_shapes": 1, "trials": trials}))
    h = replay.run_once(dataset.load(ds), "walk", 0, stop_at=0.0)
    assert [x.params["P"] for x in h] == [0, 1, 2, 3, 4, 5, 6, 7]  # step 1 (the default) up to the best
    r = pipe_main("replay", str(ds), "--agent", "walk", "--seeds", "2", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "twelve: 12 valid configurations" in r.stdout and re.search(r"(?m)^walk\s", r.stdout)

    run_dir = project / "runs" / "walk"
    r = pipe_main("run", ok, "--run-dir", str(run_dir), "--no-hw-check", cwd=project)
    assert r.returncode in (0, 1), r.stderr
    led = Ledger.read(run_dir)
    try:
        got = led.trials()
    finally:
        led.close()
    space = load_spec(ok).space
    assert [t.agent for t in got] == ["walk", "walk"]
    assert [t.params for t in got] == list(space)[:4:2]  # every second point, in order
