"""CUDA backend: NVRTC through cuda.core to a cubin, launched through
cuda.core on torch's stream.

Compiling (in the runner) needs no GPU: the architecture comes from the
hardware profile. The ptxas report (`-v`) is parsed into registers, spills,
stack and static shared memory, and `prune` refuses launch configurations
that exceed the profile's limits, or that spill when spills are forbidden,
before anything runs. Cubins are cached on disk under the hash of source,
options and NVRTC version.

Running (in the worker): `Runtime.prepare` returns the one callable used for
both the checked and the timed calls: a direct launch, or the replay of a
CUDA graph that captured that launch (runtime mode `graph`, or `auto` when a
launch takes under 20 µs of device time). Times come from CUDA events around
each call, with a device spin queued ahead of the start event so that the
host's launch cost stays out of every figure; the L2 is flushed before each timed call unless the spec asks for a warm cache;
and after the end event a device-wide synchronize measures when the GPU
really went idle, which the judge compares with the event time.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import io
import json
import os
import re
import secrets
import threading
import time
from functools import lru_cache
from pathlib import Path

from .. import machine, ptx, sass

machine_reader = sass  # the reader of a variant's machine code (builder._judge_machine)
from . import Compiled, artifact_key, cache_dir, seal, sealed

# a prepared call without a mode, in auto mode: replayed as a CUDA graph when its own device
# time is under this. The judge never asks for one: it names every arm's mode from the
# shape's floor (core/figures.launch_mode), so no candidate's timing chooses it
from ...core.figures import GRAPH_BELOW_S
# A device spin queued ahead of every timed call's start event (about 50 us at the H200's
# 1.98 GHz, longer at lower clocks): the host's launch of the call (a cuda.core launch from
# Python takes 10 to 30 us, a graph replay a few) lands while the device is still busy, so
# the events hold the call's device time only. Without it a few-microsecond kernel read
# as 20 us and more, and auto mode then took it for a long one and launched it directly.
PAD_CYCLES = 100_000
# cuda.core picks its cu12/cu13 submodule at first import; a trial's sources compile on
# several threads, and two threads importing it at once can see it half initialized.
_IMPORT_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return f"nvrtc {major}.{minor}"


toolchain = nvrtc_version  # the compiler a verdict depends on (pipe record --reuse compares it)


@lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """Where cuda_bf16.h and friends live: the toolkit or the NVIDIA wheels."""
    import cuda.pathfinder as pf

    out = []
    for lib in ("cudart", "cccl"):
        try:
            d = pf.find_nvidia_header_directory(lib)
        except Exception:
            d = None
        if d and d not in out:
            out.append(str(d))
    return tuple(out)


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str, entry: str | None = None) -> dict:
    """Registers, spills, stack and static shared memory of the entry (or the first function)."""
    log = log.replace("\x00", "")
    sections = re.split(r"ptxas info\s*:\s*Compiling entry function '([^']+)'", log)
    # sections: [preamble, name1, body1, name2, body2, ...]
    bodies = {sections[i]: sections[i + 1] for i in range(1, len(sections) - 1, 2)}
    body = bodies.get(entry) if entry else None
    if body is None:
        body = next(iter(bodies.values()), log)
    out = {}
    m = _PTXAS_REGS.search(body)
    if m:
        out["registers"] = int(m.group(1))
    m = _PTXAS_SPILL.search(body)
    if m:
        out["stack_bytes"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    m = _PTXAS_SMEM.search(body)
    out["static_smem"] = int(m.group(1)) if m else 0
    return out


def _options(options: tuple[str, ...], arch: str, name: str):
    """Map command-line style options onto cuda.core ProgramOptions."""
    from cuda.core import ProgramOptions

    # no_cache: NVRTC 12.9+ keeps its own cache, and a cache hit prints no ptxas report.
    kw: dict = {"arch": arch, "std": "c++17", "include_path": list(include_dirs()), "ptxas_options": "-v",
                "name": name, "no_cache": True}
    macros = []
    for opt in options:
        if opt.startswith("-D"):
            k, _, v = opt[2:].partition("=")
            macros.append((k, v) if v else k)
        elif re.match(r"^--?arch=", opt):
            kw["arch"] = opt.split("=", 1)[1]
        elif re.match(r"^--?maxrregcount=\d+$", opt):
            kw["max_register_count"] = int(opt.split("=", 1)[1])
        elif opt in ("-lineinfo", "--lineinfo", "--generate-line-info"):
            kw["lineinfo"] = True
        elif opt in ("--use_fast_math", "-use_fast_math"):
            kw["use_fast_math"] = True
        elif re.match(r"^--?std=", opt):
            kw["std"] = opt.split("=", 1)[1]
        else:
            raise ValueError(f"unsupported NVRTC option '{opt}'")
    if macros:
        kw["define_macro"] = macros
    return ProgramOptions(**kw)


def _cached(source: str, entry: str, options: tuple[str, ...], hw):
    """(the cached Compiled or None, the cubin's path, its ptxas log's path)."""
    t0 = time.perf_counter()
    key = artifact_key(source, " ".join(options), hw.arch or "sm_90", nvrtc_version(), "cuda")
    out = cache_dir() / "cuda" / f"{key}.cubin"
    meta = out.with_suffix(".log")
    # the PTX itself, judged again on every hit by this version's rules (ptx.analyze): counts
    # kept from an older reader would let a build it misread pass after the reader was fixed
    kept = out.with_suffix(".ptx")
    if out.exists() and meta.exists() and kept.exists() and sealed(out):
        log = meta.read_text()
        try:
            counts = ptx.analyze(kept.read_text())
        except (OSError, UnicodeDecodeError):
            return None, out, meta
        return (Compiled(True, str(out), log, time.perf_counter() - t0, cached=True,
                         resources=parse_ptxas(log, entry), ptx=counts), out, meta)
    return None, out, meta


@lru_cache(maxsize=1)
def _rules_digest() -> str:
    """The judging code's own digest (the PTX reader, the source rules and preprocessor, pcpp's
    version): part of the keys of what the cache keeps from it, so a fixed rule never meets a
    verdict an older one left."""
    from importlib import metadata

    from .. import forbid

    h = hashlib.sha256()
    for mod in (ptx, sass, machine, forbid):
        h.update(Path(mod.__file__).read_bytes())
    h.update(inspect.getsource(_branches_differ).encode())  # (the expansion's question to the compiler)
    try:
        h.update(metadata.version("pcpp").encode())
    except metadata.PackageNotFoundError:
        pass
    return h.hexdigest()[:16]


def option_arch(options: tuple[str, ...], arch: str) -> str:
    """The architecture NVRTC compiles for: the last `--arch=` of the options (as `_options`
    reads them), else the profile's."""
    for opt in options:
        if re.match(r"^--?arch=", opt):
            arch = opt.split("=", 1)[1]
    return arch


