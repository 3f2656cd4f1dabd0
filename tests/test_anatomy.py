"""benchmarks/anatomy.py: the diagnostic variants take out what they say on the real
templates' rendered sources, still compile, and refuse a source they do not apply to."""

import importlib.util
import re

import pytest

from runner.spec import load_spec
from runner.trial import Evaluator

from .conftest import PIPELINES, ROOT

_spec = importlib.util.spec_from_file_location("anatomy", ROOT / "benchmarks" / "anatomy.py")
anatomy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(anatomy)

RING = {"EPT": 64, "TMAX": 512, "MINB": 1, "VEC": 8, "HOLD": "ring", "LOAD": "default", "STORE": "default"}


def _source(name, cfg, shape):
    spec = load_spec(PIPELINES / f"{name}.yaml")
    return spec, Evaluator(spec, None, None).render_all(cfg, None, shapes=[shape])[0]


def _kernel(src):
    return src.split('extern "C" __global__', 1)[1]


def test_variants_take_out_the_exp_and_the_row_reductions():
    _, src = _source("softmax-h200", RING, {"M": 4096, "N": 32768})
    assert anatomy.variant_source(src, "real") == src
    cheap = anatomy.variant_source(src, "cheap-exp")
    # the macro follows the last #include, so the headers' own declarations are untouched
    assert cheap.index("#define exp2f(v)") > cheap.rindex("#include")
    assert "row_reduce<RPAIR>(m, s" in _kernel(cheap)
    none = anatomy.variant_source(src, "no-reduce")
    assert re.search(r"\brow_reduce<\w+>\(", _kernel(none)) is None and "#define exp2f" not in none
    assert "row_reduce" in none.split('extern "C" __global__', 1)[0]  # the helper's definition stays
    bare = anatomy.variant_source(src, "bare")
    assert "#define exp2f(v)" in bare and re.search(r"\brow_reduce<\w+>\(", _kernel(bare)) is None


def test_rmsnorm_row_sum_becomes_the_thread_value():
    spec = load_spec(PIPELINES / "rmsnorm-h200.yaml")
    cfg = dict(spec.start)
    _, src = _source("rmsnorm-h200", cfg, {"M": 2048, "N": 65536})
    calls = len(re.findall(r"\brow_sum\(", _kernel(src)))
    assert calls >= 1
    out = anatomy.variant_source(src, "no-reduce")
    assert re.search(r"\brow_sum\(", _kernel(out)) is None
    assert len(re.findall(r"rsqrtf\(\(ss\) / \(float\)NCOLS", _kernel(out))) == calls
    with pytest.raises(anatomy.VariantError, match="no exp2f"):  # RMSNorm has no exponentials
        anatomy.variant_source(src, "cheap-exp")


def test_a_variant_that_changes_nothing_is_refused():
    # the tma path exchanges (max, sum) through mbarriers, not row_reduce: nothing to take out
    tma = {**RING, "HOLD": "tma"}
    _, src = _source("softmax-h200", tma, {"M": 4096, "N": 32768})
    assert "cp.async.bulk" in src
    with pytest.raises(anatomy.VariantError, match="no-reduce"):
        anatomy.variant_source(src, "no-reduce")


cuda_core = pytest.importorskip("cuda.core", reason="cuda.core (pip install '.[cuda]') is needed to compile")


@pytest.mark.parametrize("variant", anatomy.VARIANTS)
def test_every_variant_compiles(variant):
    from runner.backends import cuda

    spec, src = _source("softmax-h200", RING, {"M": 4096, "N": 32768})
    c = cuda.compile(anatomy.variant_source(src, variant), spec.kernel.entry, spec.kernel.options, spec.hw)
    assert c.ok, c.reason
    assert c.resources.get("spill_stores", 0) == 0


def test_config_from_name_value_pairs_is_typed_by_the_domain():
    spec = load_spec(PIPELINES / "softmax-h200.yaml")
    text = "EPT=64,TMAX=512,MINB=1,VEC=8,HOLD=ring,LOAD=default,STORE=default"
    assert anatomy.parse_config(text, spec.space) == RING  # ints stay ints: the geometry needs them
    assert anatomy.parse_config('{"EPT": 64}', spec.space) == {"EPT": 64}
    with pytest.raises(SystemExit, match="not in its domain"):
        anatomy.parse_config("EPT=48", spec.space)
    with pytest.raises(SystemExit, match="not a parameter"):
        anatomy.parse_config("BLOCK=64", spec.space)
