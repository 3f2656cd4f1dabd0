"""Ray slots: each GPU of a cluster (or k CPUs of it, on the CPU backend) is an actor that
holds a judge worker on its node; the driver keeps the ledger and the agent.

Ray is an optional extra (`pip install -e '.[ray]'`). The driver compiles; an actor on
another node does not see the driver's compile cache, so it asks for the artifacts it
lacks (by their paths in the request) and the driver sends their bytes once; the actor
keeps them in a folder of its own and rewrites the paths.
"""

from __future__ import annotations

import os
import platform
import socket
import tempfile

from ..core.errors import PipeError
from ..judge.worker import HANG_CAP
from .slots import SlotLost, cpu_threads, device_profile, lost_reason, same_profiles

READY_S = 180  # an actor's start (its node's Python, torch, the judge worker)


def _ray():
    try:
        import ray
    except ImportError:
        raise PipeError("--ray needs Ray: pip install -e '.[ray]' (the ray extra)") from None
    return ray


CONNECT_S = 5.0  # how long an address given to --ray has to answer


def unreachable(address: str, timeout: float = CONNECT_S) -> str | None:
    """Why nothing is there to connect to at a Ray address (HOST:PORT or ray://HOST:PORT), or None.
    `ray.init` retries a wrong address for ever (a typo hung `pipe run` with no word); a plain TCP
    connection within `timeout` answers first."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return "expected HOST:PORT, ray://HOST:PORT, auto (the cluster `ray start` made here) or local"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        return f"nothing answers at {host}:{port} within {timeout:g} s ({e.strerror or type(e).__name__})"
    return None


def check_address(address: str) -> None:
    """PipeError where nothing answers at a --ray address (not `auto` or `local`: those are Ray's
    own to find or start)."""
    why = unreachable(address) if address not in ("auto", "local") else None
    if why:
        raise PipeError(f"--ray {address}: cannot reach a Ray cluster: {why}")


def remote_why(e: BaseException) -> str:
    """One line for an error Ray brings back from an actor: the remote exception's own last line
    (`AssertionError: Torch not compiled with CUDA enabled`), not the remote traceback Ray's text
    holds; the error's type and first line where it names no cause."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
        return f"{type(cause).__name__}: {lines[0][:300]}" if lines else type(cause).__name__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    last = next((ln for ln in reversed(lines) if ln.partition(":")[0].strip().isidentifier()), None)
    return (last or f"{type(e).__name__}: {lines[0] if lines else ''}")[:300]


def artifact_paths(msg: tuple) -> list[str]:
    """The artifact files a request names (evaluate's job, retime's jobs)."""
    if msg[0] == "evaluate":  # a variant's job names the approved build too
        return list(dict.fromkeys((msg[1].get("artifacts") or []) + (msg[1].get("approved") or [])))
    if msg[0] == "retime":
        return list(dict.fromkeys(a for j in msg[1] for a in (j.get("artifacts") or [])))
    return []


def rewrite(msg: tuple, where: dict) -> tuple:
    if msg[0] == "evaluate":
        job = {**msg[1], "artifacts": [where.get(a, a) for a in msg[1]["artifacts"]]}
        if job.get("approved"):
            job["approved"] = [where.get(a, a) for a in job["approved"]]
        return (msg[0], job, *msg[2:])
    if msg[0] == "retime":
        jobs = [{**j, "artifacts": [where.get(a, a) for a in j["artifacts"]]} if j.get("artifacts") else j
                for j in msg[1]]
        return (msg[0], jobs, *msg[2:])
    return msg


