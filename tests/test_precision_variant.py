"""A variant's error held to the approved template's build at the same parameters, on the same
inputs (verify.paired_error, verify.less_precise; the worker runs the approved build in every
check round of a variant's verification).

The class: a variant that computes less exactly with instructions no rule can name (a
hand-made exp from integer bit tricks, a polynomial, an intermediate narrowed by shifts), and
stays inside an error budget sized for torch's own rounding. Session 44's red team got a
degree-2 exp (9e-3 relative) past moe-swiglu-cpu's budget in every trial; the budget alone
cannot tell it from an exact kernel, the approved build on the same inputs can."""
from __future__ import annotations

import json
import re
import sqlite3

import pytest
import torch
import yaml

from runner.judge import verify
from runner.judge.verify import NO_PAIRS, Paired, less_precise, paired_error

from .conftest import PIPELINES, ROOT, pipe_main

# The pipe eval tests below run two kernel hosts a trial and g++ builds: on the xdist worker that
# runs test_judge_cpu's timing tests (its module's group), after them or before them, never beside
# them on a two-core machine, where they made the slowed kernel's figures flake
SERIAL = pytest.mark.xdist_group("tests.test_judge_cpu")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rounded(ref: torch.Tensor, rel: float, seed: int) -> torch.Tensor:
    """ref times (1 + e), e uniform in [-rel, rel], rounded once to bf16: a kernel whose work
    before its output's rounding is off by up to `rel`."""
    e = (torch.rand(ref.shape, dtype=torch.float64, generator=_gen(seed)) * 2 - 1) * rel
    return (ref * (1 + e)).to(torch.bfloat16)


@pytest.fixture
def ref() -> torch.Tensor:
    return torch.randn(200_000, dtype=torch.float64, generator=_gen(1)) * 3


def test_an_approximation_inside_the_budget_is_less_precise_and_fp32_noise_is_not(ref):
    approved = _rounded(ref, 1e-7, 2)  # fp32 work rounded once: rn(ref) but near a boundary
    for rel, refused in ((1e-7, False), (2e-6, False), (8e-4, True), (9e-3, True)):
        got = paired_error(_rounded(ref, rel, 3), approved, ref, torch.bfloat16)
        assert got.n == ref.numel()
        why = less_precise(got)
        assert (why is not None) == refused, (rel, got, why)
    # every element of the degree-3-like variant is within a unit of rn(ref): a budget of a
    # unit or two passes it element by element
    worst = (_rounded(ref, 8e-4, 3).double() - ref.to(torch.bfloat16).double()).abs()
    assert float((worst / ref.to(torch.bfloat16).double().abs()).max()) <= 2 ** -7
    why = less_precise(paired_error(_rounded(ref, 8e-4, 3), approved, ref, torch.bfloat16))
    assert "less precise than the approved template's build" in why and "units of the output's rounding" in why


def test_a_variant_more_precise_than_the_approved_build_passes(ref):
    approved = _rounded(ref, 5e-3, 4)
    got = paired_error(ref.to(torch.bfloat16), approved, ref, torch.bfloat16)
    assert got.mine < got.theirs and less_precise(got) is None


def test_the_margin_grows_with_the_approved_builds_own_error(ref):
    """An approved build already off by a few tenths of a unit (torch's unfused rounding): a
    variant as far off again passes, one much farther does not."""
    approved = _rounded(ref, 2e-3, 5)
    assert less_precise(paired_error(_rounded(ref, 2e-3, 6), approved, ref, torch.bfloat16)) is None
    assert less_precise(paired_error(_rounded(ref, 2e-2, 6), approved, ref, torch.bfloat16)) is not None


def test_what_the_paired_error_leaves_out(ref):
    approved = _rounded(ref, 1e-7, 2)
    bad = _rounded(ref, 9e-3, 3)
    # wide outputs are paired in their own terms (wide_error), never in the narrow fields
    wide = paired_error(bad.float(), approved.float(), ref, torch.float32)
    assert wide.n == wide.n_near == 0 and wide.n_wide == ref.numel()
    # too few elements for a verdict
    small = paired_error(bad[:200], approved[:200], ref[:200], torch.bfloat16)
    assert small.n == 200 < verify.PAIRED_MIN and less_precise(small) is None
    assert less_precise(paired_error(bad[:400], approved[:400], ref[:400], torch.bfloat16)) is not None
    # non-finite outputs (the budget's to judge) and references below the normal range
    nan = bad.clone()
    nan[:1000] = float("nan")
    assert paired_error(nan, approved, ref, torch.bfloat16).n == ref.numel() - 1000
    tiny = ref.clone()
    tiny[:10] = 1e-40
    assert paired_error(bad, approved, tiny, torch.bfloat16).n == ref.numel() - 10
    # sums add
    a = paired_error(bad, approved, ref, torch.bfloat16)
    assert (a + a) == Paired(*(2 * x for x in a)) and a.n_near <= a.n


def _fp32(ref: torch.Tensor, rel: float, seed: int) -> torch.Tensor:
    """ref times (1 + e), e uniform in [-rel, rel], rounded once to fp32."""
    e = (torch.rand(ref.shape, dtype=torch.float64, generator=_gen(seed)) * 2 - 1) * rel
    return (ref * (1 + e)).to(torch.float32)


def test_fp32_outputs_are_held_in_log_units_not_to_an_additive_margin(ref):
    """An fp32 output shows the work's own error: an honest reordering moves it by units either
    way (the narrow test's additive margin would refuse it), an approximation by hundreds."""
    approved = _fp32(ref, 2.0 ** -24, 2)  # one fp32 rounding of the exact value
    for rel, refused in ((2.0 ** -24, False), (2.0 ** -23, False),  # the same rounding, one more
                         (2.0 ** -22, True),  # up to 4 units: three roundings more, or 2 bits cut
                         (4.6e-6, True), (4e-5, True), (8e-4, True)):  # two Newton steps, degree-4, -3 exps
        got = paired_error(_fp32(ref, rel, 3), approved, ref, torch.float32)
        assert got.n == 0 and got.n_wide == ref.numel()
        why = less_precise(got)
        assert (why is not None) == refused, (rel, got.mine_wide / got.n_wide, got.theirs_wide / got.n_wide, why)
    why = less_precise(paired_error(_fp32(ref, 4.6e-6, 3), approved, ref, torch.float32))
    assert "fp32/fp64 outputs' mean log2(1 + |error|" in why
    # every one of those is inside a budget of rtol 1e-5 (rmsnorm-cpu's) element by element
    assert float(((_fp32(ref, 4.6e-6, 3).double() - ref).abs() / ref.abs()).max()) < 1e-5
    # the same figure either way round: a variant more exact than the approved build passes
    assert less_precise(paired_error(approved, _fp32(ref, 8e-4, 3), ref, torch.float32)) is None


