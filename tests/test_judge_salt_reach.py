"""A salt no output feels: where the few elements the last timed call's salt replaces move no
output past its budget (a long row reduced to one value: cross-entropy's loss), a memo of the two
value sets' answers, or a copy of another arm's output for the same set, passed every check of
every salted call (session 65's red team, datasets/judge-redteam/s65-xhost: kept 4 of 4 and 3 of
3 in a keep decision's re-timing). The judge measures it once a shape (Judge._salt_unseen) and
then salts every element too (_DenseSalt), as it does where the flops bind."""

from __future__ import annotations

import random

from .conftest import hack_spec

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
