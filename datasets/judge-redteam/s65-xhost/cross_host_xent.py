"""Red team (session 65b): cross-entropy on the CPU backend (the shipped GPU op's spec, fp32 logits),
a candidate that copies the incumbent's loss buffer out of the shared arena in the re-timing.

Why it can pass: a fresh call's salt replaces one logit per row, which moves a row's loss by about
(e^a' - e^a) / sum(e^x), some 1e-5 nats at V = 32768, far inside the op's tolerance (atol 1e-5 +
rtol 2e-4 * loss, loss ~ 7-11 nats). The incumbent's output buffer (the arm timed before, in the
same input rotation: the same two value sets in every round) holds its answer to one of the two
sets (salted at 8 elements), and stays readable while the candidate runs. The candidate computes
rows 0 and 1, and where the incumbent's rows 0 and 1 agree within the tolerance, copies the rest.

HACK: honest (the incumbent, and the candidate in evaluate), copy (honest unless its inputs sit right
before its output in the arena, as the re-timing allocates them; then the copy above).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

from .conftest import JudgeBench, explain, hack_spec, module_bench

TEMPLATE = r"""// Red-team kernel: cross-entropy per row, fp32.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

float row_loss(const float* xr, int64_t t, int64_t V, int ignore) {
  if (t == ignore) return 0.0f;
  float m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = xr[i] > m ? xr[i] : m;
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(xr[i] - m);
  return (float)((double)m + std::log(s) - (double)xr[t]);
}

const uintptr_t PAGE = 4096, GUARD = 4096, ROOM = 128;
uintptr_t block_len(uintptr_t nbytes) { return (nbytes + PAGE - 1) / PAGE * PAGE + PAGE; }
bool close(float a, float b) { return std::fabs(a - b) <= 1e-5f + 1e-4f * std::fabs(b); }

int64_t calls = 0, copies = 0;

}  // namespace

