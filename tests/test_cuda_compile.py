"""CUDA templates compile with NVRTC for the profile's architecture, without a
GPU, at several points of their spaces; the ptxas report is parsed and the
profile's limits prune configurations before launch."""

import random
from pathlib import Path

import pytest

from runner.spec.hw import find_profile, load_profile
from runner.build.builder import Builder

from .conftest import PIPELINES, ROOT, shipped_spec

cuda_core = pytest.importorskip("cuda.core", reason="cuda.core (pip install '.[cuda]') is needed to compile")
from runner.build.backends import cuda  # noqa: E402

CUDA_SPECS = [p for p in sorted(PIPELINES.glob("*.yaml")) if shipped_spec(p).kernel.backend == "cuda"]
H200 = load_profile(find_profile("h200", ROOT))


@pytest.mark.parametrize("path", CUDA_SPECS, ids=[p.stem for p in CUDA_SPECS])
def test_every_cuda_template_compiles_at_several_points(path):
    spec = shipped_spec(path)
    ev = Builder(spec)
    rng = random.Random(0)
    points = [spec.start] if spec.start else []
    all_cfgs = list(spec.space)
    points += rng.sample(all_cfgs, min(5, len(all_cfgs)))
    for cfg in points:
        for src in dict.fromkeys(ev.render_all(cfg)):
            r = cuda.compile(src, spec.kernel.entry, spec.kernel.options, spec.hw)
            assert r.ok, f"{path.name} {cfg}: {r.reason}"
            assert r.resources["registers"] > 0
            assert Path(r.artifact).read_bytes()[:4] == b"\x7fELF"


def test_compile_error_carries_the_compiler_message():
    r = cuda.compile('extern "C" __global__ void k(float* y) { y[0] = undefined_thing; }', "k", (), H200)
    assert not r.ok and r.status == "compile_error"
    assert "undefined_thing" in r.reason and "k.cu(1)" in r.reason


def test_missing_entry_is_a_compile_error():
    r = cuda.compile('extern "C" __global__ void other(float* y) { y[0] = 1.f; }', "k", (), H200)
    assert not r.ok and "no kernel named 'k'" in r.reason


def test_unsupported_option_is_refused():
    r = cuda.compile('extern "C" __global__ void k(float* y) {}', "k", ("--bogus",), H200)
    assert not r.ok and "unsupported NVRTC option" in r.reason


def test_bf16_headers_are_found():
    src = '#include <cuda_bf16.h>\nextern "C" __global__ void k(__nv_bfloat16* y) { y[0] = __float2bfloat16(1.f); }'
    r = cuda.compile(src, "k", (), H200)
    assert r.ok, r.reason


def test_cache_hit_on_same_source_and_options():
    src = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 2.f; }'
    a = cuda.compile(src, "k", (), H200)
    b = cuda.compile(src, "k", (), H200)
    c = cuda.compile(src, "k", ("-DX=1",), H200)
    assert b.cached and b.artifact == a.artifact
    assert not c.cached and c.artifact != a.artifact


SPILLY = """
extern "C" __global__ void k(const float* x, float* y, int n) {
  float r[512];
#pragma unroll
  for (int i = 0; i < 512; ++i) r[i] = x[(threadIdx.x * 7 + i * 13) % n];
  float s = 0.f;
  for (int i = 0; i < 512; ++i) s += r[(i * threadIdx.x) & 511];
  y[threadIdx.x] = s;
}
"""


def test_ptxas_report_and_spill_pruning():
    r = cuda.compile(SPILLY, "k", ("--maxrregcount=32",), H200)
    assert r.ok, r.reason
    res = r.resources
    assert res["registers"] <= 32
    assert res["stack_bytes"] > 0
    geo = {"grid": [1], "block": [128], "shared_mem": 0}
    spilled = res["spill_stores"] > 0 or res["spill_loads"] > 0
    why = cuda.prune(res, geo, H200, spills_forbidden=True)
    assert (why is not None and "spill" in why) == spilled
    assert cuda.prune(res, geo, H200, spills_forbidden=False) is None


