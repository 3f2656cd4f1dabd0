"""Where a judged trial's time goes, function by function: the spec's start configuration
judged in this process (no worker), the first evaluation as warm-up, then N evaluations
under cProfile; prints the judge's own functions by cumulative time.

    python tools/judge_profile.py [SPEC] [--n 3] [--top 30]
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
    a = ap.parse_args()
    from runner.judge.worker import Judge
    from runner.spec.spec import load_spec
    from runner.build.builder import Builder

    spec = load_spec(a.spec)
    builder = Builder(spec)
    params = dict(spec.start)
    arts, bad = builder.compiled(builder.render_all(params))
    if bad is not None:
        print("does not compile:", bad.reason)
        return 1
    job = {"artifacts": arts, "geometry": builder.geometry(params)}
    judge = Judge(spec)
    r = judge.evaluate({**job, "seed": secrets.randbits(48)})
    print("warm-up:", r["status"], r.get("reason", ""), r.get("phases"))
    prof = cProfile.Profile()
    walls = []
    for _ in range(a.n):
        t0 = time.perf_counter()
        prof.enable()
        r = judge.evaluate({**job, "seed": secrets.randbits(48)})
        prof.disable()
        walls.append(time.perf_counter() - t0)
        print(r["status"], r.get("phases"))
    print("wall per evaluation:", [round(w, 3) for w in walls])
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(r"runner|torch/(cuda|random)|_tensor", a.top)
    st.sort_stats("tottime").print_stats(a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
