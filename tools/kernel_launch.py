"""One configuration of a CUDA spec, compiled and launched outside the judge, for the probes in
tools/ (attn_numerics.py, verify_probe.py): pipe's own Builder renders, checks the source rules
and compiles (NVRTC), the CUDA Runtime loads and launches through cuda.core; outputs inside the
judge's guard bands (verify.poisoned), scratch buffers zeroed as the judge's (verify.scratch)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_cfg(spec, text: str) -> dict:
    """K=V,... (+ for , where tools/device-run.sh splits on commas) over the spec's start, and
    the space's parameters of one value; any other parameter left out is an error that names it."""
    cfg = {**{p.name: p.values[0] for p in spec.space.params if len(p.values) == 1}, **(spec.start or {})}
    for kv in filter(None, text.replace("+", ",").split(",")):
        k, v = kv.split("=")
        cfg[k] = int(v) if v.lstrip("-").isdigit() else v
    missing, unknown = sorted(set(spec.space.names) - set(cfg)), sorted(set(cfg) - set(spec.space.names))
    if missing or unknown:
        why = "; ".join([f"missing {', '.join(missing)}"] * bool(missing)
                        + [f"unknown {', '.join(unknown)}"] * bool(unknown))
        raise SystemExit(f"--cfg {text}: {why} (the space's parameters: {', '.join(spec.space.names)})")
    return cfg


def parse_shape(spec, text: str) -> dict:
    """K=V/K=V (the shape's symbols)."""
    shape = {k: int(v) for k, v in (kv.split("=") for kv in text.split("/"))}
    missing = set(spec.op.symbols) - set(shape)
    if missing:
        raise SystemExit(f"shape {text}: give {', '.join(sorted(missing))}")
    return shape


class Launcher:
    """The configuration `cfg` of `spec` at `shape`: `run(inputs)` -> the outputs (Poisoned) after
    one direct launch and a synchronize, and the scratch buffers."""

    def __init__(self, spec, cfg: dict, shape: dict):
        from runner.build.backends import cuda
        from runner.build.builder import Builder

        self.spec, self.cfg, self.shape = spec, cfg, shape
        b = Builder(spec)
        (src,) = b.render_all(cfg, shapes=[shape])
        (comp,) = b._compile_all([src])
        if not comp.ok:
            raise SystemExit(f"{cfg}: {comp.status}: {comp.reason}")
        self.resources = comp.resources
        self.rt = cuda.Runtime(spec.hw, spec.runtime)
        names = {t.name for t in (*spec.op.inputs, *spec.op.outputs, *spec.kernel.scratch)}
        types = {s.name: s.type for s in spec.op.scalars}
        kinds = [("ptr" if x in names else types.get(x, self.rt.symbol_type)) for x in spec.kernel.args]
        self.fn = self.rt.load(comp.artifact, spec.kernel.entry, kinds)
        self.geo = b.geometry(cfg, [shape])[0]
        self.scalars = {s.name: s.value for s in spec.op.scalars}

    def run(self, inputs: dict) -> tuple[list, list]:
        import torch

        from runner.judge.inputs import TORCH_DTYPES, shape_of
        from runner.judge.verify import poisoned, scratch

        op, env = self.spec.op, self.spec.op.shape_env(self.shape)
        outs = [poisoned(shape_of(t, env), TORCH_DTYPES[t.dtype], "cuda") for t in op.outputs]
        ws = [scratch(sc.name, tuple(self.geo["scratch"][sc.name]), TORCH_DTYPES[sc.dtype], "cuda")
              for sc in self.spec.kernel.scratch]
        vals = {**{k: v.data_ptr() for k, v in inputs.items()},
                **{t.name: o.view.data_ptr() for t, o in zip(op.outputs, outs)}, **{w.name: w.ptr for w in ws}}
        args = [vals[n] if n in vals else self.scalars[n] if n in self.scalars else self.shape[n]
                for n in self.spec.kernel.args]
        self.rt.prepare(self.fn, args, self.geo, mode="direct")()
        torch.cuda.synchronize()
        return outs, ws
