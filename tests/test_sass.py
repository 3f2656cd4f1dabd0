"""The judge's second reading of a variant's compiled code: the SASS of the cubin the worker
loads (runner/build/sass.py), against the approved template's SASS at the same parameters.

The PTX reader and the source rules come first; these tests switch both off where they ask
what the SASS alone refuses, which is what stands if either is ever fooled by a spelling.
The SASS lines below are cuobjdump's, from NVRTC 13 builds for sm_90 on this project's
templates and probes. NVRTC and the disassembler need no GPU: all of this runs in the CPU
suite (CI installs the `cuda` extra, which brings both).
"""

from __future__ import annotations

import pytest

from runner.build import sass

NAMED = ["fast_math", "lower_precision", "library_calls", "side_streams", "host_sync", "disable_cuda_graphs",
         "spills"]


@pytest.mark.parametrize("line, action", [
    ("HADD2.F32 R0, -RZ, R6.H0_H0", None),  # a half widened to a float: x + (-0)
    ("HFMA2.MMA R7, -RZ, RZ, 1.875, 0", None),  # a constant made on the MMA pipe
    ("HFMA2.MMA R9, R10, R0, R11", "lower_precision"),  # __hfma2
    ("HFMA2.MMA.BF16_V2 R19, R18, 1, 1, R21", "lower_precision"),  # a bf16 sum as x * 1 + y
    ("HMUL2.BF16_V2 R13, R11, R0", "lower_precision"),
    ("HMNMX2.BF16_V2 R19, R19, R0, !PT", "lower_precision"),
    ("HADD2 R19, R18, R9", "lower_precision"),
    ("HMMA.16816.F32.BF16 R4, R8, R12, R4", "narrowing"),  # bf16 in, f32 accumulators: allowed in a bf16 op
    ("HMMA.16816.F16.F16 R4, R8, R12, R4", "lower_precision"),  # f16 accumulators
    ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", "narrowing"),
    ("HGMMA.64x128x16.F32.TF32 R24, gdesc[UR4], R24", "lower_precision"),
    ("QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24", "lower_precision"),
    ("IMMA.16832.S8.S8 R4, R8, R12, R4", "lower_precision"),
    ("IDP.4A.S8.S8 R13, R13, R9, R0", "lower_precision"),
    ("VABSDIFF4.U8 R17, R0, R17, RZ", "lower_precision"),
    ("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R12, R15, R12, RZ", "lower_precision"),
    ("F2FP.F16.E4M3.UNPACK_B R4, R5", "lower_precision"),
    ("F2FP.BF16.F32.PACK_AB R4, R5, R6", "narrowing"),  # rounding f32 to bf16 to store it: a conversion
    ("ATOM.E.ADD.BF16x2.RN.STRONG.GPU P0, RZ, desc[UR4][R10.64], R21", "lower_precision"),
    ("REDG.E.ADD.F16x2.RN.STRONG.GPU desc[UR4][R2.64], R5", "lower_precision"),
    ("ATOMG.E.ADD.STRONG.GPU PT, R3, desc[UR4][R2.64], R5", None),  # an f32 sum in memory
    ("MUFU.SIN R0, R4", "fast_math"),
    ("MUFU.EX2 R7, R2", "fast_math"),  # (waived where the math library compiles to it)
    ("FMUL.FTZ R6, R19, R2", "fast_math"),
    ("FSETP.GEU.FTZ.AND P1, PT, R2, RZ, PT", "fast_math"),
    ("F2I.FTZ.U32.TRUNC.NTZ R3, R3", None),  # integer division's quotient: flushing changes nothing
    ("REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR4][R2.64], R5", None),  # atomicAdd(float*): f32 sums always flush
    ("HFMA2.BF16_V2 R0, -RZ.H0_H0, RZ.H0_H0, |R0|.H0_H0", None),  # __habs on bf16: 0 * 0 + |x|
    ("HADD2 R0, -R2.H0_H0, -RZ.H0_H0", None),  # __hneg
    ("MUFU.EX2.F16 R3, R2", "lower_precision"),  # a half-precision exponential (not the library's)
    ("FFMA R4, R13, -1.5707962512969970703, R12", None),
    # rounding toward zero or an infinity (session 44's red team: `__fmul_rz`, `__float2bfloat16_rz`)
    ("FMUL.RZ R6, R19, R2", "fast_math"), ("FADD.RM R6, R19, R2", "fast_math"),
    ("FFMA.RP R4, R13, R2, R12", "fast_math"), ("F2F.F32.F64.RZ R2, R4", "fast_math"),
    ("F2FP.BF16.F32.PACK_AB.RZ R4, R5, R6", "lower_precision"),
    ("FMUL R6, RZ, R2", None),  # RZ the zero register, not a rounding
])
def test_classify(line, action):
    (op, operands), = sass.instructions(f"        /*0070*/                   {line} ;   /* 0x0000000400057308 */")
    assert sass.classify(op, operands) == action