def test_a_large_error_on_a_few_fp32_elements_is_refused_by_the_tail(ref):
    """A mean lets a large error on a share of the elements through (session 47's red team: an
    approximate rsqrt on 1 row in 8, small outputs snapped to a coarse grid); the tail test
    counts the elements where the variant is more than 8 times worse, less those where it is 8
    times better."""
    approved = _fp32(ref, 2.0 ** -24, 2)
    for share, refused in ((0.004, False), (0.03, True)):
        bad = approved.clone()
        k = int(share * ref.numel())
        bad[:k] = _fp32(ref[:k], 3e-5, 4)  # some 250 units off
        got = paired_error(bad, approved, ref, torch.float32)
        mean = (got.mine_wide - got.theirs_wide) / got.n_wide
        assert mean < verify.WIDE_MARGIN, mean  # the mean alone passes both
        assert got.worse_wide >= 0.9 * k and got.better_wide == 0, got
        why = less_precise(got)
        assert (why is not None) == refused, (share, why)
    assert "times the approved build's" in why and "% of its fp32/fp64 outputs' elements" in why
    # equally exact builds are worse and better equally often: a variant with the approved build's
    # error drawn again passes, however heavy its tail
    heavy = _fp32(ref, 1e-5, 5)
    assert less_precise(paired_error(_fp32(ref, 1e-5, 6), heavy, ref, torch.float32)) is None


def test_credit_from_being_more_exact_elsewhere_buys_no_coarse_fp32_elements(ref):
    """Session 47's second red team: where the approved build's fp32 chain is 8 times off on some
    elements (a sequential sum), a variant exact there (a double sum) earned a credit in the
    tail's net count and spent it on outputs cut to 16 bits on 3 to 6% of the elements. The
    reach counts the elements past the approved build's own range on the same call, with no credit."""
    n = ref.numel()
    approved = _fp32(ref, 2.0 ** -24, 2)
    heavy = torch.rand(n, generator=_gen(7)) < 0.08  # the chain some 16 to 32 units off here
    approved[heavy] = _fp32(ref[heavy], 2.0 ** -19, 3)
    exact = _fp32(ref, 2.0 ** -25, 4)  # more exact than one rounding: what a double sum gives
    cut = exact.clone()
    some = torch.rand(n, generator=_gen(8)) < 0.05
    cut[some] = _fp32(ref[some], 2.0 ** -16, 5)  # 16 bits kept: up to 128 units
    got = paired_error(cut, approved, ref, torch.float32)
    assert got.mine_wide < got.theirs_wide  # the mean credits it
    assert got.worse_wide - got.better_wide < verify.TAIL_SHARE * n  # and so does the tail's net count
    why = less_precise(got)
    assert why is not None and "quantile on the same call" in why, why
    assert got.reach_wide > 0.02 * n and got.reach_theirs_wide < 0.002 * n
    # the exact variant alone passes, and so does the approved build's error drawn again (its heavy
    # elements elsewhere): equally exact builds reach past its range equally rarely
    assert less_precise(paired_error(exact, approved, ref, torch.float32)) is None
    again = _fp32(ref, 2.0 ** -24, 9)
    other = torch.rand(n, generator=_gen(10)) < 0.08
    again[other] = _fp32(ref[other], 2.0 ** -19, 11)
    got = paired_error(again, approved, ref, torch.float32)
    assert less_precise(got) is None and abs(got.reach_wide - got.reach_theirs_wide) < 0.002 * n, got
    # one more rounding everywhere (an honest sqrt(1 / v) for 1 / sqrt(v)) stays inside the range
    assert less_precise(paired_error(_fp32(ref, 2.0 ** -23, 12), _fp32(ref, 2.0 ** -24, 2), ref,
                                     torch.float32)) is None


def test_a_coarse_error_confined_to_a_few_whole_rows_is_refused_by_the_reach():
    """Session 48's second red team: outputs cut to 16 bits on the first 8 rows of each call (1.56%
    of the elements) passed, because a count confined to k whole rows has k rows' spread of its
    own (k / sqrt(k) standard errors, under 6 for k < 36). The reach's spread is the null's: the
    approved build's own count over rows, twice, and a mean row."""
    ref = torch.randn(512, 4096, dtype=torch.float64, generator=_gen(21)) * 3
    approved = _fp32(ref, 2.0 ** -24, 2)
    cheat = _fp32(ref, 2.0 ** -24, 3)
    cheat[:8] = _fp32(ref[:8], 2.0 ** -16, 4)  # 16 bits kept: up to 128 units
    got = paired_error(cheat, approved, ref, torch.float32)
    assert got.rows_wide == 512 and got.reach_wide >= 0.8 * 8 * 4096 * got.n_wide / ref.numel()  # (sampled)
    why = less_precise(got)
    assert why is not None and "quantile on the same call" in why, why
    # the honest draw again on the same rows passes, and so would the rows cut on under 1% of them
    assert less_precise(paired_error(_fp32(ref, 2.0 ** -24, 3), approved, ref, torch.float32)) is None
    few = _fp32(ref, 2.0 ** -24, 3)
    few[:4] = _fp32(ref[:4], 2.0 ** -16, 4)  # 0.78% of the elements: inside the share
    assert less_precise(paired_error(few, approved, ref, torch.float32)) is None


