"""What a judge worker keeps between requests, and a request that finds the device's memory
full: the decoys it keeps are bounded in bytes, and a request that runs out of memory is served
once more with nothing kept (a range compare's table verification at the domain's largest size
ran out of memory on an 80 GB card beside the decoys of every tuning point, session 52)."""

from __future__ import annotations

import pytest
import torch
import yaml

from runner.judge import worker
from runner.spec.spec import load_spec

from .conftest import FEW_ROWS, PIPELINES


class _Rt:
    def __init__(self, healthy=True):
        self._healthy = healthy

    def healthy(self):
        return self._healthy


class _FakeJudge:
    """Raises each of `fails` in turn on `verify`, then answers; records what was called."""

    def __init__(self, fails, healthy=True):
        self.fails = list(fails)
        self.rt = _Rt(healthy)
        self.calls = []

    def verify(self, *args):
        self.calls.append(("verify", args))
        if self.fails:
            raise self.fails.pop(0)
        return {"status": "ok", "args": args}

    def free_memory(self):
        self.calls.append(("free_memory", ()))


def test_a_request_out_of_device_memory_is_served_again_with_nothing_kept():
    j = _FakeJudge([torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")])
    assert worker._serve(j, "verify", (3, ["shape"])) == {"status": "ok", "args": (3, ["shape"])}
    assert [c[0] for c in j.calls] == ["verify", "free_memory", "verify"]


def test_out_of_memory_twice_is_the_requests_error():
    j = _FakeJudge([torch.OutOfMemoryError("first"), torch.OutOfMemoryError("second")])
    with pytest.raises(torch.OutOfMemoryError, match="second"):
        worker._serve(j, "verify", ())
    assert [c[0] for c in j.calls] == ["verify", "free_memory", "verify"]


@pytest.mark.parametrize("error,healthy", [(RuntimeError("CUDA error: an illegal memory access"), True),
                                           (torch.OutOfMemoryError("out of memory"), False),
                                           (MemoryError(), True)])
def test_other_failures_and_a_lost_context_are_not_served_again(error, healthy):
    j = _FakeJudge([error], healthy=healthy)
    with pytest.raises(type(error)):
        worker._serve(j, "verify", ())
    assert [c[0] for c in j.calls] == ["verify"]


@pytest.fixture
def cpu_judge(tmp_path):
    d = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())
    d["op"]["shapes"] = FEW_ROWS
    (tmp_path / "pipelines").mkdir()
    path = tmp_path / "pipelines" / "rmsnorm-cpu.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    j = worker.Judge(load_spec(path))
    j.census = None
    return j


def _bytes(made) -> int:
    return sum(d.numel() * d.element_size() for pair in made for d in pair)


def test_the_decoys_a_worker_keeps_are_bounded_in_bytes(cpu_judge, monkeypatch):
    j = cpu_judge
    a, b = j.op.shapes[0], j.op.shapes[1]
    first = j._decoys(a)
    monkeypatch.setattr(worker, "DECOY_CACHE_BYTES", _bytes(first) + _bytes(first) // 2)
    j.free_memory()
    assert not j._decoy_cache and j._decoy_bytes == 0 and j._decoy_last is None
    kept = j._decoys(a)
    assert j._decoy_bytes == _bytes(kept) and list(j._decoy_cache.values()) == [kept]
    assert j._decoys(a) is kept  # kept: not made again
    other = j._decoys(b)  # over the bound: held as the last only
    assert j._decoy_bytes == _bytes(kept) and len(j._decoy_cache) == 1
    assert j._decoy_last[1] is other and j._decoys(b) is other
    # made again from the worker's secret seed, a dropped decoy is the same answer
    again = j._decoys(a)
    j.free_memory()
    remade = j._decoys(a)
    assert remade is not again
    assert all(torch.equal(x, y) for p, q in zip(again, remade) for x, y in zip(p, q))
