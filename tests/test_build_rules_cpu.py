"""The CPU backend's build rules judged by what the compiler does, not how the source spells it
(red team, 2026-12): the headers the compiler actually includes, the symbols the library
actually imports, optimize/target in the preprocessed source, writable data by section, the
stack scrubbed between calls, and the seccomp filter's side doors (io_uring and friends)."""
from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
import sys
import textwrap

import pytest

from runner.build.backends import cpu
from runner.build.builder import Builder
from runner.spec.spec import load_spec

from .conftest import PIPELINES, ROOT

ENTRY_LINE = "extern \"C\" void rmsnorm_cpu("
BODY_LINE = "  rows(x, w, out, 0, M, N, eps);\n"
MOE_ENTRY = "extern \"C\" void moe_gemm_cpu("
X86 = platform.system() == "Linux" and platform.machine() == "x86_64"


def _project(tmp_path, spec="rmsnorm-cpu.yaml", template="rmsnorm.cpp.j2"):
    (tmp_path / "pipelines").mkdir(parents=True)
    (tmp_path / "kernel_templates").mkdir()
    shutil.copy(PIPELINES / spec, tmp_path / "pipelines" / spec)
    text = (ROOT / "kernel_templates" / template).read_text()
    (tmp_path / "kernel_templates" / template).write_text(text)
    sp = load_spec(tmp_path / "pipelines" / spec)
    return Builder(sp), sp, text


def _build(b: Builder, sp, text: str | None, **params):
    cfg = {**dict(sp.start), **params}
    vid = None
    if text is not None:
        vid = f"v{len(b.variants)}"
        b.variants[vid] = text
    return b.build(b.render_all(cfg, vid), b.geometry(cfg), b.approved_sources(cfg, vid))


@pytest.fixture
def rms(tmp_path):
    b, sp, text = _project(tmp_path)
    assert text.count(ENTRY_LINE) == 1 and text.count(BODY_LINE) == 1
    return b, sp, text


def _rms_variant(text: str, decl: str = "", use: str = "", head: str = "") -> str:
    return head + text.replace(ENTRY_LINE, decl + "\n" + ENTRY_LINE).replace(BODY_LINE, use + BODY_LINE)


def _verdict(rms, **kw):
    b, sp, text = rms
    return _build(b, sp, _rms_variant(text, **kw), THREADS=1)


# ---------------------------------------------------------------- 1. headers: what is included


@pytest.mark.parametrize("decl, what", [
    ("#include_next <dlfcn.h>", "include_next"),
    ("#import <dlfcn.h>", "import"),
    ("#define HDR <dlfcn.h>\n#include HDR", "#include HDR"),
    ("%:define HDR <dlfcn.h>\n%:  include \\\n HDR", "HDR"),   # digraph and splice
])
def test_header_spellings_are_refused(rms, decl, what):
    got = _verdict(rms, decl=decl)
    assert got.status == "forbidden" and what in got.reason, (got.status, got.reason)


def test_an_include_of_any_file_is_refused_and_its_text_never_echoed(rms, tmp_path):
    secret = tmp_path / "judge_secret.txt"
    secret.write_text("TOPSECRET-7f3a\n#bogus directive TOPSECRET-7f3a\n")
    got = _verdict(rms, head=f'#define F "{secret}"\n#include F\n')
    assert got.status == "forbidden", (got.status, got.reason)
    assert "TOPSECRET" not in got.reason and "TOPSECRET" not in (got.log or "")


def test_what_the_compiler_includes_is_judged_not_the_spelling():
    # past the textual rules: the preprocessor's own include tree refuses a header off the list
    text, why = cpu.preprocessed("#include_next <dlfcn.h>\nint x;\n", ())
    assert text is None and why.startswith("library_calls") and "dlfcn.h" in why, why
    text, why = cpu.preprocessed('#define F "/etc/hostname"\n#include F\nint x;\n', ())
    assert text is None and why.startswith("library_calls") and "/etc/hostname" in why, why
    text, why = cpu.preprocessed("#include <cmath>\n#include <thread>\nint y = 1;\n", ())
    assert text is not None and "int y = 1;" in text and "namespace std" not in text, why


