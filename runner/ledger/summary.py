"""run.json's and pipe show's summary of a run, and the line a goal check prints."""

from __future__ import annotations

import json
import sqlite3

from ..core import figures


def _kernels_text(ids: list) -> str:
    """A goal check's kernels: '#3', or 'the dispatch table (#3, #5)'."""
    return f"#{ids[0]}" if len(ids) == 1 else "the dispatch table (" + ", ".join(f"#{i}" for i in ids) + ")"


def goal_check_line(spec, c: dict) -> str:
    """One line for a goal check: the figure, its spread over paired rounds, the verdict.
    `spec` may be None: a check carries its goal's words (checks recorded before they did
    need the spec)."""
    what = _kernels_text(list(dict.fromkeys(c.get("kernels", []))))
    if c.get("error"):
        return f"goal check of {what}: not confirmed: {c['error']}"
    against = f" against {'torch eager' if c['against'] == 'reference' else 'torch.compile'}" if c.get("against") else ""
    rng = f", range {c['min']:.3f}-{c['max']:.3f}" if "min" in c else ""
    name = c.get("metric_name") or spec.goal.metric
    goal = c.get("goal") or spec.goal.describe()
    on = c.get("judged_on") or f"{'lower' if spec.goal.at_least is not None else 'upper'} quartile"
    return (f"goal check of {what}: {name} {c['metric']:.3f} (quartiles {c['low']:.3f}-{c['high']:.3f}"
            f"{rng} over {c['rounds']} paired rounds{against}): {'met' if c['met'] else 'not met'} "
            f"({goal}, judged on the {on})")


def goal_by_text(c: dict | None, best_id: int) -> str | None:
    """Where a met goal check's kernels are not the best configuration alone (the goal was met
    by each shape's fastest trial, what pipe export ships, while the paired keep decisions kept
    another as the best): which kernels met it, for the run's last line; else None. The best's
    own recorded figure may then lie below the goal, and the line must not read as if it met it."""
    if not c or not c.get("met") or c.get("error"):
        return None
    ids = list(dict.fromkeys(c.get("kernels", [])))
    if not ids or ids == [best_id]:
        return None
    where = " on every shape" if len(ids) == 1 else ""
    return f"the goal was met by {_kernels_text(ids)}{where}, which pipe export ships"


def summarize(name, path, spec_hash, ledger, history, status, stop, goal,
              table_metric: float | None = None, check=None, goal_check: dict | None = None) -> dict:
    """run.json's and pipe show's summary. The best, the first correct trial and each shape's
    best come from the rows the ledger's check trusts (before its first bad row), never from
    a row after an edit or a gap; the counts are of every row."""
    check = check if check is not None else ledger.verify()
    damaged = getattr(ledger, "damaged", None) or getattr(ledger, "truncated", None)  # pages lost

    def safe(fn):  # on a damaged ledger what cannot be read is left out, not a crash
        try:
            return fn()
        except sqlite3.DatabaseError:
            return None

    counts: dict[str, int] = {}
    for t in history:
        counts[t.status] = counts.get(t.status, 0) + 1
    trusted = check.trusted(history)
    kept = [t for t in trusted if t.kept]
    best = kept[-1] if kept else None
    first_ok = next((t for t in trusted if t.status == "ok"), None)
    base = safe(lambda: ledger.get_meta("baseline")) if damaged else ledger.get_meta("baseline")
    if goal_check is None:  # pipe show: the last check recorded (at_trial says when)
        goal_check = (json.loads((safe(lambda: ledger.get_meta("goal_checks")) if damaged
                                  else ledger.get_meta("goal_checks")) or "[]") or [None])[-1]
    replies = safe(ledger.replies) if damaged else ledger.replies()
    return {
        "spec": name, "spec_path": path, "spec_hash": spec_hash, "status": status, "stop": stop, "goal": goal,
        "trials": len(history), "by_status": counts,
        "baseline": json.loads(base) if base else None,
        "first_ok": {"trial": first_ok.id, "params": first_ok.params, "objective_s": first_ok.objective}
        if first_ok else None,
        "best": {"trial": best.id, "params": best.params, "variant": best.variant, "objective_s": best.objective,
                 "metric": best.metric, "times_s": best.times, "spreads": best.spreads,
                 "shapes": best.details.get("shapes"), "source_hash": best.source_hash,
                 # the SM clock and power over each shape's timing (judge/clocks.py), where sampled
                 **({"clocks": best.details["clocks"]} if best.details.get("clocks") else {}),
                 # the widest lean of its verification's errors (judge/verify.lean), where taken
                 **({"lean": best.details["lean"]} if best.details.get("lean") else {}),
                 **({"precision": best.details["precision"]} if best.details.get("precision") else {})}
        if best else None,
        "best_per_shape": figures.per_shape_best(trusted, len(best.times)) if best and best.times else None,
        # the goal's metric for the dispatch table of best_per_shape (a goal met by it stops the run)
        "table_metric": table_metric,
        # the latest paired re-measurement of the kernels that looked as if they met the goal
        "goal_check": goal_check,
        "variants": safe(lambda: len(ledger.variants())) if damaged else len(ledger.variants()),
        "replies": len(replies) if replies is not None else None,
        # a command agent's confinement as the last run that asked it recorded it (search/agents/confine.py)
        "agent_confinement": confinement(replies or []),
        "ledger_intact": check.intact,
        "ledger": check.as_dict(),
    }


def confinement(replies: list[dict]) -> dict | None:
    """A command agent's confinement as the last run that asked it recorded it in the ledger's
    replies (search/agents/confine.py): {"confined", "detail"}, or None."""
    return next(({"confined": r["outcome"] == "confined", "detail": r["feedback"]}
                 for r in reversed(replies) if r["outcome"] in ("confined", "unconfined")), None)
