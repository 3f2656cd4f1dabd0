"""Count structural properties of the judge's verification draws for the decode-attention specs.
Calls the judge's own pieces: spec loading, domain.draws (the trial's secret domain shapes),
the evaluator's shape plan (served timed + served extra shapes), worker._seed/_turn for the
round's seed and dist, and inputs.make_tensor / make_inputs for the values."""
import math, random, sys, collections
import torch
from runner.spec.spec import load_spec
from runner.judge import domain
from runner.judge.inputs import make_tensor, make_inputs
from runner.judge.worker import _seed, _turn

TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
SPECS = ["pipelines/decode-attention-h200.yaml", "pipelines/decode-attention-64-h200.yaml",
         "pipelines/decode-attention-paged16-h200.yaml", "pipelines/decode-attention-paged64-h200.yaml"]


def verified_shapes(sp, params, dseed):
    op, k = sp.op, sp.kernel
    elem = op.shape_env({})["elem"]
    timed = [s for s in op.shapes if k.serves_shape(params, s, elem)]
    extra = [s for s in op.extra_shapes if k.serves_shape(params, s, elem)]
    draws = domain.draws(op, lambda sh: k.serves_shape(params, sh, elem), dseed)
    return timed + extra + draws


def int_inputs(op, shape, seed, round_):
    """lens (and block_table) as make_inputs draws them for verification (dist from the round)."""
    env = op.shape_env(shape)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for t in op.inputs:
        v = t.drawn(False)
        if v.dtype in ("int32", "int64"):
            out[t.name] = make_tensor(v, env, v.dists[round_ % len(v.dists)], gen, "cpu")
    return out


def main():
    rng = random.Random(1234)
    for path in SPECS:
        sp = load_spec(path)
        op = sp.op
        params = sp.start
        paged = "block_table" in [t.name for t in op.inputs]
        page = params.get("PAGE", None)
        checks = sp.runtime.checks
        vs = collections.Counter()   # per value set
        tr = collections.Counter()   # per trial: the property broken at least once
        seqs = collections.Counter()
        n_vs = 0
        for trial in range(TRIALS):
            seed, dseed = rng.getrandbits(48), rng.getrandbits(48)
            hit = collections.Counter()
            for si, shape in enumerate(verified_shapes(sp, params, dseed)):
                L = shape["L"] if "L" in shape else shape["MAXP"] * page
                for r in range(checks):
                    x = int_inputs(op, shape, _seed(seed, si, r), r + si + _turn(seed))
                    lens = x["lens"].long()
                    n_vs += 1
                    f = {}
                    f["lens==1"] = bool((lens == 1).any())
                    f["lens<16 (inside one partial tile)"] = bool((lens < 16).any())
                    f["lens==L"] = bool((lens == L).any())
                    f["lens==0"] = bool((lens == 0).any())
                    f["all lens equal (B>1)"] = lens.numel() > 1 and bool((lens == lens[0]).all())
                    f["max(lens) <= L/4 (table much wider than the batch needs)"] = bool(lens.max() <= L // 4)
                    if paged:
                        t = x["block_table"].long()
                        B, maxp = t.shape
                        pool = B * maxp
                        f["lens % PAGE == 0"] = bool((lens % page == 0).any())
                        used = (lens + page - 1) // page  # pages that mean anything
                        past = torch.arange(maxp)[None, :] >= used[:, None]
                        live = t[~past]
                        f["entry past last page outside [0,pool)"] = bool(((t < 0) | (t >= pool))[past].any())
                        f["entry past last page == -1"] = bool(((t == -1))[past].any())
                        f["a page shared by two table slots (all slots)"] = t.unique().numel() < t.numel()
                        f["a page shared between live slots"] = live.unique().numel() < live.numel()
                        f["pool larger than the pages the table names"] = t.unique().numel() < pool
                        seqs["seqs"] += B
                        seqs["seqs with pages past their last"] += int((used < maxp).sum())
                    for k_, v_ in f.items():
                        vs[k_] += int(v_)
                        hit[k_] |= v_
            for k_, v_ in hit.items():
                tr[k_] += int(v_)
        print(f"== {path}: {TRIALS} trials, {n_vs} verified value sets ({checks} rounds a shape)")
        for k_ in vs:
            print(f"  {k_:62s} value sets {vs[k_]:6d} ({100*vs[k_]/n_vs:5.1f}%)   trials {tr[k_]:4d} ({100*tr[k_]/TRIALS:5.1f}%)")
        if seqs:
            print(f"  sequences: {seqs['seqs']}, with table entries past their last page: {seqs['seqs with pages past their last']}")


if __name__ == "__main__":
    main()
