"""What a run records of one trial, and how a trial is keyed: the record types every
room passes around (the agents, the judge, the ledger and the loop), apart from the
SQLite ledger that stores them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

STATUSES = ("ok", "forbidden", "render_error", "compile_error", "pruned", "wrong", "fault",
            "hang", "impossible", "tampered", "error", "crashed")


@dataclass
class Trial:
    params: dict
    status: str
    reason: str = ""
    source_hash: str | None = None
    times: list | None = None  # per-shape median seconds
    spreads: list | None = None  # per-shape interquartile range over median
    metric: float | None = None  # the goal's metric, aggregated over shapes
    objective: float | None = None  # geometric mean of per-shape medians (lower is better)
    kept: bool = False
    agent: str = ""
    details: dict = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0
    wall_s: float = 0.0
    id: int | None = None
    spec_hash: str = ""
    variant: str | None = None  # id of the template variant, None for the spec's template
    chain: str = ""

    @property
    def key(self) -> str:
        return trial_key(self.params, self.variant)


VARIANT_SEP = "#variant:"


def trial_key(params: dict, variant: str | None = None) -> str:
    """What makes two trials the same experiment: the parameters and the template variant."""
    k = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return k + VARIANT_SEP + variant if variant else k


def variant_id(text: str) -> str:
    """A template variant is named by the hash of its text."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def split_key(key: str) -> tuple[dict, str | None]:
    params, _, variant = key.partition(VARIANT_SEP)
    return json.loads(params), (variant or None)
