"""Recorded spaces: every configuration of a spec's space with its verdict.

`pipe record SPEC` runs the grid over the whole space (no goal, no keep
decisions) and `export` writes what the ledger holds as a dataset:

    {"format": "pipe-dataset/1", "spec": ..., "spec_hash": ..., "created": ...,
     "machine": {"gpu": ..., "torch": ..., ...},
     "params": {NAME: [values in domain order], ...},
     "constraints": [expr, ...], "shapes": [{symbol: value}, ...],
     "trials": [{"params": {...}, "status": "ok", "reason": "", "times": [s per shape],
                 "objective": geometric-mean seconds or null}, ...]}

`load` rebuilds the Space from the dataset alone, so `pipe replay` needs
neither the spec nor a GPU.

`merge` (`pipe merge`) joins datasets of one spec recorded in parts (`pipe
record --only`): the union of the parameter values and of the trials, the later
file winning a configuration both hold. Each trial gains "part" (the index of the
file it came from) and the dataset a "parts" list ({"file", "created", "machine",
"trials": contributed, "recorded": held}); `load` ignores both.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import ExprError, PipeError
from ..core.expr import compile_expr
from .space import Param, Space, config_key

FORMAT = "pipe-dataset/1"


def machine() -> dict:
    out = {"python": platform.python_version(), "host": platform.machine()}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
            out["driver_cuda"] = torch.version.cuda
    except Exception:
        pass
    try:
        import cuda.core

        out["cuda_core"] = cuda.core.__version__
    except Exception:
        pass
    if "gpu" not in out:
        out["cpu"] = platform.processor() or platform.machine()
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def export(spec, trials) -> dict:
    return {
        "format": FORMAT,
        "spec": spec.name,
        "spec_hash": spec.hash,
        "hardware": spec.hw.name,
        "created": _now(),
        "machine": machine(),
        "params": {p.name: list(p.values) for p in spec.space.params},
        "constraints": [c.text for c in spec.space.constraints],
        "shapes": list(spec.op.all_shapes),
        "timed_shapes": len(spec.op.shapes),
        "trials": [{"params": t.params, "status": t.status, "reason": t.reason, "times": t.times,
                    "objective": t.objective,
                    # a verdict carried over from an earlier sweep (pipe record --reuse): where it was judged
                    **({"reused_from": t.details["reused_from"]} if "reused_from" in t.details else {})}
                   for t in trials],
    }


@dataclass
class Dataset:
    path: str
    data: dict
    space: Space
    results: dict  # config key -> trial dict

    @property
    def best(self) -> float:
        """The fastest correct configuration that is a point of the rebuilt space."""
        ok = [t["objective"] for t in self.results.values()
              if t["status"] == "ok" and t["objective"] is not None and self.space.contains(t["params"]) is None]
        if not ok:
            raise ValueError(f"{self.path}: no correct, timed configuration in the dataset")
        return min(ok)

    def lookup(self, cfg: dict) -> dict:
        return self.results.get(config_key(cfg), {"params": cfg, "status": "missing", "reason": "not recorded",
                                                  "times": None, "objective": None})


def dumps(data: dict) -> str:
    """A dataset as the files in datasets/ are kept: compact JSON, the header on the first
    line and one trial a line (small, and a diff of two recordings reads trial by trial)."""
    head = {k: v for k, v in data.items() if k != "trials"}
    text = json.dumps(head, separators=(",", ":"))[:-1]
    trials = ",\n".join(json.dumps(t, separators=(",", ":")) for t in data.get("trials", []))
    return text + (',\n"trials":[\n' + trials + "\n]}\n" if "trials" in data else "}\n")


class DatasetError(PipeError, ValueError):
    """A file that is not a readable pipe-dataset/1 dataset. `why` says what is wrong, with the
    key path where the file is JSON of the wrong shape (`trials[3].params: expected an object,
    got a string`); str() puts the file's path first."""

    def __init__(self, path, why: str):
        self.path, self.why = str(path), why
        super().__init__(f"{path}: {why}")


