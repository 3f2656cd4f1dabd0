"""A salt no output feels: where the few elements the last timed call's salt replaces move no
output past its budget (a long row reduced to one value: cross-entropy's loss), a memo of the two
value sets' answers, or a copy of another arm's output for the same set, passed every check of
every salted call (session 65's red team, datasets/judge-redteam/s65-xhost: kept 4 of 4 and 3 of
3 in a keep decision's re-timing). The judge measures it once a shape (Judge._salt_unseen) and
then salts every element too (_DenseSalt), as it does where the flops bind."""

from __future__ import annotations

import copy
import random

import pytest

from .conftest import JudgeBench, explain, hack_spec, module_bench

XENT_OP = {"reference": "runner.ops.reference:cross_entropy", "dtype": "fp32",
           "inputs": {"logits": {"shape": ["M", "V"], "dist": ["normal"]},
                      "targets": {"shape": ["M"], "dtype": "int64", "dist": "randint", "low": "0", "high": "V",
                                  "special": {"value": -100, "fraction": 0.05}}},
           "outputs": {"loss": {"shape": ["M"], "dtype": "fp32"}},
           "scalars": {"ignore_index": {"value": -100, "type": "i32"}},
           "shapes": [{"M": 32, "V": 32768}, {"M": 64, "V": 8}],
           "tolerance": {"atol": 1.0e-5, "rtol": 2.0e-4, "floor": float("inf")},
           "bytes": "elem * M * V + 12 * M", "flops": "4 * M * V"}


def _judge(tmp_path):
    from runner.judge.worker import Judge
    from runner.spec.spec import load_spec

    tpl = tmp_path / "xent.cpp.j2"
    tpl.write_text('// X={{ X }}\n'
                   'extern "C" void xent(const float* x, const long* t, float* l, long M, long V, int ig) {}\n')
    (tmp_path / "spec.yaml").write_text(hack_spec(
        "xent-salt", tpl, op=XENT_OP, params={"X": [0]},
        kernel={"entry": "xent", "args": ["logits", "targets", "loss", "M", "V", "ignore_index"]}))
    spec = load_spec(tmp_path / "spec.yaml")
    judge = Judge(spec)
    judge.census = None
    return spec, judge


def test_a_salt_no_output_feels_is_made_dense(tmp_path):
    from runner.judge import worker
    from runner.judge.verify import compare

    spec, judge = _judge(tmp_path)
    long_rows, short_rows = spec.op.shapes
    # a row of 32768 logits: 8 replaced move 8 losses by about 1e-5, inside the 1e-3 budget; a row
    # of 8: a replaced logit moves its loss past it
    assert judge._salt_unseen(long_rows) and judge._dense(long_rows)
    assert not judge._salt_unseen(short_rows) and not judge._dense(short_rows)
    # the red team's memo: the unsalted set's losses, against a fresh call's reference
    inputs = judge._inputs(long_rows, 11, 0, True)
    (plain, _), = judge._reference(inputs, long_rows)
    targets = worker._salt_targets(inputs)
    rng = random.Random(5)
    rows = [sw for t in targets for sw in worker._row_salt(inputs[t], t, rng)]
    for salt, passes in ((rows, True), (rows + worker._dense_salt(inputs, targets, rng, True), False)):
        (ref, budget), = judge._reference(worker._salted(inputs, salt), long_rows)
        ok, why, _ = compare(plain.float(), ref, spec.op.atol, spec.op.rtol, budget)
        assert ok is passes, why  # the row salt alone: the memo passes; with every element scaled: it fails


MEMO_TEMPLATE = r"""// Cross-entropy per row, fp32; HACK memo: in the re-timing's layout (its inputs right before
// its output in the arena), a memo of both value sets' losses in the output's own front guard band.
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
const uintptr_t PAGE = 4096, GUARD = 4096;
uintptr_t block_len(uintptr_t nbytes) { return (nbytes + PAGE - 1) / PAGE * PAGE + PAGE; }
bool close(float a, float b) { return std::fabs(a - b) <= 1e-5f + 1e-4f * std::fabs(b); }
int next = 0;
}  // namespace

extern "C" void xent(const float* logits, const int64_t* targets, float* loss, int64_t M, int64_t V,
                     int32_t ignore_index) {
{% if HACK == "memo" %}
  uintptr_t lg = (uintptr_t)logits, tg = (uintptr_t)targets, out = (uintptr_t)loss;
  uintptr_t mine = (out - GUARD * 4) & ~(PAGE - 1);
  if (M >= 3 && M <= 2000 && lg % PAGE == 0 && lg + block_len(M * V * 4) == tg && tg + block_len(M * 8) == mine) {
    loss[0] = row_loss(logits, targets[0], V, ignore_index);
    loss[1] = row_loss(logits + V, targets[1], V, ignore_index);
    float* slot[2] = {loss - 4096, loss - 2048};
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


def _memo_spec(template) -> str:
    op = dict(XENT_OP, shapes=[{"M": 32, "V": 32768}])
    return hack_spec("xent-memo", template, op=op, params={"HACK": ["honest", "memo"]},
                     kernel={"entry": "xent", "args": ["logits", "targets", "loss", "M", "V", "ignore_index"]},
                     runtime={"cache": "warm", "warmup_ms": 2, "rep_ms": 60, "checks": 2, "timeout_s": 60},
                     forbidden=["fast_math", "library_calls", "side_streams", "lower_precision"],
                     agent={"strategy": "random", "seed": 0})


class _MemoBench(JudgeBench):
    def __init__(self, root):
        super().__init__(root, "xent.cpp.j2", MEMO_TEMPLATE, "spec.yaml", _memo_spec(root / "xent.cpp.j2"))


memo_bench = module_bench("xent-memo", _MemoBench)


@pytest.mark.slow
def test_a_memo_in_its_own_guard_band_is_caught_in_the_retiming(memo_bench):
    """The red team's memo: honest in evaluate (another layout), in a keep decision's re-timing a
    memo of both value sets' losses in its own output's front guard band, which the re-timing's
    snapshots did not check (kept 3 of 3). Handed to `decide` as a candidate under the bar."""
    inc = memo_bench.run("honest")
    t = copy.deepcopy(memo_bench.run("memo"))
    assert inc.status == t.status == "ok", (explain(inc), explain(t))
    t.objective = min(t.objective, inc.objective * 0.98)
    memo_bench.ev.decide(t, inc)
    assert t.status == "wrong" and not t.kept and "guard band changed" in t.reason, (t.status, t.reason)