def test_the_compile_log_is_capped(rms):
    got = _verdict(rms, use="  " + "undeclared_name_xyz(); " * 400 + "\n")
    assert got.status == "compile_error"
    assert len(got.log) <= cpu.LOG_CAP + 100 and len(got.reason) <= 500


# ---------------------------------------------------------------- 2. imports: what is bound


@pytest.mark.parametrize("decl, use, sym", [
    ('static int py_run(const char*) __attribute__((weakref("PyRun_SimpleString")));',
     '  if (py_run) py_run("x = 1");\n', "PyRun_SimpleString"),
    ('static long raw_write(int, const void*, unsigned long) __attribute__((weakref("write")));',
     '  raw_write(99, x, 4);\n', "'write'"),
    ("", '  setenv("PIPE_RT", "1", 1);\n', "setenv"),            # <cmath> brings stdlib.h: no header, no extern
    ('[[gnu::weakref("syscall")]] static long sc(long, ...);', "  sc(425L, 4L, x);\n", "syscall"),
])
def test_imports_outside_math_and_runtime_are_library_calls(rms, decl, use, sym):
    got = _verdict(rms, decl=decl, use=use)
    assert got.status == "forbidden", (got.status, got.reason)
    assert got.reason.startswith("library_calls") and sym in got.reason, got.reason


def test_import_rules_keep_math_memory_and_threads():
    assert cpu.import_violation(["sqrtf", "expf", "memcpy", "_Znwm", "_ZdlPvm", "__gxx_personality_v0",
                                 "_ZNSt6thread4joinEv", "_Unwind_Resume", "__gmon_start__"]) is None
    for bad in ("dlsym", "getenv", "mmap", "pthread_create", "open", "PyGILState_Ensure", "io_uring_setup"):
        assert cpu.import_violation(["sqrtf", bad]) is not None, bad


# ---------------------------------------------------------------- 3. fast math: optimize/target


@pytest.mark.parametrize("head", [
    '[[gnu::optimize("Ofast")]] static int f1() { return 1; }\n',
    '[[deprecated("]"), gnu::optimize("Ofast")]] static int f4() { return 4; }\n',  # a "]" in a string first
    '__attribute__((target("avx512f"))) static int f5() { return 5; }\n',
    '_Pragma("GCC optimize(\\"Ofast\\")")\n',
    '__attribute__((hot, optimize("Ofast"))) static int f2() { return 2; }\n',
    '#define OPT optimize\n__attribute__((OPT("Ofast"))) static int f3() { return 3; }\n',   # after the preprocessor
    '#define P(x) _Pragma(#x)\nP(GCC optimize("fast-math"))\n',
    '#pragma GCC push_options\n#pragma GCC target("avx2")\n',
    '[[gnu::target("arch=skylake")]] static int f4() { return 4; }\n',
])
def test_optimize_and_target_in_any_spelling_are_fast_math(rms, head):
    b, sp, text = rms
    got = _build(b, sp, text.replace(ENTRY_LINE, head + ENTRY_LINE), THREADS=1)
    assert got.status == "forbidden" and got.reason.startswith("fast_math"), (got.status, got.reason)


# ---------------------------------------------------------------- 4. state: by section, and the stack


@pytest.mark.parametrize("decl, use, name", [
    ("float* _ZTVmemo = nullptr;", "  if (!_ZTVmemo) _ZTVmemo = out;\n", "_ZTVmemo"),
    ("float _ZTSmemo[64];", "  _ZTSmemo[M % 64] = x[0];\n", "_ZTSmemo"),
    ("thread_local long _ZTIcalls;", "  ++_ZTIcalls;\n", "_ZTIcalls"),
])
def test_writable_data_is_judged_by_section_not_name(rms, decl, use, name):
    got = _verdict(rms, decl=decl, use=use)
    assert got.status == "forbidden", (got.status, got.reason)
    assert got.reason.startswith("device_state") and name in got.reason, got.reason


