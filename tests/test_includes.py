"""Shared template parts: `{% include "NAME" %}` lines are replaced by the files' text when
the spec is read (render.flatten). The flat text renders as Jinja's own include would, the
spec's hash and the rendered sources follow every edit to an included file, and errors name
the file and line the text came from."""

import shutil
from pathlib import Path

import jinja2
import pytest

from runner.build import render
from runner.build.builder import Builder
from runner.core.errors import SpecError
from runner.spec.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def _env(folder: Path) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def test_flat_text_renders_as_jinja_include_does(tmp_path):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "a.cuh.j2").write_text("#define A {{ X }}\n{% if X > 1 %}\n// big\n{% endif %}\n")
    # b beside the top file, so that its name for a reads the same from either folder (Jinja's
    # loader takes names from its root; flatten from the including file's folder)
    (tmp_path / "b.cuh.j2").write_text('{% include "common/a.cuh.j2" %}\n#define B {{ Y }}\n')
    (tmp_path / "t.j2").write_text('// top\n{% include "b.cuh.j2" %}\n  {% include "common/a.cuh.j2" %}\nend {{ X + Y }}\n')
    flat, segs = render.flatten(tmp_path / "t.j2")
    assert "include" not in flat
    for ctx in ({"X": 1, "Y": 2}, {"X": 5, "Y": 0}):
        assert render.render(flat, ctx) == _env(tmp_path).get_template("t.j2").render(**ctx)
    # where each flat line came from: top 1, a 1-4 (through b), b 2, a 1-4, top 4
    assert render.locate(segs, 1) == (str(tmp_path / "t.j2"), 1)
    assert render.locate(segs, 3) == (str(tmp_path / "common" / "a.cuh.j2"), 2)
    assert render.locate(segs, 6) == (str(tmp_path / "b.cuh.j2"), 2)
    assert render.locate(segs, 11) == (str(tmp_path / "t.j2"), 4)


@pytest.mark.parametrize("text, want", [
    ('{% include "missing.j2" %}\n', "t.j2:1: include 'missing.j2': no file"),
    ('x\n{% include "t.j2" %}\n', "t.j2:2: include 't.j2' includes itself"),
    ('x {% include "p.j2" %}\n', "t.j2:1: '{% include' is allowed only as a whole line"),
    ('{% import "p.j2" as p %}\n', "t.j2:1: '{% import' is allowed only as a whole line"),
])
def test_bad_includes_name_file_and_line(tmp_path, text, want):
    (tmp_path / "p.j2").write_text("p\n")
    (tmp_path / "t.j2").write_text(text)
    with pytest.raises(render.RenderError, match=None) as e:
        render.flatten(tmp_path / "t.j2")
    assert want in str(e.value)


@pytest.fixture
def project(tmp_path):
    """rmsnorm-cpu with its template's scalar helper moved into an included part."""
    for d in ("hw_profiles",):
        shutil.copytree(ROOT / d, tmp_path / d)
    (tmp_path / "kernel_templates" / "common").mkdir(parents=True)
    text = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
    head, rest = text.split("\n", 1)
    (tmp_path / "kernel_templates" / "common" / "head.j2").write_text(head + "\n")
    (tmp_path / "kernel_templates" / "rmsnorm.cpp.j2").write_text('{% include "common/head.j2" %}\n' + rest)
    (tmp_path / "pipelines").mkdir()
    shutil.copy(ROOT / "pipelines" / "rmsnorm-cpu.yaml", tmp_path / "pipelines" / "rmsnorm-cpu.yaml")
    return tmp_path


def test_an_edit_to_an_included_part_is_an_edit_to_the_template(project):
    spec_path = project / "pipelines" / "rmsnorm-cpu.yaml"
    orig = load_spec(ROOT / "pipelines" / "rmsnorm-cpu.yaml")
    spec = load_spec(spec_path)
    assert spec.kernel.template == orig.kernel.template  # the flat text is the template as it was
    params = dict(spec.start)
    before = Builder(spec).render_all(params)
    assert before == Builder(orig).render_all(params)
    part = project / "kernel_templates" / "common" / "head.j2"
    part.write_text(part.read_text() + "// one more line\n")
    edited = load_spec(spec_path)
    assert edited.hash != spec.hash
    after = Builder(edited).render_all(params)
    assert all("// one more line" in s for s in after)
    assert [render.source_hash(s) for s in after] != [render.source_hash(s) for s in before]


def _spec_error_with_part(project, extra: str) -> str:
    """The SpecError text of the project's spec once its included part ends with `extra`."""
    part = project / "kernel_templates" / "common" / "head.j2"
    part.write_text(part.read_text() + extra)
    with pytest.raises(SpecError) as e:
        load_spec(project / "pipelines" / "rmsnorm-cpu.yaml")
    return str(e.value)


def test_errors_inside_an_included_part_name_that_file(project):
    why = _spec_error_with_part(project, "{% if %}\n")
    assert "common/head.j2:2" in why and "template syntax error" in why


def test_a_missing_part_is_a_spec_error_at_the_include_line(project):
    (project / "kernel_templates" / "common" / "head.j2").unlink()
    with pytest.raises(SpecError) as e:
        load_spec(project / "pipelines" / "rmsnorm-cpu.yaml")
    assert "rmsnorm.cpp.j2:1: include 'common/head.j2': no file" in str(e.value)


def test_a_commented_include_is_no_include(tmp_path):
    (tmp_path / "t.j2").write_text('a\n{# {% include "gone.j2" %} #}\n{#\n{% include "gone.j2" %}\n#}\nb\n')
    flat, _ = render.flatten(tmp_path / "t.j2")
    assert render.render(flat, {}) == "a\nb\n"


def test_an_unknown_variable_in_a_part_is_named_at_the_part(project):
    why = _spec_error_with_part(project, "// {{ NOT_A_PARAM_AT_ALL }}\n")
    assert "common/head.j2:2" in why and "NOT_A_PARAM_AT_ALL" in why


def test_a_variant_cannot_include_files(project):
    spec = load_spec(project / "pipelines" / "rmsnorm-cpu.yaml")
    b = Builder(spec)
    b.variants["v"] = '{% include "common/head.j2" %}\n' + spec.kernel.template
    with pytest.raises(render.RenderError, match="a variant cannot read files"):
        b.render_all(dict(spec.start), "v")


def test_an_error_while_rendering_a_part_names_the_part(project):
    part = project / "kernel_templates" / "common" / "head.j2"
    part.write_text(part.read_text() + "// {{ 1 // (THREADS - THREADS) }}\n")
    spec = load_spec(project / "pipelines" / "rmsnorm-cpu.yaml")
    with pytest.raises(render.RenderError) as e:
        Builder(spec).render_all(dict(spec.start))
    assert "common/head.j2:2" in str(e.value) and "ZeroDivisionError" in str(e.value)
