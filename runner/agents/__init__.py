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


class Agent(Protocol):
    name: str

    def propose(self, history: Sequence[Seen], n: int) -> list[Config]:
        """Up to n new configurations; [] means the agent has nothing left to try."""


STRATEGIES: dict[str, Callable[..., Agent]] = {}


def register(name: str):
    def deco(cls):
        cls.name = name
        STRATEGIES[name] = cls
        return cls
    return deco


def make_agent(strategy: str, space: Space, seed: int, options: Mapping[str, Any]) -> Agent:
    return STRATEGIES[strategy](space, seed, dict(options))


from . import grid, random_search  # noqa: E402,F401  (registration)
