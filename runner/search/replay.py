"""Replay: how fast does a strategy find the best of a recorded space? No GPU needed.

A dataset (runner.search.dataset) holds the verdict of every configuration of a
space. `replay` lets an agent tune against it: propose one configuration,
look its verdict up, append it to the history, again, until the budget is
spent or the agent has nothing left. Every proposal counts as an evaluation,
failures included.

For each threshold x (1%, 3%, 5%) the figure is the number of evaluations
until the best objective so far is within x of the dataset's best. A second
figure follows the dispatch table a run leaves (each timed shape's fastest
configuration so far): evaluations until that table's geometric-mean time is
within x of the best table the space holds, which is faster than the best single
configuration wherever shapes prefer different ones (4 to 5% on the flagship
datasets). Over
seeds we report the median and the spread, and a score in the spirit of
Willemsen et al. (2021, "Bayesian Optimization for auto-tuning GPU
kernels"): 0 is no better than random search, 1 finds the optimum at once,
negative is worse than random. Random search draws without replacement, so
with S valid configurations of which k are within x of the best its expected
number of evaluations is E_random = (S + 1) / (k + 1), and

    score = (E_random - E_agent) / (E_random - 1)

with E_agent the agent's median over seeds. A run that never gets within x
(budget spent, or the agent gave up) counts as budget + 1 evaluations.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..core import figures
from ..core.errors import PipeError
from ..core.figures import geomean as _geomean
from ..core.records import trial_key
from .agents import Seen, bench_default, make_agent, replayable
from .core import limit_reason, next_proposal
from .dataset import Dataset, load
from .space import config_key

THRESHOLDS = (0.01, 0.03, 0.05)


class ReplayError(PipeError, ValueError):
    """A replay asked for with arguments it cannot run with (no seeds)."""


def _seeds(seeds: Iterable[int] | int) -> list[int]:
    """The seeds to replay with (an int n: 0 to n-1); ReplayError where there are none: the
    figures are medians over the seeds."""
    if isinstance(seeds, int):
        if seeds < 1:
            raise ReplayError(f"--seeds: {seeds} is not a positive number of simulated runs")
        return list(range(seeds))
    out = list(seeds)
    if not out:
        raise ReplayError("--seeds: no seeds given")
    return out


def strategies(names: str | None) -> tuple[list[str], str | None]:
    """pipe replay --agent: the strategies named (comma-separated; None: the registry's
    default bench), or why they cannot be replayed."""
    agents = [x.strip() for x in names.split(",") if x.strip()] if names is not None else bench_default()
    if not agents:
        return agents, (f"no strategy named in {names!r} (give one or more, comma-separated; "
                        f"replayable: {', '.join(sorted(replayable()))})")
    unknown = [x for x in agents if x not in replayable()]
    if unknown:
        return agents, (f"unknown or not replayable: {', '.join(unknown)} "
                        f"(replayable: {', '.join(sorted(replayable()))})")
    return agents, None


def valid_configs(dataset: Dataset) -> list[dict]:
    return list(dataset.space)


def _within(dataset: Dataset, configs: Sequence[dict], x: float) -> int:
    """k: how many valid configurations are timed within x of the best."""
    limit = dataset.best * (1 + x)
    k = 0
    for c in configs:
        t = dataset.lookup(c)
        if t["status"] == "ok" and t["objective"] and t["objective"] <= limit:
            k += 1
    return k


def expected_random(size: int, k: int) -> float:
    """Expected draws without replacement from `size` items until one of `k` marked ones."""
    return (size + 1) / (k + 1)


def table_times(dataset: Dataset) -> list[float] | None:
    """The best dispatch table: each timed shape's fastest time among the space's correct
    configurations. None where no trial has per-shape times."""
    rows = [t["times"] for t in dataset.results.values()
            if t["status"] == "ok" and t.get("times") and dataset.space.contains(t["params"]) is None]
    return [_least(*col) for col in zip(*rows)] if rows else None


def _least(*times):
    """The fastest of some times of one shape; None (a shape the configuration does not serve,
    a range dataset's unserved size) counts as no time, and is the answer only where all are."""
    have = [x for x in times if x is not None]
    return min(have) if have else None


def _table_geomean(table: list | None) -> float | None:
    """The table's geometric mean; None until every shape has a time."""
    return _geomean(table) if table and all(x is not None for x in table) else None


def table_best(dataset: Dataset) -> float | None:
    """The geometric-mean time of the best dispatch table (table_times)."""
    return _table_geomean(table_times(dataset))


def _fold(table: list[float] | None, h: Seen) -> list[float] | None:
    """The dispatch table (each shape's fastest time so far) after evaluation h."""
    if not h.times:
        return table
    return list(h.times) if table is None else [_least(a, b) for a, b in zip(table, h.times)]


def table_curve(history: Sequence[Seen]) -> list[float | None]:
    """After each evaluation, the geometric-mean time of the table built so far (None
    until a trial gave per-shape times)."""
    cur: list[float] | None = None
    out: list[float | None] = []
    for h in history:
        cur = _fold(cur, h)
        out.append(_table_geomean(cur))
    return out


def run_once(dataset: Dataset, agent_name: str, seed: int, options: Mapping[str, Any] | None = None,
             budget: int | None = None, stop_at: float | None = None,
             table_at: float | None = None, patience: int | None = None) -> list[Seen]:
    """One simulated tuning run; stops early once the best so far is within `stop_at` of the
    best (and, with `table_at`, the dispatch table so far within `table_at` of the best table),
    or, with `patience`, where the loop's patience would stop it."""
    return simulate(dataset, agent_name, seed, options, budget, stop_at, table_at, patience)[0]


def simulate(dataset: Dataset, agent_name: str, seed: int, options: Mapping[str, Any] | None = None,
             budget: int | None = None, stop_at: float | None = None,
             table_at: float | None = None, patience: int | None = None) -> tuple[list[Seen], str]:
    """run_once, and why it stopped: the loop's own proposal filter and stop rules
    (search.core: the trial budget and patience, the best being the fastest so far), or the
    bench's targets ("target reached"), or "space exhausted" as the loop says it."""
    agent = make_agent(agent_name, dataset.space, seed, options or {})
    budget = budget if budget is not None else len(valid_configs(dataset))
    target = dataset.best * (1 + stop_at) if stop_at is not None else None
    tbest = table_best(dataset) if table_at is not None else None
    table_target = tbest * (1 + table_at) if tbest is not None else None
    table: list[float] | None = None
    single_done = target is None
    history: list[Seen] = []
    tried: set[str] = set()
    best: Seen | None = None
    while True:
        stop = limit_reason(history, best, budget, patience=patience)
        if stop:
            return history, stop
        p = next_proposal(agent, lambda: history, tried, dataset.space)
        if p is None:
            return history, "space exhausted"
        cfg = dict(p.params)
        t = dataset.lookup(cfg)
        tried.add(trial_key(cfg))
        ok = t["status"] == "ok"
        h = Seen(cfg, t["status"], t.get("reason", ""), t["objective"],
                 times=tuple(t["times"]) if ok and t.get("times") else None)
        history.append(h)
        if ok and h.objective is not None and (best is None or h.objective < best.objective):
            best = h
        table = _fold(table, h)
        if target is not None and ok and t["objective"] and t["objective"] <= target:
            single_done = True
        now = _table_geomean(table)
        table_done = table_target is None or (now is not None and now <= table_target)
        if single_done and table_done and (target is not None or table_target is not None):
            return history, "target reached"


def evals_to(history: Sequence[Seen], target: float, budget: int) -> int:
    """1-based index of the first evaluation at or below target; budget + 1 if none."""
    for i, h in enumerate(history, 1):
        if h.status == "ok" and h.objective is not None and h.objective <= target:
            return i
    return budget + 1


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), on a sorted copy."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def replay(dataset: Dataset | str | Path, agent_name: str, seeds: Iterable[int] | int,
           options: Mapping[str, Any] | None = None, budget: int | None = None,
           thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """Simulate tuning `dataset` with `agent_name` once per seed; figures per threshold.

    Returns {"dataset", "agent", "size" (valid configs), "seeds", "budget", "best",
    "thresholds": {x: {"k", "e_random", "median", "p25", "p75", "min", "max", "mean",
    "score", "evals": [per seed], "missed": runs that never got within x}}}.
    """
    seeds = _seeds(seeds)
    ds = dataset if isinstance(dataset, Dataset) else load(dataset)
    configs = valid_configs(ds)
    size = len(configs)
    budget = budget if budget is not None else size
    stop_at = min(thresholds)
    tbest = table_best(ds)
    runs = [run_once(ds, agent_name, s, options, budget, stop_at, stop_at if tbest else None) for s in seeds]
    recorded = sum(1 for c in configs if config_key(c) in ds.results)
    out: dict[str, Any] = {"dataset": Path(ds.path).stem, "agent": agent_name, "size": size, "recorded": recorded,
                           "seeds": len(seeds), "budget": budget, "best": ds.best, "thresholds": {},
                           "table_best": tbest, "table": {}}
    curves = [table_curve(h) for h in runs] if tbest else []
    for x in thresholds if tbest else ():
        ev = [next((i for i, g in enumerate(c, 1) if g is not None and g <= tbest * (1 + x)), budget + 1)
              for c in curves]
        out["table"][x] = {"median": statistics.median(ev), "p25": _quantile(ev, 0.25),
                           "p75": _quantile(ev, 0.75), "min": min(ev), "max": max(ev), "evals": ev,
                           "missed": sum(e > budget for e in ev)}
    for x in thresholds:
        k = _within(ds, configs, x)
        ev = [evals_to(h, ds.best * (1 + x), budget) for h in runs]
        e_rand = expected_random(size, k)
        med = statistics.median(ev)
        out["thresholds"][x] = {
            "k": k, "e_random": e_rand, "median": med,
            "p25": _quantile(ev, 0.25), "p75": _quantile(ev, 0.75),
            "min": min(ev), "max": max(ev), "mean": statistics.fmean(ev),
            "score": (e_rand - med) / (e_rand - 1) if e_rand > 1 else 0.0,
            "evals": ev, "missed": sum(e > budget for e in ev),
        }
    return out


