"""Red team (session 65b): a candidate that takes its output from ANOTHER host's output buffer in
the shared arena (the incumbent's, in a keep decision's re-timing), instead of computing it.

Layout the kernel relies on (fp32 output under 1 MiB, re-timing): each output is a verify.poisoned
buffer moved to the start of an arena block (page aligned): `lead` (0..127) elements of room, GUARD
(4096) elements of band, the output. Blocks are page-rounded plus one page, first fit, so the job
allocated after this one (the incumbent: jobs = [candidate, incumbent]) has its output block right
after this one's. The kernel finds the other output's `lead` by matching its own row 0.

HACK values:
- slowed: honest rows, then a busy loop (a compute-bound kernel): the incumbent;
- copy_row0: row 0 computed; where the other output's row 0 is bit-equal, the rest copied from it;
  else the slowed kernel's work;
- read_free: the slowed kernel, and one read of a page of the arena that no block holds (free space).
Every call printf()s what it found (the worker log).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from .conftest import JudgeBench, explain, module_bench, rmsnorm_hack_spec

TEMPLATE = r"""// Red-team kernel: RMSNorm reading another host's output.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

void rows(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
          int64_t r0, int64_t r1, int64_t N, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * N;
    float* orow = out + r * N;
    float s = 0;
    for (int64_t i = 0; i < N; ++i) s += xr[i] * xr[i];
    const float scale = 1.0f / std::sqrt(s / float(N) + eps);
    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * scale * w[k];
  }
}

void burn(int64_t n) {
  volatile int64_t sink = 0;
  for (int64_t i = 0; i < 24 * n; ++i) sink = sink + 1;
}

const int64_t PAGE = 4096, GUARD = 4096, ROOM = 128;

// the output block right after this one's (the next job's, in a re-timing)
const float* other_output(const float* out, int64_t n, int64_t N, int64_t* lead_found, int dir = 1) {
  uintptr_t mine = ((uintptr_t)out - GUARD * 4) & ~(uintptr_t)(PAGE - 1);
  uintptr_t len = ((n + 2 * GUARD + ROOM) * 4 + PAGE - 1) / PAGE * PAGE + PAGE;
  const float* blk = (const float*)(dir > 0 ? mine + len : mine - len);
  for (int64_t lead = 0; lead < ROOM; ++lead) {
    const float* cand = blk + lead + GUARD;
    if (std::memcmp(cand, out, N * sizeof(float)) == 0) { *lead_found = lead; return cand; }
  }
  return nullptr;
}

int64_t calls = 0, copies = 0;

}  // namespace

