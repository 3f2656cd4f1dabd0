"""Bad run folders, bad options, interrupted and concurrent runs, stale outputs. The commands
go through the CLI's entry in the test's process (conftest.pipe_main), the judge in a worker
process of its own as ever; a second `pipe` on a busy run folder is a process of its own."""

import fcntl
import json
import sqlite3
import time

import pytest
import yaml

from runner.ledger.ledger import Ledger
from runner.core.records import Trial
from runner.spec.spec import load_spec

from .conftest import FEW_ROWS, PIPELINES, ROOT, has_cuda, pipe_main
from .test_cli_e2e import pipe

BASE = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())


def small_spec(project, **over) -> str:
    d = json.loads(json.dumps(BASE))
    d["name"] = "robust"
    d["goal"] = {"budget": {"trials": 3}}
    d["baseline"] = "none"
    d["runtime"]["rep_ms"] = 5
    d["op"]["shapes"] = FEW_ROWS
    d.update(over)
    p = project / "pipelines" / "robust.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return str(p)


def test_run_folder_that_is_a_file(project):
    f = project / "afile"
    f.write_text("x")
    for cmd in (("run", small_spec(project), "--run-dir", str(f)),
                ("eval", small_spec(project), "--params", "{}", "--run-dir", str(f))):
        r = pipe_main(*cmd, cwd=project)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "cannot be a run folder" in r.stderr


def test_corrupt_ledger_is_reported_not_raised(project):
    junk = project / "runs" / "junk"
    junk.mkdir(parents=True)
    (junk / "ledger.db").write_text("not sqlite at all " * 100)
    r = pipe_main("show", str(junk), cwd=project)
    assert r.returncode == 2 and "not a readable ledger" in r.stderr and "Traceback" not in r.stderr
    r = pipe_main("runs", "--root", str(project / "runs"), cwd=project)
    assert r.returncode == 0 and "unreadable" in r.stdout
    assert (junk / "ledger.db").read_text().startswith("not sqlite")  # show wrote nothing


def test_bad_budgets_and_agent_options(project):
    r = pipe_main("run", small_spec(project), "--max-trials", "0", cwd=project)
    assert r.returncode == 2 and "--max-trials must be a positive number" in r.stderr
    spec = small_spec(project, agent={"strategy": "tpe", "options": {"n_startup_trials": "many"}})
    r = pipe_main("validate", spec, cwd=project)
    assert r.returncode == 2 and "agent.options.n_startup_trials: expected a non-negative integer" in r.stderr
    spec = small_spec(project, agent={"strategy": "pattern", "options": {"shapes": "yes"}})
    r = pipe_main("validate", spec, cwd=project)
    assert r.returncode == 2 and "agent.options.shapes: expected one of 'off', 'alternate', got 'yes'" in r.stderr
    assert "Traceback" not in r.stderr
    # a key no strategy takes (a typo) is named, with the likeliest meant
    spec = small_spec(project, agent={"strategy": "tpe", "options": {"n_startup_trial": 3}})
    r = pipe_main("validate", spec, cwd=project)
    assert r.returncode == 2 and "agent.options.n_startup_trial: unknown option for the tpe agent; did you mean " \
        "'n_startup_trials'?" in r.stderr, r.stderr


def test_spec_hash_covers_profile_and_reference(project):
    spec = small_spec(project, hardware="host-cpu-copy")
    (project / "pipelines" / "hw_profiles").mkdir()
    prof = (ROOT / "hw_profiles" / "host-cpu.yaml").read_text().replace("name: host-cpu", "name: host-cpu-copy")
    (project / "pipelines" / "hw_profiles" / "host-cpu-copy.yaml").write_text(prof)
    h1 = load_spec(spec).hash
    (project / "pipelines" / "hw_profiles" / "host-cpu-copy.yaml").write_text(
        prof.replace("measured_bytes_per_s: 1.0e12", "measured_bytes_per_s: 2.0e12"))
    assert load_spec(spec).hash != h1


def test_interrupted_trial_is_tried_first_and_stale_best_is_repaired(project):
    spec = small_spec(project, agent={"strategy": "random", "seed": 5})
    run_dir = project / "run"
    r = pipe_main("run", spec, "--run-dir", str(run_dir), "--max-trials", "1", cwd=project)
    assert r.returncode == 1, r.stderr
    s = load_spec(spec)
    led = Ledger.open(run_dir, s.hash, s.name, s.path)
    # a kill just after the commit of a new best: the row is there, best/ still shows trial 1
    now = time.time()
    led.append(Trial(params={"ACC": 32, "THREADS": 1, "UNROLL": 4}, status="ok", kept=True, objective=1e-9,
                     times=[1e-9, 1e-9], spec_hash=s.hash, agent="test", started_at=now, finished_at=now))
    # and a kill during the next trial
    interrupted = {"ACC": 2, "THREADS": 1, "UNROLL": 2}
    led.begin(json.dumps(interrupted, sort_keys=True, separators=(",", ":")))
    led.close()
    assert json.loads((run_dir / "best" / "params.json").read_text())["trial"] == 1
    r = pipe_main("run", spec, "--run-dir", str(run_dir), "--max-trials", "3", cwd=project)
    assert r.returncode == 1, r.stderr
    rows = sqlite3.connect(run_dir / "ledger.db").execute("SELECT params FROM trials ORDER BY id").fetchall()
    assert json.loads(rows[2][0]) == interrupted  # retried before anything the agent proposes
    assert json.loads((run_dir / "best" / "params.json").read_text())["trial"] == 2


