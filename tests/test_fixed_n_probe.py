"""tools/fixed_n_probe.py without a GPU: the run-time sources it recompiles with N a constant
(softmax and RMSNorm), and PF 3's bisecting patches, on the range specs' own renders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import fixed_n_probe  # noqa: E402
from range_check import Range  # noqa: E402


@pytest.fixture(scope="module", params=["softmax", "rmsnorm"])
def op(request):
    from runner.build.builder import Builder

    r = Range(request.param, ROOT / f"pipelines/{request.param}-range-h200.yaml")
    return r, Builder(r.spec)


def test_n_fixed_renames_the_argument_and_declares_the_constant(op):
    r, b = op
    cfg = next(c for c in r.configs if c["PF"] == 4 and r.serves(c, 46341))
    src = b.render_all(cfg, shapes=[r.shape(46341, 7)])[0]
    fixed = fixed_n_probe.fix_n(src, 46341)
    assert fixed != src and "int N_run) {" in fixed and "constexpr int N = 46341;" in fixed
    assert fixed.count("int N) {") == 0
    # the launch still passes N: the argument list keeps its length and types
    sig = src[src.index('extern "C"'):src.index("int N) {")]
    assert sig in fixed
    with pytest.raises(SystemExit):
        fixed_n_probe.fix_n(src.replace("int N) {", "int n) {"), 46341)


def test_the_cut_patch_applies_only_where_every_block_gets_a_full_part():
    from runner.build.builder import Builder

    r = Range("softmax", ROOT / "pipelines/softmax-range-h200.yaml")
    b = Builder(r.spec)
    cfg = next(c for c in r.configs if c["PF"] == 3 and c["TPR"] == 256 and c["ITEMS"] == 8 and c["CL"] == 8
               and c["STORE"] == "default" and c["ALIGN"] == 0)
    src = b.render_all(cfg, shapes=[r.shape(131072, 1)])[0]
    cut = fixed_n_probe.patched(src, 131072, cfg, "cut")
    assert cut is not None and "c.P = PMAX; c.sub = SUBMAX;" in cut
    assert fixed_n_probe.patched(src, 120000, cfg, "cut") is None     # parts of 1875 chunks, not 2048
    assert fixed_n_probe.patched(src, 131071, cfg, "span") is None    # rows off the chunk boundary
    both = fixed_n_probe.patched(src, 131072, cfg, "cut+span")
    assert both is not None and "s.off = 0;" in both and "c.P = PMAX" in both


def test_moved_tensors_start_past_the_buffer_start_with_the_same_values():
    import torch

    t = torch.arange(24, dtype=torch.bfloat16).view(4, 6)
    for off in (0, 8, 64):
        v = fixed_n_probe.moved(t, off)
        assert v.shape == t.shape and v.is_contiguous() and torch.equal(v, t)
        assert v.data_ptr() - v.untyped_storage().data_ptr() == off * t.element_size()
    s, d = fixed_n_probe.moved_pair(t.flatten(), 8)
    assert s.data_ptr() != d.data_ptr() and torch.equal(s, d)


def test_offset_must_keep_the_tensors_16_byte_aligned(monkeypatch, capsys):
    for bad in ("3", "-8"):
        monkeypatch.setattr(sys, "argv", ["fixed_n_probe.py", "--offset", bad, "--compile-only"])
        with pytest.raises(SystemExit) as e:
            fixed_n_probe.main()
        assert e.value.code == 2
        assert "--offset takes a multiple of 8" in capsys.readouterr().err
