"""Is the first figure a new user sees true? Runs the CPU example N times, each in a fresh
run folder, then `pipe compare` on each run, and prints one row per run: the best trial's
own metric (the first speedup the run prints, against the baseline timed at the run's start),
the speedup the run reported (its goal check: median, lowest and highest over paired rounds against torch eager)
and the speedup pipe compare measured on the same shapes (the worst shape's, with the lowest
and highest of its paired rounds), and whether the two agree.

    python benchmarks/first_figure.py [--runs 10] [--spec pipelines/rmsnorm-cpu.yaml] [--out DIR]

Agreement: the compare's range and the run's range overlap. A figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pipe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=ROOT, capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--spec", default="pipelines/rmsnorm-cpu.yaml")
    ap.add_argument("--out", default=None, help="folder for the run folders (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the rows here as JSON")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="pipe-first-figure-"))
    rows = []
    print(f"{'run':>3}  {'exit':>4}  {'trials':>6}  {'trial':>6}  {'run: speedup (lo-hi)':<28}  "
          f"{'compare: worst shape (lo-hi)':<30}  agree")
    for i in range(a.runs):
        d = out / f"run{i}"
        r = pipe("run", a.spec, "--run-dir", str(d), "-q")
        doc = json.loads((d / "run.json").read_text())
        c = doc.get("goal_check") or {}
        cr = pipe("compare", str(d))
        row = {"run": i, "exit": r.returncode, "trials": doc["trials"], "check": c,
               "trial_metric": (doc.get("best") or {}).get("metric")}
        if cr.returncode == 0:
            cmp_doc = json.loads((d / "compare.json").read_text())
            per = []
            for s in cmp_doc["shapes"]:
                e = s["arms"].get("torch eager") or {}
                if e.get("tuned_speedup"):
                    per.append((e["tuned_speedup"], *e.get("tuned_speedup_range", [None, None])))
            row["compare"] = min(per) if per else None
        else:
            row["compare"], row["compare_error"] = None, cr.stderr.strip()[-300:]
        ok = None
        if c.get("metric") is not None and row["compare"]:
            sp, lo, hi = row["compare"]
            ok = lo <= c.get("max", c["high"]) and c.get("min", c["low"]) <= hi  # the two ranges overlap
        row["agree"] = ok
        rows.append(row)
        run_s = (f"{c['metric']:.2f}x ({c.get('min', c['low']):.2f}-{c.get('max', c['high']):.2f})"
                 if c.get("metric") is not None
                 else c.get("error", "no goal check")[:28])
        cmp_s = (f"{row['compare'][0]:.2f}x ({row['compare'][1]:.2f}-{row['compare'][2]:.2f})" if row["compare"]
                 else "compare failed")
        tm = f"{row['trial_metric']:.2f}x" if row["trial_metric"] is not None else "-"
        print(f"{i:>3}  {r.returncode:>4}  {doc['trials']:>6}  {tm:>6}  {run_s:<28}  {cmp_s:<30}  "
              f"{'yes' if ok else 'NO' if ok is False else '-'}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    agree = sum(1 for r in rows if r["agree"])
    print(f"{agree} of {len(rows)} runs: the run's speedup and pipe compare's overlap; run folders in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
