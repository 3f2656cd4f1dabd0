"""Model-based search through Optuna's ask-and-tell API: "tpe" (and "gp" where it runs).

The agent keeps no state between calls: every `propose` builds a fresh
in-memory study from the history it is given, so a resumed run proposes what
the uninterrupted run would have, and the same seed and history always give
the same proposal (the sampler's seed is derived from the agent's seed and
the length of the history, like the random strategy's).

What the sampler sees:
- each parameter as a categorical choice among the positions of its values.
  `options: {encoding: index}` gives numeric domains an IntDistribution over
  the positions instead (so a pow2 domain would be a log scale); on the
  replay bench (runner.search.replay) that did worse than categorical, so it is off.
- the objective as log(seconds), minimised; a trial that did not give a time
  (wrong, fault, hang, compile_error, forbidden, pruned, ...) counts as the
  worst observed log-time plus log(2), so the sampler learns to avoid its
  region rather than ignoring it.
- a point the sampler asks for that breaks a constraint is projected onto
  the space: the agent proposes the untried valid point nearest to it
  (distance: steps in domain positions; ties broken by a seeded draw).
  Telling such points as failures instead taught the sampler that a value
  valid only in a corner of the space (HOLD=true needs TPR >= 512) is bad.
- a point already tried is told as failed (ignored by TPE) and the agent asks
  again, up to `max_asks` times (default 4), then proposes the untried point
  nearest to the first one asked for. [] only when no valid untried point is
  left.

Options: n_startup_trials (random trials before the model; default a
twentieth of the valid space, 3 to 8), n_ei_candidates, multivariate, group,
max_asks, encoding.

Optuna is imported when an agent is built, so `import runner.search.agents` stays
fast and works without it.
"""

from __future__ import annotations

import importlib.util
import math
import random
from typing import Any, Sequence

from ..space import Config, Space, config_key
from . import Option, Seen, register

PENALTY = math.log(2.0)  # a failed trial: this much worse than the worst timed one
MAX_ASKS = 4             # asks per proposal before taking the nearest untried point instead
ENUMERATE = 20_000       # list the valid space (for the nearest untried point) up to this size


def _seed(seed: int, n: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + n * 7919 + salt) % (2**32)


def untried(space: Space, seen: set[str], rng: random.Random, limit: int = 1_000_000) -> Config | None:
    """A seeded random valid configuration not in `seen`; None when none is left."""
    for _ in range(64):
        cfg = space.sample(rng, tries=64)
        if cfg is None:
            break
        if config_key(cfg) not in seen:
            return cfg
    if space.size > limit:
        return None
    rest = [c for c in space if config_key(c) not in seen]
    return rng.choice(rest) if rest else None


