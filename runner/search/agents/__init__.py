"""Agents propose candidates; the runner judges them.

An agent sees the search space and a read-only view of the history (params,
status, objective) and returns proposals. It never sees the spec file, the
judge, the reference tensors or the ledger. Strategies register by name.
The loop drops proposals already tried, so an agent that repeats itself only
wastes its own turn, never a trial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..space import Config, Space


@dataclass(frozen=True)
class Seen:
    """What an agent may know of one finished trial."""

    params: Mapping[str, Any]
    status: str
    reason: str
    objective: float | None  # geometric-mean time in seconds; None when not timed
    variant: str | None = None  # template variant id, None for the spec's template
    metric: float | None = None  # the goal's metric, worst shape
    times: tuple[float, ...] | None = None  # per timed shape, seconds; None when not timed


@dataclass(frozen=True)
class Proposal:
    """A candidate: a parameter fill, optionally with a whole template variant."""

    params: Mapping[str, Any]
    variant: str | None = None  # full template text
    parent: str | None = None  # id of the variant it was derived from (None: the spec's template)
    note: str = ""


class Agent(Protocol):
    name: str

    def propose(self, history: Sequence[Seen], n: int) -> list[Config | Proposal]:
        """Up to n new candidates; [] means the agent has nothing left to try."""


def as_proposal(x: Config | Proposal) -> Proposal:
    return x if isinstance(x, Proposal) else Proposal(dict(x))


STRATEGIES: dict[str, Callable[..., Agent]] = {}


def register(name: str):
    def deco(cls):
        cls.name = name
        STRATEGIES[name] = cls
        return cls
    return deco


def make_agent(strategy: str, space: Space, seed: int, options: Mapping[str, Any],
               brief: Mapping[str, Any] | None = None) -> Agent:
    """`brief` is what the runner tells agents that read context (language-model and
    command agents): the hardware notes, the op, the forbidden actions, the goal."""
    cls = STRATEGIES[strategy]
    if getattr(cls, "wants_brief", False):
        return cls(space, seed, dict(options), brief=dict(brief or {}))
    return cls(space, seed, dict(options))


from . import external, grid, optuna_search, pattern, random_search  # noqa: E402,F401  (registration)
