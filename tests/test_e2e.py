"""benchmarks/e2e.py: the exported ops wired into a transformer block's evaluation
step. On the CPU every exported op falls back to torch (the shapes are not the tuned
ones), so the pipe arm must equal the torch arm exactly; the compiled arms agree
within bf16 rounding. GPU figures come from the device (docs/results.md)."""

import json
import subprocess
import sys

from .conftest import ROOT


def test_e2e_step_with_exported_ops_matches_stock_torch(exported, tmp_path):
    out = tmp_path / "e2e.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "e2e.py"), "--exported", str(exported),
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    res = json.loads(out.read_text())
    arms = res["arms"]
    assert set(arms) == {"torch", "torch.compile", "pipe", "pipe+compile"}
    assert arms["pipe"]["max_abs_diff_hidden"] == 0 and arms["pipe"]["max_abs_diff_loss"] == 0
    assert all(a["ok"] for a in arms.values())
    for name in ("torch.compile", "pipe+compile"):
        assert arms[name]["max_abs_diff_loss"] < 0.1 and arms[name]["max_abs_diff_hidden"] < 0.25
    calls = res["pipe_calls"]
    # per step: 1 softmax, 3 RMSNorms, 1 cross-entropy; the pipe arm and pipe+compile each ran once
    assert calls["softmax_h200"]["fallback"] >= 2 and calls["rmsnorm_h200"]["fallback"] >= 6
    assert calls["cross_entropy_h200"]["fallback"] >= 2
    assert all(c["kernel"] == 0 for c in calls.values())  # no CUDA here


def test_e2e_names_missing_exported_packages(tmp_path):
    (tmp_path / "softmax_h200").mkdir()
    (tmp_path / "softmax_h200" / "__init__.py").write_text("")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "e2e.py"), "--exported", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "rmsnorm_h200, cross_entropy_h200" in r.stderr and "softmax_h200," not in r.stderr
