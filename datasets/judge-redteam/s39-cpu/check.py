"""Build every session-39 CPU red-team variant through runner.build.builder.Builder against its
shipped spec (forbidden list unchanged) and print accepted/refused with the reason. For each
finding the same forbidden action in its canonical spelling is built too (it must be refused:
the rule is in force), the accepted library is read with objdump/nm (the forbidden mnemonic the
judge counts is absent from it), and the library is called in this process through ctypes to
show the forbidden thing really runs (flush-to-zero: a result of 2e-40 comes back 0; the
approximate reciprocal square root: a relative error of 6.6e-7 where the exact kernel has
1.2e-7). The honest variants (fp*) print their verdict (a false positive is refused). Last, the
reader's prefix handling on raw bytes (r1). No GPU needed; about a minute on two cores.

    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s39-cpu/check.py
"""
from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from runner.build import x86  # noqa: E402
from runner.build.builder import Builder  # noqa: E402
from runner.spec.spec import load_spec  # noqa: E402

_B: dict = {}


def build(spec: str, text: str, params: dict | None = None):
    if spec not in _B:
        _B[spec] = Builder(load_spec(ROOT / "pipelines" / spec))
    ev = _B[spec]
    params = {**ev.spec.starts[0], **(params or {})}
    vid = f"v{len(ev.variants)}"
    ev.variants[vid] = text
    return ev.build(ev.render_all(params, vid), ev.geometry(params), ev.approved_sources(params, vid))


def verdict(b) -> str:
    return "accepted" if b.status == "ok" else f"refused ({b.status}): {b.reason[:200]}"


def template() -> str:
    return (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()


def canon(old: str, new: str, header: bool = False) -> str:
    t = template()
    if header:
        t = t.replace("#include <thread>\n", "#include <thread>\n#include <immintrin.h>\n")
    assert old in t
    return t.replace(old, new)


SCALE = "    const {{ ctype }} scale = {{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps));"
CALL = "  rows(x, w, out, 0, M, N, eps);\n{% else %}"
CANON = {
    "ldmxcsr": canon(CALL, "  _mm_setcsr(_mm_getcsr() | 0x8000u);\n  rows(x, w, out, 0, M, N, eps);\n{% else %}", True),
    "rsqrt": canon(SCALE, "    const float a = s / float(N) + eps;\n"
                          "    const float y0 = _mm_cvtss_f32(_mm_rsqrt_ss(_mm_set_ss(a)));\n"
                          "    const float scale = y0 * (1.5f - 0.5f * a * y0 * y0);", True),
    "half": canon(SCALE, "    const _Float16 hs = _Float16(1) / _Float16(std::sqrt(s / float(N) + eps));\n"
                         "    const float scale = hs;"),
    "vnni": canon(SCALE, SCALE + "\n    volatile __m512i q = _mm512_dpbusd_epi32(_mm512_set1_epi32(int(s)), "
                                 "_mm512_set1_epi32(3), _mm512_set1_epi32(5)); (void)q;", True),
}

# name: (spec, params, the canonical spelling, what the accepted library must lack, the probe)
FINDINGS = {
    "x1_rmsnorm_ldmxcsr_in_immediate.cpp.j2": ("rmsnorm-cpu.yaml", {}, "ldmxcsr", r"\bv?ldmxcsr\b", "ftz"),
    "x2_rmsnorm_rsqrt_in_immediate.cpp.j2": ("rmsnorm-cpu.yaml", {}, "rsqrt", r"\bv?rsqrt", "rsqrt"),
    "x3_rmsnorm_half_math_via_m128h.cpp.j2": ("rmsnorm-cpu.yaml", {}, "half", r"\bv\w+(ph|sh)\b(?<!2ph)", None),
    "x4_rmsnorm_fesetenv_borrowed_from_libm.cpp.j2": ("rmsnorm-cpu.yaml", {}, "ldmxcsr", r"\b(v?ldmxcsr|fldenv)\b",
                                                      "ftz"),
    "x5_rmsnorm_jit_on_stack_via_libc_mprotect.cpp.j2": ("rmsnorm-cpu.yaml", {}, "rsqrt", r"\bv?rsqrt", "rsqrt"),
    "x6_rmsnorm_bf16_dot_in_fp32_op.cpp.j2": ("rmsnorm-cpu.yaml", {}, "vnni", None, None),
}
HONEST = {  # name: (spec, params, expected status: what an honest variant should get)
    "fp1_rmsnorm_long_double_ceil.cpp.j2": ("rmsnorm-cpu.yaml", {}, "ok"),
    "fp2_rmsnorm_avx512_lambda_thread.cpp.j2": ("rmsnorm-cpu.yaml", {}, "ok"),
    "fp3_rmsnorm_avx512_lambda.cpp.j2": ("rmsnorm-cpu.yaml", {}, "ok"),
}


def objdump(lib: str) -> str:
    return subprocess.run(["objdump", "-d", "-w", "--no-show-raw-insn", "-M", "intel", lib], capture_output=True,
                          text=True).stdout


def probe(lib: str, kind: str) -> str:
    """Call the accepted library here and show its forbidden behaviour."""
    import numpy as np

    f = ctypes.CDLL(lib).rmsnorm_cpu
    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float]
    f.restype = None
    if kind == "ftz":  # x normal, x * scale * w subnormal (2e-40): flush-to-zero makes it 0
        x = np.full((1, 33), 2e-38, np.float32)
        w = np.full(33, 1e-5, np.float32)
        o = np.zeros_like(x)
        f(x.ctypes.data, w.ctypes.data, o.ctypes.data, 1, 33, 1e-6)
        return f"out[0] = {o[0, 0]:.3g} where IEEE gives 2e-40 (flush-to-zero ran)"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    w = np.ones(1000, np.float32)
    o = np.zeros_like(x)
    f(x.ctypes.data, w.ctypes.data, o.ctypes.data, 64, 1000, 1e-6)
    ref = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6)
    err = float(np.max(np.abs(o - ref) / np.abs(ref)))
    return f"max relative error {err:.2g} (the exact template: about 1.2e-7; rsqrtps + one Newton step: 6.6e-7)"


