"""runner.build.render: sandboxed Jinja with StrictUndefined."""

import jinja2
import pytest

from runner.core.errors import PipeError
from runner.build import render as render_mod
from runner.build.render import CTYPES, DTYPE_VARS, RenderError, render, source_hash, template_variables, variable_line

KERNEL = """\
template <int BLOCK>
__global__ void k({{ ctype }}* x, int n) {
{% for i in range(VEC) %}
    x[{{ i }}] = {{ i * BLOCK }};
{% endfor %}
}
constexpr int B = {{ BLOCK }};
"""


def test_render_fills_variables():
    out = render(KERNEL, {"ctype": "float", "VEC": 2, "BLOCK": 64}, "softmax.cu.j2")
    assert "__global__ void k(float* x, int n) {" in out
    assert "    x[0] = 0;\n    x[1] = 64;\n" in out  # trim_blocks/lstrip_blocks: no stray lines
    assert "constexpr int B = 64;" in out
    assert "{{" not in out and "{%" not in out


def test_render_keeps_trailing_newline():
    assert render("a {{ x }}\n", {"x": 1}) == "a 1\n"
    assert render("a {{ x }}", {"x": 1}) == "a 1"


def test_render_no_autoescape():
    assert render("{{ s }}", {"s": "a < b && c > \"d\""}) == "a < b && c > \"d\""


def test_render_conditionals():
    t = "{% if VEC > 1 %}vec{% else %}scalar{% endif %}"
    assert render(t, {"VEC": 4}) == "vec"
    assert render(t, {"VEC": 1}) == "scalar"


def test_missing_variable_raises_render_error_naming_template():
    with pytest.raises(RenderError) as ei:
        render("int x = {{ BLOKC }};\n", {"BLOCK": 64}, "rmsnorm.cu.j2")
    msg = str(ei.value)
    assert msg.startswith("rmsnorm.cu.j2")
    assert "BLOKC" in msg
    assert "Undefined" in msg
    assert isinstance(ei.value, PipeError)


def test_missing_variable_inside_expression_is_error():
    # with the default Undefined this would silently give an empty string or 0
    with pytest.raises(RenderError):
        render("{{ N * 2 }}", {})
    with pytest.raises(RenderError):
        render("{% if FLAG %}x{% endif %}", {})


def test_missing_attribute_is_error():
    with pytest.raises(RenderError):
        render("{{ cfg.missing }}", {"cfg": {"present": 1}}, "t")


def test_syntax_error_is_render_error_with_line():
    with pytest.raises(RenderError) as ei:
        render("line one\n{{ x }\n", {"x": 1}, "bad.j2")
    msg = str(ei.value)
    assert msg.startswith("bad.j2:2:")
    assert "TemplateSyntaxError" in msg


@pytest.mark.parametrize("text, ctx", [
    ("{{ ''.__class__.__mro__ }}", {}),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", {}),
    ("{{ (1).__class__.__base__.__subclasses__() }}", {}),
    ("{{ f.__globals__ }}", {"f": render}),
    ("{{ f.__code__.co_consts }}", {"f": render}),
    ("{{ cycler.__init__.__globals__ }}", {}),
    ("{{ x.append(4) }}", {"x": [1, 2]}),
    ("{{ d.update({'a': 1}) }}", {"d": {}}),
])
def test_sandbox_blocks_python_internals(text, ctx):
    with pytest.raises(RenderError) as ei:
        render(text, ctx, "evil.j2")
    msg = str(ei.value)
    assert msg.startswith("evil.j2")
    assert "Security" in msg or "Undefined" in msg
    assert "<class" not in msg and "object at 0x" not in msg


def test_sandbox_does_not_mutate_context():
    xs = [1, 2]
    with pytest.raises(RenderError):
        render("{{ xs.append(3) }}", {"xs": xs})
    assert xs == [1, 2]


def test_huge_range_refused():
    with pytest.raises(RenderError):
        render("{% for i in range(10**9) %}{% endfor %}", {})


def test_error_raised_inside_template_becomes_render_error():
    with pytest.raises(RenderError) as ei:
        render("{{ 1 // n }}", {"n": 0}, "div.j2")
    assert "ZeroDivisionError" in str(ei.value)
    assert str(ei.value).startswith("div.j2")


# ---------------------------------------------------------------- template_variables

def test_template_variables_undeclared_only():
    text = """\
{% set HALF = BLOCK // 2 %}
{% for i in range(VEC) %}{{ i }} {{ HALF }} {{ ctype }}{% endfor %}
{% for j, v in pairs %}{{ j }}{{ v }}{% endfor %}
{{ N }}
"""
    assert template_variables(text) == {"BLOCK", "VEC", "ctype", "pairs", "N"}


def test_template_variables_kernel():
    assert template_variables(KERNEL) == {"ctype", "VEC", "BLOCK"}


def test_template_variables_none():
    assert template_variables("plain C code\nint x = 1;\n") == set()


def test_template_variables_syntax_error():
    with pytest.raises(jinja2.TemplateSyntaxError):
        template_variables("{% for %}")


def test_template_variables_excludes_globals_like_range():
    assert "range" not in template_variables("{% for i in range(N) %}{% endfor %}")


# ---------------------------------------------------------------- variable_line

def test_variable_line_first_use():
    text = "int a;\nint b = {{ X }};\n{% if BLOCK > 2 %}\n{{ BLOCK }}\n{% endif %}\n"
    assert variable_line(text, "BLOCK") == 3
    assert variable_line(text, "X") == 2


