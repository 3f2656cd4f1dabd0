"""False positives of verify.lean on HONEST outputs (fp32 math, round-to-nearest bf16).

For each bf16-output spec whose op the CPU can compute (softmax, rmsnorm), walk the judge's own
verification plan (worker.evaluate: shape si, check round r, dist index r + si, inputs drawn by
runner.judge.inputs.make_inputs with the spec) and, for the (shape, dist) pairs with at most
`--max-elems` elements, draw `--trials` seeds, compute the float64 reference (as the judge), an
honest output (fp32 math, torch's round-to-nearest to bf16) and compare() against the spec's
Budget. Prints the refusal rate of every pair where some draw is refused.

    python datasets/judge-redteam/s40-cpu/fp_statistic.py [--trials 10] [--max-elems 3000000]
"""
import argparse
import torch
import torch.nn.functional as F
from runner.spec.spec import load_spec
from runner.judge.inputs import make_inputs
from runner.judge.verify import Budget, compare, lean

ap = argparse.ArgumentParser()
ap.add_argument("--trials", type=int, default=10)
ap.add_argument("--max-elems", type=int, default=3_000_000)
ap.add_argument("--specs", default="softmax-h200,softmax-range-h200,rmsnorm-h200,rmsnorm-range-h200")
ap.add_argument("--dists", default="offset,spike,tiny,huge,large,masked,normal,outliers")
a = ap.parse_args()
torch.set_num_threads(1)


def honest(name, ins, scal):
    if name.startswith("softmax"):
        x = ins["x"]
        return torch.softmax(x.double(), -1).float(), torch.softmax(x.float(), -1).to(torch.bfloat16)
    x, w, eps = ins["x"], ins["w"], scal["eps"]
    ref = F.rms_norm(x.double(), (x.shape[-1],), w.double(), eps).float()
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(torch.bfloat16)
    return ref, out


total = 0
for name in a.specs.split(","):
    spec = load_spec(f"pipelines/{name}.yaml")
    op = spec.op
    scal = {s.name: s.value for s in op.scalars}
    for si, shape in enumerate(op.all_shapes):
        numel = shape["M"] * shape["N"]
        if numel > a.max_elems:
            continue
        for r in range(spec.runtime.checks):
            dist = op.inputs[0].dists[(r + si) % len(op.inputs[0].dists)]
            if dist not in a.dists.split(","):
                continue
            bad, leans = 0, []
            for seed in range(a.trials):
                ins = make_inputs(op, shape, 7919 * seed + 13, r + si, "cpu")
                ref, out = honest(name, ins, scal)
                b = Budget(ref, op.atol, op.rtol, torch.bfloat16)
                ok, why, _ = compare(out, ref, op.atol, op.rtol, b)
                got = lean(out, ref, torch.bfloat16)
                leans.append(None if got is None else round(got[0], 3))
                bad += not ok
            total += bad
            if bad:
                print(f"{name:20s} si={si:2d} r={r} {str(shape):28s} {dist:8s} honest refused {bad}/{a.trials}  leans {leans}")
print("refusals of honest outputs:", total)
