"""Verdict reuse (pipe record --reuse): the verdicts of an earlier run that stand for
this spec's kernels, by the rendered source of every shape and the launch geometry."""

from __future__ import annotations

from pathlib import Path

from ..build import render
from ..build.builder import OLD_TEMPLATE, Builder, geometry_key, sources_hash
from ..core.errors import ExprError, RunDirError
from ..core.records import Trial
from ..ledger.ledger import Ledger
from ..ledger.provenance import MADE_WITH, SPEC_PARTS, made_with, run_parts
from ..ledger.rundir import guard

# what another run's verdict on the same kernels carries over (pipe record --reuse): the
# worker's verdicts that follow from the code (not a fault or hang, which may have been the
# machine's) and the compiler's spill pruning
REUSED = ("ok", "wrong", "impossible", "pruned")


def reusable_verdicts(spec, run_dir: Path, force: bool = False) -> dict[tuple[str, str], tuple[Trial, dict]]:
    """The verdicts of the run in `run_dir` that stand for `spec`, by (the rendered source of
    every shape, launch geometry). That run must have been made with the same spec file,
    hardware profile and reference, and each reused trial judged with this run's compiler and
    judge code (the digest it keeps; a trial that predates it, the digest the run recorded):
    only the template may differ, so a configuration whose every shape renders the same source
    and launches the same way is the same binary judged under the same inputs, shapes,
    tolerances and timing protocol (its times were measured in that run's calls, as a resumed
    sweep's are). Trials judged before per-shape source digests were kept are rendered again
    from the template the run stored. Each reused trial names its origin (details
    `reused_from`: run folder, trial id, when it was judged), the first judging run's where
    that trial was itself reused."""
    run_dir = Path(run_dir).resolve()
    led = Ledger.read(run_dir, damaged_ok=True)
    try:
        old = guard(run_dir, led, force, "reuse its verdicts").trials
        parts, old_template = led.hash_parts(), led.get_meta("template")
    finally:
        led.close()
    if parts is None or any(k not in parts for k in SPEC_PARTS):
        raise RunDirError(f"{run_dir}: that run does not record what its verdicts depend on (it was begun "
                          "by an older pipe); resume it once with the template, compiler and pipe it was "
                          "made with, which adds it, or sweep anew")
    mine = run_parts(spec)
    differ = [k for k in SPEC_PARTS if parts[k] != mine[k]]
    if differ:
        raise RunDirError(f"{run_dir}: made with another {' and '.join(differ)} than this run; only the "
                          "template may differ for its verdicts to stand (the same inputs, shapes, timing, "
                          "hardware and reference)")
    stamp = made_with(mine)
    run_stamp = made_with(parts) if all(k in parts for k in MADE_WITH) else None
    b = Builder(spec)
    if old_template is not None:
        b.variants[OLD_TEMPLATE] = old_template
    out: dict[tuple[str, str], tuple[Trial, dict]] = {}
    for t in old:
        if t.variant is not None or t.status not in REUSED:
            continue
        if t.details.get("made_with", run_stamp) != stamp:  # another compiler or judge
            continue
        key = t.details.get("sources_hash")
        if key is None and old_template is not None:
            try:
                key = sources_hash(b.render_all(t.params, OLD_TEMPLATE))
            except (render.RenderError, ExprError):
                continue
        if key is None:
            continue
        origin = t.details.get("reused_from") or {"run": str(run_dir), "trial": t.id,
                                                  "judged_at": round(t.finished_at, 3)}
        out.setdefault((key, geometry_key(b.geometry(t.params))), (t, origin))
    return out
