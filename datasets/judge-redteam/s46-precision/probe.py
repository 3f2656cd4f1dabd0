"""A variant's error against the approved build's on the GPU (session 46): for three H200
specs, `pipe eval` of the approved template as a variant (the control), an honest rewrite of
its arithmetic, and a hand-made approximation inside the spec's budget. Prints each verdict
and the paired figures the trial records (details.precision: mean |error| in units of the
output's rounding, the variant's and the approved build's).

    python3 datasets/judge-redteam/s46-precision/probe.py [OUT_DIR]    (from the repo root)
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from runner.spec.spec import load_spec

# 2^t for t <= 0 by rint and a degree-3 polynomial on [-1/2, 1/2] (about 6e-4 off), built in
# the exponent bits: no exp instruction, no library call
FEXP2 = """
__device__ __forceinline__ float fexp2(float t) {
  t = fmaxf(t, -126.f);
  const float n = rintf(t), f = t - n;
  const float p = 1.f + f * (0.6931472f + f * (0.2402265f + f * 0.0555041f));
  return __int_as_float(__float_as_int(p) + ((int)n << 23));
}
"""
# 1/sqrt(x) from the bit-level guess and one Newton step (about 1.8e-3 off)
FRSQRT = """
__device__ __forceinline__ float frsqrt(float x) {
  float y = __int_as_float(0x5f3759df - (__float_as_int(x) >> 1));
  return y * (1.5f - 0.5f * x * y * y);
}
"""
EX = "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }"


def variants(name: str, text: str) -> dict[str, str]:
    out = {"control": text}
    if name == "softmax-h200":
        assert text.count(EX) == 1
        first = text.index("__device__")
        out["honest-expf"] = text.replace(EX, EX.replace("exp2f((v - m) * L2E)", "expf(v - m)"))
        out["fexp2-deg3"] = (text[:first] + FEXP2 + text[first:]).replace(EX, EX.replace("exp2f(", "fexp2("))
    if name == "rmsnorm-h200":
        assert text.count("rsqrtf(") >= 1
        first = text.index("__device__")
        out["honest-div-sqrt"] = text.replace("rsqrtf(", "1.0f / sqrtf(")
        out["frsqrt-newton1"] = text[:first] + FRSQRT + text[first:].replace("rsqrtf(", "frsqrt(")
    return out


def main() -> int:
    return run(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/s46-precision"),
               ("softmax-h200", "rmsnorm-h200", "moe-fine-h200"), variants)


def run(out_dir: Path, names, variants) -> int:
    """`pipe eval` of each of `variants(name, approved text)` of each spec `names`, into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        spec = Path("pipelines") / f"{name}.yaml"
        sp = load_spec(spec)
        start = yaml.safe_load(spec.read_text())["search"]["start"]
        start = start[0] if isinstance(start, list) else start
        for label, text in variants(name, sp.kernel.template).items():
            tmp = Path(tempfile.mkdtemp())
            (tmp / "v.cu.j2").write_text(text)
            run = out_dir / f"{name}-{label}"
            r = subprocess.run([sys.executable, "-m", "runner", "eval", str(spec), "--params", json.dumps(start),
                                "--variant", str(tmp / "v.cu.j2"), "--run-dir", str(run), "--json", "--no-hw-check"],
                               capture_output=True, text=True)
            try:
                got = json.loads(r.stdout)
            except json.JSONDecodeError:
                got = {"status": f"exit {r.returncode}", "reason": (r.stdout + r.stderr)[-600:]}
            details = {}
            if (run / "ledger.db").exists():
                with sqlite3.connect(run / "ledger.db") as c:
                    row = c.execute("select details from trials order by id desc limit 1").fetchone()
                    details = json.loads(row[0]) if row else {}
            line = (f"{name:14s} {label:16s} {got.get('status')}: precision {details.get('precision')} "
                    f"lean {(details.get('lean') or {}).get('pooled')} {got.get('reason', '')[:400]}")
            print(line, flush=True)
            rows.append(line)
    (out_dir / "probe.txt").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
