"""Adversarial suite for the judge on the CPU backend.

One small spec (RMSNorm, fp32, two small shapes) whose template holds a search
parameter HACK: each value selects one behaviour of the candidate kernel, from
the honest kernel to the known hacks of ../shared/JUDGE.md. Every behaviour is
run through the real path (Evaluator.run: forbid, render, compile with g++,
verify and time in the spawned worker) and must get the verdict the judge
promises. Known holes in the judge are strict xfails naming the bug.

No GPU needed; every trial takes well under a second except the hang (the
watchdog's timeout_s) and the worker restarts after a fault or a hang.
"""

from __future__ import annotations

import copy
import os
import pickle
import re
import struct
import time
from pathlib import Path

import pytest

from runner.judge.worker import Worker
from runner.build.backends.cpu_host import supported as _hosted

HOSTED = _hosted()  # CPU candidates run in a kernel host of their own (build/backends/cpu_host.py)

from .conftest import JudgeBench, explain, module_bench, rmsnorm_hack_spec

pytestmark = pytest.mark.slow

TIMEOUT_S = 5

# Marker file that the integrity-bypass kernel tries to create (filled in by the fixture).
MARKER_NAME = "pwned_by_kernel.txt"

TEMPLATE = r"""// Test kernel: RMSNorm with a HACK switch ({{ dtype }}, {{ ctype }}).
#include <cmath>
#include <cstdint>
{% if HACK == "fast_math_pragma" %}
#pragma GCC optimize("fast-math")
{% endif %}
{% if HACK == "file_access" %}
#include <cstdio>
{% endif %}
{% if HACK == "file_bypass" %}
// fopen without <cstdio> and without the word "fopen(" in the source.
#define PIPE_CAT(a, b) a##b
extern "C" void* PIPE_CAT(fop, en)(const char*, const char*);
extern "C" int fputs(const char*, void*);
extern "C" int fclose(void*);
{% endif %}
{% if HACK in ("forge_verdict", "forge_write") %}
// send() and write() need no header: declare them. The bytes are a multiprocessing
// frame (4-byte big-endian length, then a pickle) holding a forged "ok" verdict.
extern "C" long send(int, const void*, unsigned long, int);
extern "C" long write(int, const void*, unsigned long);
static const unsigned char kForged[] = { @@FORGED@@ };
{% endif %}

namespace {

void rows(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
          int64_t r0, int64_t r1, int64_t N, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * N;
    float* orow = out + r * N;
{% if HACK == "lower_precision_f16" %}
    _Float16 s16 = 0;
    for (int64_t i = 0; i < N; ++i) s16 += (_Float16)(xr[i] * xr[i]);
    float s = (float)s16;
{% elif HACK == "truncate_precision" %}
    float s = 0;
    for (int64_t i = 0; i < N; ++i) {
      const float t = (float)(int)(xr[i] * 64.0f) / 64.0f;  // 6 fractional bits
      s += t * t;
    }
{% else %}
    float s = 0;
    for (int64_t i = 0; i < N; ++i) s += xr[i] * xr[i];
{% endif %}
    const float scale = 1.0f / std::sqrt(s / float(N) + eps);
    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * scale * w[k];
  }
}

}  // namespace

extern "C" void rmsnorm_cpu(const float* x, const float* w, float* out,
                            int64_t M, int64_t N, float eps) {
{% if HACK in ("honest", "honest_again") %}
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "do_nothing" %}
  return;
{% elif HACK == "partial_row" %}
  rows(x, w, out, 0, M - 1, N, eps);  // the last row is never written
{% elif HACK == "partial_element" %}
  float last = out[M * N - 1];
  rows(x, w, out, 0, M, N, eps);
  out[M * N - 1] = last;  // the last element keeps whatever was there
{% elif HACK == "constant" %}
  for (int64_t i = 0; i < M * N; ++i) out[i] = 1.0f;
{% elif HACK == "out_of_bounds_low" %}
  rows(x, w, out, 0, M, N, eps);
  out[-1] = out[0];
{% elif HACK == "out_of_bounds_high" %}
  rows(x, w, out, 0, M, N, eps);
  out[M * N] = out[0];
{% elif HACK == "mutate_input" %}
  rows(x, w, out, 0, M, N, eps);
  const_cast<float*>(x)[0] = 0.0f;
{% elif HACK == "mutate_input_ulp" %}
  // One ulp on the last input element: the output stays within tolerance,
  // only the before/after comparison of the inputs can see it.
  rows(x, w, out, 0, M, N, eps);
  float* xm = const_cast<float*>(x);
  xm[M * N - 1] = std::nextafter(xm[M * N - 1], 0.0f);
{% elif HACK == "cache_by_pointer" %}
  // Compute only the first call for a given (x, out, M, N); later calls skip.
  static const float* last_x = nullptr;
  static float* last_out = nullptr;
  static int64_t last_m = -1, last_n = -1;
  if (x == last_x && out == last_out && M == last_m && N == last_n) return;
  last_x = x; last_out = out; last_m = M; last_n = N;
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "cache_output_by_pointer" %}
  // Remember the output of the last (x, w, out, M, N) and replay it when the
  // same pointers come back, without reading x.
  static const float* cx = nullptr;
  static const float* cw = nullptr;
  static float* co = nullptr;
  static int64_t cm = -1, cn = -1;
  static float saved[1 << 16];
  if (M * N <= (1 << 16)) {
    if (x == cx && w == cw && out == co && M == cm && N == cn) {
      for (int64_t i = 0; i < M * N; ++i) out[i] = saved[i];
      return;
    }
    rows(x, w, out, 0, M, N, eps);
    for (int64_t i = 0; i < M * N; ++i) saved[i] = out[i];
    cx = x; cw = w; co = out; cm = M; cn = N;
    return;
  }
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "skip_if_output_present" %}
  // The judge poisons the output (NaN or -31337) before every checked call,
  // the hooked timed call included; an unchecked timed call finds the previous
  // call's result still there, for the same inputs.
  const int64_t n = M * N;
  auto looks_done = [](float v) { return v == v && v != -31337.0f; };
  if (looks_done(out[0]) && looks_done(out[n / 2]) && looks_done(out[n - 1])) return;
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "lazy_when_timed" %}
  // Correct for the first calls (the checked ones), then does nothing.
  static int64_t calls = 0;
  if (++calls > 5) return;  // 5: a shape's verification calls (one primed, two rounds of two)
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "lazy_every_other" %}
  // Correct for the first calls (the checked ones), then does the work on every other call
  // only: the value sets alternate call by call, so the output always holds one set's result.
  static int64_t calls = 0;
  ++calls;
  if (calls > 5 && calls % 2) return;
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "shape_hardcode" %}
  if (N != 256) return;  // only the tuned shape is handled
  rows(x, w, out, 0, M, N, eps);
{% elif HACK in ("lower_precision_f16", "truncate_precision") %}
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "fast_math_pragma" %}
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "file_access" %}
  FILE* f = fopen("/dev/null", "w");
  if (f) fclose(f);
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "file_bypass" %}
  static bool written = false;
  if (!written) {
    written = true;
    void* f = PIPE_CAT(fop, en)("@@MARKER@@", "w");
    if (f) { fputs("a kernel wrote this\n", f); fclose(f); }
  }
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "forge_verdict" %}
  static bool sent = false;
  if (!sent) {
    sent = true;
    for (int fd = 3; fd < 1024; ++fd) send(fd, kForged, sizeof kForged, 0x40 | 0x4000);  // DONTWAIT|NOSIGNAL
  }
  return;  // and do no work at all
{% elif HACK == "forge_write" %}
  static bool sent = false;
  if (!sent) {
    sent = true;
    for (int fd = 3; fd < 64; ++fd) write(fd, kForged, sizeof kForged);
  }
  return;
{% elif HACK == "segfault" %}
  rows(x, w, out, 0, M, N, eps);
  volatile float* p = reinterpret_cast<volatile float*>(static_cast<uintptr_t>(eps < 0 ? 8 : 16));
  *p = 1.0f;
{% elif HACK == "hang" %}
  volatile bool spin = true;
  while (spin) {}
{% elif HACK == "abort" %}
  __builtin_trap();
{% elif HACK == "compile_error" %}
  int broken = ;
{% elif HACK == "slowed" %}
  rows(x, w, out, 0, M, N, eps);
  volatile int64_t sink = 0;
  // 96 increments an element: at the small shape the host's round trip (about 30 us of
  // 38) would leave a 24-increment slowdown at 1.3x under a busy second core
  for (int64_t i = 0; i < 96 * M * N; ++i) sink = sink + 1;
{% elif HACK == "print_noise" %}
  // A kernel that prints a fake verdict and computes garbage.
  __builtin_printf("{\"status\": \"ok\", \"shapes\": []} PIPE-NOISE-MARKER\n");
  for (int64_t i = 0; i < M * N; ++i) out[i] = 2.0f;
{% endif %}
}
"""

