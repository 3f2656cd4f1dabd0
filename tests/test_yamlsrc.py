"""runner.spec.yamlsrc: YAML with positions and without the traps."""

import math
import subprocess
import time

import pytest

from runner.spec import yamlsrc
from runner.core.errors import Diagnostic, SpecError
from runner.spec.yamlsrc import Located, dotted, load, load_file

from .conftest import ROOT, pipe_cmd


def _diags(text: str, file: str = "t.yaml") -> list[Diagnostic]:
    with pytest.raises(SpecError) as ei:
        load(text, file)
    return ei.value.diagnostics


# ---------------------------------------------------------------- duplicates

def test_duplicate_key_reports_line_of_duplicate_and_first():
    text = "a: 1\nb: 2\nc: 3\nb: 4\n"
    (d,) = _diags(text)
    assert d.file == "t.yaml"
    assert d.line == 4
    assert d.col == 1
    assert d.path == "b"
    assert "duplicate key 'b'" in d.message
    assert "line 2" in d.message


def test_duplicate_key_nested_in_list_item():
    text = "items:\n  - name: x\n    size: 1\n    name: y\n"
    (d,) = _diags(text)
    assert (d.line, d.col) == (4, 5)
    assert d.path == "items[0].name"
    assert "first defined at line 2" in d.message


def test_all_duplicates_reported_at_once():
    text = "a: 1\na: 2\nb:\n  x: 1\n  x: 2\n"
    diags = _diags(text)
    assert [(d.line, d.path) for d in diags] == [(2, "a"), (5, "b.x")]


def test_same_key_in_sibling_mappings_is_fine():
    loc = load("a:\n  x: 1\nb:\n  x: 2\n", "t.yaml")
    assert loc.data == {"a": {"x": 1}, "b": {"x": 2}}


# ---------------------------------------------------------------- scalars

@pytest.mark.parametrize("text, value", [
    ("1e-3", 1e-3),
    ("1.0e+6", 1.0e6),
    (".5", 0.5),
    ("3.", 3.0),
    ("-1e3", -1000.0),
    ("2.5E-2", 0.025),
    ("7.2e12", 7.2e12),
])
def test_floats_yaml12_style(text, value):
    v = load(f"v: {text}\n", "t.yaml").data["v"]
    assert isinstance(v, float)
    assert v == value


def test_special_floats():
    data = load("a: .inf\nb: -.inf\nc: .nan\n", "t.yaml").data
    assert data["a"] == math.inf
    assert data["b"] == -math.inf
    assert math.isnan(data["c"])


def test_signed_leading_dot_float():
    data = load("a: -.5\nb: +.5\n", "t.yaml").data
    assert data == {"a": -0.5, "b": 0.5}


def test_ints_stay_ints():
    data = load("a: 128\nb: -3\n", "t.yaml").data
    assert data == {"a": 128, "b": -3}
    assert type(data["a"]) is int


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "y", "n", "Yes", "NO", "On"])
def test_yaml11_booleans_stay_strings(word):
    v = load(f"v: {word}\n", "t.yaml").data["v"]
    assert v == word
    assert isinstance(v, str)


@pytest.mark.parametrize("word, value", [("true", True), ("false", False), ("True", True),
                                         ("FALSE", False)])
def test_true_false_are_bools(word, value):
    v = load(f"v: {word}\n", "t.yaml").data["v"]
    assert v is value


def test_quoted_number_stays_string():
    assert load("v: '1e-3'\n", "t.yaml").data["v"] == "1e-3"


def test_null_loads_as_none():
    assert load("a: ~\nb: null\nc:\n", "t.yaml").data == {"a": None, "b": None, "c": None}


# ---------------------------------------------------------------- billion laughs

def _bomb(levels: int = 9, fan: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * fan) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_refused_quickly():
    text = _bomb()
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as ei:
        load(text, "bomb.yaml")
    elapsed = time.perf_counter() - t0
    assert elapsed < 30.0  # refused in about 0.2 s; expanding it would not end at all
    (d,) = ei.value.diagnostics
    assert d.file == "bomb.yaml"
    assert "refused" in d.message
    assert str(yamlsrc.MAX_NODES) in d.message


def test_small_aliases_are_expanded():
    loc = load("a: &x [1, 2]\nb: *x\n", "t.yaml")
    assert loc.data == {"a": [1, 2], "b": [1, 2]}


def test_recursive_alias_is_spec_error():
    d = _diags("a: &x [*x]\n")
    assert len(d) == 1 and d[0].file == "t.yaml"


# ---------------------------------------------------------------- deep nesting

def _flow(levels: int) -> str:
    return "spec: " + "[" * levels + "1" + "]" * levels + "\n"


def _block_seq(levels: int) -> str:
    return "spec:\n" + "".join("  " * i + "-\n" for i in range(levels)) + "  " * levels + "x\n"


def _block_map(levels: int) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(levels)) + "  " * levels + "x: 1\n"


