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
    geo = Builder(s).geometry({"BM": 16, "SW": 0}, [{"M": 37, "N": 200}])[0]
    assert geo["tensor_maps"] == {"xm0": [16, 64], "xm128": [16, 64]}
    assert geo["grid"] == [4, 3]
    # x reaches the kernel through its maps alone: no pointer argument, and no complaint
    assert "x" not in s.kernel.args
    # the exported package's table: the maps' expressions, for the exported op to evaluate
    t = export_mod.launch_table(s)
    assert t["tensor_maps"] == [{"name": "xm0", "tensor": "x", "box": ["BM", "64"], "swizzle": 0},
                                {"name": "xm128", "tensor": "x", "box": ["BM", "64"], "swizzle": 128}]


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
    """A stand-in for a CUDA tensor: what Op.tensor_maps reads of it."""

    def __init__(self, ptr, shape):
        self.ptr, self.shape, self.device = ptr, shape, "cuda:0"

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return (self.shape[1], 1)


def test_the_exported_op_builds_each_map_on_the_callers_tensor(tmp_path, monkeypatch):
    s = load_spec(TMA / "spec.yaml")
    table = {"op": "t.scale", "inputs": [{"name": "x", "dtype": "bf16", "shape": ["M", "N"]}],
             "outputs": [{"name": "y", "dtype": "bf16", "shape": ["M", "N"]}], "scalars": [],
             "symbols": ["M", "N"], "baked": [], "entries": [], "entry": "tma_scale",
             "args": list(s.kernel.args), **export_mod.launch_table(s)}
    op = ert.Op(tmp_path, table, reference=None)
    built = []

    def fake(t, box, swizzle, dtype):  # the descriptor: cuda.core's, on a GPU
        built.append((t.ptr, box, swizzle, dtype))
        return ("map", t.ptr, box, swizzle)
    monkeypatch.setattr(ert, "tensor_map", fake)
    e = {"params": {"BM": 64, "SW": 128}, "cubin": "k.cubin"}
    x, y = _Tensor(4096, (100, 512)), _Tensor(8192, (100, 512))
    env = {"M": 100, "N": 512}
    args = op.arguments(e, env, {"x": x}, {}, [y], [128, 128, 8, 4, 4])
    assert args[0] == ("map", 4096, (64, 64), 0) and args[1] == ("map", 4096, (64, 64), 128)
    assert args[2] == 8192 and int(args[3]) == 100 and int(args[4]) == 512
    # the same buffers again: the descriptors are reused, none built
    op.arguments(e, env, {"x": x}, {}, [y], [128, 128, 8, 4, 4])
    assert len(built) == 2
    # another tensor (another address): built anew on it
    op.arguments(e, env, {"x": _Tensor(12288, (100, 512))}, {}, [y], [128, 128, 8, 4, 4])
    assert len(built) == 4 and built[-1][0] == 12288
