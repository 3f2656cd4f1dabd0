"""Shapes as ranges on the GPU: a short run of the softmax and cross-entropy range specs,
pipe compare's table and curve, and the exported op at sizes nobody tuned on, inside
a CUDA graph, and with a target outside the vocabulary."""

import json
import subprocess
import sys
import textwrap

import pytest

from .conftest import PIPELINES, has_cuda, tune_compare_export

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")]


# One fixture a spec, so that each test waits only for its own run, compare and export; 3
# secret points (the compare's curve, fallbacks and table at each): the two set-ups together
# outgrew a ten-minute device call at 6 points (session 41).
@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranged")
    tune_compare_export(PIPELINES / "softmax-range-h200.yaml", out / "softmax-range-h200", out / "pkgs", 12, points=3)
    return out


@pytest.fixture(scope="module")
def ce_packages(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranged-ce")
    tune_compare_export(PIPELINES / "cross-entropy-range-h200.yaml", out / "cross-entropy-range-h200", out / "pkgs", 8,
                        points=3)
    return out


def _py(root, code, ok=True):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=root, capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r


def test_trials_time_only_where_they_serve(packages):
    from runner.ship.rundata import open_run

    rd = open_run(packages / "softmax-range-h200", None, "test")
    oks = [t for t in rd.history if t.status == "ok"]
    assert oks
    for t in oks:
        for i, shape in enumerate(rd.spec.op.shapes):
            assert (t.times[i] is not None) == rd.spec.kernel.serves_shape(t.params, shape, 2)
        assert t.details["domain_checks"]


def test_exported_range_op_serves_untuned_sizes_and_graphs(packages):
    table = json.loads((packages / "pkgs" / "softmax_range_h200" / "table.json").read_text())
    ranges = table["by_range"]["ranges"]
    assert ranges and all(r["lo"]["N"] < r["hi"]["N"] for r in ranges)
    _py(packages / "pkgs", """
        import torch
        import softmax_range_h200 as sm
        torch.manual_seed(0)
        for m, n in ((3, 129), (77, 1000), (5, 2047), (300, 777), (2, 5003)):
            x = torch.randn(m, n, device="cuda").bfloat16()
            y = sm.softmax(x)
            ref = torch.softmax(x.double(), -1)
            assert torch.allclose(y.double(), ref, atol=1e-3, rtol=1.6e-2), (m, n)
        assert sm.op.calls["kernel"] + sm.op.calls["fallback"] == 5
        # one captured graph, replayed on new values
        x = torch.randn(64, 1000, device="cuda").bfloat16()
        sm.op.preload()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            sm.softmax(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = sm.softmax(x)
        x.copy_(torch.randn(64, 1000, device="cuda").bfloat16())
        g.replay(); torch.cuda.synchronize()
        assert torch.allclose(out.float(), torch.softmax(x.float(), -1), atol=1e-3, rtol=1.6e-2)
        x = torch.randn(4, 100, device="cuda").bfloat16()  # below the domain: the reference
        before = sm.op.calls["fallback"]
        assert torch.allclose(sm.softmax(x).float(), torch.softmax(x.float(), -1), atol=1e-2)
        assert sm.op.calls["fallback"] == before + 1
        print("ok")
    """)


def test_exported_cross_entropy_ignores_ignore_index_and_asserts_out_of_range(ce_packages):
    root = ce_packages / "pkgs"
    _py(root, """
        import torch, torch.nn.functional as F
        import cross_entropy_range_h200 as ce
        lg = torch.randn(64, 50000, device="cuda").bfloat16()
        t = torch.randint(0, 50000, (64,), device="cuda"); t[::5] = -100
        l = ce.cross_entropy(lg, t, -100)
        ref = F.cross_entropy(lg.double(), t, ignore_index=-100, reduction="none")
        assert torch.allclose(l.double(), ref, atol=1e-3, rtol=2e-4)
        assert (l[::5] == 0).all()
        print("ok")
    """)
    bad = _py(root, """
        import torch
        import cross_entropy_range_h200 as ce
        lg = torch.randn(64, 50000, device="cuda").bfloat16()
        t = torch.randint(0, 50000, (64,), device="cuda"); t[7] = 50000
        l = ce.cross_entropy(lg, t, -100)
        assert ce.op.calls["kernel"] == 1
        torch.cuda.synchronize()
        print("no error")
    """, ok=False)
    # torch's own behaviour on CUDA: a device-side assert, reported at the next synchronisation
    assert bad.returncode != 0 and "no error" not in bad.stdout
    assert "device-side assert" in bad.stderr or "Assertion" in bad.stderr, bad.stderr[-2000:]
