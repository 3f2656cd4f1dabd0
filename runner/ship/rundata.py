"""A finished run as compare, export and report open it: its trials, variants and
baseline, compare.json when pipe compare has run, and the spec, which must still hash
to what the run recorded."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.errors import PipeError, RunDirError
from ..ledger.ledger import Ledger
from ..search.dataset import json_kind
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
    compare_sha256: str | None = None  # the sha256 of the compare.json bytes read
    compare_record: dict | None = None  # the ledger's last record of a compare.json pipe compare wrote
    compare_kept: bool = False  # whether the ledger records compare's writes (none from an older pipe)

    def compare_changed(self, run_dir: Path) -> str | None:
        """Why compare.json is not what pipe compare last wrote, or None (see compare_problem)."""
        return compare_problem(run_dir, self.compare_sha256, self.compare_record, self.compare_kept)


def open_run(run_dir: Path, spec_path: str | None, doing: str, read_compare: bool = True,
             force: bool = False) -> RunData:

    led = Ledger.read(run_dir, damaged_ok=True)
    try:
        history = guard(run_dir, led, force, doing).trials
        recorded = led.get_meta("spec_hash")
        path = spec_path or recorded_spec_path(run_dir, led.get_meta("spec_path"), led.get_meta("spec_abspath"),
                                               recorded)
        variants = {k: v["text"] for k, v in led.variants().items()}  # each checked against its id (guard)
        base = led.get_meta("baseline")
        records = led.compares() if read_compare else []
        kept = led.get_meta("compare_kept") is not None
    finally:
        led.close()
    if spec_path and not Path(spec_path).is_file():
        raise RunMismatch(f"--spec {spec_path}: no such file")
    spec = run_spec(path, recorded, run_dir, doing)
    compare, sha = read_compare_bytes(run_dir, None if spec.op.domain else len(spec.op.shapes)) if read_compare \
        else (None, None)
    return RunData(spec, history, variants, json.loads(base)["times"] if base else None, compare,
                   sha, records[-1] if records else None, kept)


def compare_problem(run_dir: Path, sha: str | None, record: dict | None, kept: bool) -> str | None:
    """Why RUN/compare.json (whose bytes hash to `sha`; None: there is none) is not the file
    pipe compare last wrote, by the ledger's last compare record (`record`), or None. A ledger
    made before compare's writes were recorded (`kept` false) and holding no record takes the
    file as it is (the run folders of an older pipe); any other without a record refuses it."""
    path = run_dir / "compare.json"
    if sha is None:
        return None
    if record is None:
        return (f"{path} has no record in the run's ledger (pipe compare records the sha256 of every compare.json "
                "it writes): run pipe compare again") if kept else None
    if record["sha256"] != sha:
        import time

        at = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["at"]))
        return (f"{path} was changed after pipe compare wrote it (sha256 {sha[:16]}, the ledger's compare record "
                f"#{record['id']} of {at} says {record['sha256'][:16]}): run pipe compare again")
    return None


def recorded_spec_path(run_dir: Path, recorded: str | None, absolute: str | None = None,
                       spec_hash: str | None = None) -> str | None:
    """Where a run's spec is now, from the path it recorded (relative to the folder the run started
    in): of that path from here, the absolute path the run recorded beside it and the recorded path
    under the run folder's parents (a run PROJECT/runs/NAME started in PROJECT), the first file
    whose spec hashes to `spec_hash` (the run's), else the first file found, else the recorded
    path. Whoever loads it checks its hash against the run's."""
    if not recorded:
        return recorded
    tries = [Path(recorded)] + ([Path(absolute)] if absolute else [])
    if not Path(recorded).is_absolute():
        tries += [up / recorded for up in Path(run_dir).resolve().parents]
    found = list(dict.fromkeys(str(t) for t in tries if t.is_file()))
    if spec_hash and len(found) > 1:
        for f in found:
            try:
                if load_spec(f).hash == spec_hash:
                    return f
            except Exception:  # a file of that name that is no spec of this run: the next one
                continue
    return found[0] if found else recorded


def run_spec(path: str, recorded: str | None, run_dir: Path, doing: str):
    """The spec at `path`, which must hash to what the run in `run_dir` recorded (RunMismatch)."""
    if path and not Path(path).is_file():
        raise RunMismatch(f"{path}: the spec the run in {run_dir} recorded is not found from here (a relative "
                          "path is taken from the folder the run started in): pass the spec with --spec PATH")
    spec = load_spec(path)
    if spec.hash != recorded:
        raise RunMismatch(f"{path}: not the spec of the run in {run_dir}: the spec, its template, profile or "
                          f"reference changed since the run (hash {spec.hash} != {recorded}); {doing} the kernels "
                          "as the run judged them: pass that spec with --spec, or start a new run")
    return spec


def read_compare_bytes(run_dir: Path, shapes: int | None = None) -> tuple[dict | None, str | None]:
    """RUN/compare.json and the sha256 of the bytes it parsed, (None, None) where pipe compare has
    not run. Its structure is checked here, once (check_compare): a damaged file is a RunDirError
    naming the file and the key path of the first problem. `shapes`, where given, is the number of
    timed shapes of the run's spec (a spec without op.domain), which compare.json must have as many of."""
    import hashlib

    path = run_dir / "compare.json"
    if not path.is_file():
        return None, None
    try:
        data = path.read_bytes()
        doc = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RunDirError(f"{path}: unreadable ({e}); run pipe compare again or remove it") from None
    if not isinstance(doc, dict) or doc.get("format") != "pipe-compare/1" or "shapes" not in doc:
        raise RunDirError(f"{path}: not a pipe compare result; run pipe compare again or remove it")
    why = check_compare(doc, shapes)
    if why:
        raise RunDirError(f"{path}: not a pipe compare result ({why}); run pipe compare again or remove it")
    return doc, hashlib.sha256(data).hexdigest()


# compare.json's structure: the fields that report, export and compare read, and their types.
# A check takes (value, key path) and returns "key.path: what is wrong", or None.
Check = Callable[[object, str], "str | None"]


def _key(path: str, k) -> str:
    return f"{path}.{k}" if re.fullmatch(r"[A-Za-z_][\w]*", str(k)) else f"{path}[{json.dumps(str(k))}]"


def _is(pred, what: str) -> Check:
    return lambda v, path: None if pred(v) else f"{path}: expected {what}, got {json_kind(v)}"


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


STR = _is(lambda v: isinstance(v, str), "a string")
NUM = _is(_number, "a number")
SECONDS = _is(lambda v: _number(v) and v > 0, "a positive number (seconds)")
INT = _is(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
OBJ = _is(lambda v: isinstance(v, dict), "an object")


def _null(c: Check) -> Check:
    """c, or null."""
    return lambda v, path: None if v is None else c(v, path)


def _list(item: Check, n: int | None = None) -> Check:
    def check(v, path):
        if not isinstance(v, list):
            return f"{path}: expected a list, got {json_kind(v)}"
        if n is not None and len(v) != n:
            return f"{path}: expected {n} entries, got {len(v)}"
        return next((w for i, x in enumerate(v) if (w := item(x, f"{path}[{i}]"))), None)
    return check


def _map(value: Check) -> Check:
    """An object of any keys, each value checked by `value`."""
    def check(v, path):
        if not isinstance(v, dict):
            return f"{path}: expected an object, got {json_kind(v)}"
        return next((w for k, x in v.items() if (w := value(x, _key(path, k)))), None)
    return check


def _obj(required: dict[str, Check], optional: dict[str, Check] | None = None) -> Check:
    """An object with these keys (others are let be)."""
    def check(v, path):
        if not isinstance(v, dict):
            return f"{path}: expected an object, got {json_kind(v)}"
        for k, c in required.items():
            if k not in v:
                return f"{_key(path, k)}: missing"
            if w := c(v[k], _key(path, k)):
                return w
        for k, c in (optional or {}).items():
            if k in v and (w := c(v[k], _key(path, k))):
                return w
        return None
    return check


_ARM = _obj({}, {"error": _null(STR), "time_s": _null(NUM), "tuned_speedup": _null(NUM),
                 "tuned_speedup_range": _null(_list(NUM, 2))})
_SHAPE = _obj({"label": STR, "arms": _map(_ARM),
               "tuned": _null(_obj({"trial": INT, "params": OBJ, "time_s": SECONDS},
                                   {"variant": _null(STR), "bytes_per_s": _null(NUM), "copy_fraction": _null(NUM),
                                    "limit_fraction": _null(NUM)}))},
              {"shape": OBJ})
_USE = _list(_is(lambda v: isinstance(v, (int, str)) and not isinstance(v, bool), "a trial id"))
_RANGE_TABLE = _obj({"axes": _list(STR), "ranges": _list(_obj({"lo": _map(NUM), "hi": _map(NUM), "use": _USE},
                                                                 {"rows": _list(_obj({"below": NUM, "use": _USE}))})),
                     "exact": _list(_obj({"shape": OBJ, "use": _USE}))})
_CURVE = _obj({"shape": _map(NUM), "bytes": NUM, "arms": _map(_ARM), "table_s": _null(NUM)},
              {"use": _null(STR), "regret": _null(NUM), "regret_range": _null(_list(NUM, 2)),
               "best_arm": _null(STR), "bytes_per_s": _null(NUM), "copy_fraction": _null(NUM)})
_HELD = _obj({"label": STR, "choice": STR, "choice_s": _null(NUM), "best": _null(STR), "best_s": _null(NUM),
              "regret": _null(NUM)}, {"via": _null(STR)})
_COMPARE = _obj({"shapes": _list(_SHAPE)},
                {"machine": _map(lambda v, path: None), "date": STR, "spec_hash": STR,
                 "range_table": _RANGE_TABLE, "curve": _null(_list(_CURVE)), "held_out": _null(_list(_HELD))})


def check_compare(doc, shapes: int | None = None) -> str | None:
    """The first way a parsed compare.json is not shaped as pipe compare writes it, as
    "key.path: what is wrong", else None. `shapes`: how many entries `shapes` must hold."""
    why = _COMPARE(doc, "")
    if why:
        return why.lstrip(".")
    if shapes is not None and len(doc["shapes"]) != shapes:
        return f"shapes: expected {shapes} entries (the spec's timed shapes), got {len(doc['shapes'])}"
    return None
