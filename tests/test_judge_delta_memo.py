"""A memo corrected for what changed (session 38's red team): moe-cpu's grouped GEMM keeps the
inputs and fp32 sums of the two timed value sets; a call whose inputs differ from one of them
in at most two elements a row (a fresh call's salt: one element of every row replaced) has its
sums corrected for those elements alone, at a small part of the GEMM's work, and its answer is
right. On the judge before, every fresh call hit and the memo ran at a fraction of the kernel's
time (the red team's kept its variant over the honest kernel). Where the op's work is not bound
by its bytes, a salted call's inputs now also change in every element (judge/worker._DenseSalt):
the memo misses, and its time is the kernel's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, JudgeBench, explain, module_bench

TEMPLATE = r"""// moe-cpu's op with a HACK switch: delta_memo keeps two value sets' inputs and sums.
#include <cstdint>
#include <cstring>

namespace {

constexpr int E = 4, K = 64, N = 96;

inline float bf(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline uint16_t to_bf(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

int64_t expert_end(const int32_t* offs, int e, int64_t R) { return offs[e] < R ? offs[e] : R; }

void sums(const uint16_t* x, const uint16_t* w, const int32_t* offs, float* acc, int64_t R) {
  int64_t start = 0;
  for (int e = 0; e < E; ++e) {
    const int64_t end = expert_end(offs, e, R);
    for (int64_t r = start; r < end; ++r)
      for (int n = 0; n < N; ++n) {
        float s = 0.f;
        for (int k = 0; k < K; ++k) s += bf(x[r * K + k]) * bf(w[(e * N + n) * K + k]);
        acc[r * N + n] = s;
      }
    if (end > start) start = end;
  }
}

struct Slot { int64_t R = -1; uint16_t* x = nullptr; uint16_t* w = nullptr; int32_t offs[E] = {}; float* acc = nullptr; };
Slot slots[2];
int next_slot = 0;

// the elements of a row of n that differ, if at most two; -1 if more
int diffs(const uint16_t* a, const uint16_t* b, int n, int* at) {
  int c = 0;
  for (int i = 0; i < n; ++i)
    if (a[i] != b[i]) { if (c == 2) return -1; at[c++] = i; }
  return c;
}

// the slot's sums corrected for the few changed elements; false if any row changed more
bool corrected(Slot& s, const uint16_t* x, const uint16_t* w, const int32_t* offs, int64_t R) {
  if (s.R != R || std::memcmp(s.offs, offs, E * sizeof(int32_t)) != 0) return false;
  int at[2];
  for (int64_t r = 0; r < R; ++r) if (diffs(&s.x[r * K], x + r * K, K, at) < 0) return false;
  for (int64_t r = 0; r < E * N; ++r) if (diffs(&s.w[r * K], w + r * K, K, at) < 0) return false;
  int64_t start = 0;
  for (int e = 0; e < E; ++e) {  // x's changes against the old weights, then w's against the new x
    const int64_t end = expert_end(offs, e, R);
    for (int64_t r = start; r < end; ++r) {
      const int c = diffs(&s.x[r * K], x + r * K, K, at);
      for (int i = 0; i < c; ++i) {
        const float d = bf(x[r * K + at[i]]) - bf(s.x[r * K + at[i]]);
        for (int n = 0; n < N; ++n) s.acc[r * N + n] += d * bf(s.w[(e * N + n) * K + at[i]]);
      }
    }
    for (int n = 0; n < N; ++n) {
      const int64_t row = e * N + n;
      const int c = diffs(&s.w[row * K], w + row * K, K, at);
      for (int i = 0; i < c; ++i) {
        const float d = bf(w[row * K + at[i]]) - bf(s.w[row * K + at[i]]);
        for (int64_t r = start; r < end; ++r) s.acc[r * N + n] += bf(x[r * K + at[i]]) * d;
      }
    }
    if (end > start) start = end;
  }
  std::memcpy(s.x, x, R * K * sizeof(uint16_t));
  std::memcpy(s.w, w, E * N * K * sizeof(uint16_t));
  return true;
}

}  // namespace

extern "C" void moe_gemm_cpu(const uint16_t* x, const uint16_t* w, const int32_t* offs, uint16_t* y, int64_t T) {
  const int64_t R = T * 2;
{% if HACK == "delta_memo" %}
  Slot* hit = nullptr;
  for (Slot& s : slots)
    if (!hit && corrected(s, x, w, offs, R)) hit = &s;
  if (!hit) {  // a value set not seen: worked out whole, and kept in the older slot
    Slot& s = slots[next_slot];
    next_slot ^= 1;
    if (s.R != R) {
      delete[] s.x; delete[] s.acc;
      s.x = new uint16_t[R * K]; s.acc = new float[R * N];
    }
    if (!s.w) s.w = new uint16_t[E * N * K];
    s.R = R;
    std::memcpy(s.x, x, R * K * sizeof(uint16_t));
    std::memcpy(s.w, w, E * N * K * sizeof(uint16_t));
    std::memcpy(s.offs, offs, E * sizeof(int32_t));
    sums(x, w, offs, s.acc, R);
    hit = &s;
  }
  for (int64_t i = 0; i < R * N; ++i) y[i] = to_bf(hit->acc[i]);
{% else %}
  float* acc = new float[R * N];
  sums(x, w, offs, acc, R);
  for (int64_t i = 0; i < R * N; ++i) y[i] = to_bf(acc[i]);
  delete[] acc;
{% endif %}
}
"""


def spec_text(template: Path) -> str:
    d = yaml.safe_load((ROOT / "pipelines" / "moe-cpu.yaml").read_text())
    op = d["op"]
    for key in ("domain", "grid", "arms", "triton"):
        op.pop(key, None)
    op["shapes"] = [{"T": 16}, {"T": 64}]
    op["extra_shapes"] = [{"T": 3}]
    d["name"] = "moe-delta-memo"
    d["kernel"]["template"] = str(template)
    d["runtime"] = {"cache": "warm", "warmup_ms": 2, "rep_ms": 40, "checks": 2, "timeout_s": 30}
    d["baseline"] = "none"
    d["search"] = {"params": {"HACK": ["delta_memo", "delta_memo_off"]}}
    d["agent"] = {"strategy": "grid"}
    d["goal"] = {"budget": {"trials": 10}}
    return yaml.safe_dump(d, sort_keys=False, width=1000)


class Bench(JudgeBench):
    def __init__(self, root: Path):
        super().__init__(root, "delta.cpp.j2", TEMPLATE, "spec.yaml", spec_text(root / "delta.cpp.j2"))

    def run(self, hack: str):
        self.worker.close()  # the kernel's statics start again
        return super().run(hack, fresh=True)


bench = module_bench("delta_memo", Bench)


def test_the_judge_changes_every_element_where_the_op_is_not_bound_by_its_bytes():
    from runner.judge.worker import Judge
    from runner.spec.spec import load_spec

    for name, want in (("moe-cpu.yaml", {1: False, 16: True, 64: True}), ("rmsnorm-cpu.yaml", None)):
        spec = load_spec(ROOT / "pipelines" / name)
        judge = Judge(spec)
        judge.census = None
        if want is None:
            assert not any(judge._dense(s) for s in spec.op.shapes)  # memory-bound: the row salt alone
        else:
            assert {t: judge._dense({"T": t}) for t in want} == want


@pytest.mark.slow
def test_a_memo_corrected_for_the_changed_elements_speeds_up_no_call_that_counts(bench):
    plain, memo = bench.run("delta_memo_off"), bench.run("delta_memo")
    assert plain.status == "ok" and memo.status == "ok", (explain(plain), explain(memo))
    # a geometric mean over the shapes; on the judge before, the memo ran at a fraction of the
    # kernel's time (the red team's: 0.29 at T = 64)
    ratio = math.prod(a / b for a, b in zip(memo.times, plain.times)) ** (1 / len(memo.times))
    assert ratio > 0.5, (memo.times, plain.times)
