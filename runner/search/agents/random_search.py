"""Seeded random search without repeats.

The random stream is derived from the seed and the length of the history, so
a resumed run proposes what the uninterrupted run would have. When sampling
keeps hitting tried points (a small or mostly explored space), it falls back
to a shuffled list of the untried ones, and returns [] once none is left.
"""

from __future__ import annotations

import random
from typing import Sequence

from ..space import Config, Space, config_key
from . import Option, Seen, register


@register("random")
class RandomSearch:
    # propose() is a pure function of the history: the loop may ask it what comes next
    # while a trial is judged, and build that ahead (Session.judge)
    pure = True
    OPTIONS: dict[str, Option] = {}

    def __init__(self, space: Space, seed: int, options: dict):
        self.space = space
        self.seed = seed

    def propose(self, history: Sequence[Seen], n: int) -> list[Config]:
        rng = random.Random(self.seed * 1_000_003 + len(history))
        seen = {config_key(h.params) for h in history}
        out: list[Config] = []
        keys = set()
        for _ in range(50 * n):
            cfg = self.space.sample(rng, tries=200)
            if cfg is None:
                break
            k = config_key(cfg)
            if k not in seen and k not in keys:
                out.append(cfg)
                keys.add(k)
                if len(out) == n:
                    return out
        if self.space.size <= 1_000_000:
            rest = [c for c in self.space if config_key(c) not in seen and config_key(c) not in keys]
            rng.shuffle(rest)
            out.extend(rest[: n - len(out)])
        return out
