"""Structured witness rows (judge/inputs.py `_structured`): verification's value sets hold rows of
exact zeros and rows on a coarse grid (exact repeats, exact zeros), which no continuous draw
makes and users pass all the same (padding tokens, quantized data).

Session 54's red team (on rmsnorm-cpu): a kernel that wrote NaN where every element of a row was
0, and one that zeroed an output where a row's first two elements were equal, were both `ok`:
the judge drew neither an all-zero row nor (but by chance) two equal neighbours."""

import pytest
import torch

from runner.judge import inputs
from runner.spec.spec import load_spec

from .conftest import PIPELINES, ROOT, eval_variant

RMS = load_spec(PIPELINES / "rmsnorm-cpu.yaml")
SOFTMAX = load_spec(PIPELINES / "softmax-range-h200.yaml")
SHAPE = {"M": 512, "N": 4096}


def structured_rows(x: torch.Tensor, plain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows all 0, rows changed and not all 0) of x against the same value set without them."""
    changed = (x != plain).any(dim=1)
    zero = (x == 0).all(dim=1)
    return changed & zero, changed & ~zero


def on_grid(row: torch.Tensor, bits: int) -> bool:
    """Whether every finite element of `row` is a whole multiple of 2^(e - bits), e the exponent
    of the row's largest finite magnitude (one step finer than the grid, whose rounding may carry
    the largest element up to the next power of two)."""
    r = row.double()
    r = r[torch.isfinite(r)]
    top = float(r.abs().max())
    step = 2.0 ** (torch.floor(torch.log2(torch.tensor(top))).item() - bits)
    return bool(torch.equal(torch.round(r / step) * step, r))


def test_verification_sets_hold_zero_rows_and_coarse_rows_at_secret_places():
    seen_zero = seen_grid = unlike = 0
    for seed in range(4):
        full = inputs.make_inputs(RMS.op, SHAPE, seed, 0, "cpu", structured=True)
        plain = inputs.make_inputs(RMS.op, SHAPE, seed, 0, "cpu")
        # every other row as it was (a generator of their own)
        zero, grid = structured_rows(full["x"], plain["x"])
        # (and the few sources of the rows of one of each kind, which the witness rows leave alone
        # since session 59: where the plain set has a witness row there, the row differs)
        assert 0 < int(zero.sum() + grid.sum()) <= SHAPE["M"] // inputs.WITNESS_SHARE * 5 // 4
        seen_zero += int(zero.sum())
        seen_grid += int(grid.sum())
        for i in grid.nonzero().flatten().tolist():
            r = full["x"][i]
            others = torch.cat([full["x"][:i], full["x"][i + 1:]])
            if bool((others == r).all(dim=1).any()):  # a copy of another row (session 56: users repeat rows)
                continue
            rc, oc = r.double() - r.double().mean(), others.double() - others.double().mean(1, keepdim=True)
            if float((oc @ rc / (oc.norm(dim=1) * rc.norm()).clamp_min(1e-300)).max()) > 0.25:
                continue  # alike another row, not equal (session 58: a prompt twice at other positions)
            if not on_grid(r, inputs.STRUCTURED_BITS):  # alike a row a witness row then took the place of
                unlike += 1
                continue
            # exact repeats: few distinct values, most of the row's elements share one
            assert r.unique().numel() <= 2 ** (inputs.STRUCTURED_BITS + 1) + 1
        # where they are is the seed's secret: another seed, other rows
        if seed == 0:
            first = zero | grid
        else:
            assert not torch.equal(first, zero | grid)
    assert seen_zero > 0 and seen_grid > 0 and unlike <= 8
    # timed calls' values never (nothing times on zeros), and the set is made again the same
    timed = inputs.make_inputs(RMS.op, SHAPE, 3, 0, "cpu", timed=True, structured=False)
    assert not bool((timed["x"] == 0).all(dim=1).any())
    a, b = (inputs.make_inputs(RMS.op, SHAPE, 11, 1, "cpu", structured=True) for _ in range(2))
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_no_1d_input_nor_first_or_last_row_and_a_masked_row_keeps_its_mask():
    # rmsnorm-cpu's weight is one dimension: no structured rows there (a zero element in every value
    # set would hide its output column in every row: a tail bug at the last column went unseen one
    # value set in 30 with them); session 58's `_spread` scales and negates its elements in a share
    # of the value sets, and zeroes one, never the first or the last
    for seed in range(8):
        full = inputs.make_inputs(RMS.op, SHAPE, seed, 0, "cpu", structured=True)
        plain_w = inputs.make_inputs(RMS.op, SHAPE, seed, 0, "cpu")["w"]
        ratio = (full["w"].double() / plain_w.double()).abs()
        assert int((full["w"] == 0).sum()) <= 1 and full["w"][0] != 0 and full["w"][-1] != 0
        assert bool(((ratio == 0) | ((ratio >= 2.0 ** -7) & (ratio <= 1))).all())
        zero, grid = structured_rows(full["x"], inputs.make_inputs(RMS.op, SHAPE, seed, 0, "cpu")["x"])
        assert not bool((zero | grid)[0]) and not bool((zero | grid)[-1])  # where tails are handled
    # softmax's `masked` rows: -inf stays -inf on the coarse grid, and the other values move
    masked = SOFTMAX.op.inputs[0].dists.index("masked")
    shape = {"M": 256, "N": 1024}
    full = inputs.make_inputs(SOFTMAX.op, shape, 5, masked, "cpu", structured=True)["x"].float()
    plain = inputs.make_inputs(SOFTMAX.op, shape, 5, masked, "cpu")["x"].float()
    zero, grid = structured_rows(full, plain)
    assert int(grid.sum()) > 0
    for i in grid.nonzero().flatten().tolist():
        assert not bool(torch.isnan(full[i]).any()) and not bool((full[i] == float("inf")).any())
        if on_grid(full[i], inputs.STRUCTURED_BITS):
            assert torch.equal(torch.isinf(full[i]), torch.isinf(plain[i]))
        else:  # a copy of another row, or alike another (session 58): its mask within theirs and its own
            assert bool((torch.isinf(full[i]) <= (torch.isinf(plain[i]) | torch.isinf(full).any(0))).all())


def test_a_positive_input_gets_none():
    """A zero may lie outside a positive input's domain (a logarithm's): its values are kept."""
    import dataclasses

    pos = dataclasses.replace(RMS.op.inputs[0], dists=("positive",))
    gen = torch.Generator().manual_seed(1)
    x = inputs.make_tensor(pos, RMS.op.shape_env(SHAPE), "positive", gen, "cpu")
    assert torch.equal(inputs._structured(x.clone(), pos, 7, 0), x)
    # the same rows of a normal input do change
    normal = dataclasses.replace(RMS.op.inputs[0], dists=("normal",))
    y = inputs.make_tensor(normal, RMS.op.shape_env(SHAPE), "normal", gen, "cpu")
    assert not torch.equal(inputs._structured(y.clone(), normal, 7, 0), y)


def test_the_judge_draws_none_for_an_op_undefined_at_a_zero_row(monkeypatch):
    """x / |x| (no eps) is NaN on a zero row: every kernel would be `wrong` there, so the judge
    leaves structured rows out for such an op; RMSNorm (eps) takes them."""
    from runner.judge.worker import Judge

    judge = Judge(RMS)
    assert judge._structured is True
    other = Judge(RMS)
    monkeypatch.setattr(other, "_call_reference",
                        lambda ins, **kw: [ins["x"].double() / ins["x"].double().norm(dim=1, keepdim=True)])
    assert other._structured is False
    # an op that is NaN with or without them is the spec's own (check_reference says so): drawn
    nan = Judge(RMS)
    monkeypatch.setattr(nan, "_call_reference", lambda ins, **kw: [ins["x"].double() * float("nan")])
    assert nan._structured is True
    # verification's value sets take them, a timed call's and a torch arm's never
    x = judge._inputs(SHAPE, 21, 0)["x"]
    assert bool((x == 0).all(dim=1).any()) or bool(((x != inputs.make_inputs(RMS.op, SHAPE, 21, 0, "cpu")["x"])
                                                    .any(dim=1)).any())
    for kw in ({"timed": True}, {"judged": False}):
        x = judge._inputs(SHAPE, 21, 0, **kw)["x"]
        assert not bool((x == 0).all(dim=1).any())


TEMPLATE = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
SCALE = "    const {{ ctype }} scale = {{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps));\n"
STORE = "    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * scale * w[k];\n"
VARIANTS = {
    # NaN where every element of the row is exactly 0 (a padding row), exact elsewhere
    "nan_on_a_zero_row": TEMPLATE.replace(SCALE, (
        "    bool allzero = true;\n"
        "    for (int64_t k = 0; k < N; ++k) allzero = allzero && xr[k] == {{ ctype }}(0);\n"
        "    const {{ ctype }} scale = allzero ? std::nan(\"\") : "
        "{{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps));\n")),
    # the row's first output zeroed where its first two elements are equal (quantized data's repeats)
    "a_tell_on_equal_neighbours": TEMPLATE.replace(STORE, STORE + "    if (N > 1 && xr[0] == xr[1]) orow[0] = 0;\n"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_kernel_wrong_only_on_structured_rows_is_wrong(name, tmp_path, project):
    assert TEMPLATE.count(SCALE) == 1 and TEMPLATE.count(STORE) == 1 and VARIANTS[name] != TEMPLATE
    r, out = eval_variant(project, tmp_path / name, name, VARIANTS[name], {"ACC": 8, "THREADS": 1, "UNROLL": 2})
    assert r.returncode != 0 and '"status": "wrong"' in out, out[-3000:]


def test_a_secret_half_of_the_grid_rows_hold_runs_of_equal_values():
    """Session 60: a grid row has equal neighbours only by chance (about one pair in 14 at 4 bits),
    and a kernel that zeroed an output where a row's first two elements were equal passed 12% of
    rmsnorm-cpu's trials (emulated, datasets/judge-redteam/s60-runs/). A secret half of the grid
    rows now hold runs: each element after the first the one before it at about half the places,
    as data held or repeated along a row has them; the values stay on the row's grid."""
    runs = coarse = 0
    for seed in range(6):
        full = inputs.make_inputs(RMS.op, SHAPE, seed, 0, "cpu", structured=True)
        plain = inputs.make_inputs(RMS.op, SHAPE, seed, 0, "cpu")
        x, p = full["x"], plain["x"]
        for i in range(1, SHAPE["M"] - 1):
            r = x[i]
            if torch.equal(r, p[i]) or bool((r == 0).all()) or not on_grid(r, inputs.STRUCTURED_BITS):
                continue
            if bool((torch.cat([x[:i], x[i + 1:]]) == r).all(dim=1).any()):
                continue  # a copy of another row
            same = float((r[1:] == r[:-1]).double().mean())
            if same > 0.35:
                runs += 1
                assert same < 0.65, same  # about half the places, not a constant row
            elif same < 0.2:
                coarse += 1
    assert runs >= 6 and coarse >= 6, (runs, coarse)
