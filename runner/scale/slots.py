"""Slots: the judge workers a run spreads its trials over.

A slot owns one judge worker and answers `request(msg, timeout)` as `judge.worker.Worker`
does, so an Evaluator drives it unchanged. Three kinds:

- `LocalSlot` on the CPU backend (`--workers N`): a worker process of its own, pinned
  (every thread of it, by sched_setaffinity) to a set of `runtime.threads` cores of its
  own, so that N workers do not share cores while they time; with more workers than the
  host has cores for, the sets wrap around and the run logs `scale.oversubscribed`.
- `LocalSlot` on CUDA (`--gpus all` or `--gpus 0,1`): a worker process started with
  CUDA_VISIBLE_DEVICES set to its one GPU. GPUs whose properties differ (name, SMs,
  memory, compute capability) are refused: their times would be compared as equals.
- `RaySlot` (`--ray ADDRESS`): a Ray actor (num_gpus=1 on CUDA, num_cpus=k on the CPU)
  that holds a local judge worker on its node; the driver keeps the ledger and the agent.

A slot whose worker is lost for a reason that is not the trial's (killed from outside by
SIGKILL, a Ray actor or node gone) raises `SlotLost` from `request`: the scheduler gives
the trial to another slot. A local slot starts a new worker at its next request, as the
single worker always has; a Ray slot that lost its actor is `gone` for good.
"""

from __future__ import annotations

import os
import threading

from ..core.errors import PipeError
from ..core import log as logmod
from ..judge.worker import Worker

_ENV_LOCK = threading.Lock()  # CUDA_VISIBLE_DEVICES is set around a worker's start only


class SlotLost(Exception):
    """The slot's worker went away for a reason that is not the trial's."""


def lost_reason(result: dict) -> str | None:
    """A worker killed from outside (SIGKILL: `kill -9`, the OOM killer) is not the kernel's
    doing as far as the judge can tell; the trial is tried again on another slot (twice lost:
    it is recorded as a fault). A kernel's own crash (SIGSEGV, SIGABRT, ...) stays a fault."""
    r = str(result.get("reason", ""))
    if result.get("status") == "fault" and r.startswith("worker died") and "SIGKILL" in r:
        return r
    return None


class PinnedWorker(Worker):
    """A judge worker started with extra environment and pinned to a set of cores."""

    def __init__(self, spec, log_path: str, env: dict | None = None, cores: list[int] | None = None):
        super().__init__(spec, log_path)
        self.env = env or {}
        self.cores = cores

    def _start(self):
        with _ENV_LOCK:
            old = {k: os.environ.get(k) for k in self.env}
            os.environ.update(self.env)
            try:
                err = super()._start()
            finally:
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        if err is None and self.cores and self.proc is not None:
            pin(self.proc.pid, self.cores)
        return err

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.is_alive() else None


def pin(pid: int, cores: list[int]) -> None:
    """Every thread of process `pid` onto `cores` (threads it starts later inherit it)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = [str(pid)]
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass


class LocalSlot:
    def __init__(self, name: str, spec, log_path: str, env: dict | None = None, cores: list[int] | None = None):
        self.name = name
        self.worker = PinnedWorker(spec, log_path, env, cores)
        self.gone = False
        self.busy_since: float | None = None  # while a request is out (tests kill a busy worker)

    def request(self, msg: tuple, timeout: float) -> dict:
        import time

        self.busy_since = time.monotonic()
        try:
            r = self.worker.request(msg, timeout)
        finally:
            self.busy_since = None
        why = lost_reason(r)
        if why:
            raise SlotLost(f"{self.name}: {why}")
        return r

    @property
    def pid(self) -> int | None:
        return self.worker.pid

    def close(self) -> None:
        self.worker.close()


def cpu_threads(spec) -> int:
    return int(spec.runtime.threads or spec.hw.get("cores", 0) or 1)


def core_sets(n: int, k: int, cores: list[int] | None = None) -> tuple[list[list[int]], bool]:
    """n sets of k cores from those this process may use, disjoint while they fit, wrapping
    around when they do not; (sets, oversubscribed)."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    k = max(1, min(k, len(cores)))
    sets = [[cores[(i * k + j) % len(cores)] for j in range(k)] for i in range(n)]
    return sets, n * k > len(cores)


def local_cpu_slots(spec, run_dir, n: int) -> list[LocalSlot]:
    if spec.kernel.backend != "cpu":
        raise PipeError(f"--workers is for the CPU backend; spec {spec.name} is {spec.kernel.backend}: "
                        "use --gpus (one worker per GPU)")
    if n < 1:
        raise PipeError(f"--workers must be at least 1, got {n}")
    k = cpu_threads(spec)
    sets, over = core_sets(n, k)
    if over:
        logmod.get().warning("scale.oversubscribed", workers=n, threads_each=k, cores=len(os.sched_getaffinity(0)),
                             note="workers share cores: their timings disturb each other")
    return [LocalSlot(f"cpu:{i}", spec, str(_log(run_dir, i)), cores=sets[i]) for i in range(n)]