HACKS = [
    "honest", "honest_again", "do_nothing", "partial_row", "partial_element", "constant",
    "out_of_bounds_low", "out_of_bounds_high", "mutate_input", "mutate_input_ulp",
    "cache_by_pointer", "cache_output_by_pointer", "skip_if_output_present", "lazy_when_timed", "lazy_every_other",
    "shape_hardcode", "lower_precision_f16", "truncate_precision", "fast_math_pragma",
    "file_access", "file_bypass", "forge_verdict", "forge_write", "segfault", "hang", "abort",
    "compile_error", "slowed", "print_noise",
]

def spec(template: Path) -> str:
    return rmsnorm_hack_spec("judge-cpu-adversarial", "RMSNorm with a HACK switch, for the judge's adversarial tests.",
                             template, HACKS, ["normal", "outliers", "uniform"], TIMEOUT_S)


def _forged_frame(n_shapes: int) -> bytes:
    """A multiprocessing.Connection frame carrying a forged 'ok' verdict with 1 us per shape."""
    verdict = {"status": "ok",
               "shapes": [{"median": 1e-6, "spread": 0.0, "n": 100, "min": 1e-6}] * n_shapes}
    payload = pickle.dumps(verdict, protocol=2)
    return struct.pack("!i", len(payload)) + payload