def json_kind(v) -> str:
    """What a JSON value is, for a message ("a string", "null", the number itself)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return repr(v)  # the number itself: "expected a positive number, got -1"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(v), type(v).__name__)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _time(v) -> bool:
    return _number(v) and v > 0


def check(data) -> str | None:
    """The first way `data` (a parsed JSON document) is not shaped like a dataset, as
    "key.path: what is wrong", else None: the type of every field that load, replay and merge
    read, so that a damaged file is refused here, by name, and nowhere later."""
    def bad(path: str, expected: str, v) -> str:
        return f"{path}: expected {expected}, got {json_kind(v)}"

    if not isinstance(data, dict):
        return f"expected a JSON object at the top, got {json_kind(data)}"
    if "format" not in data:
        return "format: missing"
    if data["format"] != FORMAT:
        return f"format: expected {_short(FORMAT)}, got {_short(data['format'])}"
    for k in ("params", "constraints", "shapes", "trials"):
        if k not in data:
            return f"{k}: missing"
    for k in ("spec", "spec_hash", "hardware", "created"):
        if k in data and not isinstance(data[k], str):
            return bad(k, "a string", data[k])
    if "machine" in data and not isinstance(data["machine"], (dict, type(None))):
        return bad("machine", "an object", data["machine"])
    params = data["params"]
    if not isinstance(params, dict):
        return bad("params", "an object (parameter name: list of values)", params)
    for name, vals in params.items():
        if not isinstance(vals, list):
            return bad(f"params.{name}", "a list of values", vals)
        if not vals:
            return f"params.{name}: expected a list of values, got an empty list"
        for i, v in enumerate(vals):
            if not isinstance(v, (str, bool)) and not _number(v):
                return bad(f"params.{name}[{i}]", "a number, string or boolean", v)
    if not isinstance(data["constraints"], list):
        return bad("constraints", "a list of expressions", data["constraints"])
    for i, c in enumerate(data["constraints"]):
        if not isinstance(c, str):
            return bad(f"constraints[{i}]", "a string (an expression)", c)
    shapes = data["shapes"]
    if not isinstance(shapes, list):
        return bad("shapes", "a list of objects (symbol: size)", shapes)
    for i, shape in enumerate(shapes):
        if not isinstance(shape, dict):
            return bad(f"shapes[{i}]", "an object (symbol: size)", shape)
        for k, v in shape.items():
            if not _number(v):
                return bad(f"shapes[{i}].{k}", "a number", v)
    timed = data.get("timed_shapes", len(shapes))
    if not isinstance(timed, int) or isinstance(timed, bool) or not 0 <= timed <= len(shapes):
        return (bad("timed_shapes", "an integer", timed) if not isinstance(timed, int) or isinstance(timed, bool)
                else f"timed_shapes: expected 0 to {len(shapes)} (the number of shapes), got {timed}")
    trials = data["trials"]
    if not isinstance(trials, list):
        return bad("trials", "a list of objects", trials)
    for i, t in enumerate(trials):
        at = f"trials[{i}]"
        if not isinstance(t, dict):
            return bad(at, "an object", t)
        for k in ("params", "status", "objective"):
            if k not in t:
                return f"{at}.{k}: missing"
        if not isinstance(t["params"], dict):
            return bad(f"{at}.params", "an object", t["params"])
        if not isinstance(t["status"], str):
            return bad(f"{at}.status", "a string", t["status"])
        if "reason" in t and not isinstance(t["reason"], (str, type(None))):
            return bad(f"{at}.reason", "a string", t["reason"])
        if t["objective"] is not None and not _time(t["objective"]):
            return bad(f"{at}.objective", "a positive number or null", t["objective"])
        times = t.get("times")
        if times is None:
            continue
        if not isinstance(times, list):
            return bad(f"{at}.times", "a list of seconds per shape, or null", times)
        if len(times) < timed:
            return f"{at}.times: expected a time for each of the {timed} timed shapes, got {len(times)}"
        for j, x in enumerate(times):
            if x is not None and not _time(x):  # null: a shape the configuration does not serve
                return bad(f"{at}.times[{j}]", "a positive number (seconds) or null", x)
    return None


def load(path: str | Path) -> Dataset:
    """The dataset at `path`, its structure checked (check). Raises DatasetError, which names
    the file and the key path of the first problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise DatasetError(path, f"cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise DatasetError(path, "not a dataset (not UTF-8 text)") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise DatasetError(path, f"not a dataset (not readable as JSON: {e})") from None
    why = check(data)
    if why:
        raise DatasetError(path, f"not a {FORMAT} dataset: {why}")
    params = tuple(Param(k, tuple(v)) for k, v in data["params"].items())
    symbols = {k for shape in data["shapes"] for k in shape}
    cons = []
    for i, c in enumerate(data["constraints"]):
        try:
            cons.append(compile_expr(c, set(data["params"]) | symbols))
        except ExprError as e:
            raise DatasetError(path, f"not a {FORMAT} dataset: constraints[{i}]: {e}") from None
    space = Space(params, tuple(cons), tuple(data["shapes"]) or ({},))
    results = {config_key(t["params"]): t for t in data["trials"]}
    return Dataset(str(path), data, space, results)


# Fields that must be the same in every part of a merge: the parts are one space's subspaces.
SAME = ("format", "spec", "spec_hash", "hardware", "shapes", "timed_shapes", "constraints")


class MergeError(PipeError, ValueError):
    """An input of `merge` that cannot be read or does not belong with the others."""


@dataclass
class Merged:
    data: dict  # the merged dataset, as `export` writes one (plus "parts" and each trial's "part")
    overlap: int = 0  # pairs (configuration, the earlier file it replaces) seen in more than one file
    differ: int = 0  # of those, how many have different statuses
    ratios: list[list[float]] = field(default_factory=list)  # per timed shape: later time / earlier time


def _short(v, n: int = 60) -> str:
    r = json.dumps(v, sort_keys=True)
    return r if len(r) <= n else r[:n - 3] + "..."


def _timed(t: dict, k: int) -> list[float] | None:
    times = t.get("times")
    if t.get("status") != "ok" or not isinstance(times, list) or len(times) < k:
        return None
    times = times[:k]
    if not all(isinstance(x, (int, float)) and x > 0 for x in times):
        return None
    return times


def _same_file(a, b) -> bool:
    try:
        return Path(a).samefile(b)
    except OSError:
        return False


def merge(paths: list[str], out: str | None = None) -> Merged:
    """The datasets at `paths` as one: parameter values and trials joined; a configuration
    in several files takes the trial of the last of them. `out`, where given, is the file the
    caller will write, refused where it is one of the inputs. Raises MergeError."""
    if len(paths) < 2:
        raise MergeError("give at least two datasets to merge")
    datas = []
    for p in paths:
        if not Path(p).is_file():
            raise MergeError(f"{p}: a folder, not a dataset file" if Path(p).is_dir() else f"{p}: no such dataset")
        if out is not None and _same_file(p, out):
            raise MergeError(f"--out {out}: is the input {p}; write the merge to a new file")
        try:
            datas.append(load(p).data)  # the same checks `pipe replay` makes
        except DatasetError as e:  # JSON of the wrong shape: the key path says where; unreadable: why
            raise MergeError(str(e) if e.why.startswith(f"not a {FORMAT}") else
                             f"{p}: cannot load as a dataset: {e.why}") from None
    first = datas[0]
    for p, d in zip(paths[1:], datas[1:]):
        for k in SAME:
            if d.get(k) != first.get(k):
                raise MergeError(f"{paths[0]} and {p} differ in {k!r}: "
                                 f"{_short(first.get(k))} against {_short(d.get(k))}")
        if set(d["params"]) != set(first["params"]):
            only_a = sorted(set(first["params"]) - set(d["params"]))
            only_b = sorted(set(d["params"]) - set(first["params"]))
            raise MergeError(f"{paths[0]} and {p} differ in 'params': parameters only in the first: "
                             f"{', '.join(only_a) or 'none'}; only in the second: {', '.join(only_b) or 'none'}")

    params = {}
    for name in first["params"]:
        lists = [d["params"][name] for d in datas]
        base = max(range(len(lists)), key=lambda i: (len(lists[i]), -i))  # the longest; the first of equals
        vals = list(lists[base])
        seen = {json.dumps(v) for v in vals}  # 1, 1.0 and true stay apart, as Param.index keeps them
        for i, lst in enumerate(lists):
            if i == base:
                continue
            for v in lst:
                if json.dumps(v) not in seen:
                    seen.add(json.dumps(v))
                    vals.append(v)
        params[name] = vals

    k = first.get("timed_shapes", len(first["shapes"]))  # older datasets timed every shape
    out = Merged(data={}, ratios=[[] for _ in range(k)])
    trials: dict[str, dict] = {}
    for i, d in enumerate(datas):
        for t in d["trials"]:
            key = config_key(t["params"])
            old = trials.get(key)
            if old is not None:
                out.overlap += 1
                out.differ += old.get("status") != t.get("status")
                a, b = _timed(old, k), _timed(t, k)
                if a is not None and b is not None:
                    for s, (x, y) in enumerate(zip(a, b)):
                        out.ratios[s].append(y / x)
            trials[key] = {**t, "part": i}  # a key seen before keeps its place, takes the newer trial

    parts = [{"file": str(p), "created": d.get("created"), "machine": d.get("machine"),
              "trials": sum(1 for t in trials.values() if t["part"] == i), "recorded": len(d["trials"])}
             for i, (p, d) in enumerate(zip(paths, datas))]
    data = {}
    for key, v in first.items():
        if key == "trials":
            data["parts"] = parts
        data[key] = v
    data.update(created=_now(), machine=datas[-1].get("machine"), params=params, trials=list(trials.values()))
    out.data = data
    return out


def overlap_lines(m: Merged) -> list[str]:
    """What the files measured alike: per timed shape, later / earlier time over the
    configurations that two files both timed."""
    if not m.overlap:
        return ["overlap: none (no configuration is in more than one file)"]
    n = len(m.ratios[0]) if m.ratios else 0
    lines = [f"overlap: {m.overlap} configurations in more than one file; {n} timed in both; "
             f"{m.differ} with a different verdict"]
    shapes = m.data.get("shapes", [])
    for s, r in enumerate(m.ratios):
        if not r:
            continue
        shape = ", ".join(f"{k}={v}" for k, v in shapes[s].items()) if s < len(shapes) else ""
        lines.append(f"  shape {s} ({shape}): later/earlier time median {statistics.median(r):.4f}, "
                     f"min {min(r):.4f}, max {max(r):.4f}")
    return lines