def _expand(source: str, options: tuple[str, ...], arch: str) -> tuple[str | None, str]:
    """(the preprocessed source, "") or (None, why the preprocessor could not read it). The
    macros are those NVRTC defines for the architecture it compiles for: an `--arch=sm_90a`
    option defines the sm_90a feature macros, and the source rules must see the branches they
    open."""
    from .. import forbid

    arch = option_arch(options, arch)
    defines = [o[2:] for o in options if o.startswith("-D")]
    macros = forbid.nvrtc_macros(arch, nvrtc_version())
    try:
        text = forbid.preprocess(source, macros, defines)
        why = _branches_differ(source, options, arch, macros, defines)
    except Exception as e:  # forbid.PreprocessError, or pcpp's own
        return None, str(e)[:500] or type(e).__name__
    return (None, why) if why else (text, "")


def _branches_differ(source: str, options: tuple[str, ...], arch: str, macros: dict, defines: list) -> str:
    """Why the preprocessor's reading cannot stand for the compiler's, or "": every conditional
    directive gets a mark (`forbid.mark_branches`), and the branches pcpp kept must be those
    NVRTC kept (its `#pragma message` remarks). pcpp's own predefined macros, its arithmetic
    (`#if -0x8000000000000000 < 0`, `'\\377' > 0`), a function-like macro it is told differently
    and `true` in a condition each made it read another branch than the compiler compiled
    (session 44's second red team)."""
    from cuda.core import Program

    from .. import forbid

    tri = forbid.trigraphs(options)
    tag = secrets.token_hex(8)
    marked = forbid.mark_branches(source, tag, tri)
    if marked.count(f"pipe-branch:{tag}:") == 1:  # no conditional (odd layouts that hide one are refused first)
        return ""
    kept = forbid.branch_marks(forbid.preprocess(marked, macros, defines), tag)
    buf = io.StringIO()
    with _IMPORT_LOCK:
        opts = _options(options, arch, "pipe_branch_probe.cu")
    try:
        Program(marked, "c++", opts).compile("cubin", logs=buf)
        log = buf.getvalue()
    except Exception as e:  # NVRTCError: a source that does not compile still reports its remarks
        log = str(e)
    compiled = set(re.findall(r'#pragma message: "pipe-branch:' + tag + r':(\w+)"', log))
    if forbid.BRANCH_END not in compiled:
        return ("preprocessor: which branches the compiler takes could not be told (it stopped before the "
                "end of the source)")
    if kept != compiled:
        first = min((int(n) for n in kept ^ compiled), default=0)
        return (f"preprocessor: at line {first} the rules' preprocessor and the compiler take different branches "
                f"of a conditional: the rules would read code the compiler does not compile, or miss code it "
                f"does (write the condition so that both agree: a macro the source defines, plain arithmetic)")
    return ""


