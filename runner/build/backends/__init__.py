"""Backends: compiling (source → artifact, no device needed) is kept apart
from running (artifact → a callable in the worker).

`get(name)` returns the backend module, which provides:
- `compile(source, entry, options, hw) -> Compiled` (runs in the runner);
- `prune(resources, geometry, hw, spills_forbidden) -> reason | None` where
  launch limits apply (optional);
- `Runtime(hw, runtime_spec)` (runs in the worker): `load(artifact, entry,
  kinds)`, `prepare(fn, values, geometry)` (the callable used for checked and
  timed calls alike), `prepare_torch(fn)`, `sync()`, `timer`, `flush()`,
  `healthy()`.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Compiled:
    ok: bool
    artifact: str | None  # path of the binary
    log: str
    seconds: float
    cached: bool = False
    resources: dict = field(default_factory=dict)  # registers, spills, stack ... where known
    status: str = "ok"  # ok | compile_error | pruned
    reason: str = ""
    ptx: dict | None = None  # CUDA: the classified PTX instructions (runner.build.ptx.analyze)


def wall_timer(call: Callable[[], None], sync: Callable[[], None]) -> float:
    """A call's wall-clock time between two syncs (the CPU backend's timer, and the
    timing protocol's default)."""
    sync()
    t = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - t


def cache_dir() -> Path:
    d = Path(os.environ.get("PIPE_CACHE_DIR") or Path.home() / ".cache" / "pipe")
    d.mkdir(parents=True, exist_ok=True)
    return d


def seal(path: Path, data: bytes | None = None) -> None:
    """Write the sha256 of a cached artifact beside it (PATH.sha256): of `data`, the bytes the
    compiler gave, else of the file as it stands. The temporary name is the thread's own (builds
    ahead compile on several threads, and two may finish the same source)."""
    digest = hashlib.sha256(path.read_bytes() if data is None else data).hexdigest()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.seal.tmp")
    tmp.write_text(digest)
    os.replace(tmp, path.with_name(path.name + ".sha256"))


def sealed(path: Path) -> bool:
    """Whether a cached artifact still has the bytes it was compiled with (its seal): a file
    put in its place afterwards is a cache miss, compiled again, never run, shipped or judged
    as the source's build."""
    try:
        want = path.with_name(path.name + ".sha256").read_text().strip()
        return hashlib.sha256(path.read_bytes()).hexdigest() == want
    except OSError:
        return False


def artifact_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def get(name: str):
    if name == "cpu":
        from . import cpu
        return cpu
    if name == "cuda":
        from . import cuda
        return cuda
    raise KeyError(f"backend '{name}' is not available in this version of pipe")
