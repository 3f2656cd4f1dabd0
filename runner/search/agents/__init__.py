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


@dataclass(frozen=True)
class Option:
    """One option a strategy reads from the spec's agent.options."""

    default: Any = None  # what the agent is given when the spec leaves it out (None: nothing)
    kind: type | None = None  # int or float: a non-negative number of that kind
    choices: tuple | None = None  # one of these values
    strategy: bool = False  # names a replayable strategy (one to continue with)
    required: bool = False  # the agent cannot start without it ...
    env: str | None = None  # ... unless this environment variable is set
    hint: str = ""  # what it takes, for the message when it is missing


class Agent(Protocol):
    """The strategy contract. A class registered under a name (`register`) declares:

    - `OPTIONS`: what it reads from agent.options, with defaults and checks (spec checking
      reports a bad value at its line);
    - `pure`: propose() is a function of the history alone, so the loop may ask what comes
      next while a trial is judged and build that ahead;
    - `replayable`: it can tune against a recorded dataset (no outside process or service):
      the replay bench and a hybrid agent's `then` may use it (default: not `wants_brief`);
    - `wants_brief`: it reads the brief (make_agent passes it);
    - `bench`: it is in the replay bench's default list (default: replayable).
    """

    name: str
    OPTIONS: Mapping[str, Option]
    pure: bool
    replayable: bool
    wants_brief: bool
    bench: bool

    def propose(self, history: Sequence[Seen], n: int) -> list[Config | Proposal]:
        """Up to n new candidates; [] means the agent has nothing left to try."""


def as_proposal(x: Config | Proposal) -> Proposal:
    return x if isinstance(x, Proposal) else Proposal(dict(x))


STRATEGIES: dict[str, Callable[..., Agent]] = {}

# The strategy to use when a spec does not name one: the best on the bench (`pipe replay`,
# every dataset in datasets/). Median evaluations to come within 3% of the best at 200
# seeds: softmax-h200 pattern 9 [p75 11, max 18], tpe 10 [18, 30], random 32.5; rmsnorm-cpu
# pattern 6 [9], tpe 6 [10.2], random 9. Pattern is as good or better at 1% and 3%, has the
# shortest tail, costs ~1 ms a proposal and needs no optuna. (tpe is better at 5% on
# softmax-h200: 6 against 8.)
DEFAULT_STRATEGY = "pattern"


def register(name: str):
    def deco(cls):
        cls.name = name
        STRATEGIES[name] = cls
        return cls
    return deco


def options_of(strategy: str) -> dict[str, Option]:
    return dict(getattr(STRATEGIES[strategy], "OPTIONS", {}))


def is_replayable(strategy: str) -> bool:
    cls = STRATEGIES.get(strategy)
    return cls is not None and bool(getattr(cls, "replayable", not getattr(cls, "wants_brief", False)))


def replayable() -> list[str]:
    """The registered strategies the replay bench (and a hybrid's `then`) can run."""
    return [n for n in STRATEGIES if is_replayable(n)]


def bench_default() -> list[str]:
    """The replay bench's strategies when none are named."""
    return [n for n in replayable() if getattr(STRATEGIES[n], "bench", True)]


def option_problems(strategy: str, options: Mapping[str, Any], env: Mapping[str, str]) -> list[tuple[tuple, str]]:
    """(path under agent.options, message) for each option the strategy cannot take. A key
    that this strategy does not declare is checked as the strategies that declare it would."""
    mine = options_of(strategy) if strategy in STRATEGIES else {}
    out: list[tuple[tuple, str]] = []
    for k, o in mine.items():
        if o.required and not options.get(k) and not (o.env and env.get(o.env)):
            out.append(((), f"the {strategy} agent needs options.{k}"
                        + (f" (or {o.env} in the environment)" if o.env else f" ({o.hint})" if o.hint else "")))
    known = sorted({key for name in STRATEGIES for key in options_of(name)})
    for k, v in options.items():
        o = mine.get(k) or next((d[k] for d in map(options_of, STRATEGIES) if k in d), None)
        if o is None:  # no strategy takes it: a typo would otherwise be ignored without a word
            import difflib

            near = difflib.get_close_matches(str(k), sorted(mine) or known, n=1)
            out.append(((k,), f"unknown option for the {strategy} agent"
                        + (f"; did you mean '{near[0]}'?" if near else
                           f" (it takes {', '.join(sorted(mine))})" if mine else " (it takes none)")))
            continue
        if v is None:
            continue
        if o.kind in (int, float) and (isinstance(v, bool) or not isinstance(v, (int, float))
                                       or (o.kind is int and not isinstance(v, int)) or v < 0):
            out.append(((k,), f"expected a non-negative {'integer' if o.kind is int else 'number'}, got {v!r}"))
        elif o.choices is not None and v not in o.choices:
            out.append(((k,), f"expected one of {', '.join(map(repr, o.choices))}, got {v!r}"))
        elif o.strategy and not is_replayable(v):
            out.append(((k,), f"'{k}' names a built-in strategy to continue with, not '{v}'"))
    return out


def make_agent(strategy: str, space: Space, seed: int, options: Mapping[str, Any],
               brief: Mapping[str, Any] | None = None) -> Agent:
    """`brief` is what the runner tells agents that read context (language-model and
    command agents): the hardware notes, the op, the forbidden actions, the goal. Options
    the spec leaves out take the strategy's declared defaults."""
    cls = STRATEGIES[strategy]
    opts = {k: o.default for k, o in options_of(strategy).items() if o.default is not None}
    opts.update(options)
    if getattr(cls, "wants_brief", False):
        return cls(space, seed, opts, brief=dict(brief or {}))
    return cls(space, seed, opts)


# registration, in the replay bench's order (random search first: the yardstick)
from . import random_search, grid, optuna_search, pattern, external  # noqa: E402,F401,I001