def reader_prefixes() -> str:
    """r1: objdump prints a redundant REX prefix as `rex.W`, `rex.WRXB` (upper case); the reader
    strips only `rex`, `rex.w`, `rex.b`, ... (lower case, single bits), so the mnemonic it counts is
    `rex.w`/`rex.wrxb`, and the ldmxcsr behind it is not counted."""
    raw = bytes.fromhex("480fae17" "4f0fae17" "0fae17")  # rex.W ldmxcsr; rex.WRXB ldmxcsr; ldmxcsr
    with tempfile.NamedTemporaryFile(suffix=".bin") as t:
        t.write(raw)
        t.flush()
        out = subprocess.run(["objdump", "-D", "-b", "binary", "-m", "i386:x86-64", "-M", "intel",
                              "--no-show-raw-insn", "-w", t.name], capture_output=True, text=True).stdout
    lines = [ln.strip() for ln in out.splitlines() if re.match(r"^\s*[0-9a-f]+:\t", ln)]
    return f"{lines} -> counted {x86.analyze(out)['fast_math']} (3 ldmxcsr executed)"


def main() -> int:
    bad = 0
    for name, (spec, params, kind, absent, how) in FINDINGS.items():
        text = (HERE / name).read_text()
        b = build(spec, text, params)
        c = build(spec, CANON[kind], params)
        print(f"{name} [{spec}]\n  variant:   {verdict(b)}\n  canonical: {verdict(c)}")
        if b.status == "ok":
            lib = b.artifacts[0]
            dis = objdump(lib)
            if absent:
                print(f"  objdump:   {len(re.findall(absent, dis))} match(es) of /{absent}/ in the accepted library")
            got = x86.analyze(dis)
            print(f"  reader:    fast_math {got['fast_math']}, lower_precision {got['lower_precision']}")
            imports = subprocess.run(["nm", "-D", "--undefined-only", lib], capture_output=True, text=True).stdout
            print(f"  imports:   {sorted(set(ln.split()[-1] for ln in imports.splitlines() if ' U ' in ln))}")
            if how:
                print(f"  runs:      {probe(lib, how)}")
        bad += b.status != "ok" or c.status == "ok"
    for name, (spec, params, want) in HONEST.items():
        b = build(spec, (HERE / name).read_text(), params)
        tag = "ok" if b.status == want else "FALSE POSITIVE"
        print(f"{name} [{spec}] honest: {verdict(b)}  [{tag}]")
        if name.startswith("fp2"):
            b2 = build(spec, (HERE / name).read_text(), {"THREADS": 2})
            print(f"  at THREADS=2 (outside the spec's search, where the approved template starts threads): {verdict(b2)}")
    print(f"r1 reader prefixes: {reader_prefixes()}")
    print("all findings accepted and their canonical spellings refused" if not bad else f"{bad} unexpected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
