"""What torch.compile makes of a spec's reference at one shape: Inductor's generated code
(the Triton kernels with their launch grid, num_warps and block sizes) and its time, so a
template can be compared with what Inductor does before changing it. Run on the GPU machine:
    python3 tools/inductor_code.py pipelines/rmsnorm-h200.yaml 16384x8192 [--out FILE]
Inputs come from the judge's own generator (the spec's first distribution, never zeros);
the time is the median of event-timed calls with the L2 flushed before each."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("shape", help="sizes joined by x, in the order of the spec's symbols")
    ap.add_argument("--out", type=Path, help="also write the generated code here")
    a = ap.parse_args()

    import torch
    from torch._inductor.utils import run_and_get_code

    from runner.judge.timing import bench
    from runner.judge.worker import Judge
    from runner.spec.spec import load_spec

    spec = load_spec(a.spec)
    symbols = list(spec.op.symbols)
    sizes = [int(v) for v in a.shape.lower().split("x")]
    if len(sizes) != len(symbols):
        raise SystemExit(f"{a.shape}: expected {len(symbols)} sizes ({'x'.join(symbols)})")
    shape = dict(zip(symbols, sizes))
    judge = Judge(spec)
    ins = judge._inputs(shape, 1234, 0)
    fn = torch.compile(judge.reference, dynamic=False)  # as the judge compiles it
    _, codes = run_and_get_code(lambda: fn(**ins, **judge.scalars))
    text = "\n\n".join(codes)
    print(text)
    if a.out:
        a.out.write_text(text)
    rt = judge.rt
    rt.flush_mode = "clean"
    ts = bench(lambda: fn(**ins, **judge.scalars), rt.sync, 10, 40, before=rt.flush, timer=rt.timer, min_reps=10)
    t = statistics.median(ts)
    from runner.core import figures

    nbytes = figures.floors(spec, [shape])[0]["bytes"]
    print(f"# torch.compile at {a.shape}: {t * 1e6:.1f} us, {nbytes / t / 1e12:.2f} TB/s (median of {len(ts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