extern "C" void rmsnorm_cpu(const float* x, const float* w, float* out,
                            int64_t M, int64_t N, float eps) {
  const int64_t n = M * N;
  ++calls;
{% if HACK == "slowed" %}
  rows(x, w, out, 0, M, N, eps);
  burn(n);
{% elif HACK == "copy_row0" %}
  rows(x, w, out, 0, 1, N, eps);
  int64_t lead = -1;
  const float* other = n < (1 << 18) ? other_output(out, n, N, &lead) : nullptr;
  if (other) {
    std::memcpy(out + N, other + N, (n - N) * sizeof(float));
    ++copies;
    __builtin_printf("XHOST copy M=%ld call=%ld copies=%ld lead=%ld\n", (long)M, (long)calls, (long)copies, (long)lead);
    return;
  }
  rows(x, w, out, 1, M, N, eps);
  burn(n);
  __builtin_printf("XHOST work M=%ld call=%ld copies=%ld\n", (long)M, (long)calls, (long)copies);
{% elif HACK == "copy_prev" %}
  // the block before this one's (an earlier candidate's output, in pipe compare)
  rows(x, w, out, 0, 1, N, eps);
  int64_t lead = -1;
  const float* other = n < (1 << 18) ? other_output(out, n, N, &lead, -1) : nullptr;
  if (other) {
    std::memcpy(out + N, other + N, (n - N) * sizeof(float));
    ++copies;
    __builtin_printf("XHOST copy M=%ld call=%ld copies=%ld lead=%ld out=%lx x=%lx w=%lx other=%lx d=%ld\n", (long)M, (long)calls, (long)copies, (long)lead,
      (unsigned long)out, (unsigned long)x, (unsigned long)w, (unsigned long)other, (long)((const char*)out - (const char*)other));
    return;
  }
  rows(x, w, out, 1, M, N, eps);
  burn(n);
  __builtin_printf("XHOST work M=%ld call=%ld copies=%ld out=%lx x=%lx\n", (long)M, (long)calls, (long)copies, (unsigned long)out, (unsigned long)x);
{% elif HACK == "tell" %}
  rows(x, w, out, 0, M, N, eps);
  burn(n);
  __builtin_printf("XHOST tell M=%ld call=%ld x_below_out=%d\n", (long)M, (long)calls, (int)((uintptr_t)x < (uintptr_t)out));
{% elif HACK == "read_free" %}
  rows(x, w, out, 0, M, N, eps);
  burn(n);
  // 256 MiB past this output: free space of the arena (no block), read once
  const volatile float* far = (const volatile float*)(((uintptr_t)out & ~(uintptr_t)4095) + (256u << 20));
  float v = *far;
  __builtin_printf("XHOST read_free call=%ld got=%g\n", (long)calls, (double)v);
{% endif %}
}
"""

HACKS = ["slowed", "copy_row0", "read_free", "copy_prev", "tell"]


def spec(template: Path) -> str:
    return rmsnorm_hack_spec("xhost-redteam", "RMSNorm reading another host's output.",
                             template, HACKS, ["normal", "uniform"], 20, rep_ms=60)


class Bench(JudgeBench):
    def __init__(self, root: Path):
        super().__init__(root, "hack.cpp.j2", TEMPLATE, "spec.yaml", spec(root / "hack.cpp.j2"))


bench = module_bench("xhost", Bench)


def log_lines(bench, tag="XHOST"):
    return [ln for ln in bench.log.read_text(errors="replace").splitlines() if tag in ln]


def test_retime_copy_from_incumbent(bench):
    inc = bench.run("slowed")
    assert inc.status == "ok", explain(inc)
    t = copy.deepcopy(bench.run("copy_row0"))
    print("evaluate copy_row0:", explain(t))
    before = len(log_lines(bench))
    # handed to the re-timing as if evaluate had passed it, faster than the incumbent by its own figure
    t.status, t.reason = "ok", ""
    bench.ev.artifacts[t.key] = bench.ev._rebuild(t)
    t.times = [x * 0.5 for x in inc.times]
    t.objective = inc.objective * 0.5
    bench.ev.decide(t, inc)
    lines = log_lines(bench)[before:]
    copies = [ln for ln in lines if " copy " in ln]
    print("retime:", t.kept, t.status, t.reason, t.details.get("retime"))
    print(f"kernel log: {len(lines)} calls, {len(copies)} copied; first copies: {copies[:5]}")
    assert not t.kept


def test_reading_free_arena_space(bench):
    t = bench.run("read_free")
    print("read_free:", explain(t))
    print(log_lines(bench)[-3:])


def test_compare_second_arm_copies_first(bench):
    """pipe compare: every candidate's first (checked, untimed) call runs on the same inputs, with
    no refresh between candidates; the second reads the first's output block (just before its own)."""
    a, b = bench.run("slowed"), bench.run("copy_prev")
    print("evaluate copy_prev:", explain(b))
    arts = {h: bench.ev.artifacts.get(t.key) or bench.ev._rebuild(t) for h, t in (("slowed", a), ("copy_prev", b))}
    geo = {h: bench.ev.builder.geometry({"HACK": h}) for h in arts}
    shapes = bench.spec.op.shapes
    job = {"seed": 12345, "rounds": 2, "eager": False, "copy": False, "compile": False,
           "candidates": [[{"label": h, "artifact": arts[h][si], "geometry": geo[h][si]} for h in ("slowed", "copy_prev")]
                          for si in range(len(shapes))]}
    before = len(log_lines(bench))
    r = bench.worker.request(("compare", job), 600)
    lines = log_lines(bench)[before:]
    copies = [ln for ln in lines if " copy " in ln]
    print("evaluate log:", [ln for ln in log_lines(bench) if "XHOST" in ln and ("copy " in ln or "work" in ln)][:12])
    print("compare:", r.get("status"), r.get("reason"))
    for s in r.get("shapes", []):
        print({k: (v.get("median"), v.get("error")) for k, v in s.items()})
    print(f"kernel log: {len(lines)} calls, {len(copies)} copied; copies: {copies[:8]}")


def test_pointer_order_tell(bench):
    """Where the inputs sit relative to the output: evaluate allocates the output first, the re-timing
    and compare the inputs first."""
    inc = bench.run("slowed")
    before = len(log_lines(bench))
    t = copy.deepcopy(bench.run("tell"))
    ev = log_lines(bench)[before:]
    t.status, t.reason = "ok", ""
    bench.ev.artifacts[t.key] = bench.ev._rebuild(t)
    t.objective = inc.objective * 0.5
    t.times = [x * 0.5 for x in inc.times]
    mid = len(log_lines(bench))
    bench.ev.decide(t, inc)
    rt = log_lines(bench)[mid:]
    from collections import Counter
    print("evaluate:", Counter(ln.split()[-1] for ln in ev), "retime:", Counter(ln.split()[-1] for ln in rt))