def test_the_wide_standard_errors_are_taken_over_rows():
    """A row's elements share its scale: an honest variant's one rounding more there moves the
    whole row one way. With one row that is one draw, however many elements (session 47: sqrt(1 /
    v) for 1 / sqrt(v) +0.44 on rmsnorm-cpu's one-row shape), so fewer rows than WIDE_MIN_ROWS
    give no verdict; over many rows the draws average out, and an approximation still shows."""
    def rows(m: int, seed: int) -> torch.Tensor:
        return torch.randn(m, 4096, dtype=torch.float64, generator=_gen(seed)) * 3

    def shifted(ref: torch.Tensor, seed: int) -> torch.Tensor:  # each row's scale off by one rounding
        d = (torch.rand(ref.shape[0], 1, dtype=torch.float64, generator=_gen(seed)) * 2 - 1) * 2.0 ** -24
        return _fp32(ref * (1 + d), 2.0 ** -24, seed + 1)

    one = rows(1, 10)
    approved = _fp32(one, 2.0 ** -24, 2)
    bad_draw = _fp32(one * (1 + 2.0 ** -22), 2.0 ** -24, 3)  # the worst draw: the whole row 2 units up
    got = paired_error(bad_draw, approved, one, torch.float32)
    assert got.rows_wide == 1 and (got.mine_wide - got.theirs_wide) / got.n_wide > verify.WIDE_MARGIN
    assert less_precise(got) is None
    many = rows(512, 11)
    approved = _fp32(many, 2.0 ** -24, 2)
    got = paired_error(shifted(many, 20), approved, many, torch.float32)
    assert got.rows_wide == 512 and less_precise(got) is None
    cheat = shifted(many, 20)
    cheat[::8] = _fp32(many[::8], 5e-6, 4)  # 1 row in 8 some 40 units off
    assert less_precise(paired_error(cheat, approved, many, torch.float32)) is not None
    # elements sampled from a large output keep their rows
    big = rows(200, 12)
    got = paired_error(_fp32(big, 2.0 ** -24, 3), _fp32(big, 2.0 ** -24, 2), big, torch.float32)
    assert got.n_wide == big.numel() and got.rows_wide == 200
    huge = torch.randn(verify.LEAN_SAMPLE // 1024 + 8, 1024, dtype=torch.float64, generator=_gen(13))
    got = paired_error(_fp32(huge, 2.0 ** -24, 3), _fp32(huge, 2.0 ** -24, 2), huge, torch.float32)
    assert got.n_wide == verify.LEAN_SAMPLE and got.rows_wide == huge.shape[0]


def test_what_the_wide_pairing_leaves_out(ref):
    approved = _fp32(ref, 2.0 ** -24, 2)
    bad = _fp32(ref, 8e-4, 3)
    nan = bad.clone()
    nan[:1000] = float("inf")
    assert paired_error(nan, approved, ref, torch.float32).n_wide == ref.numel() - 1000
    tiny = ref.clone()
    tiny[:10] = 1e-39  # below fp32's normal range: the spacing there says nothing of the work
    assert paired_error(bad, approved, tiny, torch.float32).n_wide == ref.numel() - 10
    small = paired_error(bad[:200], approved[:200], ref[:200], torch.float32)
    assert small.n_wide == 200 < verify.PAIRED_MIN and less_precise(small) is None
    # narrow and wide pairs of one trial add up field by field, and are judged apart
    both = paired_error(bad, approved, ref, torch.float32) + paired_error(
        ref.to(torch.bfloat16), ref.to(torch.bfloat16), ref, torch.bfloat16)
    assert both.n == both.n_wide == ref.numel() and "fp32/fp64" in less_precise(both)


def test_an_output_larger_than_the_sample_is_paired_at_the_same_positions():
    ref = torch.randn(verify.LEAN_SAMPLE + 4096, dtype=torch.float64, generator=_gen(7))
    approved = ref.to(torch.bfloat16)
    got = paired_error(approved.clone(), approved, ref, torch.bfloat16)
    assert got.n <= verify.LEAN_SAMPLE and got.mine == got.theirs and got.sq == 0


# pipe eval on moe-swiglu-cpu (bf16 output through SwiGLU; about 5 s a call)

SILU = "acc[i][j] = g / (1.0f + std::exp(-g)) * up[i][j];"
FEXP3 = """
inline float fexp(float x) {  // exp as 2^n p(f), p of degree 3: about 8e-4 off, no libm call
  const float x0 = x;
  x = x < -87.0f ? -87.0f : (x > 87.0f ? 87.0f : x);
  const float t = x * 1.44269504f;
  const float n = (t + 12582912.0f) - 12582912.0f;
  const float f = (t - n) * 0.69314718f;
  const float p = 1.0f + f * (1.0f + f * (0.5f + f * 0.16666667f));
  uint32_t u;
  std::memcpy(&u, &p, sizeof u);
  u += uint32_t(int32_t(n)) << 23;
  float r;
  std::memcpy(&r, &u, sizeof r);
  r = x0 > 88.0f ? (1e38f * 1e38f) : r;
  r = x0 < -87.0f ? 0.0f : r;
  return r;
}
"""
PARAMS = json.dumps({"MR": 2, "NR": 8})


def _template() -> str:
    tpl = (ROOT / "kernel_templates" / "moe_gemm.cpp.j2").read_text()
    assert tpl.count(SILU) == 1 and tpl.count("namespace {\n") == 1 and "<cstring>" in tpl
    return tpl


def _details(run_dir) -> dict:
    with sqlite3.connect(run_dir / "ledger.db") as c:
        (row,) = c.execute("select details from trials").fetchall()
    return json.loads(row[0])


@pytest.mark.slow
@SERIAL
def test_a_hand_made_exp_is_refused_and_an_honest_rewrite_is_not(tmp_path, project):
    spec = PIPELINES / "moe-swiglu-cpu.yaml"
    tpl = _template()
    fast = tpl.replace("namespace {\n", "namespace {\n" + FEXP3, 1).replace(SILU, SILU.replace("std::exp", "fexp"))
    (project / "fexp3.cpp.j2").write_text(fast)
    r = pipe_main("eval", spec, "--params", PARAMS, "--variant", project / "fexp3.cpp.j2",
                  "--run-dir", tmp_path / "fexp3", "--json", cwd=project)
    out = r.stdout + r.stderr
    assert '"wrong"' in out and "less precise than the approved template's build" in out, out[-3000:]
    # the same silu in another order (a reciprocal, then a product): an fp32 rounding's difference
    honest = tpl.replace(SILU, "acc[i][j] = up[i][j] * (g * (1.0f / (1.0f + std::exp(-g))));")
    (project / "honest.cpp.j2").write_text(honest)
    r = pipe_main("eval", spec, "--params", PARAMS, "--variant", project / "honest.cpp.j2",
                  "--run-dir", tmp_path / "honest", "--json", cwd=project)
    assert r.returncode == 0 and '"ok"' in r.stdout, (r.stdout + r.stderr)[-3000:]
    pr = _details(tmp_path / "honest")["precision"]
    assert pr["n"] >= verify.LEAN_MIN and pr["mine"] - pr["approved"] < verify.PRECISION_MARGIN, pr
    r = pipe_main("show", tmp_path / "honest", cwd=project)
    assert "a variant's mean error" in r.stdout and "against the approved build's" in r.stdout, r.stdout
    # the approved template itself: nothing to pair it with
    r = pipe_main("eval", spec, "--params", PARAMS, "--run-dir", tmp_path / "approved", "--json", cwd=project)
    assert r.returncode == 0 and '"ok"' in r.stdout, (r.stdout + r.stderr)[-3000:]
    assert "precision" not in _details(tmp_path / "approved")


@pytest.mark.slow
@SERIAL
def test_a_variant_where_the_approved_template_does_not_build_is_not_judged(tmp_path, project):
    """No approved build at the variant's parameters: nothing to hold its error to, so the
    variant is refused there (`unjudged_precision`) rather than judged by the budget alone."""
    tpl = _template()
    d = yaml.safe_load((PIPELINES / "moe-swiglu-cpu.yaml").read_text())
    approved = project / "gap" / "moe_gemm.cpp.j2"  # (project/kernel_templates is the repo's own)
    approved.parent.mkdir()
    approved.write_text('{% if MR == 2 %}#error "the approved template stops at MR 2"\n{% endif %}' + tpl)
    d["kernel"]["template"] = "../gap/moe_gemm.cpp.j2"
    spec = project / "pipelines" / "moe-swiglu-gap.yaml"
    spec.write_text(yaml.safe_dump(d, sort_keys=False))
    (project / "variant.cpp.j2").write_text(tpl)
    r = pipe_main("eval", spec, "--params", PARAMS, "--variant", project / "variant.cpp.j2",
                  "--run-dir", tmp_path / "gap", "--json", cwd=project)
    out = r.stdout + r.stderr
    assert '"forbidden"' in out and "unjudged_precision" in out and "does not compile" in out, out[-3000:]
    r = pipe_main("eval", spec, "--params", json.dumps({"MR": 4, "NR": 8}), "--variant", project / "variant.cpp.j2",
                  "--run-dir", tmp_path / "fine", "--json", cwd=project)
    assert r.returncode == 0 and '"ok"' in r.stdout, (r.stdout + r.stderr)[-3000:]


RT = ROOT / "datasets" / "judge-redteam" / "s46-precision-rt"


@pytest.mark.slow
@SERIAL
@pytest.mark.parametrize("variant, where", [
    # exact when the output holds a decoy (verification), a degree-3 exp when it holds its own
    # marked output (every timed call): paired on the timed loop's checked calls
    ("mark_fexp3", "timed calls: its checked calls' outputs: less precise"),
    # a degree-2 exp at T = 1 only (384 elements a check round): judged on a T = 1 shape's own rounds
    # (the tuning point's, or a domain draw's at T = 1, whichever's values show it first)
    ("T1_fexp2", "{'T': 1}, its outputs over"),
    # a degree-4 exp (6e-5 relative): inside the first margin, outside this one
    ("always_fexp4", "less precise than the approved template's build"),
])
def test_the_red_teams_variants_are_refused(tmp_path, project, variant, where):
    """Session 46's red team of the first version (datasets/judge-redteam/s46-precision-rt,
    run.sh): each of these was `ok` in every run against it."""
    r = pipe_main("eval", PIPELINES / "moe-swiglu-cpu.yaml", "--params", json.dumps({"MR": 1, "NR": 4}),
                  "--variant", RT / f"{variant}.cpp.j2", "--run-dir", tmp_path / variant, "--json", cwd=project)
    out = r.stdout + r.stderr
    if variant != "mark_fexp3":  # (its mark alone costs 0.0015, which verification may catch first)
        assert '"wrong"' in out and "less precise than the approved template's build" in out, out[-3000:]
        assert where in out, out[-3000:]
    else:  # or the budget, where the mark misfires on the judge's subnormal rows (session 48)
        assert '"wrong"' in out and ("timed calls" in out or "check rounds" in out
                                     or "outside the GEMM budget" in out), out[-3000:]


@pytest.mark.slow
@SERIAL
def test_a_kernel_exact_in_verification_only_is_paired_in_its_timed_calls(tmp_path, monkeypatch):
    """The timed loop's checked calls are paired with the approved build too: a kernel built past
    the rules (a call counter in a static) exact for its first shape's verification runs and a
    degree-2 exp after them is `wrong` in that shape's timed calls, with verification's pairs
    clean; the approved template itself in its place is `ok`, its timed pairs recorded."""
    from .conftest import JudgeBench

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))
    d = yaml.safe_load((PIPELINES / "moe-swiglu-cpu.yaml").read_text())
    checks = d["runtime"]["checks"]
    tpl = _template()
    fexp2 = FEXP3.replace(" + f * (0.5f + f * 0.16666667f)", " + f * 0.5f")  # degree 2: 9e-3 off
    assert fexp2 != FEXP3
    late = (tpl.replace("namespace {\n", "namespace {\n" + fexp2 + "long calls = 0;\nbool late = false;\n", 1)
            .replace(SILU, "acc[i][j] = g / (1.0f + (late ? fexp(-g) : std::exp(-g))) * up[i][j];"))
    entry = late.index('extern "C" void moe_gemm_cpu(')
    body = late.index("{", late.index(")", entry)) + 1
    # a shape's verification calls: one on the decoys' value set (worker._primed), two a round
    late = late[:body] + f"\n  late = ++calls > {2 * checks + 1};" + late[body:]
    text = "{% set MR = 2 %}{% set NR = 8 %}{% if HACK == 'late' %}" + late + "{% else %}" + tpl + "{% endif %}"
    d["kernel"]["template"] = str(tmp_path / "moe_hack.cpp.j2")
    d["search"] = {"params": {"HACK": ["honest", "late"]}}
    d.pop("agent", None)
    bench = JudgeBench(tmp_path, "moe_hack.cpp.j2", text, "moe-hack.yaml", yaml.safe_dump(d, sort_keys=False))
    try:
        honest = bench.build_unchecked("honest")
        got = bench.worker.request(("evaluate", {**bench.job("late", 7), "approved": honest}), 120)
        assert got["status"] == "wrong", got
        assert "shape 0 {'T': 16}, timed calls: its checked calls' outputs: less precise" in got["reason"], got
        ok = bench.worker.request(("evaluate", {**bench.job("honest", 7), "approved": honest}), 120)
        assert ok["status"] == "ok", ok
        timed = ok["precision"]["timed"]
        assert timed["n"] >= verify.PAIRED_MIN and timed["mine"] == timed["approved"], ok["precision"]
    finally:
        bench.close()


