"""Issue 18 on the CPU backend: the classes of attack an outside suite got through.

Each class has a cheating kernel that passed the judge before the fix (checked
by hand against the previous commit, see docs/judge.md) and must be rejected
now, next to an honest control that must pass:

- class 1, a tolerance bigger than the signal: a softmax whose outputs (about
  1/N) sit far below atol=1e-3 stores only every 4th row once its output holds
  something that is not the judge's poison;
- class 3, the judge's data within reach: a kernel that reads /proc/self/maps and
  scans the worker's memory for a float64 array that is the softmax of its input
  (the reference), and copies it;
- class 4, inputs that never stress the numerics: a LayerNorm computing the
  variance as E[x^2] - E[x]^2 in float passes normal inputs, not rows with a large
  common offset;
- class 5, unbounded output: a kernel printing megabytes per call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.judge import verify
from runner.judge.worker import LOG_CAP_BYTES, Worker

from .conftest import JudgeBench, explain, hack_spec, module_bench, row_op

pytestmark = pytest.mark.slow

SOFTMAX_TEMPLATE = r"""// Test kernel: fp32 row softmax with a HACK switch.
#include <cmath>
#include <cstdint>
{% if HACK == "steal_reference" %}
// Built past the static rules (the test compiles it with g++ directly).
extern "C" int open(const char*, int, ...);
extern "C" long read(int, void*, unsigned long);
extern "C" int close(int);
{% endif %}

