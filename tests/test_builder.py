"""The builder's memo of the source rules: a build ahead checks a guess's sources and the
trial reads the verdict, the same verdict, forbidden ones included."""

from runner.build import forbid
from runner.build.builder import Builder

from .conftest import ROOT, shipped_spec


def test_source_rules_run_once_a_source_and_keep_their_verdict(monkeypatch):
    spec = shipped_spec(ROOT / "pipelines" / "softmax-h200.yaml")
    b = Builder(spec)
    calls = []
    real = forbid.check_source

    def counting(src, *a):
        calls.append(src)
        return real(src, *a)

    monkeypatch.setattr(forbid, "check_source", counting)
    sources = list(dict.fromkeys(b.render_all(dict(spec.start))))
    assert all(b.source_rules(s) is None for s in sources)
    assert all(b.source_rules(s) is None for s in sources)
    assert len(calls) == len(sources)
    bad = sources[0].replace("exp2f(", "__expf(", 1)  # fast math by name
    first = b.source_rules(bad)
    assert first is not None and first.rule == "fast_math"
    assert b.source_rules(bad) == first and len(calls) == len(sources) + 1
    assert b.build([bad], [{}]).status == "forbidden"


def test_a_fractional_launch_dimension_is_an_error_not_a_cut_grid():
    """`/` is true division in a spec expression: a grid of M / 2 at M = 3 is 1.5 blocks, which
    int() would cut to 1 and leave rows undone; the builder says so instead."""
    import dataclasses

    import pytest

    from runner.core.errors import ExprError
    from runner.core.expr import compile_expr

    spec = shipped_spec(ROOT / "pipelines" / "softmax-h200.yaml")
    k = dataclasses.replace(spec.kernel, grid=(compile_expr("M / 2"),))
    b = Builder(dataclasses.replace(spec, kernel=k))
    params = dict(spec.start)
    assert b.geometry(params, [{"M": 4, "N": 1024}])[0]["grid"] == [2]  # whole: fine
    with pytest.raises(ExprError, match=r"kernel.grid 'M / 2' is 1.5 .*whole number; use ceil_div"):
        b.geometry(params, [{"M": 3, "N": 1024}])


def test_kernel_args_are_checked_against_the_entrys_parameters_without_a_gpu():
    """A kernel.args list that does not match the entry's parameters (one too many, a scalar of
    the wrong size) is found from the build's PTX, as the GPU's load would find it; the shipped
    specs' own lists, tensor maps included, pass."""
    import dataclasses

    from runner.build.backends import cuda

    assert cuda.entry_param_sizes(".visible .entry k(\n .param .u64 k_p0,\n .param .align 64 .b8 k_p1[128],\n"
                                  " .param .u32 k_p2\n)\n{", "k") == [8, 128, 4]
    assert cuda.entry_param_sizes(".visible .entry other(\n)", "k") is None
    assert cuda.params_problem("k", [8, 128, 4], ["ptr", "tmap", "auto"]) is None
    why = cuda.params_problem("k", [8, 128, 4], ["ptr", "tmap", "auto", "f32"])
    assert "takes 3 parameters, the spec passes 4" in why
    assert "is 4 bytes, the spec passes f64" in cuda.params_problem("k", [8, 4], ["ptr", "f64"])

    spec = shipped_spec(ROOT / "pipelines" / "softmax-h200.yaml")
    b = Builder(spec)
    params = dict(spec.start)
    sources = b.render_all(params)[:1]
    assert b.build(sources, b.geometry(params)[:1]).status == "ok"
    extra = dataclasses.replace(spec, kernel=dataclasses.replace(spec.kernel, args=(*spec.kernel.args, "N")))
    got = Builder(extra).build(sources, b.geometry(params)[:1])
    assert got.status == "compile_error" and "takes 3 parameters, the spec passes 4 (kernel.args)" in got.reason