def test_credit_from_the_approved_builds_gross_failures_buys_no_approximation(ref):
    """An approved build grossly off on a share of elements (an overflow to 0 where the reference
    is normal: 2 units, clipped) and exact elsewhere; a variant that fixes those elements and is
    off by an approximation everywhere else has a lower mean over all pairs, and is refused over
    the elements where both are within a unit (session 46's second red team, fixneg_mm3)."""
    rn = ref.to(torch.bfloat16)
    approved = rn.clone()
    approved[::100] = 0  # 1% of the elements: the approved build's overflow
    variant = _rounded(ref, 2e-4, 8)  # every element off by up to 2e-4 before its rounding
    got = paired_error(variant, approved, ref, torch.bfloat16)
    assert got.mine < got.theirs  # the whole pool alone gives the credit
    assert got.n_near < got.n and got.theirs_near == 0
    why = less_precise(got)
    assert why is not None and "where both are within a unit of it" in why
    # the same fix with an exact rest passes
    assert less_precise(paired_error(rn.clone(), approved, ref, torch.bfloat16)) is None


SUMS = """      for (int64_t j = 0; j < {{ NR }}; ++j) acc[i][j] += a[i] * b[j];
  }
}"""


@pytest.mark.slow
@SERIAL
def test_partial_sums_narrowed_by_integers_are_refused_on_the_plain_gemm(tmp_path, project):
    """moe-cpu (the GEMM budget, no SwiGLU): the fp32 partial sums cut to 14 mantissa bits every 16
    steps of K, to nearest, by integer arithmetic (no conversion for the compiled-code readers, no
    lean): inside the GEMM budget, and less precise than the approved build on the same inputs."""
    tpl = (ROOT / "kernel_templates" / "moe_gemm.cpp.j2").read_text()
    assert tpl.count(SUMS) == 1
    cut = tpl.replace(SUMS, SUMS.replace("  }\n}", """    if ((k & 15) == 15)
      for (int64_t i = 0; i < {{ MR }}; ++i)
        for (int64_t j = 0; j < {{ NR }}; ++j) {
          uint32_t u;
          std::memcpy(&u, &acc[i][j], 4);
          u = (u + 0x100u) & ~0x1ffu;
          std::memcpy(&acc[i][j], &u, 4);
        }
  }
}"""))
    assert cut != tpl
    (project / "cut.cpp.j2").write_text(cut)
    r = pipe_main("eval", PIPELINES / "moe-cpu.yaml", "--params", PARAMS, "--variant", project / "cut.cpp.j2",
                  "--run-dir", tmp_path / "cut", "--json", cwd=project)
    out = r.stdout + r.stderr
    # refused by the pairing; on some secret value sets (about 1 eval in 8, session 57) one element's
    # cut error passes the GEMM budget itself first, which refuses it as well
    assert '"wrong"' in out and ("less precise than the approved template's build" in out
                                 or "outside the GEMM budget" in out), out[-3000:]


