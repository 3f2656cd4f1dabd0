"""CPU backend: C++ compiled by the host compiler into a shared library, called
through ctypes on torch CPU tensors.

It makes the whole loop real on a machine without a GPU. Candidate code runs
only in a kernel host, a process of its own under a seccomp filter that works on
buffers in a shared arena (build/backends/cpu_host.py), never in the runner or the worker that
judges it; and a fixed set of source patterns (file and process access, inline
assembly, load-time constructors) is refused at build time as a first line.
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
from pathlib import Path

from .. import x86
from . import Compiled, artifact_key, cache_dir, seal, sealed, wall_timer

# the reader of a variant's machine code (builder._judge_machine): its x86 instructions
machine_reader = x86
machine_counts = x86.counts


def machine_library(options, hw) -> frozenset:
    """Nothing waived: the accurate math functions are libm's, called from the library."""
    return frozenset()

CXX = os.environ.get("CXX", "g++")
BASE_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread")
COMPILE_TIMEOUT_S = 120

# Always refused on this backend: candidate code runs natively in a kernel host, which a
# seccomp filter also confines (judge/sandbox.py, build/backends/cpu_host.py). Headers come from an allow-list,
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
    # (the library's ELF is read for both too, whatever the spelling: backends/cpu._elf_state)
    (r"\b_*(section|ifunc)_*\s*\(", "section and ifunc attributes (bytes placed in code by hand, or code run "
                                     "as the library loads)"),
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


def integrity_violation(source: str, entry: str = "", options: tuple[str, ...] = ()) -> str | None:
    from ..forbid import strip_comments, trigraphs

    code = strip_comments(source, trigraphs(options))

    def at(m: re.Match) -> str:
        return f"'{m.group(0).strip()}' at line {code.count(chr(10), 0, m.start()) + 1}"

    for m in re.finditer(r"^[ \t]*#[ \t]*(include_next|import)\b", code, re.M):
        return f"#{m.group(1)} is not allowed in CPU kernels (only #include of the allowed headers): {at(m)}"
    for m in re.finditer(r"^[ \t]*#[ \t]*include\b(?![ \t]*[<\"])[^\n]*", code, re.M):
        return ("#include of a macro is not allowed in CPU kernels (name the header: <cmath>, ...): "
                f"{at(m)}")
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


# ---------------------------------------------------------------- what the compiler includes

LOG_CAP = 4000  # characters of a compile log kept (the log and the reason reach the ledger)
_MARK = re.compile(r'^# (\d+) "((?:\\.|[^"\\])*)"((?: \d)*)$')


