"""Model-based search through Optuna's ask-and-tell API: "tpe" (and "gp" where it runs).

The agent keeps no state between calls: every `propose` builds a fresh
in-memory study from the history it is given, so a resumed run proposes what
the uninterrupted run would have, and the same seed and history always give
the same proposal (the sampler's seed is derived from the agent's seed and
the length of the history, like the random strategy's).

What the sampler sees:
- each parameter as the position of its value in the domain's order
  (an IntDistribution over 0..len-1) when the domain is numeric, so the
  Parzen estimators can use that order (a pow2 domain becomes a log scale);
  strings and booleans stay categorical. `options: {encoding: categorical}`
  makes every parameter categorical.
- the objective as log(seconds), minimised; a trial that did not give a time
  (wrong, fault, hang, compile_error, forbidden, pruned, ...) counts as the
  worst observed log-time plus log(2), so the sampler learns to avoid its
  region rather than ignoring it.
- a point the sampler asks for that breaks a constraint is told with that
  same penalty (it costs no trial: the agent asks again); a point already
  tried is told as failed (ignored by TPE) and the agent asks again. After a
  bounded number of asks it falls back to a seeded random untried point, and
  returns [] only when no valid untried point is left.

Optuna is imported when an agent is built, so `import runner.agents` stays
fast and works without it.
"""

from __future__ import annotations

import importlib.util
import math
import random
from typing import Any, Sequence

from ..space import Config, Space, config_key
from . import Seen, register

PENALTY = math.log(2.0)  # a failed trial: this much worse than the worst timed one
MAX_ASKS = 24            # asks per proposal before falling back (options: {max_asks: N})
ENUMERATE = 200_000      # list the valid space (for the nearest untried point) up to this size


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

    def __init__(self, space: Space, seed: int, options: dict):
        import optuna  # lazy: only a strategy that needs it pays for the import

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self.space = space
        self.seed = int(seed)
        self.options = dict(options)
        self.max_asks = max(1, int(self.options.get("max_asks", MAX_ASKS)))
        self._points: list | None = None  # the valid space, listed lazily (a pure function of it)
        encoding = self.options.get("encoding", "index")
        if encoding not in ("index", "categorical"):
            raise ValueError(f"encoding must be 'index' or 'categorical', not {encoding!r}")
        D = optuna.distributions
        self._dists: dict[str, Any] = {}
        self._ordinal: dict[str, bool] = {}
        for p in space.params:
            ordinal = encoding == "index" and len(p.values) > 1 and _is_numeric(p.values)
            self._ordinal[p.name] = ordinal
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

    def _sampler(self, seed: int):
        raise NotImplementedError

    def _valid_points(self) -> list[tuple[Config, tuple[int, ...]]] | None:
        """Every valid configuration with its domain positions; None for a space too big to list."""
        if self._points is None and self.space.size <= ENUMERATE:
            names = self.space.names
            self._points = [(c, tuple(self.space.param(k).index(c[k]) for k in names)) for c in self.space]
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
        optuna = self._optuna
        seen = {config_key(h.params) for h in history}
        sampler = self._sampler(_seed(self.seed, len(history)))
        study = self._study(history, sampler)
        rng = random.Random(_seed(self.seed, len(history), salt=1))
        out: list[Config] = []
        for _ in range(n):
            cfg = None
            first = None  # what the sampler wanted first, when it was already tried
            for _ in range(self.max_asks):
                trial = study.ask(self._dists)
                cand = self._decode(trial.params)
                key = config_key(cand)
                if self.space.violated(cand) is not None:
                    if self.options.get("invalid", "penalty") == "penalty":
                        study.tell(trial, self._penalty)
                    else:
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                elif key in seen:
                    first = first or trial.params
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                else:
                    cfg = cand  # left running: with constant_liar the next ask avoids it
                    break
            if cfg is None:
                cfg = self._nearest(first, seen, rng) if first is not None else untried(self.space, seen, rng)
                if cfg is None:
                    break
                study.add_trial(optuna.trial.create_trial(
                    params=self._encode(cfg), distributions=self._dists, state=optuna.trial.TrialState.RUNNING))
            seen.add(config_key(cfg))
            out.append(cfg)
        return out


def _startup(space: Space, options: dict) -> int:
    """Random trials before the model: the option, else about a tenth of the space, 3 to 8."""
    if "n_startup_trials" in options:
        return int(options["n_startup_trials"])
    return max(3, min(8, space.size // 10))


@register("tpe")
class TPE(_OptunaAgent):
    """Tree-structured Parzen estimators (multivariate), seeded."""

    def _sampler(self, seed: int):
        import warnings

        o = self.options
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multivariate/group are "experimental"
            return self._optuna.samplers.TPESampler(
                seed=seed,
                n_startup_trials=_startup(self.space, o),
                n_ei_candidates=int(o.get("n_ei_candidates", 24)),
                multivariate=bool(o.get("multivariate", True)),
                group=bool(o.get("group", False)),
                constant_liar=True,
            )


def _gp_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("optuna", "scipy", "torch"))


if _gp_available():

    @register("gp")
    class GP(_OptunaAgent):
        """Gaussian-process Bayesian optimisation (Optuna's GPSampler), seeded."""

        def _sampler(self, seed: int):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return self._optuna.samplers.GPSampler(
                    seed=seed, n_startup_trials=_startup(self.space, self.options),
                    deterministic_objective=bool(self.options.get("deterministic_objective", False)))
