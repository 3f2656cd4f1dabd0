"""The softmax template's (max, sum) merge, compiled as host C++ from the template's own
text (the device qualifiers defined away) and checked against float64: any order of
merging partials, empty partials (-inf, 0) among them, gives the row's max and its sum of
exp(x - max). And the ring's hold decision: rows of 32768 held as f32 at 1024 threads,
rows of 65536 a block not."""

import itertools
import math
import random
import re
import subprocess

import pytest

from runner.build.builder import Builder

from .conftest import PIPELINES, ROOT, shipped_spec

TEMPLATE = (ROOT / "kernel_templates" / "softmax.cu.j2").read_text()


def _merge_source() -> str:
    m = re.search(r"__device__ __forceinline__ void merge\(.*?\n}\n", TEMPLATE, re.S)
    assert m, "no merge() in the softmax template"
    return m.group(0)


HOST = r"""
#include <cmath>
#include <cstdio>
#define __device__
#define __forceinline__ inline
#define NEG_INF (-INFINITY)
#define L2E 1.4426950408889634f
%MERGE%
// stdin: n, then n partials (m, s); merged left to right in the given order
int main() {
  int n;
  while (std::scanf("%d", &n) == 1) {
    float m = NEG_INF, s = 0.f;
    for (int i = 0; i < n; ++i) {
      float m2, s2;
      std::scanf("%f %f", &m2, &s2);
      merge(m, s, m2, s2);
    }
    std::printf("%.9g %.9g\n", m, s);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def merger(tmp_path_factory):
    from runner.build.backends import cpu

    d = tmp_path_factory.mktemp("merge")
    (d / "merge.cpp").write_text(HOST.replace("%MERGE%", _merge_source()))
    r = subprocess.run([cpu.CXX, "-O2", "-std=c++17", str(d / "merge.cpp"), "-o", str(d / "merge")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    def run(cases: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
        text = "".join(f"{len(c)} " + " ".join(f"{m!r} {s!r}" for m, s in c) + "\n"
                       for c in cases)
        out = subprocess.run([str(d / "merge")], input=text, capture_output=True, text=True, check=True).stdout
        return [tuple(float(v) for v in line.split()) for line in out.splitlines()]

    return run


def _partial(xs: list[float]) -> tuple[float, float]:
    m = max(xs, default=-math.inf)
    if m == -math.inf:  # nothing, or only masked values: the kernel's empty partial
        return (-math.inf, 0.0)
    return (m, sum(math.exp(x - m) for x in xs))


def test_merges_in_any_order_give_the_row_max_and_sum(merger):
    rng = random.Random(7)
    cases, want = [], []
    for trial in range(60):
        row = [rng.gauss(0, 1) * (30 if trial % 3 == 0 else 1) for _ in range(rng.randint(1, 40))]
        if trial % 4 == 0:
            row = [-math.inf if rng.random() < 0.25 else x for x in row]
            row[0] = 1.5  # a masked row keeps one finite value, as the spec's "masked" inputs do
        cuts = sorted(rng.sample(range(1, len(row) + 3), k=min(4, len(row) + 1)))
        parts, last = [], 0
        for c in cuts:  # some parts empty: the identity (-inf, 0) of threads past the row's end
            parts.append(row[last:c])
            last = c
        parts.append(row[last:])
        for order in itertools.islice(itertools.permutations(range(len(parts))), 3):
            cases.append([_partial(parts[i]) for i in order])
            want.append(_partial(row))
    got = merger(cases)
    for (gm, gs), (wm, ws) in zip(got, want):
        assert gm == pytest.approx(wm, rel=1e-6)
        assert gs == pytest.approx(ws, rel=1e-5)


def test_empty_partials_stay_empty_and_equal_maxima_add(merger):
    got = merger([[(-math.inf, 0.0), (-math.inf, 0.0)],
                  [(2.0, 3.0), (2.0, 5.0)],
                  [(-math.inf, 0.0), (1.0, 2.0)],
                  [(1.0, 2.0), (-math.inf, 0.0)]])
    assert got[0] == (-math.inf, 0.0)  # no NaN from -inf - -inf
    assert got[1] == (2.0, 8.0)
    assert got[2] == (1.0, 2.0) and got[3] == (1.0, 2.0)


def test_every_partial_of_a_minus_inf_max_has_a_zero_sum():
    """merge() relies on it (a NaN sum would spread through 0 * NaN): every place that
    computes exponentials against a per-thread max, which is -inf for a thread that saw
    only masked values, takes 0 as that max instead. A new one must too.

    A scan of the text, in the form the template writes it (the max handed to `ex`, named
    m...l: `ml = ...`, `mbl = ...`): an exponential written inline, or a max by another name,
    passes unseen. What stands behind it is the judge, which verifies every trial on masked
    rows (a quarter -inf)."""
    lines = [ln for ln in TEMPLATE.splitlines() if re.search(r"\bm\w*l = [^;]*;", ln)]
    unguarded = [ln.strip() for ln in lines if "NEG_INF ? 0.f :" not in ln]
    # the row's max after a whole-row reduction is finite for any row with a finite value
    # (the reference gives NaN for a row of only -inf, and so do these)
    row_max = {"const float ml = m;", "const float inv = 1.f / s, ml = m;",
               "const float inv = m == NEG_INF ? __int_as_float(0x7fc00000) : 1.f / s, ml = m;"}
    assert [ln for ln in unguarded if ln not in row_max] == []
    assert sum("NEG_INF ? 0.f :" in ln for ln in lines) >= 4  # ring, fold, scalar fold, tma pass
    assert all("ex(" not in ln for ln in lines)
    # and ex() takes the difference from the max before scaling (see its comment)
    assert "exp2f((v - m) * L2E)" in TEMPLATE


cuda_core = pytest.importorskip("cuda.core", reason="cuda.core (pip install '.[cuda]') is needed to compile")


@pytest.mark.parametrize("cfg, shape, held", [
    # the ring at 1024 threads: 32 exponentials a thread fit its 32-register margin
    ({"EPT": 32, "TMAX": 1024, "MINB": 1, "VEC": 8, "HOLD": "ring"}, {"M": 4096, "N": 32768}, True),
    # this block's 64 of a row of 131072 over a cluster of 2 do not
    ({"EPT": 64, "TMAX": 1024, "MINB": 1, "VEC": 8, "HOLD": "ring"}, {"M": 1024, "N": 131072}, False),
    # the register path keeps its 40-register margin: 32 values at 1024 threads do not fit
    ({"EPT": 32, "TMAX": 1024, "MINB": 1, "VEC": 8, "HOLD": "f32"}, {"M": 4096, "N": 32768}, False),
])
def test_hold_decision(cfg, shape, held):
    from runner.build.backends import cuda

    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    src = Builder(spec).render_all({**cfg, "LOAD": "default", "STORE": "default"}, shapes=[shape])[0]
    probe = src + "\n#if " + ("!" if held else "") + "HOLD_F32\n#error hold decision\n#endif\n"
    r = cuda.compile(probe, spec.kernel.entry, spec.kernel.options, spec.hw)
    assert r.ok, r.reason