def _ptx_text(program) -> str:
    """The PTX of a compiled program: NVRTC keeps it beside the cubin of a real architecture."""
    from cuda.bindings import nvrtc

    err, n = nvrtc.nvrtcGetPTXSize(program.handle)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or not n:
        raise RuntimeError(f"NVRTC gave no PTX ({err})")
    buf = b" " * n
    (err,) = nvrtc.nvrtcGetPTX(program.handle, buf)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC gave no PTX ({err})")
    return buf.rstrip(b"\0 ").decode(errors="replace")


def compile(source: str, entry: str, options: tuple[str, ...], hw) -> Compiled:
    t0 = time.perf_counter()
    arch = hw.arch or "sm_90"
    hit, out, meta = _cached(source, entry, options, hw)
    if hit is not None:
        return hit
    try:
        with _IMPORT_LOCK:
            from cuda.core import Program

            opts = _options(options, arch, f"{entry}.cu")
    except ValueError as e:
        return Compiled(False, None, "", 0.0, status="compile_error", reason=str(e))
    except ImportError as e:
        return Compiled(False, None, "", 0.0, status="compile_error",
                        reason=f"cuda.core is not installed ({e}); pip install 'pipe-autoresearch[cuda]'")
    buf = io.StringIO()
    try:
        prog = Program(source, "c++", opts)
        obj = prog.compile("cubin", logs=buf)
        code = bytes(obj.code)
        ptx_text = _ptx_text(prog)
        ptx_counts = ptx.analyze(ptx_text)
    except Exception as e:  # NVRTCError carries the compiler log as its message
        msg = str(e).replace("\x00", "")
        first = next((ln.strip() for ln in msg.splitlines() if "error" in ln and "NVRTC_ERROR" not in ln),
                     msg.strip().splitlines()[0] if msg.strip() else type(e).__name__)
        return Compiled(False, None, msg, time.perf_counter() - t0, status="compile_error", reason=first[:500])
    log = buf.getvalue().replace("\x00", "")
    in_log = re.search(r"Compiling entry function '" + re.escape(entry) + "'", log)
    if not in_log and (log.strip() or entry.encode() not in code):
        return Compiled(False, None, log, time.perf_counter() - t0, status="compile_error",
                        reason=f"no kernel named '{entry}' in the cubin (missing extern \"C\" __global__?)")
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, data in ((out.with_suffix(".ptx"), ptx_text.encode()), (out, code), (meta, log.encode())):
        tmp = path.with_suffix(path.suffix + f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    seal(out, code)
    return Compiled(True, str(out), log, time.perf_counter() - t0, resources=parse_ptxas(log, entry),
                    ptx=ptx_counts)


def expand(source: str, options: tuple[str, ...], hw) -> tuple[str | None, str]:
    """The preprocessed source, or (None, why not), cached on disk by source hash (pcpp is
    pure Python: some 70 to 250 ms a softmax source, so the trial asks only for variants)."""
    arch = hw.arch or "sm_90"
    key = artifact_key(source, " ".join(options), arch, nvrtc_version(), _rules_digest(), "expand")
    path = cache_dir() / "cuda" / f"{key}.expand.json"
    if path.exists():
        try:
            j = json.loads(path.read_text())
            return j["text"], j["error"]
        except (ValueError, KeyError):
            pass
    text, why = _expand(source, options, arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps({"text": text, "error": why}))
    os.replace(tmp, path)
    return text, why


_LIBRARY: dict = {}


def library_opcodes(options: tuple[str, ...], hw) -> frozenset:
    """The fast_math-class opcodes that CUDA's accurate math functions compile to with these
    options (runner.build.ptx.LIBRARY_PROBE), cached per process and on disk."""
    arch = hw.arch or "sm_90"
    key = artifact_key(ptx.LIBRARY_PROBE, " ".join(options), arch, nvrtc_version(), _rules_digest(), "library")
    hit = _LIBRARY.get(key)
    if hit is not None:
        return hit
    path = cache_dir() / "cuda" / f"{key}.library.json"
    if path.exists():
        try:
            _LIBRARY[key] = frozenset(json.loads(path.read_text()))
            return _LIBRARY[key]
        except ValueError:
            pass
    with _IMPORT_LOCK:
        from cuda.core import Program

        opts = _options(tuple(o for o in options if not o.startswith("-D")), arch, "pipe_library_probe.cu")
    prog = Program(ptx.LIBRARY_PROBE, "c++", opts)
    prog.compile("cubin", logs=io.StringIO())
    ops = ptx.library_opcodes(_ptx_text(prog))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(sorted(ops)))
    os.replace(tmp, path)
    _LIBRARY[key] = ops
    return ops


