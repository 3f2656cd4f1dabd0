"""Spec-side: which careless `writable` values `pipe validate` accepts (nothing is run; no agent).
    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s42-jail2/check_spec2.py"""
import os, subprocess, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "s42-jail"))
import harness
os.makedirs("/tmp/s42-jail2/oldrun", exist_ok=True)
cases = {
    "the repository's .git (hooks run unconfined at the user's next commit)": ["/work/main/.git"],
    "another run's folder (its ledger, a record)": ["/work/main/runs"] if False else ["/tmp/s42-jail2/oldrun"],
    "~/.config (systemd user units, autostart, git config)": ["~/.config"],
    "~/.ssh": ["~/.ssh"],
    "~/.triton (Triton's kernel cache, GPU pipelines)": ["~/.triton"],
    "~/.nv (CUDA's JIT ComputeCache)": ["~/.nv"],
    "/tmp/torchinductor_root (inductor's compiled-code cache)": ["/tmp/torchinductor_root"],
    "~/.cache (holds pipe's default cache?)": ["~/.cache"],
    "/var/tmp": ["/var/tmp"],
}
for p in ("~/.config", "~/.ssh", "~/.triton", "~/.nv", "/tmp/torchinductor_root", "~/.cache"):
    os.makedirs(os.path.expanduser(p), exist_ok=True)  # created empty if missing (a folder must exist)
for name, w in cases.items():
    proj, spec, run_dir = harness.setup("spec_check2", "/bin/true", 1, {"writable": w})
    env = dict(os.environ); env.pop("PIPE_CACHE_DIR", None)
    r = subprocess.run([str(harness.ROOT / ".venv/bin/pipe"), "validate", str(spec)], capture_output=True, text=True, env=env)
    msg = [l for l in (r.stderr + r.stdout).splitlines() if "writable" in l][:1]
    print(f"{name}: rc={r.returncode} {'ACCEPTED' if r.returncode == 0 else 'refused'} {msg[0][-170:] if msg else ''}")
