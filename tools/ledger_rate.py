"""Trials a minute of a run folder's ledger: by wall clock from the first trial's start to
the last one's end, and by the sum of the trials' own wall time; with the median judge
phases of the trials the worker timed, and the lean of verification's errors (the widest a
trial saw, runner.judge.verify.lean) across them.

    python tools/ledger_rate.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys


def rate(run_dir: str) -> str:
    db = sqlite3.connect(f"{run_dir}/ledger.db")
    rows = db.execute("SELECT status, started_at, finished_at, wall_s, details FROM trials ORDER BY id").fetchall()
    if not rows:
        return f"{run_dir}: no trials"
    span = max(r[2] for r in rows) - min(r[1] for r in rows)
    own = sum(r[3] or 0 for r in rows)
    ok = sum(1 for r in rows if r[0] == "ok")
    phases = [json.loads(r[4] or "{}").get("judge_phases") for r in rows]
    phases = [p for p in phases if p]
    med = {k: round(statistics.median(p[k] for p in phases), 4) for k in phases[0]} if phases else {}
    judge = [json.loads(r[4] or "{}").get("judge_wall_s") for r in rows]
    judge = [j for j in judge if j]
    build = [json.loads(r[4] or "{}").get("build_wall_s") for r in rows]
    build = [b for b in build if b is not None]
    leans = [json.loads(r[4] or "{}").get("lean") for r in rows]
    leans = sorted((x["mean"] for x in leans if x), key=abs)
    lean = (f"; verification's lean (units of the output's rounding) over {len(leans)} trials: median |lean| "
            f"{statistics.median(abs(x) for x in leans):.4f}, widest {leans[-1]:+.4f}" if leans else "")
    return (f"{run_dir}: {len(rows)} trials ({ok} ok) in {span:.1f} s: {len(rows) / span * 60:.0f} a minute by the "
            f"clock, {len(rows) / own * 60:.0f} by the trials' own wall time; median judge round trip "
            f"{statistics.median(judge) if judge else float('nan'):.3f} s, median build "
            f"{statistics.median(build) if build else float('nan'):.4f} s, phases {json.dumps(med)}{lean}")


if __name__ == "__main__":
    for d in sys.argv[1:]:
        print(rate(d))
