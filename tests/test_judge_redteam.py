"""Red team (issue 18, last part): cheats written against the judge by someone who read
docs/judge.md and the judge's code, beyond the five classes already handled.

One RMSNorm spec (fp32, CPU backend) whose template holds a HACK switch. Each cheat is
honest whenever the output holds something it did not write (the judge's decoy before every
verification call, and in the fresh buffers of a re-timing or a comparison), so
verification never sees it; what it does in the timed calls is the cheat:

- rare_lazy_counter: skips the work on one timed call in 16 (a call counter in a
  static); before the per-call samples it passed about 2 times in 3 (each shape's 3
  or 4 checked calls all missed a lazy one);
- rare_lazy_clock: the same, keyed on the steady clock (about one call in 16);
- fingerprint_cache: remembers the outputs of the last two inputs, keyed on 8 sampled
  input elements, and copies the remembered output when the fingerprint matches: the
  timed calls alternate two value sets, so every timed call hit, and the answers were
  right; it passed every time, faster than computing;
- the fingerprint cache again, in the re-timing that decides a keep: until session 28 a
  kernel could be honest in `evaluate` and cache only there, telling the re-timing apart by
  the guard poison its fresh buffers held; they now hold a decoy
  (test_judge_protocol.py's sentinel test), so the test hands the re-timing a cache that
  evaluate caught, as if it had not;
- deferred_thread: hands the work to a std::thread and returns, joining it at the
  next call (work left for later; the CPU backend times by wall clock);
- pool_thread: a thread kept between calls does the rows, and the call returns with the
  last row left to it (done before any sample could look).

joined_threads is honest: threads started and joined inside the call.

The defences: every timed call's output is sampled at secret positions right after it
returns (outside the timed region) and checked against its value set's reference; the
last timed call of every timed loop (evaluate, re-timing, compare) gets inputs with a
few elements replaced at secret positions, so no remembered output is
right for it; after every call of the kernel its process counts its own threads at once and
reports the count on a socket only the judge reads, and the judge lists them too: one of the
kernel's still alive (not exiting) is work outside the call (judge/threads.py).
See docs/judge.md.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from .conftest import JudgeBench, explain, module_bench, rmsnorm_hack_spec

pytestmark = pytest.mark.slow

TEMPLATE = r"""// Red-team kernel: RMSNorm with a HACK switch.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <thread>
{% if HACK == "rare_lazy_clock" %}#include <immintrin.h>{% endif %}

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

// Did the output keep what this kernel last wrote there? (verification puts a decoy
// there first, and so do the fresh buffers of a re-timing: then it must work)
float last_written = 0.0f;
bool own_output(const float* out) { return out[0] == last_written; }

struct Entry { float key[8]; int64_t n; float* data; };
Entry cache[2];
int next_slot = 0;

void fingerprint(const float* x, int64_t n, float* key) {
  for (int i = 0; i < 8; ++i) key[i] = x[(n - 1) * i / 7];
}

bool replay(const float* x, float* out, int64_t n) {
  float key[8];
  fingerprint(x, n, key);
  for (auto& e : cache)
    if (e.data && e.n == n && std::memcmp(e.key, key, sizeof key) == 0) {
      std::memcpy(out, e.data, n * sizeof(float));
      return true;
    }
  return false;
}

void remember(const float* x, const float* out, int64_t n) {
  Entry& e = cache[next_slot];
  next_slot ^= 1;
  if (e.n != n) { delete[] e.data; e.data = new float[n]; e.n = n; }
  fingerprint(x, n, e.key);
  std::memcpy(e.data, out, n * sizeof(float));
}

std::thread pending;

// pool_thread: one thread kept from call to call, spinning for work
struct Job { const float* x; const float* w; float* out; int64_t M, N; float eps; };
Job job;
std::atomic<int64_t> posted{0}, served{0}, progress{0};
std::thread* helper = nullptr;

void serve() {
  int64_t seen = 0;
  for (;;) {
    int64_t p;
    while ((p = posted.load(std::memory_order_acquire)) == seen) {}
    seen = p;
    for (int64_t r = 0; r < job.M; ++r) {
      rows(job.x, job.w, job.out, r, r + 1, job.N, job.eps);
      if (r == 0) last_written = job.out[0];
      progress.store(r + 1, std::memory_order_release);
    }
    served.store(seen, std::memory_order_release);
  }
}

}  // namespace

