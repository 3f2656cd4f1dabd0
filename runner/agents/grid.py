"""Grid: every valid configuration in order (last parameter fastest)."""

from __future__ import annotations

from typing import Sequence

from ..space import Config, Space, config_key
from . import Seen, register


@register("grid")
class Grid:
    def __init__(self, space: Space, seed: int, options: dict):
        self.space = space
        self._it = iter(space)

    def propose(self, history: Sequence[Seen], n: int) -> list[Config]:
        seen = {config_key(h.params) for h in history}
        out: list[Config] = []
        for cfg in self._it:
            if config_key(cfg) not in seen:
                out.append(cfg)
                if len(out) == n:
                    break
        return out
