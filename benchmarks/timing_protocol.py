"""How the judge's timing protocol moves a figure, on the GPU.

Times, by the judge's own `bench` and the CUDA runtime's timer and flush:
  - a device copy of 256 MiB (read) into 256 MiB (written), the bytes of every flagship shape;
  - torch eager softmax at the flagship shapes, on each input distribution of the spec;
under the L2 flush that reads a buffer twice the L2 ("clean", the judge's) and the one that
writes it ("dirty", as triton.testing.do_bench does, leaving dirty lines whose write-back
lands in the timed call), each with and without the input refresh that the judge queues
ahead of every timed call. A 2 GiB copy with no flush at all gives the bandwidth that no
L2 protocol touches. Every arm runs in rounds that alternate the order; medians.

    python benchmarks/timing_protocol.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import torch

    from runner.build.backends.cuda import Runtime
    from runner.judge.inputs import make_inputs
    from runner.judge.timing import bench
    from runner.judge.worker import _alternate
    from runner.spec.spec import load_spec

    spec = load_spec(str(Path(__file__).resolve().parents[1] / "pipelines" / "softmax-h200.yaml"))
    rt = Runtime(spec.hw)
    dists = list(spec.op.inputs[0].dists)

    def x_of(M, N, d, seed):  # the judge's own inputs: round r draws the spec's r-th distribution
        return make_inputs(spec.op, {"M": M, "N": N}, seed, dists.index(d), "cuda")["x"]

    arms = {}  # name -> (call, refresh, bytes); refresh: the other of two value sets, as the judge does
    n = 128 << 20  # bf16 elements: 256 MiB
    src = {"b": torch.randint(0, 256, (2 * n,), dtype=torch.uint8, device="cuda")}
    dst = torch.empty_like(src["b"])
    _, refresh = _alternate(src, [{"b": src["b"].clone()}, {"b": torch.randint_like(src["b"], 0, 256)}])
    arms["copy 256 MiB"] = (lambda: dst.copy_(src["b"]), refresh, 4 * n)
    for M, N in [(32768, 4096), (8192, 16384), (4096, 32768), (1024, 131072)]:
        for d in ("normal", "outliers", "masked"):
            x = {"x": x_of(M, N, d, 0)}
            _, refresh = _alternate(x, [{"x": x["x"].clone()}, {"x": x_of(M, N, d, 1)}])
            arms[f"eager softmax {M}x{N} {d}"] = (lambda x=x["x"]: torch.softmax(x, dim=-1), refresh, 4 * M * N)
    big_src = torch.randint(0, 256, (2 << 30,), dtype=torch.uint8, device="cuda")
    big_dst = torch.empty_like(big_src)

    protocols = [("clean", True), ("clean", False), ("dirty", True), ("dirty", False)]
    res: dict[str, dict[str, list[float]]] = {k: {f"{f}{'+refresh' if r else ''}": [] for f, r in protocols}
                                              for k in arms}
    res["copy 2 GiB, no flush"] = {"none": []}
    for rnd in range(a.rounds):
        order = list(arms.items())
        if rnd % 2:
            order.reverse()
        for name, (call, refresh, _) in order:
            for f, r in (protocols if rnd % 2 == 0 else protocols[::-1]):
                rt.flush_mode = f
                before = (lambda refresh=refresh: (refresh(), rt.flush())) if r else rt.flush
                rt.walls = []
                ts = bench(call, rt.sync, 10, 60, before=before, timer=rt.timer, min_reps=10)
                res[name][f"{f}{'+refresh' if r else ''}"].append(statistics.median(ts))
        rt.walls = []
        ts = bench(lambda: big_dst.copy_(big_src), rt.sync, 10, 100, timer=rt.timer, min_reps=10)
        res["copy 2 GiB, no flush"]["none"].append(statistics.median(ts))

    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": a.rounds, "arms": {}}
    nbytes = {k: v[2] for k, v in arms.items()}
    nbytes["copy 2 GiB, no flush"] = 4 << 30
    cols = [f"{f}{'+refresh' if r else ''}" for f, r in protocols]
    print(f"{'arm':44s}" + "".join(f"{c:>24s}" for c in cols))
    for name, by in res.items():
        row = {c: statistics.median(v) for c, v in by.items()}
        out["arms"][name] = {c: {"median_s": t, "tbps": nbytes[name] / t / 1e12, "rounds": by[c]} for c, t in row.items()}
        print(f"{name:44s}" + "".join(f"{row[c] * 1e6:10.1f} us {nbytes[name] / row[c] / 1e12:5.2f} TB/s" if c in row
                                      else f"{'':>24s}" for c in (cols if len(row) > 1 else ["none"])))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
