"""The spec loader: every pipeline validates; bad input gets file:line:col
errors and exit 2, never a traceback (hypothesis mutates real specs)."""

import copy
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner import cli
from runner.core.errors import SpecError
from runner.spec.spec import load_spec

from .conftest import PIPELINES, ROOT, shipped_spec

DIAG = re.compile(r"^[^\s:][^:]*:\d+:\d+: ")
SPECS = sorted(PIPELINES.glob("*.yaml"))
BASE_TEXT = (PIPELINES / "rmsnorm-cpu.yaml").read_text()
BASE = yaml.safe_load(BASE_TEXT)


def validate(capsys, path) -> tuple[int, str]:
    rc = cli.main(["validate", str(path)])
    out = capsys.readouterr()
    return rc, out.err


def assert_diagnostics(err: str):
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, "exit 2 without a diagnostic"
    for ln in lines:
        assert DIAG.match(ln), f"not a file:line:col diagnostic: {ln!r}"


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_pipeline_validates(capsys, path):
    rc, err = validate(capsys, path)
    assert rc == 0, err


def write(project, data=None, text=None, name="s.yaml") -> Path:
    p = project / "pipelines" / name
    p.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False))
    return p


def test_many_errors_reported_at_once_with_positions(project, capsys):
    text = re.sub(r"(?m)^agent: \{strategy: (\w+), seed: 0\}", r"agent: {strategy: \1, seed: 0, colour: red}",
                  BASE_TEXT.replace("dtype: fp32", "dtype: fp33").replace("patience: 16", 'patience: "x"'))
    assert "colour: red" in text
    p = write(project, text=text)
    rc, err = validate(capsys, p)
    assert rc == 2
    assert_diagnostics(err)
    lines = err.splitlines()
    assert len(lines) == 3
    line_of = {k: i + 1 for i, ln in enumerate(text.splitlines()) for k in ("fp33", "colour", "patience") if k in ln}
    assert any(f":{line_of['fp33']}:" in ln and "op.dtype" in ln and "did you mean 'fp32'" in ln for ln in lines)
    assert any(f":{line_of['colour']}:" in ln and "agent.colour" in ln and "unknown key" in ln for ln in lines)
    assert any(f":{line_of['patience']}:" in ln and "goal.patience" in ln for ln in lines)


def test_unknown_top_level_key_suggests(project, capsys):
    d = copy.deepcopy(BASE)
    d["serach"] = d.pop("search")
    rc, err = validate(capsys, write(project, d))
    assert rc == 2
    assert_diagnostics(err)
    assert "serach: unknown key 'serach'; did you mean 'search'?" in err
    assert "'search' is required" in err


