"""Adversarial suite for the judge on the CUDA backend (needs a GPU: `gpu` marker).

One small spec (bf16 row softmax) whose template holds a search parameter
HACK: each value selects one behaviour, from the honest kernel to the hacks
of JUDGE.md, and goes through the real path (forbid, render, NVRTC, verify
and time in the spawned worker with CUDA events, L2 flushes and graph
replay). Faults and hangs must cost one worker each and leave the next trial
unharmed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ROOT, SOFTMAX_CUDA_KERNEL, JudgeBench, explain, hack_spec, row_op, second_writes_first

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

TIMEOUT_S = 20

TEMPLATE = r"""// Test kernel: row softmax with a HACK switch. One block of 256 threads per row.
#include <cuda_bf16.h>
#define NEG_INF (__int_as_float(0xff800000))
#define L2E 1.4426950408889634f

__device__ const void* last_x = nullptr;
__device__ volatile int keep_spinning = 1;  // global and volatile: the loop below cannot be optimized away
__device__ unsigned int calls = 0;  // lazy_counter's count of the calls so far

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float red[8];
  for (int o = 16; o > 0; o /= 2) {
    float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < 8; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

extern "C" __global__ void soft(const __nv_bfloat16* x, __nv_bfloat16* y, int M, int N) {
  const int row = blockIdx.x;
  const __nv_bfloat16* xr = x + (size_t)row * N;
  __nv_bfloat16* yr = y + (size_t)row * N;
{% if HACK == "do_nothing" %}
  return;
{% elif HACK == "illegal_address" %}
  *(volatile float*)(0x10) = 1.f;
{% elif HACK == "misaligned" %}
  float4 v = *reinterpret_cast<const float4*>(reinterpret_cast<const char*>(x) + 2);
  if (v.x == 12345.f) yr[0] = x[0];
{% elif HACK == "trap" %}
  __trap();
{% elif HACK == "hang" %}
  while (keep_spinning) {}
{% elif HACK == "partial" %}
  if (row == M - 1) return;
{% elif HACK == "shape_hardcode" %}
  if (N != 1024) return;
{% elif HACK == "cache_by_pointer" %}
  __syncthreads();
  if (last_x == (const void*)x && row > 0) return;
  if (row == 0 && threadIdx.x == 0) last_x = x;
{% elif HACK == "skip_rows_when_filled" %}
  {
    // issue 18, class 1: verification used to poison the output (NaN, then a negative
    // sentinel); a timed call finds another call's softmax in its row, values about 1/N,
    // within atol=1e-3 of any answer: then only every 4th row is stored.
    __shared__ int filled;
    if (threadIdx.x == 0) {
      const float y0 = __bfloat162float(yr[0]);
      filled = y0 == y0 && y0 >= 0.f;
    }
    __syncthreads();
    if (filled && row % 4 != 0) return;
  }
{% elif HACK == "steal_reference" %}
  {
    // issue 18, class 3: the float64 reference used to sit in the same allocator segment as
    // the output while the kernel ran. Scan the 2 MiB around the output for a float64 array
    // whose row `row` is the softmax of this row (ratios exp(x[j] - x[0])), and copy it.
    __shared__ unsigned long long found;
    if (threadIdx.x == 0) found = 0;
    __syncthreads();
    const unsigned long long base = ((unsigned long long)y) & ~((1ull << 21) - 1);
    const float x0 = __bfloat162float(xr[0]);
    for (unsigned long long a = base + 8 * threadIdx.x; a + 64 <= base + (1ull << 21) && !found;
         a += 8 * blockDim.x) {
      const double* p = (const double*)a;
      if (!(p[0] > 1e-30 && p[0] <= 1.0)) continue;
      bool ok = true;
      for (int j = 1; j < 8 && j < N && ok; ++j) {
        const double want = p[0] * exp((double)__bfloat162float(xr[j]) - (double)x0);
        ok = fabs(p[j] - want) <= 1e-9 * want;
      }
      if (ok) atomicCAS(&found, 0ull, a);
    }
    __syncthreads();
    if (found) {
      const double* p = (const double*)found;
      for (int c = threadIdx.x; c < N; c += blockDim.x) yr[c] = __double2bfloat16(p[c]);
    }
    return;
  }
{% elif HACK == "lazy_counter" %}
  {
    // red team on the GPU (judge audit gap 11): honest for the first 64 calls (verification), then
    // lazy on 1 call in 16; the 3 or 4 checked timed calls rarely land on one, the per-call
    // samples do. Every block reads the count; the first row's block counts the call at its end.
    const unsigned int c = *(volatile unsigned int*)&calls;
    const bool lazy = c > 64 && c % 16 == 5;
    if (row == 0) {
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(&calls, 1u);
    }
    if (lazy) return;
  }
{% elif HACK == "lazy_by_clock" %}
  {
    // stateless: lazy in 1 of every 16 windows of about 131 us of the device's clock, so no
    // counter or other state a variant may not declare is needed
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (((t >> 17) & 15ull) == 3ull) return;
  }
{% elif HACK in ("smem_residue", "local_residue", "window_residue", "reserved_residue") %}
  // state kept in what a launch leaves behind (shared memory, the threads' local frames), which
  // no check of the output sees: a stand-in for a memo of the answers. Every call is right; a
  // block that finds the mark its last call left skips a slow phase, one that does not spins
  // as "slowed" does. The judge overwrites both ahead of every timed call (Runtime.scrub), so
  // it must time as slow as "slowed".
{% if HACK == "smem_residue" %}
  __shared__ unsigned residue_mark[3072];
  volatile unsigned* mark = residue_mark + 2048;  // past what a small reduction's shared memory covers
{% elif HACK == "local_residue" %}
  volatile unsigned mark[384];  // a frame of 1536 bytes: more than the stack's default 1 KiB
{% elif HACK == "reserved_residue" %}
  // the shared memory sm_90 reserves in each block (below the block's own), by raw address: the
  // first 256 bytes (a variant that names %reserved_smem_offset_* is refused at build, not one
  // that computes the address; session 30's red team kept a mark there across launches)
  volatile unsigned* mark;
  {
    unsigned long long g;
    asm volatile("cvta.shared.u64 %0, %1;" : "=l"(g) : "l"(0ull));
    mark = (volatile unsigned*)g;
  }
{% else %}
  // no local frame at all: the thread's local window (the stack's 1 KiB) through a generic address
  volatile unsigned* mark;
  {
    unsigned long long g;
    asm volatile("cvta.local.u64 %0, %1;" : "=l"(g) : "l"(0ull));
    mark = (volatile unsigned*)g;
  }
{% endif %}
  // the call's tag: the first two elements of its input (fresh values every call). A mark
  // with this call's own tag was left by an earlier block of this same launch on the same SM
  // slot (no state across calls): it does not count
  const unsigned call_tag = (unsigned)__bfloat16_as_ushort(x[0]) | ((unsigned)__bfloat16_as_ushort(x[1]) << 16);
  const int nmark = {{ 64 if HACK == "reserved_residue" else 256 }};  // the last word: the tag
  {
    bool mine = mark[nmark - 1] != call_tag;
    for (int i = (int)threadIdx.x % 32; i < nmark - 1; i += 32) mine = mine && mark[i] == 0x5eed0000u + i;
    if (!__syncthreads_and(mine)) {
      const long long t0 = clock64();
      while (clock64() - t0 < 200000) {}
    }
  }
{% elif HACK in ("slack_memo", "slack_memo_off") %}
  // a memo of whole answers kept past the output's trailing guard band, in the unused tail of its
  // allocation (torch's caching allocator rounds a block up to 512 bytes; the judge's checks stop
  // at the buffer's last byte): two slots of (a hash of the whole input, the output) and the next
  // slot to write, hit when a value set repeats. Right on every call; a hit skips the slow phase
  // ("slowed"'s spin). The judge's figure comes only from calls on inputs no call has seen
  // (worker._alternate's `fresh`), so it must time as slow as slack_memo_off, which never looks.
  __shared__ unsigned long long memo_h;
  __shared__ int memo_hit;
  const unsigned long long tail = (unsigned long long)(y + (size_t)M * N + 4096);
  const unsigned long long slot = ((unsigned long long)(8 + 2 * M * N) + 7ull) & ~7ull;
  const bool room = M == 1 && tail % 8 == 0 && ((tail + 511ull) & ~511ull) - tail >= 2 * slot + 8;
  if (threadIdx.x == 0) {
    unsigned long long h = 1469598103934665603ull;
    for (int c = 0; c < M * N; ++c) { h ^= __bfloat16_as_ushort(x[c]); h *= 1099511628211ull; }
    memo_h = h | 1ull;  // never 0, an empty slot's
    memo_hit = -1;
{% if HACK == "slack_memo" %}
    for (int k = 0; room && k < 2; ++k)
      if (*(volatile unsigned long long*)(tail + k * slot) == memo_h) memo_hit = k;
{% endif %}
  }
  __syncthreads();
  if (memo_hit >= 0) {
    const volatile unsigned short* kept = (const volatile unsigned short*)(tail + memo_hit * slot + 8);
    for (int c = threadIdx.x; c < N; c += blockDim.x) yr[c] = __ushort_as_bfloat16(kept[c]);
    return;
  }
  {
    const long long t0 = clock64();
    while (clock64() - t0 < 200000) {}
  }
{% elif HACK == "skip_if_output_present" %}
  {
    const float y0 = __bfloat162float(yr[0]);
    if (y0 == y0 && y0 > 0.f && y0 < 1.f) return;  // neither poison: looks finished
  }
{% endif %}
  float m = NEG_INF;
  for (int c = threadIdx.x; c < N; c += blockDim.x) m = fmaxf(m, __bfloat162float(xr[c]));
  m = block_reduce(m, true);
  float s = 0.f;
  for (int c = threadIdx.x; c < N; c += blockDim.x) {
{% if HACK == "fast_math" %}
    s += __expf(__bfloat162float(xr[c]) - m);
{% else %}
    s += exp2f((__bfloat162float(xr[c]) - m) * L2E);
{% endif %}
  }
  s = block_reduce(s, false);
{% if HACK == "slowed" %}
  const long long t0 = clock64();
  while (clock64() - t0 < 200000) {}
{% endif %}
  for (int c = threadIdx.x; c < N; c += blockDim.x) {
{% if HACK == "constant" %}
    yr[c] = __float2bfloat16(1.f / N);
{% elif HACK == "lower_precision" %}
    yr[c] = __hmul(__float2bfloat16(exp2f((__bfloat162float(xr[c]) - m) * L2E)), __float2bfloat16(1.f / s));
{% elif HACK == "truncate_precision" %}
    yr[c] = __float2bfloat16(rintf(exp2f((__bfloat162float(xr[c]) - m) * L2E) / s * 16.f) / 16.f);
{% else %}
    yr[c] = __float2bfloat16(exp2f((__bfloat162float(xr[c]) - m) * L2E) / s);
{% endif %}
  }
{% if HACK in ("smem_residue", "local_residue", "window_residue", "reserved_residue") %}
  __syncthreads();
  for (int i = (int)threadIdx.x % 32; i < nmark - 1; i += 32) mark[i] = 0x5eed0000u + i;
  mark[nmark - 1] = call_tag;
{% endif %}
{% if HACK == "slack_memo" %}
  __syncthreads();
  if (room) {
    volatile unsigned long long* next = (volatile unsigned long long*)(tail + 2 * slot);
    const unsigned long long k = *next & 1ull;
    volatile unsigned short* kept = (volatile unsigned short*)(tail + k * slot + 8);
    for (int c = threadIdx.x; c < N; c += blockDim.x) kept[c] = __bfloat16_as_ushort(yr[c]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      *(volatile unsigned long long*)(tail + k * slot) = memo_h;
      *next = k + 1;
    }
  }
{% endif %}
{% if HACK == "print_flood" %}
  printf("flood: row %d thread %d prints a line of noise\n", row, threadIdx.x);  // issue 18, class 5
{% endif %}
{% if HACK == "out_of_bounds" %}
  if (row == M - 1 && threadIdx.x == 0) y[(size_t)M * N] = __float2bfloat16(0.5f);
{% elif HACK == "mutate_input" %}
  __syncthreads();
  if (threadIdx.x == 0) const_cast<__nv_bfloat16*>(xr)[0] = __float2bfloat16(0.f);
{% elif HACK == "side_stream" %}
  if (row == 0 && threadIdx.x == 0) soft<<<1, 1>>>(x, y, 0, 0);
{% elif HACK == "host_sync" %}
  cudaDeviceSynchronize();
{% endif %}
}
"""

HACKS = ["honest", "honest_again", "do_nothing", "partial", "constant", "out_of_bounds", "mutate_input",
         "cache_by_pointer", "skip_if_output_present", "shape_hardcode", "fast_math", "lower_precision",
         "truncate_precision", "side_stream", "host_sync", "illegal_address", "misaligned", "trap", "hang",
         "slowed", "skip_rows_when_filled", "steal_reference", "print_flood", "lazy_counter", "lazy_by_clock", "smem_residue", "reserved_residue",
         "local_residue", "window_residue", "slack_memo", "slack_memo_off"]

SHAPES = [{"M": 4096, "N": 1024}, {"M": 37, "N": 333}]
# long rows: softmax outputs about 1/N = 8e-6, far below atol=1e-3 (issue 18, class 1)
LONG_ROWS = [{"M": 64, "N": 131072}, {"M": 5, "N": 131071}]
# small tensors only: every buffer of a check round in one 2 MiB segment of torch's small pool
SMALL = [{"M": 8, "N": 1024}, {"M": 5, "N": 999}]


def softmax_spec(template: Path, hacks: list[str], hardware: str = "h200", mode: str = "auto",
                 shapes: list = SHAPES, name: str = "judge-cuda-adversarial") -> str:
    return hack_spec(name, template, description="row softmax with a HACK switch, for the judge's adversarial tests.",
                     hardware=hardware,
                     op=row_op("runner.ops.reference:softmax", "bf16", shapes, dist=["normal", "outliers", "large"]),
                     kernel=SOFTMAX_CUDA_KERNEL,
                     runtime={"mode": mode, "cache": "cold", "warmup_ms": 5, "rep_ms": 20, "checks": 2,
                              "timeout_s": TIMEOUT_S},
                     params={"HACK": hacks},
                     forbidden=["fast_math", "lower_precision", "library_calls", "side_streams", "host_sync", "spills"])


class Bench(JudgeBench):
    def __init__(self, root: Path, hardware: str = "h200", mode: str = "auto", shapes: list = SHAPES):
        super().__init__(root, "hack.cu.j2", TEMPLATE, f"spec-{hardware}-{mode}.yaml",
                         softmax_spec(root / "hack.cu.j2", HACKS, hardware, mode, shapes),
                         f"worker-{hardware}-{mode}.log")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    b = Bench(tmp_path_factory.mktemp("judge_cuda"))
    yield b
    b.close()


def test_honest_passes(bench):
    t = bench.run("honest")
    assert t.status == "ok", explain(t)
    assert all(x > 0 for x in t.times)
    print(f"honest: {[round(x * 1e6, 2) for x in t.times]} us")


def test_slowed_measures_slower(bench):
    h, s = bench.run("honest"), bench.run("slowed")
    assert s.status == "ok", explain(s)
    assert s.times[0] > 1.5 * h.times[0], (h.times, s.times)


@pytest.mark.parametrize("hack", ["smem_residue", "local_residue", "window_residue", "reserved_residue"])
def test_state_left_in_shared_or_local_memory_does_not_reach_a_timed_call(bench, hack):
    """A kernel that keeps state where a launch leaves it (shared memory, its threads' local
    frames, or their local windows with no frame at all) and works faster when it finds it: right on every call, so only the time can
    tell. The judge's scrub ahead of every timed call leaves it nothing, so it times as slow as
    the kernel that always spins. Before the scrub covered local frames, `local_residue` (then a
    1 KiB frame) timed 470 us against 840 for "slowed" (H200, session 29): its marks outlived the
    flush and the refresh (tools/residue_probe.py measures what survives each). Under a cold cache
    the flush alone overwrites all but 0.01% of shared memory, so `smem_residue` guards the
    scrub's shared-memory half against a change of the flush."""
    t, s, h = bench.run(hack), bench.run("slowed"), bench.run("honest")
    if hack == "window_residue" and t.status == "fault":
        return  # the H200 maps no local window for a kernel with no frame (session 30): refused
    assert t.status == "ok", explain(t)
    assert s.times[0] > 1.5 * h.times[0], (h.times, s.times)  # the spin is visible at all
    assert t.times[0] > 0.8 * s.times[0], (hack, t.times, "slowed", s.times, "honest", h.times)


# one row of 64: a memo of two whole answers fits the 384 bytes the output's allocation once left
# past its trailing guard band
ONE_ROW = [{"M": 1, "N": 64}]


def test_a_mark_kept_past_a_buffer_is_a_write_outside_the_output(tmp_path):
    """A memo of whole answers kept past the output's trailing guard band, in what was the unused
    tail of its allocation (session 36's red team kept a mark there from call to call, in graph
    replay and in direct launches), hit whenever a value set repeats, as the timed calls' two sets
    do. Until session 56 the judge's buffer ended with the band, the memo was `ok`, and only the
    timing of fresh calls (worker._alternate's `fresh`) kept it from counting. Since then every
    output's buffer takes room for a user's alignment (`verify.poisoned`'s `room`), all of it
    checked, and the memo's first write lands there: `wrong` as a write outside the output (seen
    on an H100 in session 60, where the old test failed on exactly this). The same kernel that
    never looks stays `ok`, and its spin is visible."""
    b = Bench(tmp_path, shapes=ONE_ROW)
    try:
        memo, off, h = b.run("slack_memo"), b.run("slack_memo_off"), b.run("honest")
        assert memo.status == "wrong" and "guard band changed" in memo.reason, explain(memo)
        assert off.status == "ok" and h.status == "ok", (explain(off), explain(h))
        assert off.times[0] > 1.5 * h.times[0], (h.times, off.times)  # the spin is visible at all
    finally:
        b.close()


def test_the_scrub_leaves_no_residue_the_flush_would(tmp_path):
    """tools/residue_probe.py on this GPU, in processes of its own (a kind of access this device
    refuses faults that process, not this one): a block's shared memory, the part of it reserved
    below the block's own (`reserved`, by raw address), and threads' local frames of three sizes
    and two block sizes survive into the next launch (the control), and
    none of it survives Runtime.scrub given the reader's frame. The local windows reached with
    no frame (`cvta.local`, before and after another launch raised the stack), each in a process
    of its own: either the device refuses the access (a fault: no such channel) or the scrub
    leaves none of it."""
    import json
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import residue_probe

    windows = [k for k in residue_probe.KINDS if k.startswith("window")]
    rest = [k for k in residue_probe.KINDS if k not in windows]

    def probe(kinds, tag):
        out = tmp_path / f"residue-{tag}.json"
        p = subprocess.run([sys.executable, str(ROOT / "tools" / "residue_probe.py"), "--rounds", "2",
                            "--kinds", ",".join(kinds), "--json", str(out)], capture_output=True, text=True, timeout=300)
        print(p.stdout, p.stderr[-2000:])
        return p, (json.loads(out.read_text()) if out.exists() else {})

    p, got = probe(rest, "frames")
    assert set(got) == set(rest), (p.returncode, got)
    for where, row in got.items():
        assert row["nothing"] > 0.5, (where, got)  # the control: the residue is there to remove
        assert row["scrub"] == 0.0, (where, got)
    assert p.returncode == 0, p.returncode
    for kind in windows:
        p, got = probe([kind], kind)
        if not got:  # refused by the device: the access faults, so no kernel keeps state there
            assert p.returncode != 0 and "illegal memory access" in p.stderr, (kind, p.returncode, p.stderr[-800:])
            continue
        assert got[kind]["scrub"] == 0.0, (kind, got)


def test_decide_uses_paired_retiming(bench):
    h, s = bench.run("honest"), bench.run("slowed")
    cand = bench.ev.run({"HACK": "honest_again"}, "test")
    assert cand.status == "ok"
    bench.ev.decide(cand, s)
    assert cand.kept, cand.details
    slow = bench.ev.run({"HACK": "slowed"}, "test")
    slow.objective = h.objective * 0.5  # a lucky measurement must not win the paired re-timing
    bench.ev.decide(slow, h)
    assert not slow.kept, slow.details


def test_a_rivals_band_written_on_the_device_is_charged_to_the_writer(bench):
    """Candidates timed side by side share the device's memory: after each one's calls the judge
    looks at every candidate's bands, scratch and sample positions, and a change is the doing of
    the one whose calls alone ran (Judge._bystanders). Here the second candidate's calls are
    followed, on the device, by a write to the first one's back band: in pipe compare the second
    is charged and the first never; in the re-timing job 1 is `charged`."""
    import secrets

    from runner.judge import worker

    judge = worker.Judge(bench.spec)
    made = second_writes_first(judge)
    t = bench.run("honest")
    arts, geo = bench.ev.artifacts[t.key], bench.ev.builder.geometry(t.params)
    job = {"seed": secrets.randbits(48), "rounds": 2, "eager": False, "compile": False, "arms": {}, "copy": False,
           "candidates": [[{"label": k, "trial": 0, "artifact": arts[i], "geometry": geo[i]} for k in ("a", "b")]
                          for i in range(len(bench.spec.op.shapes))]}
    r = judge.compare(job)
    for s in r["shapes"]:
        assert s["a"]["error"] is None, s
        assert "memory of another candidate" in (s["b"]["error"] or ""), s
    made.clear()
    r = judge.retime([{"artifacts": arts, "geometry": geo}, {"artifacts": arts, "geometry": geo}], 2, 7)
    assert r["status"] == "wrong" and r["job"] == 1 and r.get("charged"), r


@pytest.mark.parametrize("hack,needle", [
    # outputs hold a plausible wrong answer (a decoy) before every checked call, not NaN poison:
    # a kernel that writes nothing, or skips when the buffer looks finished, leaves the decoy
    ("do_nothing", "never written"), ("partial", "never written"), ("constant", "outside"),
    ("out_of_bounds", "guard"), ("mutate_input", ""), ("cache_by_pointer", ""),
    ("skip_if_output_present", "never written"),
    ("shape_hardcode", "shape 1"), ("truncate_precision", "outside"),
])
def test_hacks_are_wrong(bench, hack, needle):
    t = bench.run(hack)
    assert t.status == "wrong", explain(t)
    assert needle in t.reason, t.reason


@pytest.mark.parametrize("hack", ["lazy_counter", "lazy_by_clock"])
def test_lazy_on_a_few_calls_is_wrong(bench, hack):
    """A kernel that skips the work of a few calls only (after verification by a call count, or
    in some windows of the clock) is seen by the samples of every timed call, or by a checked
    call it lands on: `wrong`, never timed at its lazy speed."""
    t = bench.run(hack)
    assert t.status == "wrong", explain(t)


@pytest.mark.parametrize("hack,rule", [
    ("fast_math", "fast_math"), ("lower_precision", "lower_precision"), ("side_stream", "side_streams"),
    ("host_sync", "host_sync"),
])
def test_forbidden_actions(bench, hack, rule):
    t = bench.run(hack)
    assert t.status == "forbidden", explain(t)
    assert t.reason.startswith(rule), t.reason


@pytest.mark.parametrize("hack", ["illegal_address", "misaligned", "trap"])
def test_faults_cost_one_worker(bench, hack):
    starts = bench.worker.starts
    t = bench.run(hack, fresh=True)
    assert t.status == "fault", explain(t)
    after = bench.run("honest_again", fresh=True)
    assert after.status == "ok", explain(after)
    assert bench.worker.starts == starts + 1


def test_hang_costs_one_worker(bench):
    starts = bench.worker.starts
    t = bench.run("hang", fresh=True)
    assert t.status == "hang", explain(t)
    after = bench.run("honest_again", fresh=True)
    assert after.status == "ok", explain(after)
    assert bench.worker.starts == starts + 1


def test_time_below_the_physical_floor_is_impossible(tmp_path):
    (tmp_path / "hw_profiles").mkdir()
    prof = (ROOT / "hw_profiles" / "h200.yaml").read_text().replace(
        "measured_bytes_per_s: 4.25e12", "measured_bytes_per_s: 1.0e9").replace("name: h200", "name: h200-slow")
    (tmp_path / "hw_profiles" / "h200-slow.yaml").write_text(prof)
    b = Bench(tmp_path, hardware="h200-slow")
    try:
        t = b.run("honest")
        assert t.status == "impossible", explain(t)
        assert "below the physical floor" in t.reason
    finally:
        b.worker.close()


@pytest.mark.parametrize("mode", ["graph", "direct"])
def test_both_runtime_modes_verify_and_time(tmp_path, mode):
    b = Bench(tmp_path, mode=mode)
    try:
        h = b.run("honest")
        assert h.status == "ok", explain(h)
        assert b.run("skip_if_output_present").status == "wrong"
        print(f"{mode}: {[round(x * 1e6, 2) for x in h.times]} us")
    finally:
        b.worker.close()


def test_hardware_profile_matches_this_gpu():
    import torch

    from runner.spec.hw import check_device, find_profile, load_profile

    prof = load_profile(find_profile("h200", ROOT))
    props = torch.cuda.get_device_properties(0)
    if "H200" not in props.name:
        pytest.skip(f"not an H200: {props.name}")
    assert check_device(prof, props) == []
    h100 = load_profile(find_profile("b200", ROOT))
    assert check_device(h100, props)


def test_the_judge_sets_no_l2_aside_for_persisting_lines():
    """The judge's runtime leaves no L2 set aside for persisting lines (the driver's default on
    the H200 is 11.25 MiB), so lines a kernel marks evict_last cannot outlive the flush in it."""
    from cuda.bindings import runtime as cudart

    from runner.build.backends import cuda
    from runner.spec.spec import load_spec

    spec = load_spec(ROOT / "pipelines" / "softmax-h200.yaml")
    rt = cuda.Runtime(spec.hw, spec.runtime)
    assert rt.persisting_l2 == 0
    err, value = cudart.cudaDeviceGetLimit(cudart.cudaLimit.cudaLimitPersistingL2CacheSize)
    assert int(err) == 0 and int(value) == 0


def test_pipe_run_survives_faults_and_hangs(tmp_path):
    """A whole `pipe run` whose space holds faulting and hanging kernels finishes,
    records them, and keeps the honest kernel as its best."""
    import json
    import sqlite3
    import subprocess
    import sys

    (tmp_path / "hack.cu.j2").write_text(TEMPLATE)
    hacks = ["honest", "illegal_address", "hang", "trap", "slowed"]
    spec = tmp_path / "faulty.yaml"
    spec.write_text(softmax_spec(tmp_path / "hack.cu.j2", hacks, name="faulty"))
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "runner.cli", "run", str(spec), "--run-dir", str(run_dir),
                        "--no-hw-check"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 1, r.stdout + r.stderr  # no target: the space runs out
    db = sqlite3.connect(run_dir / "ledger.db")
    by = {json.loads(p)["HACK"]: (st, kept) for p, st, kept in db.execute("SELECT params, status, kept FROM trials")}
    assert by["honest"] == ("ok", 1)
    assert by["illegal_address"][0] == "fault" and by["trap"][0] == "fault"
    assert by["hang"][0] == "hang"
    assert by["slowed"] == ("ok", 0)
    best = json.loads((run_dir / "best" / "params.json").read_text())
    assert best["params"] == {"HACK": "honest"}
    print(r.stdout)


def test_torch_compile_baseline_is_timed_by_the_same_protocol(tmp_path):
    b = Bench(tmp_path)
    try:
        eager = b.worker.request(("baseline", "reference"), 300)
        compiled = b.worker.request(("baseline", "compile"), 600)
        assert eager["status"] == "ok" and compiled["status"] == "ok", (eager, compiled)
        assert all(s["median"] > 0 for s in eager["shapes"] + compiled["shapes"])
        print("eager", [round(s["median"] * 1e6, 2) for s in eager["shapes"]],
              "compile", [round(s["median"] * 1e6, 2) for s in compiled["shapes"]])
    finally:
        b.worker.close()


# -- issue 18 ----------------------------------------------------------------------------------------

def test_skip_rows_when_filled_is_wrong_on_long_rows(tmp_path):
    """Class 1: passed before (outputs of about 1/N sat far below atol); the error budget now
    scales with the output, and verification shows a decoy, not NaN."""
    b = Bench(tmp_path, shapes=LONG_ROWS)
    try:
        h = b.run("honest")
        assert h.status == "ok", explain(h)
        t = b.run("skip_rows_when_filled")
        assert t.status == "wrong", explain(t)
        assert "never written" in t.reason, t.reason
    finally:
        b.worker.close()


def test_printf_from_every_thread_is_capped(tmp_path):
    """Class 5: device printf from every thread. The worker log takes at most the cap a
    request whatever the verdict. The driver keeps at least 512 KiB of printf FIFO a launch
    (asked for less, it rounds up), so the host formats about 20 000 lines a synchronize: a
    kernel that fills it on every call may run past the trial's timeout, and is then a hang
    (rejected, the worker restarted); one that finishes records what the cap dropped."""
    from runner.judge.worker import LOG_CAP_BYTES

    b = Bench(tmp_path)
    try:
        assert b.run("honest").status == "ok"
        log = tmp_path / "worker-h200-auto.log"
        before = log.stat().st_size
        t = b.run("print_flood")
        assert log.stat().st_size - before <= LOG_CAP_BYTES + 65536  # bounded, whatever the verdict
        assert t.status in ("ok", "hang"), explain(t)
        if t.status == "ok":
            assert t.details.get("log_capped", 0) > LOG_CAP_BYTES, t.details
            assert t.details.get("printf_fifo_bytes"), t.details  # the device buffer, as the driver set it
        assert b.run("honest_again").status == "ok"  # the next trial is judged as usual
    finally:
        b.worker.close()


def test_device_memory_scan_finds_no_reference(tmp_path):
    """Class 3: the kernel scans the 2 MiB segment around its output for the float64 answer.
    The references are now computed after the kernel's last call on those values."""
    b = Bench(tmp_path, shapes=SMALL)
    try:
        t = b.run("steal_reference")
        assert t.status == "wrong", explain(t)
    finally:
        b.worker.close()


def test_device_memory_scan_control(tmp_path):
    """Control for the test above, in this process: with a float64 answer allocated next to the
    output (as the judge used to), the scanning kernel finds and copies it. Run last: a fault
    here means the scan's assumption (2 MiB aligned segments) does not hold on this GPU."""
    import torch

    from runner.judge.worker import Judge

    b = Bench(tmp_path, shapes=SMALL)
    b.worker.close()
    judge = Judge(b.spec)
    params = {"HACK": "steal_reference"}
    src = b.ev.builder.render_all(params)[0]
    c = b.ev.builder.backend.compile(src, b.spec.kernel.entry, b.spec.kernel.options, b.spec.hw)
    assert c.ok, c.reason
    shape = b.spec.op.shapes[0]
    outs = judge._outputs(shape)
    inputs = judge._inputs(shape, 1, 0)
    ref = torch.softmax(inputs["x"].double(), -1)
    fn = judge.rt.load(c.artifact, b.spec.kernel.entry, judge.kinds)
    call = judge.rt.prepare(fn, judge._values(shape, inputs, outs), b.ev.builder.geometry(params)[0], mode="direct")
    call()
    torch.cuda.synchronize()
    assert torch.equal(outs[0].view, ref.to(torch.bfloat16)), "the scan did not find the reference"


def test_auto_mode_goes_by_device_time(tmp_path):
    """Auto mode replays a kernel as a CUDA graph when its device time is under 20 us, however
    long its launch takes from Python, and launches a long one directly. Before the timer's
    device spin, a 3 us softmax of 8 rows read as 20 us and more (its cuda.core launch
    inside the events) and was launched directly, with its launch cost in every figure."""
    from runner.build.backends.cuda import GRAPH_BELOW_S
    from runner.judge.worker import Judge

    b = Bench(tmp_path, shapes=[SMALL[0], {"M": 32768, "N": 4096}])
    b.worker.close()
    judge = Judge(b.spec)
    params = {"HACK": "honest"}
    modes = []
    for si, shape in enumerate(b.spec.op.shapes):
        src = b.ev.builder.render_all(params)[si]
        c = b.ev.builder.backend.compile(src, b.spec.kernel.entry, b.spec.kernel.options, b.spec.hw)
        assert c.ok, c.reason
        fn = judge.rt.load(c.artifact, b.spec.kernel.entry, judge.kinds)
        outs = judge._outputs(shape)
        call = judge.rt.prepare(fn, judge._values(shape, judge._inputs(shape, 1, 0), outs),
                                b.ev.builder.geometry(params)[si])
        ts = sorted(judge.rt.timer(call, judge.rt.sync) for _ in range(7))
        modes.append((call.mode, ts[3]))
    print("modes and median event times:", modes)
    assert modes[0][0] == "graph" and modes[0][1] < GRAPH_BELOW_S, modes
    assert modes[1][0] == "direct" and modes[1][1] > GRAPH_BELOW_S, modes
