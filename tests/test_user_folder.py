"""A new op kept in a folder of its own (issue 17 and the new-user findings): the
template and the reference module found beside the spec from any working folder,
errors that name what was tried, inline PTX against Jinja's `{%`, `pipe render
--shape` over extra and held-out shapes, `pipe render --compile`, and derived
values evaluated by `pipe validate`."""

import re
import shutil
import sys

import pytest
import yaml

from runner import cli
from runner.build import render
from runner.core.errors import SpecError
from runner.spec.spec import load_spec

from .conftest import ROOT

EXAMPLE = ROOT / "examples" / "layernorm"
DIAG = re.compile(r"^[^\s:][^:]*:\d+:\d+: ")


@pytest.fixture
def user(tmp_path, monkeypatch):
    """The LayerNorm example copied to a folder outside the repo, the working folder elsewhere,
    and neither the example nor its copy on sys.path."""
    folder = tmp_path / "mine" / "layernorm"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(EXAMPLE), str(folder))])
    return folder


def edit(folder, fn):
    p = folder / "spec.yaml"
    d = yaml.safe_load(p.read_text())
    fn(d)
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def validate(capsys, *paths) -> tuple[int, str]:
    rc = cli.main(["validate", *map(str, paths)])
    return rc, capsys.readouterr().err


def assert_diagnostics(err: str):
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines
    for ln in lines:
        assert DIAG.match(ln), ln


# -- 1. the template -----------------------------------------------------------------
def test_template_and_reference_beside_the_spec_from_another_folder(user, capsys):
    rc, err = validate(capsys, user / "spec.yaml")
    assert rc == 0, err
    spec = load_spec(user / "spec.yaml")
    assert spec.kernel.template_path == str((user / "layernorm.cpp.j2").resolve())
    assert spec.folder == str(user.resolve())


def test_template_beside_the_spec_wins_over_the_working_folder(user, capsys, tmp_path):
    (tmp_path / "elsewhere" / "layernorm.cpp.j2").write_text("// a decoy, not the spec's template\n")
    spec = load_spec(user / "spec.yaml")
    assert spec.kernel.template_path == str((user / "layernorm.cpp.j2").resolve())


def test_a_checked_in_template_is_found_from_a_spec_outside_the_repo(user, capsys):
    # pipe's own project folder comes after the spec's folders and the working folder
    p = edit(user, lambda d: d["kernel"].update(template="kernel_templates/rmsnorm.cpp.j2"))
    with pytest.raises(SpecError) as e:  # found (the error is about the template's contents, not its path)
        load_spec(p)
    assert "not found" not in str(e.value)
    assert "rmsnorm.cpp.j2" in str(e.value)


def test_missing_template_lists_every_path_tried(user, capsys, tmp_path):
    p = edit(user, lambda d: d["kernel"].update(template="nowhere/ln.cpp.j2"))
    rc, err = validate(capsys, p)
    assert rc == 2
    assert_diagnostics(err)
    assert "kernel.template" in err and "tried" in err
    for folder in (user, user.parent, tmp_path / "elsewhere", ROOT):
        assert str(folder.resolve() / "nowhere" / "ln.cpp.j2") in err


# -- 2. the reference module ---------------------------------------------------------
def test_missing_reference_module_names_the_paths_and_pythonpath(user, capsys):
    (user / "layernorm_ref.py").unlink()
    rc, err = validate(capsys, user / "spec.yaml")
    assert rc == 2
    assert_diagnostics(err)
    assert "op.reference" in err and "PYTHONPATH" in err and str(user.resolve()) in err


def test_missing_function_is_a_spec_error(user, capsys):
    p = edit(user, lambda d: d["op"].update(reference="layernorm_ref:nope"))
    rc, err = validate(capsys, p)
    assert rc == 2 and "has no function 'nope'" in err


@pytest.mark.parametrize("name", ["torch", "runner", "json"])
def test_a_local_module_cannot_stand_in_for_another(user, capsys, name):
    shutil.copy(user / "layernorm_ref.py", user / f"{name}.py")
    p = edit(user, lambda d: d["op"].update(reference=f"{name}:layernorm"))
    rc, err = validate(capsys, p)
    assert rc == 2
    assert_diagnostics(err)
    assert f"module '{name}'" in err and "rename" in err
    assert sys.modules[name].__file__ != str(user / f"{name}.py")  # and it did not get in


@pytest.mark.parametrize("widens, ok", [(("x",), True), (["x", "w"], True), ({"b"}, True), (("nope",), False),
                                         ("x", False), ((["x"],), False), (("x", 3), False)])