def test_one_process_per_run_folder(project):
    spec = small_spec(project)
    run_dir = project / "run"
    run_dir.mkdir()
    with open(run_dir / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = pipe("run", spec, "--run-dir", str(run_dir), cwd=project)
    assert r.returncode == 2 and "in use by another pipe process" in r.stderr


def test_a_list_of_starts_runs_first_in_order_and_is_built_ahead(project):
    """search.start as a list: those trials come before the agent's, in the spec's order, and
    each next one is compiled while the one before is judged (the agent never guesses them;
    the CPU backend builds ahead when PIPE_BUILD_AHEAD=1 asks)."""
    starts = [{"ACC": 8, "THREADS": 1, "UNROLL": 2}, {"ACC": 1, "THREADS": 1, "UNROLL": 4},
              {"ACC": 32, "THREADS": 1, "UNROLL": 1}]
    spec = small_spec(project, agent={"strategy": "pattern", "seed": 1},
                      search={**BASE["search"], "start": starts}, goal={"budget": {"trials": 4}})
    run_dir = project / "run"
    r = pipe_main("run", spec, "--run-dir", str(run_dir), cwd=project, env={"PIPE_BUILD_AHEAD": "1"})
    assert r.returncode == 1, r.stderr  # no goal to meet: the budget ends it
    rows = sqlite3.connect(run_dir / "ledger.db").execute("SELECT params, details FROM trials ORDER BY id").fetchall()
    assert [json.loads(p) for p, _ in rows[:3]] == starts and len(rows) == 4
    assert json.loads(rows[3][0]) not in starts
    assert [bool(json.loads(d).get("built_ahead")) for _, d in rows[1:3]] == [True, True]


def test_a_sweep_records_its_slice_only_whatever_the_starts(project, tmp_path):
    """pipe record takes no start configuration: with --only, a start outside the slice
    would otherwise be recorded in it (and push one of the slice's own out of the budget)."""
    starts = [{"ACC": 8, "THREADS": 1, "UNROLL": 2}, {"ACC": 32, "THREADS": 1, "UNROLL": 1}]
    spec = small_spec(project, search={**BASE["search"], "start": starts})
    out = tmp_path / "slice.json"
    r = pipe_main("record", spec, "--run-dir", str(project / "rec"), "--out", str(out),
                  "--only", "ACC=1", "--only", "THREADS=1", cwd=project)
    assert r.returncode == 0, r.stderr
    got = [t["params"] for t in json.loads(out.read_text())["trials"]]
    assert sorted(p["UNROLL"] for p in got) == [1, 2, 4]
    assert all(p["ACC"] == 1 and p["THREADS"] == 1 for p in got)


def test_eval_builds_nothing_ahead(project, tmp_path):
    """pipe eval judges one candidate: the spec's other starts are not compiled behind it."""
    starts = [{"ACC": 8, "THREADS": 1, "UNROLL": 2}, {"ACC": 1, "THREADS": 1, "UNROLL": 4},
              {"ACC": 32, "THREADS": 1, "UNROLL": 1}]
    spec = small_spec(project, search={**BASE["search"], "start": starts})
    cache = tmp_path / "cache"
    r = pipe_main("eval", spec, "--params", json.dumps(starts[0]), "--run-dir", str(project / "ev"), cwd=project,
                  env={"PIPE_BUILD_AHEAD": "1", "PIPE_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr
    built = [p for p in cache.rglob("*") if p.is_file() and p.suffix not in (".log", ".txt", ".json", ".sha256")]
    assert len({p.stem for p in built}) == 1, built


def test_a_run_that_stops_on_an_error_is_failed_not_interrupted(project):
    """A reference that fails on the spec's own shapes stops the run before any trial (exit 2);
    its folder then reads `failed` with the reason, not `interrupted` (which is a process gone)."""
    spec = small_spec(project)
    d = yaml.safe_load(open(spec))
    d["op"]["reference"] = "runner.ops.reference:softmax"  # takes x alone: fails on (x, w)
    d["baseline"] = "reference"  # timed first, before any trial
    open(spec, "w").write(yaml.safe_dump(d, sort_keys=False))
    r = pipe_main("run", spec, "-q", cwd=project)
    assert r.returncode == 2 and "before any trial" in r.stderr and "Traceback" not in r.stderr
    r = pipe_main("runs", "--root", str(project / "runs"), cwd=project)
    assert r.returncode == 0 and "failed" in r.stdout and "interrupted" not in r.stdout
    doc = json.loads((project / "runs" / "robust" / "run.json").read_text())
    assert doc["status"] == "failed" and "op.reference" in doc["stop"]
    r = pipe_main("show", str(project / "runs" / "robust"), cwd=project)
    assert r.returncode == 0 and "status failed" in r.stdout and "stopped on: " in r.stdout
    d["op"]["reference"] = "runner.ops.reference:rmsnorm"  # fixed: the folder holds another spec's run
    open(spec, "w").write(yaml.safe_dump(d, sort_keys=False))
    r = pipe_main("run", spec, "-q", cwd=project)
    assert r.returncode == 2 and "it holds no trial: remove it" in r.stderr


@pytest.mark.skipif(has_cuda(), reason="the point is a machine without a GPU (CI's)")
def test_no_hw_check_skips_the_profile_not_the_gpu(project, tmp_path):
    """--no-hw-check runs a CUDA spec on a GPU that differs from its profile; on a machine with no
    GPU at all it is refused before the run folder is made, in one line, not failed in the worker."""
    run = tmp_path / "run"
    r = pipe_main("run", str(PIPELINES / "softmax-h200.yaml"), "--no-hw-check", "--run-dir", str(run), cwd=project)
    assert r.returncode == 2 and "needs a CUDA GPU and none is available" in r.stderr and "Traceback" not in r.stderr
    assert "skips the match with the profile, not the GPU" in r.stderr and not run.exists()
