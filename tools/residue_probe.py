"""Does what one launch leaves in shared memory and in its threads' local frames reach the next
launch, and does the judge's scrub remove it? (docs/judge.md, "State kept between calls".)

    python tools/residue_probe.py               # the H200 profile's runtime, 3 rounds
    python tools/residue_probe.py --rounds 5

A writer kernel fills, with a pattern drawn from a fresh tag, one of (KINDS):

- smem: every SM's shared memory (one block of the opt-in maximum, four waves of blocks);
- reserved: the shared memory sm_90 reserves in each block below the block's own (1 KiB on the
  H200), by raw shared-window address (`st.shared` at [0, the dynamic array's address)), in the
  same blocks as smem (session 30: a mark kept at address 0 survived other kernels' launches);
- local264, local1k, local4k: its threads' local frames of 264 bytes, 1 KiB (the default stack)
  and 4 KiB (more than the stack: the driver raises it for the launch), every thread slot of
  every SM twice over, in blocks of 256 threads; local1k-1024t the same in blocks of 1024;
- window: with no frame at all, the first 1 KiB of its threads' local windows through generic
  addresses (`cvta.local`); window8k: 8 KiB of them, after a launch with an 8 KiB frame raised
  the stack.

A reader kernel of the same kind then counts the words of its own, never written, memory that
hold the pattern. Between the two, one of:

- nothing;
- the flush and an input refresh (what the judge did ahead of a timed call before the scrub):
  `Runtime.flush` (a read of twice the L2) and a copy of 256 MiB;
- the judge's scrub (`Runtime.scrub`, given the reader's frame as the judge gives a candidate's),
  then the flush and the refresh.

It prints the fraction of the reader's words that held the pattern, a row for each kind as it
is measured (and writes them to --json). On the H200 the window kinds fault (session 30: a
kernel with no frame has no local memory at the addresses `cvta.local` makes from small
offsets), which ends the process: run them with --kinds, each in a process of its own.
"nothing" well above 0 is the residue a kernel could
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

PATTERN = r"""
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
// the shared memory reserved in each block below its own (sm_90: 1 KiB), reached by raw address
// in the block's shared window: words [0, the dynamic array's address) as the array's own kernel
// sees them. Prediction on the H200 (one block of the opt-in maximum an SM, so the reserved part
// sits at the same place in every such block): nothing 1.0; flush 1.0 (no kernel of the flush or
// the refresh writes a block's reserved part); scrub 0.0 (Runtime.scrub's shared-memory kernel
// writes every word below its own array since session 30).
__device__ __forceinline__ void st_reserved(unsigned a, unsigned v) {
  asm volatile("st.volatile.shared.u32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_reserved(unsigned a) {
  unsigned v;
  asm volatile("ld.volatile.shared.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
  return v;
}
extern "C" __global__ void __launch_bounds__(1024) w_reserved(unsigned tag, int words) {
  extern __shared__ unsigned w_reserved_s[];
  const unsigned lo = (unsigned)__cvta_generic_to_shared(w_reserved_s);
  for (int i = threadIdx.x; i < words && 4u * (unsigned)i < lo; i += blockDim.x)
    st_reserved(4u * (unsigned)i, PAT(tag, i));
}
extern "C" __global__ void __launch_bounds__(1024) r_reserved(unsigned tag, int words, unsigned long long* hits) {
  extern __shared__ unsigned r_reserved_s[];
  const unsigned lo = (unsigned)__cvta_generic_to_shared(r_reserved_s);
  unsigned long long n = 0;
  for (int i = threadIdx.x; i < words && 4u * (unsigned)i < lo; i += blockDim.x)
    n += ld_reserved(4u * (unsigned)i) == PAT(tag, i);
  atomicAdd(hits, n);
}
// a kernel with no local frame at all reaching its threads' local windows through generic
// addresses made from local offsets
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
# local frames of a given size (words) and block size: writer and reader
LOCAL = r"""
extern "C" __global__ void __launch_bounds__(BLOCK) w_NAME(unsigned tag, int words) {
  volatile unsigned a[WORDS];
#pragma unroll 1
  for (int i = 0; i < words && i < WORDS; ++i) a[i] = PAT(tag, i);
}
extern "C" __global__ void __launch_bounds__(BLOCK) r_NAME(unsigned tag, int words, unsigned long long* hits) {
  volatile unsigned a[WORDS];
  unsigned long long n = 0;
#pragma unroll 1
  for (int i = 0; i < words && i < WORDS; ++i) n += a[i] == PAT(tag, i);
  atomicAdd(hits, n);
}
"""
# name: (frame words, threads a block); "grow": a launch with an 8 KiB frame first, which raises
# the context's stack size, then the window kinds read and write 8 KiB of it
KINDS = {"smem": None, "reserved": None, "local264": (66, 256), "local1k": (256, 256), "local4k": (1024, 256),
         "local1k-1024t": (256, 1024), "window": (256, 256), "window8k": (2048, 256)}

def _local(name: str, words: int, block: int) -> str:
    return LOCAL.replace("NAME", name).replace("WORDS", str(words)).replace("BLOCK", str(block))


SOURCE = (PATTERN + "".join(_local(k.replace("-", "_"), *size) for k, size in KINDS.items() if k.startswith("local"))
          + _local("grow", 2048, 256))
BETWEEN = ("nothing", "flush", "scrub")


def judge_runtime(spec_path: str | None = None):
    """The judge's CUDA runtime for a spec's hardware profile and runtime section."""
    from runner.build.backends import cuda
    from runner.spec.spec import load_spec

    spec = load_spec(spec_path or str(ROOT / "pipelines" / "softmax-h200.yaml"))
    return cuda.Runtime(spec.hw, spec.runtime)


def measure(rt, rounds: int = 3, on_row=None, kinds=None) -> dict:
    """{kind: {between: the largest fraction of the reader's words that held the writer's
    pattern over `rounds`}} for each kind of KINDS and between in BETWEEN, with the judge's
    runtime `rt`; the scrub is called as the judge calls it, with the reader's own frame."""
    import torch

    from runner.build.backends import cuda

    props = rt.dev.properties
    sms = int(props.multiprocessor_count)
    smem = int(props.max_shared_memory_per_block_optin)
    threads = int(props.max_threads_per_multiprocessor)
    arg_kinds = {"w": ["i32", "i32"], "r": ["i32", "i32", "ptr"]}
    fns = {}

    def fn(entry, role):
        if entry not in fns:
            built = cuda.compile(SOURCE, entry, (), rt.hw)
            if not built.ok:
                raise RuntimeError(f"{entry}: {built.reason}")
            fns[entry] = rt.load(built.artifact, entry, arg_kinds[role])
        return fns[entry]

    hits = torch.zeros(1, dtype=torch.int64, device="cuda")
    src = torch.randn(64 << 20, device="cuda")
    dst = torch.empty_like(src)
    out: dict = {}
    for kind, size in KINDS.items():
        if kinds is not None and kind not in kinds:
            continue
        if kind == "smem":
            g, words, name, per = {"grid": [4 * sms], "block": [1024], "shared_mem": smem}, smem // 4, "smem", 1
        elif kind == "reserved":  # the blocks of smem; the words below their own shared memory
            reserved = int(getattr(props, "reserved_shared_memory_per_block", 0) or 1024)
            g, words, name, per = {"grid": [4 * sms], "block": [1024], "shared_mem": smem}, reserved // 4, "reserved", 1
        else:
            w, block = size
            name = kind.split("8k")[0].replace("-", "_")
            g = {"grid": [2 * (threads // block) * sms], "block": [block]}
            words, per = w, block
        if kind == "window8k":  # the stack raised first: an 8 KiB frame launched
            rt.prepare(fn("w_grow", "w"), [1, 2048], {"grid": [1], "block": [32]}, mode="direct")()
        total = g["grid"][0] * per * words
        out[kind] = {}
        for between in BETWEEN:
            worst = 0.0
            for _ in range(rounds):
                tag = secrets.randbits(31) | 1
                hits.zero_()
                rt.prepare(fn(f"w_{name}", "w"), [tag, words], g, mode="direct")()
                read = rt.prepare(fn(f"r_{name}", "r"), [tag, words, hits.data_ptr()], g, mode="direct")
                if between == "scrub":
                    rt.scrub(getattr(read, "local_bytes", 0))
                if between in ("flush", "scrub"):
                    dst.copy_(src)
                    rt.flush()
                read()
                torch.cuda.synchronize()
                worst = max(worst, int(hits.item()) / total)
            out[kind][between] = worst
        if on_row is not None:
            on_row(kind, out[kind])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=None, help="the spec whose hardware profile and runtime the judge uses")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the fractions here, row by row as they are measured")
    ap.add_argument("--kinds", help="comma-separated kinds of KINDS to measure (default all); the window kinds "
                    "may fault on a device that maps no local window past a frame, which ends the process")
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
        print(f"  {where:>13}: {cells}", flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows))

    kinds = None
    if a.kinds:
        kinds = [k for k in a.kinds.split(",") if k]
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            print(f"residue_probe: unknown kinds {unknown}; known: {sorted(KINDS)}", file=sys.stderr)
            return 2
    measure(rt, a.rounds, on_row=row, kinds=kinds)
    if any(r["scrub"] > 0 for r in rows.values()):
        return 1
    return 0 if any(r["nothing"] > 0 for r in rows.values()) else 3


if __name__ == "__main__":
    sys.exit(main())
