"""decode-attention-h200's verification value sets (its listed and extra shapes), before and after
session 59's plans: per trial, whether any value set gives k outlier channels while v has none (as
an LLM's KV cache has them: keys with channels, values without), and the per-set joint shares.
Calls the real round indices, feature_plan and _outlier_plan (the draw that decides an input's
channels); no tensors. python review/corr_emulate.py N [SPEC]"""
import sys
from runner.judge import worker
from runner.judge import inputs as I
from runner.judge.inputs import _outlier_plan, _takes_outliers, shape_of, OUTLIER_MIN_COLS
from runner.judge.worker import _seed, _turn
from tests.conftest import shipped_spec, PIPELINES

spec = sys.argv[2] if len(sys.argv) > 2 else "decode-attention-h200"
op = shipped_spec(PIPELINES / f"{spec}.yaml").op
SHAPES = [dict(s) for s in op.all_shapes]
NEW = hasattr(worker, "feature_plan")
names = [t.name for t in op.inputs]
K = [i for i, t in enumerate(names) if t.startswith("k")][0]
V = [i for i, t in enumerate(names) if t.startswith("v")][0]
Q = names.index("q")
n = int(sys.argv[1]); checks = op_checks = 2
none_trials = 0; sets = 0; joint = {}
for t in range(n):
    seed = 7919 * t + 3
    if NEW:
        big = worker.largest_shape(op, SHAPES)
        rounds = [worker.round_indices(op, seed, si, checks, si == big) for si in range(len(SHAPES))]
        plan = worker.feature_plan(op, SHAPES, rounds, False, True)
    else:
        rounds = [[r + si + _turn(seed) for r in range(checks)] for si in range(len(SHAPES))]
        plan = {}
    seen = False
    for si, sh in enumerate(SHAPES):
        env = op.shape_env(sh)
        for r, idx in enumerate(rounds[si]):
            share = (plan.get((si, r)) or (None, None, None))[1]
            got = []
            for i in (Q, K, V):
                v = op.inputs[i].drawn(False)
                d = v.dists[idx % len(v.dists)]
                s = shape_of(v, env)
                ok = _takes_outliers(v, env, d) and s[-1] >= OUTLIER_MIN_COLS
                got.append(bool(ok and _outlier_plan(s[-1], _seed(seed, si, r), i, False, *(((I._share_of(share, i) if hasattr(I, '_share_of') else share),) if NEW else ())) is not None))
            sets += 1
            joint[tuple(got)] = joint.get(tuple(got), 0) + 1
            seen |= got[1] and not got[2]
    none_trials += not seen
print(f"{spec} {'after' if NEW else 'before'}: trials with no set of k channels and v none: {none_trials}/{n};"
      f" per set (q,k,v) shares: " + ", ".join(f"{k}: {c / sets:.3f}" for k, c in sorted(joint.items())))