def machine_counts(artifact: str) -> dict:
    """The classified SASS of a built cubin (runner.build.sass.analyze), kept beside it under
    the judging code's digest (RuntimeError where the disassembler is missing or fails)."""
    return machine.kept(Path(artifact).with_suffix(f".{_rules_digest()}.sass.json"),
                        lambda: sass.analyze(sass.disassemble(artifact)))


def machine_library(options: tuple[str, ...], hw) -> frozenset:
    """The fast_math-class SASS opcodes of CUDA's accurate math functions with these options
    (the SASS of runner.build.ptx.LIBRARY_PROBE), per process and on disk."""
    key = ("sass", options, hw.arch or "sm_90")
    hit = _LIBRARY.get(key)
    if hit is not None:
        return hit
    built = compile(ptx.LIBRARY_PROBE, "pipe_library_probe", tuple(o for o in options if not o.startswith("-D")), hw)
    if not built.ok:
        raise RuntimeError(f"the math library probe did not compile: {built.reason}")
    ops = frozenset(k for k in machine_counts(built.artifact)["fast_math"])
    _LIBRARY[key] = ops
    return ops


# NVRTC compiles of one process run one at a time (measured on 2 cores: four compiles of a
# softmax source take 0.75 s one after another, 0.66 s on two threads, 0.38 s in two
# processes), so a trial's sources, and the builds ahead beside the judge, compile in a pool
# of worker processes (spawned: the runner's process never touches the GPU, but a fork of a
# threaded process is unsafe all the same).
_POOL = None
_POOL_LOCK = threading.Lock()
POOL_PROCS = max(1, min(8, (os.cpu_count() or 1) - 2))  # two cores left to the judge and the loop


def _pool():
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            _POOL = ProcessPoolExecutor(max_workers=POOL_PROCS, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_behind_the_judge)
            atexit.register(_POOL.shutdown, cancel_futures=True)  # before the interpreter tears down
        return _POOL


def _behind_the_judge() -> None:
    """A compile process yields the CPU to the judge's worker: builds ahead only have to keep
    up with the judge, while the worker's time is every trial's round trip."""
    try:
        os.nice(10)
    except OSError:
        pass


def _compile_into(cache: str, source: str, entry: str, options: tuple[str, ...], hw) -> Compiled:
    """compile() in a worker process, into the caller's cache (its PIPE_CACHE_DIR now)."""
    os.environ["PIPE_CACHE_DIR"] = cache
    return compile(source, entry, options, hw)


def compile_all(sources: list[str], entry: str, options: tuple[str, ...], hw) -> list[Compiled]:
    """compile() of each source, side by side in the worker processes; cache hits are read
    here. A worker that dies (a compiler crash) costs its batch a compile in this process."""
    from concurrent.futures.process import BrokenProcessPool

    out: list = [_cached(s, entry, options, hw)[0] for s in sources]
    todo = [i for i, c in enumerate(out) if c is None]
    if len(todo) == 1 or POOL_PROCS == 1:
        for i in todo:
            out[i] = compile(sources[i], entry, options, hw)
        return out
    global _POOL
    pool = _pool()
    try:
        cache = str(cache_dir())
        futs = {i: pool.submit(_compile_into, cache, sources[i], entry, options, hw) for i in todo}
        for i, f in futs.items():
            out[i] = f.result()
    except BrokenProcessPool:
        with _POOL_LOCK:
            if _POOL is pool:  # not a new one another thread started meanwhile
                _POOL = None
        for i in todo:
            if out[i] is None:
                out[i] = compile(sources[i], entry, options, hw)
    return out


