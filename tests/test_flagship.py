"""The flagship CUDA pipelines (softmax, RMSNorm, cross-entropy on the h200 profile):
every configuration of their spaces launches on every shape (clusters included), the
worst register cases compile without spills, and the spec keys they rely on
(kernel.cluster, tensor `special` values) behave."""

import itertools

import pytest
import torch

from runner.core.errors import SpecError
from runner.judge.inputs import make_tensor
from runner.spec.spec import load_spec
from runner.build.builder import Builder

from .conftest import PIPELINES, shipped_spec

FLAGSHIP = ["softmax-h200", "rmsnorm-h200", "cross-entropy-h200"]


@pytest.mark.parametrize("name", FLAGSHIP)
def test_every_configuration_has_a_valid_launch_on_every_shape(name):
    from runner.build.backends import cuda

    spec = shipped_spec(PIPELINES / f"{name}.yaml")
    ev = Builder(spec)
    n = 0
    shapes = spec.op.all_shapes + spec.op.held_out_shapes
    for cfg in spec.space:
        for shape, geo in zip(shapes, ev.geometry(cfg, shapes=shapes)):
            # no registers known yet: the launch limits alone
            why = cuda.prune({}, geo, spec.hw, True)
            assert why is None, f"{name} {cfg} {shape}: {why}"
            assert 1 <= geo["cluster"][0] <= 8 and geo["grid"][0] % geo["cluster"][0] == 0
            n += 1
    assert n == len(list(spec.space)) * len(shapes) and spec.op.held_out_shapes


