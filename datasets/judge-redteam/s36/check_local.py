"""GPU-less check of session 36's reproducers: each variant rendered, ruled on and compiled
(NVRTC, sm_90a per the h200 profile) through the runner's own Builder, its compiled code judged
against the approved template's build, as `pipe eval --variant` does before any GPU work.

    python datasets/judge-redteam/s36/check_local.py      (from the repo root, venv active)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from runner.build.builder import Builder  # noqa: E402
from runner.spec.spec import load_spec  # noqa: E402

VARIANTS = ["v_slowed", "v_out_slack", "v_in_slack", "v_param", "v_malloc"]


def param_lines(src: str, sp) -> list[str]:
    """The PTX lines (nvcc -arch=sm_90a, where nvcc is on PATH) that touch the kernel's parameter
    memory through a generic address."""
    import shutil
    import subprocess
    import tempfile

    if not shutil.which("nvcc"):
        return ["(no nvcc here)"]
    with tempfile.TemporaryDirectory() as d:
        cu = Path(d) / "k.cu"
        cu.write_text(src)
        r = subprocess.run(["nvcc", "-arch=sm_90a", "-ptx", str(cu), "-o", str(cu.with_suffix(".ptx"))],
                           capture_output=True, text=True)
        if r.returncode:
            return [r.stderr[-400:]]
        ptx = cu.with_suffix(".ptx").read_text()
    return [ln.strip() for ln in ptx.splitlines() if re.search(r"cvta\.param|soft_param_0|volatile", ln)]


def main() -> int:
    for spec_name in ("softmax-stash.yaml", "softmax-stash-direct.yaml"):
        sp = load_spec(HERE / spec_name)
        b = Builder(sp)
        params = {"BLOCK": 256}
        base = b.build(b.render_all(params), b.geometry(params))
        print(f"{spec_name}: approved template: {base.status} {base.reason or ''}")
        for name in VARIANTS:
            b.variants[name] = (HERE / f"{name}.cu.j2").read_text()
            got = b.build(b.render_all(params, name), b.geometry(params), b.approved_sources(params, name))
            extra = ""
            if got.ptx:
                extra = f" ptx.extern={got.ptx.get('extern')} ptx.data={got.ptx.get('data')}"
            print(f"  {name}: {got.status}" + (f" ({got.reason})" if got.reason else "") + extra)
            if name == "v_param" and spec_name == "softmax-stash.yaml":
                print("    its PTX:", *param_lines(b.render_all(params, name)[0], sp), sep="\n      ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
