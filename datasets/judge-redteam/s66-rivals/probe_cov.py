"""Item 1: per CPU spec and shape, the probe's verdict (_salt_unseen, _dense) over several
processes' draws, and how often a memo of the unsalted answer passes a fresh call's (row salt)
and the last call's (8-pair salt) reference, whole output and at 1024 sampled positions."""
import random, sys, torch
from runner.spec.spec import load_spec
from runner.judge.worker import Judge, _salt_targets, _row_salt, _draw_salt, _dense_salt, _salted
from runner.judge import worker as W

def shapes_of(spec):
    out = list(spec.op.shapes) + list(spec.op.extra_shapes)
    return out

def run(path, extra=()):
    spec = load_spec(path)
    j = Judge(spec); j.census = None
    for shape in shapes_of(spec) + list(extra):
        probes = []
        for _ in range(4):
            j._salt_probe.clear()
            probes.append(j._salt_unseen(shape))
        dense = j._dense(shape)
        passes_row = passes_last = 0
        n = 6
        for t in range(n):
            inp = j._inputs(shape, 1000 + t, 0, True)
            (refs) = j._reference(inp, shape)
            targets = _salt_targets(inp, j._unsalted)
            rng = random.Random(t)
            for kind in ("row", "last"):
                salt = [sw for tt in targets for sw in (_row_salt(inp[tt], tt, rng) if kind == "row" else _draw_salt(inp[tt], tt, rng))]
                salt += _dense_salt(inp, targets, rng, dense)
                r2 = j._reference(_salted(inp, salt), shape)
                ok = all(bool(((r0.to(r1.dtype) - r1).abs() <= b.tensor()).all()) for (r0, _), (r1, b) in zip(refs, r2))
                if kind == "row": passes_row += ok
                else: passes_last += ok
        print(f"{spec.name} {shape}: probe_unseen={probes} dense={dense} memo passes row-salt {passes_row}/{n} last-salt {passes_last}/{n}", flush=True)

for p in sys.argv[1:]:
    extra = []
    if "moe" in p: extra = [{"T": 1}, {"T": 4}, {"T": 64}]
    if "range" in p: extra = [{"M": 4096, "N": 64}, {"M": 4, "N": 64}, {"M": 16, "N": 16384}, {"M": 4, "N": 16384}, {"M": 1, "N": 64}]
    run(p, extra)