def _log(run_dir, i: int):
    return run_dir / ("worker.log" if i == 0 else f"worker.{i}.log")


def parse_gpus(text: str, count: int) -> list[int]:
    if text.strip() == "all":
        return list(range(count))
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PipeError(f"--gpus {text}: expected 'all' or a comma-separated list of device indices") from None
    if not ids or len(set(ids)) != len(ids):
        raise PipeError(f"--gpus {text}: expected distinct device indices")
    bad = [i for i in ids if not 0 <= i < count]
    if bad:
        raise PipeError(f"--gpus {text}: no device {bad[0]} (this host has {count})")
    return ids


def device_profile(props) -> dict:
    """What must be equal between two GPUs whose times are compared."""
    return {"name": str(props.name), "sms": int(props.multi_processor_count),
            "cc": f"{props.major}.{props.minor}", "memory_gib": round(int(props.total_memory) / 2**30)}


def same_profiles(profiles: dict[str, dict]) -> None:
    """Refuse devices whose profiles differ (PipeError naming the first two that do)."""
    items = list(profiles.items())
    for name, p in items[1:]:
        if p != items[0][1]:
            raise PipeError(f"devices differ: {items[0][0]} is {items[0][1]}, {name} is {p}; times from "
                            "different hardware are never compared as equals (use a list of like devices)")


def local_gpu_slots(spec, run_dir, text: str, hw_check: bool = True) -> list[LocalSlot]:
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        count = 0
    if count == 0:
        raise PipeError(f"--gpus {text}: no CUDA device on this machine (torch sees none); "
                        "on the CPU backend, --workers N runs N judge workers")
    if spec.kernel.backend != "cuda":
        raise PipeError(f"--gpus is for the CUDA backend; spec {spec.name} is {spec.kernel.backend}: "
                        "use --workers N (N judge workers on the CPU)")
    ids = parse_gpus(text, count)
    props = {f"cuda:{i}": torch.cuda.get_device_properties(i) for i in ids}
    same_profiles({k: device_profile(p) for k, p in props.items()})
    if hw_check:
        from ..spec.hw import check_device

        for k, p in props.items():
            bad = check_device(spec.hw, p)
            if bad:
                raise PipeError(f"{k} does not match profile {spec.hw.name}: " + "; ".join(bad))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    phys = [x.strip() for x in visible.split(",")] if visible else None
    return [LocalSlot(f"cuda:{i}", spec, str(_log(run_dir, n)),
                      env={"CUDA_VISIBLE_DEVICES": phys[i] if phys else str(i)}) for n, i in enumerate(ids)]


def precheck(spec, workers: int | None = None, gpus: str | None = None, ray: str | None = None) -> None:
    """The cheap refusals, before a run folder is touched (PipeError)."""
    if sum(x is not None for x in (gpus, ray)) > 1:
        raise PipeError("--gpus and --ray do not go together (on a cluster, every GPU of it is used)")
    if workers is not None and gpus is not None:
        raise PipeError("--workers is for the CPU backend and --gpus for CUDA: give one of them")
    if workers is not None and workers < 1:
        raise PipeError(f"--workers must be at least 1, got {workers}")
    if gpus is not None:
        try:
            import torch

            has = torch.cuda.is_available() and torch.cuda.device_count() > 0
        except Exception:
            has = False
        if not has:
            raise PipeError(f"--gpus {gpus}: no CUDA device on this machine (torch sees none); "
                            "on the CPU backend, --workers N runs N judge workers")
    if ray is not None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # (ray_slots._ray says the same, later)
            raise PipeError("--ray needs Ray: pip install -e '.[ray]' (the ray extra)")
        from .ray_slots import check_address

        check_address(ray)
    if workers is not None and ray is None and spec.kernel.backend != "cpu":
        raise PipeError(f"--workers is for the CPU backend; spec {spec.name} is {spec.kernel.backend}: "
                        "use --gpus (one worker per GPU)")


def make_slots(spec, run_dir, workers: int | None = None, gpus: str | None = None, ray: str | None = None,
               hw_check: bool = True) -> list | None:
    """The slots of a scaled-out run, or None for the one worker of a plain run."""
    if ray is not None:
        from .ray_slots import ray_slots

        return ray_slots(spec, run_dir, ray, workers)
    if gpus is not None:
        return local_gpu_slots(spec, run_dir, gpus, hw_check)
    if workers is not None:
        return local_cpu_slots(spec, run_dir, workers)
    return None
