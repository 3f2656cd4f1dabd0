"""pipe hw: a GPU's copy and read bandwidth and bf16 matmul rate, for a hardware profile
(runner/spec/measure.py)."""
from __future__ import annotations

import math

import pytest
from runner.core.errors import PipeError
from runner.spec import measure, yamlsrc

from .conftest import has_cuda, pipe_main


def test_quartiles():
    assert measure.quartiles([3.0]) == (3.0, 3.0, 3.0)
    q1, med, q3 = measure.quartiles([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (q1, med, q3) == (2.0, 3.0, 4.0)


@pytest.mark.parametrize("device, profile", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                             ("NVIDIA B200", "b200"), ("NVIDIA A100-SXM4-80GB", None)])
def test_the_profile_is_the_one_whose_device_name_the_gpu_carries(device, profile):
    got = measure.pick_profile(None, device)
    assert (got.name if got else None) == profile


def test_a_named_profile_wins_and_a_missing_one_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert measure.pick_profile("h200", "NVIDIA H100 80GB HBM3").name == "h200"
    with pytest.raises(PipeError, match="no hw_profiles/nope.yaml"):
        measure.pick_profile("nope", "NVIDIA H100 80GB HBM3")


# a profile as h100.yaml was before pipe hw measured one: a copy estimate, no read figure
ESTIMATE = {"name": "h100", "path": "hw_profiles/h100.yaml",
            "data": {"bandwidth": {"measured_bytes_per_s": 3.0e12}, "peak_flops": {"bf16": 7.9e14}}}


def _got(profile: dict | None) -> dict:
    figs = {"bandwidth.measured_bytes_per_s": {"value": 2.9e12, "q1": 2.89e12, "q3": 2.91e12, "unit": "B/s",
                                               "how": "copy"},
            "bandwidth.read_bytes_per_s": {"value": 3.2e12, "q1": 3.19e12, "q3": 3.21e12, "unit": "B/s",
                                           "how": "read"},
            "peak_flops.bf16": {"value": 7.0e14, "q1": 6.9e14, "q3": 7.1e14, "unit": "FLOP/s", "how": "matmul"}}
    return {"device": {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "l2_bytes": 52428800,
                       "memory_bytes": 85520809984, "torch": "2.x"}, "date": "2026-12-05", "figures": figs,
            "profile": profile}


def test_the_report_sets_each_figure_beside_the_profiles_and_gives_lines_that_load():
    text = measure.report(_got(ESTIMATE))
    assert "2.900 TB/s [2.890..2.910]: copy" in text and "700.0 TFLOP/s [690.0..710.0]: matmul" in text
    assert "3e12 in the profile, measured 2.9e12 (0.97x)" in text
    assert "none in the profile, measured 3.2e12" in text
    assert "7.9e14 in the profile, measured 7e14 (0.89x)" in text
    snippet = text.split("for the profile (hw_profiles/NAME.yaml):\n", 1)[1]
    d = yamlsrc.load(snippet, "snippet").data  # as a profile is read (YAML 1.2 numbers: 2.9e12 is one)
    assert d["bandwidth"]["measured_bytes_per_s"] == pytest.approx(2.9e12)
    assert d["bandwidth"]["read_bytes_per_s"] == pytest.approx(3.2e12)
    assert d["peak_flops"]["bf16"] == pytest.approx(7.0e14)
    assert "pipe hw on NVIDIA H100 80GB HBM3" in d["bandwidth"]["measured_by"]
    assert "no profile in pipe's hw_profiles/ names this GPU" in measure.report(_got(None))


def test_without_a_gpu_pipe_hw_says_so(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = pipe_main("hw")
    assert r.returncode == 2 and "finds no CUDA GPU here" in r.stderr and "Traceback" not in r.stderr
    r = pipe_main("hw", "--reps", "1")
    assert r.returncode == 2 and "at least 2 timed calls" in r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")
def test_the_figures_on_this_gpu_are_below_the_datasheet(tmp_path):
    """Each figure is finite, its quartiles around its median, and no bandwidth is above the
    profile's datasheet figure (a timing that missed the work would be)."""
    got = measure.measure(reps=5)
    assert got["profile"] is not None, got["device"]
    sheet = float(got["profile"]["data"]["bandwidth"]["datasheet_bytes_per_s"])
    for key, f in got["figures"].items():
        assert math.isfinite(f["value"]) and f["q1"] <= f["value"] <= f["q3"], (key, f)
    for key in ("bandwidth.measured_bytes_per_s", "bandwidth.read_bytes_per_s"):
        assert 0.3 * sheet < got["figures"][key]["value"] < 1.02 * sheet, (key, got["figures"][key], sheet)
    print(measure.report(got))
