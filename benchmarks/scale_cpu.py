"""Trials per minute of a CPU-backend sweep (`pipe record`) with 1, 2 and 4 judge workers.

    python benchmarks/scale_cpu.py [--workers 1,2,4] [--ray] [--rows few|full]

Each count records the same space (rmsnorm-cpu.yaml's 18 configurations) in a fresh run
folder with a fresh compile cache, by a real `pipe record --workers N` process (or `--ray
local --workers N`: a Ray cluster started in that process, one actor per worker). The rate is
the trials recorded over the time from the first trial's start to the last one's end (from
the ledger: the process start, the workers' start and the baseline are left out), so it
counts what scales: compiles (g++, on the slots' threads) and judging (on the workers).
A figure, not a test: on a host with fewer cores than workers the workers share cores
(the run logs `scale.oversubscribed`) and the rate stops growing there.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FEW_ROWS = [{"M": 16, "N": 4096}, {"M": 64, "N": 1024}]  # tests/conftest.py's: the same rows, less work


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--ray", action="store_true", help="through a local Ray cluster (needs the ray extra)")
    ap.add_argument("--rows", choices=("few", "full"), default="few",
                    help="the spec's own shapes (full) or tests' fewer rows (few, the default)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pipe-scale-"))
    (tmp / "pipelines").mkdir()
    for d in ("kernel_templates", "hw_profiles"):
        os.symlink(ROOT / d, tmp / d)
    spec = yaml.safe_load((ROOT / "pipelines" / "rmsnorm-cpu.yaml").read_text())
    if a.rows == "few":
        spec["op"]["shapes"] = FEW_ROWS
    (tmp / "pipelines" / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    print(f"host: {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable); spec rmsnorm-cpu, "
          f"{a.rows} rows; {'Ray local cluster' if a.ray else 'local workers'}")
    print(f"{'workers':>7} {'trials':>6} {'sweep s':>8} {'trials/min':>10} {'vs 1':>6}  slots")
    base = None
    for n in [int(x) for x in a.workers.split(",")]:
        run = tmp / f"w{n}"
        env = {**os.environ, "PIPE_CACHE_DIR": str(tmp / f"cache{n}"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        cmd = [sys.executable, "-m", "runner", "record", "pipelines/s.yaml", "--run-dir", str(run),
               "--out", str(tmp / f"w{n}.json"), "-q", "--workers", str(n)] + (["--ray", "local"] if a.ray else [])
        t0 = time.time()
        r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        if r.returncode not in (0, 1):
            print(f"{n:>7} failed: {r.stderr[-800:]}")
            continue
        db = sqlite3.connect(f"file:{run}/ledger.db?mode=ro", uri=True)
        rows = db.execute("SELECT started_at, finished_at, details FROM trials").fetchall()
        db.close()
        span = max(f for _, f, _ in rows) - min(s for s, _, _ in rows)
        rate = len(rows) / span * 60
        base = base or rate
        slots = sorted({json.loads(d).get("slot", "?") for _, _, d in rows})
        print(f"{n:>7} {len(rows):>6} {span:>8.1f} {rate:>10.1f} {rate / base:>5.2f}x  {', '.join(slots)}"
              f"  (process {time.time() - t0:.0f} s)")
    print(f"run folders under {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
