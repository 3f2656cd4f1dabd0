"""Paged decode attention on the GPU (issue 21, item 2): a short run of the paged spec (pages of
16 tokens) on a small part of its domain, pipe compare's table, and the exported op at sizes
nobody tuned on with shuffled block tables, then inside one captured CUDA graph whose lengths and
block table change between replays (a serving engine's decode step: new tokens, new pages)."""

import json

import pytest
import yaml

from .conftest import (PIPELINES, assert_every_trial_verified_across_the_domain, has_cuda, run_exported,
                       small_decode_space, tune_compare_export)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")]


def small_spec(folder):
    """The paged16 spec, its domain cut to B 1..4 and MAXP 8..256 (L 128..4096) and its space to
    six configurations (every split size class the small domain needs)."""
    d = yaml.safe_load((PIPELINES / "decode-attention-paged16-h200.yaml").read_text())
    d["name"] = "decode-attention-paged-small"
    d["op"]["shapes"] = [{"B": 1, "MAXP": 128}, {"B": 4, "MAXP": 64}]
    d["op"]["domain"]["MAXP"] = {"min": 8, "max": 256}
    d["op"]["domain"]["B"] = {"min": 1, "max": 4}
    d["op"]["held_out_shapes"] = [{"B": 3, "MAXP": 188}]
    d["op"]["extra_shapes"] = [{"B": 3, "MAXP": 9}, {"B": 3, "MAXP": 64}]
    d["op"].pop("domain_where", None)
    small_decode_space(d)
    path = folder / "decode-attention-paged-small.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("paged")
    spec = small_spec(out)
    tune_compare_export(spec, out / "run", out / "pkgs", trials=6)
    return out


def test_every_trial_verified_on_shuffled_tables(package):
    assert_every_trial_verified_across_the_domain(package / "run")


def test_exported_paged_op_in_one_graph_with_changing_lengths_and_pages(package):
    pkgs = package / "pkgs"
    (name,) = [p.name for p in pkgs.iterdir() if (p / "table.json").exists()]
    table = json.loads((pkgs / name / "table.json").read_text())
    assert table["by_range"]["ranges"]
    out = run_exported(pkgs, f"""
        import torch
        import {name} as pkg
        from runner.ops.reference import decode_attention_paged
        torch.manual_seed(0)
        fn = pkg.decode_attention_paged  # the reference's name

        def pool(B, P):
            kc = torch.randn(B * P, 16, 8, 128, device="cuda").bfloat16()
            vc = torch.randn(B * P, 16, 8, 128, device="cuda").bfloat16()
            t = torch.randperm(B * P, device="cuda").view(B, P).int()
            return kc, vc, t

        def ref(q, kc, vc, t, lens):
            return decode_attention_paged(q.double(), kc.double(), vc.double(), t, lens)

        # sizes nobody tuned on, shuffled pages, ragged lengths
        for B, P in ((1, 21), (3, 94), (2, 250), (4, 9)):
            q = torch.randn(B, 32, 128, device="cuda").bfloat16()
            kc, vc, t = pool(B, P)
            lens = torch.randint(1, 16 * P + 1, (B,), device="cuda", dtype=torch.int32)
            y = fn(q, kc, vc, t, lens)
            assert torch.allclose(y.double(), ref(q, kc, vc, t, lens), atol=1e-3, rtol=1.6e-2), (B, P)
        assert pkg.op.calls["kernel"] >= 3, pkg.op.calls
        # one captured graph; the lengths and the block table change in place between replays
        B, P = 4, 188
        q = torch.randn(B, 32, 128, device="cuda").bfloat16()
        kc, vc, t = pool(B, P)
        lens = torch.full((B,), 16 * P, device="cuda", dtype=torch.int32)
        pkg.op.preload()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(q, kc, vc, t, lens)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn(q, kc, vc, t, lens)
        for step in range(6):
            lens.copy_(torch.randint(1, 16 * P + 1, (B,), device="cuda", dtype=torch.int32))
            t.copy_(torch.randperm(B * P, device="cuda").view(B, P).int())
            g.replay()
            torch.cuda.synchronize()
            assert torch.allclose(out.double(), ref(q, kc, vc, t, lens), atol=1e-3, rtol=1.6e-2), step
        print("graph ok", pkg.op.calls)
    """)
    assert "graph ok" in out
