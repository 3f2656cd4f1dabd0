"""CPU backend: C++ compiled by the host compiler into a shared library, called
through ctypes on torch CPU tensors.

It makes the whole loop real on a machine without a GPU. Candidate code runs
only in the worker process, never in the runner, and a fixed set of source
patterns (file and process access, inline assembly, load-time constructors)
is refused so that a candidate cannot reach the ledger or the judge.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import time
from functools import lru_cache

from . import Compiled, artifact_key, cache_dir, wall_timer

CXX = os.environ.get("CXX", "g++")
BASE_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread")
COMPILE_TIMEOUT_S = 120

# Always refused on this backend: candidate code runs natively in the worker, which a
# seccomp filter also confines (judge/sandbox.py). Headers come from an allow-list,
# and no symbol may be declared by hand: only the entry point has C linkage.
ALLOWED_HEADERS = {"cmath", "math.h", "cstdint", "stdint.h", "cstddef", "stddef.h", "cstring", "climits",
                   "cfloat", "algorithm", "array", "atomic", "limits", "type_traits", "utility", "thread",
                   "immintrin.h", "arm_neon.h"}
ALLOWED_BUILTINS = {"expect", "prefetch", "assume_aligned", "unreachable", "trap", "memcpy", "memset",
                    "fma", "fmaf", "sqrt", "sqrtf", "fabs", "fabsf", "isnan", "isinf", "clz", "ctz",
                    "popcount", "bswap16", "bswap32", "bswap64", "printf"}
INTEGRITY = (
    (r"\b(asm|__asm__|__asm)\b", "inline assembly"),
    (r"\b(fopen|freopen|open|openat|creat|unlink|rename|remove|mmap|syscall|ptrace|fork|vfork|kill)\s*\(",
     "file, memory-mapping or process calls"),
    (r"#\s*include\s*[<\"](fstream|cstdio|stdio\.h|unistd\.h|fcntl\.h|sys/|dlfcn\.h|filesystem|signal\.h|csignal)",
     "headers for files, processes or signals"),
    (r"__attribute__\s*\(\(\s*(constructor|destructor)", "load-time constructors"),
    (r"\bstd::(ofstream|ifstream|fstream|filesystem|system)\b", "file or process access"),
)


@lru_cache(maxsize=1)
def compiler_version() -> str:
    try:
        out = subprocess.run([CXX, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"


toolchain = compiler_version  # the compiler a verdict depends on (pipe record --reuse compares it)


def integrity_violation(source: str, entry: str = "") -> str | None:
    from ..forbid import strip_comments

    code = strip_comments(source)

    def at(m: re.Match) -> str:
        return f"'{m.group(0).strip()}' at line {code.count(chr(10), 0, m.start()) + 1}"

    for m in re.finditer(r"#\s*include\s*[<\"]([^>\"]+)[>\"]", code):
        if m.group(1) not in ALLOWED_HEADERS:
            return f"header <{m.group(1)}> is not on the CPU backend's allow-list " \
                   f"({', '.join(sorted(ALLOWED_HEADERS))}): {at(m)}"
    for m in re.finditer(r"\bextern\b", code):
        if not re.match(r'extern\s+"C"\s+void\s+' + re.escape(entry) + r"\s*\(", code[m.start():]) or not entry:
            return f"only the entry point may be declared extern (symbols cannot be declared by hand): {at(m)}"
    m = re.search(r"##", code)
    if m:
        return f"token pasting is not allowed in CPU kernels: {at(m)}"
    for m in re.finditer(r"\b__builtin_(\w+)", code):
        if m.group(1) not in ALLOWED_BUILTINS:
            return f"builtin __builtin_{m.group(1)} is not allowed in CPU kernels: {at(m)}"
    for rx, what in INTEGRITY:
        m = re.search(rx, code)
        if m:
            line = code.count("\n", 0, m.start()) + 1
            return f"{what} are not allowed in CPU kernels: '{m.group(0).strip()}' at line {line}"
    return None


_DATA_TYPES = set("bBdDvVu")  # nm's writable data: bss, data, weak and unique objects
# vtables and type info (relocated once, then read-only) and the unwinder's personality reference
_READ_ONLY = ("_ZTV", "_ZTI", "_ZTS", "_ZTT", "DW.ref.")


def _nm_data(lib: str) -> dict[str, int] | None:
    """The writable data symbols of a shared library (statics included), or None without nm."""
    try:
        r = subprocess.run(["nm", "--defined-only", lib], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    out: dict[str, int] = {}
    for ln in r.stdout.splitlines():
        parts = ln.split()
        if len(parts) == 3 and parts[1] in _DATA_TYPES and not parts[2].startswith(_READ_ONLY):
            out[parts[2]] = out.get(parts[2], 0) + 1
    return out


@lru_cache(maxsize=8)
def _toolchain_data(options: tuple[str, ...]) -> frozenset:
    """What the toolchain itself puts in an empty library's writable data (_DYNAMIC,
    __dso_handle, completed.0, ...): never the kernel's. Worked out once per compiler and
    options, and kept in the artifact cache (every judge worker would compile the probe again)."""
    import json

    kept = cache_dir() / "cpu" / f"toolchain-{artifact_key(' '.join(options), compiler_version(), 'data')}.json"
    try:
        return frozenset(json.loads(kept.read_text()))
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory(prefix="pipe-cpu-") as tmp:
        src, lib = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write('extern "C" void pipe_probe(float* y) { y[0] = 1.f; }\n')
        r = subprocess.run([CXX, *BASE_FLAGS, *options, src, "-o", lib], capture_output=True, text=True,
                           timeout=COMPILE_TIMEOUT_S)
        syms = _nm_data(lib) if r.returncode == 0 else None
    if syms is None:
        return frozenset()
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp_kept = kept.with_suffix(f".{os.getpid()}.tmp")
    tmp_kept.write_text(json.dumps(sorted(syms)))
    os.replace(tmp_kept, kept)  # atomic, as the artifacts are
    return frozenset(syms)


def data_symbols(lib: str, options: tuple[str, ...]) -> dict | None:
    """The kernel's own state that outlives a call: writable static data (a global, a static
    local, a class static) beyond the toolchain's, as `ptx.analyze` reports a CUDA module's
    `.global` data ({"data": {name: 1}}, the other parts empty), so that the builder refuses a
    variant that declares data the approved template's build does not (`device_state`)."""
    syms = _nm_data(lib)
    if syms is None:
        return None
    base = _toolchain_data(tuple(options))
    return {"code": {}, "asm": {}, "extern": {}, "data": {k: v for k, v in sorted(syms.items()) if k not in base}}


