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
    """Raises each of `fails` in turn on `verify` (after `slow` seconds of the clock), then
    answers; records what was called, and whether it was the retry."""

    def __init__(self, fails, healthy=True, slow=0.0):
        self.fails = list(fails)
        self.rt = _Rt(healthy)
        self.calls = []
        self.slow = slow
        self._retry = False

    def verify(self, *args):
        self.calls.append(("verify", args, self._retry))
        if self.fails:
            worker.time.sleep(self.slow)
            raise self.fails.pop(0)
        return {"status": "ok", "args": args}

    def free_memory(self):
        self.calls.append(("free_memory", ()))


def test_a_request_out_of_device_memory_is_served_again_with_nothing_kept():
    j = _FakeJudge([torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")])
    r = worker._serve(j, "verify", (3, ["shape"]), 60.0)
    assert {k: r[k] for k in ("status", "args")} == {"status": "ok", "args": (3, ["shape"])}
    assert "ran out of device memory" in r["retried"] and "8.00 GiB" in r["retried"]
    assert [c[0] for c in j.calls] == ["verify", "free_memory", "verify"]
    assert [c[2] for c in j.calls if c[0] == "verify"] == [False, True] and j._retry is False


def test_a_first_attempt_that_took_much_of_the_time_limit_is_not_served_again():
    # a second attempt that ran out of the runner's time would be recorded as the kernel's hang
    j = _FakeJudge([torch.OutOfMemoryError("out of memory")], slow=0.3)
    with pytest.raises(torch.OutOfMemoryError):
        worker._serve(j, "verify", (), 0.3 / worker.RETRY_SHARE * 0.9)
    assert [c[0] for c in j.calls] == ["verify"]


def test_out_of_memory_twice_is_the_requests_error():
    j = _FakeJudge([torch.OutOfMemoryError("first"), torch.OutOfMemoryError("second")])
    with pytest.raises(torch.OutOfMemoryError, match="second"):
        worker._serve(j, "verify", ())
    assert [c[0] for c in j.calls] == ["verify", "free_memory", "verify"] and j._retry is False


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


def test_out_of_memory_in_one_arm_is_the_requests_on_the_first_attempt_and_the_arms_on_the_retry(cpu_judge):
    j = cpu_judge
    oom = torch.OutOfMemoryError("CUDA out of memory")
    assert j._not_the_arms(oom)  # first attempt: the whole request is served again
    assert not j._not_the_arms(RuntimeError("an SDPA backend this device lacks"))
    j._retry = True
    assert not j._not_the_arms(oom)  # nothing kept and still too large: the arm's, as before


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


class _HoldsFrame(_FakeJudge):
    """The first attempt keeps a large object in its own frame; free_memory records whether it
    was already gone (the failed attempt's traceback, and with it its frames, dropped)."""

    def verify(self, *args):
        import weakref

        class Big:
            pass

        big = Big()  # noqa: F841 - held by this frame only
        self.ref = weakref.ref(big)
        return super().verify(*args)

    def free_memory(self):
        self.freed_first = self.ref() is None
        super().free_memory()


def test_the_failed_attempts_frames_are_gone_before_memory_is_freed():
    j = _HoldsFrame([torch.OutOfMemoryError("CUDA out of memory")])
    assert worker._serve(j, "verify", ())["status"] == "ok"
    assert j.freed_first


def _main(*args):
    """worker_main with stdout and stderr on fds 1 and 2, as in a spawned worker (pytest's
    capture replaced them with its own files in this process)."""
    import os
    import sys

    sys.stdout = os.fdopen(1, "w", closefd=False)
    sys.stderr = os.fdopen(2, "w", closefd=False)
    worker.worker_main(*args)


def _forked_worker(spec, log_path):
    """worker_main in a forked process (so a monkeypatched Judge reaches it), driven by Worker."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    w = worker.Worker(spec, str(log_path))
    w.proc = ctx.Process(target=_main, args=(child, spec, str(log_path)), daemon=True)
    w.proc.start()
    child.close()
    w.conn = parent
    assert parent.poll(60) and worker.read_reply(parent)["status"] == "ready"
    return w


@pytest.mark.parametrize("fails,status", [(1, "ok"), (2, "error")])
def test_worker_main_serves_a_request_out_of_memory_once_more(tmp_path, monkeypatch, fails, status):
    d = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())
    d["op"]["shapes"] = FEW_ROWS
    (tmp_path / "pipelines").mkdir()
    path = tmp_path / "pipelines" / "rmsnorm-cpu.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    left = [fails]

    def check_reference(self, extra_only=False):
        if left[0]:
            left[0] -= 1
            raise torch.OutOfMemoryError(f"Tried to allocate 8.00 GiB ({left[0]} left)")
        return {"status": "ok"}

    monkeypatch.setattr(worker.Judge, "check_reference", check_reference)
    log = tmp_path / "worker.log"
    w = _forked_worker(load_spec(path), log)
    try:
        r = w.request(("check_reference", False), 60)
    finally:
        w.close()
    assert r["status"] == status, r
    assert (r.get("retried") is not None) == (status == "ok")
    if status == "error":
        assert "OutOfMemoryError" in r["reason"] and "0 left" in r["reason"]
    assert "served again with nothing kept" in log.read_text()
