"""The autoresearch loop.

    propose → render → forbid → compile → verify → time → decide → record → stop?

Each trial's row is committed before the next trial starts. Re-running on the
same run folder resumes: finished trials are never repeated (the loop drops
proposals already in the ledger), an interrupted trial is tried again, and
budgets count everything the ledger holds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from . import log as logmod
from .agents import Seen, make_agent
from .judge.worker import Worker
from .ledger import Ledger, Trial, tsv, write_atomic
from .progress import Reporter
from .space import config_key
from .trial import Evaluator

EXIT_GOAL, EXIT_BUDGET, EXIT_INPUT = 0, 1, 2


@dataclass
class Outcome:
    exit_code: int
    stop: str
    best: Trial | None
    trials: int


def shape_label(shape: dict) -> str:
    return "x".join(str(v) for v in shape.values())


def run(spec, run_dir: Path, max_trials: int | None = None, minutes: float | None = None,
        reporter: Reporter | None = None, keep_decisions: bool = True) -> Outcome:
    log = logmod.get().bind(run=str(run_dir))
    ledger = Ledger.open(run_dir, spec.hash, spec.name, spec.path)
    history = ledger.trials()
    budget_trials = max_trials or spec.goal.trials
    budget_s = (minutes or spec.goal.minutes or 0) * 60 or None
    reporter = reporter or Reporter(budget_trials)
    worker = Worker(spec, str(run_dir / "worker.log"))
    log.info("run.start", spec=spec.path, spec_hash=spec.hash, resumed_trials=len(history),
             agent=spec.agent.strategy, goal=spec.goal.describe())
    try:
        baseline = _baseline(spec, ledger, worker, log)
        ev = Evaluator(spec, worker, baseline)
        agent = make_agent(spec.agent.strategy, spec.space, spec.agent.seed, spec.agent.options)
        for key, n in ledger.interrupted().items():  # a trial that killed the runner twice is not retried
            if n >= 2 and key not in {t.key for t in history}:
                t = Trial(params=json.loads(key), status="crashed", agent="runner", spec_hash=spec.hash,
                          reason=f"the runner died {n} times during this trial", started_at=time.time(),
                          finished_at=time.time())
                history.append(ledger.append(t))
        best = _best(history)
        _write_outputs(spec, run_dir, ledger, history, best, ev, "running", None)
        session_t0 = time.time()
        elapsed_before = sum(t.wall_s for t in history)
        stop = None
        while True:
            stop = _stop_reason(spec, history, best, budget_trials, budget_s,
                                elapsed_before + time.time() - session_t0)
            if stop:
                break
            cand = _next(spec, agent, history)
            if cand is None:
                stop = "space exhausted"
                break
            ledger.begin(config_key(cand))
            t = ev.run(cand, agent.name)
            if keep_decisions:
                ev.decide(t, best)
            elif t.status == "ok" and (best is None or t.objective < best.objective):
                t.kept = True  # recording a space: the fastest so far, without paired re-timing
            t = ledger.append(t)
            history.append(t)
            if t.kept:
                best = t
                _write_best(spec, run_dir, ev, best)
            log.debug("trial.done", id=t.id, status=t.status, params=t.params, objective=t.objective,
                      kept=t.kept, reason=t.reason or None)
            reporter.trial(t, best, len(history))
            with open(run_dir / "trials.tsv", "a", encoding="utf-8") as f:
                f.write(tsv([t], [shape_label(s) for s in spec.op.shapes]).split("\n", 1)[1])
        met = best is not None and spec.goal.met(best.metric)
        _write_outputs(spec, run_dir, ledger, history, best, ev, "goal met" if met else stop, stop)
        log.info("run.end", stop=stop, trials=len(history), best_id=best.id if best else None,
                 best_objective_s=best.objective if best else None, goal_met=met)
        return Outcome(EXIT_GOAL if met else EXIT_BUDGET, stop, best, len(history))
    finally:
        reporter.close()
        worker.close()
        ledger.close()


def _next(spec, agent, history: list[Trial]) -> dict | None:
    tried = {t.key for t in history}
    if spec.start is not None and config_key(spec.start) not in tried:
        return dict(spec.start)
    seen = [Seen(t.params, t.status, t.reason, t.objective) for t in history]
    for _ in range(3):
        for cand in agent.propose(seen, 1):
            if config_key(cand) not in tried and spec.space.contains(cand) is None:
                return cand
    return None


def _stop_reason(spec, history, best, budget_trials, budget_s, elapsed) -> str | None:
    if best is not None and spec.goal.met(best.metric):
        return "goal met"
    if budget_trials is not None and len(history) >= budget_trials:
        return f"trial budget spent ({budget_trials})"
    if budget_s is not None and elapsed >= budget_s:
        return f"time budget spent ({budget_s / 60:g} min)"
    if spec.goal.patience and best is not None:
        since = len(history) - next(i for i, t in enumerate(history) if t.id == best.id) - 1
        if since >= spec.goal.patience:
            return f"patience ran out ({since} trials without a keep)"
    return None


def _best(history: list[Trial]) -> Trial | None:
    kept = [t for t in history if t.kept]
    return kept[-1] if kept else None


def _baseline(spec, ledger: Ledger, worker: Worker, log) -> list[float] | None:
    if spec.baseline == "none":
        return None
    have = ledger.get_meta("baseline")
    if have:
        return json.loads(have)["times"]
    r = worker.request(("baseline", spec.baseline), spec.runtime.timeout_s * 4)
    if r["status"] != "ok":
        log.warning("baseline.failed", reason=r.get("reason"))
        return None
    times = [s["median"] for s in r["shapes"]]
    ledger.set_meta("baseline", json.dumps({"mode": spec.baseline, "times": times, "shapes": r["shapes"]}))
    log.info("baseline.done", mode=spec.baseline, times_us=[round(t * 1e6, 3) for t in times])
    return times


def _write_best(spec, run_dir: Path, ev: Evaluator, best: Trial) -> None:
    d = run_dir / "best"
    d.mkdir(exist_ok=True)
    sources = ev.sources.get(best.key) or ev.render_all(best.params)
    ext = ".cu" if spec.kernel.backend == "cuda" else ".cpp"
    unique = list(dict.fromkeys(sources))
    for i, src in enumerate(unique):
        name = f"kernel{ext}" if len(unique) == 1 else f"kernel.shape{sources.index(src)}{ext}"
        write_atomic(d / name, src)
    write_atomic(d / "params.json", json.dumps(
        {"trial": best.id, "params": best.params, "objective_s": best.objective, "metric": best.metric,
         "times_s": best.times, "shapes": spec.op.shapes, "source_hash": best.source_hash}, indent=2) + "\n")


def _write_outputs(spec, run_dir, ledger, history, best, ev, status, stop) -> None:
    write_atomic(run_dir / "trials.tsv", tsv(history, [shape_label(s) for s in spec.op.shapes]))
    if best is not None and not (run_dir / "best" / "params.json").exists():
        _write_best(spec, run_dir, ev, best)
    summary = summarize(spec.name, spec.path, spec.hash, ledger, history, status, stop, spec.goal.describe())
    write_atomic(run_dir / "run.json", json.dumps(summary, indent=2, default=str) + "\n")


def summarize(name, path, spec_hash, ledger, history, status, stop, goal) -> dict:
    counts: dict[str, int] = {}
    for t in history:
        counts[t.status] = counts.get(t.status, 0) + 1
    best = _best(history)
    first_ok = next((t for t in history if t.status == "ok"), None)
    base = ledger.get_meta("baseline")
    return {
        "spec": name, "spec_path": path, "spec_hash": spec_hash, "status": status, "stop": stop, "goal": goal,
        "trials": len(history), "by_status": counts,
        "baseline": json.loads(base) if base else None,
        "first_ok": {"trial": first_ok.id, "params": first_ok.params, "objective_s": first_ok.objective}
        if first_ok else None,
        "best": {"trial": best.id, "params": best.params, "objective_s": best.objective, "metric": best.metric,
                 "times_s": best.times, "spreads": best.spreads, "shapes": best.details.get("shapes"),
                 "source_hash": best.source_hash} if best else None,
        "ledger_intact": ledger.verify_chain() is None,
    }