def test_parse_ptxas_picks_the_entry():
    log = ("ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 10 registers, used 0 barriers, 0 bytes smem\n"
           "ptxas info    : Compiling entry function 'b' for 'sm_90'\n"
           "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem\n\x00")
    assert cuda.parse_ptxas(log, "b") == {"registers": 255, "stack_bytes": 16, "spill_stores": 8,
                                          "spill_loads": 4, "static_smem": 2048}
    assert cuda.parse_ptxas(log, "a")["registers"] == 10


@pytest.mark.parametrize("geo,res,needle", [
    ({"grid": [1], "block": [2048], "shared_mem": 0}, {}, "threads per block"),
    ({"grid": [1], "block": [256], "shared_mem": 300_000}, {}, "shared memory"),
    ({"grid": [1], "block": [128], "shared_mem": 200_000}, {"static_smem": 40_000}, "shared memory"),
    ({"grid": [1], "block": [1024], "shared_mem": 0}, {"registers": 128}, "registers per block"),
    ({"grid": [1, 70000], "block": [32], "shared_mem": 0}, {}, "65535"),
    ({"grid": [0], "block": [32], "shared_mem": 0}, {}, "empty launch"),
])
def test_prune_by_profile_limits(geo, res, needle):
    why = cuda.prune(res, geo, H200, spills_forbidden=False)
    assert why is not None and needle in why


def test_within_limits_is_not_pruned():
    geo = {"grid": [132, 2], "block": [1024], "shared_mem": 100_000}
    assert cuda.prune({"registers": 64, "static_smem": 1024}, geo, H200, spills_forbidden=True) is None


def test_compile_all_matches_compile_source_by_source_in_worker_processes(tmp_path, monkeypatch):
    """Sources compile side by side in worker processes (NVRTC runs one compile at a time
    per process), into the caller's cache; results come back in the sources' order, a
    compile error among them included, and a second call reads every one from the cache."""
    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cuda, "POOL_PROCS", 2)  # a pool whatever this machine's cores
    ok = ['extern "C" __global__ void k(float* y) { y[0] = %d.0f; }' % i for i in range(3)]
    bad = 'extern "C" __global__ void k(float* y) { y[0] = undefined_thing; }'
    sources = [ok[0], bad, ok[1], ok[2]]
    got = cuda.compile_all(sources, "k", (), H200)
    assert cuda._POOL is not None  # compiled in the worker processes
    assert [c.ok for c in got] == [True, False, True, True]
    assert "undefined_thing" in got[1].reason
    for src, c in zip(sources, got):
        if c.ok:  # in the cache this process reads, under this source's key
            again = cuda.compile(src, "k", (), H200)
            assert again.cached and again.artifact == c.artifact
            assert Path(c.artifact).is_relative_to(tmp_path / "cache")
    assert len({c.artifact for c in got if c.ok}) == 3
    assert all(c.cached for c in cuda.compile_all(ok, "k", (), H200))


@pytest.mark.parametrize("where", ["submit", "result"])
def test_compile_all_survives_a_dead_worker_pool(tmp_path, monkeypatch, where):
    """A worker process that dies (a compiler crash) breaks the pool, at submit or while a
    compile is under way: the batch compiles in this process instead, and the next call
    starts a new pool."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cuda, "POOL_PROCS", 2)

    class Broken:
        def submit(self, *a, **k):
            if where == "submit":
                raise BrokenProcessPool("a worker died")
            f = Future()
            f.set_exception(BrokenProcessPool("a worker died"))
            return f

    monkeypatch.setattr(cuda, "_POOL", Broken())
    sources = ['extern "C" __global__ void k(float* y) { y[0] = %d.5f; }' % i for i in range(2)]
    got = cuda.compile_all(sources, "k", (), H200)
    assert all(c.ok and not c.cached for c in got)
    assert cuda._POOL is None  # dropped: the next batch starts a fresh pool