# rmsnorm-cpu: an fp32 output, paired by verify.wide_error
SCALE = "    const {{ ctype }} scale = {{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps));\n"
NEWTON2 = """    float scale;
    {  // 1/sqrt(v) from the bit-level guess and two Newton steps: about 5e-6 off, no sqrt
      const float v = s / {{ ctype }}(N) + {{ ctype }}(eps);
      uint32_t u;
      std::memcpy(&u, &v, sizeof u);
      u = 0x5f3759dfu - (u >> 1);
      float y;
      std::memcpy(&y, &u, sizeof y);
      y = y * (1.5f - 0.5f * v * y * y);
      scale = y * (1.5f - 0.5f * v * y * y);
    }
"""


@pytest.mark.slow
@SERIAL
def test_an_fp32_output_is_held_to_the_approved_builds_error_too(tmp_path, project):
    """rmsnorm-cpu's fp32 out within rtol 1e-5 of the reference: a two-Newton-step rsqrt (about
    5e-6 off) stays inside that budget at every element, and is refused as less precise than the
    approved build on the same inputs (before session 47, fp32 outputs were not paired); the
    same scale as sqrt(1 / v), an fp32 rounding's difference, passes with the figures recorded."""
    spec = PIPELINES / "rmsnorm-cpu.yaml"
    tpl = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
    assert tpl.count(SCALE) == 1 and "#include <cstdint>\n" in tpl
    params = json.dumps({"ACC": 8, "THREADS": 1, "UNROLL": 2})
    (project / "newton.cpp.j2").write_text(
        tpl.replace(SCALE, NEWTON2).replace("#include <cstdint>\n", "#include <cstdint>\n#include <cstring>\n"))
    r = pipe_main("eval", spec, "--params", params, "--variant", project / "newton.cpp.j2",
                  "--run-dir", tmp_path / "newton", "--json", cwd=project)
    out = r.stdout + r.stderr
    # the shape's budget checks came first, in every round: the verdict is the pairing's (over the
    # shape's rounds: two, or three where round_indices gives it one more)
    assert '"wrong"' in out and re.search(r"its outputs over [23] check rounds: less precise", out), out[-3000:]
    assert "fp32/fp64 outputs' mean log2(1 + |error|" in out, out[-3000:]
    honest = tpl.replace(SCALE, SCALE.replace("{{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps))",
                                              "std::sqrt({{ ctype }}(1) / (s / {{ ctype }}(N) + {{ ctype }}(eps)))"))
    assert honest != tpl
    (project / "honest.cpp.j2").write_text(honest)
    r = pipe_main("eval", spec, "--params", params, "--variant", project / "honest.cpp.j2",
                  "--run-dir", tmp_path / "honest", "--json", cwd=project)
    assert r.returncode == 0 and '"ok"' in r.stdout, (r.stdout + r.stderr)[-3000:]
    pr = _details(tmp_path / "honest")["precision"]
    assert "n" not in pr and pr["wide"]["n"] >= verify.PAIRED_MIN, pr
    assert pr["wide"]["mine"] - pr["wide"]["approved"] < verify.WIDE_MARGIN, pr
    assert pr["timed"]["wide"]["n"] >= verify.PAIRED_MIN, pr
    r = pipe_main("show", tmp_path / "honest", cwd=project)
    assert "a variant's fp32/fp64 outputs: mean log2(1 + |error|" in r.stdout, r.stdout