def test_template_and_space_must_match_naming_both_files(project, capsys):
    d = copy.deepcopy(BASE)
    d["search"]["params"]["EXTRA"] = [1, 2]
    tpl = project / "t.cpp.j2"
    tpl.write_text((project / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
                   .replace("{{ UNROLL }}", "{{ UNROLLL }}"))
    d["kernel"]["template"] = str(tpl)
    rc, err = validate(capsys, write(project, d))
    assert rc == 2
    assert_diagnostics(err)
    text = tpl.read_text()
    at = text.index("UNROLLL")  # the name's own line and column, where the user looks
    line, col = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
    assert re.search(rf"t\.cpp\.j2:{line}:{col}: template uses 'UNROLLL'.*s\.yaml", err), err
    assert re.search(r"s\.yaml:\d+:\d+: search\.params\.EXTRA: parameter 'EXTRA' is not used by template .*t\.cpp\.j2", err)
    assert re.search(r"search\.params\.UNROLL: parameter 'UNROLL' is not used", err)


def test_semantic_errors(project, capsys):
    d = copy.deepcopy(BASE)
    d["search"]["start"] = {"ACC": 3, "THREADS": 1, "UNROLL": 1}
    d["search"]["constraints"] = ["ACC * THREADS <= N", "bogus > 1"]
    d["kernel"]["args"] = ["x", "out", "M", "N", "eps", "nothing"]
    d["forbidden"].append("fast_maths")
    d["agent"]["strategy"] = "randon"
    d["op"]["reference"] = "runner.ops.reference:nope"
    rc, err = validate(capsys, write(project, d))
    assert rc == 2
    assert_diagnostics(err)
    for needle in ("search.constraints[1]", "unknown name bogus", "kernel.args[5]", "tensor 'w' is not passed",
                   "did you mean 'fast_math'", "did you mean 'random'", "has no function 'nope'"):
        assert needle in err, needle


def test_a_reference_that_is_not_found_is_named_beside_the_schema_errors(project, capsys):
    """The schema's errors stop the checks after them; op.reference's lookup is still reported
    with them, so that a spec is fixed in one pass (a first-hour user fixed the schema errors,
    then met the misspelt reference)."""
    d = copy.deepcopy(BASE)
    d["op"]["reference"] = "runner.ops.reference:nope"
    d["kernel"]["entry"] = 5  # a schema error
    rc, err = validate(capsys, write(project, d))
    assert rc == 2
    assert_diagnostics(err)
    assert "kernel.entry: expected string" in err and "op.reference:" in err and "has no function 'nope'" in err, err
    d["op"]["reference"] = "runner.ops.reference:rmsnorm"  # found: the schema's error alone
    rc, err = validate(capsys, write(project, d))
    assert rc == 2 and "kernel.entry" in err and "op.reference" not in err, err


def test_an_argument_passed_twice_is_an_error_at_its_line(project, capsys):
    d = copy.deepcopy(BASE)
    d["kernel"]["args"] = list(d["kernel"]["args"]) + [d["kernel"]["args"][-1]]
    rc, err = validate(capsys, write(project, d))
    assert rc == 2
    assert_diagnostics(err)
    n = len(d["kernel"]["args"]) - 1
    assert re.search(rf"s\.yaml:\d+:\d+: kernel\.args\[{n}\]: '{d['kernel']['args'][-1]}' is passed twice", err), err


@pytest.mark.parametrize("step, says", [(0, "must be at least 1, got 0"), (2.5, "expected integer")])
def test_a_bad_range_step_is_named_at_the_step(project, capsys, step, says):
    d = copy.deepcopy(BASE)
    d["search"]["params"]["ACC"] = {"range": {"min": 1, "max": 32, "step": step}}
    rc, err = validate(capsys, write(project, d))
    assert rc == 2
    assert f"search.params.ACC.range.step: {says}" in err, err


def test_an_op_error_brings_no_false_template_error_after_it(project, capsys):
    d = copy.deepcopy(BASE)
    d["op"]["bytes"] = "Q * N"
    rc, err = validate(capsys, write(project, d))
    assert rc == 2 and "op.bytes: 'Q * N': unknown name Q" in err
    assert "template uses" not in err, err  # N is a shape symbol: the op's error hid it


def test_start_outside_space(project, capsys):
    d = copy.deepcopy(BASE)
    d["search"]["start"] = {"ACC": 3, "THREADS": 1, "UNROLL": 1}
    rc, err = validate(capsys, write(project, d))
    assert rc == 2 and "search.start" in err and "ACC=3 is not one of" in err


def test_start_list_is_tried_in_order_and_checked_item_by_item(project, capsys):
    d = copy.deepcopy(BASE)
    first, second = {"ACC": 8, "THREADS": 1, "UNROLL": 1}, {"ACC": 1, "THREADS": 1, "UNROLL": 4}
    d["search"]["start"] = [first, second]
    spec = load_spec(write(project, d))
    assert spec.starts == (first, second) and spec.start == first  # render and eval fill from the first
    d["search"]["start"] = [first, {"ACC": 3, "THREADS": 1, "UNROLL": 1}, dict(first)]
    rc, err = validate(capsys, write(project, d))
    assert rc == 2
    assert_diagnostics(err)
    assert "search.start[1]" in err and "ACC=3 is not one of" in err
    assert "search.start[2]" in err and "listed twice (also item 0)" in err
    d["search"]["start"] = []
    rc, err = validate(capsys, write(project, d))
    assert rc == 2 and "search.start" in err


def test_empty_space(project, capsys):
    d = copy.deepcopy(BASE)
    d["search"]["constraints"] = ["ACC > 1000"]
    d["search"].pop("start")
    rc, err = validate(capsys, write(project, d))
    assert rc == 2 and "no configuration satisfies the constraints" in err


def test_expressions_never_eval(project, capsys):
    d = copy.deepcopy(BASE)
    d["op"]["bytes"] = "__import__('os').system('touch /tmp/pwned-by-pipe')"
    rc, err = validate(capsys, write(project, d))
    assert rc == 2 and "op.bytes" in err
    assert not Path("/tmp/pwned-by-pipe").exists()


def test_yaml_traps(project, capsys):
    rc, err = validate(capsys, write(project, text=BASE_TEXT + "name: again\n"))
    assert rc == 2 and "duplicate key 'name'" in err
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    rc, err = validate(capsys, write(project, text=bomb, name="bomb.yaml"))
    assert rc == 2 and "refused" in err
    spec = load_spec(PIPELINES / "rmsnorm-cpu.yaml")
    assert spec.op.scalars[0].value == pytest.approx(1e-6) and isinstance(spec.op.scalars[0].value, float)


def test_missing_file_and_not_yaml(project, capsys):
    rc, err = validate(capsys, project / "nope.yaml")
    assert rc == 2 and "no such file" in err
    rc, err = validate(capsys, write(project, text="- just\n- a list\n"))
    assert rc == 2
    assert_diagnostics(err)


def test_spec_error_is_exception_with_all_diagnostics(project):
    d = copy.deepcopy(BASE)
    d["op"]["dtype"] = 5
    d["kernel"]["entry"] = 7
    with pytest.raises(SpecError) as ei:
        load_spec(write(project, d))
    assert len(ei.value.diagnostics) == 2


# -- random mutations -----------------------------------------------------------

def _paths(node, prefix=()):
    """Every key path of a YAML document (dict keys and list indices)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def _mappings(node, prefix=()):
    out = [prefix] if isinstance(node, dict) else []
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_mappings(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_mappings(v, prefix + (i,)))
    return out


def _get(d, path):
    for p in path:
        d = d[p]
    return d


PATHS = _paths(BASE)
MAPPINGS = _mappings(BASE)
# Mappings whose keys are names the user chooses, where a new key may still be valid.
FREE = {("agent", "options")}
WRONG = [None, "zzz", 3.5, -7, [1, "a"], {"q": 1}, True]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS))
def test_mutation_remove_key(project, capsys, path):
    d = copy.deepcopy(BASE)
    parent = _get(d, path[:-1])
    del parent[path[-1]]
    rc, err = validate(capsys, write(project, d))
    assert rc in (0, 2)
    if rc == 2:
        assert_diagnostics(err)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=st.sampled_from(WRONG))
def test_mutation_wrong_type(project, capsys, path, value):
    d = copy.deepcopy(BASE)
    old = _get(d, path)
    if type(old) is type(value) and old == value:
        return
    _get(d, path[:-1])[path[-1]] = value
    rc, err = validate(capsys, write(project, d))
    assert rc in (0, 2)
    if rc == 2:
        assert_diagnostics(err)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(MAPPINGS), key=st.from_regex(r"\A[a-z][a-z_]{2,10}\Z"))
def test_mutation_unknown_key(project, capsys, where, key):
    d = copy.deepcopy(BASE)
    m = _get(d, where)
    if key in m:
        return
    m[key] = "zzz"
    rc, err = validate(capsys, write(project, d))
    if where in FREE:
        assert rc in (0, 2)
    else:
        assert rc == 2
    if rc == 2:
        assert_diagnostics(err)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=len(BASE_TEXT) - 1))
def test_mutation_cut_short(project, capsys, cut):
    rc, err = validate(capsys, write(project, text=BASE_TEXT[:cut]))
    assert rc in (0, 2)
    if rc == 2:
        assert_diagnostics(err)


def test_named_arms_take_no_built_in_name(project, capsys):
    """op.arms (pipe compare's named arms): a name of a built-in arm is an error at its key's line."""
    text = BASE_TEXT.replace("  dtype: fp32\n", "  dtype: fp32\n  arms:\n    by hand: tests.compare_arms:rmsnorm_rsqrt\n"
                             "    torch.compile: tests.compare_arms:rmsnorm_rsqrt\n", 1)
    rc, err = validate(capsys, write(project, text=text))
    assert rc == 2
    assert_diagnostics(err)
    line = text.splitlines().index("    torch.compile: tests.compare_arms:rmsnorm_rsqrt") + 1
    assert any(f":{line}:" in ln and "op.arms.torch.compile" in ln and "taken by a built-in arm" in ln
               for ln in err.splitlines()), err
    assert "by hand" not in err
    rc, err = validate(capsys, write(project, text=BASE_TEXT.replace(
        "  dtype: fp32\n", "  dtype: fp32\n  arms:\n    bad: not-a-callable\n", 1), name="bad.yaml"))
    assert rc == 2 and "op.arms.bad" in err
    assert_diagnostics(err)
    ok = load_spec(write(project, text=BASE_TEXT.replace(
        "  dtype: fp32\n", "  dtype: fp32\n  triton: a.b:c\n  arms:\n    by hand: tests.compare_arms:rmsnorm_rsqrt\n", 1),
        name="ok.yaml"))
    assert ok.op.arms == {"by hand": "tests.compare_arms:rmsnorm_rsqrt"}
    assert list(ok.op.compare_arms()) == ["triton", "by hand"]
    assert list(ok.op.compare_arms(triton=False)) == ["by hand"] and ok.op.compare_arms(arms=False) == {"triton": "a.b:c"}


def test_read_traffic_needs_the_profiles_read_bandwidth(project, capsys):
    """op.traffic read on a profile without bandwidth.read_bytes_per_s (host-cpu): a
    diagnostic at op.traffic, exit 2."""
    text = BASE_TEXT.replace("\nop:\n", "\nop:\n  traffic: read\n", 1)
    assert "traffic: read" in text
    rc, err = validate(capsys, write(project, text=text))
    assert rc == 2
    assert_diagnostics(err)
    assert "traffic" in err and "read_bytes_per_s" in err


def test_read_traffic_floors_use_the_read_bandwidth():
    """The decode-attention spec (op.traffic read) takes its floor and bandwidth fraction from
    the h200 profile's read-only figure; the softmax flagship from the copy figure."""
    from runner.core.figures import floors

    att = shipped_spec(PIPELINES / "decode-attention-h200.yaml")
    sm = shipped_spec(PIPELINES / "softmax-h200.yaml")
    assert att.op.traffic == "read" and sm.op.traffic == "copy"
    read, copy_ = att.hw.read_bandwidth, att.hw.bandwidth
    assert read and read > copy_
    f = floors(att)[0]
    assert f["t_bw"] == pytest.approx(f["bytes"] / read)
    g = floors(sm)[0]
    assert g["t_bw"] == pytest.approx(g["bytes"] / copy_)


def _example_edited(tmp_path, edit, name="s.yaml"):
    """The CPU example with `edit` (old, new) made, written to tmp_path/name, its template found."""
    text = (ROOT / "pipelines" / "rmsnorm-cpu.yaml").read_text()
    assert edit[0] in text
    text = text.replace(*edit).replace("template: kernel_templates/", f"template: {ROOT}/kernel_templates/")
    (tmp_path / name).write_text(text)
    return tmp_path / name


@pytest.mark.parametrize("edit, says", [
    (("at_least: 1.5", "at_least: 1.5, at_most: 3"), "goal.target: give at_least or at_most, not both"),
    (("minutes: 1", "minutes: 0"), "goal.budget.minutes: must be greater than 0, got 0"),
    (("reference: runner.ops.reference:rmsnorm", "reference: rmsnorm"), "op.reference: expected module:function"),
])
def test_schema_errors_are_said_in_words_not_schema(tmp_path, edit, says):
    """A user reads what to write, not the JSON schema's own terms or a regex."""
    with pytest.raises(SpecError) as e:
        load_spec(_example_edited(tmp_path, edit))
    assert says in str(e.value) and "minimum of" not in str(e.value) and "^[" not in str(e.value), str(e.value)


@pytest.mark.parametrize("edit, says", [
    (("at_least: 1.5", "at_least: -2"), "goal.target.at_least: -2 is met by any kernel"),
    (("at_least: 1.5", "at_least: 0"), "goal.target.at_least: 0 is met by any kernel"),
    (("{metric: speedup, at_least: 1.5}", "{metric: time_us, at_most: -1}"), "at_most: -1 can never be met"),
    (("{metric: speedup, at_least: 1.5}", "{metric: limit_fraction, at_least: 1.2}"), "can never be met"),
    (("{metric: speedup, at_least: 1.5}", "{metric: bandwidth_fraction, at_least: 5}"), "stays at most 1"),
])
def test_a_goal_no_kernel_can_miss_or_meet_is_refused(tmp_path, edit, says):
    """A speedup of at least -2 is met by a kernel fifteen times slower than torch; a fraction of
    the floor above 1 / (1 - limit_slack) by none (such a time is refused as impossible)."""
    with pytest.raises(SpecError) as e:
        load_spec(_example_edited(tmp_path, edit))
    assert says in str(e.value) and "s.yaml:" in str(e.value), str(e.value)
    ok = _example_edited(tmp_path, ("{metric: speedup, at_least: 1.5}", "{metric: limit_fraction, at_least: 1.0}"),
                         "ok.yaml")
    assert load_spec(ok).goal.at_least == 1.0  # the floor itself stays a goal


def test_an_error_in_op_is_not_reported_again_in_the_kernels_expressions(tmp_path):
    """An unknown name in op.bytes leaves the op unbuilt; the kernel's geometry, which names the
    shape symbols, is not also reported for naming them (they are read from the spec's text)."""
    text = (ROOT / "pipelines" / "softmax-h200.yaml").read_text()
    old = next(ln for ln in text.splitlines() if ln.startswith("  bytes: "))
    text = text.replace(old, '  bytes: "elem * (2 * M * K)"')
    for d in ("kernel_templates/", "hw_profile"):
        text = text.replace(f"template: {d}", f"template: {ROOT}/{d}")
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "s.yaml")
    msg = str(e.value)
    assert "op.bytes" in msg and "unknown name K" in msg and "kernel." not in msg, msg


def test_a_parameter_the_launch_alone_reads_is_used(tmp_path):
    """A parameter read only by the launch (here a grid of WAVES times the rows' blocks) changes
    what runs, so it is used; one read by nothing, or by kernel.serves alone, is not."""
    import yaml

    d = yaml.safe_load((ROOT / "pipelines" / "softmax-h200.yaml").read_text())
    d["kernel"]["template"] = str(ROOT / "kernel_templates" / Path(d["kernel"]["template"]).name)
    d["search"]["params"]["WAVES"] = [1, 2]
    for st in d["search"]["start"]:
        st["WAVES"] = 1
    d["kernel"]["grid"] = f"({d['kernel']['grid']}) * WAVES"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    assert load_spec(tmp_path / "s.yaml").space is not None
    d["kernel"]["grid"] = d["kernel"]["grid"].replace(" * WAVES", "")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(SpecError, match="parameter 'WAVES' is not used by template .* nor by the launch"):
        load_spec(tmp_path / "s.yaml")


def test_channel_pairs_name_two_floating_inputs_multiplied_along_one_last_dimension(project, capsys):
    """op.channel_pairs (verification's outlier channels of each input made small in the other): an
    unknown name, a 1-D or integer input, an input paired with itself or in two pairs, inputs whose
    last dimensions differ, and a pair beside op.tolerance.gemm_k are each an error at the pair's
    line; the decode-attention spec's pair loads as input places."""
    decode = (PIPELINES / "decode-attention-h200.yaml").read_text()
    assert load_spec(PIPELINES / "decode-attention-h200.yaml").op.channel_pairs == ((0, 1),)
    cases = [
        (BASE_TEXT, "[[x, nope]]", "'nope' is not an input"),
        (BASE_TEXT, "[[x, w]]", "input 'w' is not a floating tensor of two or more dimensions"),
        (BASE_TEXT, "[[x, x]]", "paired with itself"),
        (decode, "[[q, lens]]", "input 'lens' is not a floating tensor"),
        (decode, "[[q, k], [v, q]]", "input 'q' is already in pair 0"),
        (decode.replace("q: {shape: [B, 32, 128]", "q: {shape: [B, 128, 32]"), "[[q, k]]",
         "the last dimensions of 'q' (32 = 32) and 'k' (128 = 128) differ"),
        ((PIPELINES / "moe-cpu.yaml").read_text(), "[[x, w]]", "op.tolerance.gemm_k pairs a GEMM's activation"),
    ]
    for n, (text, pairs, says) in enumerate(cases):
        text = re.sub(r"(?m)^  channel_pairs: .*\n", "", text).replace("\nop:\n", f"\nop:\n  channel_pairs: {pairs}\n", 1)
        rc, err = validate(capsys, write(project, text=text, name=f"pairs{n}.yaml"))
        assert rc == 2, (pairs, err)
        assert_diagnostics(err)
        line = text.splitlines().index(f"  channel_pairs: {pairs}") + 1
        assert any(f":{line}:" in ln and "op.channel_pairs" in ln and says in ln for ln in err.splitlines()), (says, err)
