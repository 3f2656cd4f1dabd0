"""Pattern: a local search around the incumbent, with seeded random restarts.

Each parameter's domain is ordered, so a configuration has neighbours one step
away in one parameter (Space.neighbours). The agent:

1. samples seeded random points until `init` trials are done and one of them
   gave a time (options: {init: N}, default 1);
2. proposes the untried valid neighbours of the incumbent (the fastest timed
   trial so far), most promising first: a move whose mirror move (the same
   parameter, the other way) was tried and was slower, or failed, comes first,
   by how much slower (the pattern move of a pattern search); the others follow
   in a seeded shuffle;
3. when every 1-step neighbour is tried, widens to 2-step moves (one parameter
   two steps, or two parameters one step each), which also crosses constraint
   boundaries a single step cannot;
4. when that neighbourhood is exhausted too, restarts from a seeded random
   untried point, and returns [] only once the valid space is exhausted.

Like the random strategy it keeps no state between calls: the random stream
is derived from the seed and the length of the history, so a resumed run
proposes what the uninterrupted run would have.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any, Mapping, Sequence

from ..space import Config, Space, config_key
from . import Seen, register

FAILED = math.log(2.0)  # a failed mirror move counts as this much slower than the worst timed trial


def _seed(seed: int, n: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + n * 7919 + salt) % (2**32)


@register("pattern")
class Pattern:
    def __init__(self, space: Space, seed: int, options: dict):
        self.space = space
        self.seed = int(seed)
        self.init = max(1, int(options.get("init", 1)))
        self._valid: dict[str, bool] = {}  # key -> valid? (a cache of a pure function)

    # -- geometry -------------------------------------------------------------
    def _ok(self, cfg: Mapping[str, Any]) -> bool:
        k = config_key(cfg)
        v = self._valid.get(k)
        if v is None:
            v = self._valid[k] = self.space.violated(cfg) is None
        return v

    def _moves(self, cfg: Mapping[str, Any], steps: int) -> list[tuple[Config, tuple]]:
        """Valid configurations exactly `steps` unit moves away (L1 in domain positions).

        Each comes with its move: a tuple of (parameter, delta) pairs.
        """
        idx = {p.name: p.index(cfg[p.name]) for p in self.space.params}
        out = []
        if steps == 1:
            deltas = [((p.name, d),) for p in self.space.params for d in (-1, 1)]
        else:
            singles = [((p.name, d),) for p in self.space.params for d in (-2, 2)]
            pairs = [((a.name, da), (b.name, db))
                     for a, b in itertools.combinations(self.space.params, 2)
                     for da in (-1, 1) for db in (-1, 1)]
            deltas = singles + pairs
        for move in deltas:
            new = dict(cfg)
            for name, d in move:
                j = idx[name] + d
                vals = self.space.param(name).values
                if not 0 <= j < len(vals):
                    break
                new[name] = vals[j]
            else:
                if self._ok(new):
                    out.append((new, move))
        return out

    def _mirror(self, cfg: Mapping[str, Any], move: tuple) -> Config | None:
        new = dict(cfg)
        for name, d in move:
            p = self.space.param(name)
            j = p.index(cfg[name]) - d
            if not 0 <= j < len(p.values):
                return None
            new[name] = p.values[j]
        return new

    def _random(self, seen: set[str], rng: random.Random) -> Config | None:
        for _ in range(64):
            cfg = self.space.sample(rng, tries=64)
            if cfg is None:
                break
            if config_key(cfg) not in seen:
                return cfg
        if self.space.size > 1_000_000:
            return None
        rest = [c for c in self.space if config_key(c) not in seen]
        return rng.choice(rest) if rest else None

    # -- the search -----------------------------------------------------------
    def propose(self, history: Sequence[Seen], n: int) -> list[Config]:
        seen = {config_key(h.params) for h in history}
        rng = random.Random(_seed(self.seed, len(history)))
        timed = [(math.log(h.objective), i, h) for i, h in enumerate(history)
                 if h.status == "ok" and h.objective is not None and h.objective > 0]
        inc = min(timed, key=lambda t: (t[0], t[1]))[2].params if timed else None
        if inc is not None and self.space.contains(inc) is not None:
            inc = None  # the fastest trial is not a point of this space (an edited spec)
        worst = max(t[0] for t in timed) + FAILED if timed else 0.0
        score = {config_key(h.params): (math.log(h.objective) if h.status == "ok" and h.objective
                                        and h.objective > 0 else worst) for h in history}
        cands: list[Config] = []
        if inc is not None and len(history) >= self.init:
            base = score[config_key(inc)]
            for steps in (1, 2):
                ring = [(c, m) for c, m in self._moves(inc, steps) if config_key(c) not in seen]
                if not ring:
                    continue
                rng.shuffle(ring)

                def promise(cm):
                    mirror = self._mirror(inc, cm[1])
                    s = score.get(config_key(mirror)) if mirror is not None else None
                    return -(s - base) if s is not None else 0.0

                ring.sort(key=promise)  # stable: ties keep the seeded shuffle order
                cands = [c for c, _ in ring]
                break
        out: list[Config] = []
        for c in cands:
            if len(out) == n:
                return out
            out.append(c)
            seen.add(config_key(c))
        while len(out) < n:
            c = self._random(seen, rng)
            if c is None:
                break
            out.append(c)
            seen.add(config_key(c))
        return out