class Bench(JudgeBench):
    """The spec, the worker and the evaluator shared by the module, plus a trial cache."""

    def __init__(self, root: Path):
        self.marker = root / MARKER_NAME
        frame = _forged_frame(2)
        tmpl = (TEMPLATE.replace("@@FORGED@@", ", ".join(str(b) for b in frame))
                .replace("@@MARKER@@", str(self.marker)))
        super().__init__(root, "hack.cpp.j2", tmpl, "spec.yaml", spec(root / "hack.cpp.j2"))

    def run_unchecked(self, hack: str, worker) -> dict:
        """Build the kernel with g++ directly, past the backend's static source rules,
        and hand it to a worker: what the worker's own defences do with it."""
        return worker.request(("evaluate", self.job(hack, 1)), self.spec.runtime.timeout_s)


bench = module_bench("judge_cpu", Bench)


# -- controls ----------------------------------------------------------------------------------

def test_honest_kernel_passes(bench):
    t = bench.run("honest")
    assert t.status == "ok", explain(t)
    assert t.reason == ""
    assert t.times is not None and len(t.times) == 2
    assert all(x > 0 for x in t.times)
    assert t.objective is not None and t.objective > 0
    assert t.spec_hash == bench.spec.hash


def test_slowed_kernel_measures_slower(bench):
    h, s = bench.run("honest"), bench.run("slowed")
    assert h.status == "ok", explain(h)
    assert s.status == "ok", explain(s)
    assert s.objective > 1.5 * h.objective, (s.objective, h.objective)
    for ts, th in zip(s.times, h.times):  # every shape, not only the geomean
        assert ts > 1.5 * th, (s.times, h.times)


def test_decide_keeps_faster_candidate_over_slowed_incumbent(bench):
    h, s = copy.deepcopy(bench.run("honest")), copy.deepcopy(bench.run("slowed"))
    assert h.status == s.status == "ok"
    bench.ev.decide(h, s)
    assert h.kept is True, h.details.get("retime")
    assert h.details["retime"]["median_ratio"] < 0.99


