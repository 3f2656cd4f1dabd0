"""Run folders and command-line values a user gets wrong: refused with a clear message, the
folder left as it was found (an audit of session 39 found each of these)."""

from __future__ import annotations

import json

import pytest

from runner.core.errors import RunDirError
from runner.ledger.ledger import Ledger

from .conftest import PIPELINES, ROOT, pipe_main


def test_a_folder_of_another_spec_with_its_ledger_gone_is_not_stamped(tmp_path):
    """run.json names another spec and ledger.db is missing or empty: refused before a ledger
    is created or stamped (the folder would then read as this spec's run)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"spec": "layernorm-cpu", "spec_hash": "aaaa"}))
    for state in ("missing", "empty"):
        if state == "empty":
            (run / "ledger.db").write_bytes(b"")
        with pytest.raises(RunDirError, match="holds a run of another spec .layernorm-cpu"):
            Ledger.open(run, "bbbb", "rmsnorm-cpu", "spec.yaml")
        assert sorted(p.name for p in run.iterdir()) == (["run.json"] if state == "missing"
                                                           else ["ledger.db", "run.json"])
        assert (run / "ledger.db").exists() is (state == "empty") and not (run / "ledger.db-wal").exists()
    # the same spec's folder is opened as before (the ledger's own check then judges it)
    (run / "ledger.db").unlink()
    Ledger.open(run, "aaaa", "layernorm-cpu", "spec.yaml").close()


def test_reading_a_ledger_leaves_nothing_beside_it(tmp_path):
    run = tmp_path / "run"
    Ledger.open(run, "aaaa", "x", "spec.yaml").close()
    before = sorted(p.name for p in run.iterdir())
    led = Ledger(run / "ledger.db", readonly=True)
    assert led.get_meta("spec_hash") == "aaaa"
    led.close()
    assert sorted(p.name for p in run.iterdir()) == before == ["ledger.db"]
    r = pipe_main("show", str(run), cwd=ROOT)
    assert sorted(p.name for p in run.iterdir()) == before, r.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_budget_that_is_no_positive_number_is_refused(tmp_path, value):
    r = pipe_main("run", str(PIPELINES / "rmsnorm-cpu.yaml"), "--run-dir", str(tmp_path / "r"), "--minutes", value,
                  cwd=ROOT)
    assert r.returncode == 2 and "--minutes must be a positive number" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "r").exists()


def test_a_variant_file_that_is_not_text_is_refused(tmp_path):
    bad = tmp_path / "v.cpp.j2"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    r = pipe_main("eval", str(PIPELINES / "rmsnorm-cpu.yaml"), "--run-dir", str(tmp_path / "r"),
                  "--params", json.dumps({"ACC": 1, "THREADS": 1, "UNROLL": 1}), "--variant", str(bad), cwd=ROOT)
    assert r.returncode == 2 and "not UTF-8 text" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_parameter_of_too_many_values_is_one_spec_error(tmp_path):
    """A `range` expands into every value: 10^8 of them loaded for minutes. Refused at its key,
    and the template's use of the parameter is no second error."""
    text = (PIPELINES / "rmsnorm-cpu.yaml").read_text()
    assert "ACC: {pow2: {min: 1, max: 32}}" in text
    text = text.replace("ACC: {pow2: {min: 1, max: 32}}", "ACC: {range: {min: 1, max: 100000000, step: 1}}")
    text = text.replace("template: kernel_templates/", f"template: {ROOT}/kernel_templates/")
    (tmp_path / "huge.yaml").write_text(text)
    r = pipe_main("validate", str(tmp_path / "huge.yaml"), cwd=ROOT)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "search.params.ACC.range: 100000000 values; a parameter takes at most" in errors[0]
    assert errors[0].startswith(f"{tmp_path / 'huge.yaml'}:"), errors


@pytest.mark.parametrize("args, needle", [
    (["render", str(PIPELINES / "rmsnorm-cpu.yaml"), "--set", "=1"], "--set =1: expected NAME=VALUE"),
    (["runs", "--root", "{tmp}/nothing"], "is no folder"),
    (["runs", "--root", "{tmp}/file"], "is a file, not a folder"),
    (["replay", str(ROOT / "datasets" / "softmax-h200.json"), "--seeds", "0"], "--seeds: 0 is not a positive"),
    (["compare", "{tmp}/run", "--points", "-5"], "--points: -5 is not a positive"),
    (["run", str(PIPELINES / "rmsnorm-cpu.yaml"), "--run-dir", "{tmp}/file"], "it is a file, not a folder"),
])
def test_values_and_folders_that_cannot_be_used_are_named(tmp_path, args, needle):
    (tmp_path / "file").write_text("x")
    r = pipe_main(*[x.replace("{tmp}", str(tmp_path)) for x in args], cwd=ROOT)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_refused_command_leaves_no_folder_it_made_for_its_output(tmp_path):
    """report --out on a run folder that is refused: the output folder made to check that it
    can be written is removed again (it was left empty)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "ledger.db").write_text("not sqlite")
    out = tmp_path / "a" / "b" / "report"
    r = pipe_main("report", str(run), "--out", str(out), cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()


def test_a_spec_named_for_a_report_must_be_readable_and_the_runs(tmp_path):
    """report --spec with a missing file, or another run's spec: an error, not a report that
    says the spec no longer matches."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "softmax-h200-run", run)
    r = pipe_main("report", str(run), "--out", str(tmp_path / "o1"), "--spec", str(tmp_path / "nope.yaml"), cwd=ROOT)
    assert r.returncode == 2 and "nope.yaml" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = pipe_main("report", str(run), "--out", str(tmp_path / "o2"), "--spec", str(PIPELINES / "rmsnorm-cpu.yaml"),
                  cwd=ROOT)
    assert r.returncode == 2 and "not the spec of the run" in r.stderr, r.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_no_runs_folder_yet_is_no_runs(tmp_path):
    r = pipe_main("runs", cwd=tmp_path)  # the default root, runs/, not made yet
    assert r.returncode == 0 and "no run folders" in r.stdout, (r.stdout, r.stderr)
