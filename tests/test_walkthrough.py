"""docs/first-pipeline.md: its example works from a folder outside the repo, from
another working folder, with no PYTHONPATH pointing at it; its shell commands name
files that exist."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT

DOC = ROOT / "docs" / "first-pipeline.md"
EXAMPLE = ROOT / "examples" / "layernorm"
OUTPUT_FLAGS = {"--run-dir", "--out", "--json"}  # their values are written, not read


def sh_commands() -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    return [shlex.split(ln) for b in blocks for ln in b.splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_walkthrough_has_commands_and_its_files_exist():
    cmds = sh_commands()
    assert len(cmds) >= 6
    assert {c[1] for c in cmds if c[0] == "pipe"} >= {"validate", "render", "run", "show", "report"}
    checked = 0
    for c in cmds:
        for prev, tok in zip(["", *c], c):
            if prev in OUTPUT_FLAGS or tok.startswith("-") or "=" in tok:
                continue
            if tok.startswith("runs/"):  # a run folder the walkthrough's own pipe run makes
                assert any("--run-dir" in x and tok in x for x in cmds), tok
                continue
            if "/" in tok or re.search(r"\.(yaml|py|j2|md|json)$", tok):
                assert (ROOT / tok).exists(), f"{shlex.join(c)}: {tok} does not exist"
                checked += 1
    assert checked >= 6


def test_the_walkthrough_names_the_judges_real_statuses():
    from runner.core.records import STATUSES

    text = DOC.read_text()
    for s in STATUSES:
        assert f"| `{s}` |" in text, s


def env_without_the_example() -> dict:
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    e["PYTHONPATH"] = str(ROOT)  # pipe itself, not the example
    return e


def pipe(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "runner", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env_without_the_example(), timeout=timeout)


@pytest.mark.slow
def test_the_example_runs_from_a_folder_of_its_own(tmp_path):
    folder = tmp_path / "ops" / "layernorm"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    cwd = tmp_path / "somewhere" / "else"
    cwd.mkdir(parents=True)
    spec = folder / "spec.yaml"

    r = pipe("validate", spec, cwd=cwd)
    assert r.returncode == 0, r.stderr
    r = pipe("render", spec, "--set", "ACC=8", "--shape", "extra:2", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert 'extern "C" void layernorm_cpu' in r.stdout and "acc[8]" in r.stdout
    r = pipe("render", spec, "--compile", cwd=cwd)
    assert r.returncode == 0 and r.stdout.startswith("compiles: "), r.stderr

    run_dir = cwd / "runs" / "ln"
    r = pipe("run", spec, "--max-trials", "4", "--run-dir", run_dir, "-q", cwd=cwd)
    assert r.returncode in (0, 1), r.stderr  # 1: the goal not met in 4 trials on a loaded machine
    assert "Traceback" not in r.stderr
    s = pipe("show", run_dir, "--json", cwd=cwd)
    assert s.returncode == 0, s.stderr
    summary = json.loads(s.stdout)
    assert summary["spec"] == "layernorm-cpu" and summary["ledger_intact"]
    assert 1 <= summary["trials"] <= 4
    assert summary["by_status"].get("ok", 0) >= 1, summary["by_status"]
    assert summary["best"] is not None
    r = pipe("show", run_dir, cwd=cwd)
    assert r.returncode == 0 and "best: trial #" in r.stdout