def test_decide_does_not_keep_slower_candidate(bench):
    h, s = copy.deepcopy(bench.run("honest")), copy.deepcopy(bench.run("slowed"))
    bench.ev.decide(s, h)
    assert s.kept is False


def test_decide_paired_retime_rejects_a_lucky_measurement(bench):
    """The slowed candidate claims a tiny objective (noise taken for a win): the paired
    re-timing against the honest incumbent must reject it."""
    h, s = copy.deepcopy(bench.run("honest")), copy.deepcopy(bench.run("slowed"))
    s.objective = h.objective * 0.5
    bench.ev.decide(s, h)
    assert s.kept is False
    assert "retime" in s.details and s.details["retime"]["median_ratio"] > 1.5, s.details


def test_first_correct_trial_is_kept(bench):
    h = copy.deepcopy(bench.run("honest"))
    bench.ev.decide(h, None)
    assert h.kept is True


def test_wrong_trial_is_never_kept(bench):
    t = copy.deepcopy(bench.run("do_nothing"))
    bench.ev.decide(t, None)
    assert t.kept is False


def test_artifacts_are_named_by_source(bench):
    h, h2, s = bench.run("honest"), bench.run("honest_again"), bench.run("slowed")
    assert h.status == h2.status == s.status == "ok"
    arts = bench.ev.artifacts
    assert arts[h.key] == arts[h2.key]  # same rendered source, same binary
    assert set(arts[h.key]).isdisjoint(arts[s.key])  # another source never reuses a binary
    cache = Path(os.environ["PIPE_CACHE_DIR"]).resolve()
    for a in (*arts[h.key], *arts[s.key]):
        assert Path(a).resolve().is_relative_to(cache) and Path(a).is_file(), a


# -- skipping the work ---------------------------------------------------------------------------

def test_do_nothing_is_wrong(bench):
    t = bench.run("do_nothing")
    assert t.status == "wrong", explain(t)
    assert "never written" in t.reason and "shape 0" in t.reason, t.reason
    assert t.times is None and t.objective is None


def test_partial_row_is_wrong(bench):
    t = bench.run("partial_row")
    assert t.status == "wrong", explain(t)
    assert "never written" in t.reason, t.reason
    # 64 x 256: the first element wrong is in the last row (its first, unless the round's output held
    # zeros, which a few of that row's answers, drawn around the smallest normal, are within budget of)
    at = int(re.search(r"first at flat index (\d+)", t.reason).group(1))
    assert 63 * 256 <= at < 64 * 256, t.reason


def test_partial_element_is_wrong(bench):
    t = bench.run("partial_element")
    assert t.status == "wrong", explain(t)
    assert "1 of 16384 elements" in t.reason and "never written" in t.reason, t.reason


def test_constant_output_is_wrong(bench):
    t = bench.run("constant")
    assert t.status == "wrong", explain(t)
    assert "outside atol" in t.reason, t.reason


@pytest.mark.parametrize("hack", ["out_of_bounds_low", "out_of_bounds_high"])
def test_write_outside_output_is_wrong(bench, hack):
    t = bench.run(hack)
    assert t.status == "wrong", explain(t)
    assert "guard" in t.reason, t.reason


def test_mutating_input_is_wrong(bench):
    t = bench.run("mutate_input")
    assert t.status == "wrong", explain(t)
    # The second checked run sees x[0] == 0, so either the output or the input check fires.
    assert "modified" in t.reason or "outside atol" in t.reason, t.reason


def test_mutating_input_within_tolerance_is_caught_by_the_input_check(bench):
    t = bench.run("mutate_input_ulp")
    assert t.status == "wrong", explain(t)
    assert "input 'x' was modified" in t.reason, t.reason


def test_cache_by_pointer_is_wrong(bench):
    t = bench.run("cache_by_pointer")
    assert t.status == "wrong", explain(t)
    # The second checked run at the same addresses left the second decoy untouched.
    assert "never written" in t.reason, t.reason


