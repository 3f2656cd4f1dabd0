"""Every shipped spec's start configurations judged once: a sweep for false positives.

    python tools/eval_sweep.py [--glob 'pipelines/*-h200.yaml' | SPEC ...] [--timeout 120] [--no-hw-check] [--out DIR]

For each spec matched, `pipe eval SPEC --params {}` (the spec's start) in a run folder of its own,
each in a child process with a wall-clock limit; a spec with no start (the range specs) gets
`pipe run SPEC --max-trials --trials` instead, every trial of it counted. The judge's verification (value sets, placements,
guard bands, the timed calls' checks) changes from session to session; an honest kernel the
search kept before must still be `ok`. Prints one line per spec (status, reason, wall time) and
exits 1 if any is not `ok` (a spec cut off by the limit counts as not `ok`).
"""

from __future__ import annotations

import argparse
import glob
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.spec.spec import load_spec  # noqa: E402


def verdict(r, started: bool, run: Path) -> tuple[str, str]:
    """(status, reason) of one spec: pipe eval's JSON, or every trial of the run's ledger."""
    last = (r.stderr.strip().splitlines() or [""])[-1]
    if started:
        try:
            v = json.loads(r.stdout)
            return v.get("status", "?"), v.get("reason", "")
        except json.JSONDecodeError:
            return f"exit {r.returncode}", last
    from runner.ship.rundata import open_run

    try:
        trials = open_run(run, None, "sweep").history
    except Exception as e:  # noqa: BLE001 - no ledger: the run's own error says why
        return f"exit {r.returncode}", f"{last} ({type(e).__name__})"
    if not trials:
        return f"exit {r.returncode}", last
    odd = [t for t in trials if t.status != "ok"]
    return ("ok" if not odd else odd[0].status), (f"{len(odd)} of {len(trials)} trials not ok: {odd[0].reason}"
                                                   if odd else f"{len(trials)} trials")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="*", help="spec files (default: those --glob matches)")
    ap.add_argument("--glob", default="pipelines/*-h200.yaml")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a spec (its compile and judge)")
    ap.add_argument("--no-hw-check", action="store_true", help="judge on a GPU the profiles do not name")
    ap.add_argument("--out", default="", help="folder for the run folders (default: a temporary one)")
    ap.add_argument("--trials", type=int, default=2, help="trials of a spec with no start (pipe run)")
    a = ap.parse_args()
    specs = [str(Path(p).resolve()) for p in a.specs] or sorted(glob.glob(str(ROOT / a.glob)))
    if not specs:
        print(f"no spec matches {a.glob}", file=sys.stderr)
        return 2
    out = Path(a.out or tempfile.mkdtemp(prefix="eval-sweep-"))
    bad = 0
    for spec in specs:
        name = Path(spec).stem
        started = load_spec(spec).start is not None
        cmd = ([sys.executable, "-m", "runner", "eval", spec, "--params", "{}", "--json"] if started else
               [sys.executable, "-m", "runner", "run", spec, "--max-trials", str(a.trials)])
        cmd += ["--run-dir", str(out / name)] + (["--no-hw-check"] if a.no_hw_check else [])
        t0 = time.time()
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.timeout)
            status, reason = verdict(r, started, out / name)
        except subprocess.TimeoutExpired:
            status, reason = "cut off", f"past {a.timeout:.0f} s"
        bad += status != "ok"
        print(f"{name:36s} {status:10s} {time.time() - t0:6.1f} s  {reason[:300]}", flush=True)
    print(f"\n{len(specs) - bad} of {len(specs)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
