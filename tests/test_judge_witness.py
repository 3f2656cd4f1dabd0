"""Every distribution a spec lists reaches every verified shape (judge/inputs.py, witness rows),
and no cheap test tells the judge's rows from a user's (the `scaled` distribution).

Session 42's red team (datasets/judge-redteam/s42-told): the check rounds rotated over an
input's distributions, shape by shape, so with `checks: 2` rmsnorm-cpu's `offset` and `tiny`
rows were drawn only at its extra shapes; a variant that dropped eps wherever M > 7 was `ok`
and wrong on a user's rows of rms 0.05 (17.8 times its budget). A second one kept eps only
on rows that looked like the judge's (an element under 1e-30 or over 300), also `ok`."""

import pytest
import torch

from runner.judge import inputs
from runner.spec.spec import load_spec

from .conftest import PIPELINES, ROOT, eval_variant

RMS = load_spec(PIPELINES / "rmsnorm-cpu.yaml")
SHAPE = {"M": 512, "N": 4096}  # a timed shape


def kinds(x: torch.Tensor) -> dict[str, int]:
    """Rows of x by what made them: offset (a common offset), tiny (all under 1e-30), scaled
    far from 1 (rms under 0.05 or over 20), the rest."""
    x = x.double()
    mean, rms, top = x.mean(1).abs(), x.pow(2).mean(1).sqrt(), x.abs().amax(1)
    offset = mean > 100
    tiny = top < 1e-30
    scaled = ~offset & ~tiny & ((rms < 0.05) | (rms > 20))
    return {"offset": int(offset.sum()), "tiny": int(tiny.sum()), "scaled": int(scaled.sum()), "rows": x.shape[0]}


def test_every_listed_distribution_is_drawn_at_every_verified_shape():
    for r in range(2):  # the spec's check rounds: normal, then outliers as the round's own
        k = kinds(inputs.make_inputs(RMS.op, SHAPE, 1234 + r, r, "cpu")["x"])
        assert k["offset"] > 0 and k["tiny"] > 0 and k["scaled"] > 0, k
        assert k["offset"] + k["tiny"] + k["scaled"] <= k["rows"] // inputs.WITNESS_SHARE, k
    # a timed call's values: the round's distributions alone, as torch is timed on them
    k = kinds(inputs.make_inputs(RMS.op, SHAPE, 1234, 0, "cpu", timed=True)["x"])
    assert k["offset"] == k["tiny"] == 0, k
    # the same seed gives the same set (the checks make it again), and another a new one
    a, b = (inputs.make_inputs(RMS.op, SHAPE, 77, 0, "cpu") for _ in range(2))
    assert all(torch.equal(a[n], b[n]) for n in a)
    c = inputs.make_inputs(RMS.op, SHAPE, 78, 0, "cpu")
    assert not torch.equal(a["x"], c["x"])


def test_witness_rows_leave_the_sets_other_values_as_they_were(monkeypatch):
    full = inputs.make_inputs(RMS.op, SHAPE, 9, 0, "cpu")
    share = inputs.WITNESS_SHARE
    monkeypatch.setattr(inputs, "WITNESS_SHARE", 1 << 40)  # none
    plain = inputs.make_inputs(RMS.op, SHAPE, 9, 0, "cpu")
    assert torch.equal(full["w"], plain["w"])  # one dimension: no rows to witness
    same = (full["x"] == plain["x"]).all(dim=1)
    assert int((~same).sum()) == SHAPE["M"] // share  # the witness rows, and nothing else
    # too few rows for a witness: the round's distribution alone
    monkeypatch.undo()
    small = {"M": inputs.WITNESS_SHARE - 1, "N": 64}
    k = kinds(inputs.make_inputs(RMS.op, small, 9, 0, "cpu")["x"])
    assert k["offset"] == k["tiny"] == k["scaled"] == 0


def test_scaled_rows_span_twelve_decades():
    x = inputs.make_inputs(RMS.op, SHAPE, 5, RMS.op.inputs[0].dists.index("scaled"), "cpu")["x"].double()
    lg = x.pow(2).mean(1).sqrt().log10()
    assert float(lg.min()) < -4.5 and float(lg.max()) > 4.5
    assert float(lg.std()) > 2.5  # spread over the range, not bunched


TEMPLATE = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
EPS = "const {{ ctype }} scale = {{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps));"
NO_EPS = "{{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N))"
WITH_EPS = "{{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps))"
ROWS_OF_THE_CALL = "const bool careful = (r1 - r0) <= 7 && r0 == 0;"
VARIANTS = {
    # eps dropped wherever the call has more than 7 rows: the timed shapes, never the extra ones
    "beyond_the_extra_shapes": TEMPLATE.replace(
        EPS, ROWS_OF_THE_CALL + f"\n    const {{{{ ctype }}}} scale = careful ? {WITH_EPS} : {NO_EPS};"),
    # eps kept on rows that look like the judge's numerics rows (two elements and w[0] read)
    "unless_the_judges_rows": TEMPLATE.replace(EPS, (
        "const {{ ctype }} a0 = std::fabs(xr[0]), a1 = std::fabs(xr[N - 1]);\n"
        "    const bool judged = a0 < 1e-30f || a1 < 1e-30f || a0 > 300.0f || a1 > 300.0f\n"
        "                        || std::fabs(w[0]) < 1e-30f;\n"
        f"    const {{{{ ctype }}}} scale = judged ? {WITH_EPS} : {NO_EPS};")),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_kernel_wrong_on_a_users_rows_of_small_scale_is_wrong(name, tmp_path, project):
    assert EPS in TEMPLATE and VARIANTS[name] != TEMPLATE
    params = {"ACC": 8, "THREADS": 1, "UNROLL": 1}
    r, text = eval_variant(project, tmp_path / name, name, VARIANTS[name], params)
    assert r.returncode != 0 and '"status": "wrong"' in text, text[-3000:]
    # the template itself, a variant in nothing but a comment: ok at the same parameters
    honest = TEMPLATE.replace("// RMSNorm over rows on the CPU", "// RMSNorm over rows, again")
    r, text = eval_variant(project, tmp_path / "honest", "honest", honest, params)
    assert r.returncode == 0 and '"status": "ok"' in r.stdout, text[-3000:]