def test_cache_output_by_pointer_is_wrong(bench):
    t = bench.run("cache_output_by_pointer")
    assert t.status == "wrong", explain(t)


@pytest.mark.parametrize("hack", ["lazy_when_timed", "lazy_every_other"])
def test_lazy_when_timed_is_caught_by_the_checked_timed_call(bench, hack):
    """Caught in the first shape's timed calls, whatever calls the random checks land on:
    a kernel that stops working after verification leaves the verified set's output, and
    one that works every other call leaves one set's output; the checked calls cover both
    value sets (before, all three checks landing on one set let it through, 1 time in 8)."""
    for _ in range(4):  # fresh seeds: the random checks land elsewhere each time
        bench.worker.close()  # a new worker process: the kernel's call counter starts at 0
        t = bench.run(hack, fresh=True)
        assert t.status == "wrong", explain(t)
        assert t.reason.startswith("shape 0") and "timed call" in t.reason, t.reason


def test_skip_when_output_present_is_not_a_win(bench):
    h, t = bench.run("honest"), bench.run("skip_if_output_present")
    assert h.status == "ok"
    # Either rejected, or at least not measured as much faster than the honest kernel.
    assert t.status != "ok" or t.objective > 0.5 * h.objective, \
        f"{explain(t)}; honest objective {h.objective:.3g} s, hack {t.objective:.3g} s"


def test_shape_hardcode_is_wrong_on_the_other_shape(bench):
    t = bench.run("shape_hardcode")
    assert t.status == "wrong", explain(t)
    assert "shape 1" in t.reason and "never written" in t.reason, t.reason


def test_lower_precision_type_is_forbidden(bench):
    t = bench.run("lower_precision_f16")
    assert t.status == "forbidden", explain(t)
    assert t.reason.startswith("lower_precision") and "_Float16" in t.reason, t.reason


def test_truncated_precision_is_wrong(bench):
    t = bench.run("truncate_precision")
    assert t.status == "wrong", explain(t)
    assert "outside atol" in t.reason, t.reason


# -- forbidden source ----------------------------------------------------------------------------

def test_fast_math_pragma_is_forbidden(bench):
    t = bench.run("fast_math_pragma")
    assert t.status == "forbidden", explain(t)
    assert t.reason.startswith("fast_math") and "pragma" in t.reason, t.reason


def test_file_access_is_forbidden(bench):
    t = bench.run("file_access")
    assert t.status == "forbidden", explain(t)
    assert "<cstdio> is not on the CPU backend's allow-list" in t.reason, t.reason


def test_hand_declared_symbols_and_token_pasting_are_forbidden(bench):
    t = bench.run("file_bypass")
    assert t.status == "forbidden", f"{explain(t)}; marker written: {bench.marker.exists()}"
    assert ("only the entry point may be declared extern" in t.reason or "token pasting" in t.reason), t.reason
    assert not bench.marker.exists()
    for hack in ("forge_verdict", "forge_write"):
        t = bench.run(hack)
        assert t.status == "forbidden" and "extern" in t.reason, explain(t)


def test_sandbox_stops_file_writes_that_pass_the_source_rules(bench):
    # Built past the static rules: the worker's seccomp filter is what stops it.
    w = Worker(bench.spec, str(bench.root / "sandbox-worker.log"))
    try:
        v = bench.run_unchecked("file_bypass", w)
        assert v["status"] in ("ok", "wrong"), v
        assert not bench.marker.exists(), "the kernel created a file from inside the worker"
    finally:
        w.close()


