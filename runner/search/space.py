"""The parameter search space: typed finite domains plus constraints.

Every parameter form of the spec (a list, `values`, `range`, `pow2`) becomes
an ordered tuple of values; constraints are safe expressions over the
parameters (and the shape symbols: a configuration must satisfy them on every
shape). A configuration is a dict name -> value; its `key` is canonical JSON.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator, Mapping, Sequence

from ..core.expr import Expr

Config = dict  # name -> value


def config_key(cfg: Mapping[str, Any]) -> str:
    return json.dumps(dict(cfg), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Param:
    name: str
    values: tuple

    @property
    def kind(self) -> str:
        return type(self.values[0]).__name__

    def index(self, value: Any) -> int:
        for i, v in enumerate(self.values):
            if v == value and type(v) is type(value):
                return i
        raise ValueError(f"{value!r} is not in the domain of {self.name}")


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]
    constraints: tuple[Expr, ...] = ()
    shapes: tuple[Mapping[str, int], ...] = ({},)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def size(self) -> int:
        """Upper bound: the product of the domains, before constraints."""
        n = 1
        for p in self.params:
            n *= len(p.values)
        return n

    @cached_property
    def _shape_free(self) -> tuple[bool, ...]:
        """Per constraint: whether it names no shape symbol (one evaluation then serves every
        shape: most constraints are over the parameters alone)."""
        symbols = {k for shape in self.shapes for k in shape}
        return tuple(not (set(getattr(c, "names", symbols)) & symbols) for c in self.constraints)

    def violated(self, cfg: Mapping[str, Any]) -> str | None:
        """The first constraint the configuration breaks (on any shape), else None."""
        for c, free in zip(self.constraints, self._shape_free):
            for shape in self.shapes[:1] if free else self.shapes:
                if not c({**shape, **cfg}):
                    return c.text
        return None

    def contains(self, cfg: Mapping[str, Any]) -> str | None:
        """None if cfg is a valid point of the space, else the reason it is not."""
        if set(cfg) != set(self.names):
            missing = sorted(set(self.names) - set(cfg))
            extra = sorted(set(cfg) - set(self.names))
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                    ([f"unknown {', '.join(extra)}"] if extra else [])
            return "; ".join(parts)
        for p in self.params:
            try:
                p.index(cfg[p.name])
            except ValueError:
                return f"{p.name}={cfg[p.name]!r} is not one of {list(p.values)}"
        bad = self.violated(cfg)
        return f"violates constraint '{bad}'" if bad else None

    def __iter__(self) -> Iterator[Config]:
        """Every valid configuration, in grid order (last parameter fastest)."""
        for combo in itertools.product(*(p.values for p in self.params)):
            cfg = dict(zip(self.names, combo))
            if self.violated(cfg) is None:
                yield cfg

    def indexed(self, limit: int) -> list[tuple[Config, tuple[int, ...]]] | None:
        """Every valid configuration with its positions in the domains, for distance-based
        search; None when the space (before constraints) is larger than `limit`."""
        if self.size > limit:
            return None
        return [(c, tuple(p.index(c[p.name]) for p in self.params)) for c in self]

    def sample(self, rng: random.Random, tries: int = 1000) -> Config | None:
        for _ in range(tries):
            cfg = {p.name: rng.choice(p.values) for p in self.params}
            if self.violated(cfg) is None:
                return cfg
        return None

    def neighbours(self, cfg: Mapping[str, Any]) -> list[Config]:
        """Valid configurations one step away in one parameter's ordered domain."""
        out = []
        for p in self.params:
            i = p.index(cfg[p.name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(p.values):
                    n = {**cfg, p.name: p.values[j]}
                    if self.violated(n) is None:
                        out.append(n)
        return out


def param_values(spec: Any) -> tuple:
    """Expand one parameter's spec form into its ordered values."""
    if isinstance(spec, list):
        return tuple(spec)
    if "values" in spec:
        return tuple(spec["values"])
    if "range" in spec:
        r = spec["range"]
        return tuple(range(r["min"], r["max"] + 1, r.get("step", 1)))
    if "pow2" in spec:
        lo, hi = spec["pow2"]["min"], spec["pow2"]["max"]
        out, v = [], lo
        while v <= hi:
            out.append(v)
            v *= 2
        return tuple(out)
    raise ValueError(f"unknown parameter form {spec!r}")


def domain_problem(values: Sequence[Any]) -> str | None:
    kinds = {type(v) for v in values}
    if len(kinds) > 1:
        return "values mix types (" + ", ".join(sorted(k.__name__ for k in kinds)) + ")"
    if len(set(map(repr, values))) != len(values):
        return "values repeat"
    if not values:
        return "no values"
    return None