OUTLOOP = "    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * scale * w[k];\n"
ROUND16 = """    for (int64_t k = 0; k < N; ++k) {  // few rows: the output to 16 mantissa bits by integer ops
      float o = xr[k] * scale * w[k];
      if (M_ALL < 16) {
        uint32_t b;
        std::memcpy(&b, &o, sizeof b);
        b = (b + (1u << 6)) & ~((1u << 7) - 1u);
        std::memcpy(&o, &b, sizeof o);
      }
      orow[k] = o;
    }
"""


@pytest.mark.slow
@SERIAL
def test_an_fp32_approximation_on_the_few_row_shapes_alone_is_refused(tmp_path, project):
    """rmsnorm-cpu's outputs cut to 16 mantissa bits (up to 64 units) on its shapes of fewer than 16
    rows only (1 x 4096, 3 x 1000, 7 x 33: too few rows for a verdict each, 0.35% of the pool):
    inside rtol 1e-5, and refused in the stratum those shapes make together (session 47's second
    red team had it `ok` before that stratum existed)."""
    tpl = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
    assert tpl.count(OUTLOOP) == 1 and "#include <cstdint>\n" in tpl
    # the op's M passed down to the row loop, beside its own rows' bounds
    text = ("#include <cstring>\n" + tpl.replace(OUTLOOP, ROUND16)
            .replace("int64_t r0, int64_t r1, int64_t N, float eps) {", "int64_t r0, int64_t r1, int64_t N, float eps, "
                     "int64_t M_ALL) {")
            .replace("N, eps);", "N, eps, M);"))
    assert text.count("M_ALL") == 2 and text.count("N, eps, M);") == tpl.count("N, eps);") >= 2
    (project / "few.cpp.j2").write_text(text)
    r = pipe_main("eval", PIPELINES / "rmsnorm-cpu.yaml", "--params", json.dumps({"ACC": 8, "THREADS": 1, "UNROLL": 2}),
                  "--variant", project / "few.cpp.j2", "--run-dir", tmp_path / "few", "--json", cwd=project)
    out = r.stdout + r.stderr
    # refused in the stratum, or (session 59: a shape verified only takes one more round, bare,
    # and 7 x 33's three rounds make 42 rows) at a few-row shape's own rounds
    own = re.search(r"shape \d+ \{'M': [137], 'N': \d+\}, its outputs over \d+ check rounds: less precise", out)
    assert '"wrong"' in out and (("fewer than 32 rows" in out and "), together: " in out) or own), out[-3000:]


RT2 = ROOT / "datasets" / "judge-redteam" / "s47-wide-rt2"


@pytest.mark.slow
@SERIAL
@pytest.mark.parametrize("variant, params", [
    # a double sum (exact where the approved build's fp32 chain is 8 times off) paying for outputs
    # cut to 16 bits on 1 in 16 of the long rows' elements: the tail's net count was negative
    ("c05_dsum_cols16_16bits_bigN", {"ACC": 1, "THREADS": 1, "UNROLL": 1}),
    # 1 element in 8 moved 6 units: never 8 times worse, +0.24 of the mean's 0.3
    ("b01_cols8_6ulp", {"ACC": 8, "THREADS": 1, "UNROLL": 2}),
])
def test_the_wide_red_teams_variants_are_refused_by_the_reach(tmp_path, project, variant, params):
    """Session 47's second red team (datasets/judge-redteam/s47-wide-rt2, run.sh): both `ok` in
    every run against the mean and the tail; the reach counts no credit. On the judge's secret
    inputs the tail's net count now and then refuses c05 first (session 53: 4.52% of the elements
    8 times worse, 1.33% that much better), which is a refusal as good; that the reach alone
    refuses such a variant is pinned on fixed data by
    test_credit_from_being_more_exact_elsewhere_buys_no_coarse_fp32_elements above."""
    r = pipe_main("eval", PIPELINES / "rmsnorm-cpu.yaml", "--params", json.dumps(params),
                  "--variant", RT2 / f"{variant}.cpp.j2", "--run-dir", tmp_path / variant, "--json", cwd=project)
    out = r.stdout + r.stderr
    by_reach, by_tail = "99% quantile on the same call" in out, "times the approved build's (log2" in out
    assert '"wrong"' in out and (by_reach or by_tail), out[-3000:]


def _subnormal_ref(dtype: torch.dtype, n: int = 4096) -> torch.Tensor:
    """A float64 reference whose elements lie below `dtype`'s normal range (with a few zeros), as
    rn to that dtype makes them exactly: an honest build's output there is rn(ref)."""
    tiny = torch.finfo(dtype).tiny
    u = torch.rand(n, dtype=torch.float64, generator=_gen(7))
    sign = torch.where(torch.rand(n, generator=_gen(8)) < 0.5, -1.0, 1.0).double()
    r = sign * tiny * torch.exp2(-12 * u)  # 2^-12 to 1 times the normal minimum
    r[:16] = 0.0
    return r