def _is_numeric(values: tuple) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class _OptunaAgent:
    """Shared ask-and-tell machinery; subclasses supply `_sampler(seed)`."""

    OPTIONS = {"n_startup_trials": Option(None, int), "encoding": Option("categorical", choices=("categorical", "index")),
               "max_asks": Option(MAX_ASKS, int), "n_ei_candidates": Option(24, int), "multivariate": Option(True),
               "group": Option(False), "deterministic_objective": Option(False)}

    def __init__(self, space: Space, seed: int, options: dict):
        import optuna  # lazy: only a strategy that needs it pays for the import

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self.space = space
        self.seed = int(seed)
        self.options = dict(options)
        self.max_asks = max(1, int(self.options.get("max_asks", MAX_ASKS)))
        self._points: list | None = None  # the valid space, listed lazily (a pure function of it)
        encoding = self.options.get("encoding", "categorical")
        if encoding not in ("index", "categorical"):
            raise ValueError(f"encoding must be 'index' or 'categorical', not {encoding!r}")
        D = optuna.distributions
        self._dists: dict[str, Any] = {}
        for p in space.params:
            ordinal = encoding == "index" and len(p.values) > 1 and _is_numeric(p.values)
            if ordinal:
                self._dists[p.name] = D.IntDistribution(0, len(p.values) - 1)
            else:
                # Categorical choices must be None/bool/int/float/str: use positions throughout.
                self._dists[p.name] = D.CategoricalDistribution(list(range(len(p.values))))

    # -- encoding ----------------------------------------------------------
    def _encode(self, cfg) -> dict[str, int] | None:
        try:
            return {p.name: p.index(cfg[p.name]) for p in self.space.params}
        except (KeyError, ValueError):
            return None

    def _decode(self, internal: dict[str, Any]) -> Config:
        return {p.name: p.values[int(internal[p.name])] for p in self.space.params}

    # -- the study -----------------------------------------------------------
    def _study(self, history: Sequence[Seen], sampler):
        optuna = self._optuna
        logs = [math.log(h.objective) for h in history
                if h.status == "ok" and h.objective is not None and h.objective > 0]
        self._penalty = (max(logs) + PENALTY) if logs else 0.0
        study = optuna.create_study(direction="minimize", sampler=sampler)
        trials = []
        for h in history:
            enc = self._encode(h.params)
            if enc is None:
                continue  # not a point of this space (an edited spec): nothing to learn from
            ok = h.status == "ok" and h.objective is not None and h.objective > 0
            value = math.log(h.objective) if ok else self._penalty
            trials.append(optuna.trial.create_trial(params=enc, distributions=self._dists, value=value))
        study.add_trials(trials)
        return study

    def _valid_points(self) -> list[tuple[Config, tuple[int, ...]]] | None:
        """Every valid configuration with its domain positions; None for a space too big to list."""
        if self._points is None:
            self._points = self.space.indexed(ENUMERATE)
        return self._points

    def _nearest(self, internal: dict[str, Any], seen: set[str], rng: random.Random) -> Config | None:
        """The untried valid configuration closest to what the sampler asked for (ties: seeded)."""
        points = self._valid_points()
        if points is None:
            return untried(self.space, seen, rng)
        want = [int(internal[k]) for k in self.space.names]
        best, best_d = [], None
        for cfg, pos in points:
            if config_key(cfg) in seen:
                continue
            d = sum(abs(a - b) for a, b in zip(pos, want))
            if best_d is None or d < best_d:
                best, best_d = [cfg], d
            elif d == best_d:
                best.append(cfg)
        return rng.choice(best) if best else None

    def propose(self, history: Sequence[Seen], n: int) -> list[Config]:
        seen = {config_key(h.params) for h in history}
        study = self._study(history, self._sampler(_seed(self.seed, len(history))))
        rng = random.Random(_seed(self.seed, len(history), salt=1))
        out: list[Config] = []
        for _ in range(n):
            cfg = self._ask(study, seen, rng)
            if cfg is None:
                break  # the valid space is exhausted
            seen.add(config_key(cfg))
            out.append(cfg)
        return out

    def _ask(self, study, seen: set[str], rng: random.Random) -> Config | None:
        TrialState = self._optuna.trial.TrialState
        wanted = None  # what the sampler asked for, when that was not a new valid point
        for _ in range(self.max_asks):
            trial = study.ask(self._dists)
            cand = self._decode(trial.params)
            invalid = self.space.violated(cand) is not None
            if not invalid and config_key(cand) not in seen:
                return cand  # left running: with constant_liar a further ask steers away from it
            study.tell(trial, state=TrialState.FAIL)  # ignored by the sampler
            wanted = wanted or trial.params
            if invalid:
                break  # project it onto the space rather than asking again
        cfg = self._nearest(wanted, seen, rng)
        if cfg is not None:
            study.add_trial(self._optuna.trial.create_trial(
                params=self._encode(cfg), distributions=self._dists, state=TrialState.RUNNING))
        return cfg

    def _startup(self) -> int:
        """Random trials before the model: the option, else a twentieth of the valid space, 3 to 8."""
        if "n_startup_trials" in self.options:
            return int(self.options["n_startup_trials"])
        points = self._valid_points()
        size = len(points) if points is not None else self.space.size
        return max(3, min(8, size // 20))

    def _sampler(self, seed: int):
        raise NotImplementedError


class TPE(_OptunaAgent):
    """Tree-structured Parzen estimators (multivariate), seeded."""

    def _sampler(self, seed: int):
        import warnings

        o = self.options
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate/group are "experimental"
            return self._optuna.samplers.TPESampler(
                seed=seed,
                n_startup_trials=self._startup(),
                n_ei_candidates=int(o.get("n_ei_candidates", 24)),
                multivariate=bool(o.get("multivariate", True)),
                group=bool(o.get("group", False)),
                constant_liar=True,
            )


class GP(_OptunaAgent):
    """Gaussian-process Bayesian optimisation (Optuna's GPSampler, which needs scipy and torch).

    On the replay bench it did no better than "tpe" at ten times the cost (a GP fit per
    proposal), so it is registered where it can run but left out of the default bench.
    """

    bench = False

    def _sampler(self, seed: int):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._optuna.samplers.GPSampler(
                seed=seed, n_startup_trials=self._startup(),
                deterministic_objective=bool(self.options.get("deterministic_objective", False)))


def _importable(*modules: str) -> bool:
    # find_spec finds a top-level module without importing it: registration stays cheap.
    return all(importlib.util.find_spec(m) is not None for m in modules)


if _importable("optuna"):
    register("tpe")(TPE)
if _importable("optuna", "scipy", "torch"):
    register("gp")(GP)
