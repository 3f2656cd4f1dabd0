"""EXPOLY (softmax_rt.cu.j2, PF = 3): part of a row's exponentials as a polynomial on the FMA
pipe. Its float32 arithmetic, read from the rendered source and emulated here step by step, is
held to exp2 over every t the kernel can meet (t = (v - m) * log2(e) <= 0, -inf for a masked
element): as accurate as ex2.approx.f32 where the result is normal, within one unit where it is
subnormal, exactly 0 at -inf. The GPU check is `tools/range_check.py --ops softmax --only EXPOLY=2`
with the range spec's `EXPOLY: [0, 2]` (the space has only 0 since session 55: slower on an H100's SM)."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from range_check import Range  # noqa: E402


@pytest.fixture(scope="module")
def source():
    from runner.build.builder import Builder

    r = Range("softmax", ROOT / "pipelines/softmax-range-h200.yaml")
    # the template's, out of the space: PF 3's ITEMS 6 geometries, LAG 0
    cfgs = [dict(c, EXPOLY=2) for c in r.configs if c["PF"] == 3 and c["ITEMS"] == 6 and not c["LAG"]]
    assert cfgs and not any(c["EXPOLY"] for c in r.configs)
    src = Builder(r.spec).render_all(cfgs[0], shapes=[{"M": 724, "N": 185364}])[0]
    # without EXPOLY the kernel defines no polynomial (the call sits in an `#if EXPOLY` branch)
    plain = Builder(r.spec).render_all(dict(cfgs[0], EXPOLY=0), shapes=[{"M": 724, "N": 185364}])[0]
    assert "float ex_poly(" not in plain and "#define EXPOLY 0" in plain and "#define EXPOLY 2" in src
    return src


def coefficients(src: str) -> list[float]:
    """The polynomial's coefficients in Horner order, highest first, as the source writes them."""
    body = src[src.index("float ex_poly(float v, float m) {"):]
    body = body[:body.index("\n}\n")]
    first = re.search(r"float p = ([0-9.e+-]+)f;", body)
    rest = re.findall(r"p = fmaf\(p, f, ([0-9.e+-]+)f\);", body)
    assert first and len(rest) == 5, body
    for text in ("fmaxf((v - m) * L2E, -150.f)", "t + 12582912.f", "t - (k - 12582912.f)",
                 "__float_as_int(k) - 0x4B400000", "j < -125", "low ? j + 64 : j", "__int_as_float(0x1f800000)",
                 "return v != v ? v :"):  # a NaN element stays NaN (fmaxf would drop it)
        assert text in body, text  # the steps the emulation below takes
    return [float(first.group(1))] + [float(c) for c in rest]


def fma32(a, b, c):
    """fmaf in float32: the product exact in float64, one rounding (float64 then float32: the
    double rounding this allows is below the tolerances here)."""
    return (a.astype(np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(np.float32)


def ex_poly(t: np.ndarray, coef: list[float]) -> np.ndarray:
    """The kernel's steps in float32 on t = (v - m) * log2(e)."""
    f32 = np.float32
    t = np.maximum(t.astype(np.float32), f32(-150.0))
    k = (t + f32(12582912.0)).astype(np.float32)
    f = (t - (k - f32(12582912.0))).astype(np.float32)
    p = np.full_like(f, f32(coef[0]))
    for c in coef[1:]:
        p = fma32(p, f, f32(c))
    j = k.view(np.int32).astype(np.int64) - 0x4B400000
    low = j < -125
    bits = p.view(np.int32).astype(np.int64) + (np.where(low, j + 64, j) << 23)
    scaled = bits.astype(np.int32).view(np.float32)
    return (scaled * np.where(low, np.float32(2.0 ** -64), np.float32(1.0))).astype(np.float32)


def test_the_polynomial_is_exp2_over_every_t_a_row_meets(source):
    coef = coefficients(source)
    rng = np.random.default_rng(7)
    t = np.concatenate([np.linspace(-150.0, 0.0, 600001), -rng.random(200000) * 150.0,
                        -np.exp2(-rng.random(2000) * 30.0), [0.0, -0.5, -1e-7, -125.5, -126.0, -149.0, -149.5]])
    t = t.astype(np.float32)
    got = ex_poly(t, coef).astype(np.float64)
    want = np.exp2(t.astype(np.float64))
    normal = want >= 2.0 ** -126
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    assert rel.max() <= 2.0 ** -21.5, rel.max()  # ex2.approx.f32: 2 units (2^-22); this one 1.6e-7
    # below the normal range: the polynomial's relative error and one rounding to the subnormal
    # grid (a unit of 2^-149), not a flush to 0 or a unit's drift
    sub = ~normal
    assert sub.sum() > 1000
    assert (np.abs(got[sub] - want[sub]) <= 2.0 ** -150 + 2.0 ** -21.5 * want[sub]).all()
    # every value in (0, 1], and monotone in t
    order = np.argsort(t, kind="stable")
    assert (np.diff(got[order]) >= 0).all() and got.max() <= 1.0 and got.min() >= 0.0
    assert ex_poly(np.array([0.0], np.float32), coef)[0] == 1.0


def test_a_masked_element_gives_exactly_zero(source):
    coef = coefficients(source)
    got = ex_poly(np.array([-np.inf, -1e30, -150.0, -200.0], np.float32), coef)
    assert (got == 0).all()
    # and the smallest t that is not 0 rounds as exp2 does: 2^-149.5 rounds to 2^-149
    assert ex_poly(np.array([-149.4], np.float32), coef)[0] == np.float32(2.0 ** -149)
