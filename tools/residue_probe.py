"""Does what one launch leaves in shared memory and in its threads' local frames reach the next
launch, and does the judge's scrub remove it? (docs/judge.md, "State kept between calls".)

    python tools/residue_probe.py               # the H200 profile's runtime, 3 rounds
    python tools/residue_probe.py --rounds 5

A writer kernel fills every SM's shared memory (one block of the opt-in maximum, four waves of
blocks), or its threads' local frames (1 KiB each, every thread slot an SM holds), or, with no
frame at all, the first 1 KiB of its threads' local windows through generic addresses
("window"), with a pattern drawn from a fresh tag; a reader kernel of the same kind then counts
the words of its own, never written, memory that hold the pattern. Between the two, one of:

- nothing;
- the flush and an input refresh (what the judge did ahead of a timed call before the scrub):
  `Runtime.flush` (a read of twice the L2) and a copy of 256 MiB;
- the judge's scrub (`Runtime.scrub`), then the flush.

It prints the fraction of the reader's words that held the pattern, a row for each kind as it
is measured (and writes them to --json). "nothing" well above 0 is the residue a kernel could
keep its state in; "scrub" must be 0. Exit status 1 where the scrub
leaves any, 2 without a CUDA GPU, 3 where nothing survives even with nothing between (no
residue on this device: the scrub has nothing to remove).
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCE = r"""
#define PAT(tag, i) ((tag) ^ ((unsigned)(i) * 2654435761u))
extern "C" __global__ void __launch_bounds__(1024) w_smem(unsigned tag, int words) {
  extern __shared__ unsigned s_[];
  volatile unsigned* s = s_;
  for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = PAT(tag, i);
}
extern "C" __global__ void __launch_bounds__(1024) r_smem(unsigned tag, int words, unsigned long long* hits) {
  extern __shared__ unsigned s_[];
  volatile unsigned* s = s_;
  unsigned long long n = 0;
  for (int i = threadIdx.x; i < words; i += blockDim.x) n += s[i] == PAT(tag, i);
  atomicAdd(hits, n);
}
extern "C" __global__ void __launch_bounds__(256, 8) w_local(unsigned tag, int words) {
  volatile unsigned a[256];
#pragma unroll 1
  for (int i = 0; i < words && i < 256; ++i) a[i] = PAT(tag, i);
}
extern "C" __global__ void __launch_bounds__(256, 8) r_local(unsigned tag, int words, unsigned long long* hits) {
  volatile unsigned a[256];
  unsigned long long n = 0;
#pragma unroll 1
  for (int i = 0; i < words && i < 256; ++i) n += a[i] == PAT(tag, i);
  atomicAdd(hits, n);
}
// a kernel with no local frame at all reaching its threads' local windows through generic
// addresses made from local offsets: the window (the context's stack size, 1 KiB by default) is
// there whatever the frame
__device__ __forceinline__ volatile unsigned* window(int i) {
  unsigned long long g;
  asm volatile("cvta.local.u64 %0, %1;" : "=l"(g) : "l"(4ull * (unsigned long long)i));
  return (volatile unsigned*)g;
}
extern "C" __global__ void __launch_bounds__(256, 8) w_window(unsigned tag, int words) {
#pragma unroll 1
  for (int i = 0; i < words; ++i) *window(i) = PAT(tag, i);
}
extern "C" __global__ void __launch_bounds__(256, 8) r_window(unsigned tag, int words, unsigned long long* hits) {
  unsigned long long n = 0;
#pragma unroll 1
  for (int i = 0; i < words; ++i) n += *window(i) == PAT(tag, i);
  atomicAdd(hits, n);
}
"""
LOCAL_WORDS = 256
BETWEEN = ("nothing", "flush", "scrub")


def judge_runtime(spec_path: str | None = None):
    """The judge's CUDA runtime for a spec's hardware profile and runtime section."""
    from runner.build.backends import cuda
    from runner.spec.spec import load_spec

    spec = load_spec(spec_path or str(ROOT / "pipelines" / "softmax-h200.yaml"))
    return cuda.Runtime(spec.hw, spec.runtime)


def measure(rt, rounds: int = 3, on_row=None) -> dict:
    """{"smem" | "local" | "window": {between: the largest fraction of the reader's words that held the
    writer's pattern over `rounds`}} for between in BETWEEN, with the judge's runtime `rt`."""
    import torch

    from runner.build.backends import cuda

    props = rt.dev.properties
    sms = int(props.multiprocessor_count)
    smem = int(props.max_shared_memory_per_block_optin)
    per_sm = int(props.max_threads_per_multiprocessor) // 256
    kinds = {"w": ["i32", "i32"], "r": ["i32", "i32", "ptr"]}
    geo = {"smem": {"grid": [4 * sms], "block": [1024], "shared_mem": smem},
           "local": {"grid": [2 * per_sm * sms], "block": [256]},
           "window": {"grid": [2 * per_sm * sms], "block": [256]}}
    words = {"smem": smem // 4, "local": LOCAL_WORDS, "window": LOCAL_WORDS}
    fns = {}
    for where in geo:
        for role in "wr":
            built = cuda.compile(SOURCE, f"{role}_{where}", (), rt.hw)
            if not built.ok:
                raise RuntimeError(f"{role}_{where}: {built.reason}")
            fns[role, where] = rt.load(built.artifact, f"{role}_{where}", kinds[role])  # the local frame counts
    hits = torch.zeros(1, dtype=torch.int64, device="cuda")
    src = torch.randn(64 << 20, device="cuda")
    dst = torch.empty_like(src)
    out: dict = {}
    for where in geo:
        g = geo[where]
        total = g["grid"][0] * (g["block"][0] if where != "smem" else 1) * words[where]
        out[where] = {}
        for between in BETWEEN:
            worst = 0.0
            for _ in range(rounds):
                tag = secrets.randbits(31) | 1
                hits.zero_()
                rt.prepare(fns["w", where], [tag, words[where]], g, mode="direct")()
                if between == "scrub":
                    rt.scrub()
                if between in ("flush", "scrub"):
                    dst.copy_(src)
                    rt.flush()
                rt.prepare(fns["r", where], [tag, words[where], hits.data_ptr()], g, mode="direct")()
                torch.cuda.synchronize()
                worst = max(worst, int(hits.item()) / total)
            out[where][between] = worst
        if on_row is not None:
            on_row(where, out[where])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=None, help="the spec whose hardware profile and runtime the judge uses")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the fractions here, row by row as they are measured")
    a = ap.parse_args(argv)
    import json

    import torch

    if not torch.cuda.is_available():
        print("residue_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    rt = judge_runtime(a.spec)
    print(f"residue_probe on {torch.cuda.get_device_name()}: the largest fraction of a reader's words that "
          f"held the last launch's pattern, over {a.rounds} rounds", flush=True)
    rows: dict = {}

    def row(where, fractions):  # printed and written as each is done: a fault later keeps them
        rows[where] = fractions
        cells = "  ".join(f"{b} {fractions[b]:.4f}" for b in BETWEEN)
        print(f"  {where:>6}: {cells}", flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows))

    measure(rt, a.rounds, on_row=row)
    if any(r["scrub"] > 0 for r in rows.values()):
        return 1
    return 0 if any(r["nothing"] > 0 for r in rows.values()) else 3


if __name__ == "__main__":
    sys.exit(main())