def test_the_approved_templates_and_an_honest_variant_still_build(rms, tmp_path):
    b, sp, text = rms
    assert _build(b, sp, None, THREADS=1).status == "ok"
    assert _build(b, sp, None, THREADS=2).status == "ok"
    assert _build(b, sp, text.replace("s += acc[j];", "s = s + acc[j];"), THREADS=2).status == "ok"
    mb, msp, mtext = _project(tmp_path / "moe", "moe-cpu.yaml", "moe_gemm.cpp.j2")
    assert _build(mb, msp, None).status == "ok"
    got = _build(mb, msp, mtext.replace(MOE_ENTRY, "// honest\n" + MOE_ENTRY))
    assert got.status == "ok", got.reason


DEEP = r"""
#include <cstdint>
static __attribute__((noinline)) void put_deep(uint64_t v) { volatile uint64_t d[40000]; for (int i = 0; i < 40000; ++i) d[i] = v; }
static __attribute__((noinline)) uint64_t get_deep(uint64_t v) { volatile uint64_t d[40000]; uint64_t n = 0; for (int i = 0; i < 40000; ++i) n += d[i] == v; return n; }
extern "C" void deep(int64_t get, uint64_t v, uint64_t* found) { if (get) *found = get_deep(v); else put_deep(v); }
"""