def test_long_rows_use_a_cluster_and_short_rows_share_a_block():
    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    ev = Builder(spec)
    geo = ev.geometry({"EPT": 16, "TMAX": 1024, "MINB": 1, "VEC": 8, "HOLD": "f32", "LOAD": "default",
                       "STORE": "default"})
    by_n = {s["N"]: g for s, g in zip(spec.op.shapes, geo)}  # the timed shapes come first
    assert by_n[131072]["cluster"] == [8] and by_n[131072]["grid"] == [1024 * 8]  # 8192 threads a row
    assert by_n[4096]["cluster"] == [1] and by_n[4096]["block"] == [1024] and by_n[4096]["grid"] == [32768 // 4]


def _by_shape(ev, cfg):
    """Launch geometry and rendered source of `cfg` on every timed and extra shape, by (M, N)."""
    shapes = ev.spec.op.all_shapes
    keys = [(s["M"], s["N"]) for s in shapes]
    return (dict(zip(keys, ev.geometry(cfg, shapes=shapes))), dict(zip(keys, ev.render_all(cfg, shapes=shapes))))


def test_tma_hold_is_a_persistent_ring_of_shared_memory_stages():
    """HOLD = "tma": one block per SM (MINB = 1, 512 threads and a producer warp) holding 3
    slots of 64 KiB, a tile of 8 rows each, for rows of 4096; a row of 131072 is spread over a cluster of 2,
    each block's half (128 KiB) in 16 KiB slots of a 14-slot ring, and 66 clusters fill the
    132 SMs; a row length that is no multiple of 8 cannot use 16-byte bulk copies and takes
    the f32 path."""
    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    ev = Builder(spec)
    cfg = {"EPT": 64, "TMAX": 512, "MINB": 1, "VEC": 8, "HOLD": "tma", "LOAD": "default", "STORE": "default"}
    by, src = _by_shape(ev, cfg)
    assert by[(32768, 4096)] == {**by[(32768, 4096)], "grid": [132], "block": [544], "cluster": [1],
                                 "shared_mem": 3 * 65536}
    assert by[(1024, 131072)]["cluster"] == [2] and by[(1024, 131072)]["grid"] == [132]
    assert by[(1024, 131072)]["shared_mem"] == 14 * 16384  # 224 KiB: the tile and 6 slots ahead
    assert by[(1, 4096)]["grid"] == [1]  # never more blocks than tiles
    odd = by[(5, 131071)]
    assert odd["shared_mem"] == 0 and odd["cluster"] == [4] and odd["grid"] == [5 * 4]  # the f32 geometry
    assert odd["block"] == [512]
    assert "bulk_load(ring" in src[(4096, 32768)] and "bulk_load(ring" not in src[(5, 131071)]
    # two blocks per SM share the SM's shared memory: a half row (32 KiB, two slots) and
    # four slots ahead each
    two = ev.geometry({**cfg, "EPT": 32, "MINB": 2}, shapes=[{"M": 4096, "N": 32768}])[0]
    assert two["cluster"] == [2] and two["shared_mem"] == 6 * 16384 and two["grid"] == [132 * 2]
    # 1024 threads leave no room for the producer warp: the f32 path
    wide = ev.geometry({**cfg, "TMAX": 1024}, shapes=[{"M": 4096, "N": 32768}])[0]
    assert wide["shared_mem"] == 0 and wide["block"] == [1024]


def test_softmax_ring_is_a_persistent_grid_with_a_shared_memory_ring_per_thread():
    """Softmax HOLD = "ring": no producer warp. A row of 32768 per block of 512 threads is one
    64 KiB piece, three in the ring; at 1024 threads and 64 elements a thread a row of 32768
    is 128 KiB, so four 32 KiB pieces of a seven-piece ring; a row of 131072 over a cluster of
    4 (120 SMs); a row length that is no multiple of VEC takes the f32 geometry."""
    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    ev = Builder(spec)
    cfg = {"EPT": 64, "TMAX": 512, "MINB": 1, "VEC": 8, "HOLD": "ring", "LOAD": "default", "STORE": "default"}
    by, src = _by_shape(ev, cfg)
    assert by[(4096, 32768)] == {**by[(4096, 32768)], "grid": [132], "block": [512], "cluster": [1],
                                 "shared_mem": 3 * 65536}
    assert by[(1024, 131072)] == {**by[(1024, 131072)], "grid": [120], "block": [512], "cluster": [4],
                                  "shared_mem": 3 * 65536}
    odd = by[(5, 131071)]
    assert odd["shared_mem"] == 0 and odd["grid"] == [5 * odd["cluster"][0]]
    assert "wait_ring();" in src[(4096, 32768)] and "wait_ring();" not in src[(5, 131071)]
    assert "#define SUBR 1" in src[(4096, 32768)] and "bulk_load(ring" not in src[(4096, 32768)]
    g, src = (d[(4096, 32768)] for d in _by_shape(ev, {**cfg, "TMAX": 1024}))
    assert g == {**g, "grid": [132], "block": [1024], "cluster": [1], "shared_mem": 7 * 32768}
    assert "#define PV 2" in src and "#define SUBR 4" in src and "#define NP 7" in src


def test_rmsnorm_ring_is_a_persistent_grid_with_a_shared_memory_ring_per_thread():
    """RMSNorm HOLD = "ring": rows of 65536 over a cluster of 2 blocks of 1024 threads, one
    64 KiB piece a block (half a row), three in the ring, 66 clusters on the 132 SMs; a whole
    row of 65536 in one block (64 elements a thread) is four 32 KiB pieces of a seven-piece
    ring; a row length that is no multiple of VEC cannot use vector copies and takes the bf16
    geometry, not persistent."""
    spec = shipped_spec(PIPELINES / "rmsnorm-h200.yaml")
    ev = Builder(spec)
    cfg = {"EPT": 32, "TMAX": 1024, "MINB": 1, "VEC": 8, "HOLD": "ring", "LOAD": "default", "STORE": "default"}
    by, src = _by_shape(ev, cfg)
    assert by[(2048, 65536)] == {**by[(2048, 65536)], "grid": [132], "block": [1024], "cluster": [2],
                                 "shared_mem": 3 * 65536}
    assert by[(1, 65536)]["grid"] == [2]  # never more clusters than row groups
    odd = by[(5, 65537)]
    assert odd["shared_mem"] == 0 and odd["grid"] == [5 * odd["cluster"][0]]
    assert "#define RING 1" in src[(2048, 65536)] and "#define RING 0" in src[(5, 65537)]
    g, src = (d[(2048, 65536)] for d in _by_shape(ev, {**cfg, "EPT": 64}))
    assert g == {**g, "grid": [132], "cluster": [1], "shared_mem": 7 * 32768}
    assert "#define PV 2" in src and "#define SUBR 4" in src and "#define NP 7" in src
    # clusters of 4 or 8 fit 120 SMs at once; two blocks an SM share its shared memory
    four = ev.geometry({**cfg, "TMAX": 256, "EPT": 64}, shapes=[{"M": 2048, "N": 65536}])[0]
    assert four["cluster"] == [4] and four["grid"] == [120]
    two = ev.geometry({**cfg, "TMAX": 512, "EPT": 16, "MINB": 2}, shapes=[{"M": 2048, "N": 65536}])[0]
    assert two["cluster"] == [8] and two["grid"] == [120 * 2 // 8 * 8] and two["shared_mem"] == 6 * 16384


cuda_core = pytest.importorskip("cuda.core", reason="cuda.core (pip install '.[cuda]') is needed to compile")


@pytest.mark.slow  # about 70 s of NVRTC builds: the slow suite, with every template change
@pytest.mark.parametrize("name", FLAGSHIP)
def test_register_heavy_corners_compile_without_spills(name):
    """The largest per-thread holds at the largest blocks: the template must fall back
    to streaming where a hold does not fit, never spill (spills are forbidden)."""
    from runner.build.backends import cuda

    spec = shipped_spec(PIPELINES / f"{name}.yaml")
    ev = Builder(spec)
    names = [p.name for p in spec.space.params]
    values = {p.name: list(p.values) for p in spec.space.params}
    corner = {"EPT": [values["EPT"][-1]], "TMAX": [values["TMAX"][0], values["TMAX"][-1]], "VEC": values["VEC"]}
    for key in ("HOLD", "UNROLL"):  # every hold kind, every unroll
        if key in values:
            corner[key] = values[key]
    if "MINB" in values:  # the tightest register cap
        corner["MINB"] = [values["MINB"][-1]]
    seen = {}
    for vals in itertools.product(*corner.values()):
        cfg = {**spec.start, **dict(zip(corner, vals))}
        assert set(cfg) == set(names)
        for src, geo in zip(ev.render_all(cfg), ev.geometry(cfg)):
            if src not in seen:
                seen[src] = cuda.compile(src, spec.kernel.entry, spec.kernel.options, spec.hw)
            r = seen[src]
            assert r.ok, f"{name} {cfg}: {r.reason}"
            assert cuda.prune(r.resources, geo, spec.hw, True) is None, f"{name} {cfg} {geo}: {r.resources}"


def test_cluster_prune_reasons():
    from runner.build.backends import cuda

    hw = shipped_spec(PIPELINES / "softmax-h200.yaml").hw
    assert "whole number of clusters" in cuda.prune({}, {"grid": [10], "block": [256], "cluster": [4]}, hw, True)
    assert cuda.prune({}, {"grid": [32], "block": [256], "cluster": [8]}, hw, True) is None
    # past the portable 8 only with the profile's opt-in size (the runner sets the kernel's
    # non-portable attribute): 16 on the H200's profile, never 32; none on a profile without it
    assert hw.get("max_cluster_size") == 8 and hw.get("max_cluster_size_opt_in") == 16
    assert cuda.prune({}, {"grid": [32], "block": [256], "cluster": [16]}, hw, True) is None
    assert "limit of 16" in cuda.prune({}, {"grid": [64], "block": [256], "cluster": [32]}, hw, True)
    portable = {k: v for k, v in hw.data.items() if k != "max_cluster_size_opt_in"}
    assert "portable limit of 8" in cuda.prune({}, {"grid": [32], "block": [256], "cluster": [16]}, portable, True)


def _copy(project, name):
    p = project / "pipelines" / name
    p.write_text((PIPELINES / name).read_text())
    return p


def test_cluster_needs_the_cuda_backend(project):
    spec = _copy(project, "rmsnorm-cpu.yaml")
    text = spec.read_text().replace("kernel:\n", "kernel:\n  cluster: 2\n", 1)
    spec.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert "kernel.cluster" in str(e.value) and "cuda backend" in str(e.value)


def test_special_values_replace_a_share_of_elements():
    spec = shipped_spec(PIPELINES / "cross-entropy-h200.yaml")
    t = next(x for x in spec.op.inputs if x.name == "targets")
    env = spec.op.shape_env({"M": 20000, "V": 1000})
    g = torch.Generator().manual_seed(1)
    x = make_tensor(t, env, "randint", g, "cpu")
    ignored = (x == -100).float().mean().item()
    assert x.dtype == torch.int64 and 0.04 < ignored < 0.06
    rest = x[x != -100]
    assert rest.min() >= 0 and rest.max() < 1000


def test_special_integer_value_must_be_integral(project):
    spec = _copy(project, "cross-entropy-h200.yaml")
    spec.write_text(spec.read_text().replace("special: {value: -100,", "special: {value: -1.5,"))
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert "op.inputs.targets.special.value" in str(e.value)


def test_masked_inputs_keep_a_finite_value_in_every_row():
    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    t = next(x for x in spec.op.inputs if x.name == "x")
    assert "masked" in t.dists
    x = make_tensor(t, spec.op.shape_env({"M": 300, "N": 1000}), "masked", torch.Generator().manual_seed(3), "cpu")
    neg = torch.isneginf(x.float())
    assert 0.2 < neg.float().mean().item() < 0.3
    assert not neg[:, 0].any() and torch.isfinite(x.float()[~neg]).all()


def test_bulk_stores_are_for_the_tma_hold_only():
    """STORE = "bulk" goes through the tma ring's slots: the spec's constraint keeps it out
    of every other hold, so the space grows by the tma slice alone."""
    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    cfg = {"EPT": 16, "TMAX": 256, "MINB": 2, "VEC": 8, "HOLD": "tma", "LOAD": "default", "STORE": "bulk"}
    assert spec.space.contains(cfg) is None
    for hold in ("f32", "bf16", "none", "ring"):
        assert "violates constraint" in spec.space.contains({**cfg, "HOLD": hold})
    configs = list(spec.space)
    assert sum(c["STORE"] == "bulk" for c in configs) == sum(c["HOLD"] == "tma" and c["STORE"] == "cs" for c in configs)
    assert {c["HOLD"] for c in configs if c["STORE"] == "bulk"} == {"tma"}


@pytest.mark.parametrize("shape,cfg,bulk", [
    # clusters of 8, the tile (2 slots) in registers: stored by the bulk-copy engine
    ({"M": 1024, "N": 131072}, {"EPT": 16, "TMAX": 256, "MINB": 2}, 2),
    # one block a row of 32768 (4 slots a tile, 14 slots)
    ({"M": 4096, "N": 32768}, {"EPT": 32, "TMAX": 512, "MINB": 1}, 4),
    # a cluster of 2 whose half row (128 KiB) does not fit in registers: stores as "default"
    ({"M": 1024, "N": 131072}, {"EPT": 64, "TMAX": 512, "MINB": 1}, 0),
])
def test_bulk_stores_replace_global_stores_where_the_tile_is_held(shape, cfg, bulk):
    """In the SASS: a bulk store (UBLKCP.G.S) for each slot of a tile and no 16-byte global
    store on the whole-tile path where the tile is held in registers; where it is not, the
    kernel is the "default" one."""
    import re

    from runner.build.backends import cuda

    from .conftest import load_script

    from runner.build import sass

    sass_mix = load_script("tools/sass_mix.py")
    if sass.tool() is None:
        pytest.skip(sass.UNAVAILABLE)
    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    ev = Builder(spec)
    ops = {}
    for store in ("bulk", "default"):
        full = {**cfg, "VEC": 8, "HOLD": "tma", "LOAD": "default", "STORE": store}
        r = cuda.compile(ev.render_all(full, shapes=[shape])[0], spec.kernel.entry, spec.kernel.options, spec.hw)
        assert r.ok and r.resources["spill_stores"] == 0, r.reason
        ops[store] = re.findall(r"\b(UBLKCP\.G\.S|STG\.E\.128)\b", sass_mix.sass(r.artifact))
    assert ops["bulk"].count("UBLKCP.G.S") == bulk and ops["default"].count("UBLKCP.G.S") == 0
    assert ops["default"].count("STG.E.128") > 0
    if bulk:
        # the shape's rows fill every block's part: the ordinary stores are compiled away
        assert ops["bulk"].count("STG.E.128") == 0
    else:
        assert ops["bulk"] == ops["default"]