extern "C" void rmsnorm_cpu(const float* x, const float* w, float* out,
                            int64_t M, int64_t N, float eps) {
  const int64_t n = M * N;
{% if HACK == "honest" %}
  rows(x, w, out, 0, M, N, eps);
{% elif HACK == "rare_lazy_counter" %}
  static int64_t calls = 0;
  if (own_output(out) && ++calls % 16 == 0) return;  // one timed call in 16: nothing
  rows(x, w, out, 0, M, N, eps);
  last_written = out[0];
{% elif HACK == "rare_lazy_clock" %}
  // the time-stamp counter, read inline (a clock the library imports, such as steady_clock,
  // is refused at build since session 30: only math, memory and thread symbols)
  const int64_t now = (int64_t)__rdtsc();
  if (own_output(out) && (now >> 11) % 16 == 0) return;  // about one timed call in 16
  rows(x, w, out, 0, M, N, eps);
  last_written = out[0];
{% elif HACK == "fingerprint_cache" %}
  if (!(own_output(out) && replay(x, out, n))) {
    rows(x, w, out, 0, M, N, eps);
    remember(x, out, n);
  }
  last_written = out[0];
{% elif HACK == "deferred_thread" %}
  if (pending.joinable()) pending.join();  // the previous call's work ends now
  if (!own_output(out)) {
    rows(x, w, out, 0, M, N, eps);
    last_written = out[0];
    return;
  }
  pending = std::thread([=] { rows(x, w, out, 0, M, N, eps); last_written = out[0]; });
{% elif HACK == "pool_thread" %}
  while (served.load(std::memory_order_acquire) != posted.load(std::memory_order_relaxed)) {}  // the last call's work ends
  if (!own_output(out)) {
    rows(x, w, out, 0, M, N, eps);
    last_written = out[0];
    return;
  }
  if (!helper) helper = new std::thread(serve);  // kept, never joined
  job = Job{x, w, out, M, N, eps};
  progress.store(0, std::memory_order_relaxed);
  posted.fetch_add(1, std::memory_order_release);
  // return with the last row still to do: it is written well before any sample is taken
  while (progress.load(std::memory_order_acquire) < M - 1) {}
{% elif HACK == "joined_threads" %}
  std::thread team[3];  // honest: threads started and joined inside the call
  const int64_t chunk = (M + 3) / 4;
  for (int t = 1; t < 4; ++t) {
    const int64_t r0 = t * chunk < M ? t * chunk : M, r1 = r0 + chunk < M ? r0 + chunk : M;
    team[t - 1] = std::thread(rows, x, w, out, r0, r1, N, eps);
  }
  rows(x, w, out, 0, chunk < M ? chunk : M, N, eps);
  for (auto& th : team) th.join();
{% elif HACK == "slowed" %}
  rows(x, w, out, 0, M, N, eps);
  volatile int64_t sink = 0;
  for (int64_t i = 0; i < 24 * n; ++i) sink = sink + 1;
{% elif HACK == "whole_memo" or HACK == "whole_memo_off" %}
  // "slowed" (a compute-bound kernel), with a memo of the last two whole inputs: a call on an
  // input it has seen copies the answer and skips the work (session 35's red team kept such
  // memos in memory no scrub reaches; a static stands in for it here)
  static float* keep_x[2] = {nullptr, nullptr};
  static float* keep_out[2] = {nullptr, nullptr};
  static int64_t keep_n[2] = {0, 0};
  static int slot = 0;
  for (int k = 0; k < {{ 2 if HACK == "whole_memo" else 0 }}; ++k)  // (_off: the same kernel, never looking)
    if (keep_n[k] == n && std::memcmp(keep_x[k], x, n * sizeof(float)) == 0) {
      std::memcpy(out, keep_out[k], n * sizeof(float));
      return;
    }
  rows(x, w, out, 0, M, N, eps);
  volatile int64_t sink = 0;
  for (int64_t i = 0; i < 24 * n; ++i) sink = sink + 1;
  if (keep_n[slot] != n) {
    delete[] keep_x[slot];
    delete[] keep_out[slot];
    keep_x[slot] = new float[n];
    keep_out[slot] = new float[n];
    keep_n[slot] = n;
  }
  std::memcpy(keep_x[slot], x, n * sizeof(float));
  std::memcpy(keep_out[slot], out, n * sizeof(float));
  slot ^= 1;
{% elif HACK == "row_stat_memo" or HACK == "row_stat_memo_off" %}
  // "slowed", with a memo of every row's statistic (its 1 / RMS) for the last two inputs, each
  // row keyed on a hash of its elements that no order of them changes: a call whose rows all
  // hold the same elements as a kept input's, in any order, reuses the statistics, computes
  // out = x * scale * w and skips the work (session 36's second red team: a fresh call's salt
  // then swapped two elements in every row, which keeps every such statistic, and the memo
  // answered every call right, the salted last one included)
  static uint64_t* keys[2] = {nullptr, nullptr};
  static float* scales[2] = {nullptr, nullptr};
  static int64_t kept_m[2] = {0, 0};
  static int slot = 0;
  uint64_t* key = new uint64_t[M];
  for (int64_t r = 0; r < M; ++r) {
    key[r] = 1;
    for (int64_t c = 0; c < N; ++c) {
      uint32_t b;
      std::memcpy(&b, x + r * N + c, sizeof b);
      uint64_t h = (uint64_t)b * 0x9E3779B97F4A7C15ull;
      key[r] += h ^ (h >> 29);
    }
  }
  for (int k = 0; k < {{ 2 if HACK == "row_stat_memo" else 0 }}; ++k) {  // (_off: the same kernel, never looking)
    if (kept_m[k] != M || std::memcmp(keys[k], key, M * sizeof(uint64_t)) != 0) continue;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < N; ++c) out[r * N + c] = x[r * N + c] * scales[k][r] * w[c];
    delete[] key;
    return;
  }
  rows(x, w, out, 0, M, N, eps);
  volatile int64_t sink = 0;
  for (int64_t i = 0; i < 24 * n; ++i) sink = sink + 1;
  if (kept_m[slot] != M) {
    delete[] keys[slot];
    delete[] scales[slot];
    keys[slot] = new uint64_t[M];
    scales[slot] = new float[M];
    kept_m[slot] = M;
  }
  for (int64_t r = 0; r < M; ++r) {
    float ss = 0;
    for (int64_t c = 0; c < N; ++c) ss += x[r * N + c] * x[r * N + c];
    scales[slot][r] = 1.0f / std::sqrt(ss / float(N) + eps);
  }
  std::memcpy(keys[slot], key, M * sizeof(uint64_t));
  delete[] key;
  slot ^= 1;
{% endif %}
}
"""

HACKS = ["honest", "rare_lazy_counter", "rare_lazy_clock", "fingerprint_cache",
         "deferred_thread", "pool_thread", "joined_threads", "slowed", "whole_memo", "whole_memo_off",
         "row_stat_memo", "row_stat_memo_off"]

def spec(template: Path) -> str:
    return rmsnorm_hack_spec("judge-redteam", "RMSNorm with a HACK switch, for the red-team tests.",
                             template, HACKS, ["normal", "uniform"], 20, rep_ms=60)


class Bench(JudgeBench):
    def __init__(self, root: Path):
        super().__init__(root, "hack.cpp.j2", TEMPLATE, "spec.yaml", spec(root / "hack.cpp.j2"))

    def run(self, hack: str, fresh_worker: bool = True):
        if fresh_worker:  # the kernel's statics start again
            self.worker.close()
        return super().run(hack, fresh=True)


bench = module_bench("redteam", Bench)


def test_a_memo_of_whole_inputs_speeds_up_no_call_that_counts(bench):
    """Right answers, remembered whole: the timed calls alternate two value sets, so a memo of
    the last two whole inputs hit on every timed call but the salted last one and ran the
    compute-bound kernel several times faster than it computes (session 35's red team, with
    the memo on libc's heap). On the CPU backend about half the timed calls now get inputs no
    call has seen, and the figure is theirs alone: the memo's time is the kernel's."""
    plain, memo = bench.run("whole_memo_off"), bench.run("whole_memo")
    assert plain.status == "ok" and memo.status == "ok", (explain(plain), explain(memo))
    # over the shapes (a geometric mean): one shape's median moves 2x on a busy 2-core machine;
    # on the judge before, the memo ran 15x and 7x faster than the same kernel without it
    ratio = math.prod(a / b for a, b in zip(memo.times, plain.times)) ** (1 / len(memo.times))
    assert ratio > 0.5, (memo.times, plain.times)


def test_a_memo_of_row_statistics_speeds_up_no_call_that_counts(bench):
    """Right answers from a memo of each row's statistic (RMSNorm's 1 / RMS), each row keyed on
    a hash that ignores the order of its elements. While a fresh call's new inputs were its
    set with two elements swapped in every row (session 36), every row statistic stayed what
    it was: the memo hit on every timed call, fresh and salted ones too, and gave the right
    answer (a second red team, on cross-entropy's logsumexp). A fresh call now takes a value
    from elsewhere into one element of every row, and the memo's time is the kernel's."""
    plain, memo = bench.run("row_stat_memo_off"), bench.run("row_stat_memo")
    assert plain.status == "ok" and memo.status == "ok", (explain(plain), explain(memo))
    ratio = math.prod(a / b for a, b in zip(memo.times, plain.times)) ** (1 / len(memo.times))
    assert ratio > 0.5, (memo.times, plain.times)


def test_honest_control_passes_with_many_timed_calls(bench):
    """The control, and what the rare cheats rely on: enough timed calls for a lazy one."""
    t = bench.run("honest")
    assert t.status == "ok", explain(t)
    assert all(n >= 32 for n in t.details["timed_calls"]), t.details["timed_calls"]


def test_lazy_on_a_few_timed_calls_is_caught(bench):
    """Lazy on about one timed call in 16 (a call counter): each shape's checked calls all missed
    the lazy ones about 2 times in 3; the per-call samples see every timed call."""
    for _ in range(3):
        t = bench.run("rare_lazy_counter")
        assert t.status == "wrong", explain(t)
        assert "timed call" in t.reason, t.reason


def test_a_kernel_that_reads_a_clock_faults(bench):
    """Lazy on the calls a clock picks (the time-stamp counter, read inline: a clock the library
    imports is refused at build): the per-call samples caught it as `wrong`; since session 38 the
    kernel host turns the counter off before it loads a library (a kernel slow in most rounds of a
    comparison and fast in one, keyed on the clock, was never cut), so it faults at once."""
    t = bench.run("rare_lazy_clock")
    assert t.status == "fault" and "SIGSEGV" in t.reason, explain(t)


def test_fingerprint_cache_is_caught(bench):
    """Right answers, remembered: only a call whose inputs match neither value set (the
    salted last call) shows it. Before the salt it passed every time."""
    for _ in range(2):
        t = bench.run("fingerprint_cache")
        assert t.status == "wrong", explain(t)
        assert "timed call" in t.reason, t.reason


def outside_the_call(t) -> bool:
    """The verdict on work done outside the timed call, whichever defence saw it first: the
    thread census (a kernel's thread alive after the call) or the per-call samples."""
    return t.status == "wrong" and ("work outside the timed call" in t.reason or "left for later" in t.reason)


def test_deferred_work_is_caught(bench):
    """Work handed to a thread that outlives the call. The per-call samples alone missed
    every timed call now and then (a thread on the second core done before the sample):
    the thread census after every call sees the thread alive. Run alone on an idle 2-core
    machine it passed the judge 4 times of 4 (session 44): the judge listed the kernel host's
    threads only once the host was asleep again, and the thread was done by then. The host
    now counts its own threads at once after the call returns (kernel_host._Census)."""
    for _ in range(3):
        t = bench.run("deferred_thread")
        assert outside_the_call(t), explain(t)


def test_kept_thread_finishing_after_return_is_caught(bench):
    """A thread kept from call to call does the rows; the call returns with the last row
    still to do, written long before any sample: the samples and the salted call see right
    answers (the judge before the census passed it every time). The census sees the thread."""
    for _ in range(3):
        t = bench.run("pool_thread")
        assert outside_the_call(t), explain(t)
        assert "still running after" in t.reason, t.reason


def test_threads_joined_inside_the_call_pass(bench):
    """The census's other side: a kernel that starts threads and joins them before it
    returns is honest, however soon after the join the judge looks."""
    for _ in range(3):
        t = bench.run("joined_threads")
        assert t.status == "ok", explain(t)


def test_a_cache_that_reaches_the_retiming_is_caught_there(bench):
    """The re-timing that decides a keep has its own salted last calls: a fingerprint cache
    that evaluate caught is handed to it as if evaluate had passed it, faster than a slowed
    incumbent, and the re-timing finds it wrong and does not keep it."""
    inc = bench.run("slowed")
    assert inc.status == "ok", explain(inc)
    t = copy.deepcopy(bench.run("fingerprint_cache", fresh_worker=False))
    assert t.status == "wrong", explain(t)  # evaluate's salted last call saw it
    t.status, t.reason = "ok", ""
    bench.ev.artifacts[t.key] = bench.ev._rebuild(t)  # kept for trials that pass, as it would be
    t.times = [x * 0.5 for x in inc.times]
    t.objective = inc.objective * 0.5
    bench.ev.decide(t, inc)
    assert t.kept is False and t.status == "wrong", (t.details.get("retime"), explain(t))
    assert "re-timing" in t.reason, t.reason
