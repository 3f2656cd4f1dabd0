"""runner.spec.hw: hardware profiles and the device check (no GPU needed)."""

import types
from pathlib import Path

import pytest

from runner.spec import hw
from runner.core.errors import SpecError
from runner.spec.hw import (HwProfile, check_device, check_present_device, find_profile, load_profile,
                            matching_profiles, mismatch_text)

ROOT = Path(__file__).resolve().parent.parent
PROFILES = sorted((ROOT / "hw_profiles").glob("*.yaml"))

H200_PROPS = types.SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, major=9, minor=0,
                                   total_memory=150754820096)
H100_PROPS = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132, major=9,
                                   minor=0, total_memory=85520809984)

MINIMAL = """\
name: {name}
kind: cuda
bandwidth:
  measured_bytes_per_s: 1.0e12
peak_flops:
  bf16: 5.0e14
"""


def test_there_are_profiles():
    names = {p.stem for p in PROFILES}
    assert {"h200", "h100", "b200", "host-cpu"} <= names


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_profile_loads(path):
    prof = load_profile(path)
    assert isinstance(prof, HwProfile)
    assert prof.name == path.stem
    assert prof.kind in ("cpu", "cuda")
    assert isinstance(prof.bandwidth, float) and prof.bandwidth > 0
    assert prof.path == str(path)
    assert 0 <= prof.limit_slack <= 10
    for dtype, v in prof.data["peak_flops"].items():
        assert prof.peak_flops(dtype) == float(v) and v > 0


@pytest.mark.parametrize("path", [p for p in PROFILES if p.stem != "host-cpu"], ids=lambda p: p.stem)
def test_cuda_profiles_describe_the_device(path):
    prof = load_profile(path)
    assert prof.kind == "cuda"
    assert prof.arch.startswith("sm_")
    for key in ("device_name", "sm_count", "memory_bytes"):
        assert prof.get(key), key
    assert prof.peak_flops("bf16") > prof.peak_flops("fp32")


def test_h200_numbers():
    prof = load_profile(ROOT / "hw_profiles" / "h200.yaml")
    assert prof.bandwidth == 4.25e12
    assert prof.peak_flops("bf16") == 7.9e14
    assert prof.peak_flops("fp4") is None
    assert prof.arch == "sm_90"
    assert prof.get("sm_count") == 132
    assert prof.get("not_a_key", "dflt") == "dflt"
    assert prof.limit_slack == 0.05
    assert "H200" in prof.context  # h200.md beside it