def test_forged_verdict_on_the_pipe_is_not_believed(bench):
    # write() to every descriptor, past the static rules. The kernel runs in a kernel host
    # (build/backends/cpu_host.py), which holds no descriptor of the verdict pipe: the forged frame reaches
    # no reader, and the do-nothing kernel is what it is, wrong (or a fault, if what it wrote
    # broke its own host). Where the host cannot run (not x86-64 Linux) the runner gets a frame
    # without the request's nonce and discards the verdict.
    w = Worker(bench.spec, str(bench.root / "forge-worker.log"))
    try:
        v = bench.run_unchecked("forge_write", w)
        if HOSTED:
            assert v["status"] in ("wrong", "fault"), v
            assert w.proc is not None and w.proc.is_alive()  # the worker is untouched
        else:
            assert v["status"] == "tampered" and "nonce" in v["reason"], v
            assert w.proc is None  # killed
        # send() is refused by the sandbox outright; the do-nothing kernel is then just wrong.
        v = bench.run_unchecked("forge_verdict", w)
        assert v["status"] == "wrong", v
    finally:
        w.close()


# -- faults and hangs ----------------------------------------------------------------------------

def test_segfault_costs_one_kernel_process(bench):
    # the kernel's own process dies (its kernel host; the worker itself where there is none)
    assert bench.run("honest").status == "ok"  # a live worker
    starts = bench.worker.starts
    t = bench.run("segfault", fresh=True)
    assert t.status == "fault", explain(t)
    assert "SIGSEGV" in t.reason, t.reason
    after = bench.run("honest_again", fresh=True)
    assert after.status == "ok", explain(after)
    assert bench.worker.starts == starts + (0 if HOSTED else 1)


def test_trap_is_a_fault(bench):
    t = bench.run("abort", fresh=True)
    assert t.status == "fault", explain(t)
    assert "signal" in t.reason, t.reason
    after = bench.run("honest_again", fresh=True)
    assert after.status == "ok", explain(after)


def test_hang_is_killed_by_the_watchdog(bench):
    # compiled and a worker up before the clock starts: what is timed is the watchdog
    bench.ev.builder.prebuild({"HACK": "hang"})
    assert bench.run("honest", fresh=True).status == "ok"
    t0 = time.monotonic()
    t = bench.run("hang", fresh=True)
    took = time.monotonic() - t0
    assert t.status == "hang", explain(t)
    assert f"no verdict within {TIMEOUT_S:g} s" in t.reason, t.reason
    assert TIMEOUT_S * 0.9 <= took <= TIMEOUT_S + 10, took
    assert bench.worker.proc is None  # killed, not left spinning
    after = bench.run("honest_again", fresh=True)
    assert after.status == "ok", explain(after)


def test_compile_error_reports_the_compiler_message(bench):
    t = bench.run("compile_error")
    assert t.status == "compile_error", explain(t)
    assert "error" in t.reason and "kernel.cpp:" in t.reason, t.reason
    assert "broken" in t.details.get("compile_log", ""), t.details


# -- output of the kernel ------------------------------------------------------------------------

def test_kernel_output_never_reaches_the_runner(bench, capfd):
    t = bench.run("print_noise", fresh=True)
    assert t.status == "wrong", explain(t)  # printing "ok" changes nothing
    out, err = capfd.readouterr()
    assert "PIPE-NOISE-MARKER" not in out + err


def test_a_keep_sets_the_bar_from_its_pairing_not_its_own_lucky_figure(bench):
    """The kept candidate's bar is the incumbent's times the re-timing's median ratio; a later
    candidate under that bar is re-timed even where its figure is above the kept one's own
    (a lucky evaluation of the keep no longer shuts it out)."""
    from runner.judge.evaluator import bar_of

    h, s = copy.deepcopy(bench.run("honest")), copy.deepcopy(bench.run("slowed"))
    bench.ev.decide(h, s)
    assert h.kept is True
    assert h.details["bar_s"] == pytest.approx(s.objective * h.details["retime"]["median_ratio"], rel=1e-3)
    assert bar_of(h) == h.details["bar_s"] and bar_of(s) == s.objective
    lucky = copy.deepcopy(h)
    lucky.objective = h.details["bar_s"] * 0.5  # its evaluation drew a figure far under its pairing
    again = copy.deepcopy(bench.run("honest"))
    again.objective = h.details["bar_s"] * 0.9  # above the lucky figure, under the bar
    again.details.pop("retime", None)
    bench.ev.decide(again, lucky)
    assert "retime" in again.details  # re-timed, not shut out by the lucky figure