def _run_cpp(source: str, options: tuple[str, ...]) -> tuple[int, str, str, str]:
    """g++ -E on `source` as kernel.cpp: (returncode, its output, its diagnostics, the path it had)."""
    with tempfile.TemporaryDirectory(prefix="pipe-cpu-") as tmp:
        src = os.path.join(tmp, "kernel.cpp")
        with open(src, "w") as f:
            f.write(source)
        flags = [f for f in (*BASE_FLAGS, *options) if f not in ("-shared",)]
        try:
            r = subprocess.run([CXX, *flags, "-E", src], capture_output=True, text=True, errors="replace",
                               timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return -1, "", "the preprocessor timed out", src
        return r.returncode, r.stdout, r.stderr, src


def _walk(out: str, main: str) -> tuple[str, list[tuple[str, bool, int]], list[str]]:
    """From g++ -E output with line markers: (the main file's own text after the preprocessor,
    lines kept where they were; (path, system header?, line) of each file the main file
    includes itself; every other file entered)."""
    text: list[str] = []
    direct: list[tuple[str, bool, int]] = []
    nested: list[str] = []
    stack: list[str] = []
    cur, line = "", 1
    for ln in out.split("\n"):
        m = _MARK.match(ln) if ln.startswith("# ") else None
        if m is None:
            if cur == main:
                text.append(ln)
            line += 1
            continue
        n, name, flags = int(m.group(1)), m.group(2).encode().decode("unicode_escape"), m.group(3).split()
        if "1" in flags:
            if cur == main:
                direct.append((name, "3" in flags, line))
            elif not cur.startswith("<") and cur:
                nested.append(name)
            elif cur == "<command-line>" and name not in nested:
                nested.append(name)
            stack.append(cur)
        elif "2" in flags and stack:
            stack.pop()
        cur, line = name, n
        if cur == main:
            text.extend([""] * max(0, n - 1 - len(text)))
    return "\n".join(text), direct, nested


@lru_cache(maxsize=8)
def _allowed_paths(options: tuple[str, ...]) -> dict[str, str]:
    """Resolved path -> name of each allowed header this compiler has, as it resolves them."""
    names = sorted(ALLOWED_HEADERS)
    probe = "".join(f"#if __has_include(<{h}>)\n#include <{h}>\n#endif\n" for h in names)
    rc, out, _, src = _run_cpp(probe, options)
    if rc != 0:
        return {}
    _, direct, _ = _walk(out, src)
    found: dict[str, str] = {}
    for path, _, line in direct:
        i = (line - 2) // 3  # three probe lines per header, the #include second
        found[os.path.realpath(path)] = names[i] if 0 <= i < len(names) else path
    return found


@lru_cache(maxsize=64)
def preprocessed(source: str, options: tuple[str, ...]) -> tuple[str | None, str]:
    """(the source's own text after g++'s preprocessor, "") or (None, why it is refused or could
    not be read). Every file the source includes itself must resolve to an allowed header, and
    every file those include must be a system header: what the compiler reads is judged, not how
    the directive spells it (a macro, #include_next, #import). Reasons name paths, never text."""
    rc, out, err, src = _run_cpp(source, options)
    text, direct, nested = _walk(out, src)
    allowed = _allowed_paths(tuple(options))
    for path, system, line in direct:
        if os.path.realpath(path) not in allowed:
            return None, (f"library_calls: kernel.cpp line {line} includes '{path[:200]}', which is not one of "
                          f"the CPU backend's allowed headers ({', '.join(sorted(ALLOWED_HEADERS))})")
    for path in nested:
        if not path.startswith("/") or not _system_path(path, tuple(options)):
            return None, f"library_calls: the includes reach '{path[:200]}', which is not a system header"
    if rc != 0:  # only the candidate's own diagnostics, never a line of another file
        mine = [ln for ln in err.replace(src, "kernel.cpp").splitlines() if ln.startswith("kernel.cpp:")]
        why = next((ln for ln in mine if "error" in ln), mine[0] if mine else "the preprocessor failed")
        return None, why[:300]
    return text, ""


@lru_cache(maxsize=8)
def _system_dirs(options: tuple[str, ...]) -> tuple[str, ...]:
    flags = [f for f in (*BASE_FLAGS, *options) if f not in ("-shared",)]
    try:
        r = subprocess.run([CXX, *flags, "-E", "-v", "-x", "c++", "-"], input="", capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    dirs, on = [], False
    for ln in r.stderr.splitlines():
        if ln.startswith("#include <...> search starts here"):
            on = True
        elif ln.startswith("End of search list"):
            on = False
        elif on:
            dirs.append(os.path.realpath(ln.strip()) + os.sep)
    return tuple(dirs)


def _system_path(path: str, options: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(d) for d in _system_dirs(options))


def expand(source: str, options, hw) -> tuple[str | None, str]:
    """The builder's hook: the source after the preprocessor, for the forbidden-action rules."""
    return preprocessed(source, tuple(options))


# ---------------------------------------------------------------- what the library imports

# Imported symbols no forbidden action concerns: the toolchain's own, libm's math, memory
# moves, operator new/delete, the C++ runtime's exceptions and libgcc's helpers.
_HARMLESS = re.compile(
    r"^(?:__gmon_start__|_ITM_(?:de)?registerTMCloneTable|__cxa_finalize|_Jv_RegisterClasses"
    r"|(?:__)?(?:acos|asin|atan|atan2|cos|sin|tan|cosh|sinh|tanh|acosh|asinh|atanh|exp|exp2|exp10|expm1"
    r"|log|log2|log10|log1p|logb|ilogb|pow|sqrt|cbrt|hypot|erf|erfc|lgamma|tgamma|ceil|floor|trunc|round"
    r"|lround|llround|rint|lrint|llrint|nearbyint|fmod|remainder|remquo|fma|fmax|fmin|fdim|fabs|copysign"
    r"|nextafter|nexttoward|frexp|ldexp|modf|scalbn|scalbln|nan|sincos)[fl]?(?:_finite)?"
    # (not libmvec's `_ZGV*`: its vector functions are approximations, up to 4 ulps, that only
    # -ffast-math asks for; a call of one is a library call beyond the approved build's)
    r"|(?:__)?mem(?:cpy|move|set|cmp)(?:_chk)?|bcmp|__stack_chk_fail"
    r"|__gxx_personality_v0|_Unwind_Resume|__cxa_(?:begin_catch|end_catch|rethrow|allocate_exception"
    r"|free_exception|throw|pure_virtual|call_unexpected)|_ZSt9terminatev|_ZSt\d+__throw_\w+"
    r"|_ZTVN10__cxxabiv1\d+__\w+_type_infoE"
    r"|__[a-z]+(?:qi|hi|si|di|ti|sf|df|tf|xf|hf|bf|sc|dc|xc|tc)[23]|__cpu_indicator_init|__cpu_model"
    r"|__cpu_features2)$")
# Imported symbols a kernel may use but a variant may not add over the approved template's
# build: threads, the C++ runtime's guards and exit hooks, thread-local storage, printf, and the
# heap (operator new and delete: a variant of a template that allocates nothing could keep a
# memo of its inputs and outputs there from call to call, session 30's second red team).
_PERMITTED = re.compile(
    r"^(?:_Zn[wa]m\w*|_Zd[la]Pv\w*|__cxa_throw_bad_array_new_length|_ZNSt6thread\w*|_ZTINSt6thread6_StateE|_ZNSt11this_thread\w*|sched_yield|__cxa_atexit"
    r"|__cxa_guard_(?:acquire|release|abort)|__cxa_thread_atexit(?:_impl)?|__tls_get_addr|__atomic_\w+"
    r"|printf|puts|putchar)$")


def _tool(cmd: list[str]) -> str | None:
    """The stdout of a binutils command on a library, None where it is missing or fails."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def imports(lib: str) -> list[str] | None:
    """The symbols the library takes from other libraries (weak ones included), or None without nm."""
    out = _tool(["nm", "-D", "--undefined-only", lib])
    if out is None:
        return None
    return sorted({ln.split()[-1].split("@")[0] for ln in out.splitlines() if ln.split()})


def import_violation(names: list[str]) -> str | None:
    bad = [n for n in names if not _HARMLESS.match(n) and not _PERMITTED.match(n)]
    if bad:
        return (f"library_calls: the library imports {', '.join(repr(n) for n in bad[:5])}: a CPU kernel may "
                "import only math, memory, thread and C++ runtime symbols (whatever the spelling: a header, "
                "a weakref or alias, an asm label)")
    return None


# ---------------------------------------------------------------- writable data

# the toolchain's writable data that is not in an empty library (the exception personality's
# pointer, which a C++ identifier cannot name)
_TOOLCHAIN_WRITABLE = frozenset({"DW.ref.__gxx_personality_v0", "_GLOBAL_OFFSET_TABLE_", "_DYNAMIC"})


# the tables of functions the loader runs as it loads or unloads a library, by type and by name
_LOAD_TIME = ("INIT_ARRAY", "PREINIT_ARRAY", "FINI_ARRAY")
_LOAD_TIME_NAMES = (".ctors", ".dtors", ".init_array", ".fini_array", ".preinit_array")


# the executable sections a C++ library's link makes: anything else that executes was placed by
# hand (a section attribute whose name smuggles flags: `section(".x,\"ax\",@progbits#")`)
_CODE_SECTIONS = frozenset({".init", ".plt", ".plt.got", ".plt.sec", ".text", ".fini"})


def _elf_state(lib: str) -> tuple[dict[str, int], int, list[str]] | None:
    """(writable data symbols, load-time table bytes, foreign code) of a shared library, from one
    readelf, or None without readelf.
    The data symbols (statics and thread-locals included) are judged by where a symbol lies, never
    by its name: a symbol in a section the loader leaves writable (.data, .bss, .tdata, .tbss, any
    other section with the W flag) counts, one in the part that is read-only after relocation
    (GNU_RELRO: vtables, type info) does not. The load-time bytes are the sizes of
    .init_array, .preinit_array, .fini_array, .ctors and .dtors: code the loader runs. Foreign
    code is what executes without the compiler having made it a function: an executable section
    of its own, a data object inside an executable section (bytes written as an array and called
    through a pointer: machine code no source rule and no reader of the compiled code sees as
    code), and an indirect function (`ifunc`: its resolver runs as the library is relocated)."""
    text = _tool(["readelf", "-W", "-S", "-l", "-s", lib])
    if text is None:
        return None
    sections: dict[int, tuple[str, int, int, str]] = {}
    relro: list[tuple[int, int]] = []
    out: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    foreign: set[str] = set()
    load_time = 0
    for ln in text.splitlines():
        m = re.match(r"^\s*\[\s*(\d+)\]\s+(.*)$", ln)
        if m:
            parts = m.group(2).split()
            if len(parts) >= 9:
                flags = parts[6] if len(parts) >= 10 else ""
                try:
                    sections[int(m.group(1))] = (parts[0], int(parts[2], 16), int(parts[4], 16), flags)
                    if parts[1] in _LOAD_TIME or parts[0] in _LOAD_TIME_NAMES:
                        load_time += int(parts[4], 16)
                    if "X" in flags and parts[0] not in _CODE_SECTIONS:
                        foreign.add(f"executable section {parts[0]!r}")
                except ValueError:
                    pass
            continue
        parts = ln.split()
        if parts and parts[0] == "GNU_RELRO" and len(parts) >= 6:
            relro.append((int(parts[2], 16), int(parts[2], 16) + int(parts[5], 16)))
            continue
        if len(parts) >= 8 and parts[0].endswith(":") and parts[0][:-1].isdigit() and parts[6].isdigit():
            kind, ndx, name = parts[3], int(parts[6]), parts[7].split("@")[0]
            if kind == "IFUNC":
                foreign.add(f"indirect function {name!r}")
            if kind in ("SECTION", "FILE") or ndx not in sections or name in _TOOLCHAIN_WRITABLE:
                continue
            sec, addr, size, flags = sections[ndx]
            if "X" in flags and kind not in ("FUNC", "NOTYPE"):
                foreign.add(f"{kind.lower()} {name!r} in executable section {sec!r}")
            # a TLS section's image may lie in RELRO; each thread's copy of it is writable
            if "W" not in flags or ("T" not in flags and any(lo <= addr and addr + size <= hi for lo, hi in relro)):
                continue
            key = (name, parts[1])
            if key in seen:  # the same symbol in .dynsym and .symtab
                continue
            seen.add(key)
            out[name] = out.get(name, 0) + 1
    return out, load_time, sorted(foreign)


@lru_cache(maxsize=8)
def _toolchain(options: tuple[str, ...]) -> dict:
    """What the toolchain itself puts in an empty library: its writable data (_DYNAMIC,
    __dso_handle, completed.0, ...) and its load-time tables (frame_dummy and its counterpart),
    never the kernel's. Worked out once per compiler and options, and kept in the artifact cache
    (every judge worker would compile the probe again). {"data": [names], "load_time": bytes}."""
    import json

    kept = cache_dir() / "cpu" / f"toolchain-{artifact_key(' '.join(options), compiler_version(), 'empty-library')}.json"
    try:
        got = json.loads(kept.read_text())
        if isinstance(got, dict) and "data" in got:
            return got
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory(prefix="pipe-cpu-") as tmp:
        src, lib = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write('extern "C" void pipe_probe(float* y) { y[0] = 1.f; }\n')
        r = subprocess.run([CXX, *BASE_FLAGS, *options, src, "-o", lib], capture_output=True, text=True,
                           timeout=COMPILE_TIMEOUT_S)
        elf = _elf_state(lib) if r.returncode == 0 else None
    if elf is None:
        return {"data": [], "load_time": None}
    got = {"data": sorted(elf[0]), "load_time": elf[1], "foreign": elf[2]}
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp_kept = kept.with_suffix(f".{os.getpid()}.tmp")
    tmp_kept.write_text(json.dumps(got))
    os.replace(tmp_kept, kept)  # atomic, as the artifacts are
    return got


def _toolchain_data(options: tuple[str, ...]) -> frozenset:
    return frozenset(_toolchain(tuple(options))["data"])


def data_symbols(lib: str, options: tuple[str, ...]) -> dict | None:
    """The kernel's own state that outlives a call: writable static data (a global, a static
    local, a class static, a thread-local) beyond the toolchain's, as `ptx.analyze` reports a
    CUDA module's `.global` data ({"data": {name: 1}}), so that the builder refuses a variant
    that declares data the approved template's build does not (`device_state`); and under
    "extern" the symbols it imports beyond the harmless ones (math, memory, the C++ runtime), so
    that a variant importing one the approved template's build does not is `library_calls`."""
    elf = _elf_state(lib)
    if elf is None:
        return None
    syms, load_time, foreign = elf
    base = _toolchain_data(tuple(options))
    names = imports(lib) or []
    data = {k: v for k, v in sorted(syms.items()) if k not in base}
    load = load_time_bytes(load_time, options)
    if load:
        from ..ptx import LOAD_TIME

        data[LOAD_TIME] = load
    own = [f for f in foreign if f not in _toolchain(tuple(options)).get("foreign", ())]
    if own:
        from ..ptx import FOREIGN_CODE

        data[FOREIGN_CODE] = len(own)
        data.update({f"{FOREIGN_CODE}: {f}": 1 for f in own[:8]})  # named in the verdict
    return {"code": {}, "asm": {}, "extern": {n: 1 for n in names if not _HARMLESS.match(n)}, "data": data}


# ---------------------------------------------------------------- code run at load or unload

def load_time_bytes(load_time: int, options: tuple[str, ...] = ()) -> int:
    """A library's load-time function table bytes (`_elf_state`) beyond the toolchain's own: code
    the loader runs as the worker loads or unloads the library (a global object's constructor or
    destructor, a function pointer placed in .init_array by a section attribute), before the
    judge's first call and outside every timed or checked one. The builder refuses a variant
    with more than the approved template's build (`ptx.compare`, LOAD_TIME)."""
    base = _toolchain(tuple(options))["load_time"]
    return 0 if base is None else max(0, load_time - base)


def _judge_library(lib: str, options: tuple[str, ...] = ()) -> str | None:
    names = imports(lib)
    return import_violation(names) if names is not None else None


def compile(source: str, entry: str, options: tuple[str, ...], hw) -> Compiled:
    t0 = time.perf_counter()
    bad = integrity_violation(source, entry, tuple(options))
    if bad:
        return Compiled(False, None, bad, 0.0, status="forbidden", reason=bad)
    text, why = preprocessed(source, tuple(options))
    if text is None:
        status = "forbidden" if why.startswith("library_calls") else "compile_error"
        return Compiled(False, None, why, time.perf_counter() - t0, status=status, reason=why)
    key = artifact_key(source, " ".join(options), compiler_version(), "cpu")
    out = cache_dir() / "cpu" / f"{key}.so"
    if out.exists() and sealed(out):
        bad = _judge_library(str(out), tuple(options))
        if bad:
            return Compiled(False, None, bad, time.perf_counter() - t0, status="forbidden", reason=bad)
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
        if len(log) > LOG_CAP:  # it reaches the ledger: kept short (and only the allowed files are read)
            log = log[:LOG_CAP] + f"\n... ({len(log) - LOG_CAP} more characters)"
        if r.returncode != 0:
            first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:300])
            return Compiled(False, None, log, time.perf_counter() - t0, status="compile_error",
                            reason=first.strip()[:500])
        nm = _tool(["nm", "-D", "--defined-only", lib])
        if nm is not None and not re.search(r"\bT " + re.escape(entry) + r"$", nm, re.M):
            return Compiled(False, None, log, time.perf_counter() - t0, status="compile_error",
                            reason=f"entry '{entry}' is not an exported C symbol (missing extern \"C\"?)")
        bad = _judge_library(lib, tuple(options))
        if bad:
            return Compiled(False, None, log, time.perf_counter() - t0, status="forbidden", reason=bad)
        data = data_symbols(lib, options)
        tmp_out = out.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(lib, tmp_out)
        os.replace(tmp_out, out)  # atomic: a reader sees the whole file or none
        seal(out, Path(lib).read_bytes())
    return Compiled(True, str(out), log, time.perf_counter() - t0, ptx=data)


_CTYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float, "f64": ctypes.c_double,
           "ptr": ctypes.c_void_p}


class Runtime:
    """Worker side: the candidates' libraries, each in a kernel host of its own (build/backends/cpu_host.py:
    a process under the seccomp filter, working on buffers in a shared arena, timed by the
    worker's clock); torch tensors and scalars marshalled to it. Where the host cannot run (not
    x86-64 Linux) the library is loaded into the worker itself, with the static rules alone."""

    device = "cpu"
    symbol_type = "i64"  # shape symbols are passed as int64_t
    # timed calls evaluate's timed loop makes at the least (the loop whose times a trial records;
    # the re-timing's and pipe compare's rounds keep 10 each, many rounds), whatever one costs: a kernel host's handoffs (its
    # wake-up, the settle) cost 0.2 to 3 ms a call on a busy 2-core VM, which cut a 25 ms budget to
    # 10 calls, and a kernel lazy on one call in 16 then passed half the time; at 32 a shape, it
    # goes unsampled 13% of the time a shape (64 cost the quick suite 40 s more on 2 cores)
    min_reps = 32

    def __init__(self, hw, runtime_spec=None):
        import torch

        from . import cpu_host as host

        self.hw = hw
        # torch's arms (the baseline, pipe compare's eager and compile) get the thread count
        # the spec gives kernels: a speedup over torch on other threads compares unlike things
        self.threads = int(getattr(runtime_spec, "threads", None) or hw.get("cores", 0) or os.cpu_count() or 1)
        # the judge flushes before every timed call (cache: cold): a host's calibration too
        self.cold = getattr(runtime_spec, "cache", "warm") == "cold"
        torch.set_num_threads(self.threads)
        self._libs: dict[str, ctypes.CDLL] = {}
        self._flush_buf = None
        self.hosted = host.supported()
        self._hosts: dict[tuple, host.Host] = {}
        if self.hosted:
            self.arena = host.Arena()
            self.census = host.HostCensus()
            self.census.arena = self.arena
            host.not_dumpable()

    def load(self, artifact: str, entry: str, kinds: list[str]):
        if self.hosted:
            from . import cpu_host as host

            key = (artifact, entry, tuple(kinds))
            h = self._hosts.pop(key, None)
            if h is None or not h.alive():
                if len(self._hosts) >= host.MAX_HOSTS:  # the oldest goes
                    self._drop(next(iter(self._hosts)))
                h = host.Host(self.arena, artifact, entry, kinds, self.census, self.threads,
                              between=self.flush if self.cold else None)
            self._hosts[key] = h  # most recent last
            self.census.hosts = list(self._hosts.values())
            return h
        lib = self._libs.get(artifact)
        if lib is None:
            lib = self._libs[artifact] = ctypes.CDLL(artifact)
        fn = getattr(lib, entry)
        fn.restype = None
        fn.argtypes = [_CTYPES[k] for k in kinds]
        return fn

    def _drop(self, key) -> None:
        h = self._hosts.pop(key)
        h.close()
        self.census.hosts = list(self._hosts.values())

    def release(self) -> None:
        """The end of a request: every host goes, and with it whatever its kernel kept."""
        for key in list(self._hosts):
            self._drop(key)
        if self.hosted:
            self.arena.punch_free()

    def share(self, t):
        """`t` as a candidate may see it: a copy in the arena (in-process: `t` itself)."""
        return self.arena.tensor(t) if self.hosted else t

    def prepare(self, fn, values: list, geometry=None, mode=None):
        """The one callable used for checked and timed calls alike."""
        if self.hosted:
            from .cpu_host import Host, HostCall

            if isinstance(fn, Host):
                return HostCall(fn, values)
        return lambda: fn(*values)

    def prepare_torch(self, fn, mode=None):
        return fn

    def healthy(self) -> bool:
        return True

    SCRUB_BYTES = 1 << 20  # of the calling thread's stack, below the stack pointer
    _SCRUB_MARGIN = 256  # left alone right below the pointer: memset's own frame (it uses none)

    def scrub(self, local_bytes: int = 0, call=None) -> None:
        """Overwrite SCRUB_BYTES of the calling thread's stack below the stack pointer, where a
        kernel's frames lie and where a value left by one call would wait for the next (the CPU
        side of `device_state`; the CUDA runtime scrubs shared and local memory). The judge runs
        it ahead of every call of a candidate and ahead of every timed call, outside the timing
        (judge/worker.Judge). libc's own getcontext (the stack pointer) and memset do the work,
        on this thread's stack as pthread reports it; x86-64 Linux only. A hosted call's
        scrub is its host's, on the host's thread (build/backends/kernel_host.py)."""
        import threading

        if call is not None and hasattr(call, "scrub"):
            call.scrub(max(self.SCRUB_BYTES, int(local_bytes or 0)))
            return
        if self.hosted:
            return

        st = self._stack_bounds()
        if st is None:
            return
        ctx, memset, getcontext = st
        if getcontext(ctx) != 0:
            return
        sp = int.from_bytes(bytes(ctx[160:168]), "little")  # uc_mcontext.gregs[REG_RSP]
        low = self._stack_low.get(threading.get_ident())
        if low is None:
            low = self._stack_low[threading.get_ident()] = self._thread_stack_low()
        top = sp - self._SCRUB_MARGIN
        bottom = max(top - max(self.SCRUB_BYTES, int(local_bytes or 0)), low + 65536)
        if top > bottom:
            memset(ctypes.c_void_p(bottom), 0, ctypes.c_size_t(top - bottom))

    _stack_low: dict = {}
    _scrub_fns = None

    def _stack_bounds(self):
        import platform

        if Runtime._scrub_fns is None:
            if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
                Runtime._scrub_fns = False
            else:
                libc = ctypes.CDLL(None)
                memset = libc.memset
                memset.restype, memset.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
                getcontext = libc.getcontext
                getcontext.restype, getcontext.argtypes = ctypes.c_int, [ctypes.c_void_p]
                Runtime._scrub_fns = (ctypes.create_string_buffer(4096), memset, getcontext)
        return Runtime._scrub_fns or None

    @staticmethod
    def _thread_stack_low() -> int:
        """The lowest address of this thread's stack (pthread_getattr_np; for the main thread
        glibc reads it from /proc/self/maps and the stack limit, once per thread here)."""
        libc = ctypes.CDLL(None)
        libc.pthread_self.restype = ctypes.c_ulong
        attr = ctypes.create_string_buffer(256)
        addr, size = ctypes.c_void_p(), ctypes.c_size_t()
        if libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) != 0:
            return 1 << 62  # unknown: scrub nothing
        try:
            if libc.pthread_attr_getstack(attr, ctypes.byref(addr), ctypes.byref(size)) != 0:
                return 1 << 62
        finally:
            libc.pthread_attr_destroy(attr)
        return int(addr.value or 0)

    def sync(self) -> None:
        pass

    def timer(self, call, sync) -> float:
        timed = getattr(call, "timed", None)  # a hosted call: the host primed, then go to done
        return timed() if timed is not None else wall_timer(call, sync)

    def flush(self) -> None:
        """Evict caches: write a buffer twice the profile's last-level cache."""
        import torch

        if self._flush_buf is None:
            n = 2 * int(self.hw.get("l2_bytes", 64 << 20)) // 4
            self._flush_buf = torch.empty(n, dtype=torch.float32)
        self._flush_buf.fill_(1.0)
