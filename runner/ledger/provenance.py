"""What a run's verdicts depend on: the spec's parts (spec file, template, hardware
profile, reference), the backend's compiler and the judge's own code. The ledger keeps
them for the run and each trial keeps the digest of the compiler and judge it was judged
with, so verdicts are reused (judge.reuse) only where they still stand."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping

from ..build import backends

# the code a verdict depends on besides the spec: the judge, the backends (compile options,
# pruning, launches, timing), the forbidden-action checks and the figures
_JUDGE_CODE = ("judge/*.py", "build/backends/*.py", "build/forbid.py", "build/ptx.py", "build/sass.py", "build/x86.py",
               "build/machine.py", "build/builder.py", "core/figures.py")
SPEC_PARTS = ("spec", "hardware", "reference")  # must match for a run's verdicts to be offered
MADE_WITH = ("toolchain", "judge")  # must match per trial (a resumed run may have changed them)


def run_parts(spec) -> dict[str, str]:
    """What a run's verdicts depend on, part by part: the spec's (spec file, template, hardware
    profile, reference), the backend's compiler and the judge's own code."""
    be = backends.get(spec.kernel.backend)
    judge = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]  # the package
    for pattern in _JUDGE_CODE:
        for f in sorted(root.glob(pattern)):
            judge.update(f.read_bytes())
    try:
        tool = be.toolchain()
    except Exception as e:  # no compiler here: nothing can match it
        tool = f"unavailable ({type(e).__name__})"
    return {**spec.hash_parts, "toolchain": f"{spec.kernel.backend}: {tool}", "judge": judge.hexdigest()[:16]}


def made_with(parts: Mapping[str, str]) -> str:
    """The compiler and judge code a trial was judged with, as one digest (each trial keeps it)."""
    return hashlib.sha256(json.dumps([parts.get(k) for k in MADE_WITH]).encode()).hexdigest()[:16]


