"""Shared by the CUDA red teams' check.py (s38-cuda, s38b-cuda, s38d-cuda): a variant built
through the project's own Builder against a shipped spec (its forbidden list unchanged), the
verdict in a line, and how many times a pattern occurs in the accepted build's kept PTX (so
that no acceptance is vacuous). No GPU needed (NVRTC only)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from runner.build.builder import Builder  # noqa: E402
from runner.spec.spec import load_spec  # noqa: E402

_BUILDERS: dict = {}


def builder(spec: str) -> Builder:
    """The Builder of pipelines/SPEC, one per spec."""
    if spec not in _BUILDERS:
        _BUILDERS[spec] = Builder(load_spec(ROOT / "pipelines" / spec))
    return _BUILDERS[spec]


def build(spec: str, text: str, params: dict | None = None):
    """The Build of a variant's template text at params (the spec's first start by default)."""
    ev = builder(spec)
    params = params or ev.spec.starts[0]
    vid = f"v{len(ev.variants)}"
    ev.variants[vid] = text
    return ev.build(ev.render_all(params, vid), ev.geometry(params), ev.approved_sources(params, vid))


def evidence(spec: str, text: str, params: dict, rx: str) -> str:
    """How often `rx` occurs in the PTX of the variant's build (read from the artifact cache)."""
    ev = builder(spec)
    vid = f"e{len(ev.variants)}"
    ev.variants[vid] = text
    arts, _ = ev.compiled(ev.render_all(params, vid))
    n = sum(len(re.findall(rx, Path(a).with_suffix(".ptx").read_text())) for a in dict.fromkeys(arts or []))
    return f"{n} match(es) of /{rx}/ in the accepted build's PTX"


def verdict(b) -> str:
    return "accepted" if b.status == "ok" else f"refused ({b.status}): {b.reason[:220]}"
