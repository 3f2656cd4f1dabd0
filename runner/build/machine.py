"""What the machine code of a variant holds, against the approved template's build: the
shared half of the readers of compiled code (`sass.py` for CUDA cubins, `x86.py` for CPU
libraries). Each reader sorts its instructions into the forbidden actions and counts them by
opcode; a variant is refused where it has more of one than the approved template's build at
the same parameters and shape, and where nothing at all could be read."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

ACTIONS = ("lower_precision", "fast_math")
# instructions that are lower precision only in an op that declares no type that narrow: rounding a
# float to 16 bits (and bf16 products), and dot products of 8- and 16-bit integers
_NARROWINGS = ("narrowing", "int_narrowing")


def count(instructions: Iterable[tuple[str, list[str]]], classify: Callable, key: Callable) -> dict:
    """{"lower_precision": {opcode: n}, "fast_math": {...}, "read": instructions read}."""
    out = {a: Counter() for a in (*ACTIONS, "unreadable", *_NARROWINGS)}
    n = 0
    for op, operands in instructions:
        n += 1
        action = classify(op, operands)
        if action:
            out[action][key(action, op)] += 1
    got = {**{a: dict(sorted(out[a].items())) for a in (*ACTIONS, *_NARROWINGS)}, "read": n}
    if out["unreadable"]:
        got["unreadable"] = sum(out["unreadable"].values())
    return got


def compare(cand: dict, base: dict | None, named, waived=frozenset(), where: str = "SASS",
            unit: str = "cubin", narrow_ok: bool = True, ints_ok: bool = False) -> tuple[str, str] | None:
    """(action, reason) for the first classified opcode the candidate's build has more of than
    the approved template's (`base`; None: nothing to compare with, every count is new), or
    None. `waived`: what the accurate math functions compile to, not counted. `narrow_ok`: the
    op declares a 16-bit float (conversions to it and bf16 products are then no narrowing);
    `ints_ok`: it declares an 8- or 16-bit integer (their dot products are its own arithmetic)."""
    fold = [k for k, ok in (("narrowing", narrow_ok), ("int_narrowing", ints_ok)) if not ok]

    def folded(d: dict) -> dict:  # what is lower precision in this op, counted as such
        lp = dict(d.get("lower_precision", {}))
        for k in fold:
            lp.update(d.get(k, {}))
        return {**d, "lower_precision": lp}

    cand = folded(cand)
    base = None if base is None else folded(base)
    if not cand.get("read"):
        return "unreadable_code", f"the disassembler read no instruction in the candidate's {unit}"
    base = base or {}
    if cand.get("unreadable", 0) > base.get("unreadable", 0):  # whatever the spec names
        return "unreadable_code", (f"{cand['unreadable']} instructions the disassembler could not decode in the "
                                   f"candidate's {unit} vs {base.get('unreadable', 0)} in the approved template's build")
    for action in ACTIONS:
        if action not in named:
            continue
        for op, n in cand.get(action, {}).items():
            if action == "fast_math" and op in waived:
                continue
            b = base.get(action, {}).get(op, 0)
            if n > b:
                return action, (f"'{op}' in the {where}: {n} in the candidate's {unit} vs {b} in the approved "
                                "template's build at the same parameters")
    return None


def kept(path: Path, make: Callable[[], dict]) -> dict:
    """The counts kept at `path` (beside the artifact, under the reader's digest), else make()'s,
    written there whole or not at all."""
    if path.exists():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    got = make()
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(got))
    os.replace(tmp, path)
    return got