def test_context_empty_without_md(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text(MINIMAL.format(name="x"), encoding="utf-8")
    prof = load_profile(p)
    assert prof.context == ""
    assert prof.limit_slack == 0.05  # default
    assert prof.arch is None
    (tmp_path / "x.md").write_text("# notes about x\n", encoding="utf-8")
    assert load_profile(p).context == "# notes about x\n"


def test_zero_peak_counts_as_unknown(tmp_path):
    p = tmp_path / "z.yaml"
    p.write_text(MINIMAL.format(name="z").replace("bf16: 5.0e14", "bf16: 0"), encoding="utf-8")
    assert load_profile(p).peak_flops("bf16") is None


# ---------------------------------------------------------------- find_profile

def test_find_profile_from_nested_folder_below_repo_root():
    near = ROOT / "pipelines" / "some" / "deeper" / "folder"
    p = find_profile("h200", near)
    assert p == ROOT / "hw_profiles" / "h200.yaml"
    assert load_profile(p).name == "h200"


def test_find_profile_from_outside_falls_back_to_package(tmp_path):
    p = find_profile("h200", tmp_path / "a" / "b")
    assert p is not None
    assert p.resolve() == (hw.PACKAGE_ROOT / "hw_profiles" / "h200.yaml").resolve()


def test_find_profile_unknown_name(tmp_path):
    assert find_profile("no-such-gpu-9000", ROOT / "pipelines") is None
    assert find_profile("no-such-gpu-9000", tmp_path) is None


def test_find_profile_prefers_nearest_folder(tmp_path):
    (tmp_path / "hw_profiles").mkdir()
    local = tmp_path / "hw_profiles" / "h200.yaml"
    local.write_text(MINIMAL.format(name="h200"), encoding="utf-8")
    own = tmp_path / "proj" / "hw_profiles"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text(MINIMAL.format(name="mine"), encoding="utf-8")
    nested = tmp_path / "proj" / "specs" / "deep"
    nested.mkdir(parents=True)
    assert find_profile("h200", nested) == local  # above the spec, before pipe's own
    assert find_profile("mine", nested) == own / "mine.yaml"
    assert find_profile("mine", tmp_path) is None  # not visible from above


def test_find_profile_ignores_directory_with_profile_name(tmp_path):
    (tmp_path / "hw_profiles" / "weird.yaml").mkdir(parents=True)
    assert find_profile("weird", tmp_path) is None


# ---------------------------------------------------------------- bad profiles

def test_unknown_key_is_spec_error_with_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(MINIMAL.format(name="bad") + "sm_cuont: 132\n", encoding="utf-8")
    with pytest.raises(SpecError) as ei:
        load_profile(p)
    diags = ei.value.diagnostics
    assert len(diags) == 1
    d = diags[0]
    assert d.file == str(p)
    assert isinstance(d.line, int) and d.line >= 1
    assert "sm_cuont" in d.message
    assert str(d).startswith(f"{p}:{d.line}:")


def test_unknown_key_reported_at_its_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(MINIMAL.format(name="bad") + "sm_cuont: 132\n", encoding="utf-8")
    with pytest.raises(SpecError) as ei:
        load_profile(p)
    assert ei.value.diagnostics[0].line == 7


def test_wrong_types_are_spec_errors_with_lines(tmp_path):
    p = tmp_path / "types.yaml"
    p.write_text("name: t\nkind: cuda\nsm_count: many\nbandwidth:\n  measured_bytes_per_s: fast\n"
                 "peak_flops: {}\n", encoding="utf-8")
    with pytest.raises(SpecError) as ei:
        load_profile(p)
    got = {(d.path, d.line) for d in ei.value.diagnostics}
    assert got == {("sm_count", 3), ("bandwidth.measured_bytes_per_s", 5)}
    assert all(d.file == str(p) for d in ei.value.diagnostics)


@pytest.mark.parametrize("body, path", [
    ("name: t\nkind: gpu\nbandwidth: {measured_bytes_per_s: 1.0}\npeak_flops: {}\n", "kind"),
    ("name: t\nkind: cuda\nsm_count: 0\nbandwidth: {measured_bytes_per_s: 1.0}\npeak_flops: {}\n",
     "sm_count"),
    ("name: t\nkind: cuda\nbandwidth: {measured_bytes_per_s: 1.0}\npeak_flops: {bf16: lots}\n",
     "peak_flops.bf16"),
    ("name: t\nkind: cuda\nbandwidth: {measured_bytes_per_s: 1.0}\npeak_flops: {}\nlimit_slack: -1\n",
     "limit_slack"),
])
def test_bad_values(tmp_path, body, path):
    p = tmp_path / "v.yaml"
    p.write_text(body, encoding="utf-8")
    with pytest.raises(SpecError) as ei:
        load_profile(p)
    assert [d.path for d in ei.value.diagnostics] == [path]


def test_missing_required_keys(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("name: m\nkind: cpu\n", encoding="utf-8")
    with pytest.raises(SpecError) as ei:
        load_profile(p)
    text = str(ei.value)
    assert "bandwidth" in text and "peak_flops" in text


def test_profile_not_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(SpecError):
        load_profile(p)


def test_missing_profile_file(tmp_path):
    with pytest.raises(SpecError) as ei:
        load_profile(tmp_path / "gone.yaml")
    assert ei.value.diagnostics[0].file == str(tmp_path / "gone.yaml")


def test_duplicate_key_in_profile(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text(MINIMAL.format(name="dup") + "kind: cpu\n", encoding="utf-8")
    with pytest.raises(SpecError) as ei:
        load_profile(p)
    d = ei.value.diagnostics[0]
    assert d.line == 7 and "duplicate" in d.message


# ---------------------------------------------------------------- check_device

def test_check_device_h200_matches():
    prof = load_profile(ROOT / "hw_profiles" / "h200.yaml")
    assert check_device(prof, H200_PROPS) == []


def test_check_device_h100_like_against_b200():
    prof = load_profile(ROOT / "hw_profiles" / "b200.yaml")
    bad = check_device(prof, H100_PROPS)
    assert isinstance(bad, list) and len(bad) == 4
    text = "\n".join(bad)
    assert "NVIDIA H100 80GB HBM3" in text and "'B200'" in text  # the name
    assert "132 SMs" in text and "148" in text  # the SM count
    assert "sm_90" in text and "sm_100" in text  # the arch
    assert "80 GiB" in text and "180 GiB" in text  # the memory


def test_check_device_h200_against_h100_profile():
    prof = load_profile(ROOT / "hw_profiles" / "h100.yaml")
    bad = check_device(prof, H200_PROPS)
    assert any("NVIDIA H200" in m and "H100" in m for m in bad)
    assert any("GiB" in m for m in bad)
    assert not any("SMs" in m for m in bad)  # both have 132
    assert not any("sm_90" in m for m in bad)  # same arch


def test_check_device_name_case_insensitive_and_memory_tolerance():
    prof = load_profile(ROOT / "hw_profiles" / "h200.yaml")
    props = types.SimpleNamespace(**{**vars(H200_PROPS), "name": "nvidia h200 sxm",
                                     "total_memory": int(150754820096 * 0.95)})
    assert check_device(prof, props) == []
    props.total_memory = int(150754820096 * 0.8)
    (msg,) = check_device(prof, props)
    assert "GiB" in msg


def test_check_device_arch_mismatch_only():
    prof = load_profile(ROOT / "hw_profiles" / "h200.yaml")
    props = types.SimpleNamespace(**{**vars(H200_PROPS), "major": 8, "minor": 0})
    assert check_device(prof, props) == ["device is sm_80, profile targets sm_90"]


def test_check_device_sm_count_only():
    prof = load_profile(ROOT / "hw_profiles" / "h200.yaml")
    props = types.SimpleNamespace(**{**vars(H200_PROPS), "multi_processor_count": 114})
    assert check_device(prof, props) == ["device has 114 SMs, profile says 132"]


def test_check_device_profile_without_device_fields(tmp_path):
    p = tmp_path / "bare.yaml"
    p.write_text(MINIMAL.format(name="bare"), encoding="utf-8")
    assert check_device(load_profile(p), H100_PROPS) == []


def test_a_mismatch_names_the_profiles_that_describe_this_gpu(tmp_path):
    h200 = load_profile(ROOT / "hw_profiles" / "h200.yaml")
    found = matching_profiles(H100_PROPS, tmp_path)
    assert [p.stem for p in found] == ["h100"]  # not b200, not host-cpu, not h200
    text = mismatch_text(h200, check_device(h200, H100_PROPS), found)
    assert "'h100'" in text and "`hardware`" in text and "--no-hw-check" in text
    # a project's own profile of this GPU is found first, beside pipe's
    (tmp_path / "hw_profiles").mkdir()
    mine = (ROOT / "hw_profiles" / "h100.yaml").read_text().replace("name: h100", "name: lab-h100")
    (tmp_path / "hw_profiles" / "lab-h100.yaml").write_text(mine)
    assert [p.stem for p in matching_profiles(H100_PROPS, tmp_path)] == ["lab-h100", "h100"]
    # no profile of this GPU: the old advice alone
    odd = types.SimpleNamespace(**{**vars(H100_PROPS), "name": "NVIDIA A100-SXM4-80GB", "major": 8, "minor": 0,
                                   "multi_processor_count": 108})
    assert matching_profiles(odd, tmp_path) == []
    assert mismatch_text(h200, check_device(h200, odd), []).endswith("(pass --no-hw-check to run anyway)")


def test_check_present_device_skips_cpu_profiles():
    prof = load_profile(ROOT / "hw_profiles" / "host-cpu.yaml")
    assert prof.kind == "cpu"
    assert check_present_device(prof) is None