namespace {

void rows(const float* x, float* y, int64_t r0, int64_t r1, int64_t step, int64_t N) {
  for (int64_t r = r0; r < r1; r += step) {
    const float* xr = x + r * N;
    float* yr = y + r * N;
    float m = -INFINITY;
    for (int64_t i = 0; i < N; ++i) m = xr[i] > m ? xr[i] : m;
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += std::exp((double)xr[i] - m);
    for (int64_t i = 0; i < N; ++i) yr[i] = (float)(std::exp((double)xr[i] - m) / s);
  }
}

{% if HACK == "steal_reference" %}
// Does p hold the float64 softmax of the rows of x? Checked on a few elements of the
// first and the last row: the ratios of a softmax row are exp(x[j] - x[0]).
bool is_answer(const double* p, const float* x, int64_t M, int64_t N) {
  for (int k = 0; k < 2; ++k) {
    const int64_t r = k ? M - 1 : 0;
    const double* pr = p + r * N;
    const float* xr = x + r * N;
    if (!(pr[0] > 1e-30 && pr[0] <= 1.0)) return false;
    for (int64_t j = 1; j < 8 && j < N; ++j) {
      const double want = pr[0] * std::exp((double)xr[j] - (double)xr[0]);
      if (!(std::fabs(pr[j] - want) <= 1e-12 * want)) return false;
    }
  }
  return true;
}

struct Region { uintptr_t lo, hi; };

// The anonymous read-write mappings of this process (the heap, mmap'd tensors).
int regions(Region* out, int cap) {
  static char buf[1 << 20];
  int fd = open("/proc/self/maps", 0);
  if (fd < 0) return 0;
  long n = 0, k;
  while ((k = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += k;
  close(fd);
  buf[n] = 0;
  int count = 0;
  char* line = buf;
  while (*line && count < cap) {
    char* end = line;
    while (*end && *end != '\n') ++end;
    uintptr_t lo = 0, hi = 0;
    char* c = line;
    while (*c != '-') { lo = lo * 16 + (*c <= '9' ? *c - '0' : *c - 'a' + 10); ++c; }
    ++c;
    while (*c != ' ') { hi = hi * 16 + (*c <= '9' ? *c - '0' : *c - 'a' + 10); ++c; }
    ++c;
    const bool rw = c[0] == 'r' && c[1] == 'w';
    int field = 0;  // the path is the 6th field, 4 after the permissions
    char* f = c;
    while (f < end && field < 4) { while (f < end && *f != ' ') ++f; while (f < end && *f == ' ') ++f; ++field; }
    const bool anon = f >= end || *f == '[';
    const bool heapish = f >= end || (f[1] == 'h' && f[2] == 'e');
    if (rw && anon && heapish) out[count++] = {lo, hi};
    line = *end ? end + 1 : end;
  }
  return count;
}

const double* find_answer(const float* x, int64_t M, int64_t N) {
  static const double* seen[2] = {nullptr, nullptr};  // the two value sets of the timed calls
  for (const double* p : seen)
    if (p && is_answer(p, x, M, N)) return p;
  static Region rs[8192];
  const int n = regions(rs, 8192);
  const uintptr_t bytes = (uintptr_t)(M * N) * 8;
  for (int i = 0; i < n; ++i) {
    if (rs[i].hi - rs[i].lo < bytes) continue;
    for (uintptr_t a = rs[i].lo; a + bytes <= rs[i].hi; a += 8) {
      const double* p = reinterpret_cast<const double*>(a);
      if (is_answer(p, x, M, N)) {
        seen[1] = seen[0];
        seen[0] = p;
        return p;
      }
    }
  }
  return nullptr;
}
{% endif %}

}  // namespace

extern "C" void softmax_cpu(const float* x, float* y, int64_t M, int64_t N) {
{% if HACK == "honest" %}
  rows(x, y, 0, M, 1, N);
{% elif HACK == "skip_rows_when_filled" %}
  // Verification used to poison the output with NaN, then -31337; a timed call finds
  // another call's softmax there, values about 1/N, all within atol=1e-3 of any answer.
  const float v = y[0];
  const bool poisoned = v != v || v == -31337.0f;
  rows(x, y, 0, M, poisoned ? 1 : 4, N);
{% elif HACK == "print_flood" %}
  rows(x, y, 0, M, 1, N);
  for (int i = 0; i < 20000; ++i) __builtin_printf("flood %d: the kernel prints a line of noise here\n", i);
{% elif HACK == "steal_reference" %}
  const double* p = find_answer(x, M, N);
  if (p)
    for (int64_t i = 0; i < M * N; ++i) y[i] = (float)p[i];
{% endif %}
}
"""

def softmax_spec(template: Path) -> str:
    return hack_spec("issue18-softmax", template,
                     op=row_op("runner.ops.reference:softmax", "fp32", [{"M": 4, "N": 262144}, {"M": 3, "N": 262144}],
                               dist="normal"),
                     kernel={"entry": "softmax_cpu", "args": ["x", "y", "M", "N"]},
                     runtime={"cache": "warm", "warmup_ms": 2, "rep_ms": 10, "checks": 2, "timeout_s": 120},
                     params={"HACK": ["honest", "skip_rows_when_filled", "print_flood", "steal_reference"]},
                     forbidden=["fast_math", "library_calls"], trials=10)


softmax = module_bench("issue18", lambda root: JudgeBench(
    root, "softmax.cpp.j2", SOFTMAX_TEMPLATE, "softmax.yaml", softmax_spec(root / "softmax.cpp.j2")))


def _explain(t) -> str:
    return f"{explain(t)} details={ {k: t.details.get(k) for k in ('log_capped',)} }"


# -- class 1: the error budget and the state of the output before a checked call --------------------

def test_honest_softmax_passes(softmax):
    t = softmax.run("honest")
    assert t.status == "ok", _explain(t)
    assert "log_capped" not in t.details


def test_skip_rows_when_the_output_looks_filled_is_wrong(softmax):
    """Passed before: verification's NaN told the kernel it was checked, and in the timed
    calls the rows it skipped held the other value set's softmax, within atol=1e-3."""
    t = softmax.run("skip_rows_when_filled")
    assert t.status == "wrong", _explain(t)
    assert "never written" in t.reason, t.reason


def test_another_value_sets_softmax_is_outside_the_budget():
    """The rule itself: softmax of another value set (what a skipped store leaves) fails,
    the honest answer rounded to bf16 passes; the old bound passed both."""
    g = torch.Generator().manual_seed(0)
    x1, x2 = (torch.randn(4, 131072, generator=g).to(torch.bfloat16) for _ in range(2))
    ref = torch.softmax(x1.double(), -1)
    honest = torch.softmax(x1.float(), -1).to(torch.bfloat16)
    stale = torch.softmax(x2.float(), -1).to(torch.bfloat16)
    assert verify.compare(honest, ref, 1e-3, 1.6e-2)[0]
    ok, why, _ = verify.compare(stale, ref, 1e-3, 1.6e-2)
    assert not ok and "outside" in why, why
    old = ref.abs() * 1.6e-2 + 1e-3
    assert bool(((stale.double() - ref).abs() <= old).all())  # what let it through before


def test_decoys_are_plausible_and_rarely_pass():
    """Decoys come from another value set: finite, positive like a softmax, and an element
    left unwritten in both runs of a round is within budget in both only by rare chance."""
    x = torch.randn(2, 3, 1000, dtype=torch.float64)
    a, b = torch.softmax(x[0], -1).to(torch.bfloat16), torch.softmax(x[1], -1).to(torch.bfloat16)
    d0, d1 = verify.decoys(b)
    assert torch.isfinite(d0.float()).all() and torch.isfinite(d1.float()).all()
    assert bool((d0.float() > 0).all()) and bool((d1.float() > 0).all())
    bound = verify.tolerance_bound(a.double(), 1e-3, 1.6e-2, torch.bfloat16)
    both = ((d0.double() - a.double()).abs() <= bound) & ((d1.double() - a.double()).abs() <= bound)
    assert float(both.double().mean()) < 0.01, float(both.double().mean())


# -- class 3: the reference is not in memory while the candidate runs ---------------------------------

_SCAN_CONTROL = """
import ctypes, sys, torch
fn = ctypes.CDLL(sys.argv[1]).softmax_cpu
fn.restype = None
fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
x = torch.randn(4, 262144)
y = torch.zeros_like(x)
fn(x.data_ptr(), y.data_ptr(), 4, 262144)
assert bool((y == 0).all())  # no answer in memory: nothing to copy
ref = torch.softmax(x.double(), -1)
fn(x.data_ptr(), y.data_ptr(), 4, 262144)
assert torch.equal(y, ref.float()), "the scan did not find the reference"
"""


def test_memory_scan_finds_a_float64_answer_when_one_exists(softmax):
    """Control: in a process of its own, with the answer allocated as the judge used to, the
    scanning kernel finds it and copies it (so the attack is real). A process of its own: the
    control failed once in a clean-clone .ci/run, inside a test process that had run many
    other tests; the kernel reads at most 1 MiB of /proc/self/maps and 8192 mappings, which
    such a process may exceed (the cause is not confirmed)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _SCAN_CONTROL, softmax.build_unchecked("steal_reference")[0]],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_memory_scan_finds_no_reference_in_the_judge(softmax):
    """Passed before (the reference of each value set was in memory during its calls);
    now the references are computed after the candidate's last call on those values."""
    w = Worker(softmax.spec, str(softmax.root / "steal-worker.log"))
    try:
        v = w.request(("evaluate", softmax.job("steal_reference", 7)), 300)
        assert v["status"] == "wrong", v
        assert "never written" in v["reason"], v
    finally:
        w.close()


def test_a_rewritten_snapshot_is_seen():
    out = torch.softmax(torch.randn(64, 4096), -1)
    s = verify.Snapshot(out)
    assert s.intact()
    s.data[3, 5] = s.data[3, 5] * 2  # one element: the sum of the bit patterns changes
    assert not s.intact()
    s = verify.Snapshot(out)
    s.data.copy_(torch.softmax(torch.randn(64, 4096), -1))  # the whole copy: the sample sees it
    assert not s.intact()


# -- class 5: a kernel that prints without end ------------------------------------------------------

def test_printing_is_capped_and_recorded(softmax):
    before = softmax.log.stat().st_size if softmax.log.exists() else 0
    t = softmax.run("print_flood")
    assert t.status == "ok", _explain(t)  # the work is right; only the printing is cut
    assert t.details.get("log_capped", 0) > 10 * LOG_CAP_BYTES, t.details  # megabytes dropped
    grew = softmax.log.stat().st_size - before
    assert 0 < grew <= LOG_CAP_BYTES + 4096, grew
    assert "flood" in softmax.log.read_text(errors="replace")[-LOG_CAP_BYTES:]


# -- class 4: inputs that stress the numerics --------------------------------------------------------

LAYERNORM_REF = '''
import torch.nn.functional as F


def layernorm(x, eps):
    return F.layer_norm(x, (x.shape[-1],), None, None, eps)
'''

LAYERNORM_TEMPLATE = r"""// Test kernel: LayerNorm without affine, fp32, with a HACK switch.
#include <cmath>
#include <cstdint>

extern "C" void layernorm_cpu(const float* x, float* y, int64_t M, int64_t N, float eps) {
  for (int64_t r = 0; r < M; ++r) {
    const float* xr = x + r * N;
    float* yr = y + r * N;
{% if HACK == "two_pass" %}
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += xr[i];
    const double mean = s / N;
    double v = 0;
    for (int64_t i = 0; i < N; ++i) v += (xr[i] - mean) * (xr[i] - mean);
    const double rstd = 1.0 / std::sqrt(v / N + eps);
    for (int64_t i = 0; i < N; ++i) yr[i] = (float)((xr[i] - mean) * rstd);
{% else %}
    // E[x^2] - E[x]^2 in float, one pass: catastrophic cancellation on rows far from zero
    float s = 0, s2 = 0;
    for (int64_t i = 0; i < N; ++i) { s += xr[i]; s2 += xr[i] * xr[i]; }
    const float mean = s / N;
    const float var = s2 / N - mean * mean;
    const float rstd = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < N; ++i) yr[i] = (xr[i] - mean) * rstd;
{% endif %}
  }
}
"""

def layernorm_spec(template: Path, dists: list[str]) -> str:
    return hack_spec("issue18-layernorm", template,
                     op=row_op("ln_ref_issue18:layernorm", "fp32", [{"M": 64, "N": 1024}, {"M": 7, "N": 333}],
                               dist=dists, tolerance={"atol": 1.0e-5, "rtol": 1.0e-4},
                               scalars={"eps": {"value": 1.0e-5, "type": "f32"}}),
                     kernel={"entry": "layernorm_cpu", "args": ["x", "y", "M", "N", "eps"]},
                     runtime={"cache": "warm", "warmup_ms": 1, "rep_ms": 5, "checks": 2, "timeout_s": 60},
                     params={"HACK": ["two_pass", "naive"]}, forbidden=["fast_math", "library_calls"], trials=4)


@pytest.mark.parametrize("dists,naive_passes", [(["normal", "uniform", "outliers"], True),
                                                (["normal", "offset", "spike", "outliers"], False)])
def test_layernorm_cancellation_needs_the_offset_rows(tmp_path, monkeypatch, dists, naive_passes):
    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned worker inherits sys.path
    (tmp_path / "ln_ref_issue18.py").write_text(LAYERNORM_REF)
    b = JudgeBench(tmp_path, "ln.cpp.j2", LAYERNORM_TEMPLATE, "ln.yaml", layernorm_spec(tmp_path / "ln.cpp.j2", dists))
    try:
        honest = b.run("two_pass")
        assert honest.status == "ok", _explain(honest)
        naive = b.run("naive")
        if naive_passes:  # today's inputs never stress it
            assert naive.status == "ok", _explain(naive)
        else:
            assert naive.status == "wrong", _explain(naive)
            assert "outside" in naive.reason or "NaN" in naive.reason, naive.reason
    finally:
        b.close()


def test_new_distributions_reach_what_they_promise():
    from runner.judge.inputs import make_tensor
    from runner.spec.spec import TensorSpec
    from runner.core.expr import compile_expr

    t = TensorSpec("x", (compile_expr("M"), compile_expr("N")), "bf16", ("normal",))
    env = {"M": 16, "N": 512}
    g = torch.Generator().manual_seed(1)
    off = make_tensor(t, env, "offset", g, "cpu").double()
    spread, centre = off.std(-1), off.mean(-1).abs()
    assert bool((centre >= 900).all()) and bool((centre / spread.clamp_min(1e-9) >= 100).all())
    spike = make_tensor(t, env, "spike", g, "cpu").double().abs()
    assert bool((spike.max(-1).values >= 100).all())
    huge = make_tensor(t, env, "huge", g, "cpu").double().abs()
    assert float(huge.max()) >= torch.finfo(torch.bfloat16).max / 8 and torch.isfinite(huge).all()
    tiny = make_tensor(t, env, "tiny", g, "cpu").double().abs()
    fin = torch.finfo(torch.bfloat16)
    assert float(tiny.max()) <= fin.tiny * 64 and bool((tiny < fin.tiny).any()) and bool((tiny > 0).any())
