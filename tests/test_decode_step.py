"""benchmarks/decode_step.py: a small decoder's decode step (the attention plus the flagship
ops) with pipe's exported ops. On the CPU it runs eagerly and checks the wiring: the compiled
arm is as close to the float32 step as the tolerance allows (twice the larger of the stock arms'
distances from it, or a bf16 floor), new lengths change the outputs by more than the
tolerance (so an arm that replays stale lengths fails the check, and one that does is caught),
a missing package is a clean error. With the exported RMSNorm and softmax (which fall back to
torch on the CPU) and a stand-in decode-attention package (no decode-attention run is kept in
tests/data), the pipe arms equal the torch arm. The GPU test exports a short decode-attention
run and times the step on the device."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from .conftest import ROOT, has_cuda, load_script, tune_compare_export

SCRIPT = str(ROOT / "benchmarks" / "decode_step.py")
CPU_ENV = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
FLAGSHIP = "decode_attention_h200,rmsnorm_h200,softmax_h200"  # the script's default --names


def bench(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=CPU_ENV)


def test_torch_and_compiled_step_agree_and_lengths_matter(tmp_path):
    out = tmp_path / "decode.json"
    r = bench("--json", out)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    res = json.loads(out.read_text())
    arms = res["arms"]
    assert set(arms) == {"torch", "torch.compile"} and all(a["ok"] and a["basis"] for a in arms.values())
    tol = res["tolerance"]
    assert arms["torch"]["max_abs_diff_hidden"] == 0 and arms["torch"]["max_abs_diff_probs"] == 0
    assert arms["torch.compile"]["max_abs_diff_hidden"] <= tol["hidden"]
    assert arms["torch.compile"]["max_abs_diff_probs"] <= tol["probs"]
    # the tolerance comes from the float32 step: twice the larger of the stock arms' distances
    # from it, at least
    te = tol["stock_error"]
    assert tol["stock_arms"] == ["torch", "torch.compile"]
    for k in ("hidden", "probs"):
        assert 0 < te[k] == max(arms["torch"][f"error_{k}"], arms["torch.compile"][f"error_{k}"])
        assert tol[k] >= 2 * te[k]
    assert arms["torch.compile"]["error_probs"] <= tol["probs"]
    # the two draws of the lengths differ, and so do the outputs, by more than the tolerance
    d0, d1 = res["lens_draws"]
    assert d0 != d1 and max(d0) == max(d1) == res["shape"]["context"]
    assert res["refresh"]["changes"]
    assert res["refresh"]["max_abs_diff_hidden"] > 3 * tol["hidden"]
    assert res["refresh"]["max_abs_diff_probs"] > tol["probs"]


def test_an_arm_with_stale_lengths_is_caught(monkeypatch):
    """An arm whose attention keeps the first lengths it saw (as a graph that baked them in
    would) passes at the first draw and fails at the second."""
    mod = load_script("benchmarks/decode_step.py")
    real = mod.make_arms

    def with_stale(stock, pipe, W, cfg, want):
        arms = real(stock, pipe, W, cfg, want)
        stale, first = mod.Ops(), {}

        def attention(q, k, v, lens):
            first.setdefault("lens", lens.clone())
            return mod.sdpa_decode(q, k, v, first["lens"])

        stale.decode_attention = attention
        arms["stale"] = lambda *a: mod.step(stale, W, cfg, *a)
        return arms

    monkeypatch.setattr(mod, "make_arms", with_stale)
    cfg = {"batch": 3, "context": 48, "layers": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "hidden": 4096,
           "ffn": 256, "vocab": 512}
    with torch.no_grad():
        res = mod.run(None, mod.NAMES, cfg, 1, 1, "cpu", want={"torch"})
    assert set(res["arms"]) == {"torch", "stale"}
    assert res["refresh"]["changes"] and res["arms"]["torch"]["ok"]
    assert not res["arms"]["stale"]["ok"]
    assert res["arms"]["stale"]["max_abs_diff_hidden"] > res["tolerance"]["hidden"]


def test_names_missing_exported_packages(tmp_path):
    (tmp_path / "rmsnorm_range_h200").mkdir()
    (tmp_path / "rmsnorm_range_h200" / "__init__.py").write_text("")
    r = bench("--exported", tmp_path, "--names", "decode_attention_h200,rmsnorm_range_h200,softmax_range_h200",
              timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "decode_attention_h200, softmax_range_h200" in r.stderr and "rmsnorm_range_h200" not in r.stderr
    r = bench("--exported", tmp_path / "nowhere", timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "no such folder" in r.stderr


# A stand-in for an exported decode-attention package: the reference's bf16 path behind a
# torch.library custom op (opaque to torch.compile, as the exported op is), its calls counted.
STAND_IN = '''
import torch
from runner.ops.reference import decode_attention as _reference


class _Op:
    calls = {"kernel": 0, "fallback": 0}

    def preload(self):
        return 0


op = _Op()


@torch.library.custom_op("standin_decode::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    op.calls["fallback"] += 1
    return _reference(q, k, v, lens).contiguous()


@decode_attention.register_fake
def _(q, k, v, lens):
    return torch.empty_like(q)
'''


def test_pipe_arms_with_exported_ops_match_stock_torch(exported, tmp_path):
    pkgs = tmp_path / "pkgs"
    pkgs.mkdir()
    for name in ("rmsnorm_h200", "softmax_h200"):
        (pkgs / name).symlink_to(exported / name)
    (pkgs / "decode_attention_h200").mkdir()
    (pkgs / "decode_attention_h200" / "__init__.py").write_text(textwrap.dedent(STAND_IN))
    out = tmp_path / "decode.json"
    r = subprocess.run([sys.executable, SCRIPT, "--exported", str(pkgs), "--arms",
                        "torch,pipe,pipe+compile", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**CPU_ENV, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    res = json.loads(out.read_text())
    arms = res["arms"]
    assert set(arms) == {"torch", "pipe", "pipe+compile"} and all(a["ok"] for a in arms.values())
    assert arms["pipe"]["max_abs_diff_hidden"] == 0 and arms["pipe"]["max_abs_diff_probs"] == 0
    assert res["names"] == FLAGSHIP.split(",")
    calls, layers = res["pipe_calls"], res["shape"]["layers"]
    # per step and layer one attention and two RMSNorms, then one RMSNorm and one softmax; the pipe
    # arm ran twice (the two draws), pipe+compile twice after its compile's own calls
    assert calls["decode_attention_h200"]["fallback"] >= 4 * layers
    assert calls["rmsnorm_h200"]["fallback"] >= 4 * (2 * layers + 1) and calls["softmax_h200"]["fallback"] >= 4
    assert all(c["kernel"] == 0 for c in calls.values())  # no CUDA here


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")
def test_decode_step_on_the_gpu(exported, tmp_path):
    """A short decode-attention run (the small spec of test_decode_attention_gpu) exported beside
    the flagship RMSNorm and softmax, then the step at B 4, context 4096, timed in graphs."""
    from .test_decode_attention_gpu import small_spec

    spec = small_spec(tmp_path)
    pkgs = tmp_path / "pkgs"
    tune_compare_export(spec, tmp_path / "run", pkgs, trials=6)
    for name in ("rmsnorm_h200", "softmax_h200"):
        (pkgs / name).symlink_to(exported / name)
    out = tmp_path / "decode.json"
    r = subprocess.run([sys.executable, SCRIPT, "--exported", str(pkgs), "--names",
                        "decode_attention_small,rmsnorm_h200,softmax_h200", "--batch", "4", "--context", "4096",
                        "--reps", "5", "--rounds", "2", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["arms"]) == {"torch", "torch.compile", "pipe", "pipe+compile"}
    assert all(a["ok"] and a["speedup_vs_torch"] for a in res["arms"].values())
    assert res["refresh"]["changes"]
    assert res["pipe_calls"]["decode_attention_small"]["kernel"] > 0


def test_a_speedup_is_shown_with_its_round_by_round_spread():
    graphs = load_script("benchmarks/graphs.py")
    arms = {"torch": {"ok": True}, "pipe": {"ok": True}, "bad": {"ok": False}}
    graphs.fold_rounds(arms, {"torch": [10.0, 12.0, 11.0], "pipe": [5.0, 8.0, 5.5], "bad": [1.0, 1.0, 1.0]})
    # the median ratio and the lowest and highest of the rounds' own ratios (12/8, 10/5)
    assert arms["pipe"]["speedup_vs_torch"] == pytest.approx(11.0 / 5.5)
    assert arms["pipe"]["speedup_range"] == pytest.approx([1.5, 2.0])
    assert graphs.arm_time(arms["pipe"], 1e0, "s", ".1f") == "5.5 s  2.000x [1.500..2.000]"
    assert arms["bad"]["speedup_range"] is None and "WRONG OUTPUT" in graphs.arm_time(arms["bad"], 1, "s", ".1f")