def test_rounding_to_16_bits_is_lower_precision_only_where_the_op_has_no_16_bit_float():
    a = sass.analyze("        /*0000*/   F2FP.BF16.F32.PACK_AB R4, R5, R6 ;\n")
    assert sass.compare(a, {}, NAMED) is None  # a bf16 op stores its output so
    action, why = sass.compare(a, {}, NAMED, narrow_ok=False)
    assert action == "lower_precision" and "F2FP.BF16.F32.PACK_AB" in why


def test_counts_are_per_opcode_and_fast_math_by_function():
    text = "\n".join(f"        /*{i * 16:04x}*/   {ln} ;" for i, ln in enumerate([
        "@P0 MUFU.SIN R0, R4", "MUFU.SIN R1, R4", "FSETP.GEU.FTZ.AND P1, PT, R2, RZ, PT",
        "FSETP.NEU.FTZ.AND P1, PT, |R2|, +INF , PT", "HMUL2.BF16_V2 R13, R11, R0", "NOP", "FADD R1, R2, R3"]))
    a = sass.analyze(text)
    assert a == {"lower_precision": {"HMUL2.BF16_V2": 1}, "fast_math": {"FSETP.FTZ": 2, "MUFU.SIN": 2},
                 "narrowing": {}, "int_narrowing": {}, "read": 6}
    base = {"lower_precision": {}, "fast_math": {"MUFU.SIN": 2, "FSETP.FTZ": 2}}
    assert sass.compare(a, base, NAMED)[0] == "lower_precision"
    assert sass.compare(a, base, ["fast_math"]) is None  # as many as the approved build
    action, why = sass.compare(a, {}, ["fast_math"])
    assert action == "fast_math" and "2 in the candidate's cubin vs 0" in why
    assert sass.compare(a, {}, ["fast_math"], waived=frozenset({"MUFU.SIN", "FSETP.FTZ"})) is None
    # nothing read is never a clean reading
    assert sass.compare({"read": 0}, None, NAMED)[0] == "unreadable_code"


# ------------------------------------------------------ through NVRTC and the disassembler

needs_tools = pytest.mark.skipif(sass.tool() is None, reason="cuobjdump/nvdisasm not installed (the cuda extra)")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    pytest.importorskip("cuda.core")
    pytest.importorskip("pcpp")
    from .test_forbid_compiled import NAMED as FC_NAMED
    from .test_forbid_compiled import approved

    return approved(tmp_path_factory.mktemp("sass"), FC_NAMED)


@pytest.fixture
def ptx_blind(monkeypatch):
    """The source rules and the PTX reader switched off: only the SASS judges."""
    from runner.build import builder, forbid, ptx

    monkeypatch.setattr(ptx, "compare", lambda *a, **k: None)
    monkeypatch.setattr(forbid, "check_expanded", lambda *a, **k: None)
    monkeypatch.setattr(forbid, "check_names_anywhere", lambda *a, **k: None)
    monkeypatch.setattr(builder.Builder, "source_rules", lambda self, src: None)


