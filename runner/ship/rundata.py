"""A finished run as compare, export and report open it: its trials, variants and
baseline, compare.json when pipe compare has run, and the spec, which must still hash
to what the run recorded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import PipeError, RunDirError
from ..ledger.ledger import Ledger
from ..ledger.rundir import guard
from ..spec.spec import load_spec


class RunMismatch(PipeError):
    pass


@dataclass
class RunData:
    spec: object
    history: list
    variants: dict  # variant id -> template text
    baseline: list | None  # per-shape seconds of the recorded baseline
    compare: dict | None  # compare.json, when pipe compare has run


def open_run(run_dir: Path, spec_path: str | None, doing: str, read_compare: bool = True,
             force: bool = False) -> RunData:

    led = Ledger.read(run_dir, damaged_ok=True)
    try:
        history = guard(run_dir, led, force, doing).trials
        recorded = led.get_meta("spec_hash")
        path = spec_path or led.get_meta("spec_path")
        variants = {k: v["text"] for k, v in led.variants().items()}
        base = led.get_meta("baseline")
    finally:
        led.close()
    spec = load_spec(path)
    if spec.hash != recorded:
        raise RunMismatch(f"{path}: the spec, its template, profile or reference changed since the run in "
                          f"{run_dir} (hash {spec.hash} != {recorded}); {doing} the kernels as the run judged "
                          "them: pass that spec with --spec, or start a new run")
    compare = read_compare_json(run_dir) if read_compare else None
    return RunData(spec, history, variants, json.loads(base)["times"] if base else None, compare)


def read_compare_json(run_dir: Path) -> dict | None:
    path = run_dir / "compare.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunDirError(f"{path}: unreadable ({e}); run pipe compare again or remove it") from None
    if not isinstance(doc, dict) or doc.get("format") != "pipe-compare/1" or "shapes" not in doc:
        raise RunDirError(f"{path}: not a pipe compare result; run pipe compare again or remove it")
    return doc
