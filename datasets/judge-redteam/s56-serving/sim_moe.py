"""Structural properties of the judge's MoE routings (offs) at every verified shape of a trial:
the served timed shapes, the served extra shapes and the trial's secret domain draws, 4 rounds a
shape, each round's dist as worker.evaluate picks it (r + si + _turn(seed)), drawn by the
judge's own routing_counts through make_tensor."""
import collections, random, sys, glob
import torch
from runner.spec.spec import load_spec
from runner.judge import domain
from runner.judge.inputs import make_tensor
from runner.judge.worker import _seed, _turn

TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 100
rng = random.Random(7)
for path in sorted(glob.glob("pipelines/moe-*-h200.yaml")):
    sp = load_spec(path); op = sp.op; params = sp.start; k = sp.kernel
    elem = op.shape_env({})["elem"]
    offs_t = next(t for t in op.inputs if t.name == "offs")
    vs, tr, n = collections.Counter(), collections.Counter(), 0
    for _ in range(TRIALS):
        seed, dseed = rng.getrandbits(48), rng.getrandbits(48)
        shapes = [s for s in op.shapes if k.serves_shape(params, s, elem)] + \
                 [s for s in op.extra_shapes if k.serves_shape(params, s, elem)] + \
                 domain.draws(op, lambda sh: k.serves_shape(params, sh, elem), dseed)
        hit = collections.Counter()
        for si, shape in enumerate(shapes):
            env = op.shape_env(shape)
            for r in range(sp.runtime.checks):
                dist = offs_t.dists[(r + si + _turn(seed)) % len(offs_t.dists)]
                offs = make_tensor(offs_t, env, dist, torch.Generator().manual_seed(_seed(seed, si, r)), "cpu").long()
                R = int(offs_t.rows(env))
                sizes = torch.diff(offs, prepend=torch.zeros(1, dtype=torch.long))
                live = sizes[sizes > 0]
                n += 1
                f = {
                    "offs[-1] < R (padding rows past the last group)": int(offs[-1]) < R,
                    ">=2 live groups, every one a multiple of 16 (aligned/padded routing)": live.numel() >= 2 and bool((live % 16 == 0).all()),
                    ">=2 live groups, every one a multiple of 128": live.numel() >= 2 and bool((live % 128 == 0).all()),
                    "a live group larger than R/topk (only from skewed dists)": bool((live > R // offs_t.topk).any()),
                }
                for a, b in f.items():
                    vs[a] += int(b); hit[a] |= b
        for a, b in hit.items():
            tr[a] += int(b)
    print(f"== {path}: {TRIALS} trials, {n} verified value sets")
    for a in vs:
        print(f"  {a:72s} value sets {vs[a]:5d} ({100*vs[a]/n:5.1f}%)  trials {tr[a]:4d} ({100*tr[a]/TRIALS:5.1f}%)")
