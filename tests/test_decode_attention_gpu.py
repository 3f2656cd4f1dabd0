"""Decode attention on the GPU (issue 21): a short run of the decode-attention spec on a small
part of its domain, pipe compare's table, the exported op at sizes nobody tuned on and inside
one captured CUDA graph whose context lengths change between replays (as a serving engine's
decode step does), and the runner-owned workspace left zero by every call."""

import json

import pytest
import yaml

from .conftest import (PIPELINES, assert_every_trial_verified_across_the_domain, has_cuda, run_exported,
                       small_decode_space, tune_compare_export)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")]


def small_spec(folder):
    """The h200 spec, its domain cut to B 1..4 and L 128..4096 and its space to six
    configurations (every split size class the small domain needs)."""
    d = yaml.safe_load((PIPELINES / "decode-attention-h200.yaml").read_text())
    d["name"] = "decode-attention-small"
    d["op"]["shapes"] = [{"B": 1, "L": 2048}, {"B": 4, "L": 1024}]
    d["op"]["domain"]["L"] = {"min": 128, "max": 4096}
    d["op"]["domain"]["B"] = {"min": 1, "max": 4}
    d["op"]["held_out_shapes"] = [{"B": 3, "L": 3000}]
    d["op"]["extra_shapes"] = [{"B": 3, "L": 129}, {"B": 3, "L": 1021}]
    d["op"].pop("domain_where", None)
    d["op"].pop("arms", None)  # compiled FlexAttention alone takes minutes; the device compare has them
    small_decode_space(d)
    path = folder / "decode-attention-small.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("attn")
    spec = small_spec(out)
    tune_compare_export(spec, out / "run", out / "pkgs", trials=6)
    return out


def test_every_trial_verified_with_its_workspace(package):
    assert_every_trial_verified_across_the_domain(package / "run")


def test_exported_op_in_one_graph_with_changing_lengths(package):
    pkgs = package / "pkgs"
    (name,) = [p.name for p in pkgs.iterdir() if (p / "table.json").exists()]
    table = json.loads((pkgs / name / "table.json").read_text())
    assert table["by_range"]["ranges"]
    out = run_exported(pkgs, f"""
        import torch
        import {name} as pkg
        from runner.ops.reference import decode_attention
        torch.manual_seed(0)
        fn = pkg.decode_attention  # the reference's name
        # sizes nobody tuned on, ragged lengths
        for B, L in ((1, 333), (3, 1500), (2, 4000), (4, 129)):
            q = torch.randn(B, 32, 128, device="cuda").bfloat16()
            k = torch.randn(B, L, 8, 128, device="cuda").bfloat16()
            v = torch.randn(B, L, 8, 128, device="cuda").bfloat16()
            lens = torch.randint(1, L + 1, (B,), device="cuda", dtype=torch.int32)
            y = fn(q, k, v, lens)
            ref = decode_attention(q.double(), k.double(), v.double(), lens)
            assert torch.allclose(y.double(), ref, atol=1e-3, rtol=1.6e-2), (B, L)
        assert pkg.op.calls["kernel"] >= 3, pkg.op.calls
        # one captured graph; the lengths change in place between replays
        B, L = 4, 3000
        q = torch.randn(B, 32, 128, device="cuda").bfloat16()
        k = torch.randn(B, L, 8, 128, device="cuda").bfloat16()
        v = torch.randn(B, L, 8, 128, device="cuda").bfloat16()
        lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
        pkg.op.preload()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(q, k, v, lens)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn(q, k, v, lens)
        seen = set()
        for step in range(6):
            new = torch.randint(1, L + 1, (B,), device="cuda", dtype=torch.int32)
            lens.copy_(new)
            g.replay()
            torch.cuda.synchronize()
            ref = decode_attention(q.double(), k.double(), v.double(), lens)
            assert torch.allclose(out.double(), ref, atol=1e-3, rtol=1.6e-2), (step, new.tolist())
            seen.add(tuple(new.tolist()))
        assert len(seen) == 6
        print("graph ok", pkg.op.calls)
    """)
    assert "graph ok" in out
