"""Spec-side checks: which `writable`/`workdir` values `pipe validate` accepts.
    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s42-jail/check_spec.py"""
import os, subprocess, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness, yaml
os.makedirs("/tmp/s42-jail/e4_outer", exist_ok=True)
cases = {
    "nested workdir in writable (E4)": {"workdir": "/tmp/s42-jail/e4_outer/work", "writable": ["/tmp/s42-jail/e4_outer"]},
    "writable /tmp (the CPU backend builds in /tmp/pipe-cpu-*)": {"writable": ["/tmp"]},
    "writable /usr/local/include (ahead of /usr/include for g++)": {"writable": ["/usr/local/include"]},
    "writable ~ (HOME holds the cache)": {"writable": ["~"]},
    "writable relative ../": {"writable": ["../"]},
    "workdir inside the runner": {"workdir": str(harness.ROOT / "runner" / "x")},
}
for name, opts in cases.items():
    proj, spec, run_dir = harness.setup("spec_check", "/bin/true", 1, opts)
    r = subprocess.run([str(harness.ROOT / ".venv/bin/pipe"), "validate", str(spec)], capture_output=True, text=True,
                       env=dict(os.environ, PIPE_CACHE_DIR="/tmp/s42-jail/cache"))
    msg = [l for l in r.stderr.splitlines() if "agent" in l][:1]
    print(f"{name}: rc={r.returncode} {'ACCEPTED' if r.returncode == 0 else 'refused'} {msg[0][-160:] if msg else ''}")