def prune(resources: dict, geometry: dict, hw, spills_forbidden: bool) -> str | None:
    """Why this launch cannot run well on the profile's hardware, or None."""
    block = geometry.get("block") or [1]
    grid = geometry.get("grid") or [1]
    threads = 1
    for b in block:
        threads *= b
    if any(b < 1 for b in block) or any(g < 1 for g in grid):
        return f"empty launch: grid {grid}, block {block}"
    max_t = hw.get("max_threads_per_block", 1024)
    if threads > max_t:
        return f"{threads} threads per block exceed the limit of {max_t}"
    cluster = geometry.get("cluster")
    if cluster:
        size = 1
        for c in cluster:
            size *= c
        if any(c < 1 for c in cluster) or len(cluster) > len(grid) and any(c > 1 for c in cluster[len(grid):]):
            return f"cluster {cluster} does not fit grid {grid}"
        if any(g % c for g, c in zip(grid, cluster)):
            return f"grid {grid} is not a whole number of clusters {cluster}"
        max_c = hw.get("max_cluster_size", 8)
        # past the portable size with the profile's opt-in size: the runner sets the kernel's attribute
        most = max(max_c, hw.get("max_cluster_size_opt_in", max_c))
        if size > most:
            return (f"a cluster of {size} blocks exceeds the limit of {most}" if most > max_c else
                    f"a cluster of {size} blocks exceeds the portable limit of {max_c}")
    if len(grid) > 1 and any(g > 65535 for g in grid[1:]):
        return f"grid {grid}: y and z dimensions are limited to 65535"
    if grid[0] > 2**31 - 1:
        return f"grid.x {grid[0]} exceeds 2^31 - 1"
    smem = resources.get("static_smem", 0) + geometry.get("shared_mem", 0)
    max_smem = hw.get("shared_mem_per_block_optin_bytes", 49152)
    if smem > max_smem:
        return f"{smem} bytes of shared memory per block exceed the limit of {max_smem}"
    regs = resources.get("registers")
    if regs:
        warps = -(-threads // hw.get("warp_size", 32))
        per_warp = -(-(regs * 32) // 256) * 256  # allocated in units of 256 per warp
        need = per_warp * warps
        limit = hw.get("registers_per_block", 65536)
        if need > limit:
            return f"{regs} registers x {threads} threads need {need} registers per block, limit {limit}"
    if spills_forbidden and (resources.get("spill_stores", 0) or resources.get("spill_loads", 0)):
        return f"register spills ({resources['spill_stores']} bytes stored, {resources['spill_loads']} loaded)"
    return None


PRINTF_FIFO_BYTES = 8 << 10  # asked for a launch's device printf buffer (the H200's driver rounds it up to 512 KiB)


def _set_ctx_limit(name: str, value: int, reset: str | None = None) -> int | None:
    """Set the context's limit CU_LIMIT_<name> to `value` (then call driver.<reset>() where one is
    named) and return the limit as the driver reports it after, or None where the bindings or
    the device refuse. For the limits the judge sets before any candidate module is loaded."""
    try:
        from cuda.bindings import driver

        ok = driver.CUresult.CUDA_SUCCESS
        limit = getattr(driver.CUlimit, f"CU_LIMIT_{name}")
        err, = driver.cuCtxSetLimit(limit, value)
        if err != ok:
            return None
        if reset is not None:
            err, = getattr(driver, reset)()
            if err != ok:
                return None
    except Exception:  # older bindings, or a device without the limit
        return None
    return _ctx_limit(name)


def _ctx_limit(name: str) -> int | None:
    """The context's limit CU_LIMIT_<name>, or None where the bindings or the device refuse."""
    try:
        from cuda.bindings import driver

        err, size = driver.cuCtxGetLimit(getattr(driver.CUlimit, f"CU_LIMIT_{name}"))
        return int(size) if err == driver.CUresult.CUDA_SUCCESS else None
    except Exception:  # noqa: BLE001
        return None


def _cap_printf_fifo() -> int | None:
    """A small device-printf FIFO: what one launch can print is bounded on the device (the rest
    is dropped by the driver), so a kernel printing from every thread costs the host at most
    this much formatting per synchronize. None where refused: the worker's log cap alone bounds
    what reaches the disk."""
    return _set_ctx_limit("PRINTF_FIFO_SIZE", PRINTF_FIFO_BYTES)


def _no_persisting_l2() -> int | None:
    """No L2 set aside for persisting lines, and none held: the H200's driver sets aside 11.25
    MiB by default (session 28). Lines a kernel marks to stay (`evict_last`) do not outlive the
    judge's flush where they overflow that set-aside (tools/l2_probe.py at 16 to 32 MiB); with
    none set aside they have nowhere to outlive it at any size. The limit as the driver then
    reports it (0), or None where refused (the flush alone stands then)."""
    return _set_ctx_limit("PERSISTING_L2_CACHE_SIZE", 0, reset="cuCtxResetPersistingL2Cache")


# What a launch leaves on the chip and in the context's local memory is there for the next one:
# nothing clears a block's shared memory or a thread's local frame between kernels of one
# context (tools/residue_probe.py measures it). A kernel could keep its state there from one
# timed call to the next (a call count, a memo of its answers) where no check of the judge's
# looks. `Runtime.scrub` overwrites both; the judge runs it ahead of every call of a candidate.
SCRUB_SOURCE = r"""
// Each block first waits 10 us of the device's clock: the grid is exactly what the SMs hold at
// once, and no block may end (and free its slot for another) before every block has started,
// so that every SM runs its full share and every slot is written.
__device__ __forceinline__ void pipe_scrub_wait() {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < 10000ull);
}
extern "C" __global__ void __launch_bounds__(1024) pipe_scrub_smem(int words) {
  extern __shared__ unsigned pipe_scrub_s[];
  volatile unsigned* s = pipe_scrub_s;
  pipe_scrub_wait();
  for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = 0u;
  // and every byte of the block's window below its own: the shared memory sm_90 reserves in each
  // block, which a kernel reaches by raw address (session 30: a mark kept at address 0 survived
  // other kernels' launches). One block of the opt-in maximum an SM: the reserved part and the
  // dynamic part together are all of the SM's shared memory.
  const unsigned lo = (unsigned)__cvta_generic_to_shared(pipe_scrub_s);
  for (unsigned a = threadIdx.x * 4u; a < lo; a += blockDim.x * 4u)
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(a), "r"(0u) : "memory");
}
#ifdef PIPE_LOCAL_WORDS
extern "C" __global__ void __launch_bounds__(256, 8) pipe_scrub_local(int words) {
  volatile unsigned a[PIPE_LOCAL_WORDS];
  pipe_scrub_wait();
#pragma unroll 1
  for (int i = 0; i < words && i < PIPE_LOCAL_WORDS; ++i) a[i] = 0u;
}
#endif
"""


def local_bytes(kernel, device: int = 0) -> int:
    """The per-thread local memory (stack frame) a loaded kernel uses, 0 where unknown (the
    scrub covers the context's stack size whatever this says)."""
    try:
        v = kernel.attributes.local_size_bytes  # a property in cuda.core 1.2
        return int(v() if callable(v) else v)
    except Exception:  # noqa: BLE001 - a cuda.core without the attribute: ask the driver
        pass
    try:
        from cuda.bindings import driver

        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
        h = kernel.handle
        if isinstance(h, driver.CUkernel):
            err, n = driver.cuKernelGetAttribute(attr, h, driver.CUdevice(device))
        else:
            err, n = driver.cuFuncGetAttribute(attr, h)
        return int(n) if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # noqa: BLE001
        return 0


def _same(v):
    """A tensor map's cast: the descriptor as built (cuda.core launches it by value)."""
    return v


def params_problem(entry: str, sizes: list[int], kinds: list[str]) -> str | None:
    """What is wrong between the entry's parameters (their sizes in bytes) and what the spec's
    kernel.args pass (`kinds`: ptr, tmap, i32, i64, f32, f64, or auto for a shape symbol), or
    None: at load on the GPU, and from the PTX at build time (entry_param_sizes), so a wrong
    kernel.args is found without one."""
    if len(sizes) != len(kinds):
        return f"kernel '{entry}' takes {len(sizes)} parameters, the spec passes {len(kinds)} (kernel.args)"
    for i, (k, size) in enumerate(zip(kinds, sizes)):
        if k == "tmap":
            if size != 128:
                return (f"parameter {i} of '{entry}' is {size} bytes, the spec passes a tensor map "
                        "(a 128-byte CUtensorMap, `const __grid_constant__ CUtensorMap`)")
        elif k == "auto":
            if size not in (4, 8):
                return f"parameter {i} of '{entry}' is {size} bytes; shape symbols need int or long"
        else:
            want = {"ptr": 8, "i32": 4, "i64": 8, "f32": 4, "f64": 8}.get(k)
            if want != size:
                return f"parameter {i} of '{entry}' is {size} bytes, the spec passes {k} ({want} bytes)"
    return None


_PARAM_SIZE = {"8": 1, "16": 2, "32": 4, "64": 8}


def entry_param_sizes(ptx_text: str, entry: str) -> list[int] | None:
    """The sizes in bytes of `entry`'s parameters as its PTX declares them (`.param .u64 p0`,
    `.param .align 64 .b8 p1[128]`), or None where the PTX has no such entry or a parameter it
    cannot read (then only the GPU's load checks them)."""
    m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", ptx_text, re.S)
    if m is None:
        return None
    sizes = []
    for decl in (d.strip() for d in m.group(1).split(",")):
        if not decl:
            continue
        arr = re.search(r"\.b8\s+\w+\[(\d+)\]", decl)
        if arr:
            sizes.append(int(arr.group(1)))
            continue
        t = re.search(r"\.[usbf](8|16|32|64)\b", decl)
        if t is None:
            return None
        sizes.append(_PARAM_SIZE[t.group(1)])
    return sizes


class Runtime:
    """Worker side: load cubins, launch on torch's stream, time with events."""

    device = "cuda"
    symbol_type = "auto"  # from the kernel's parameter sizes

    def __init__(self, hw, runtime_spec=None):
        import torch
        from cuda.core import Device

        self.torch = torch
        # The judge's host-side work is small (sampled checksums, positions, a few scalars):
        # one thread. torch's default, a thread per core, makes each such op a parallel region
        # whose slowest thread waits for a core the builds ahead are using (an 8-element
        # torch.equal of a snapshot's 64 Ki sampled words took 4 ms in a run, 0.3 ms alone).
        torch.set_num_threads(1)
        self.hw = hw
        self.mode = getattr(runtime_spec, "mode", "auto")
        self.dev = Device(torch.cuda.current_device())
        self.dev.set_current()
        self.printf_fifo = _cap_printf_fifo()
        self.persisting_l2 = _no_persisting_l2()  # 0: nothing set aside (None: refused, the flush alone)
        self._mods: dict[str, object] = {}
        self._smem: dict[int, int] = {}  # kernel handle -> dynamic shared memory allowed so far
        self._scrubbers: dict[str, tuple] = {}  # "smem" / "local<bytes>" -> (kernel, LaunchConfig, words)
        self._flush_buf = None
        self.walls: list[float] = []
        self._mode_flags = {"matmul.allow_tf32": False, "cudnn.allow_tf32": False,
                            "matmul.allow_fp16_reduced_precision_reduction": False,
                            "matmul.allow_bf16_reduced_precision_reduction": False}
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    def mode_changed(self) -> str | None:
        """The numeric mode the runner set (no TF32, no reduced-precision reductions), checked after each trial."""
        b = self.torch.backends
        now = {"matmul.allow_tf32": b.cuda.matmul.allow_tf32, "cudnn.allow_tf32": b.cudnn.allow_tf32,
               "matmul.allow_fp16_reduced_precision_reduction": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
               "matmul.allow_bf16_reduced_precision_reduction": b.cuda.matmul.allow_bf16_reduced_precision_reduction}
        bad = [k for k, v in now.items() if bool(v) != self._mode_flags[k]]
        return ", ".join(f"{k} is now {now[k]}" for k in bad) or None

    def _stream(self):
        return self.dev.create_stream(self.torch.cuda.current_stream())

    def load(self, artifact: str, entry: str, kinds: list[str]):
        import numpy as np
        from cuda.core import ObjectCode

        mod = self._mods.get(artifact)
        if mod is None:
            mod = self._mods[artifact] = ObjectCode.from_cubin(artifact)
        kernel = mod.get_kernel(entry)
        sizes = [p.size for p in kernel.arguments_info]
        why = params_problem(entry, sizes, kinds)
        if why:
            raise LaunchError(why)
        casts = []
        for k, size in zip(kinds, sizes):
            if k == "tmap":  # a TMA descriptor, by value: `const __grid_constant__ CUtensorMap`
                casts.append(_same)
            elif k == "auto":
                casts.append(np.int32 if size == 4 else np.int64)
            else:
                casts.append({"ptr": int, "i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}[k])
        return kernel, casts

    def prepare(self, fn, values: list, geometry: dict | None, mode: str | None = None):
        """The one callable used for checked and timed calls alike; `mode` forces
        direct launches or graph replay (default: the spec's runtime mode)."""
        from cuda.core import launch

        from ...ship.exported_runtime import launch_config, raise_smem

        kernel, casts = fn
        args = [c(v) for c, v in zip(casts, values)]
        g = geometry or {}
        smem = int(g.get("shared_mem", 0))
        try:  # static and dynamic together may pass 48 KiB: the kernel is allowed what it asks
            raise_smem(kernel, smem, self.dev.device_id, self._smem, _handle_key(kernel), g.get("cluster"))
            config = launch_config(g.get("grid"), g.get("block"), g.get("cluster"), smem)
        except (RuntimeError, ValueError) as e:
            raise LaunchError(str(e)) from None

        def direct():
            launch(self._stream(), config, kernel, *args)

        call = self._maybe_graph(direct, mode)
        call.local_bytes = local_bytes(kernel, self.dev.device_id)  # for the scrub ahead of it
        return call

    def prepare_torch(self, fn, mode: str | None = None):
        """A torch arm's callable, replayed as a CUDA graph or launched directly (`mode`, else
        the runtime's). An arm whose capture fails (a host sync inside it, say) falls back to
        direct launches, with a `note` saying why, while the device is still healthy: pipe
        compare times it that way and shows the note."""
        try:
            return self._maybe_graph(fn, mode)
        except Exception as e:  # noqa: BLE001 - whatever the capture raised
            if (mode or self.mode) == "direct" or not self.healthy():
                raise
            why = f"{type(e).__name__}: {e}".splitlines()[0][:300]

        def direct():
            return fn()

        direct.mode = "direct"
        direct.note = f"timed as direct launches: its CUDA graph capture failed ({why})"
        return direct

    def _maybe_graph(self, direct, mode: str | None = None):
        torch = self.torch
        mode = mode or self.mode
        if mode == "auto":
            direct()  # warm: module load, first-launch costs
            torch.cuda.synchronize()
            # device time (the timer's spin hides the launch): a kernel of a few microseconds
            # whose Python launch takes longer is still a short kernel, replayed as a graph
            ts = [self.timer(direct, torch.cuda.synchronize) for _ in range(5)]
            mode = "graph" if sorted(ts)[2] < GRAPH_BELOW_S else "direct"
        if mode == "direct":
            direct.mode = "direct"
            return direct
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm up outside capture on a side stream, as torch advises
            direct()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            direct()
        def replay():
            graph.replay()

        replay.graph = graph  # the callable keeps its graph alive
        replay.mode = "graph"
        return replay

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def _scrubber(self, key: str):
        """(kernel, launch config, words) of one scrub kernel, built on first use: a grid of
        exactly what the SMs hold at once, whose blocks wait until all have started. `smem`: one
        block of the opt-in maximum of dynamic shared memory on every SM; `local<B>`: B bytes
        of local frame for every thread slot of every SM (2048 on Hopper)."""
        got = self._scrubbers.get(key)
        if got is not None:
            return got
        from cuda.core import LaunchConfig
        from cuda.core import ObjectCode

        from ...ship.exported_runtime import allow_dynamic_smem

        props = self.dev.properties
        sms = int(props.multiprocessor_count)

        def build(entry, options=()):
            built = compile(SCRUB_SOURCE, entry, options, self.hw)
            if not built.ok:
                raise RuntimeError(f"the judge's scrub kernel did not build: {built.reason}")
            return ObjectCode.from_cubin(built.artifact).get_kernel(entry)

        if key == "smem":
            nbytes = int(props.max_shared_memory_per_block_optin)
            kernel = build("pipe_scrub_smem")
            allow_dynamic_smem(kernel, nbytes, self.dev.device_id)
            config = LaunchConfig(grid=(sms,), block=(1024,), shmem_size=nbytes)
        else:
            nbytes = int(key[len("local"):])
            kernel = build("pipe_scrub_local", (f"-DPIPE_LOCAL_WORDS={nbytes // 4}",))
            per_sm = int(props.max_threads_per_multiprocessor) // 256
            config = LaunchConfig(grid=(per_sm * sms,), block=(256,), shmem_size=0)
        got = self._scrubbers[key] = (kernel, config, nbytes // 4)
        return got

    def scrub(self, local_bytes: int = 0) -> None:
        """Overwrite every SM's shared memory, and every thread slot's local window on every SM,
        on torch's stream. A kernel's frame sits at the top of its threads' window, whose size
        is the context's stack size (1 KiB by default, raised by the driver for any launch that
        needs more, and never lowered), and a kernel with a smaller frame or none reaches the
        rest through generic addresses: so the scrub's frame is the stack size as it is now,
        read at every scrub. `local_bytes`, the frame of the kernel about to run, gets a scrub
        of that very frame too, where it differs (in case a launch's window were its own
        frame). The judge runs it ahead of every call of a candidate, and ahead of the input
        refresh and the flush of every timed call of every arm (`judge/worker.Judge`): no call
        finds what an earlier one left there, and a call cannot tell a timed call by what it
        finds. Local memory goes through the L2, which the flush empties after."""
        import numpy as np
        from cuda.core import launch

        stream = self._stream()
        kernel, config, words = self._scrubber("smem")
        launch(stream, config, kernel, np.int32(words))
        stack = _ctx_limit("STACK_SIZE") or 1024
        for nbytes in sorted({stack, local_bytes} - {0}):
            kernel, config, words = self._scrubber(f"local{-(-nbytes // 8) * 8}")
            launch(stream, config, kernel, np.int32(words))

    def timer(self, call, sync) -> float:
        """Event time of one call. Work queued before it (new input values, the L2 flush,
        then a device spin of PAD_CYCLES) runs ahead of the start event, so the host's launch
        cost stays out of the figure.
        After the end event, a device-wide synchronize and one more event measure how long
        the device stayed busy after the call: work left on another stream shows there."""
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        idle = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(PAD_CYCLES)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()  # device-wide
        idle.record()
        idle.synchronize()
        self.walls.append(end.elapsed_time(idle) / 1e3)
        return start.elapsed_time(end) / 1e3

    # How the L2 is emptied ahead of a timed call: "clean" reads a buffer of twice its size,
    # which evicts everything and leaves only clean lines, so the dirty lines of the work
    # before (the last output, the input refresh) are written back here, outside the timed
    # region; "dirty" writes the buffer instead (as triton.testing.do_bench does), which
    # leaves the L2 full of dirty lines whose write-back then lands inside the timed call.
    flush_mode = "clean"

    def flush(self) -> None:
        torch = self.torch
        if self._flush_buf is None:
            n = 2 * int(self.hw.get("l2_bytes", 64 << 20)) // 8
            self._flush_buf = torch.ones(n, dtype=torch.int64, device="cuda")
            self._flush_out = torch.empty((), dtype=torch.int64, device="cuda")
        if self.flush_mode == "dirty":
            self._flush_buf.fill_(1)
        else:
            torch.sum(self._flush_buf, dim=0, out=self._flush_out)

    def healthy(self) -> bool:
        try:
            self.torch.cuda.synchronize()
            return True
        except Exception:
            return False


class LaunchError(Exception):
    pass


def _handle_key(kernel) -> int:
    """The loaded kernel's driver handle (one per module and entry), else the object's id."""
    try:
        return int(kernel.handle)
    except (AttributeError, TypeError, ValueError):
        return id(kernel)

