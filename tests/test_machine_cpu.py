"""The CPU backend's compiled code, judged as the CUDA backend's is: a variant's x86 machine
code against the approved template's (runner/build/x86.py), and bytes that execute without
the compiler having made them a function (backends/cpu._elf_state's foreign code).

Each hack below passed the CPU judge before this change: `immintrin.h` is allowed, and with
it `_mm_rsqrt_ss` (a 12-bit reciprocal square root) and the int8 dot products; and an array
placed in an executable section by a section attribute ran as code that no rule read.
"""

from __future__ import annotations

import pytest

from runner.build import x86
from runner.build.backends import cpu
from runner.build.builder import Builder

from .conftest import ROOT, shipped_spec

SCALE = "    const {{ ctype }} scale = {{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps));"
ARG = "s / {{ ctype }}(N) + {{ ctype }}(eps)"


@pytest.mark.parametrize("line, action", [
    ("vrsqrtss xmm0,xmm0,xmm0", "fast_math"),
    ("rcpps xmm1,xmm2", "fast_math"),
    ("vrcp14ps zmm0,zmm1", "fast_math"),
    ("vrsqrt28sd xmm0,xmm1,xmm2", "fast_math"),
    ("vldmxcsr DWORD PTR [rsp-0x4]", "fast_math"),
    ("fxrstor64 [rdi]", "fast_math"),
    ("vaddph zmm0,zmm1,zmm2", "lower_precision"),
    ("vfmadd231sh xmm0,xmm1,xmm2", "lower_precision"),
    ("rex.W ldmxcsr DWORD PTR [rdi]", "fast_math"),  # a redundant REX prefix, as objdump spells it
    ("rex.WRXB vrsqrtps xmm0,xmm1", "fast_math"),
    ("fldcw WORD PTR [rsp-0x2]", None),  # GCC's own around an exact long double floor (the host reads the state)
    ("f2xm1", "fast_math"),
    ("vmulps zmm0,zmm1,zmm2{rz-sae}", "fast_math"),  # a rounding mode of its own, no MXCSR write
    ("vaddps zmm0,zmm1,zmm2{rn-sae}", None),  # round to nearest: the default's
    ("vcvtps2dq zmm0,zmm1{rz-sae}", None),  # a conversion's truncation, as a C cast
    ("fsin", "fast_math"),
    ("{vex} vpdpbusd ymm0,ymm1,ymm2", "int_narrowing"),
    ("vpdpwssds zmm0,zmm1,zmm2", "int_narrowing"),
    ("pmaddubsw xmm0,xmm1", "int_narrowing"),  # an int16 dot loop compiles to these
    ("tdpbssd tmm0,tmm1,tmm2", "int_narrowing"),
    ("vcvtss2sh xmm0,xmm1,xmm2", "narrowing"),  # AVX-512 FP16 conversions round to 16 bits too
    ("vcvtw2ph zmm0,zmm1", "narrowing"),
    ("tdpfp16ps tmm0,tmm1,tmm2", "lower_precision"),
    ("vdpbf16ps zmm0,zmm1,zmm2", "narrowing"),  # bf16 products summed in f32: allowed in a bf16 op
    ("vcvtneps2bf16 ymm0,zmm1", "narrowing"),  # rounding to bf16 to store it
    ("vcvtps2ph xmm0,ymm1,0x4", "narrowing"),
    ("vmovsh xmm0,WORD PTR [rdi]", None),
    ("vcmpph k1,zmm0,zmm1,0x1", None),
    ("vaddps ymm0,ymm1,ymm2", None),
    ("vsqrtss xmm0,xmm0,xmm0", None),  # sqrtf inlined: exact
    ("lock add DWORD PTR [rip+0x2ee5],0x1", None),
    ("(bad)", "unreadable"),
])
def test_classify(line, action):
    (op, operands), = x86.instructions(f"    137f:\t{line}")
    assert x86.classify(op, operands) == action


def test_an_undecodable_instruction_is_refused_beyond_the_approved_build():
    a = x86.analyze("    10:\tvaddps ymm0,ymm1,ymm2\n    14:\t(bad)\n")
    assert a["read"] == 2 and a["unreadable"] == 1
    assert x86.compare(a, {"read": 9}, [])[0] == "unreadable_code"  # whatever the spec names
    assert x86.compare(a, dict(a), []) is None


@pytest.fixture(scope="module")
def rms():
    sp = shipped_spec(ROOT / "pipelines" / "rmsnorm-cpu.yaml")
    assert {"fast_math", "lower_precision"} <= set(sp.forbidden.named)
    assert sp.kernel.template.count(SCALE) == 1
    return Builder(sp)


def _build(ev: Builder, text: str):
    vid = f"v{len(ev.variants)}"
    ev.variants[vid] = text
    start = ev.spec.starts[0]
    return ev.build(ev.render_all(start, vid), ev.geometry(start), ev.approved_sources(start, vid))


def _with(ev: Builder, scale: str, head: str = "#include <immintrin.h>\n") -> str:
    t = ev.spec.kernel.template
    return t.replace("#include <cmath>\n", "#include <cmath>\n" + head, 1).replace(SCALE, scale)