def replay_patience(dataset: Dataset | str | Path, agent_name: str, seeds: Iterable[int] | int, patience: int,
                    options: Mapping[str, Any] | None = None, budget: int | None = None) -> dict:
    """Where a run with this patience stops, and how good its dispatch table is then: per seed
    the evaluations made, the table's geometric-mean time over the best table's, and the worst
    shape's time over that shape's best in the space."""
    seeds = _seeds(seeds)
    ds = dataset if isinstance(dataset, Dataset) else load(dataset)
    best = table_times(ds)
    if not best:
        raise ValueError(f"{ds.path}: no per-shape times to build a table from")
    stops, tables, worst = [], [], []
    for s in seeds:
        h = run_once(ds, agent_name, s, options, budget, patience=patience)
        table = None
        for e in h:
            table = _fold(table, e)
        stops.append(len(h))
        got, ref = _table_geomean(table), _table_geomean(best)
        tables.append(got / ref if got is not None and ref else math.inf)
        worst.append(max((math.inf if x is None else x / b) for x, b in zip(table, best) if b is not None)
                     if table else math.inf)
    q = lambda xs: {"median": statistics.median(xs), "p75": _quantile(xs, 0.75), "max": max(xs)}  # noqa: E731
    return {"dataset": Path(ds.path).stem, "agent": agent_name, "patience": patience, "seeds": len(seeds),
            "evals": q(stops), "table": q(tables), "worst_shape": q(worst)}


