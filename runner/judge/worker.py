"""The isolated worker: a long-lived process that verifies and times.

Flow: the runner starts one worker (spawned, so no state is shared) with the
spec; the worker imports torch and the reference once, then answers requests
over a pipe: `evaluate` (verify on every shape, then time), `baseline` (time
the reference by the same protocol) and `retime` (candidate and incumbent
timed interleaved). A candidate that crashes the process or never answers
costs one worker: `Worker.request` turns that into a `fault` or `hang`
verdict, and the next request starts a fresh worker. The worker's stdout and
stderr go to a log file in the run folder, so nothing a kernel prints reaches
the runner's output or its figures.
"""

from __future__ import annotations

import hashlib
import importlib
import multiprocessing as mp
import os
import random
import signal
import time
import traceback
from typing import Any

READY_TIMEOUT_S = 180.0


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:7], "little")


class Judge:
    """Runs inside the worker."""

    def __init__(self, spec):
        import torch

        from .. import backends

        self.torch = torch
        self.spec = spec
        self.op = spec.op
        self.rt = backends.get(spec.kernel.backend).Runtime(spec.hw)
        mod, _, fn = spec.op.reference.partition(":")
        self.reference = getattr(importlib.import_module(mod), fn)
        self.scalars = {s.name: s.value for s in spec.op.scalars}
        self.tensor_names = {t.name for t in (*spec.op.inputs, *spec.op.outputs)}
        self.kinds = [self._kind(a) for a in spec.kernel.args]

    def _kind(self, name: str) -> str:
        if name in self.tensor_names:
            return "ptr"
        for s in self.op.scalars:
            if s.name == name:
                return s.type
        return self.rt.symbol_type

    # -- helpers ---------------------------------------------------------------
    def _inputs(self, shape: dict, seed: int, round_: int) -> dict:
        from .inputs import make_inputs

        return make_inputs(self.op, shape, seed, round_, self.rt.device)

    def _reference(self, inputs: dict) -> list:
        """float64 reference on private copies, moved aside before the candidate runs."""
        torch = self.torch
        private = {k: (v.to(torch.float64) if v.dtype.is_floating_point else v.clone())
                   for k, v in inputs.items()}
        from .verify import tolerance_bound

        out = self.reference(**private, **self.scalars)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        del private
        return [(o.detach().clone(), tolerance_bound(o, self.op.atol, self.op.rtol)) for o in outs]

    def _outputs(self, shape: dict) -> list:
        from .inputs import TORCH_DTYPES, shape_of
        from .verify import poisoned

        env = self.op.shape_env(shape)
        return [poisoned(shape_of(t, env), TORCH_DTYPES[t.dtype], self.rt.device) for t in self.op.outputs]

    def _values(self, shape: dict, inputs: dict, outs: list) -> list:
        tensors = {**{k: v.data_ptr() for k, v in inputs.items()},
                   **{t.name: o.view.data_ptr() for t, o in zip(self.op.outputs, outs)}}
        vals = []
        for a in self.spec.kernel.args:
            vals.append(tensors[a] if a in tensors else self.scalars[a] if a in self.scalars else shape[a])
        return vals

    def _check(self, outs: list, refs: list, which: int) -> str | None:
        from .verify import compare

        for t, o, (r, bound) in zip(self.op.outputs, outs, refs):
            if not o.guards_intact(which):
                return f"output '{t.name}': wrote outside its bounds (guard band changed)"
            ok, why, _ = compare(o.view, r, self.op.atol, self.op.rtol, bound)
            if not ok:
                return f"output '{t.name}': {why}"
        return None

    def _bench(self, call, budget_scale: float = 1.0, around=None) -> list[float]:
        from .timing import bench

        rt = self.spec.runtime
        return bench(call, self.rt.sync, rt.warmup_ms * budget_scale, rt.rep_ms * budget_scale,
                     flush=self.rt.flush if rt.cache == "cold" else None, timer=self.rt.timer,
                     around=around)

    # -- requests --------------------------------------------------------------
    def evaluate(self, job: dict) -> dict:
        from .timing import stats

        shapes_out = []
        n_timed = len(self.op.shapes)
        for si, shape in enumerate(self.op.all_shapes):  # extra shapes: verified, not timed
            fn = self.rt.load(job["artifacts"][si], self.spec.kernel.entry, self.kinds)
            geometry = job.get("geometry", [None] * len(self.op.all_shapes))[si]
            label = f"shape {si} {shape}" if si < n_timed else f"extra shape {si - n_timed} {shape}"
            outs = self._outputs(shape)
            for r in range(self.spec.runtime.checks):
                inputs = self._inputs(shape, _seed(job["seed"], si, r), r)
                before = {k: v.clone() for k, v in inputs.items()}
                refs = self._reference(inputs)
                vals = self._values(shape, inputs, outs)
                for which in (0, 1):  # two runs, two poisons: both must pass
                    for o in outs:
                        o.fill(which)
                    self.rt.call(fn, vals, geometry)
                    self.rt.sync()
                    why = self._check(outs, refs, which)
                    if why:
                        return {"status": "wrong", "reason": f"{label}, check {r}: {why}"}
                if not self.op.in_place:
                    for k, v in inputs.items():
                        if not self.torch.equal(v, before[k]):
                            return {"status": "wrong",
                                    "reason": f"{label}: input '{k}' was modified by the kernel"}
            if si >= n_timed:
                continue
            # Time on the last checked inputs; one random timed call and the last are re-checked.
            rng = random.Random(job["seed"] + si)
            failed: list[str] = []

            def before_call():
                for o in outs:
                    o.fill(0)

            def after_call():
                why = self._check(outs, refs, 0)
                if why:
                    failed.append(why)

            times = self._bench(lambda: self.rt.call(fn, vals, geometry),
                                around=(rng.random(), before_call, after_call))
            # The hooked call left poison 0 in the guards; the last call's output must still be right.
            why = failed[0] if failed else self._check(outs, refs, 0)
            if why:
                return {"status": "wrong", "reason": f"{label}, timed call: {why}"}
            shapes_out.append(stats(times).as_dict())
        return {"status": "ok", "shapes": shapes_out}

    def baseline(self, mode: str) -> dict:
        from .timing import stats

        fn = self.reference
        if mode == "compile":
            fn = self.torch.compile(self.reference)
        out = []
        for si, shape in enumerate(self.op.shapes):
            inputs = self._inputs(shape, _seed("baseline", si), 0)
            times = self._bench(lambda: fn(**inputs, **self.scalars))
            out.append(stats(times).as_dict())
        return {"status": "ok", "shapes": out}

    def retime(self, jobs: list[dict], rounds: int) -> dict:
        """medians[round][job][shape]: the jobs timed in alternating order each round."""
        loaded = []
        for si, shape in enumerate(self.op.shapes):
            inputs = self._inputs(shape, _seed("retime", si), 0)
            outs = self._outputs(shape)
            vals = self._values(shape, inputs, outs)
            loaded.append([(self.rt.load(j["artifacts"][si], self.spec.kernel.entry, self.kinds),
                            j.get("geometry", [None] * len(self.op.shapes))[si], vals, inputs, outs)
                           for j in jobs])
        medians = []
        for r in range(rounds):
            row = [[0.0] * len(self.op.shapes) for _ in jobs]
            order = list(range(len(jobs)))
            if r % 2:
                order.reverse()
            for si in range(len(self.op.shapes)):
                for j in order:
                    fn, geo, vals, _, _ = loaded[si][j]
                    ts = self._bench(lambda: self.rt.call(fn, vals, geo), budget_scale=0.3)
                    row[j][si] = sorted(ts)[len(ts) // 2]
            medians.append(row)
        return {"status": "ok", "medians": medians}


def worker_main(conn, spec, log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner decides when we stop
    try:
        judge = Judge(spec)
    except Exception as e:
        conn.send({"status": "error", "reason": f"worker setup failed: {type(e).__name__}: {e}"})
        return
    conn.send({"status": "ready", "pid": os.getpid()})
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind, args = msg[0], msg[1:]
        if kind == "stop":
            return
        try:
            result = getattr(judge, kind)(*args)
        except Exception as e:
            traceback.print_exc()
            result = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
        conn.send(result)


class Worker:
    """Runner side: one live worker at a time, restarted after a fault or a hang."""

    def __init__(self, spec, log_path: str):
        self.spec = spec
        self.log_path = log_path
        self.proc = None
        self.conn = None
        self.starts = 0

    def _start(self) -> dict | None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, self.spec, self.log_path),
                                daemon=True, name="pipe-worker")
        self.proc.start()
        child.close()
        self.conn = parent
        self.starts += 1
        if not parent.poll(READY_TIMEOUT_S):
            self._kill()
            return {"status": "error", "reason": f"worker did not start within {READY_TIMEOUT_S:.0f} s"}
        try:
            msg = parent.recv()
        except EOFError:
            return self._died("while starting")
        if msg.get("status") != "ready":
            self._kill()
            return msg
        return None

    def _kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def _died(self, when: str) -> dict:
        self.proc.join(timeout=10)
        code = self.proc.exitcode
        if code is not None and code < 0:
            try:
                what = f"signal {signal.Signals(-code).name}"
            except ValueError:
                what = f"signal {-code}"
        else:
            what = f"exit code {code}"
        tail = _tail(self.log_path)
        self._kill()
        return {"status": "fault", "reason": f"worker died {when} ({what})" + (f": {tail}" if tail else "")}

    def request(self, msg: tuple, timeout: float) -> dict:
        if self.proc is None or not self.proc.is_alive():
            err = self._start()
            if err:
                return err
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError):
            return self._died("before the request")
        t0 = time.monotonic()
        if not self.conn.poll(timeout):
            self._kill()
            return {"status": "hang", "reason": f"no verdict within {timeout:g} s; worker killed",
                    "seconds": time.monotonic() - t0}
        try:
            return self.conn.recv()
        except (EOFError, ConnectionResetError):
            return self._died("during the trial")

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(("stop",))
                self.proc.join(timeout=5)
            except (BrokenPipeError, OSError):
                pass
        self._kill()


def _tail(path: str, n: int = 300) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 2000))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return (lines[-1] if lines else "")[:n]
