"""Session 42's red team, "verification told apart from timing" (CPU backend): every variant here
judged by the project's own CLI (`pipe eval`) next to the honest template at the same parameters,
then each library built by runner.build.builder.Builder (the judge's own build) called in this
process through ctypes on inputs a user would give it at the spec's timed shapes, and held to the
judge's own error budget (verify.Budget). No GPU; about 2 minutes on two cores.

    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s42-told/check.py [--no-eval]

Printed per variant: the verdict and the per-shape times of `pipe eval` (us), the honest control's
beside it, and for the user inputs the worst |out - ref| / budget (> 1 is wrong) and how many
elements are NaN/Inf.
"""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from runner.build.builder import Builder  # noqa: E402
from runner.judge.verify import Budget  # noqa: E402
from runner.spec.spec import load_spec  # noqa: E402

P = {"ACC": 16, "THREADS": 1, "UNROLL": 4}
VARIANTS = [
    None,  # the approved template: the honest control
    "c0_rmsnorm_no_eps_anywhere_control.cpp.j2",
    "v1_rmsnorm_no_eps_off_extra_shapes.cpp.j2",
    "v2_rmsnorm_no_eps_unless_judge_dist.cpp.j2",
    "v3c_rmsnorm_counter_in_output_lsbs_never_lazy.cpp.j2",
]
# the stateless counter told apart exactly: lazy on the one call it takes for the salted last (32 of a
# loop it forced to 32 calls), and on the call before it; both must be caught, at exactly that call
LAZY = ["v3_rmsnorm_counter_in_output_lsbs_lazy_last.cpp.j2", "v3b_rmsnorm_counter_in_output_lsbs_lazy_31.cpp.j2"]
SPECS = {"rmsnorm-cpu": ["rmsnorm-cpu.yaml", None], "rmsnorm-range-cpu": ["rmsnorm-range-cpu.yaml", None]}
# (spec, variant) pairs judged by pipe eval: every variant on rmsnorm-cpu; on the range spec (whose
# domain draws reach every M, so a shape-keyed path meets offset and tiny rows) the honest one, v1, v2
EVAL = [("rmsnorm-cpu", v) for v in VARIANTS + LAZY] + [("rmsnorm-range-cpu", v) for v in (None, VARIANTS[2], VARIANTS[3])]
RANGE_P = {"ACC": 8, "THREADS": 1, "UNROLL": 1}


def evaluate(spec: str, variant: str | None, out: Path) -> dict:
    params = P if spec == "rmsnorm-cpu" else RANGE_P
    name = variant or "honest"
    cmd = [sys.executable, "-m", "runner.cli", "eval", f"pipelines/{spec}.yaml", "--params", json.dumps(params),
           "--run-dir", str(out / f"{spec}-{name}"), "--json"]
    if variant:
        cmd += ["--variant", str(HERE / variant)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return {"status": f"NO-VERDICT rc={r.returncode}", "reason": r.stderr[-300:]}


def build(spec_name: str, variant: str | None):
    spec = SPECS[spec_name]
    if spec[1] is None:
        spec[1] = Builder(load_spec(ROOT / "pipelines" / spec[0]))
    b = spec[1]
    params = {**b.spec.starts[0], **P}
    vid = None
    if variant:
        vid = f"v{len(b.variants)}"
        b.variants[vid] = (HERE / variant).read_text()
    got = b.build(b.render_all(params, vid), b.geometry(params), b.approved_sources(params, vid))
    assert got.status == "ok", (variant, got.status, got.reason)
    f = ctypes.CDLL(got.artifacts[0]).rmsnorm_cpu
    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float]
    return f


def user_inputs(M: int, N: int) -> dict:
    """What a user calls RMSNorm with at the spec's timed shape, and the judge never draws there."""
    g = torch.Generator().manual_seed(42)
    w = torch.rand(N, generator=g) + 0.5
    small = torch.randn(M, N, generator=g) * 0.05  # activations of rms 0.05 (eps matters: 1e-6 / 0.0025)
    padded = torch.randn(M, N, generator=g)
    padded[-8:] = 0.0  # padding rows of zeros at the end of a batch
    tiny = torch.randn(M, N, generator=g) * 1e-22  # rows whose squares underflow in fp32
    return {"rms 0.05": (small, w), "8 zero rows": (padded, w), "rms 1e-22": (tiny, w)}


def judge_on(f, x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> str:
    M, N = x.shape
    out = torch.full_like(x, 7.0)
    f(x.data_ptr(), w.data_ptr(), out.data_ptr(), M, N, eps)
    ref = torch.nn.functional.rms_norm(x.double(), (N,), w.double(), eps)
    b = Budget(ref, 1e-5, 1e-5, out_dtype=torch.float32)
    bad = ~torch.isfinite(out)
    ratio = ((out.double() - b.ref).abs() / b.tensor()).nan_to_num(float("inf"))
    verdict = "RIGHT" if b.holds(out) else "WRONG"
    return f"{verdict}: worst err/budget {ratio.max().item():.3g}, {int(bad.sum())} NaN/Inf"


def main() -> int:
    out = Path("/tmp/s42-told-check")
    shutil.rmtree(out, ignore_errors=True)  # a run folder that holds the trial already answers from its ledger
    if "--no-eval" not in sys.argv:
        print(f"== pipe eval at {P} (rmsnorm-cpu) and {RANGE_P} (rmsnorm-range-cpu); times in us per timed shape")
        for spec, v in EVAL:
            r = evaluate(spec, v, out)
            times = [round(s["time_s"] * 1e6, 1) for s in r.get("shapes") or []]
            obj = r.get("objective_s")
            print(f"  {spec:18s} {v or 'honest (approved template)':52s} {r['status']:8s} times {times} "
                  f"objective {round(obj * 1e6, 1) if obj else None}  {(r.get('reason') or '')[:220]}")
    print("== the same libraries on a user's inputs at the timed shape M=512, N=4096 (the judge's budget)")
    for v in VARIANTS:
        f = build("rmsnorm-cpu", v)
        for what, (x, w) in user_inputs(512, 4096).items():
            print(f"  {v or 'honest':52s} {what:12s} {judge_on(f, x, w)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