def format_patience(r: dict) -> str:
    e, tb, w = r["evals"], r["table"], r["worst_shape"]
    return (f"{r['dataset']} {r['agent']} patience {r['patience']}: stops after {_num(e['median'])} evaluations "
            f"(p75 {_num(e['p75'])}, max {e['max']}); table {tb['median']:.4f} of the best table "
            f"(p75 {tb['p75']:.4f}); worst shape {w['median']:.4f} of its best (p75 {w['p75']:.4f}, max {w['max']:.4f})")


def datasets(folder: str | Path = Path(__file__).resolve().parents[2] / "datasets") -> list[Path]:
    return sorted(Path(folder).glob("*.json"))


def bench(datasets_: Iterable[Dataset | str | Path], agents: Iterable[str] | None = None,
          seeds: Iterable[int] | int = 25, options: Mapping[str, Mapping[str, Any]] | None = None,
          thresholds: Sequence[float] = THRESHOLDS) -> list[dict]:
    """One row per (dataset, agent): the replay figures flattened for a table (agents: the
    registry's bench strategies by default; one that is not replayable is left out)."""
    agents = bench_default() if agents is None else list(agents)
    rows = []
    seeds = _seeds(seeds)
    for d in datasets_:
        ds = d if isinstance(d, Dataset) else load(d)
        for a in agents:
            if a not in replayable():
                continue
            r = replay(ds, a, seeds, (options or {}).get(a), thresholds=thresholds)
            row = {"dataset": r["dataset"], "agent": a, "size": r["size"], "recorded": r["recorded"],
                   "seeds": r["seeds"]}
            for x, f in r["thresholds"].items():
                p = f"{round(x * 100)}%"
                row[f"k@{p}"] = f["k"]
                row[f"random@{p}"] = f["e_random"]
                row[f"median@{p}"] = f["median"]
                row[f"p25@{p}"] = f["p25"]
                row[f"p75@{p}"] = f["p75"]
                row[f"min@{p}"] = f["min"]
                row[f"max@{p}"] = f["max"]
                row[f"score@{p}"] = f["score"]
                row[f"missed@{p}"] = f["missed"]
                tf = r["table"].get(x)
                if tf:
                    row[f"table@{p}"] = tf["median"]
                    row[f"table_p25@{p}"], row[f"table_p75@{p}"] = tf["p25"], tf["p75"]
            rows.append(row)
    return rows


