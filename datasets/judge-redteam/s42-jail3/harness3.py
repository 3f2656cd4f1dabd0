"""s42-jail3 harness: the s42 harness's scratch project, run with `pipe run --workers N`.

    python harness3.py NAME AGENT [--workers 2] [--trials N] [--opt k=json] [--arg X] [--rep-ms 50]
"""
import argparse, json, os, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "s42-jail"))
import harness  # noqa: E402
import yaml  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("name"); ap.add_argument("script")
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--trials", type=int, default=4)
ap.add_argument("--rep-ms", type=int, default=50)
ap.add_argument("--opt", action="append", default=[])
ap.add_argument("--arg", action="append", default=[])
a = ap.parse_args()
opts = {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.opt)}
proj, spec, run_dir = harness.setup(a.name, a.script, a.trials, opts, a.arg)
d = yaml.safe_load(spec.read_text())
d["runtime"]["rep_ms"] = a.rep_ms
d["op"]["shapes"] = [{"M": 512, "N": 4096}]
spec.write_text(yaml.safe_dump(d, sort_keys=False))
env = dict(os.environ, PIPE_CACHE_DIR="/tmp/s42-jail/cache")
t0 = time.time()
r = subprocess.run([str(harness.ROOT / ".venv/bin/pipe"), "run", str(spec), "--run-dir", str(run_dir), "-q",
                    "--workers", str(a.workers)], cwd=proj, capture_output=True, text=True, env=env, timeout=500)
print(f"== pipe run --workers {a.workers} rc={r.returncode} in {time.time()-t0:.1f}s")
print("stderr tail:", r.stderr.strip()[-800:])
import sqlite3
con = sqlite3.connect(f"file:{run_dir}/ledger.db?mode=ro", uri=True)
for i, st, params, obj, kept, det in con.execute("SELECT id, status, params, objective, kept, details FROM trials ORDER BY rowid"):
    dd = json.loads(det)
    print(f"trial {i} {st} {params} obj={obj} kept={kept} slot={dd.get('slot')} retime={dd.get('retime')} note={str(dd.get('note'))[:300]}")
