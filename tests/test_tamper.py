"""Tamper evidence of a run folder: an edited row, a row deleted from the middle or
the end, a ledger file cut short and an edited run.json head are each found, with
the first row that cannot be trusted named; `pipe show` exits 1 and keeps forged rows
out of the best; `pipe runs` flags the run; `pipe run`, `pipe export` and `pipe report`
refuse the folder without --force and go on with it. Also: a run left `running` by a
killed process shows as interrupted, `show --json` keeps the run's stop and goal, and
a busy run folder is refused before torch is imported."""

import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from runner.core.errors import RunDirError
from runner.ledger.ledger import HEAD_NOTE, Ledger
from runner.core.records import Trial
from runner.ledger.rundir import check_folder

from .conftest import CPU_RUN_TRIALS, ROOT, pipe_main

pytestmark = pytest.mark.slow

TRIALS = CPU_RUN_TRIALS


def pipe(*args, cwd, env=None):
    """A `pipe` process: for a folder this test holds locked, which another process must find held."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=e)


def pipe_here(*args, cwd, env=None):
    """The CLI's entry in this process (conftest.pipe_main); a run's judge is still a worker process."""
    return pipe_main(*args, cwd=cwd, env=env)


@pytest.fixture
def base(shared_cpu_run):
    """One real CPU run of TRIALS trials (no goal target, so the budget ends it), made once for
    the whole test run (tests/conftest.py); each test tampers with a copy."""
    proj, _, returncode, stderr = shared_cpu_run
    assert returncode == 1, stderr  # the budget ends it
    env = {"PIPE_CACHE_DIR": os.environ["PIPE_CACHE_DIR"]}  # the run's shared cache (tests/conftest.py)
    return proj, env


@pytest.fixture
def run(base, tmp_path):
    """A copy of the base run, in the same project (the spec path it recorded still resolves)."""
    proj, env = base
    name = f"run-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{tmp_path.name}"  # the project is the run's, shared
    shutil.rmtree(proj / name, ignore_errors=True)
    shutil.copytree(proj / "base", proj / name)
    return proj, proj / name, env


def sql(run_dir, *stmts):
    db = sqlite3.connect(run_dir / "ledger.db")
    for s in stmts:
        db.execute(s)
    db.commit()
    db.close()


def chain_of(run_dir, row):
    db = sqlite3.connect(f"file:{run_dir}/ledger.db?mode=ro", uri=True)
    try:
        return db.execute("SELECT chain FROM trials WHERE id=?", (row,)).fetchone()[0]
    finally:
        db.close()


def check(run_dir):
    led = Ledger.read(run_dir, damaged_ok=True)
    try:
        return check_folder(run_dir, led)
    finally:
        led.close()


def show_json(proj, run_dir, env, run=None):
    r = (run or pipe_here)("show", str(run_dir), "--json", cwd=proj, env=env)
    assert "Traceback" not in r.stderr
    return r.returncode, json.loads(r.stdout)


def forge_best(run_dir, row):
    """Drop the trigger and make `row` a kept, impossibly fast trial."""
    sql(run_dir, "DROP TRIGGER trials_no_update",
        f"UPDATE trials SET objective=1e-9, kept=1, status='ok', times='[1e-9, 1e-9]' WHERE id={row}")


def delete(run_dir, row):
    sql(run_dir, "DROP TRIGGER trials_no_delete", f"DELETE FROM trials WHERE id={row}")


def assert_flagged(proj, run_dir, env, row, words):
    c = check(run_dir)
    assert not c.intact and c.first_bad_row == row and words in c.reason, c
    rc, s = show_json(proj, run_dir, env)
    assert rc == 1
    assert s["ledger"]["intact"] is False and s["ledger"]["first_bad_row"] == row and s["ledger_intact"] is False
    r = pipe_here("show", str(run_dir), cwd=proj, env=env)
    assert r.returncode == 1 and f"BROKEN at row {row}" in r.stdout, r.stdout
    return s


def test_intact_run(run):
    proj, run_dir, env = run
    c = check(run_dir)
    assert c.intact and c.rows == TRIALS and not c.note
    assert json.loads((run_dir / "run.json").read_text())["ledger_head"] == {"rows": TRIALS,
                                                                            "chain": chain_of(run_dir, TRIALS)}
    rc, s = show_json(proj, run_dir, env)
    assert rc == 0 and s["ledger"]["intact"] and s["ledger"]["first_bad_row"] is None
    # a finished run keeps its stop reason and goal in show --json
    assert s["stop"] == f"trial budget spent ({TRIALS})" and s["goal"] is not None
    assert s["status"] == s["stop"]


def test_edited_row_is_named_and_kept_out_of_the_best(run):
    proj, run_dir, env = run
    forge_best(run_dir, 3)
    s = assert_flagged(proj, run_dir, env, 3, "edited")
    assert s["best"] is None or s["best"]["trial"] < 3
    assert all(p is None or p["trial"] < 3 for p in s["best_per_shape"] or [])
    assert s["trials"] == TRIALS


def test_deleted_middle_row_is_named(run):
    proj, run_dir, env = run
    delete(run_dir, 2)
    assert_flagged(proj, run_dir, env, 2, "missing")


def test_deleted_last_row_is_named(run):
    proj, run_dir, env = run
    delete(run_dir, TRIALS)
    s = assert_flagged(proj, run_dir, env, TRIALS, "missing")
    assert s["trials"] == TRIALS - 1


def test_deleted_last_row_with_the_ledger_head_and_tsv_rewritten(run):
    """An attacker who edits ledger.db (its head record too) and trials.tsv, not run.json."""
    proj, run_dir, env = run
    delete(run_dir, TRIALS)
    head = json.dumps({"rows": TRIALS - 1, "chain": chain_of(run_dir, TRIALS - 1)})
    sql(run_dir, f"UPDATE meta SET value='{head}' WHERE key='head'")
    tsv = (run_dir / "trials.tsv").read_text().splitlines(True)
    (run_dir / "trials.tsv").write_text("".join(tsv[:-1]))
    s = assert_flagged(proj, run_dir, env, TRIALS, "run.json")
    assert "missing" in s["ledger"]["reason"]


def test_truncated_ledger_file_is_named(run):
    proj, run_dir, env = run
    path = run_dir / "ledger.db"
    ps = sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute("PRAGMA page_size").fetchone()[0]
    os.truncate(path, path.stat().st_size - ps)  # the last page cut off
    c = check(run_dir)
    assert not c.intact and c.first_bad_row is not None and 1 <= c.first_bad_row <= TRIALS
    rows_left = c.rows
    assert c.first_bad_row == rows_left + 1  # the first row that could not be read
    rc, s = show_json(proj, run_dir, env)
    assert rc == 1 and s["ledger"]["first_bad_row"] == c.first_bad_row
    r = pipe_here("show", str(run_dir), cwd=proj, env=env)
    assert r.returncode == 1 and f"row {c.first_bad_row}" in r.stdout and "Traceback" not in r.stderr
    # resuming names the row too
    r = pipe_here("run", "pipelines/rmsnorm-cpu.yaml", "--run-dir", str(run_dir), cwd=proj, env=env)
    assert r.returncode == 2 and f"row {c.first_bad_row}" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("edit", ["rows", "chain"])
def test_edited_run_json_head_is_named(run, edit):
    proj, run_dir, env = run
    doc = json.loads((run_dir / "run.json").read_text())
    if edit == "rows":
        doc["ledger_head"]["rows"] = TRIALS + 1
        row = TRIALS + 1
    else:
        doc["ledger_head"]["chain"] = "0" * 16
        row = TRIALS
    (run_dir / "run.json").write_text(json.dumps(doc))
    assert_flagged(proj, run_dir, env, row, "run.json")


def test_removed_run_json_anchor_is_flagged(run):
    proj, run_dir, env = run
    doc = json.loads((run_dir / "run.json").read_text())
    del doc["ledger_head"]
    (run_dir / "run.json").write_text(json.dumps(doc))
    c = check(run_dir)
    assert not c.intact and "no head anchor" in c.reason


def test_an_older_ledger_without_anchor_still_verifies(run):
    """A run folder from a pipe before the head anchor: its chain is checked, the limit said."""
    proj, run_dir, env = run
    sql(run_dir, "DELETE FROM meta WHERE key IN ('head', 'anchored')")
    doc = json.loads((run_dir / "run.json").read_text())
    del doc["ledger_head"]
    (run_dir / "run.json").write_text(json.dumps(doc))
    c = check(run_dir)
    assert c.intact and c.note == HEAD_NOTE
    r = pipe_here("show", str(run_dir), cwd=proj, env=env)
    assert r.returncode == 0 and "a deleted last row cannot be detected" in r.stdout
    forge_best(run_dir, 2)  # and an edit is still found
    assert check(run_dir).first_bad_row == 2


def test_resume_refused_without_force_and_goes_on_with_it(run):
    proj, run_dir, env = run
    forge_best(run_dir, 3)
    r = pipe_here("run", "pipelines/rmsnorm-cpu.yaml", "--run-dir", str(run_dir), "--max-trials", str(TRIALS + 1),
                  cwd=proj, env=env)
    assert r.returncode == 2 and "row 3" in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
    assert check(run_dir).rows == TRIALS  # nothing appended
    r = pipe_here("eval", "pipelines/rmsnorm-cpu.yaml", "--params", "{}", "--run-dir", str(run_dir), cwd=proj, env=env)
    assert r.returncode == 2 and "row 3" in r.stderr
    r = pipe_here("run", "pipelines/rmsnorm-cpu.yaml", "--run-dir", str(run_dir), "--max-trials", str(TRIALS + 1),
                  "--force", cwd=proj, env=env)
    assert r.returncode in (0, 1), r.stderr
    assert "ledger.broken" in r.stderr  # the warning
    c = check(run_dir)
    assert c.rows == TRIALS + 1
    # the damage stays found after the resume re-anchored the head
    assert not c.intact and c.first_bad_row == 3 and c.resumed_after == TRIALS
    rc, s = show_json(proj, run_dir, env)
    assert rc == 1 and s["ledger"]["first_bad_row"] == 3
    assert s["best"] is None or s["best"]["trial"] != 3


def test_export_and_report_refused_without_force(run):
    proj, run_dir, env = run
    delete(run_dir, 2)
    r = pipe_here("export", str(run_dir), "--out", str(run_dir / "exp"), cwd=proj, env=env)
    assert r.returncode == 2 and "row 2" in r.stderr and "--force" in r.stderr
    r = pipe_here("export", str(run_dir), "--out", str(run_dir / "exp"), "--force", cwd=proj, env=env)
    # past the ledger check: the CPU run then meets export's own limit
    assert r.returncode == 2 and "refusing" not in r.stderr and "only CUDA" in r.stderr
    assert "ledger.broken" in r.stderr  # the warning
    r = pipe_here("report", str(run_dir), "--out", str(run_dir / "rep"), cwd=proj, env=env)
    assert r.returncode == 2 and "row 2" in r.stderr and not (run_dir / "rep" / "report.md").exists()
    r = pipe_here("report", str(run_dir), "--out", str(run_dir / "rep"), "--force", cwd=proj, env=env)
    assert r.returncode == 0, r.stderr
    assert "BROKEN" in (run_dir / "rep" / "report.md").read_text()


def test_runs_flags_tampered_and_interrupted_runs(base, tmp_path):
    proj, env = base
    root = tmp_path / "runs"
    for name in ("good", "edited", "stopped", "busy"):
        shutil.copytree(proj / "base", root / name)
    forge_best(root / "edited", 4)
    for name in ("stopped", "busy"):
        doc = json.loads((root / name / "run.json").read_text())
        doc["status"] = "running"  # what a run killed by Ctrl-C or kill -9 leaves
        (root / name / "run.json").write_text(json.dumps(doc))
    with open(root / "busy" / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = pipe("runs", "--root", str(root), cwd=proj, env=env)
        rc, s_busy = show_json(proj, root / "busy", env, run=pipe)
    rc, s_stopped = show_json(proj, root / "stopped", env)
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0].rsplit("/", 1)[-1]: ln for ln in r.stdout.splitlines()[1:]}
    assert "TAMPERED (row 4)" in lines["edited"]
    assert "interrupted" in lines["stopped"]
    assert "running" in lines["busy"] and "interrupted" not in lines["busy"]
    assert "TAMPERED" not in lines["good"] and "interrupted" not in lines["good"]
    assert s_busy["status"] == "running" and s_stopped["status"] == "interrupted"


def test_busy_folder_refused_before_torch_is_imported(run):
    """The refusal comes before the spec is loaded (which imports torch): checked in the process."""
    proj, run_dir, env = run
    code = ("import sys; from runner.cli import main; rc = main(sys.argv[1:]); "
            "print('rc', rc, 'torch', 'torch' in sys.modules)")
    with open(run_dir / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        outs = [subprocess.run([sys.executable, "-c", code, cmd, "pipelines/rmsnorm-cpu.yaml", *extra,
                                "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120,
                               cwd=proj, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
                for cmd, extra in (("run", []), ("eval", ["--params", "{}"]), ("record", []))]
    for r in outs:
        assert "rc 2 torch False" in r.stdout, (r.stdout, r.stderr)
        assert "in use by another pipe process" in r.stderr


def test_busy_default_folder_refused_before_torch(run):
    proj, run_dir, env = run
    default = proj / "runs" / "rmsnorm-cpu"
    default.mkdir(parents=True, exist_ok=True)
    code = ("import sys; from runner.cli import main; rc = main(['run', 'pipelines/rmsnorm-cpu.yaml']); "
            "print('rc', rc, 'torch', 'torch' in sys.modules)")
    with open(default / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=proj,
                           env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert "rc 2 torch False" in r.stdout, (r.stdout, r.stderr)


# Ledgers built with the Ledger API alone (no run folder around them)

def _trial(i):
    return Trial(params={"A": i}, status="ok", times=[1e-3 * i], objective=1e-3 * i, spec_hash="h1", agent="t",
                 started_at=float(i), finished_at=float(i) + 1)


@pytest.mark.parametrize("cut", ["last", "two-last"])
def test_ledger_head_record_finds_deleted_last_rows(tmp_path, cut):
    led = Ledger.open(tmp_path, "h1", "s", "s.yaml")
    for i in range(1, 6):
        led.append(_trial(i))
    assert led.verify().intact
    led.db.execute("DROP TRIGGER trials_no_delete")
    led.db.execute("DELETE FROM trials WHERE id >= ?", (5 if cut == "last" else 4,))
    c = led.verify()
    assert not c.intact and c.first_bad_row == (5 if cut == "last" else 4) and "head" in c.reason
    led.db.execute("DELETE FROM meta WHERE key='head'")  # and the head record with them
    c = led.verify()
    assert not c.intact and "head record was removed" in c.reason
    led.close()


def test_ledger_row_added_outside_pipe_is_named(tmp_path):
    led = Ledger.open(tmp_path, "h1", "s", "s.yaml")
    for i in range(1, 4):
        led.append(_trial(i))
    head = led.get_meta("head")
    led.append(_trial(4))
    led.set_meta("head", head)  # a row appended without its head: as if inserted by hand
    c = led.verify()
    assert not c.intact and c.first_bad_row == 4 and "added outside" in c.reason
    led.close()


def test_unreadable_ledger_is_still_an_error_without_traceback(tmp_path):
    (tmp_path / "ledger.db").write_bytes(b"not sqlite" * 100)
    with pytest.raises(RunDirError, match="not a readable ledger"):
        Ledger.read(tmp_path, damaged_ok=True)
