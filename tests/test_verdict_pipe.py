"""The verdict pipe between the runner and its judge worker carries plain data only.

On the CPU backend a candidate's native code runs in the worker's process and can write any
bytes to the pipe (session 30's red team did: a pickle whose unpickling ran `eval` in the
runner, which then forged its own verdict and patched the re-timing). The runner must read a
bounded frame and resolve no global while unpickling it, so that nothing a candidate writes
runs in the runner, whatever the frame says.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading

import numpy as np
import pytest

from runner.judge import worker as wk


class _RunsCode:
    """Unpickling this calls os.system: a frame a candidate could write to the pipe."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


class _FakeProc:
    def __init__(self):
        self.alive, self.exitcode = True, None

    def is_alive(self):
        return self.alive

    def kill(self):
        self.alive = False

    def join(self, timeout=None):
        self.alive = False


def _worker_with_pipe(spec=None):
    w = wk.Worker(spec, "/dev/null")
    runner_end, worker_end = mp.Pipe()
    w.proc, w.conn = _FakeProc(), runner_end
    return w, worker_end


def test_a_reply_that_names_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    a, b = mp.Pipe()
    b.send_bytes(pickle.dumps({"status": "ok", "evil": _RunsCode(marker)}))
    with pytest.raises(pickle.UnpicklingError, match="plain data only"):
        wk.read_reply(a)
    assert not marker.exists()
    # the control: pickle itself would have run it
    pickle.loads(pickle.dumps(_RunsCode(marker)))
    assert marker.exists()


def test_the_worker_request_turns_such_a_reply_into_tampered(tmp_path):
    marker = tmp_path / "ran"
    w, worker_end = _worker_with_pipe()

    def answer():
        kind, nonce, *_ = worker_end.recv()
        worker_end.send_bytes(pickle.dumps({"status": "ok", "nonce": nonce, "x": _RunsCode(marker)}))

    t = threading.Thread(target=answer)
    t.start()
    v = w.request(("evaluate", {}), timeout=10)
    t.join()
    assert v["status"] == "tampered", v
    assert "not plain data" in v["reason"], v
    assert not marker.exists()
    assert w.proc is None  # killed


def test_an_oversized_reply_is_refused(tmp_path):
    w, worker_end = _worker_with_pipe()

    def answer():
        kind, nonce, *_ = worker_end.recv()
        worker_end.send_bytes(pickle.dumps({"status": "ok", "nonce": nonce, "pad": b"x" * (wk.REPLY_MAX_BYTES + 1)}))

    t = threading.Thread(target=answer)
    t.start()
    v = w.request(("evaluate", {}), timeout=10)
    t.join()
    assert v["status"] == "tampered", v


def test_a_plain_reply_with_the_nonce_is_believed():
    w, worker_end = _worker_with_pipe()

    def answer():
        kind, nonce, *_ = worker_end.recv()
        wk._send(worker_end, {"status": "ok", "nonce": nonce, "times": (np.float64(1.5e-6), np.float32(2.0)),
                              "per_shape": {(1, 2): [np.int64(3)]}, "arr": np.arange(3)})

    t = threading.Thread(target=answer)
    t.start()
    v = w.request(("evaluate", {}), timeout=10)
    t.join()
    assert v["status"] == "ok", v
    assert v["times"] == (1.5e-6, 2.0) and type(v["times"][0]) is float
    assert v["per_shape"] == {(1, 2): [3]} and v["arr"] == [0, 1, 2]


def test_plain_reduces_torch_values():
    torch = pytest.importorskip("torch")
    got = wk._plain({"t": torch.tensor(2.5), "v": torch.arange(2), "o": object()})
    assert got["t"] == 2.5 and got["v"] == [0, 1] and got["o"].startswith("<object object")