def test_variable_line_ignores_plain_code_and_word_parts():
    text = "int BLOCK = 4;\n{{ BLOCK_N }}\n{{ MY_BLOCK }}\n{{ BLOCK + 1 }}\n"
    assert variable_line(text, "BLOCK") == 4


def test_variable_line_in_kernel():
    assert variable_line(KERNEL, "ctype") == 2
    assert variable_line(KERNEL, "VEC") == 3
    assert variable_line(KERNEL, "BLOCK") == 4


def test_variable_line_unknown_defaults_to_one():
    assert variable_line(KERNEL, "NOPE") == 1


def test_variable_line_multiline_tag():
    # A tag spanning lines: the line reported is the one where the name stands.
    text = "int a;\nint b;\n{% if VEC > 1\n      and BLOCK > 32 %}x{% endif %}\n"
    assert variable_line(text, "BLOCK") == 4
    assert variable_line(text, "VEC") == 3


# ---------------------------------------------------------------- source_hash

def test_source_hash_stable_and_distinct():
    a = source_hash("__global__ void k() {}\n")
    assert a == source_hash("__global__ void k() {}\n")
    assert len(a) == 16
    assert all(c in "0123456789abcdef" for c in a)
    assert a != source_hash("__global__ void k() {}")  # one byte less
    assert a != source_hash("__global__ void k()  {}\n")
    assert source_hash("") != source_hash(" ")


def test_source_hash_known_value():
    # sha256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
    assert source_hash("abc") == "ba7816bf8f01cfea"


def test_source_hash_unicode():
    assert source_hash("é") != source_hash("e")


# ---------------------------------------------------------------- tables

def test_ctypes_tables():
    assert DTYPE_VARS == ("dtype", "ctype")
    assert set(CTYPES["cpu"]) == set(CTYPES["cuda"])
    assert CTYPES["cuda"]["bf16"] == "__nv_bfloat16"
    assert CTYPES["cuda"]["fp16"] == "__half"
    assert CTYPES["cpu"]["fp32"] == "float"


def test_a_compilers_line_is_named_in_the_template_where_one_line_alone_renders_it(tmp_path):
    """A compile error names a line of the rendered source; the template line (through an
    include, its own file) is added where exactly one template line can have rendered that
    text, and nothing is claimed where several can."""
    (tmp_path / "helpers.cuh.j2").write_text("__device__ float twice(float v) { return 2 * v; }\n")
    (tmp_path / "k.cu.j2").write_text(
        '{% include "helpers.cuh.j2" %}\n'
        "{% for i in range(N) %}\n"
        "float a{{ i }} = 0;\n"
        "{% endfor %}\n"
        "extern \"C\" __global__ void k(float* x) {\n"
        "  x[0] = twice(a{{ N - 1 }}) + undefined_thing;\n"
        "}\n")
    text, segs = render_mod.flatten(tmp_path / "k.cu.j2")
    src = render(text, {"N": 3}, "k.cu.j2", segs)
    lines = src.splitlines()
    bad = next(i for i, ln in enumerate(lines, 1) if "undefined_thing" in ln)
    assert render_mod.source_line(text, src, bad, segs) == f"{tmp_path / 'k.cu.j2'}:6"
    helper = next(i for i, ln in enumerate(lines, 1) if "twice(float" in ln)
    assert render_mod.source_line(text, src, helper, segs) == f"{tmp_path / 'helpers.cuh.j2'}:1"
    a1 = next(i for i, ln in enumerate(lines, 1) if ln.startswith("float a1"))
    assert render_mod.source_line(text, src, a1, segs) == f"{tmp_path / 'k.cu.j2'}:3"  # a loop's line
    brace = next(i for i, ln in enumerate(lines, 1) if ln == "}")
    assert render_mod.source_line(text, src, brace, segs) is None  # too little text to tell
    nvrtc = f'k.cu({bad}): error: identifier "undefined_thing" is undefined'
    assert render_mod.compiler_source_line(nvrtc, text, src, segs).endswith(f"[template {tmp_path / 'k.cu.j2'}:6]")
    gcc = f"kernel.cpp:{bad}:20: error: 'undefined_thing' was not declared in this scope"
    assert render_mod.compiler_source_line(gcc, text, src, segs, "k").endswith(":6]")
    assert render_mod.compiler_source_line("ld: cannot find -lfoo", text, src, segs) == "ld: cannot find -lfoo"
    twice = text.replace("  x[0] = twice(a{{ N - 1 }}) + undefined_thing;\n",
                         "{% if N > 1 %}\n  x[0] = twice(a{{ N - 1 }}) + undefined_thing;\n{% else %}\n"
                         "  x[0] = twice(a{{ 0 }}) + undefined_thing;\n{% endif %}\n")
    src2 = render(twice, {"N": 1}, "k.cu.j2")
    bad2 = next(i for i, ln in enumerate(src2.splitlines(), 1) if ln.startswith("  x[0]"))
    assert render_mod.source_line(twice, src2, bad2) is None  # two template lines could have made it
    inline = "int a;\n  s += {% if F %}fast(x){% else %}slow(x){% endif %} * y;\n  s += slow(x) * y;\n"
    src3 = render(inline, {"F": False})
    assert src3.splitlines()[1] == src3.splitlines()[2] == "  s += slow(x) * y;"
    assert render_mod.source_line(inline, src3, 2) is None  # an inline branch's line could have made it too
    assert render_mod.source_line(inline.replace("  s += slow(x) * y;\n", ""), src3, 2) == "template:2"
