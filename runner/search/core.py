"""The search core: the rules of a search, which the loop (runner.loop) and the replay
bench (search.replay) both run, so a replay figure predicts a run.

- next_proposal: what is judged next (owed proposals first, then the agent's; a repeat or
  a point outside the space is dropped and the agent asked again);
- stop rules: the goal (with a paired re-measurement, the loop's), the trial and time
  budgets, and patience (evaluations without a new best or a shape beaten);
- what to build ahead while a trial is judged (ahead_plan), for pure agents.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

from ..core import figures
from ..core.records import Trial, trial_key, variant_id
from .agents import Proposal, Seen, as_proposal

AHEAD = 2  # the next trial's guesses built during each judge (Session._build_ahead, ahead_plan)
DEEP = 1  # and the trial after next's, one judge earlier
ASKS = 3  # times an agent is asked for an untried point of the space before the search ends


def next_proposal(agent, seen: Callable[[], list[Seen]], tried: set[str], space, owed: Iterable[Proposal] = (),
                  after_ask: Callable[[], None] | None = None, n: int = 1,
                  rest: list | None = None) -> Proposal | None:
    """The next candidate: the first of `owed` (the spec's start configurations, a trial the
    runner died in) that is untried and in the space, else the agent's first proposal that is,
    asking it up to ASKS times; None when it has nothing left. `seen` gives the history the
    agent sees; `after_ask` runs after each ask (the loop writes a context-reading agent's
    replies to the ledger there, before its trial runs). `n`: how many the agent is asked for at