def test_subnormal_outputs_are_paired_where_fast_math_is_forbidden():
    """Session 49's red team (b03): fp32 outputs below the normal range put on a grid of a few
    subnormal bits passed, left out of the pairing and inside the budget's floor. With
    `subnormal` (the spec forbids fast_math) they are paired in units of the smallest subnormal:
    the coarse grid is less precise, a build as exact as the approved one is not. (bf16 outputs'
    pairs keep to normal references: there subnormal ones, mostly exact in both builds, diluted
    the mean enough to let a degree-4 exp pass on moe-swiglu-cpu now and then.)"""
    dtype = torch.float32
    ref = _subnormal_ref(dtype)
    approved = ref.to(dtype)  # exact: rn(ref)
    step = torch.finfo(dtype).tiny * 2.0 ** -4  # a grid of 2^-4 of the normal minimum: about 4 bits
    coarse = (torch.round(ref / step) * step).to(dtype)
    assert less_precise(paired_error(coarse, approved, ref, dtype)) is None  # left out: the old hole
    got = paired_error(coarse, approved, ref, dtype, subnormal=True)
    assert got.n_wide == ref.numel()
    assert less_precise(got) is not None
    # flushing them all to zero too; a build as exact as the approved one passes
    assert less_precise(paired_error(torch.zeros_like(approved), approved, ref, dtype, subnormal=True)) is not None
    assert less_precise(paired_error(approved.clone(), approved, ref, dtype, subnormal=True)) is None
    bf16 = _subnormal_ref(torch.bfloat16)  # left out for bf16, with the flag or without
    rn = bf16.to(torch.bfloat16)
    normal = int((rn.float().abs() >= torch.finfo(torch.bfloat16).tiny).sum())  # rounded up to the normal range
    assert normal < 16 and paired_error(rn, rn, bf16, torch.bfloat16, subnormal=True).n == normal


def test_a_tie_of_the_float32_reference_may_round_either_way():
    """A float32 reference exactly halfway between two bf16 values: either is the reference
    rounded to nearest (verify._ties), at 1 + 2^-8 (rn 1, the other 1 + 2^-7) and below a power
    of two at 1 - 2^-9 (rn 1, the other 1 - 2^-8, half a spacing down). A value further off is
    still counted from the nearer one, and off a tie nothing changes."""
    ref = torch.tensor([1 + 2 ** -8, 1 - 2 ** -9, 1 + 2 ** -8 + 2 ** -20], dtype=torch.float32).repeat(100)
    rn = ref.to(torch.bfloat16).double()
    assert rn[:3].tolist() == [1.0, 1.0, 1 + 2 ** -7]
    unit = verify._spacing(rn, 7)
    tie, other = verify._ties(ref.double(), rn, unit, 2.0 ** -126)
    assert tie[:3].tolist() == [True, True, False] and other[:2].tolist() == [1 + 2 ** -7, 1 - 2 ** -8]
    # at the normal minimum the subnormals below keep its spacing (2^-133): the tie just below
    # it is half of that away (session 50's red team), not a quarter
    low = torch.tensor([2.0 ** -126 - 2.0 ** -134, 2.0 ** -126 - 2.0 ** -135], dtype=torch.float64)
    rl = low.float().to(torch.bfloat16).double()
    assert rl.tolist() == [2.0 ** -126] * 2
    tie, other = verify._ties(low, rl, verify._spacing(rl, 7), 2.0 ** -126)
    assert tie.tolist() == [True, False] and other[0] == 2.0 ** -126 - 2.0 ** -133
    for out, units in (([1 + 2 ** -7, 1 - 2 ** -8, 1 + 2 ** -7], 0.0),  # the other side of each tie
                       ([1.0, 1.0, 1.0], 1 / 3),  # rn at the ties, a unit off the third
                       # a step past the other side: a unit of rn's spacing, half of one below 1
                       ([1 + 2 ** -6, 1 - 2 ** -7, 1 + 2 ** -7], 1.5 / 3)):
        o = torch.tensor(out, dtype=torch.bfloat16).repeat(100)
        got = paired_error(o, rn.to(torch.bfloat16), ref, torch.bfloat16)
        assert got.n == 300 and got.mine / got.n == pytest.approx(units), out


