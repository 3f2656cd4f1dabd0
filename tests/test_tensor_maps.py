"""kernel.tensor_maps (TMA descriptors the runner builds and passes by value), without a GPU:
the spec's checks with file:line and the key path, the launch geometry's boxes, the exported
package's table and its arguments. The descriptors themselves are built and launched in
tests/test_tensor_maps_gpu.py."""

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from runner.build.builder import Builder
from runner.ship import export as export_mod
from runner.ship import exported_runtime as ert
from runner.spec.spec import load_spec

from .conftest import pipe_main

TMA = Path(__file__).resolve().parent / "tma_cuda"
BASE = yaml.safe_load((TMA / "spec.yaml").read_text())


def spec_copy(tmp_path: Path, change=None) -> Path:
    """The tensor-map test spec, changed, in a folder of its own with its template and reference."""
    d = copy.deepcopy(BASE)
    if change is not None:
        change(d)
    for f in ("tma_scale.cu.j2", "tma_ref.py"):
        shutil.copyfile(TMA / f, tmp_path / f)
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def errors(path: Path) -> list[str]:
    r = pipe_main("validate", path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    return [ln for ln in r.stderr.splitlines() if ln.startswith(str(path))]


def test_the_spec_and_the_launch_carry_each_maps_box():
    s = load_spec(TMA / "spec.yaml")
    maps = {m.name: m for m in s.kernel.tensor_maps}
    assert set(maps) == {"xm0", "xm128"} and maps["xm128"].swizzle == 128 and maps["xm0"].swizzle == 0
    assert maps["xm0"].tensor == "x" and maps["xm0"].elem == 2
    # the launch carries a box for the map the configuration reads (`when`), none for the other
    geo = Builder(s).geometry({"BM": 16, "SW": 0}, [{"M": 37, "N": 200}])[0]
    assert geo["tensor_maps"] == {"xm0": [16, 64]}
    assert geo["grid"] == [4, 3]
    assert Builder(s).geometry({"BM": 64, "SW": 128}, [{"M": 37, "N": 200}])[0]["tensor_maps"] == {"xm128": [64, 64]}
    # x reaches the kernel through its maps alone: no pointer argument, and no complaint
    assert "x" not in s.kernel.args
    # the exported package's table: the maps' expressions, for the exported op to evaluate
    t = export_mod.launch_table(s)
    assert t["tensor_maps"] == [{"name": "xm0", "tensor": "x", "box": ["BM", "64"], "swizzle": 0, "when": "SW == 0"},
                                {"name": "xm128", "tensor": "x", "box": ["BM", "64"], "swizzle": 128,
                                 "when": "SW == 128"}]


@pytest.mark.parametrize("change, where, says", [
    (lambda d: d["kernel"]["tensor_maps"]["xm0"].update(tensor="z"), "kernel.tensor_maps.xm0.tensor",
     "'z' is no input or output"),
    (lambda d: d["kernel"]["tensor_maps"]["xm0"].update(box=["BM"]), "kernel.tensor_maps.xm0.box",
     "the box has 1 dimensions; 'x' has 2"),
    (lambda d: d["kernel"]["args"].remove("xm128"), "kernel.tensor_maps.xm128", "not passed to the kernel"),
    (lambda d: d["kernel"]["tensor_maps"].update(BM={"tensor": "x", "box": [1, 64]}), "kernel.tensor_maps.BM",
     "has the name of a search parameter"),
    # boxes the tensor copy cannot move, found over the space (BM = 64 passes, 512 does not)
    (lambda d: d["search"]["params"].update(BM=[64, 512]), "kernel.tensor_maps.xm0.box",
     "must be a whole number from 1 to 256"),
    (lambda d: d["kernel"]["tensor_maps"]["xm0"].update(box=["BM", 4]), "kernel.tensor_maps.xm0.box",
     "innermost dimension is 8 bytes"),
    (lambda d: d["kernel"]["tensor_maps"]["xm128"].update(box=["BM", 128]), "kernel.tensor_maps.xm128.box",
     "more than the 128-byte swizzle spans"),
    (lambda d: d["kernel"]["tensor_maps"]["xm0"].update(swizzle=16), "kernel.tensor_maps.xm0.swizzle", ""),
    (lambda d: d["kernel"]["tensor_maps"]["xm0"].update(when="SWZ == 0"), "kernel.tensor_maps.xm0.when",
     "SWZ"),
    # a box the tensor copy cannot move is an error only where the configuration reads the map
    (lambda d: (d["search"]["params"].update(BM=[64, 512]), d["kernel"]["tensor_maps"]["xm0"].update(when="BM < 512")),
     "kernel.tensor_maps.xm128.box", "must be a whole number from 1 to 256"),
    # a listed shape whose rows the tensor copy cannot address (200 bytes apart)
    (lambda d: (d["op"].pop("domain_where"), d["op"]["extra_shapes"].append({"M": 3, "N": 100})),
     "kernel.tensor_maps.xm0.tensor", "bytes in dimension 0; the tensor copy needs multiples of 16"),
])
def test_a_bad_tensor_map_is_a_spec_error_at_its_key(tmp_path, change, where, says):
    p = spec_copy(tmp_path, change)
    errs = errors(p)
    hit = [e for e in errs if f": {where}: " in e and says in e]
    assert hit, errs
    # file:line:col of the key
    assert hit[0].split(":")[1].isdigit() and hit[0].split(":")[2].isdigit()


def test_tensor_maps_need_the_cuda_backend(tmp_path):
    p = spec_copy(tmp_path, lambda d: d.update(hardware="host-cpu"))
    assert any("tensor maps (TMA) need the cuda backend" in e for e in errors(p))


class _Tensor:
    """A stand-in for a CUDA tensor: what the exported op reads of it."""

    def __init__(self, ptr, shape, elem=2):
        self.ptr, self.shape, self.device, self.elem = ptr, shape, "cuda:0", elem

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return (self.shape[1], 1)

    def element_size(self):
        return self.elem

    def dim(self):
        return len(self.shape)


def _exported_op(tmp_path):
    s = load_spec(TMA / "spec.yaml")
    table = {"op": "t.scale", "inputs": [{"name": "x", "dtype": "bf16", "shape": ["M", "N"]}],
             "outputs": [{"name": "y", "dtype": "bf16", "shape": ["M", "N"]}], "scalars": [],
             "symbols": ["M", "N"], "baked": [], "entries": [], "entry": "tma_scale",
             "args": list(s.kernel.args), **export_mod.launch_table(s)}
    return ert.Op(tmp_path, table, reference=None)


def test_the_exported_op_builds_each_map_on_the_callers_tensor(tmp_path, monkeypatch):
    op = _exported_op(tmp_path)
    built = []

    def fake(t, box, swizzle, dtype):  # the descriptor: cuda.core's, on a GPU
        built.append((t.ptr, box, swizzle, dtype))
        return ("map", t.ptr, box, swizzle)
    monkeypatch.setattr(ert, "tensor_map", fake)
    monkeypatch.setattr(ert, "placeholder_map", lambda device: ("placeholder", device))
    e = {"params": {"BM": 64, "SW": 128}, "cubin": "k.cubin"}
    x, y = _Tensor(4096, (100, 512)), _Tensor(8192, (100, 512))
    env = {"M": 100, "N": 512}
    args = op.arguments(e, env, {"x": x}, {}, [y], [128, 128, 8, 4, 4])
    # SW 128 reads xm128 (`when`): it is built; xm0 is a placeholder the kernel never reads
    assert args[0] == ("placeholder", "cuda:0") and args[1] == ("map", 4096, (64, 64), 128)
    assert args[2] == 8192 and int(args[3]) == 100 and int(args[4]) == 512
    assert built == [(4096, (64, 64), 128, "bf16")]
    # another configuration's box, another tensor: built on it, every call (a kept descriptor
    # would keep the caller's tensor alive)
    args = op.arguments({**e, "params": {"BM": 16, "SW": 0}}, env, {"x": _Tensor(12288, (100, 512))}, {}, [y],
                        [128, 128, 8, 4, 4])
    assert built[-1:] == [(12288, (16, 64), 0, "bf16")] and args[1] == ("placeholder", "cuda:0")


def test_a_tensor_the_copy_cannot_address_takes_the_fallback(tmp_path):
    op = _exported_op(tmp_path)
    e = {"params": {"BM": 64, "SW": 128}, "cubin": "k.cubin"}
    good, y = _Tensor(4096, (100, 512)), _Tensor(8192, (100, 512))
    env = {"M": 100, "N": 512}
    assert ert.tensor_map_unfit(good) is None and op._maps_fit(e, {"x": good}, [y], env)
    odd = _Tensor(4096, (100, 100))  # rows 200 bytes apart
    assert "stride of dimension 0 is 200 bytes" in ert.tensor_map_unfit(odd)
    assert not op._maps_fit(e, {"x": odd}, [y], env)
    assert "16-byte boundary" in ert.tensor_map_unfit(_Tensor(4104, (100, 512)))
    assert ert.tensor_map_unfit(_Tensor(4096, (1, 100))) is None  # one row: no stride to keep


def test_the_judge_builds_each_map_on_its_own_buffer_with_the_launch_box(monkeypatch):
    # the worker's argument list, without a GPU: the map on the judge's tensor (an output's
    # view, not its guarded buffer), its box from the launch geometry, in kernel.args order
    import torch

    from runner.judge.worker import Judge

    s = load_spec(TMA / "spec.yaml")
    w = Judge.__new__(Judge)
    w.spec, w.op, w.scalars = s, s.op, {}
    w.tensor_maps = {m.name: m for m in s.kernel.tensor_maps}
    built = []

    def fake(t, box, swizzle, dtype):
        built.append((t, box, swizzle, dtype))
        return f"map{len(built)}"
    monkeypatch.setattr(ert, "tensor_map", fake)

    class Out:
        def __init__(self, view):
            self.view = view
    x = torch.zeros(37, 200, dtype=torch.bfloat16)
    guarded = torch.zeros(37 * 200 + 64, dtype=torch.bfloat16)
    y = Out(guarded[32:32 + 37 * 200].view(37, 200))
    monkeypatch.setattr(ert, "placeholder_map", lambda device: f"placeholder on {device}")
    geo = Builder(s).geometry({"BM": 16, "SW": 0}, [{"M": 37, "N": 200}])[0]
    vals = w._values({"M": 37, "N": 200}, {"x": x}, [y], (), geo)
    # SW 0 reads xm0 alone (`when`): built with the launch's box; xm128's place holds a placeholder
    assert vals[:2] == ["map1", "placeholder on cpu"] and vals[2] == y.view.data_ptr() and vals[3:] == [37, 200]
    assert len(built) == 1 and built[0][0] is x and built[0][1:] == ([16, 64], 0, "bf16")


def test_the_launch_takes_a_map_only_as_a_128_byte_parameter(monkeypatch):
    # Runtime.load against the kernel's own parameter sizes (from its cubin): a tensor map is
    # 128 bytes by value; a kernel that declares a pointer there is refused, with the reason
    import cuda.core

    from runner.build.backends import cuda as cuda_backend

    class Kernel:
        def __init__(self, sizes):
            self.arguments_info = [type("P", (), {"size": n})() for n in sizes]

    class Obj:
        sizes: list = []

        @classmethod
        def from_cubin(cls, path):
            return cls()

        def get_kernel(self, entry):
            return Kernel(Obj.sizes)
    monkeypatch.setattr(cuda.core, "ObjectCode", Obj)
    rt = cuda_backend.Runtime.__new__(cuda_backend.Runtime)
    rt._mods = {}
    kinds = ["tmap", "tmap", "ptr", "auto", "auto"]
    Obj.sizes = [128, 128, 8, 4, 4]
    kernel, casts = rt.load("a.cubin", "tma_scale", kinds)
    marker = object()
    assert casts[0](marker) is marker and casts[1](marker) is marker  # the descriptor as built
    Obj.sizes = [8, 128, 8, 4, 4]
    rt._mods = {}
    with pytest.raises(cuda_backend.LaunchError, match="parameter 0 of 'tma_scale' is 8 bytes, the spec passes a "
                                                        "tensor map"):
        rt.load("b.cubin", "tma_scale", kinds)
