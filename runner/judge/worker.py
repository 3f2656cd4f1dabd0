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
import secrets
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
        self.rt = backends.get(spec.kernel.backend).Runtime(spec.hw, spec.runtime)
        from ..userpath import load_callable  # from the spec's folder, then sys.path

        self.reference = load_callable(spec.op.reference, spec.home)
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

    def _check(self, outs: list, refs: list, which: int, guards: bool = True) -> str | None:
        from .verify import compare

        for t, o, (r, bound) in zip(self.op.outputs, outs, refs):
            if guards and not o.guards_intact(which):
                return f"output '{t.name}': wrote outside its bounds (guard band changed)"
            ok, why, _ = compare(o.view, r, self.op.atol, self.op.rtol, bound)
            if not ok:
                return f"output '{t.name}': {why}"
        return None

    def _bench(self, call, budget_scale: float = 1.0, refresh=None, check_at=None,
               second_check: float | None = None) -> list[float]:
        from .timing import bench

        rt = self.spec.runtime
        flush = self.rt.flush if rt.cache == "cold" else None
        hooks = [h for h in (refresh, flush) if h is not None]
        before = (lambda: [h() for h in hooks]) if hooks else None
        checks = [check_at] if check_at else []
        if check_at and second_check is not None:
            checks.append((second_check, check_at[1]))
        return bench(call, self.rt.sync, rt.warmup_ms * budget_scale, rt.rep_ms * budget_scale,
                     before=before, timer=self.rt.timer, checks=checks, min_reps=10)

    # -- requests --------------------------------------------------------------
    def evaluate(self, job: dict) -> dict:
        """Verify on every shape (spec and extra), then time the spec's shapes. A job may name
        its own `shapes`, how many of them to time (`n_timed`) and the check rounds (`checks`):
        pipe compare verifies a kernel for a held-out shape that way before it is shipped."""
        from .timing import stats

        shapes_out = []
        all_shapes = job.get("shapes") or self.op.all_shapes
        n_timed = job.get("n_timed", len(self.op.shapes))
        checks = job.get("checks", self.spec.runtime.checks)
        clock = time.perf_counter
        # where the judge's time goes, for pipe report; time_s splits into the second value
        # set and its reference (time_setup_s), the timed loop (time_loop_s) and the output
        # checks after timed calls (time_check_s)
        phases = {"verify_s": 0.0, "time_s": 0.0, "time_setup_s": 0.0, "time_loop_s": 0.0, "time_check_s": 0.0}
        for si, shape in enumerate(all_shapes):  # extra shapes: verified, not timed
            t0 = clock()
            fn = self.rt.load(job["artifacts"][si], self.spec.kernel.entry, self.kinds)
            geometry = job["geometry"][si]
            label = f"shape {si} {shape}" if si < n_timed else f"extra shape {si - n_timed} {shape}"
            outs = self._outputs(shape)
            inputs: dict = {}
            for r in range(checks):
                # the distribution cycles with the shape too, so a trial meets every one of them
                fresh = self._inputs(shape, _seed(job["seed"], si, r), r + si)
                if r % 2 == 0:  # new buffers, new addresses
                    inputs = fresh
                else:  # new values at the same addresses: defeats caching by pointer
                    for k, v in fresh.items():
                        inputs[k].copy_(v)
                before = {k: v.clone() for k, v in inputs.items()}
                refs = self._reference(inputs)
                run = self.rt.prepare(fn, self._values(shape, inputs, outs), geometry)
                for which in (0, 1):  # two runs, two poisons: both must pass
                    for o in outs:
                        o.fill(which)
                    self.rt.sync()
                    run()
                    self.rt.sync()
                    why = self._check(outs, refs, which)
                    if why:
                        return {"status": "wrong", "reason": f"{label}, check {r}: {why}"}
                if not self.op.in_place:
                    for k, v in inputs.items():
                        if not self.torch.equal(v, before[k]):
                            return {"status": "wrong",
                                    "reason": f"{label}: input '{k}' was modified by the kernel"}
            t1 = clock()
            phases["verify_s"] += t1 - t0
            if si >= n_timed:
                continue
            why, times = self._time_checked(job, si, shape, inputs, before, refs, run, outs, phases)
            phases["time_s"] += clock() - t1
            if why:
                status = "impossible" if why.startswith("the device stayed busy") else "wrong"
                return {"status": status, "reason": f"{label}, timed calls: {why}"}
            shapes_out.append(stats(times).as_dict())
        return {"status": "ok", "shapes": shapes_out, "phases": {k: round(v, 4) for k, v in phases.items()}}

    def _time_checked(self, job, si, shape, inputs, values0, refs0, run, outs, phases):
        """Time `run` while two value sets take turns in the input buffers.

        Before every timed call (outside the timed region) the inputs get the
        other set's values, so no call sees the inputs of the call before it:
        a kernel that skips work when its inputs look unchanged, or replays a
        cached output, leaves a wrong output. Two random timed calls and the
        last are checked against the reference of the values they were given,
        with no poison in the output beforehand (poison would tip a kernel off);
        when all of them were given the same set, one more call, on the other
        set, is checked too, so a kernel that works on one set's calls only (or
        stops after verification) cannot pass unseen.
        """
        clock = time.perf_counter
        t0 = clock()
        sets = [values0, self._inputs(shape, _seed(job["seed"], si, "timing"), 1 + si)]
        refs = [refs0, self._reference(sets[1])]
        state, refresh = _alternate(inputs, sets)
        self.rt.sync()
        checking = [0.0]

        failed: list[str] = []
        seen: set[int] = set()  # the value sets the checked calls were given

        def check():
            c0 = clock()
            self.rt.sync()
            why = self._check(outs, refs[state["cur"]], 1, guards=True)
            seen.add(state["cur"])
            if why:
                failed.append(why)
            checking[0] += clock() - c0

        rng = random.Random(job["seed"] + si)
        self.rt.walls = []
        t1 = clock()
        times = self._bench(run, refresh=refresh, check_at=(rng.random(), check), second_check=rng.random())
        phases["time_setup_s"] += t1 - t0
        phases["time_loop_s"] += clock() - t1 - checking[0]
        late = self._late(times)
        if late:
            return late, times
        if failed:
            return failed[0], times
        check()
        if not failed and len(seen) < 2:
            # Every checked call was given the same value set. A kernel that skips the work
            # on the calls of one set (after the checks of verification, or every other call)
            # leaves that set's output in place and would pass them all: one more call, on the
            # other set, is checked too.
            refresh()
            run()
            check()
        phases["time_check_s"] += checking[0]
        return (failed[0] if failed else None), times

    def _late(self, times: list[float]) -> str | None:
        """Did the device stay busy well after the end event (work on another stream)?
        `walls` holds, per timed call, the gap from the end event to the device going idle."""
        walls = getattr(self.rt, "walls", None)
        if not walls:
            return None
        ev, gap = _mid(times), _mid(walls)
        if gap > max(200e-6, ev):
            return (f"the device stayed busy {gap * 1e6:.1f} us after the end event of a {ev * 1e6:.1f} us "
                    "call: work outside the timed stream")
        return None

    def torch_arm(self, mode: str):
        """The reference in the op's dtype as production runs it: eager, or torch.compile of it
        (one compiled function per worker, so its compiled code is reused across requests)."""
        if mode != "compile":
            return self.reference
        if getattr(self, "_compiled", None) is None:
            self._compiled = self.torch.compile(self.reference, dynamic=False)
        return self._compiled

    def warm_torch(self, compile_: bool, triton: str | None = None, shapes=None) -> None:
        """Run the torch arms that compile (torch.compile, a Triton kernel) once on every shape
        before a CPU worker's sandbox goes on: Dynamo and Inductor write their caches and start
        the host compiler on the first call of each shape, which the sandbox forbids."""
        arms = self._other_arms(compile_, triton)[0]
        for si, shape in enumerate(shapes or self.op.shapes):
            inputs = self._inputs(shape, _seed("warm", si), 0)
            for name, f in arms.items():
                if name == "torch eager":
                    continue
                try:
                    f(**inputs, **self.scalars)
                except Exception:  # the arm reports its own error when compared
                    pass

    def _other_arms(self, compile_: bool, triton: str | None) -> tuple[dict, dict]:
        """The torch arms of pipe compare, built once per worker: {name: fn}, {name: note}."""
        key = (bool(compile_), triton)
        cache = self.__dict__.setdefault("_arms", {})
        if key in cache:
            return cache[key]
        others: dict = {"torch eager": self.reference}
        notes: dict = {}
        if compile_:
            others["torch.compile"] = self.torch_arm("compile")
        if triton:
            try:
                from ..userpath import load_callable

                others["triton"] = load_callable(triton, self.spec.home)
            except Exception as e:  # no triton here: say so in the table
                notes["triton"] = f"unavailable: {type(e).__name__}: {e}"[:300]
        cache[key] = (others, notes)
        return others, notes

    def baseline(self, mode: str) -> dict:
        from .timing import stats

        fn = self.torch_arm(mode)
        out = []
        for si, shape in enumerate(self.op.shapes):
            inputs = self._inputs(shape, _seed("baseline", si), 0)
            run = self.rt.prepare_torch(lambda: fn(**inputs, **self.scalars))
            times = self._bench(run)
            out.append(stats(times).as_dict())
        return {"status": "ok", "shapes": out}

    def _rotation(self, shape: dict, tag: tuple):
        """Two value sets for one shape's inputs, their references, and `refresh`, which
        copies the other set into the input buffers before a call (state["cur"] says which)."""
        inputs = self._inputs(shape, _seed(*tag, 0), 0)
        sets = [{k: v.clone() for k, v in inputs.items()}, self._inputs(shape, _seed(*tag, 1), 1)]
        refs = [self._reference(sets[0]), self._reference(sets[1])]
        return (inputs, sets, refs, *_alternate(inputs, sets))

    def retime(self, jobs: list[dict], rounds: int, seed: int = 0) -> dict:
        """medians[round][job][shape]: the jobs timed in alternating order each round,
        under the same input rotation as `evaluate`, so no job can coast on unchanged
        inputs; after each job's timing its last output is checked against the reference.
        The runner draws `seed` afresh for every request: the inputs are unpredictable."""
        prepared, refreshers, checkers, keep = [], [], [], []
        mode = None
        for si, shape in enumerate(self.op.shapes):
            inputs, sets, refs, state, refresh = self._rotation(shape, ("retime", seed, si))

            row, outs_row = [], []
            for j in jobs:
                if j.get("torch"):  # the baseline's arm, timed under the same protocol, not checked
                    f = self.torch_arm(j["torch"])
                    call = self.rt.prepare_torch(lambda f=f, inputs=inputs: f(**inputs, **self.scalars), mode)
                    mode = getattr(call, "mode", mode)
                    row.append(call)
                    outs_row.append(None)
                    continue
                outs = self._outputs(shape)
                fn = self.rt.load(j["artifacts"][si], self.spec.kernel.entry, self.kinds)
                call = self.rt.prepare(fn, self._values(shape, inputs, outs), j["geometry"][si], mode=mode)
                mode = getattr(call, "mode", mode)  # every job of a shape runs in the first job's mode
                row.append(call)
                outs_row.append(outs)
            mode = None
            prepared.append(row)
            refreshers.append(refresh)
            checkers.append((outs_row, refs, state))
            keep.append((inputs, sets))  # the prepared calls point into these buffers
        medians = []
        for r in range(rounds):
            row = [[0.0] * len(self.op.shapes) for _ in jobs]
            order = list(range(len(jobs)))
            if r % 2:
                order.reverse()
            for si in range(len(self.op.shapes)):
                for j in order:
                    ts = self._bench(prepared[si][j], budget_scale=0.3, refresh=refreshers[si])
                    row[j][si] = _mid(ts)
                    self.rt.sync()
                    outs_row, refs, state = checkers[si]
                    if outs_row[j] is None:
                        continue
                    why = self._check(outs_row[j], refs[state["cur"]], 1, guards=False)
                    if why:
                        return {"status": "wrong", "job": j, "reason": f"re-timing, shape {si}: {why}"}
            medians.append(row)
        return {"status": "ok", "medians": medians}

    def compare(self, job: dict) -> dict:
        """Side by side on every spec shape, in rounds that alternate the order: each shape's
        tuned candidates, the reference in the op's dtype (torch eager), torch.compile of it,
        the spec's Triton kernel, and a device copy of the op's bytes (half read, half
        written). Every arm is checked against the float64 reference before it is timed;
        the candidates also after their last timed call. One protocol for all arms: the
        inputs change before every call and the L2 is flushed as the spec says."""
        import statistics

        from .verify import compare as close_enough

        torch = self.torch
        others, notes = self._other_arms(job.get("compile"), job.get("triton"))
        others, notes = dict(others), dict(notes)
        if not job.get("eager", True):
            others.pop("torch eager")
        shapes = []
        for si, shape in enumerate(job.get("shapes") or self.op.shapes):
            inputs, sets, refs, state, refresh = self._rotation(shape, ("compare", job["seed"], si))

            calls, errors, outs_of = {}, dict(notes), {}
            mode = None  # every arm of a shape runs in the first arm's mode (graph replay or direct)
            for cand in job["candidates"][si]:
                name = cand["label"]
                outs = self._outputs(shape)
                try:
                    fn = self.rt.load(cand["artifact"], self.spec.kernel.entry, self.kinds)
                    call = self.rt.prepare(fn, self._values(shape, inputs, outs), cand["geometry"], mode=mode)
                    for o in outs:
                        o.fill(0)
                    self.rt.sync()
                    call()
                    self.rt.sync()
                except Exception as e:
                    if not self.rt.healthy():
                        raise  # a sticky device error: the worker is lost, the runner says so
                    errors[name] = f"{type(e).__name__}: {e}"[:400]
                    continue
                mode = getattr(call, "mode", mode)
                errors[name] = self._check(outs, refs[0], 0)
                calls[name], outs_of[name] = call, outs
            for name, f in others.items():
                try:
                    res = f(**inputs, **self.scalars)
                    self.rt.sync()
                    res = list(res) if isinstance(res, (tuple, list)) else [res]
                    errors[name] = next((f"output {i}: {why}" for i, (o, (r, b)) in enumerate(zip(res, refs[0]))
                                         for ok, why, _ in [close_enough(o, r, self.op.atol, self.op.rtol, b)]
                                         if not ok), None)
                    calls[name] = self.rt.prepare_torch(lambda f=f, inputs=inputs: f(**inputs, **self.scalars), mode)
                    mode = getattr(calls[name], "mode", mode)
                except Exception as e:
                    errors[name] = f"{type(e).__name__}: {e}"[:400]
            if job.get("copy", True):
                nbytes = int(self.op.bytes(self.op.shape_env(shape)))
                src = torch.randint(0, 256, (max(1, nbytes // 2),), dtype=torch.uint8, device=self.rt.device)
                dst = torch.empty_like(src)
                calls["copy"] = self.rt.prepare_torch(lambda src=src, dst=dst: dst.copy_(src), mode)
                errors["copy"] = None
            names = list(calls)
            times: dict[str, list[float]] = {k: [] for k in names}
            for r in range(job.get("rounds", 3)):
                for name in (names if r % 2 == 0 else names[::-1]):
                    # one protocol for every arm: new input values and the L2 flush queued
                    # ahead of each call (which also keeps the device busy while the host
                    # launches, so no arm's host overhead lands between its events)
                    ts = self._bench(calls[name], refresh=refresh)
                    times[name].append(_mid(ts))
                    if name in outs_of and errors[name] is None:
                        self.rt.sync()
                        why = self._check(outs_of[name], refs[state["cur"]], 1, guards=False)
                        if why:
                            errors[name] = f"after timing: {why}"
            shapes.append({name: {"median": statistics.median(times[name]) if times[name] else None,
                                  "rounds": times[name], "error": errors.get(name),
                                  "mode": getattr(calls.get(name), "mode", None)}
                           for name in dict.fromkeys([*names, *errors])})
            del calls, outs_of, inputs, sets, refs
            torch.cuda.empty_cache() if self.rt.device == "cuda" else None
        return {"status": "ok", "shapes": shapes, "machine": self._machine()}

    def _machine(self) -> dict:
        torch = self.torch
        info = {"torch": torch.__version__}
        if self.rt.device == "cuda":
            info["device"] = torch.cuda.get_device_name()
            info["cuda"] = torch.version.cuda
            try:
                import cuda.core

                info["cuda.core"] = cuda.core.__version__
            except Exception:
                pass
            try:
                import triton

                info["triton"] = triton.__version__
            except Exception:
                pass
        else:
            import platform

            info["device"] = platform.processor() or platform.machine()
        return info


def _mid(xs: list[float]) -> float:
    """The upper median (a measured value, never an average of two)."""
    return sorted(xs)[len(xs) // 2]


def _alternate(inputs: dict, sets: list[dict]):
    """(state, refresh): refresh copies the next of the two value sets into the input
    buffers before a call; state["cur"] says which set the buffers hold now."""
    state = {"i": 0, "cur": 0}

    def refresh():
        k = state["i"] % 2
        for name, v in sets[k].items():
            inputs[name].copy_(v)
        state["cur"] = k
        state["i"] += 1

    return state, refresh


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the runner dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_main(conn, spec, log_path: str) -> None:
    _die_with_parent()
    if os.getppid() == 1:  # the runner is already gone
        return
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner decides when we stop
    if spec.kernel.backend == "cpu":
        # Inductor compiles in this process, not in a pool of subprocesses that the CPU
        # sandbox would stop (and that leave semaphores behind at exit)
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    try:
        judge = Judge(spec)
    except Exception as e:
        conn.send({"status": "error", "reason": f"worker setup failed: {type(e).__name__}: {e}"})
        return
    conn.send({"status": "ready", "pid": os.getpid()})
    sandboxed = False
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind, nonce, args = msg[0], msg[1], msg[2:]
        if kind == "stop":
            return
        if kind in ("evaluate", "retime", "compare") and spec.kernel.backend == "cpu" and not sandboxed:
            from .sandbox import install

            # torch.compile (and Triton) write caches and start compilers on a shape's first call:
            # those calls happen now, before the sandbox forbids files and processes
            try:
                if kind == "compare":
                    judge.warm_torch(args[0].get("compile"), args[0].get("triton"), args[0].get("shapes"))
                elif spec.baseline == "compile":
                    judge.warm_torch(True)
            except Exception:
                traceback.print_exc()
            sandboxed = install()  # native candidate code runs from here on
        try:
            result = getattr(judge, kind)(*args)
            mode_broken = judge.rt.mode_changed() if hasattr(judge.rt, "mode_changed") else None
            if mode_broken and result.get("status") == "ok":
                result = {"status": "forbidden", "reason": f"the runtime mode changed during the trial: {mode_broken}"}
        except Exception as e:
            traceback.print_exc()
            result = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
            if not judge.rt.healthy():  # a sticky device error: this process's context is gone
                result = {"status": "fault", "fatal": True,
                          "reason": f"device fault: {type(e).__name__}: {str(e)[:400]}"}
                conn.send({**result, "nonce": nonce})
                return
        conn.send({**result, "nonce": nonce})


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
        """One verdict. Replies must echo the request's random nonce, and exactly one
        must arrive: anything else means something in the worker wrote to the pipe."""
        if self.proc is None or not self.proc.is_alive():
            err = self._start()
            if err:
                return err
        nonce = secrets.token_hex(16)
        try:
            self.conn.send((msg[0], nonce, *msg[1:]))
        except (BrokenPipeError, OSError):
            return self._died("before the request")
        t0 = time.monotonic()
        if not self.conn.poll(timeout):
            self._kill()
            return {"status": "hang", "reason": f"no verdict within {timeout:g} s; worker killed",
                    "seconds": time.monotonic() - t0}
        try:
            result = self.conn.recv()
        except (EOFError, ConnectionResetError):
            return self._died("during the trial")
        except Exception as e:  # bytes that do not unpickle: not from the judge
            self._kill()
            return {"status": "tampered", "reason": f"unreadable reply from the worker ({type(e).__name__}); worker killed"}
        if not isinstance(result, dict) or result.get("nonce") != nonce or self.conn.poll(0.05):
            self._kill()
            return {"status": "tampered",
                    "reason": "a reply without the request's nonce, or more than one reply: something in the "
                              "worker wrote to the verdict pipe; verdict discarded, worker killed"}
        result.pop("nonce")
        if result.get("fatal"):
            self._kill()
        return result

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(("stop", ""))
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