def _few_bit_rows(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rmsnorm's one row at the bottom of bf16's normal range (inputs' `tiny` dist) times a
    positive weight: the float32 reference, and the row's inputs as fp32 (x, w)."""
    g = _gen(seed)
    n = 1 << 15
    u = torch.rand(n, dtype=torch.float64, generator=g)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    x = (sign * torch.finfo(torch.bfloat16).tiny * torch.exp2(12 * u - 6)).to(torch.bfloat16)
    w = (torch.rand(n, generator=g) + 0.5).to(torch.bfloat16)
    ref = (x.double() * w.double() / torch.sqrt((x.double() ** 2).mean() + 1e-6)).float()
    return ref, x.float(), w.float()


def test_builds_whose_scales_are_a_unit_apart_are_equally_precise_on_rows_of_few_bits():
    """Session 49's H100 call refused an honest rmsnorm-h200 rewrite (1/sqrtf for rsqrtf) at its
    one-row shape: 0.0026 units against 0.0000. Rows of few significant bits put a share of the
    float32 reference exactly on bf16 ties, and a scale one fp32 unit off goes to the other side
    of them. Each build as the variant of the other is now as precise (the ties excused); the
    outputs cut toward zero, or the scale cut to 16 bits, are still less precise."""
    for seed in range(3):
        ref, x, w = _few_bit_rows(seed)
        a = torch.rsqrt((x * x).mean() + torch.tensor(1e-6))
        b = torch.nextafter(a, torch.tensor(float("inf")))
        ya, yb = (x * a * w).to(torch.bfloat16), (x * b * w).to(torch.bfloat16)
        rn = ref.to(torch.bfloat16).double()
        tie, _ = verify._ties(ref.double(), rn, verify._spacing(rn.abs(), 7), 2.0 ** -126)
        assert ((ya != yb) & tie).any()  # the builds differ at ties of the reference
        assert less_precise(paired_error(ya, yb, ref, torch.bfloat16)) is None
        assert less_precise(paired_error(yb, ya, ref, torch.bfloat16)) is None
        cut = ((x * a * w).view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
        assert less_precise(paired_error(cut, ya, ref, torch.bfloat16)) is not None
        a16 = (a.reshape(1).view(torch.int32) & ~0xFFFF).view(torch.float32)
        assert less_precise(paired_error((x * a16 * w).to(torch.bfloat16), ya, ref, torch.bfloat16)) is not None


def test_bf16_outputs_below_the_normal_range_are_a_stratum_of_their_own():
    """Session 50's H100 call: rmsnorm-h200 with its subnormal results written as 0 was `ok`,
    x times a witness element of w landing below the normal range beside outputs of normal size,
    the budget's floor covering them whole. With `subnormal`, a bf16 output's elements whose
    reference rounds below the normal range are paired apart (units of the smallest subnormal):
    their flush is less precise; a build whose scale is one fp32 unit off is not; and without the
    flag (fast_math allowed) nothing changes."""
    g = _gen(7)
    m, n = 64, 1024
    x = torch.randn(m, n, generator=g).to(torch.bfloat16).float()
    w = (torch.rand(n, generator=g) + 0.5)
    w[::16] *= torch.finfo(torch.bfloat16).tiny * 2.0  # a witness element in 16, around the normal minimum
    w = w.to(torch.bfloat16).float()
    s = torch.rsqrt((x * x).mean(dim=1, keepdim=True) + 1e-6)
    ref = (x.double() * w.double() / torch.sqrt((x.double() ** 2).mean(dim=1, keepdim=True) + 1e-6)).float()
    approved = (x * s * w).to(torch.bfloat16)
    honest = (x * torch.nextafter(s, torch.full_like(s, float("inf"))) * w).to(torch.bfloat16)
    flushed = approved.clone()
    flushed[flushed.float().abs() < torch.finfo(torch.bfloat16).tiny] = 0
    assert not torch.equal(flushed, approved)
    got = paired_error(flushed, approved, ref, torch.bfloat16, subnormal=True)
    assert got.n_sub > 256 and got.mine_sub / got.n_sub > 1 and got.theirs_sub == 0
    assert "where the reference rounds below the normal range" in less_precise(got)
    assert less_precise(paired_error(flushed, approved, ref, torch.bfloat16)) is None  # fast_math allowed
    for a, b in ((honest, approved), (approved, honest)):
        assert less_precise(paired_error(a, b, ref, torch.bfloat16, subnormal=True)) is None


def test_the_subnormal_stratum_gives_no_credit_for_the_approved_build_s_gross_errors():
    """Session 50's red team: moe-swiglu-cpu's approved build writes 0 where exp(-g) overflows,
    2 units (clipped) off a subnormal reference, and a variant exact there spent that credit on
    cuts elsewhere. The stratum now takes only the elements where the approved build is within a
    unit: there a variant one unit off on 2 of 5 elements is refused, though its mean over all of
    them equals the approved build's."""
    g = _gen(11)
    n = 5000
    tiny = torch.finfo(torch.bfloat16).tiny
    ref = (tiny * torch.exp2(-1 - 4 * torch.rand(n, generator=g, dtype=torch.float64))).float()  # 2^-5..2^-1 of it
    rn = ref.to(torch.bfloat16)
    step = 2.0 ** -133
    approved = rn.clone()
    approved[:1000] = 0  # grossly off on a fifth: 2 units each, clipped
    cut = rn.double()
    cut[1000:3000] -= step  # the variant: exact on that fifth, a unit off on 2 in 5 of the rest
    variant = cut.to(torch.bfloat16)
    got = paired_error(variant, approved, ref, torch.bfloat16, subnormal=True)
    assert got.n_sub == 4000 and got.theirs_sub == 0 and got.mine_sub / got.n_sub == pytest.approx(0.5)
    assert "below the normal range" in less_precise(got)
    exact = rn.clone()
    assert less_precise(paired_error(exact, approved, ref, torch.bfloat16, subnormal=True)) is None


def test_thin_strata_are_pooled_apart():
    """verify.thin: a shape's subnormal stratum of fewer than PAIRED_MIN pairs, and fp32/fp64 pairs
    of fewer than WIDE_MIN_ROWS rows, go to the worker's pool of thin shapes (session 50's red
    team cut every subnormal output at moe-cpu's T = 1 alone: a few hundred pairs, diluted among
    the large shapes'); a stratum large enough for its own verdict does not."""
    small = NO_PAIRS._replace(n_sub=100, mine_sub=50.0, theirs_sub=0.0, sq_sub=50.0)
    assert verify.thin(small) == small
    assert verify.thin(small._replace(n_sub=verify.PAIRED_MIN)) == NO_PAIRS
    mixed = Paired(1000, 1.0, 1.0, 0.0)._replace(n_wide=40, rows_wide=4, mine_wide=3.0, n_sub=10, mine_sub=5.0)
    t = verify.thin(mixed)
    assert (t.n, t.n_wide, t.rows_wide, t.n_sub, t.mine_sub) == (0, 40, 4, 10, 5.0)
    # three thin shapes of 100 pairs each, cut by a unit on half: no verdict alone, refused together
    pool = small + small + small
    assert less_precise(small) is None and less_precise(pool) is not None


RT49 = ROOT / "datasets" / "judge-redteam" / "s49-rt"


@pytest.mark.slow
@SERIAL
@pytest.mark.parametrize("variant", ["b03_subnormal_out_budget_shaped"])
def test_session_49s_subnormal_output_variants_are_refused(tmp_path, project, variant):
    """Session 49's red team (datasets/judge-redteam/s49-rt, run.sh): b03 put rmsnorm-cpu's
    subnormal outputs on a grid of 2^-9 of the call's mean (inside the budget's floor, out of the
    pairing): `ok` in every run before the subnormal pairing. (c01, a flush at the one shape whose
    rounds never drew `tiny` weights, is caught where the secret turn gives that shape a `tiny`
    round: two trials in three.)"""
    r = pipe_main("eval", PIPELINES / "rmsnorm-cpu.yaml", "--params", json.dumps({"ACC": 8, "THREADS": 1, "UNROLL": 2}),
                  "--variant", RT49 / f"{variant}.cpp.j2", "--run-dir", tmp_path / variant, "--json", cwd=project)
    out = r.stdout + r.stderr
    assert '"wrong"' in out, out[-3000:]
