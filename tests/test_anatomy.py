"""benchmarks/anatomy.py: the diagnostic variants take out what they say on the real
templates' rendered sources, still compile, and refuse a source they do not apply to."""

import re

import pytest

from runner.build.builder import Builder

from .conftest import PIPELINES, ROOT, load_script, shipped_spec

anatomy = load_script("benchmarks/anatomy.py")

RING = {"EPT": 64, "TMAX": 512, "MINB": 1, "VEC": 8, "HOLD": "ring", "LOAD": "default", "STORE": "default"}


def _source(name, cfg, shape):
    spec = shipped_spec(PIPELINES / f"{name}.yaml")
    return spec, Builder(spec).render_all(cfg, None, shapes=[shape])[0]


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
    spec = shipped_spec(PIPELINES / "rmsnorm-h200.yaml")
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
    from runner.build.backends import cuda

    spec, src = _source("softmax-h200", RING, {"M": 4096, "N": 32768})
    c = cuda.compile(anatomy.variant_source(src, variant), spec.kernel.entry, spec.kernel.options, spec.hw)
    assert c.ok, c.reason
    assert c.resources.get("spill_stores", 0) == 0


def test_config_from_name_value_pairs_is_typed_by_the_domain():
    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    text = "EPT=64,TMAX=512,MINB=1,VEC=8,HOLD=ring,LOAD=default,STORE=default"
    assert anatomy.parse_config(text, spec.space) == RING  # ints stay ints: the geometry needs them
    assert anatomy.parse_config('{"EPT": 64}', spec.space) == {"EPT": 64}
    with pytest.raises(SystemExit, match="not in its domain"):
        anatomy.parse_config("EPT=48", spec.space)
    with pytest.raises(SystemExit, match="not a parameter"):
        anatomy.parse_config("BLOCK=64", spec.space)


def _run_anatomy(tmp_path, *extra):
    import json
    import subprocess
    import sys

    out = tmp_path / "anatomy.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "anatomy.py"), "--spec",
                        str(PIPELINES / "rmsnorm-cpu.yaml"), "--shape", "512x4096", "--config",
                        "ACC=16,THREADS=1,UNROLL=1", "--rows", "256", "--rounds", "1", "--json", str(out), *extra],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def test_end_to_end_on_the_cpu_backend(tmp_path):
    """The same code path the GPU runs, on the CPU backend: every arm timed at every number
    of rows, a variant that does not apply reported and left out, another template version
    timed beside the real one."""
    same = tmp_path / "same.cpp.j2"
    same.write_text((ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text())
    r, doc = _run_anatomy(tmp_path, "--variants", "real,no-reduce", "--template", f"same={same}",
                          "--grid", "half=ceil_div(M, 2)")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "c0 no-reduce: skipped" in r.stdout
    arms = {(t["arm"], t["rows"]) for t in doc["times"]}
    assert arms == {(a, m) for a in ("c0 real", "c0 same", "c0 half", "copy of the same bytes") for m in (512, 256)}
    # the grid arm launches on its own expression, evaluated at each number of rows
    assert doc["arms"]["c0 half"]["geometry"] == {"512": {**doc["arms"]["c0 real"]["geometry"]["512"], "grid": [256]},
                                                  "256": {**doc["arms"]["c0 real"]["geometry"]["256"], "grid": [128]}}
    assert all(t["median_s"] > 0 and len(t["rounds_s"]) == 1 for t in doc["times"])
    assert doc["arms"]["c0 real"]["config"] == {"ACC": 16, "THREADS": 1, "UNROLL": 1}


def test_a_version_that_is_not_the_op_is_refused(tmp_path):
    wrong = tmp_path / "wrong.cpp.j2"
    text = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
    assert "orow[k] = xr[k] * scale * w[k];" in text
    wrong.write_text(text.replace("orow[k] = xr[k] * scale * w[k];", "orow[k] = 2 * xr[k] * scale * w[k];"))
    r, doc = _run_anatomy(tmp_path, "--variants", "real", "--template", f"wrong={wrong}")
    assert r.returncode != 0 and "c0 wrong at 512 rows: the output does not match the reference" in r.stderr
    assert doc is None  # nothing timed, nothing written


def test_a_grid_that_does_not_parse_is_refused(tmp_path):
    r, doc = _run_anatomy(tmp_path, "--variants", "real", "--grid", "g=NOPE + 1")
    assert r.returncode != 0 and "--grid g=NOPE + 1" in r.stderr and "Traceback" not in r.stderr
    assert doc is None