def test_a_references_widens_names_floating_inputs(user, capsys, widens, ok):
    """op.reference's `widens` (inputs the reference makes float64 itself: the judge's private
    copies of them keep their dtype) must name floating inputs: a typo would leave a copy
    float64, or an input the reference never widens."""
    text = (user / "layernorm_ref.py").read_text()
    name = f"wide_ref_{abs(hash(repr(widens)))}"
    (user / f"{name}.py").write_text(
        text + f"\n\ndef wide(x, w, b, eps):\n    return layernorm(x.double(), w.double(), b.double(), eps)\n\n\n"
               f"wide.widens = {widens!r}\n")
    p = edit(user, lambda d: d["op"].update(reference=f"{name}:wide"))
    rc, err = validate(capsys, p)
    if ok:
        assert rc == 0, err
        return
    assert rc == 2
    assert_diagnostics(err)
    assert "op.reference" in err and ".widens must name floating inputs of the op (b, w, x)" in err, err


def test_two_folders_with_a_module_of_the_same_name_each_get_their_own(user, capsys, tmp_path):
    other = tmp_path / "theirs"
    shutil.copytree(user, other)
    ref = other / "layernorm_ref.py"
    ref.write_text(ref.read_text().replace("def layernorm(", "def layernorm_other(x, w, b, eps):\n"
                                                             "    return x\n\n\ndef layernorm("))
    edit(other, lambda d: d["op"].update(reference="layernorm_ref:layernorm_other"))
    rc, err = validate(capsys, user / "spec.yaml", other / "spec.yaml", user / "spec.yaml")
    assert rc == 0, err


def test_the_spec_hash_covers_the_local_reference_module(user):
    h0 = load_spec(user / "spec.yaml").hash
    ref = user / "layernorm_ref.py"
    ref.write_text(ref.read_text() + "\n\ndef helper():\n    return 2\n")  # not the function itself
    assert load_spec(user / "spec.yaml").hash != h0


def test_the_worker_imports_the_reference_from_the_spec_folder(user):
    from runner.judge.worker import Judge

    spec = load_spec(user / "spec.yaml")
    # a spawned worker starts with none of the runner's imports
    sys.modules.pop("layernorm_ref", None)
    sys.path[:] = [p for p in sys.path if p != str(user.resolve())]
    judge = Judge(spec)
    assert judge.reference.__module__ == "layernorm_ref"
    assert sys.modules["layernorm_ref"].__file__ == str(user.resolve() / "layernorm_ref.py")
    assert sys.path[-1] == str(user.resolve())  # appended, never ahead of the judge's own modules


# -- 3. inline PTX and Jinja's {% ------------------------------------------------------
PTX = 'asm volatile("mov.b64 %0, {%1, %2};" : "=l"(r) : "r"(lo), "r"(hi));\n'


def test_inline_ptx_operands_get_a_hint_naming_the_template_line(user, capsys):
    t = user / "layernorm.cpp.j2"
    lines = t.read_text().splitlines(keepends=True)
    lines.insert(4, "// " + PTX)
    t.write_text("".join(lines))
    rc, err = validate(capsys, user / "spec.yaml")
    assert rc == 2
    assert_diagnostics(err)
    assert f"{t.resolve()}:5:" in err
    assert "inline PTX operands `{%1`" in err and "{ %0" in err and "{% raw %}" in err


def test_the_hint_when_a_variant_renders():
    with pytest.raises(render.RenderError) as e:
        render.render("int r;\n" + PTX, {}, "variant-x")
    assert "variant-x:2" in str(e.value) and "{% raw %}" in str(e.value)
    assert render.syntax_hint("{% if X %}\n", 1) is None  # a real tag gets no hint
    assert render.render("{% raw %}" + PTX + "{% endraw %}", {}) == PTX


# -- 4. pipe render --shape ----------------------------------------------------------
def test_render_reaches_extra_and_held_out_shapes(user, capsys):
    p = edit(user, lambda d: d["op"].update(held_out_shapes=[{"M": 5, "N": 777}]))
    assert cli.main(["render", str(p), "--shape", "extra:2"]) == 0
    assert "N = 33 values" in capsys.readouterr().out
    assert cli.main(["render", str(p), "--shape", "held:0"]) == 0
    assert "N = 777 values" in capsys.readouterr().out
    assert cli.main(["render", str(p), "--shape", "1"]) == 0
    assert "N = 1024 values" in capsys.readouterr().out


@pytest.mark.parametrize("choice", ["2", "extra:3", "held:0", "spare:0", "x"])
def test_render_shape_out_of_range_lists_the_choices(user, capsys, choice):
    assert cli.main(["render", str(user / "spec.yaml"), "--shape", choice]) == 2
    err = capsys.readouterr().err
    assert "valid choices: shapes:0..1, extra:0..2" in err and "Traceback" not in err


