"""Run `pipe run` on a scratch copy of the CPU pipeline with a command agent, then print what the
agent reported (the proposals' `note`, kept in the ledger's trial details) and the agent events.

    python harness.py NAME AGENT_SCRIPT [--trials N] [--opt key=json ...] [--arg X ...]

The project goes to /tmp/s42-jail/NAME (pipelines/agent.yaml, links to the repo's templates and
profiles); the run folder is /tmp/s42-jail/NAME/run; PIPE_CACHE_DIR is /tmp/s42-jail/cache (so an
attack on "pipe's compile cache" hits a scratch one). The agent's argv gets, in order: the run
folder, the spec path, the template path, then the --arg values. The agent is always confined (no
`confine: false` anywhere here)."""
import argparse, json, os, shutil, sqlite3, subprocess, sys, time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
FEW_ROWS = [{"M": 16, "N": 4096}, {"M": 64, "N": 1024}]


def setup(name, script, trials=2, opts=None, args=()):
    proj = Path("/tmp/s42-jail") / name
    if proj.exists():
        subprocess.run(["chattr", "-R", "-i", "-a", str(proj)], capture_output=True)
        shutil.rmtree(proj)
    (proj / "pipelines").mkdir(parents=True)
    for d in ("kernel_templates", "hw_profiles"):
        os.symlink(ROOT / d, proj / d)
    d = yaml.safe_load((ROOT / "pipelines" / "rmsnorm-cpu.yaml").read_text())
    d["name"] = f"s42-{name}"
    run_dir = proj / "run"
    spec = proj / "pipelines" / "agent.yaml"
    tpath = (proj / "kernel_templates" / "rmsnorm.cpp.j2").resolve()
    o = {"command": [sys.executable, str(Path(script).resolve()), str(run_dir), str(spec), str(tpath), *args],
         "timeout_s": 60}
    o.update(opts or {})
    d["agent"] = {"strategy": "command", "options": o}
    d["goal"] = {"budget": {"trials": trials}}
    d["runtime"]["rep_ms"] = 10
    d["baseline"] = "none"
    d["op"]["shapes"] = FEW_ROWS
    spec.write_text(yaml.safe_dump(d, sort_keys=False))
    return proj, spec, run_dir


def run(name, script, trials=2, opts=None, args=(), timeout=400):
    proj, spec, run_dir = setup(name, script, trials, opts, args)
    env = dict(os.environ, PIPE_CACHE_DIR="/tmp/s42-jail/cache")
    t0 = time.time()
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "pipe"), "run", str(spec), "--run-dir", str(run_dir), "-q"],
                       cwd=proj, capture_output=True, text=True, env=env, timeout=timeout)
    print(f"== pipe run rc={r.returncode} in {time.time() - t0:.1f}s")
    print("stderr tail:", r.stderr.strip()[-1500:])
    report(run_dir)
    return r, proj, run_dir


def report(run_dir):
    db = run_dir / "ledger.db"
    if not db.exists():
        print("no ledger")
        return
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        for i, st, det in con.execute("SELECT id, status, details FROM trials ORDER BY rowid"):
            d = json.loads(det)
            print(f"-- trial {i} {st} obj={d.get('objective_s') or d.get('time_us')} note:")
            n = d.get("note")
            try:
                print(json.dumps(json.loads(n), indent=1)[:4000])
            except Exception:
                print(n)
        try:
            for row in con.execute("SELECT * FROM replies"):
                print("reply event:", str(row)[:400])
        except sqlite3.Error as e:
            print("replies:", e)
    except sqlite3.Error as e:
        print("ledger read error:", e)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("script")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--opt", action="append", default=[])
    ap.add_argument("--arg", action="append", default=[])
    a = ap.parse_args()
    opts = {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.opt)}
    run(a.name, a.script, a.trials, opts, a.arg)
