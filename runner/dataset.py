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
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from .expr import compile_expr
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


def export(spec, trials) -> dict:
    return {
        "format": FORMAT,
        "spec": spec.name,
        "spec_hash": spec.hash,
        "hardware": spec.hw.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
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


def load(path: str | Path) -> Dataset:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} dataset")
    params = tuple(Param(k, tuple(v)) for k, v in data["params"].items())
    symbols = {k for shape in data["shapes"] for k in shape}
    cons = tuple(compile_expr(c, set(data["params"]) | symbols) for c in data["constraints"])
    space = Space(params, cons, tuple(data["shapes"]) or ({},))
    results = {config_key(t["params"]): t for t in data["trials"]}
    return Dataset(str(path), data, space, results)