# -- 5. pipe render --compile (the real g++) --------------------------------------------
def test_render_compile_says_it_compiles(user, capsys):
    assert cli.main(["render", str(user / "spec.yaml"), "--compile", "--shape", "extra:1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compiles: layernorm.cpp.j2 for op.extra_shapes[1] (M=3, N=1000) with cpu")


def test_render_compile_reports_a_compile_error(user, capsys):
    t = user / "layernorm.cpp.j2"
    t.write_text(t.read_text().replace("return s;", "return s"))
    assert cli.main(["render", str(user / "spec.yaml"), "--compile"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("compile_error: layernorm.cpp.j2 for op.shapes[0]")
    assert "expected" in err and "return s" in err  # the compiler's own diagnostic


def test_render_compile_reports_a_forbidden_action(user, capsys):
    t = user / "layernorm.cpp.j2"
    t.write_text(t.read_text().replace("#include <thread>", "#include <thread>\n#pragma omp parallel for"))
    assert cli.main(["render", str(user / "spec.yaml"), "--compile"]) == 1
    err = capsys.readouterr().err
    at = next(i for i, ln in enumerate(t.read_text().splitlines(), 1) if "omp parallel" in ln)
    assert err.startswith("forbidden: ") and err.rstrip().endswith(f"layernorm.cpp.j2:{at}]"), err


def test_render_compile_judges_as_a_trial_does(user, capsys):
    """--compile refuses what a trial's build would: a parameter rule of the spec, a launch over
    the profile's limits, a compile error named at the template's line."""
    import yaml

    spec = user / "spec.yaml"
    d = yaml.safe_load(spec.read_text())
    d["forbidden"] = list(d.get("forbidden") or []) + [{"rule": "ACC == 2", "reason": "two never pay"}]
    spec.write_text(yaml.safe_dump(d, sort_keys=False))
    assert cli.main(["render", str(spec), "--compile", "--set", "ACC=2"]) == 1
    assert "rule 'ACC == 2': two never pay" in capsys.readouterr().err
    t = user / "layernorm.cpp.j2"
    t.write_text(t.read_text().replace("return s;", "return s"))
    assert cli.main(["render", str(spec), "--compile"]) == 1
    at = next(i for i, ln in enumerate(t.read_text().splitlines(), 1) if "return s" in ln)
    err = capsys.readouterr().err
    assert "[template " in err and f"layernorm.cpp.j2:{at}" in err, err


# -- 6. derived values evaluated by pipe validate ------------------------------------
def _derive(d, value, **extra):
    d["kernel"]["derive"] = {"TAIL": value}
    d["kernel"].update(extra)


def test_derive_dividing_by_zero_for_one_value_is_a_spec_error(user, capsys):
    p = edit(user, lambda d: _derive(d, "N % (ACC - 1)"))
    text = p.read_text()
    rc, err = validate(capsys, p)
    assert rc == 2
    assert_diagnostics(err)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "TAIL:" in ln)
    assert re.search(rf":{line}:\d+: kernel\.derive\.TAIL: fails for ACC=1, THREADS=1 on op\.shapes\[0\]", err), err
    assert "ZeroDivisionError" in err


def test_derive_failing_on_an_extra_shape_only(user, capsys):
    p = edit(user, lambda d: _derive(d, "4096 // (N - 33)"))
    rc, err = validate(capsys, p)
    assert rc == 2 and "on op.extra_shapes[2] (M=7, N=33)" in err


def test_derive_outside_the_constraints_is_not_evaluated(user, capsys):
    def f(d):
        _derive(d, "N % (ACC - 1)")
        d["search"]["constraints"] = ["ACC > 1"]
        d["search"]["start"] = {"ACC": 2, "THREADS": 1}
    rc, err = validate(capsys, edit(user, f))
    assert rc == 0, err


def test_large_space_is_probed_one_parameter_at_a_time(user, capsys):
    def f(d):
        d["search"]["params"]["ACC"] = {"range": {"min": 1, "max": 200}}
        d["search"]["params"]["THREADS"] = {"range": {"min": 1, "max": 100}}
        d["search"]["start"] = {"ACC": 4, "THREADS": 2}
        _derive(d, "N // (THREADS - 77)")
    rc, err = validate(capsys, edit(user, f))
    assert rc == 2 and "fails for ACC=4, THREADS=77" in err


def test_render_of_a_spec_with_no_start_takes_the_spaces_first_configuration(capsys):
    """The range specs give no search.start: pipe render takes the space's first configuration
    that has the values --set names, and names a value that is none of the space's."""
    spec = str(ROOT / "pipelines" / "softmax-range-h200.yaml")
    assert cli.main(["render", spec, "--set", "PF=3"]) == 0
    assert "softmax" in capsys.readouterr().out
    assert cli.main(["render", spec, "--set", "PF=99"]) == 2
    assert "PF=99 is not one of" in capsys.readouterr().err