def compile(source: str, entry: str, options: tuple[str, ...], hw) -> Compiled:
    t0 = time.perf_counter()
    bad = integrity_violation(source, entry)
    if bad:
        return Compiled(False, None, bad, 0.0, status="forbidden", reason=bad)
    key = artifact_key(source, " ".join(options), compiler_version(), "cpu")
    out = cache_dir() / "cpu" / f"{key}.so"
    if out.exists():
        return Compiled(True, str(out), "", time.perf_counter() - t0, cached=True,
                        ptx=data_symbols(str(out), options))
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pipe-cpu-") as tmp:
        src = os.path.join(tmp, "kernel.cpp")
        with open(src, "w") as f:
            f.write(source)
        lib = os.path.join(tmp, "kernel.so")
        cmd = [CXX, *BASE_FLAGS, *options, src, "-o", lib]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Compiled(False, None, "", time.perf_counter() - t0, status="compile_error",
                            reason=f"compiler timed out after {COMPILE_TIMEOUT_S} s")
        log = (r.stdout + r.stderr).replace(src, "kernel.cpp")
        if r.returncode != 0:
            first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:300])
            return Compiled(False, None, log, time.perf_counter() - t0, status="compile_error",
                            reason=first.strip()[:500])
        nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
        if nm.returncode == 0 and not re.search(r"\bT " + re.escape(entry) + r"$", nm.stdout, re.M):
            return Compiled(False, None, log, time.perf_counter() - t0, status="compile_error",
                            reason=f"entry '{entry}' is not an exported C symbol (missing extern \"C\"?)")
        data = data_symbols(lib, options)
        tmp_out = out.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(lib, tmp_out)
        os.replace(tmp_out, out)  # atomic: a reader sees the whole file or none
    return Compiled(True, str(out), log, time.perf_counter() - t0, ptx=data)


_CTYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float, "f64": ctypes.c_double,
           "ptr": ctypes.c_void_p}


class Runtime:
    """Worker side: load libraries, marshal torch tensors and scalars, time by wall clock."""

    device = "cpu"
    symbol_type = "i64"  # shape symbols are passed as int64_t

    def __init__(self, hw, runtime_spec=None):
        import torch

        self.hw = hw
        # torch's arms (the baseline, pipe compare's eager and compile) get the thread count
        # the spec gives kernels: a speedup over torch on other threads compares unlike things
        self.threads = int(getattr(runtime_spec, "threads", None) or hw.get("cores", 0) or os.cpu_count() or 1)
        torch.set_num_threads(self.threads)
        self._libs: dict[str, ctypes.CDLL] = {}
        self._flush_buf = None

    def load(self, artifact: str, entry: str, kinds: list[str]):
        lib = self._libs.get(artifact)
        if lib is None:
            lib = self._libs[artifact] = ctypes.CDLL(artifact)
        fn = getattr(lib, entry)
        fn.restype = None
        fn.argtypes = [_CTYPES[k] for k in kinds]
        return fn

    def prepare(self, fn, values: list, geometry=None, mode=None):
        """The one callable used for checked and timed calls alike."""
        return lambda: fn(*values)

    def prepare_torch(self, fn, mode=None):
        return fn

    def healthy(self) -> bool:
        return True

    def sync(self) -> None:
        pass

    def timer(self, call, sync) -> float:
        return wall_timer(call, sync)

    def flush(self) -> None:
        """Evict caches: write a buffer twice the profile's last-level cache."""
        import torch

        if self._flush_buf is None:
            n = 2 * int(self.hw.get("l2_bytes", 64 << 20)) // 4
            self._flush_buf = torch.empty(n, dtype=torch.float32)
        self._flush_buf.fill_(1.0)