def _num(v: float) -> str:
    return f"{v:g}" if float(v).is_integer() else f"{v:.1f}"


def format_table(rows: Sequence[dict], thresholds: Sequence[float] = THRESHOLDS) -> str:
    """A plain-text table under 100 columns: one block per dataset, one line per agent and
    threshold with median evaluations [p25-p75] (min-max), random search's expectation,
    the score and the dispatch table's figure. `pipe replay --json` has every figure too."""
    if not rows:
        return "(no datasets)"
    tables = any(f"table@{round(x * 100)}%" in r for r in rows for x in thresholds)
    head = ["agent", "within", "evals med [p25-p75] (min-max)", "E_rand", "score"]
    if tables:  # evaluations until the per-shape dispatch table is within x of the best table
        head.append("table med [p25-p75]")
    blocks: dict[str, list[dict]] = {}
    for r in rows:
        blocks.setdefault(r["dataset"], []).append(r)
    bodies = []
    for name, rs in blocks.items():
        body = []
        for r in rs:
            for j, x in enumerate(thresholds):
                p = f"{round(x * 100)}%"
                miss = f", {r[f'missed@{p}']} missed" if r.get(f"missed@{p}") else ""
                line = [r["agent"] if j == 0 else "", p,
                        f"{_num(r[f'median@{p}'])} [{_num(r[f'p25@{p}'])}-{_num(r[f'p75@{p}'])}] "
                        f"({r[f'min@{p}']}-{r[f'max@{p}']}){miss}",
                        f"{r[f'random@{p}']:.1f}", f"{r[f'score@{p}']:+.2f}"]
                if tables:
                    line.append(f"{_num(r[f'table@{p}'])} [{_num(r[f'table_p25@{p}'])}-"
                                f"{_num(r[f'table_p75@{p}'])}]" if f"table@{p}" in r else "-")
                body.append(line)
        seeds = sorted({r["seeds"] for r in rs})
        part = rs[0]["recorded"]
        partial = (f" (a partial dataset, {part} of them recorded: the rest count as failed evaluations, "
                   "and the best is the best recorded)") if part < rs[0]["size"] else ""
        bodies.append((f"{name}: {rs[0]['size']} valid configurations{partial}, "
                       f"{' or '.join(map(str, seeds))} seed{'s' if seeds != [1] else ''}", body))
    widths = [max(len(h), *(len(b[i]) for _, body in bodies for b in body)) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = []
    for title, body in bodies:
        out += [title, fmt(head), fmt(["-" * w for w in widths])] + [fmt(b) for b in body] + [""]
    legend = ("evals: evaluations until the best so far is within x of the best configuration (over "
              "the seeds); E_rand: random search's expected evaluations; score: 1 finds the best at "
              "once, 0 is no better than random search")
    legend += ("; table: evaluations until the per-shape dispatch table is within x of the best table."
               if tables else ".")
    return "\n".join(out + textwrap.wrap(legend, 92))


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m runner.search.replay", description=__doc__.split("\n")[0])
    ap.add_argument("datasets", nargs="*", help="dataset files (default: datasets/*.json)")
    ap.add_argument("--agents", default=",".join(bench_default()),
                    help="comma-separated strategies (default: %(default)s; gp, where scipy is "
                         "installed, is left out as slow)")
    ap.add_argument("--seeds", type=int, default=25)
    a = ap.parse_args(argv)
    agents = [s for s in a.agents.split(",") if s]
    unknown = [s for s in agents if s not in replayable()]
    if unknown:
        ap.error(f"unknown or unavailable strategies: {', '.join(unknown)} "
                 f"(known: {', '.join(sorted(replayable()))})")
    try:
        print(format_table(bench(a.datasets or datasets(), agents, a.seeds)))
    except PipeError as e:  # a dataset that is not one, no seeds: said as pipe replay says it
        ap.exit(2, f"{ap.prog}: {e}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