class JudgeActor:
    """Runs in a Ray worker process: one judge worker (a local process of its own)."""

    def __init__(self, spec, log_path: str):
        from ..judge.worker import Worker

        if not os.path.isdir(os.path.dirname(log_path) or "."):  # another node: no run folder here
            log_path = os.path.join(tempfile.mkdtemp(prefix="pipe-actor-"), os.path.basename(log_path))
        self.spec = spec
        self.worker = Worker(spec, log_path)
        self.local: dict[str, str] = {}
        self.dir = tempfile.mkdtemp(prefix="pipe-artifacts-")

    def info(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        out = {"pid": os.getpid(), "node": ctx.get_node_id()[:8], "ip": ray.util.get_node_ip_address()}
        if self.spec.kernel.backend == "cuda":
            import torch

            out["profile"] = device_profile(torch.cuda.get_device_properties(0))
            out["gpu"] = os.environ.get("CUDA_VISIBLE_DEVICES", "?")
        else:
            out["profile"] = {"cpu": _cpu_model()}
        return out

    def request(self, msg: tuple, timeout: float, blobs: dict | None = None) -> dict:
        for path, data in (blobs or {}).items():
            dest = os.path.join(self.dir, f"{len(self.local)}-{os.path.basename(path)}")
            with open(dest, "wb") as f:
                f.write(data)
            self.local[path] = dest
        missing = [p for p in artifact_paths(msg) if p not in self.local and not os.path.exists(p)]
        if missing:
            return {"status": "_missing", "paths": missing}
        r = self.worker.request(rewrite(msg, self.local), timeout)
        r["worker_pid"] = self.worker.proc.pid if self.worker.proc is not None else None
        return r

    def close(self) -> None:
        self.worker.close()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class RaySlot:
    def __init__(self, name: str, actor, info: dict):
        self.name = name
        self.actor = actor
        self.info = info
        self.gone = False
        self.busy_since: float | None = None

    @property
    def pid(self) -> int:
        return self.info["pid"]

    def request(self, msg: tuple, timeout: float) -> dict:
        import time

        ray = _ray()
        self.busy_since = time.monotonic()
        try:
            blobs = None
            # the worker's own deadline runs from the judge's last progress, HANG_CAP times it in all
            # (judge/worker.Worker.request): the slot waits for that, and two minutes more
            wait = HANG_CAP * timeout + 120
            for _ in range(2):
                try:
                    r = ray.get(self.actor.request.remote(msg, timeout, blobs), timeout=wait)
                except ray.exceptions.GetTimeoutError:
                    self.gone = True
                    raise SlotLost(f"{self.name}: no answer within {wait:g} s") from None
                except ray.exceptions.RayError as e:  # the actor, its process or its node died
                    self.gone = True
                    raise SlotLost(f"{self.name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
                if r.get("status") != "_missing":
                    break
                blobs = {p: open(p, "rb").read() for p in r["paths"]}
        finally:
            self.busy_since = None
        r.pop("worker_pid", None)
        why = lost_reason(r)
        if why:
            raise SlotLost(f"{self.name}: {why}")
        return r

    def close(self) -> None:
        ray = _ray()
        if not self.gone:
            try:
                ray.get(self.actor.close.remote(), timeout=30)
            except Exception:
                pass
        try:
            ray.kill(self.actor)
        except Exception:
            pass


def ray_slots(spec, run_dir, address: str, workers: int | None = None) -> list[RaySlot]:
    """Connect to the cluster at `address` ('auto': the one started on this machine with `ray
    start`; 'local': start one in this process) and put one actor on each GPU (CUDA) or on
    each `runtime.threads` CPUs (CPU backend; `workers` caps how many)."""
    ray = _ray()
    if not ray.is_initialized():
        kw: dict = {"logging_level": "ERROR", "log_to_driver": False}
        if address == "local":
            here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            kw["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                [here, *filter(None, [os.environ.get("PYTHONPATH")])])}}
            if workers:
                kw["num_cpus"] = workers * (cpu_threads(spec) if spec.kernel.backend == "cpu" else 1)
        else:
            kw["address"] = address
            check_address(address)  # (the CLI's precheck asked already; run() may be called without it)
        try:
            ray.init(**kw)
        except Exception as e:
            raise PipeError(f"--ray {address}: cannot reach a Ray cluster ({type(e).__name__}: {e})") from None
    res = ray.cluster_resources()
    if spec.kernel.backend == "cuda":
        n, opts = int(res.get("GPU", 0)), {"num_gpus": 1, "num_cpus": 1}
        if n == 0:
            raise PipeError(f"--ray {address}: the cluster has no GPU (spec {spec.name} is CUDA)")
        if workers:
            n = min(n, workers)
    else:
        k = cpu_threads(spec)
        n, opts = int(res.get("CPU", 0)) // k, {"num_cpus": k}
        if workers:
            n = min(n, workers) if n else 0
        if n == 0:
            raise PipeError(f"--ray {address}: the cluster has {res.get('CPU', 0):g} CPUs, fewer than one "
                            f"worker's {k} (runtime.threads)")
    Actor = ray.remote(max_restarts=0, max_task_retries=0)(JudgeActor)
    actors = [Actor.options(**opts).remote(spec, str(run_dir / f"worker.ray{i}.log")) for i in range(n)]
    try:
        infos = ray.get([a.info.remote() for a in actors], timeout=READY_S)
    except Exception as e:
        for a in actors:
            ray.kill(a)
        raise PipeError(f"--ray {address}: the judge actors did not start ({remote_why(e)})") from None
    names = [f"ray:{i['ip']}:" + (f"cuda{i['gpu']}" if "gpu" in i else f"cpu{n}") for n, i in enumerate(infos)]
    try:
        same_profiles({nm: i["profile"] for nm, i in zip(names, infos)})
    except PipeError:
        for a in actors:
            ray.kill(a)
        raise
    return [RaySlot(nm, a, i) for nm, a, i in zip(names, actors, infos)]