@pytest.mark.skipif(not X86, reason="the scrub is x86-64 Linux")
def test_the_kernel_host_scrubs_the_stack_below_the_call(tmp_path):
    """A 320 KB frame left by one call, read by the next in the same kernel host: the host's
    scrub before every call leaves none of it; with the scrub off (the control) it all stays."""
    import torch

    from runner.build.backends import cpu_host as host

    src, lib = tmp_path / "deep.cpp", tmp_path / "deep.so"
    src.write_text(DEEP)
    subprocess.run([cpu.CXX, "-O2", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    arena, census = host.Arena(1 << 24), host.HostCensus()
    h = host.Host(arena, str(lib), "deep", ["i64", "i64", "ptr"], census)
    found = arena.tensor(torch.zeros(1, dtype=torch.int64))
    mark = 0x5EEDC0FFEE123457 - (1 << 64)  # as an int64
    try:
        def left():
            host.HostCall(h, [0, mark, found.data_ptr()])()
            host.HostCall(h, [1, mark, found.data_ptr()])()
            return int(found[0])

        assert left() < 16, "words of the last call's 320 KB frame survived the host's scrub"
        h.scrub_bytes = 0  # the control: no scrub
        assert left() > 30000
        assert census.take() is None  # nothing ran between the calls
    finally:
        h.close()


# ---------------------------------------------------------------- 5. seccomp: the side doors

SYSCALLS = textwrap.dedent("""
    import ctypes, sys
    from runner.judge import sandbox
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    print("installed", sandbox.install())
    buf = ctypes.create_string_buffer(256)
    for name, nr, args in [("io_uring_setup", 425, (4, buf)), ("io_uring_enter", 426, (0, 1, 1, 1, 0, 0)),
                           ("io_uring_register", 427, (0, 0, 0, 0)), ("memfd_create", 319, (b"x", 0)),
                           ("userfaultfd", 323, (0,)), ("bpf", 321, (0, buf, 0)),
                           ("perf_event_open", 298, (buf, 0, -1, -1, 0)), ("pidfd_open", 434, (1, 0))]:
        rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        print(name, "refused" if rc == -1 and ctypes.get_errno() == 1 else f"ALLOWED {rc} {ctypes.get_errno()}")
    print("getpid ok", libc.syscall(ctypes.c_long(39)) > 0)
""")


@pytest.mark.skipif(not X86, reason="the filter is for x86-64 Linux")
def test_the_filter_refuses_io_uring_and_other_side_doors():
    r = subprocess.run([sys.executable, "-c", SYSCALLS], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "installed True" in r.stdout and "getpid ok True" in r.stdout, r.stdout
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register", "memfd_create", "userfaultfd", "bpf",
                 "perf_event_open", "pidfd_open"):
        assert f"{name} refused" in r.stdout, r.stdout


def test_the_filter_refuses_other_abis():
    from runner.judge import sandbox

    prog = sandbox._program()
    assert prog[1] == (sandbox.JEQ_K, 1, 0, sandbox.AUDIT_ARCH_X86_64)
    assert prog[2] == (sandbox.RET_K, 0, 0, sandbox.RET_ERRNO | sandbox.EPERM)  # i386 via int $0x80


@pytest.mark.parametrize("decl", [
    # a global object whose constructor runs as the worker loads the library
    "static volatile float pipe_seed = 2.f;\n"
    "struct PipeInit { float v; PipeInit() : v(std::sqrt(pipe_seed)) {} };\nstatic PipeInit pipe_init;\n",
    # a function pointer put in the loader's table by a section attribute
    "static void pipe_early() {}\n__attribute__((used, section(\".init_array\"))) static void (*pipe_ia)() = pipe_early;\n",
])
def test_code_the_loader_would_run_is_refused(rms, decl, monkeypatch):
    """Session 30's red team: a constructor (a global object's, or a pointer placed in
    .init_array) runs when the worker loads the library, before the judge's first call and
    outside every checked or timed one. A variant's load-time tables may be no larger than the
    approved template's build's. (A section attribute is refused by name first; the library's
    tables are judged with that rule off, as for a spelling no rule reads.)"""
    from runner.build import ptx

    body = 'extern "C" void k(float* y, const float* x, long n) { for (long i = 0; i < n; ++i) y[i] = x[i]; }\n'
    if "section(" in decl:
        assert "section and ifunc" in cpu.compile("#include <cmath>\n" + decl + body, "k", (), None).reason
        monkeypatch.setattr(cpu, "INTEGRITY", tuple(r for r in cpu.INTEGRITY if "section" not in r[0]))
    ok = cpu.compile("#include <cmath>\n" + body, "k", (), None)
    got = cpu.compile("#include <cmath>\n" + decl + body, "k", (), None)
    assert ok.ok and got.ok, (ok.reason, got.reason)
    assert ptx.LOAD_TIME not in ok.ptx["data"] and got.ptx["data"][ptx.LOAD_TIME] > 0, got.ptx
    # judged apart from the variant's other data (the object itself is writable data too)
    same_data = {**got.ptx, "data": {k: v for k, v in got.ptx["data"].items() if k != ptx.LOAD_TIME}}
    action, why = ptx.compare(got.ptx, same_data, [])
    assert action == "device_state" and "load-time" in why, (action, why)
    assert ptx.compare(got.ptx, got.ptx, []) is None  # the approved template's own: allowed


def test_a_raw_string_hides_no_code_from_the_source_rules():
    """Session 30's second red team: `R"x( " /* )x"` ... `R"y( */ " )y"` read as plain strings
    made everything between them one block comment to the rules, while g++ compiled it: inline
    asm and a bare syscall passed. Raw strings are read as the compiler reads them."""
    src = ('const char* pipe_a = R"x( " /* )x";\n'
           'extern "C" void k(float* y) { asm volatile("nop"); y[0] = 1.f; }\n'
           'const char* pipe_b = R"y( */ " )y";\n')
    bad = cpu.integrity_violation(src, "k")
    assert bad is not None and "inline assembly" in bad, bad
    # the control: the same code outside any string trick is refused the same way, and a raw
    # string that hides nothing leaves an honest kernel alone
    assert "inline assembly" in cpu.integrity_violation(src.replace("R\"x( \" /* )x\"", "\"\"")
                                                         .replace("R\"y( */ \" )y\"", "\"\""), "k")
    assert cpu.integrity_violation('const char* s = R"(a /* b)";\nextern "C" void k(float* y) { y[0] = 1.f; }\n',
                                   "k") is None