def test_an_approximate_intrinsic_is_refused_in_the_machine_code(rms):
    b = _build(rms, _with(rms, f"    const float scale = _mm_cvtss_f32(_mm_rsqrt_ss(_mm_set_ss({ARG})));"))
    assert b.status == "forbidden" and b.reason.startswith("fast_math"), b.reason
    assert "'vrsqrtss' in the machine code" in b.reason and "vs 0 in the approved" in b.reason, b.reason


def test_an_int8_dot_product_is_refused_in_the_machine_code(rms):
    dot = ("    const __m512i q = _mm512_dpbusd_epi32(_mm512_set1_epi32((int)s), _mm512_set1_epi32((int)N), "
           "_mm512_set1_epi32(3));\n"
           f"    const {{{{ ctype }}}} scale = {{{{ ctype }}}}(1) / std::sqrt({ARG}) + 0.f * _mm512_reduce_add_epi32(q);")
    b = _build(rms, _with(rms, dot))
    if b.status == "compile_error":  # a machine without AVX-512 VNNI (-march=native)
        pytest.skip(f"no AVX-512 VNNI here: {b.reason}")
    assert b.status == "forbidden" and b.reason.startswith("lower_precision") and "vpdpbusd" in b.reason, b.reason


def test_honest_variants_pass_the_machine_code(rms):
    """Exact intrinsics (a vector sqrt and divide), sqrtf for std::sqrt, a pow: no approximation."""
    for scale in (f"    const float scale = 1.f / _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss({ARG})));",
                  f"    const float scale = 1.f / sqrtf({ARG});",
                  f"    const float scale = std::pow({ARG}, -0.5f);"):
        b = _build(rms, _with(rms, scale))
        assert b.status == "ok", (scale, b.reason)


BLOB = 'const unsigned char pipe_blob[] = {0xf3, 0x0f, 0x52, 0xc0, 0xc3};  // rsqrtss xmm0, xmm0; ret\n'
CALL = f"    const float scale = ((float (*)(float))(const void*)pipe_blob)({ARG});"


@pytest.mark.parametrize("attr", [
    '__attribute__((section(".text.pipe,\\"ax\\",@progbits#")))',  # flags smuggled in the name
    '__attribute__((section(".text")))',
])
def test_bytes_placed_in_an_executable_section_are_refused(rms, monkeypatch, attr):
    text = _with(rms, CALL, head="").replace("namespace {\n", "namespace {\n" + attr + " " + BLOB, 1)
    b = _build(rms, text)
    assert b.status == "forbidden" and "section and ifunc attributes" in b.reason, b.reason  # by name first
    # and by the library itself, for a spelling no rule reads
    monkeypatch.setattr(cpu, "INTEGRITY", tuple(r for r in cpu.INTEGRITY if "section" not in r[0]))
    b = _build(rms, text)
    assert b.status == "forbidden" and b.reason.startswith("foreign_code") and "pipe_blob" in b.reason, b.reason


def test_an_indirect_function_is_refused(rms, monkeypatch):
    """An ifunc's resolver runs as the library is relocated, outside every call."""
    decl = ("static float pipe_inv(float v) { return 1.f / std::sqrt(v); }\n"
            "static float (*pipe_pick())(float) { return pipe_inv; }\n"
            'float pipe_ifn(float) __attribute__((ifunc("_ZL9pipe_pickv")));\n')
    text = _with(rms, f"    const float scale = pipe_ifn({ARG});", head="").replace("namespace {\n", decl + "namespace {\n", 1)
    b = _build(rms, text)
    assert b.status == "forbidden" and "section and ifunc attributes" in b.reason, b.reason  # by name first
    monkeypatch.setattr(cpu, "INTEGRITY", tuple(r for r in cpu.INTEGRITY if "section" not in r[0]))
    b = _build(rms, text)
    assert b.status == "forbidden" and b.reason.startswith("foreign_code"), b.reason
    assert "indirect function '_Z8pipe_ifnf'" in b.reason, b.reason


def test_without_objdump_a_variant_is_refused_and_a_fill_is_not(rms, monkeypatch):
    monkeypatch.setattr(x86.shutil, "which", lambda name: None if name == "objdump" else "/usr/bin/" + name)
    monkeypatch.setattr(x86, "_digest", lambda: "no-objdump")  # nothing read from the cache
    b = _build(rms, _with(rms, f"    const float scale = 1.f / sqrtf({ARG});"))
    assert b.status == "error" and b.reason.startswith("disassembler_unavailable"), b.reason
    start = rms.spec.starts[0]
    assert rms.build(rms.render_all(start), rms.geometry(start), None).status == "ok"


def test_rounding_to_16_bits_in_an_fp32_op_is_lower_precision(rms):
    """rmsnorm-cpu declares fp32 only: a sum rounded through fp16 (F16C's conversions around fp32
    instructions, session 39's red team) is narrowing there, whatever spells it."""
    half = (f"    const float h = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss({ARG}), 0)));\n"
            "    const float scale = 1.f / std::sqrt(h);")
    b = _build(rms, _with(rms, half))
    assert b.status == "forbidden" and b.reason.startswith("lower_precision") and "vcvtps2ph" in b.reason, b.reason
