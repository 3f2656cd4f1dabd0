"""The judge's secret sample positions sit on the device while the timed calls run (every call's
output is gathered there as it returns). A kernel that found them and rewrote them, so that every
sample landed where it had computed, would disarm the per-call samples: the host keeps their
values, and positions changed after the loop are a verdict of their own. The judge runs in this
process with a Python kernel (the check's own logic, no native code)."""
from __future__ import annotations

import torch

from runner.build.builder import Builder
from runner.judge import worker
from runner.spec.spec import load_spec

from .conftest import PIPELINES


def _evaluate(monkeypatch, rewrite_after: int | None) -> dict:
    spec = load_spec(PIPELINES / "rmsnorm-cpu.yaml")
    made: list = []
    real = worker._sample_positions

    def recorded(outs, device):
        made.append(real(outs, device))
        return made[-1]

    monkeypatch.setattr(worker, "_sample_positions", recorded)
    j = worker.Judge(spec)
    j.census = None
    calls = [0]

    def kernel(x, w, out, M, N, eps):  # honest RMSNorm in float64, rounded once
        calls[0] += 1
        xd = x.double()
        out.copy_((xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + eps) * w.double()).float())
        if rewrite_after is not None and made and calls[0] > rewrite_after:
            for p in made[-2]:  # the outputs' positions of the loop that is running
                p.zero_()

    j.rt.load = lambda artifact, entry, kinds: kernel

    def values(shape, inputs, outs, ws=(), geometry=None):
        named = {**inputs, **{t.name: o.view for t, o in zip(j.op.outputs, outs)}}
        return [named[a] if a in named else (shape[a] if a in shape else j.scalars[a]) for a in spec.kernel.args]

    j._values = values
    threads = torch.get_num_threads()
    try:
        job = {"seed": 5, "artifacts": ["py"] * len(j.op.all_shapes),
               "geometry": Builder(spec).geometry(dict(spec.start))}
        return j.evaluate(job)
    finally:
        torch.set_num_threads(threads)


def test_an_honest_kernel_passes(monkeypatch):
    r = _evaluate(monkeypatch, None)
    assert r["status"] == "ok", r


def test_rewritten_sample_positions_are_wrong(monkeypatch):
    r = _evaluate(monkeypatch, rewrite_after=30)
    assert r["status"] == "wrong", r
    assert "sample positions were rewritten" in r["reason"], r["reason"]
