"""The commands that work on a run folder after its run. compare, export and report find the
run's spec from any folder: the path the run recorded is relative to the folder it started in,
so they also try the absolute path recorded beside it and the recorded path under the run
folder's parents; where none is found, the error says to name the spec with --spec. A new
`pipe record` does not replace a dataset recorded earlier. `pipe eval` on a finished run leaves
its status as the run ended it. `pipe show` says when the limit is a profile's bound, not measured."""

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from runner.ledger.ledger import Ledger
from runner.ship.rundata import RunMismatch, open_run, recorded_spec_path
from runner.spec.spec import load_spec

from .conftest import PIPELINES, ROOT


def project(root: Path) -> Path:
    """A project folder with the CPU example's spec in pipelines/ and the repo's templates and
    profiles linked, and an (empty) run of it started there as `pipe run pipelines/... --run-dir
    runs/base` would: the ledger records the relative spec path."""
    (root / "pipelines").mkdir(parents=True)
    for d in ("kernel_templates", "hw_profiles"):
        os.symlink(ROOT / d, root / d)
    shutil.copy(PIPELINES / "rmsnorm-cpu.yaml", root / "pipelines" / "rmsnorm-cpu.yaml")
    here = os.getcwd()
    os.chdir(root)
    try:
        spec = load_spec("pipelines/rmsnorm-cpu.yaml")
        Ledger.open(Path("runs/base"), spec.hash, spec.name, "pipelines/rmsnorm-cpu.yaml").close()
    finally:
        os.chdir(here)
    return root / "runs" / "base"


def forget_absolute(run: Path) -> None:  # a run recorded before the absolute path was
    db = sqlite3.connect(run / "ledger.db")
    db.execute("DELETE FROM meta WHERE key='spec_abspath'")
    db.commit()
    db.close()


def test_the_spec_is_found_from_another_folder(tmp_path, monkeypatch):
    run = project(tmp_path / "proj")
    monkeypatch.chdir(tmp_path)  # not the project: the recorded relative path does not resolve here
    want = str((tmp_path / "proj" / "pipelines" / "rmsnorm-cpu.yaml").resolve())
    assert recorded_spec_path(run, "pipelines/rmsnorm-cpu.yaml", want) == want
    rd = open_run(run, None, "compare times")
    assert rd.spec.name == "rmsnorm-cpu" and rd.history == []
    forget_absolute(run)  # then the run folder's parents: the project holds it
    assert Path(recorded_spec_path(run, "pipelines/rmsnorm-cpu.yaml")).resolve() == Path(want)
    assert open_run(run, None, "compare times").spec.name == "rmsnorm-cpu"


def test_of_several_files_at_the_recorded_path_the_runs_own_spec_is_taken(tmp_path, monkeypatch):
    """Another project's file of the same relative path (an edited spec) is no reason to refuse:
    the absolute path the run recorded holds the spec whose hash the run has."""
    run = project(tmp_path / "proj")
    other = tmp_path / "other" / "pipelines"
    other.mkdir(parents=True)
    (other / "rmsnorm-cpu.yaml").write_text((PIPELINES / "rmsnorm-cpu.yaml").read_text().replace(
        "patience: 16", "patience: 17"))  # another hash
    monkeypatch.chdir(tmp_path / "other")
    assert open_run(run, None, "compare times").spec.goal.patience == 16
    with pytest.raises(RunMismatch, match="--spec nowhere.yaml: no such file"):
        open_run(run, "nowhere.yaml", "compare times")


def test_a_spec_found_nowhere_asks_for_spec(tmp_path, monkeypatch):
    run = project(tmp_path / "proj")
    forget_absolute(run)
    moved = shutil.move(str(run), str(tmp_path / "elsewhere"))  # no parent of it holds pipelines/
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunMismatch, match="--spec"):
        open_run(Path(moved), None, "compare times")
    assert open_run(Path(moved), str(tmp_path / "proj" / "pipelines" / "rmsnorm-cpu.yaml"),
                    "compare times").spec.name == "rmsnorm-cpu"  # named: found


@pytest.mark.slow  # 15 to 34 s of the quick suite, which CI keeps under 10 minutes
def test_a_new_sweep_does_not_replace_a_recorded_dataset(tmp_path):
    """`pipe record SPEC` with no --out writes datasets/<name>.json: a new sweep where that file
    exists (the replay bench's own) is refused before anything is judged, and the file is kept."""
    from .conftest import pipe_main

    proj = tmp_path / "proj"
    project(proj)
    (proj / "datasets").mkdir()
    kept = proj / "datasets" / "rmsnorm-cpu.json"
    kept.write_text('{"recorded": "earlier"}')
    r = pipe_main("record", "pipelines/rmsnorm-cpu.yaml", "--run-dir", "runs/sweep", cwd=proj)
    assert r.returncode == 2 and "--out" in r.stderr and "Traceback" not in r.stderr
    assert kept.read_text() == '{"recorded": "earlier"}' and not (proj / "runs" / "sweep").exists()
    one = ["--only", "ACC=1", "--only", "UNROLL=1", "-q"]
    r = pipe_main("record", "pipelines/rmsnorm-cpu.yaml", "--run-dir", "runs/sweep", "--out", "mine.json", *one,
                  cwd=proj)
    assert r.returncode == 0, r.stderr[-2000:]
    # that run folder resumed with no --out: it wrote mine.json, not the default, which stays
    r = pipe_main("record", "pipelines/rmsnorm-cpu.yaml", "--run-dir", "runs/sweep", *one, cwd=proj)
    assert r.returncode == 2 and kept.read_text() == '{"recorded": "earlier"}'
    kept.unlink()  # a sweep that wrote the default itself rewrites it when resumed
    r = pipe_main("record", "pipelines/rmsnorm-cpu.yaml", "--run-dir", "runs/own", *one, cwd=proj)
    assert r.returncode == 0 and kept.exists()
    r = pipe_main("record", "pipelines/rmsnorm-cpu.yaml", "--run-dir", "runs/own", *one, cwd=proj)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.slow  # 17 s of the quick suite (two pipe evals), which CI keeps under 10 minutes
def test_eval_on_a_finished_run_keeps_its_status(tmp_path):
    from .conftest import pipe_main

    run = project(tmp_path / "proj")
    (run / "run.json").write_text(json.dumps({"status": "goal met", "stop": "goal met"}))
    r = pipe_main("eval", "pipelines/rmsnorm-cpu.yaml", "--params", '{"ACC": 4, "THREADS": 1, "UNROLL": 1}',
                  "--run-dir", "runs/base", cwd=tmp_path / "proj")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((run / "run.json").read_text())
    assert (doc["status"], doc["stop"], doc["trials"]) == ("goal met", "goal met", 1)
    r = pipe_main("eval", "pipelines/rmsnorm-cpu.yaml", "--params", '{"ACC": 4, "THREADS": 1, "UNROLL": 1}',
                  "--run-dir", "runs/new", cwd=tmp_path / "proj")
    assert r.returncode == 0 and json.loads((run.parent / "new" / "run.json").read_text())["status"] == "eval"
    # the host CPU's limit is an upper bound of its profile, not a measurement: pipe show says so
    r = pipe_main("show", "runs/new", cwd=tmp_path / "proj")
    assert r.returncode == 0 and "of the limit (the profile's upper bound, not measured)" in r.stdout, r.stdout
    r = pipe_main("show", str(ROOT / "tests" / "data" / "softmax-h200-run"), cwd=ROOT)  # an H200's, measured
    assert r.returncode == 0 and "of the limit" in r.stdout and "not measured" not in r.stdout, r.stdout
