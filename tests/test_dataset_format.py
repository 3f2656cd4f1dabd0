"""Datasets are kept compact, one trial a line: the writer of `pipe record` and `pipe merge`
gives the committed files back byte for byte, and what it writes loads as it was."""

import json
from pathlib import Path

import pytest

from runner import cli
from runner.search import dataset

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "datasets").rglob("*.json"))
RECORDINGS = [f for f in FILES if json.loads(f.read_text()).get("format") == dataset.FORMAT]


def test_there_are_recordings_to_check():
    assert len(RECORDINGS) >= 4


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_writer_gives_the_committed_file_back(path):
    text = path.read_text()
    assert dataset.dumps(json.loads(text)) == text


def test_merge_writes_one_trial_a_line(tmp_path):
    src = ROOT / "datasets" / "rmsnorm-cpu.json"
    out = tmp_path / "m.json"
    assert cli.main(["merge", str(src), str(src), "--out", str(out)]) == cli.EXIT_OK
    lines = out.read_text().splitlines()
    data = json.loads(out.read_text())
    assert len(lines) == len(data["trials"]) + 3  # header, '"trials":[', the trials, ']}'
    assert all(ln.startswith('{"params":') for ln in lines[2:-1])
    assert dataset.load(out).results.keys() == dataset.load(src).results.keys()