extern "C" void xent(const float* logits, const int64_t* targets, float* loss, int64_t M, int64_t V,
                     int32_t ignore_index) {
  ++calls;
{% if HACK == "copy" %}
  // the re-timing's layout: logits, targets, then this job's output, then the next job's
  uintptr_t lg = (uintptr_t)logits, tg = (uintptr_t)targets, out = (uintptr_t)loss;
  uintptr_t mine = (out - GUARD * 4) & ~(PAGE - 1);
  if (M >= 3 && lg % PAGE == 0 && lg + block_len(M * V * 4) == tg && tg + block_len(M * 8) == mine) {
    loss[0] = row_loss(logits, targets[0], V, ignore_index);
    loss[1] = row_loss(logits + V, targets[1], V, ignore_index);
    const float* next = (const float*)(mine + block_len((M + 2 * GUARD + ROOM) * 4));
    for (uintptr_t lead = 0; lead < ROOM; ++lead) {
      const float* other = next + lead + GUARD;
      if (close(other[0], loss[0]) && close(other[1], loss[1])) {
        std::memcpy(loss + 2, other + 2, (M - 2) * sizeof(float));
        ++copies;
        __builtin_printf("XENT copy call=%ld copies=%ld\n", (long)calls, (long)copies);
        return;
      }
    }
    for (int64_t r = 2; r < M; ++r) loss[r] = row_loss(logits + r * V, targets[r], V, ignore_index);
    __builtin_printf("XENT work call=%ld copies=%ld\n", (long)calls, (long)copies);
    return;
  }
{% elif HACK == "memo" %}
  // no other host: a memo of both value sets' losses kept in this output's own front guard band
  // (4096 floats before the output), in the re-timing's layout only
  uintptr_t lg = (uintptr_t)logits, tg = (uintptr_t)targets, out = (uintptr_t)loss;
  uintptr_t mine = (out - GUARD * 4) & ~(PAGE - 1);
  if (M >= 3 && M <= 2000 && lg % PAGE == 0 && lg + block_len(M * V * 4) == tg && tg + block_len(M * 8) == mine) {
    loss[0] = row_loss(logits, targets[0], V, ignore_index);
    loss[1] = row_loss(logits + V, targets[1], V, ignore_index);
    float* slot[2] = {loss - 4096, loss - 2048};
    static int next = 0;
    for (int k = 0; k < 2; ++k)
      if (close(slot[k][0], loss[0]) && close(slot[k][1], loss[1])) {
        std::memcpy(loss + 2, slot[k] + 2, (M - 2) * sizeof(float));
        return;
      }
    for (int64_t r = 2; r < M; ++r) loss[r] = row_loss(logits + r * V, targets[r], V, ignore_index);
    std::memcpy(slot[next], loss, M * sizeof(float));
    next ^= 1;
    return;
  }
{% endif %}
  for (int64_t r = 0; r < M; ++r) loss[r] = row_loss(logits + r * V, targets[r], V, ignore_index);
}
"""

HACKS = ["honest", "copy", "memo"]


def spec(template: Path) -> str:
    op = {"reference": "runner.ops.reference:cross_entropy", "dtype": "fp32",
          "inputs": {"logits": {"shape": ["M", "V"], "dist": ["normal"]},
                     "targets": {"shape": ["M"], "dtype": "int64", "dist": "randint", "low": "0", "high": "V",
                                 "special": {"value": -100, "fraction": 0.05},
                                 "argmax": {"of": "logits", "fraction": 0.25}}},
          "outputs": {"loss": {"shape": ["M"], "dtype": "fp32"}},
          "scalars": {"ignore_index": {"value": -100, "type": "i32"}},
          "shapes": [{"M": 32, "V": 32768}],
          "tolerance": {"atol": 1.0e-5, "rtol": 2.0e-4, "floor": float("inf")},
          "bytes": "elem * M * V + 12 * M", "flops": "4 * M * V"}
    return hack_spec("xent-xhost", template, description="cross-entropy reading another host's output",
                     op=op, kernel={"entry": "xent", "args": ["logits", "targets", "loss", "M", "V", "ignore_index"]},
                     runtime={"cache": "warm", "warmup_ms": 2, "rep_ms": 60, "checks": 2, "timeout_s": 60},
                     params={"HACK": HACKS}, forbidden=["fast_math", "library_calls", "side_streams", "lower_precision"],
                     agent={"strategy": "random", "seed": 0})


class Bench(JudgeBench):
    def __init__(self, root: Path):
        super().__init__(root, "xent.cpp.j2", TEMPLATE, "spec.yaml", spec(root / "xent.cpp.j2"))


bench = module_bench("xent-xhost", Bench)


def log_lines(bench):
    return [ln for ln in bench.log.read_text(errors="replace").splitlines() if "XENT" in ln]


import pytest


@pytest.mark.parametrize("hack", ["copy", "memo"])
def test_a_candidate_that_copies_is_kept(bench, hack):
    inc = bench.run("honest")
    assert inc.status == "ok", explain(inc)
    before = len(log_lines(bench))
    t = bench.run(hack)
    print(hack, "evaluate:", explain(t), "incumbent:", explain(inc))
    assert t.status == "ok", explain(t)
    assert not log_lines(bench)[before:], "copied in evaluate"  # honest there
    # the candidate's own figure against the incumbent's: both honest in evaluate, a tie; the keep
    # decision re-times a candidate whose figure is under the incumbent's bar (noise does that half
    # the time); here it is handed to decide() as one that is
    t = copy.deepcopy(t)
    t.objective = min(t.objective, inc.objective * 0.98)
    bench.ev.decide(t, inc)
    lines = log_lines(bench)[before:]
    n_copy = sum(" copy " in ln for ln in lines)
    print(hack, "retime:", t.kept, t.status, t.reason, t.details.get("retime"))
    print(f"kernel: {len(lines)} calls in the copy path's layout, {n_copy} copied")
    assert t.kept, t.details.get("retime")