once (a scaled-out run asks for its trials in flight and its free slots: the trials in
flight are in `tried` and not yet in the history the agent sees). `rest`: where the reply's
other fresh proposals go (for the other free slots, without asking again)."""
    for p in owed:
        if untried(p, tried, space):
            return p
    for _ in range(ASKS):
        props = [as_proposal(raw) for raw in agent.propose(seen(), n)]
        if after_ask is not None:
            after_ask()
        fresh = [p for p in props if untried(p, tried, space)]
        if fresh:
            if rest is not None:
                keys = {_key(fresh[0])}
                for p in fresh[1:]:
                    if _key(p) not in keys:
                        keys.add(_key(p))
                        rest.append(p)
            return fresh[0]
    return None


def _key(p: Proposal) -> str:
    return trial_key(dict(p.params), variant_id(p.variant) if p.variant is not None else None)


def untried(p: Proposal, tried: set[str], space) -> bool:
    """Not tried yet (trials in flight are in `tried`) and in the space."""
    return _key(p) not in tried and space.contains(dict(p.params)) is None


BROKEN_AFTER = 4  # trials, every one failing to build the same way, after which a run warns


def broken_reason(history) -> str | None:
    """A warning, once a run's first BROKEN_AFTER trials all failed to compile (or all failed to
    render) with one and the same error, word for word, and none built: the template may not
    build at any parameters. Only a warning: a parameter-dependent static_assert fails alike at
    every value it refuses."""
    kinds = {t.status for t in history}
    if len(history) < BROKEN_AFTER or len(kinds) != 1 or kinds - {"compile_error", "render_error"}:
        return None  # (one that built, or failed otherwise: the parameters matter)
    if len({t.reason or "" for t in history[:BROKEN_AFTER]}) != 1:
        return None
    why = (history[0].reason or "").strip()
    shape = re.match(r"at \{[^}]*\} \(pipe render (--shape \S+)\)", why)
    at = f" {shape.group(1)}" if shape else ""
    verb = "render" if kinds == {"render_error"} else "compile"
    return (f"the first {len(history)} trials failed to {verb} alike ({why[:300]}): the template may not build "
            f"at any parameters; check it with pipe render SPEC --compile --set ...{at} (the run goes on)")


def stop_reason(spec, history, best, budget_trials, budget_s, elapsed,
                call_minutes: float | None = None, call_elapsed: float = 0.0,
                baseline: list[float] | None = None, confirm=None) -> str | None:
    """Why the run stops before its next trial, or None: the goal met (where the spec stops
    on it; with `confirm`, only once a paired re-measurement confirms it), then limit_reason."""
    if spec.goal.stop_when_met and goal_met(spec, history, best, baseline, confirm):
        return "goal met"
    return limit_reason(history, best, budget_trials, budget_s, elapsed, call_minutes, call_elapsed,
                        spec.goal.patience)


def limit_reason(history, best, budget_trials: int | None, budget_s: float | None = None, elapsed: float = 0.0,
                 call_minutes: float | None = None, call_elapsed: float = 0.0,
                 patience: int | None = None) -> str | None:
    """The budgets (trials, the run's time, this call's time) and patience."""
    if budget_trials is not None and len(history) >= budget_trials:
        return f"trial budget spent ({budget_trials})"
    if budget_s is not None and elapsed >= budget_s:
        return f"time budget spent ({budget_s / 60:g} min)"
    if call_minutes and call_elapsed >= call_minutes * 60:
        return f"time budget spent ({call_minutes:g} min of this call)"
    return patience_reason(history, best, patience)


def patience_reason(history, best, patience: int | None) -> str | None:
    """`patience` trials in a row without progress: a new best, or a shape's best time beaten
    (the run ships each shape's fastest). `best` is the best trial, one of `history`."""
    if not patience or best is None:
        return None
    best_index = next(i for i, t in enumerate(history) if t is best or _same_trial(t, best))
    since = len(history) - figures.last_progress(history, best_index) - 1
    if since >= patience:
        return f"patience ran out ({since} trials without a new best or a faster kernel for a shape)"
    return None


def _same_trial(a, b) -> bool:
    ida = getattr(a, "id", None)
    return ida is not None and ida == getattr(b, "id", None)


class PatienceStop:
    """patience_reason fed one evaluation at a time, the best being the fastest so far (the
    replay bench's, which has no paired re-timing): `add` says whether a run stops after it."""

    def __init__(self, patience: int):
        self.patience, self.history, self.best = patience, [], None

    def add(self, h: Seen) -> bool:
        self.history.append(h)
        if h.status == "ok" and h.objective is not None and (self.best is None or h.objective < self.best.objective):
            self.best = h
        return patience_reason(self.history, self.best, self.patience) is not None


def goal_picks(spec, history, best, baseline) -> list[list[Trial]]:
    """The kernels whose recorded figures meet the goal, one trial per timed shape: the best
    configuration on every shape, and the dispatch table of each shape's fastest kernel so far
    (what the run ships, and what pipe compare times). Empty when neither looks met."""
    if best is None:
        return []
    n = spec.op.named if spec.op.domain else len(spec.op.shapes)  # with op.domain: the listed shapes
    picks = [[best] * n] if spec.goal.met(best.metric) else []
    # the table is confirmed too where it is other kernels than the best (a domain ranks the best over
    # its grid, so even one listed shape may have a faster kernel of its own)
    if best.times and spec.goal.met(figures.table_metric(spec, history, baseline)):
        by_id = {t.id: t for t in history}
        table = [by_id[r["trial"]] for r in figures.per_shape_best(history, n)]
        if [t.id for t in table] != [best.id] * n:
            picks.append(table)
    return picks


def goal_met(spec, history, best, baseline, confirm=None) -> bool:
    """The best configuration meets the goal, or the dispatch table does; with `confirm`
    (Session.confirm_goal), only if a paired re-measurement of those kernels confirms it."""
    picks = goal_picks(spec, history, best, baseline)
    if confirm is None:
        return bool(picks)
    return any(confirm(p) for p in picks)


def outcomes(params: dict, vid: str | None, history, best: float | None) -> list[Seen]:
    """What the trial of `params` may come out as, the likeliest first: slower than the best
    and than each shape's best; the new best, faster on every shape; failed; between the best
    and the next fastest (a random restart's walk centres on the best since the restart);
    slower overall but faster on every shape (a shape's own walk)."""
    oks = [t for t in history if t.status == "ok" and t.objective]
    if not oks:
        return [Seen(params, "wrong", "", None, vid)]
    best = best or min(t.objective for t in oks)
    timed = [t.times for t in oks if t.times]
    table = [min((x for x in col if x is not None), default=None) for col in zip(*timed)] if timed else None
    if table is not None and any(x is None for x in table):
        table = None
    scaled = lambda f: tuple(x * f for x in table) if table else None  # noqa: E731
    objs = sorted({t.objective for t in oks})
    out = [Seen(params, "ok", "", best * 1.1, vid, times=scaled(1.1)),
           Seen(params, "ok", "", best * 0.9, vid, times=scaled(0.9)),
           Seen(params, "wrong", "", None, vid)]
    if len(objs) > 1:
        out.append(Seen(params, "ok", "", (objs[0] + objs[1]) / 2, vid, times=scaled(1.05)))
    out.append(Seen(params, "ok", "", best * 1.02, vid, times=scaled(0.99)))
    return out


def ahead_guesses(agent, seen: list[Seen], pending: list[Seen], skip: set[str], space, limit: int) -> list[dict]:
    """The agent's next proposal after each outcome in `pending`, distinct, untried (not in
    `skip`), valid, at most `limit`, in the outcomes' order. Replayed on the whole recorded
    softmax space (pattern, 10 seeds of 250 trials), the first guess is the next trial 85% of
    the time and the first two 99%."""
    return [g for g, _ in _guesses(agent, seen, pending, skip, space, limit)]


def _guesses(agent, seen, pending, skip, space, limit) -> list[tuple[dict, Seen]]:
    """ahead_guesses, each with the outcome it follows."""
    out: list[tuple[dict, Seen]] = []
    keys = set(skip)
    for pend in pending:
        if len(out) >= limit:
            break
        try:
            guess = next(iter(agent.propose([*seen, pend], 1)), None)
        except Exception:  # a guess is never worth a failed run
            return out
        if guess is None:
            continue
        g = as_proposal(guess)
        params = dict(g.params)
        key = trial_key(params, None)
        if g.variant is not None or key in keys or space.contains(params) is not None:
            continue
        keys.add(key)
        out.append((params, pend))
    return out


def ahead_plan(agent, seen: list[Seen], history, params: dict, vid: str | None, best: float | None,
               skip: set[str], space, width: int = AHEAD, deep: int = DEEP) -> list[dict]:
    """What to build while the trial of `params` is judged, the likeliest first: the agent's
    next proposal for each of its likeliest outcomes (`width` of them, ahead_guesses), then
    `deep` proposals for the trial after the first of those (its own outcomes, given the one
    it follows). The build of the trial after next starts one judge earlier: a build that
    takes longer than a judge no longer holds the loop up when the guesses are right."""
    skip = set(skip) | {trial_key(params, vid)}
    firsts = _guesses(agent, seen, outcomes(params, vid, history, best), skip, space, width)
    plan = [g for g, _ in firsts]
    if not firsts or deep < 1:
        return plan
    g1, came = firsts[0]
    after = outcomes(g1, None, [*history, came], min(filter(None, (best, came.objective)), default=None))
    skip |= {trial_key(g, None) for g in plan}
    plan += [g for g, _ in _guesses(agent, [*seen, came], after, skip, space, deep)]
    return plan