@pytest.mark.parametrize("make", [_flow, _block_seq, _block_map])
def test_nesting_past_the_limit_is_a_positioned_error(make):
    n = yamlsrc.MAX_DEPTH
    assert load(make(n - 1), "t.yaml").data  # as deep as allowed: loads
    (d,) = _diags(make(n + 5))
    assert f"nested deeper than {n} levels" in d.message
    assert d.line > 1 if make is not _flow else d.line == 1
    assert d.col > 1 and d.path  # where the limit was crossed, with its key path


def test_nesting_through_aliases_is_caught_while_converting():
    half = yamlsrc.MAX_DEPTH // 2 + 5
    text = "a: &a " + "[" * half + "1" + "]" * half + "\nb: " + "[" * half + "*a" + "]" * half + "\n"
    (d,) = _diags(text)
    assert f"nested deeper than {yamlsrc.MAX_DEPTH} levels" in d.message
    assert d.line == 1 and d.path.startswith("b[0]")  # the node is written in a, reached through b


def test_deep_path_is_shortened_in_the_message():
    (d,) = _diags(_block_map(600))
    assert d.path.startswith("k0.k1.k2.k3.k4.") and "more>" in d.path and len(d.path) < 80


@pytest.mark.parametrize("make, line", [(_flow, 1), (_block_seq, None), (_block_map, None)])
@pytest.mark.parametrize("levels", [500, 5000])
def test_pipe_validate_on_a_deep_file_exits_2_without_traceback(tmp_path, make, line, levels):
    f = tmp_path / "deep.yaml"
    f.write_text(make(levels))
    r = subprocess.run([*pipe_cmd(), "validate", str(f)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr
    head = r.stderr.strip().splitlines()[0]
    got_line = int(head.split(":")[1])
    assert head.startswith(f"{f}:") and got_line == (line or yamlsrc.MAX_DEPTH + 1 + (make is _block_seq))
    assert f"nested deeper than {yamlsrc.MAX_DEPTH} levels" in head


def test_a_spec_as_deep_as_allowed_passes_every_check(project):
    """The loader's limit leaves room for every walk after it: the schema validator, the
    semantic checks and the spec's hash all take a value nested MAX_DEPTH levels deep."""
    src = (ROOT / "pipelines" / "rmsnorm-cpu.yaml").read_text()
    # under agent.options.then_options (a free-form option: the continuing strategy's options)
    deep = "[" * (yamlsrc.MAX_DEPTH - 3) + "1" + "]" * (yamlsrc.MAX_DEPTH - 3)
    old = "agent: {strategy: pattern, seed: 0}"
    assert old in src
    spec = project / "pipelines" / "deep.yaml"
    spec.write_text(src.replace(old, "agent: {strategy: pattern, seed: 0, options: {then_options: " + deep + "}}"))
    r = subprocess.run([*pipe_cmd(), "validate", str(spec)], capture_output=True, text=True, timeout=120,
                       cwd=project)
    assert r.returncode == 0, r.stderr[-2000:]
    spec.write_text(src.replace(old, "agent: {strategy: pattern, seed: 0, options: {then_options: [" + deep + "]}}"))
    r = subprocess.run([*pipe_cmd(), "validate", str(spec)], capture_output=True, text=True, timeout=120,
                       cwd=project)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "agent.options.then_options" in r.stderr


# ---------------------------------------------------------------- syntax errors

@pytest.mark.parametrize("text, line", [
    ("a: 1\nb: [1, 2\nc: 3\n", 2),  # where the `[` left open is, not the next key's line
    ("a: 1\nb: {x: 1, y: [1, 2]\nc: 3\n", 2),
    ("a: 1\nb: 'open\n", 2),
    # closed, but a comma missing inside: where the parser stopped is the mistake
    ("a: 1\nb: {x: 1,\n    y: 2 z: 3}\nc: 3\n", 3),
    ("a: 1\nb: c: d\n", 2),
    ("a:\n  b: 1\n c: 2\n", 3),
    ("a: 1\nx:\n\t- 1\n", 3),
])
def test_syntax_error_diagnostic_line(text, line):
    (d,) = _diags(text, "syn.yaml")
    assert d.file == "syn.yaml"
    assert d.line == line
    assert d.col >= 1
    assert d.message.startswith("YAML syntax error")
    assert str(d).startswith(f"syn.yaml:{line}:")
    opened = next((ch for ch in "{['" if ch in text), None)
    if opened and line == 2:  # at the mark left open
        assert d.col == text.splitlines()[1].index(opened) + 1
        assert "opened here is not closed: at line 3" in d.message, d.message


def test_two_documents_are_refused():
    (d,) = _diags("a: 1\n---\nb: 2\n")
    assert d.line == 2
    assert "single document" in d.message


# ---------------------------------------------------------------- positions

NESTED = """\
top:
  list:
    - name: a
      val: 1
    - name: b
      val: [10, 20]
other: x
"""


def test_value_positions_nested_and_list_indices():
    loc = load(NESTED, "p.yaml")
    assert loc.values[("top", "list", 0, "name")] == (3, 13)
    assert loc.values[("top", "list", 1, "val")] == (6, 12)
    assert loc.values[("top", "list", 1, "val", 0)] == (6, 13)
    assert loc.values[("top", "list", 1, "val", 1)] == (6, 17)
    assert loc.values[("top", "list", 0)] == (3, 7)
    assert loc.values[("other",)] == (7, 8)


def test_key_positions():
    loc = load(NESTED, "p.yaml")
    assert loc.keys[("top",)] == (1, 1)
    assert loc.keys[("top", "list")] == (2, 3)
    assert loc.keys[("top", "list", 1, "val")] == (6, 7)
    assert loc.keys[("other",)] == (7, 1)
    # list items have no key
    assert ("top", "list", 0) not in loc.keys


def test_pos_prefers_value_or_key_and_walks_up():
    loc = load(NESTED, "p.yaml")
    assert loc.pos(("top", "list", 1, "val")) == (6, 12)
    assert loc.pos(("top", "list", 1, "val"), prefer_key=True) == (6, 7)
    # unknown leaf: falls back to the nearest known ancestor
    assert loc.pos(("top", "list", 0, "missing")) == (3, 7)
    assert loc.pos(("nothing", "here")) == (1, 1)


def test_diag_uses_position_and_dotted_path():
    loc = load(NESTED, "p.yaml")
    d = loc.diag(("top", "list", 1, "val", 1), "too big")
    assert d == Diagnostic("p.yaml", 6, 17, "top.list[1].val[1]", "too big")
    assert str(d) == "p.yaml:6:17: top.list[1].val[1]: too big"


def test_diagnostic_str_without_path():
    assert str(Diagnostic("f", 2, 3, "", "boom")) == "f:2:3: boom"


def test_spec_error_sorts_diagnostics():
    e = SpecError([Diagnostic("f", 5, 1, "b", "x"), Diagnostic("f", 2, 1, "a", "y")])
    assert [d.line for d in e.diagnostics] == [2, 5]
    assert str(e).splitlines()[0].startswith("f:2:1")


# ---------------------------------------------------------------- refused features

def test_merge_key_is_error():
    d = _diags("base: &b {x: 1}\nc:\n  <<: *b\n  y: 2\n")
    assert len(d) == 1
    assert d[0].line == 3
    assert "merge" in d[0].message


def test_python_object_tag_on_scalar_is_error():
    (d,) = _diags("a: !!python/object:os.system x\n")
    assert d.line == 1
    assert d.path == "a"
    assert "tag" in d.message


def test_custom_local_tag_on_scalar_is_error():
    (d,) = _diags("a: 1\nb: !env HOME\n")
    assert d.line == 2
    assert d.path == "b"


@pytest.mark.parametrize("text", [
    "a: !!python/object:os.system {}\n",
    "a: !!python/object/apply:os.system ['ls']\n",
    "a: !custom {x: 1}\n",
])
def test_custom_tag_on_collection_is_error(text):
    with pytest.raises(SpecError):
        load(text, "t.yaml")


def test_complex_key_is_error():
    (d,) = _diags("? [a, b]\n: 1\n")
    assert "plain scalars" in d.message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file_is_error(text):
    (d,) = _diags(text, "e.yaml")
    assert d.file == "e.yaml"
    assert "empty" in d.message


# ---------------------------------------------------------------- load_file

def test_load_file_ok(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("a: 1e-3\n", encoding="utf-8")
    loc = load_file(str(p))
    assert isinstance(loc, Located)
    assert loc.file == str(p)
    assert loc.data == {"a": 0.001}


def test_load_file_missing(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as ei:
        load_file(str(p))
    (d,) = ei.value.diagnostics
    assert d.file == str(p)
    assert "no such file" in d.message


def test_load_file_not_utf8(tmp_path):
    p = tmp_path / "latin.yaml"
    p.write_bytes(b"name: caf\xe9\xff\n")
    with pytest.raises(SpecError) as ei:
        load_file(str(p))
    (d,) = ei.value.diagnostics
    assert d.file == str(p)
    assert "UTF-8" in d.message


def test_load_file_directory(tmp_path):
    with pytest.raises(SpecError) as ei:
        load_file(str(tmp_path))
    assert ei.value.diagnostics[0].file == str(tmp_path)


def test_load_file_syntax_error_names_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("a: 1\nb: [\n", encoding="utf-8")
    with pytest.raises(SpecError) as ei:
        load_file(str(p))
    assert ei.value.diagnostics[0].file == str(p)


# ---------------------------------------------------------------- dotted

@pytest.mark.parametrize("path, text", [
    ((), ""),
    (("a",), "a"),
    (("a", "b"), "a.b"),
    (("a", "b", 0, "c"), "a.b[0].c"),
    (("a", 0, 1), "a[0][1]"),
    ((3, "x"), "[3].x"),
])
def test_dotted(path, text):
    assert dotted(path) == text