def _build(ev, text, params=None):
    from .test_forbid_compiled import build

    return build(ev, text, params)


@needs_tools
def test_the_math_library_waiver_is_read_from_its_own_sass(small):
    from runner.build.backends import cuda

    sp = small.spec
    lib = cuda.machine_library(sp.kernel.options, sp.hw)
    assert {"MUFU.EX2", "MUFU.RCP", "MUFU.RSQ"} <= lib  # expf, division, rsqrtf
    assert "MUFU.SIN" not in lib and "MUFU.TANH" not in lib  # sinf and tanhf are polynomials


@needs_tools
@pytest.mark.parametrize("line, needle", [
    ("    yr[c] = __hmul(__float2bfloat16(e), __float2bfloat16(inv));", "HMUL2"),
    # (`__sinf` reduces its argument with a multiply rounded toward zero, counted first)
    ("    yr[c] = __float2bfloat16(e * inv + __sinf(e));", ("MUFU.SIN", "FMUL.RZ")),
    ('    float t; asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(e));\n    yr[c] = __float2bfloat16(t * inv);',
     "MUFU.TANH"),
    ('    unsigned short q; asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(q) : "f"(e * inv));\n'
     '    yr[c] = __float2bfloat16((float)(q & 0xff));', "E4M3"),
])
def test_what_the_ptx_reader_misses_the_sass_refuses(small, ptx_blind, line, needle):
    from .test_forbid_compiled import APPROVED, STORE_LINE

    b = _build(small, APPROVED.replace(STORE_LINE, line))
    assert b.status == "forbidden", (b.status, b.reason)
    needles = needle if isinstance(needle, tuple) else (needle,)
    assert "in the SASS" in b.reason and any(n in b.reason for n in needles), b.reason


@needs_tools
def test_honest_variants_pass_the_sass(small, ptx_blind):
    """Another unroll, expf for exp2f (the library's MUFU.EX2 and FTZ ops), a division, an
    integer division (MUFU.RCP and F2I.FTZ), bf16 converted and stored."""
    from .test_forbid_compiled import APPROVED, EX_LINE, STORE_LINE

    for text in (APPROVED.replace("#pragma unroll {{ UNROLL }}", "#pragma unroll 8"),
                 APPROVED.replace(EX_LINE, "  return expf(v - m);"),
                 APPROVED.replace(STORE_LINE, "    yr[c] = __float2bfloat16(e / s);"),
                 APPROVED.replace(STORE_LINE, "    yr[c] = __float2bfloat16(e * inv + (float)((unsigned)c / (unsigned)M));")):
        b = _build(small, text, {"UNROLL": 2})
        assert b.status == "ok", b.reason


@needs_tools
def test_the_flagships_own_templates_pass_their_sass():
    from runner.build.builder import Builder

    from .conftest import ROOT, shipped_spec

    for name in ("softmax-h200.yaml", "decode-attention-h200.yaml", "moe-fine-swiglu-h200.yaml"):
        sp = shipped_spec(ROOT / "pipelines" / name)
        ev = Builder(sp)
        ev.variants["same"] = sp.kernel.template
        for start in sp.starts[:2]:
            b = ev.build(ev.render_all(start, "same"), ev.geometry(start), ev.approved_sources(start, "same"))
            assert b.status == "ok", (name, b.reason)


def test_without_the_disassembler_a_variant_is_refused_and_a_fill_is_not(small, monkeypatch):
    from .test_forbid_compiled import APPROVED

    monkeypatch.setattr(sass, "tool", lambda: None)
    from runner.build.backends import cuda

    monkeypatch.setattr(cuda, "_rules_digest", lambda: "no-disassembler")  # nothing read from the cache
    b = _build(small, APPROVED.replace("#pragma unroll {{ UNROLL }}", "#pragma unroll 8"))
    assert b.status == "error" and b.reason.startswith("disassembler_unavailable") and "cuobjdump" in b.reason, b.reason
    assert _build(small, None).status == "ok"  # the approved template's own fills need no reading
