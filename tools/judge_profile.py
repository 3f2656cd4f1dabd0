"""Where a judged trial's time goes, function by function: the spec's start configuration
judged in this process (no worker), the first evaluation as warm-up, then N evaluations
under cProfile; prints the judge's own functions by cumulative time.

    python tools/judge_profile.py [SPEC] [--n 3] [--top 30] [--sync]

--sync: instead of cProfile, each judge step (and the reference, the comparisons, the
checksums) synchronizes the device before and after it and is charged the wall time in
between: what each step costs the device, inclusive and exclusive of the steps inside it,
with its count per evaluation. Work no longer overlaps, so the total is an upper bound.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", nargs="?", default="pipelines/softmax-h200.yaml")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--configs", type=int, default=1,
                    help="evaluate this many configurations in turn (the start and random ones): each "
                         "evaluation then loads a kernel it has not run, as in a run")
    a = ap.parse_args()
    from runner.judge.worker import Judge
    from runner.spec.spec import load_spec
    from runner.build.builder import Builder

    spec = load_spec(a.spec)
    builder = Builder(spec)
    import random

    rng = random.Random(0)
    picks = [dict(spec.start)] + [spec.space.sample(rng) for _ in range(8 * a.configs)]
    jobs = []
    for params in picks:
        if len(jobs) == a.configs or params is None:
            break
        arts, bad = builder.compiled(builder.render_all(params))
        if bad is None:
            jobs.append({"artifacts": arts, "geometry": builder.geometry(params)})
    if not jobs:
        print("nothing compiles")
        return 1
    print(f"{len(jobs)} configuration(s)")
    judge = Judge(spec)
    r = judge.evaluate({**jobs[-1], "seed": secrets.randbits(48)})
    print("warm-up:", r["status"], r.get("reason", ""), r.get("phases"))
    if a.sync:
        return _by_step(judge, jobs, a.n)
    prof = cProfile.Profile()
    walls = []
    for i in range(a.n):
        t0 = time.perf_counter()
        prof.enable()
        r = judge.evaluate({**jobs[i % len(jobs)], "seed": secrets.randbits(48)})
        prof.disable()
        walls.append(time.perf_counter() - t0)
        print(r["status"], r.get("phases"))
    print("wall per evaluation:", [round(w, 3) for w in walls])
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(r"runner|torch/(cuda|random)|_tensor", a.top)
    st.sort_stats("tottime").print_stats(a.top)
    return 0


def _by_step(judge, jobs: list, n: int) -> int:
    import torch

    from runner.judge import verify, worker

    incl: dict[str, float] = {}
    excl: dict[str, float] = {}
    count: dict[str, int] = {}
    stack: list[list] = []  # [name, start, time charged to children]

    def wrap(name, fn):
        def timed(*args, **kw):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            stack.append([name, t0, 0.0])
            try:
                return fn(*args, **kw)
            finally:
                torch.cuda.synchronize()
                _, start, kids = stack.pop()
                dt = time.perf_counter() - start
                incl[name] = incl.get(name, 0.0) + dt
                excl[name] = excl.get(name, 0.0) + dt - kids
                count[name] = count.get(name, 0) + 1
                if stack:
                    stack[-1][2] += dt
        return timed

    for m in ("_inputs", "_reference", "_decoys", "_outputs", "_snap", "_settle", "_unchanged",
              "_time_checked", "_bench", "_check"):
        setattr(judge, m, wrap(m, getattr(judge, m)))
    judge.reference = wrap("reference()", judge.reference)
    judge.rt.load = wrap("rt.load", judge.rt.load)
    judge.rt.prepare = wrap("rt.prepare", judge.rt.prepare)
    for mod, names in ((verify, ("compare", "tolerance_bound", "decoys")),
                       (worker, ("_same_bits", "_sampled", "_salted"))):
        for f in names:
            setattr(mod, f, wrap(f, getattr(mod, f)))
    verify.Snapshot.__init__ = wrap("Snapshot()", verify.Snapshot.__init__)
    verify.Snapshot.intact = wrap("Snapshot.intact", verify.Snapshot.intact)
    walls = []
    for i in range(n):
        t0 = time.perf_counter()
        r = judge.evaluate({**jobs[i % len(jobs)], "seed": secrets.randbits(48)})
        walls.append(time.perf_counter() - t0)
        print(r["status"], r.get("reason", ""), r.get("phases"))
    print("wall per evaluation (steps synchronized):", [round(w, 3) for w in walls])
    print(f"{'step':<18} {'calls':>6} {'incl s':>8} {'excl s':>8}   (per evaluation)")
    for name in sorted(incl, key=lambda k: -excl[k]):
        print(f"{name:<18} {count[name] / n:>6.1f} {incl[name] / n:>8.4f} {excl[name] / n:>8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
