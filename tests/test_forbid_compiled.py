"""Forbidden actions judged on what runs: the preprocessed source, each inline-asm
instruction, and the PTX that NVRTC emits, against the approved template's own build
(issue 18, class 2). NVRTC compiles without a GPU, so all of this runs in the CPU suite.

Each bypass below passed the source rules before this change (the outside suite's three,
then the ones written here against docs/judge.md and runner/build/forbid.py, runner/build/ptx.py); the
controls are the approved flagship templates at their start configurations and honest
variants, which must still build.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("cuda.core")
pytest.importorskip("pcpp")

from runner.build import forbid, ptx  # noqa: E402
from runner.spec.spec import load_spec  # noqa: E402
from runner.build.builder import Builder  # noqa: E402

from .conftest import ROOT, SOFTMAX_CUDA_KERNEL, hack_spec, row_op, shipped_spec  # noqa: E402

NAMED = ["fast_math", "lower_precision", "library_calls", "side_streams", "host_sync", "disable_cuda_graphs",
         "spills"]

# A small approved template: bf16 row softmax, fp32 math through exp2f, one block a row.
APPROVED = r"""#include <cuda_bf16.h>
#define L2E 1.4426950408889634f

__device__ float block_sum(float v) {
  __shared__ float red[8];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0.f;
  for (int w = 0; w < 8; ++w) v += red[w];
  return v;
}

__device__ __forceinline__ float ex(float v, float m) {
  return exp2f((v - m) * L2E);
}

extern "C" __global__ void soft(const __nv_bfloat16* x, __nv_bfloat16* y, int M, int N) {
  const __nv_bfloat16* xr = x + (size_t)blockIdx.x * N;
  __nv_bfloat16* yr = y + (size_t)blockIdx.x * N;
  float m = 0.f, s = 0.f;
#pragma unroll {{ UNROLL }}
  for (int c = threadIdx.x; c < N; c += blockDim.x) s += ex(__bfloat162float(xr[c]), m);
  s = block_sum(s);
  const float inv = 1.f / s;
  for (int c = threadIdx.x; c < N; c += blockDim.x) {
    const float e = ex(__bfloat162float(xr[c]), m);
    yr[c] = __float2bfloat16(e * inv);
  }
}
"""

def spec(template: Path, forbidden: list[str]) -> str:
    return hack_spec("compiled-forbid", template, hardware="h200",
                     op=row_op("runner.ops.reference:softmax", "bf16", [{"M": 64, "N": 1024}]),
                     kernel=SOFTMAX_CUDA_KERNEL, params={"UNROLL": [1, 2, 4]}, forbidden=forbidden,
                     baseline=None, trials=10)


def approved(root: Path, forbidden: list[str]) -> Builder:
    """The builder of the approved template under forbidden."""
    (root / "soft.cu.j2").write_text(APPROVED)
    (root / "spec.yaml").write_text(spec(root / "soft.cu.j2", forbidden))
    return Builder(load_spec(root / "spec.yaml"))


EX_LINE = "  return exp2f((v - m) * L2E);"
STORE_LINE = "    yr[c] = __float2bfloat16(e * inv);"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return approved(tmp_path_factory.mktemp("compiled_forbid"), NAMED)


def build(ev: Builder, text: str | None, params: dict | None = None):
    """The Build of the approved template (text None) or of a variant, at params."""
    params = params or {"UNROLL": 1}
    vid = None
    if text is not None:
        vid = f"v{len(ev.variants)}"
        ev.variants[vid] = text
    return ev.build(ev.render_all(params, vid), ev.geometry(params), ev.approved_sources(params, vid))


def raw_check(ev: Builder, text: str) -> forbid.Violation | None:
    ev.variants["raw"] = text
    src = ev.render_all({"UNROLL": 1}, "raw")[0]
    return forbid.check_source(src, (), "cuda", NAMED, ())


def forbidden_as(b, action: str, *needles: str) -> None:
    assert b.status == "forbidden", (b.status, b.reason)
    assert b.reason.startswith(action), b.reason
    for n in needles:
        assert n in b.reason, b.reason


# ---------------------------------------------------------------- controls

def test_small_approved_template_builds_and_records_its_ptx(small):
    b = build(small, None)
    assert b.status == "ok", b.reason
    assert b.ptx["code"].get("ex2.approx.f32", 0) >= 2  # exp2f is ex2.approx.f32: the template's own
    assert b.ptx_approved is None


@pytest.mark.parametrize("unroll", [1, 2, 4])
def test_honest_variants_still_build(small, unroll):
    """Different but exact code: another unroll, expf in place of exp2f, a second exp2f call,
    a harmless inline asm, bf16 only converted and stored, a double `round`."""
    for text in (APPROVED.replace("#pragma unroll {{ UNROLL }}", "#pragma unroll 8"),
                 APPROVED.replace(EX_LINE, "  return expf(v - m);"),
                 APPROVED.replace(EX_LINE, "  return 0.5f * exp2f((v - m) * L2E) + 0.5f * exp2f((v - m) * L2E);"),
                 APPROVED.replace(STORE_LINE, '    float t; asm("mov.b32 %0, %1;" : "=f"(t) : "f"(e * inv));\n'
                                              "    yr[c] = __float2bfloat16_rn(t);"),
                 # exact double functions that compile to a directed rounding (`round`: add.rz.f64)
                 APPROVED.replace(EX_LINE, "  return exp2f((v - m) * L2E) + 0.f * (float)round((double)v);")):
        b = build(small, text, {"UNROLL": unroll})
        assert b.status == "ok", b.reason
        assert b.ptx_approved is not None


FLAGSHIPS = ["softmax-h200.yaml", "rmsnorm-h200.yaml", "cross-entropy-h200.yaml"]


def _at_start(name: str):
    """(spec, builder, start, the approved template's build) of a shipped spec at its start."""
    sp = shipped_spec(ROOT / "pipelines" / name)
    ev = Builder(sp)
    start = sp.starts[0]
    b = ev.build(ev.render_all(start), ev.geometry(start), None)
    assert b.status == "ok", b.reason
    return sp, ev, start, b


@pytest.mark.parametrize("name", FLAGSHIPS)
def test_flagship_templates_pass_at_their_start(name):
    sp, ev, start, b = _at_start(name)
    assert b.ptx is not None
    # the flagships compute in fp32: no half arithmetic, no inline-asm approximation
    assert not any(ptx.classify(op) == "lower_precision" for op in b.ptx["code"]), b.ptx
    assert not b.ptx["asm"], b.ptx
    assert "%unreadable statements" not in b.ptx["data"], b.ptx  # the reader reads all of it
    # and their own source, as a variant of itself, is judged equal to its build
    ev.variants["same"] = sp.kernel.template
    again = ev.build(ev.render_all(start, "same"), ev.geometry(start), ev.approved_sources(start, "same"))
    assert again.status == "ok", again.reason


def test_softmax_variant_with_another_unroll_passes_and_a_bypass_does_not():
    sp = shipped_spec(ROOT / "pipelines" / "softmax-h200.yaml")
    ev = Builder(sp)
    start = sp.starts[0]
    t = sp.kernel.template
    old = "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }"
    assert old in t
    ev.variants["unroll"] = t.replace("#pragma unroll", "#pragma unroll 1", 1)
    b = ev.build(ev.render_all(start, "unroll"), ev.geometry(start), ev.approved_sources(start, "unroll"))
    assert b.status == "ok", b.reason
    ev.variants["asm"] = t.replace(old, "__device__ __forceinline__ float ex(float v, float m) { float r; "
                                        'asm("mov.f32 %0, %1; ex2.approx.ftz.f32 %0, %0;" : "=f"(r) : '
                                        '"f"((v - m) * L2E)); return r; }')
    b = ev.build(ev.render_all(start, "asm"), ev.geometry(start), ev.approved_sources(start, "asm"))
    forbidden_as(b, "fast_math", "ex2.approx.ftz.f32")


# ---------------------------------------------------------------- the outside suite's three bypasses

MACRO = APPROVED.replace("#define L2E", "#define FAST_EXP __expf\n#define L2E").replace(
    EX_LINE, "  return FAST_EXP(v - m);")
TWO_IN_ONE_ASM = APPROVED.replace(
    EX_LINE, '  float r;\n  asm("mov.f32 %0, %1; ex2.approx.ftz.f32 %0, %0;" : "=f"(r) : "f"((v - m) * L2E));\n'
             "  return r;")
BF16_OPERATORS = APPROVED.replace(
    STORE_LINE, "    yr[c] = __float2bfloat16(e) * __float2bfloat16(inv);")


def test_macro_to_an_intrinsic_is_refused(small):
    b = build(small, MACRO)
    forbidden_as(b, "fast_math", "__expf")
    # the rule that catches it reads the name, not the call: FAST_EXP(...) hides the call
    assert forbid.preprocess("#define FAST_EXP __expf\nfloat f(float v) { return FAST_EXP(v); }").count("__expf(") == 1


def test_second_instruction_in_one_asm_string_is_refused(small):
    b = build(small, TWO_IN_ONE_ASM)
    forbidden_as(b, "fast_math", "ex2.approx.ftz.f32")
    # the compiled code shows it too, in the inline asm, where nothing is waived
    src = small.render_all({"UNROLL": 1}, [k for k, v in small.variants.items() if v == TWO_IN_ONE_ASM][0])[0]
    c = small.backend.compile(src, "soft", (), small.spec.hw)
    assert c.ptx["asm"].get("ex2.approx.ftz.f32", 0) >= 2
    assert ptx.compare(c.ptx, {"code": {}, "asm": {}, "extern": {}}, ["fast_math"])[0] == "fast_math"


def test_bf16_operator_overloads_are_refused_on_the_compiled_code(small):
    assert raw_check(small, BF16_OPERATORS) is None  # nothing in the spelling
    b = build(small, BF16_OPERATORS)
    forbidden_as(b, "lower_precision", "mul", "bf16", "0 in the approved")
    assert any(ptx.classify(op) == "lower_precision" for op in b.ptx["asm"]), b.ptx


def test_bf16_operators_allowed_where_lower_precision_is_not_forbidden(tmp_path):
    ev = approved(tmp_path, ["fast_math"])
    b = build(ev, BF16_OPERATORS)
    assert b.status == "ok", b.reason


# ---------------------------------------------------------------- bypasses written against the new judge

def test_function_pointer_to_an_intrinsic(small):
    text = APPROVED.replace(EX_LINE, "  float (*f)(float) = &__expf;\n  return f((v - m));")
    forbidden_as(build(small, text), "fast_math", "__expf")


def test_nvvm_builtin_and_libdevice_fast_path(small):
    decl = 'extern "C" __device__ float __nv_fast_expf(float);\n#define L2E'
    for call, needle, text in (("__nvvm_ex2_approx_ftz_f((v - m) * L2E)", "__nvvm_ex2_approx_ftz_f", APPROVED),
                               ("__nv_fast_expf(v - m)", "__nv_fast_expf", APPROVED.replace("#define L2E", decl))):
        forbidden_as(build(small, text.replace(EX_LINE, f"  return {call};")), "fast_math", needle)


def test_nvvm_sin_approx_is_seen_in_the_ptx_when_the_name_is_not(small):
    """An approximation no accurate library function uses (sin.approx) shows in the
    compiled code whatever the spelling: here the source rule is off and the PTX check
    alone refuses it."""
    text = APPROVED.replace(EX_LINE, "  return __nvvm_sin_approx_f(v - m) + 2.f;")
    vid = "sin"
    small.variants[vid] = text
    params = {"UNROLL": 1}
    src = small.render_all(params, vid)[0]
    c = small.backend.compile(src, "soft", (), small.spec.hw)
    base = small.backend.compile(small.render_all(params, None)[0], "soft", (), small.spec.hw)
    waived = small.backend.library_opcodes((), small.spec.hw)
    assert "sin.approx.f32" not in waived and "ex2.approx.f32" in waived
    action, why = ptx.compare(c.ptx, base.ptx, ["fast_math"], waived)
    assert action == "fast_math" and "sin.approx.f32" in why


def test_ftz_by_string_concatenation_and_raw_strings(small):
    for asm in ('asm volatile("add" ".ftz" ".f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(0.f));',
                'asm volatile(R"(add.ftz.f32 %0, %1, %2;)" : "=f"(r) : "f"(a), "f"(0.f));'):
        text = APPROVED.replace(EX_LINE, f"  float a = exp2f((v - m) * L2E), r;\n  {asm}\n  return r;")
        forbidden_as(build(small, text), "fast_math", "add.ftz.f32")


def test_asm_string_from_a_macro_in_a_compiler_only_branch(small):
    """The asm text lives in a macro defined only where NVRTC compiles (__CUDACC_RTC__): the
    raw source shows no asm instruction, the preprocessor (with NVRTC's macros) does."""
    text = APPROVED.replace("#define L2E", '#ifdef __CUDACC_RTC__\n#define EX2 "ex2.approx.ftz.f32 %0, %0;"\n'
                                           '#else\n#define EX2 ""\n#endif\n#define L2E').replace(
        EX_LINE, '  float r;\n  asm("mov.f32 %0, %1;" EX2 : "=f"(r) : "f"((v - m) * L2E));\n  return r;')
    assert raw_check(small, text) is None
    b = build(small, text)
    forbidden_as(b, "fast_math", "ex2.approx.ftz.f32", "after the preprocessor")


def test_asm_in_a_branch_the_preprocessor_does_not_take_is_caught_in_the_ptx(small, monkeypatch):
    """The same, behind a macro NVRTC defines that the preprocessor is not told of: refused
    before the compile (the two take different branches there), and, were that question
    answered wrongly, the PTX check still refuses what the preprocessed source did not show."""
    from runner.build.backends import cuda

    text = APPROVED.replace("#define L2E", '#ifdef __CUDACC_VER_BUILD__\n#define EX2 "ex2.approx.ftz.f32 %0, %0;"\n'
                                           '#else\n#define EX2 ""\n#endif\n#define L2E').replace(
        EX_LINE, '  float r;\n  asm("mov.f32 %0, %1;" EX2 : "=f"(r) : "f"((v - m) * L2E));\n  return r;')
    forbidden_as(build(small, text), "preprocessor", "different branches")
    monkeypatch.setattr(cuda, "_branches_differ", lambda *a: "")  # the question answered wrongly
    monkeypatch.setattr(cuda, "expand", lambda src, options, hw: cuda._expand(src, options, hw.arch or "sm_90"))
    b = build(small, text.replace("%0, %1;", "%0, %1; "))  # (a source the builds so far have not cached)
    forbidden_as(b, "fast_math", "ex2.approx.ftz.f32", "inline asm", "0 in the approved")


def test_hidden_hmul_macro(small):
    text = APPROVED.replace("#define L2E", "#define MUL __hmul\n#define L2E").replace(
        STORE_LINE, "    yr[c] = MUL(__float2bfloat16(e), __float2bfloat16(inv));")
    assert raw_check(small, text) is None
    forbidden_as(build(small, text), "lower_precision", "__hmul", "after the preprocessor")


def test_fake_end_of_inline_asm_marker_does_not_hide_the_rest():
    ptx_text = "\n".join([
        "\tmov.f32 %f1, %f2;",
        "\t// begin inline asm",
        "\tmov.f32 %f3, %f1;",
        "\t// end inline asm",
        "\tex2.approx.ftz.f32 %f3, %f3;",
        "\t// end inline asm",
        "\tex2.approx.ftz.f32 %f4, %f4;",
        "\t// begin inline asm",
        "\t{ mul.bf16 %rs1,%rs2,%rs3; }",
        "",
        "\t// end inline asm",
    ])
    a = ptx.analyze(ptx_text)
    assert a["asm"] == {"ex2.approx.ftz.f32": 1, "mul.bf16": 1}
    assert a["code"] == {"ex2.approx.ftz.f32": 1}


def test_device_side_launch_and_external_functions_in_the_ptx():
    a = ptx.analyze(".extern .func  (.param .b32 func_retval0) cudaLaunchDevice(\n.param .b64 p0\n);\n"
                    ".extern .func  (.param .b32 func_retval0) vprintf(\n.param .b64 p0\n);\n"
                    ".extern .func mystery(\n);\n")
    assert a["extern"] == {"cudaLaunchDevice": 1, "mystery": 1, "vprintf": 1}
    assert ptx.compare(a, None, ["side_streams"]) [0] == "side_streams"
    assert ptx.compare(a, None, ["library_calls"])[0] == "library_calls"
    assert ptx.compare(a, {"code": {}, "asm": {}, "extern": {"cudaLaunchDevice": 1, "mystery": 1}},
                       ["side_streams", "library_calls"]) is None


@pytest.mark.parametrize("op, action", [
    ("ex2.approx.f32", "fast_math"), ("ex2.approx.ftz.f32", "fast_math"), ("tanh.approx.f32", "fast_math"),
    ("div.full.f32", "fast_math"), ("rcp.approx.ftz.f64", "fast_math"), ("add.ftz.f32", "fast_math"),
    ("fma.rn.ftz.f32", "fast_math"), ("fma.rn.bf16", "lower_precision"), ("mul.bf16x2", "lower_precision"),
    ("max.f16", "lower_precision"), ("ex2.approx.ftz.bf16", "lower_precision"), ("cvt.rna.tf32.f32", "lower_precision"),
    ("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16", "lower_precision"),
    ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "lower_precision"),
    ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", None),
    ("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", None),
    ("cvt.rn.bf16.f32", None), ("cvt.f32.bf16", None), ("cvt.rn.bf16x2.f32", None), ("ld.global.b16", None),
    ("st.global.v4.b32", None), ("div.rn.f32", None), ("rcp.rn.f32", None), ("sqrt.rn.f32", None),
    ("fma.rn.f32", None), ("neg.bf16", None), ("mov.b16", None),
    # 8-bit operands, fp8 rounding, sums kept in half precision in memory (the judge audit's gap 6)
    ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "lower_precision"),
    ("wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e4m3", "lower_precision"),
    ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", "lower_precision"),
    ("cvt.rn.satfinite.e4m3x2.f32", "lower_precision"), ("cvt.rn.satfinite.e2m1x2.f32", "lower_precision"),
    ("cvt.rn.f16x2.e4m3x2", None), ("cvt.rn.f32.u8", None),  # widening reads are exact
    ("red.global.add.noftz.bf16x2", "lower_precision"), ("atom.global.add.noftz.f16", "lower_precision"),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16", "lower_precision"),
    ("red.global.add.f32", None), ("atom.global.add.u32", None), ("cvt.s8.s32", None), ("cvt.u32.u8", None),
    ("atom.global.cas.b16", None),
    # session 38's third red team: sums across devices' memory, typeless tensor sums, 8-bit SIMD;
    # and what the judge sorts into no action, refused beyond the approved build's count
    ("multimem.red.relaxed.gpu.global.add.bf16x2", "lower_precision"),
    ("multimem.ld_reduce.relaxed.gpu.global.add.acc::f32.bf16x2", "lower_precision"),
    ("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group", "lower_precision"),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32", None),
    ("vabsdiff4.u32.u32.u32", "lower_precision"), ("vadd2.u32.u32.u32.sat", "lower_precision"),
    ("sad.u32", None), ("sad.u16", "lower_precision"), ("vmax.s32.s32.s32", "unjudged"),
    ("cvt.rn.satfinite.e2m1x4.f32", "lower_precision"),
    ("multimem.st.relaxed.gpu.global.f32", "unjudged"), ("tensormap.replace.tile.global_address.b1024.b64", "unjudged"),
    # session 44's red team: rounding toward zero or an infinity (`__fmul_rz`, `__fadd_rd`,
    # `__float2bfloat16_rz`) and a float quantised to 8-bit integers passed as allowed
    ("mul.rz.f32", "fast_math"), ("add.rm.f32", "fast_math"), ("rcp.rz.f32", "fast_math"), ("fma.rp.f64", "fast_math"),
    ("cvt.rz.f32.f64", "fast_math"), ("cvt.rz.bf16.f32", "lower_precision"), ("cvt.rz.bf16x2.f32", "lower_precision"),
    ("cvt.rs.f16x2.f32", "lower_precision"), ("cvt.rni.sat.s8.f32", "lower_precision"),
    ("cvt.rzi.s8.f32", "lower_precision"),
    ("cvt.rzi.s32.f32", None), ("cvt.rmi.f32.f32", None), ("cvt.rn.f32.f64", None),  # integer rounding; nearest
])
def test_classify(op, action):
    assert ptx.classify(op) == action


def test_asm_strings_split_into_instructions():
    code = 'asm volatile("mov.f32 %0, %1;\\n\\tex2.approx.f32 %0, %0;" : "=f"(r) : "f"(a));\n' \
           '__asm__ __volatile__ ( "{ .reg .pred p; setp.ne.b32 p, %0, 0; @p add.ftz.f32 %1, %1, %1; }" );'
    texts = forbid.asm_strings(code)
    assert [line for line, _ in texts] == [1, 2]
    ops = [ptx.opcode(s) for _, t in texts for s in ptx.statements(t)]
    assert ops == ["mov.f32", "ex2.approx.f32", "setp.ne.b32", "add.ftz.f32"]


def test_the_library_waiver_holds_what_accurate_functions_compile_to(small):
    waived = small.backend.library_opcodes((), small.spec.hw)
    assert {"ex2.approx.f32", "ex2.approx.ftz.f32", "rsqrt.approx.f32"} <= waived
    assert not any(op.startswith(("sin.approx", "cos.approx", "tanh.approx", "sqrt.approx", "div.full")) for op in waived)
    assert all(ptx.classify(op) == "fast_math" for op in waived)


@pytest.mark.parametrize("cond", [
    "#ifdef __STDC__",  # NVRTC defines it; the rules' preprocessor did not (session 44's red team)
    "#include <cuda_runtime.h>\n#ifdef CUDART_VERSION",  # a toolchain header's macro, the header unread
    "#ifdef __PCPP__",  # the rules' preprocessor defines it; NVRTC does not (the second red team)
    "#if -0x8000000000000000 < 0",  # an unsigned literal, read as signed
    "#if '\\377' < 0",  # a char constant's sign
    "#if __CUDA_ARCH_HAS_FEATURE__(SM100_ALL)",  # a function-like macro told the wrong way
    "#if true",  # a keyword in C++, an unknown 0 to a C preprocessor
])
def test_a_branch_the_compiler_takes_and_the_rules_skip_is_refused(cond):
    """Every conditional directive gets a mark, and the branches the rules' preprocessor keeps
    must be those NVRTC compiles: a variant whose condition the two read differently (so the
    rules read a branch the compiler skips, or skip one it compiles) is refused; the conditions
    of honest templates (their own flags, __CUDA_ARCH__, include guards, splices) read alike."""
    from runner.build.backends import cuda

    body = "__device__ float f(float a, float b) { return __fdividef(a, b); }"
    k = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n'
    for taken in (f"{cond}\n{body}\n#endif\n", f"{cond}\n#else\n{body}\n#endif\n"):
        text, why = cuda._expand("#include <cuda_bf16.h>\n" + taken + k, (), "sm_90")
        assert text is None and "different branches" in why, (cond, why)
    honest = ("#define LEAN 0\n#if LEAN\n__device__ int q;\n#else\n__device__ int r;\n#endif\n"
              "#if PIPE_OWN_FLAG\n__device__ int s;\n#endif\n#ifdef __CUDA_ARCH__\n__device__ int t;\n#endif\n"
              "#ifndef GUARD_H\n#define GUARD_H\n#endif\n#if 0 \\\n  || 1\n__device__ int u;\n#endif\n")
    text, why = cuda._expand("#include <cuda_bf16.h>\n" + honest + k, (), "sm_90")
    assert not why and "int r;" in text and "int q;" not in text and "int u;" in text, why
    text, why = cuda._expand('#include "no/such/header.h"\n#if 1\nint a;\n#endif\n' + k, (), "sm_90")
    assert text is None and "could not be told" in why  # the compiler stopped first: fails closed


def test_marks_a_source_writes_itself_do_not_count(monkeypatch):
    """The branch marks carry a tag drawn for each check: a source that writes the marks of the
    branches it hides into the branches the other side takes cannot make the sets agree, as it
    could if it knew the tag."""
    from runner.build.backends import cuda

    src = ("#include <cuda_bf16.h>\n#if -0x8000000000000000 < 0\n"  # (pcpp: true; NVRTC: false)
           '#pragma message("pipe-branch:feedface:4")\n#else\n#pragma message("pipe-branch:feedface:2")\n'
           "__device__ float f(float a, float b) { return __fdividef(a, b); }\n#endif\n"
           'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n')
    text, why = cuda._expand(src, (), "sm_90")
    assert text is None and "different branches" in why, why
    monkeypatch.setattr(cuda.secrets, "token_hex", lambda n=8: "feedface")  # the tag known: the forgery works
    text, why = cuda._expand(src, (), "sm_90")
    assert not why and "__fdividef" not in text


@pytest.mark.parametrize("spelling", [
    '#\finclude "{h}"',  # a form feed: whitespace to the compiler, not to the rules or pcpp
    '#\vinclude "{h}"',
    '#/*\n*/include "{h}"',  # one directive to the compiler, none to a line-based reading
    "#ifdef PIPE_FLAG /*\n*/\n#endif",  # the mark after the directive's line would sit in the comment
])
def test_a_layout_the_rules_and_the_compiler_read_apart_is_refused(small, spelling, tmp_path):
    """Session 44's third red team included a header past the include rule and hid a branch from
    the marks with each spelling; honest layouts (a comment on its own lines, one closed on its
    directive's line, CRLF line ends) build."""
    (tmp_path / "fast.cuh").write_text("// a header the variant brings\n")
    b = build(small, APPROVED.replace("#define L2E", spelling.replace("{h}", str(tmp_path / "fast.cuh"))
                                      + "\n#define L2E"))
    forbidden_as(b, "preprocessor")
    for ok in ("/* a note\n   over lines */", "#if 1 /* closed here */\n#endif"):
        assert build(small, APPROVED.replace("#define L2E", ok + "\n#define L2E")).status == "ok", ok
    assert build(small, APPROVED.replace("\n", "\r\n")).status == "ok"


@pytest.mark.parametrize("opener", [
    'static_assert(sizeof(R""(/*)"") == 3, "");',  # a quote in a raw string's delimiter
    'static_assert(sizeof(R"[()<:" /* )[") == 9, "");',  # a digraph inside a raw string
    "static_assert(sizeof(R\"10()1'0\" /* )10\") == 10, \"\");",  # a digit separator inside one
])
def test_a_name_hidden_in_what_a_lexer_takes_for_a_comment_is_found(small, opener):
    """Session 44's fourth red team: a literal the rules' lexer and pcpp end elsewhere than C++17
    does opens a "comment" to both that the compiler compiles, and `__fdividef` in it reached the
    waived `div.approx.f32`. A variant's text is searched for the names whole, comments kept."""
    text = APPROVED.replace(EX_LINE, f"  {opener}\n  return __fdividef(1.f, __expf(m - v));\n  // */")
    forbidden_as(build(small, text), "fast_math", "__fdividef", "comments included")


def test_a_variant_includes_no_file_outside_the_toolchain():
    approved = '#include <cuda_bf16.h>\n#include "mine.cuh"\n'
    for inc in ('#include "/tmp/fast.cuh"', "#include </tmp/fast.cuh>", "#include <cuda/../../fast.cuh>",
                '#define H "/tmp/fast.cuh"\n#include H', '#include "other.cuh"'):
        assert "a variant includes only" in forbid.foreign_include(approved + inc + "\n", approved), inc
    for ok in ("#include <cuda/pipeline>", '#include "mine.cuh"', '// #include "/tmp/fast.cuh"'):
        assert forbid.foreign_include(approved + ok + "\n", approved) is None, ok


def test_the_preprocessor_takes_the_branches_of_the_options_architecture():
    """A spec compiling for sm_90a (`--arch=sm_90a` in kernel.options, as the MoE specs do for
    wgmma) gets NVRTC's sm_90a feature macros; the source rules run on the branches they open,
    so code hidden behind `#ifdef __CUDA_ARCH_FEAT_SM90_ALL` is seen (it was not: the macros
    came from the profile's sm_90)."""
    from runner.build.backends import cuda

    src = ("#ifdef __CUDA_ARCH_FEAT_SM90_ALL\n"
           "__device__ float hidden(float x) { return __expf(x); }\n"
           "#endif\n"
           "extern \"C\" __global__ void k(float* y) { y[0] = 1.0f; }\n")
    text, why = cuda._expand(src, ("--arch=sm_90a",), "sm_90")
    assert not why and "__expf" in text
    text, why = cuda._expand(src, (), "sm_90")
    assert not why and "__expf" not in text
    assert cuda.option_arch(("-DX=1", "--arch=sm_90a"), "sm_90") == "sm_90a"
    assert cuda.option_arch(("-DX=1",), "sm_90") == "sm_90"


# ---------------------------------------------------------------- state kept between calls
KERNEL_LINE = 'extern "C" __global__ void soft('


@pytest.mark.parametrize("decl, use, needle", [
    # a call counter: lazy after the judge's first calls
    ("__device__ unsigned calls;", "  if (threadIdx.x == 0) atomicAdd(&calls, 1u);", "calls"),
    # a memo of last call's row sums, static (internal linkage: the name is mangled)
    ("static __device__ float memo[4096];", "  memo[blockIdx.x % 4096] = xr[0] == xr[0] ? 0.f : 1.f;", "memo"),
    # writable storage behind a string literal
    ("", '  if (threadIdx.x == 0) { char* p = (char*)"pipe-state-pipe-state"; p[blockIdx.x % 16] = 1; }', "$str"),
    # a counter declared inside an inline asm string's braces (session 30's red team; it kept
    # counting across launches on the H200)
    ("", '  unsigned c; asm volatile("{ .global .align 4 .u32 pipe_calls2; atom.global.add.u32 %0, [pipe_calls2], 1; }"'
         ' : "=r"(c)); if (c > 1000000000u) m = 1.f;', "pipe_calls2"),
    # __constant__ data written through the generic address cvta.const gives (it kept counting too)
    ("__constant__ unsigned pipe_cst[4];", '  unsigned* p; asm("cvta.const.u64 %0, pipe_cst;" : "=l"(p)); '
     'if (threadIdx.x == 0) atomicAdd(p, 1u); if (p[0] == 12345u) m = 1.f;', "cvta.const"),
])
def test_a_variant_declaring_device_state_is_refused_whatever_the_spec_names(tmp_path, decl, use, needle):
    """Module-scope device data outlives a call: a variant may not declare any the approved
    template's build lacks, even where the spec names no forbidden action about it."""
    ev = approved(tmp_path, ["fast_math"])  # device_state is not named: it is refused all the same
    text = APPROVED.replace(KERNEL_LINE, decl + "\n" + KERNEL_LINE).replace(
        "  float m = 0.f, s = 0.f;\n", "  float m = 0.f, s = 0.f;\n" + use + "\n")
    assert text != APPROVED
    b = build(ev, text)
    forbidden_as(b, "device_state", needle, "approved template's build does not")


def test_device_state_the_approved_template_declares_stays_allowed(tmp_path):
    """The approved template's own __device__ data is the user's: its variants may keep it."""
    mine = APPROVED.replace(KERNEL_LINE, "__device__ unsigned launches;\n" + KERNEL_LINE).replace(
        "  float m = 0.f, s = 0.f;\n", "  float m = 0.f, s = 0.f;\n  if (threadIdx.x == 0) atomicAdd(&launches, 1u);\n")
    (tmp_path / "soft.cu.j2").write_text(mine)
    (tmp_path / "spec.yaml").write_text(spec(tmp_path / "soft.cu.j2", NAMED))
    ev = Builder(load_spec(tmp_path / "spec.yaml"))
    b = build(ev, None)
    assert b.status == "ok" and b.ptx["data"] == {"launches": 1}, (b.status, b.reason)
    b = build(ev, mine.replace("#pragma unroll {{ UNROLL }}", "#pragma unroll 8"))
    assert b.status == "ok", b.reason


def _state_refused_unless_approved(text: str, key: str, needle: str) -> None:
    """The PTX `text` holds one `key` of data; refused as device_state (its reason naming
    `needle`) against a build without it, allowed against one with as much."""
    a = ptx.analyze(text)
    assert a["data"] == {key: 1}
    action, why = ptx.compare(a, {"data": {}}, [])
    assert action == "device_state" and needle in why
    assert ptx.compare(a, {"data": {key: 1}}, []) is None


def test_the_reserved_shared_memory_counts_as_device_state():
    """A block's reserved shared memory (sm_90: %reserved_smem_offset_begin ..) keeps what a
    launch leaves there (session 30, H200; the scrub now writes it too): a variant that reaches it
    where the approved build does not is refused as device_state, whatever the spec names; the
    same use in the approved build stays allowed."""
    text = (".visible .entry k(\n.param .u64 p\n)\n{\n\t.reg .b32 %r<3>;\n"
            "\t// begin inline asm\n\tmov.u32 %r1, %reserved_smem_offset_begin;\n\t// end inline asm\n"
            "\tld.shared.u32 %r2, [%r1];\n\tret;\n}\n")
    _state_refused_unless_approved(text, "%reserved_smem_offset_begin", "reserved")
    assert ptx.analyze(text.replace("%reserved_smem_offset_begin", "%smid"))["data"] == {}


def test_module_scope_global_data_in_the_ptx():
    text = ("\n.global .align 4 .u32 calls;\n.visible .global .align 8 .b8 memo[1024];\n"
            ".global .attribute(.managed) .align 4 .u32 man;\n.const .align 4 .b8 cst[16];\n"
            ".shared .align 4 .b8 sh[64];\n.visible .entry k(\n.param .u64 p\n)\n{\n"
            "\tld.global.u32 %r1, [calls];\n\tst.global.u32 [calls], %r1;\n\tret;\n}\n")
    a = ptx.analyze(text)
    assert a["data"] == {"calls": 1, "man": 1, "memo": 1}  # not the constant, not the shared array
    assert ptx.compare(a, {"data": {"calls": 1, "man": 1, "memo": 1}}, []) is None
    assert ptx.compare(a, {"data": {"calls": 1}}, [])[0] == "device_state"


def test_a_global_declared_inside_a_function_or_asm_braces_is_device_state():
    """`{ .global .u32 n; atom.global.add.u32 %0, [n], 1; }` in an inline asm string declares a
    variable that lives as long as the module: a call counter kept there survived from launch to
    launch on the H200 (session 30, datasets/benchmarks/judge-h200/s30-call3-state-channels.txt).
    Where it is declared does not matter: any .global the approved build lacks is device_state."""
    text = (".visible .entry k(\n.param .u64 p\n)\n{\n\t.reg .b32 %r<3>;\n"
            "\t// begin inline asm\n\t{ .global .align 4 .u32 pipe_calls2; atom.global.add.u32 %r1, [pipe_calls2], 1; }\n"
            "\t// end inline asm\n\tld.global.u32 %r2, [%rd1];\n\tret;\n}\n")
    a = ptx.analyze(text)
    # ld.global / atom.global are not declarations; a directive inside inline asm other than
    # `.reg` is also counted as unreadable, and the declaration is named first
    assert a["data"] == {"pipe_calls2": 1, "%unreadable statements": 1}
    action, why = ptx.compare(a, {"data": {}}, [])
    assert action == "device_state" and "pipe_calls2" in why
    # a declaration in the compiler's own code, in a function body, too
    assert ptx.analyze(text.replace("// begin inline asm", "").replace("// end inline asm", ""))["data"] == {
        "pipe_calls2": 1}


def test_constant_memory_reached_through_a_generic_address_is_device_state():
    """`cvta.const` gives a generic address of __constant__ data, and a store through it changes
    that data for every later launch (session 30, H200: a counter so kept read 0, 1, 2, 3). More
    cvta.const than the approved build has is device_state; as many is not."""
    text = (".const .align 4 .b8 cst[16];\n.visible .entry k(\n.param .u64 p\n)\n{\n"
            "\t// begin inline asm\n\tcvta.const.u64 %rd1, cst;\n\t// end inline asm\n"
            "\tatom.global.add.u32 %r1, [%rd1], 1;\n\tret;\n}\n")
    _state_refused_unless_approved(text, "%cvta.const", "cvta.const")


def test_a_kernel_parameter_reached_through_a_generic_address_is_device_state(tmp_path):
    """A `__grid_constant__` parameter's address is a generic address of the launch's parameter
    memory (`cvta.param`); a replayed CUDA graph keeps that memory from call to call, and a mark
    stored there outlived every call on the H200 (session 36's red team:
    `datasets/judge-redteam/s36/v_param.cu.j2`, ok at the honest time where the spin it skips
    costs 20x). A variant with more cvta.param than the approved build is device_state; a
    parameter read by value is not."""
    text = (".visible .entry k(\n.param .align 8 .b8 k_param_0[8]\n)\n{\n\tmov.b64 %rd1, k_param_0;\n"
            "\tcvta.param.u64 %rd2, %rd1;\n\tst.volatile.u64 [%rd2], %rd3;\n\tret;\n}\n")
    _state_refused_unless_approved(text, "%cvta.param", "cvta.param")
    ev = approved(tmp_path, ["fast_math"])  # device_state is not named: refused all the same
    grid_constant = APPROVED.replace("const __nv_bfloat16* x,", "const __grid_constant__ unsigned long long xa,")
    by_value = grid_constant.replace("  const __nv_bfloat16* xr", "  const __nv_bfloat16* x = (const __nv_bfloat16*)xa;\n"
                                     "  const __nv_bfloat16* xr")
    assert by_value != grid_constant != APPROVED
    assert build(ev, by_value).status == "ok"
    stash = by_value.replace("  float m = 0.f, s = 0.f;\n", "  float m = 0.f, s = 0.f;\n"
                             "  volatile unsigned long long* pa = (volatile unsigned long long*)"
                             "const_cast<unsigned long long*>(&xa);\n"
                             "  if (threadIdx.x == 0 && (*pa >> 48) == 0x5eedull) m = 1.f;\n"
                             "  if (threadIdx.x == 0) *pa = *pa | (0x5eedull << 48);\n")
    assert stash != by_value
    forbidden_as(build(ev, stash), "device_state", "cvta.param", "parameter memory")


@pytest.mark.parametrize("decl", [
    "{ .global\n.align 4 .u32 pipe_st; atom.global.add.u32 %r1, [pipe_st], 1; }",  # split over lines
    "{ .global.u32 pipe_st; atom.global.add.u32 %r1, [pipe_st], 1; }",  # no space before the type
])
def test_a_global_declaration_is_found_however_it_is_spelled(decl):
    """Session 30's second red team kept counters past a rule that read one line at a time and
    wanted a space after `.global` (both counted 0, 32, 64, 96 on the H200)."""
    text = (".visible .entry k(\n.param .u64 p\n)\n{\n\t.reg .b32 %r<3>;\n\t// begin inline asm\n\t" + decl +
            "\n\t// end inline asm\n\tcvta.to.global.u64 %rd2, %rd1;\n\tst.global.u32 [%rd2], %r1;\n\tret;\n}\n")
    a = ptx.analyze(text)
    assert a["data"] == {"pipe_st": 1, "%unreadable statements": 1}, a["data"]
    assert ptx.compare(a, {"data": {}}, [])[0] == "device_state"


# ---------------------------------------------------------------- PTX read as ptxas reads it
# (session 38's red team: whitespace, a newline between an opcode and its modifiers, a space in a
# guard, a declaration split over lines; each assembled to the same cubin as the plain spelling)

@pytest.mark.parametrize("spelled, op", [
    ("ex2 .approx.ftz.f32 %f1, %f2;", "ex2.approx.ftz.f32"),
    ("ex2\n\t.approx\n\t.ftz.f32 %f1, %f2;", "ex2.approx.ftz.f32"),
    ("@ p ex2.approx.ftz.f32 %f1, %f2;", "ex2.approx.ftz.f32"),
    ("@ ! %p1 rcp .approx.ftz.f32 %f1, %f2;", "rcp.approx.ftz.f32"),
    ("mul .rn.bf16x2 %r1, %r2, %r3;", "mul.rn.bf16x2"),
    ("mma .sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, "
     "{%f5,%f6,%f7,%f8};", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    ("dp4a.s32.s32 %r1, %r2, %r3, %r4;", "dp4a.s32.s32"),
    ("$L1: ex2 . approx.f32 %f1, %f2;", "ex2.approx.f32"),
])
def test_an_instruction_is_read_however_ptxas_lets_it_be_spaced(spelled, op):
    a = ptx.analyze("// begin inline asm\n" + spelled + "\n// end inline asm\n")
    assert a["asm"] == {op: 1}, a
    assert ptx.compare(a, None, ["fast_math", "lower_precision"]) is not None


def test_a_comment_inside_a_line_comment_hides_no_instruction():
    # ptxas reads `// /*` as a line comment: the instruction on the next line is assembled
    a = ptx.analyze("mov.f32 %f1, %f2; // /*\nex2.approx.ftz.f32 %f1, %f1;\n// */\n")
    assert a["code"] == {"ex2.approx.ftz.f32": 1}, a


def test_constant_memory_written_through_a_spaced_cvta_is_device_state():
    a = ptx.analyze("// begin inline asm\ncvta .const.u64 %rd1, c;\n// end inline asm\n")
    assert ptx.compare(a, {"code": {}, "asm": {}, "extern": {}, "data": {}}, [])[0] == "device_state"


def test_a_function_declared_over_lines_or_only_called_is_external():
    a = ptx.analyze("{\n.extern\n.func (.param .b64 r)\nmalloc\n(\n.param .b64 p\n)\n;\n"
                    "call.uni (r), malloc, (p);\ncall.uni (r), mystery, (p);\n}\n"
                    ".visible .func (.param .b32 r) mine(.param .b32 a)\n{\nret;\n}\ncall.uni (r), mine, (a);\n")
    assert a["extern"] == {"malloc": 1, "mystery": 1}, a
    assert ptx.compare(a, None, ["library_calls"])[0] == "library_calls"


SPACED_EX2 = APPROVED.replace(
    EX_LINE, '  float r; asm("ex2 ." "approx.ftz.f32 %0, %1;" : "=f"(r) : "f"((v - m) * L2E)); return r;')
NEWLINE_RCP = APPROVED.replace(
    "  const float inv = 1.f / s;", '  float inv; asm("rcp\\n\\t.approx.ftz.f32 %0, %1;" : "=f"(inv) : "f"(s));')
DP4A_SUM = APPROVED.replace(
    "  s = block_sum(s);", "  s = block_sum((float)__dp4a((int)(s * 127.f), 0x01010101, 0) / 127.f);")


@pytest.mark.parametrize("text, action, needle", [
    (SPACED_EX2, "fast_math", "ex2 .approx.ftz.f32"), (NEWLINE_RCP, "fast_math", "rcp"),
    (DP4A_SUM, "lower_precision", "dp4a"),
])
def test_spacing_and_int8_dot_products_are_refused_through_the_compiler(small, text, action, needle):
    forbidden_as(build(small, text), action, needle)


def test_a_cached_build_is_judged_again_by_the_rules_in_force(small, monkeypatch):
    """The cache keeps the PTX, not an older reader's counts: a fixed rule reaches a build made
    before the fix (session 38: three red-team variants passed on counts cached before)."""
    src = small.render_all({"UNROLL": 2})[0]
    first = small.backend.compile(src, "soft", (), small.spec.hw)
    assert first.ok
    marker = {"code": {"ex2.approx.ftz.f32": 99}, "asm": {}, "extern": {}, "data": {}}
    monkeypatch.setattr(ptx, "analyze", lambda text: marker if "soft" in text else {})
    again = small.backend.compile(src, "soft", (), small.spec.hw)
    assert again.cached and again.ptx == marker


# ---------------------------------------------------------------- what the reader cannot read
# (session 38's second red team: a `.loc` line, a `%` label, `::` in a modifier, `.extern.func`
# and `call.uni(` with no space, fake inline-asm marks, a dot escaped as `\x2e`; each hid a
# forbidden instruction that ptxas assembled)

def _asm(body: str) -> str:
    return ".visible .entry k(\n.param .u64 p\n)\n{\n\t.reg .b32 %r<3>;\n\t// begin inline asm\n\t" + body + \
        "\n\t// end inline asm\n\tret;\n}\n"


@pytest.mark.parametrize("body, op", [
    ("red.global.add.noftz.L2::cache_hint.bf16x2 [%rd1], %r1, %rd2;", "red.global.add.noftz.L2::cache_hint.bf16x2"),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16 [%rd1], [%r1], 64;",
     "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16"),
    (".loc 1 1 1\n\tex2.approx.ftz.f32 %f1, %f2;", "ex2.approx.ftz.f32"),
    ("%pipe: mul.rn.bf16x2 %r1, %r2, %r3;", "mul.rn.bf16x2"),
    ("$a: %b: rcp.approx.ftz.f32 %f1, %f2;", "rcp.approx.ftz.f32"),
])
def test_a_forbidden_instruction_behind_a_line_directive_a_label_or_a_scope_is_read(body, op):
    a = ptx.analyze(_asm(body))
    assert a["asm"] == {op: 1}, a
    assert ptx.compare(a, None, ["fast_math", "lower_precision"]) is not None


def test_a_call_and_an_extern_with_no_space_are_read():
    a = ptx.analyze(_asm("{ .reg .b64 r0; call.uni(r0), malloc, (r0); }") + ".extern.func (.param .b64 r) free(.param .b64 p);\n")
    assert a["extern"] == {"free": 1, "malloc": 1}, a
    # a call through a function pointer names a register, no function: nothing external
    assert ptx.analyze(_asm("call.uni (r0), %rd11, (r0), proto;"))["extern"] == {}
    assert ptx.compare(a, None, ["library_calls"])[0] == "library_calls"


@pytest.mark.parametrize("body", [
    "pipe.approx.f32 %f1, %f2;",                    # an opcode PTX does not have
    "ex2.approx.ftz.f32%f1, %f2;",                  # more of the word than the reader took
    ".pragma \"nounroll\";",                         # a directive inline asm has no use for
    ".section .pipe { .b8 1 }",
])
def test_what_the_reader_cannot_read_is_counted_and_refused_beyond_the_approved_build(body):
    a = ptx.analyze(_asm(body).replace("\tret;", "\tex2.approx.ftz.f32 %f3, %f3;\n\tret;"))
    n = a["data"].get("%unreadable statements", 0)
    assert n >= 1, a
    assert a["code"] == {"ex2.approx.ftz.f32": 1}, a  # the compiler's code after it is read, not swallowed
    action, why = ptx.compare(a, {"code": {}, "asm": {}, "extern": {}, "data": {}}, [])
    assert action == "unreadable_ptx" and f"{n} statements" in why
    assert ptx.compare(a, {"code": {}, "asm": {}, "extern": {}, "data": {"%unreadable statements": n}}, []) is None


def test_inline_asm_that_writes_the_compilers_marks_is_refused_and_escapes_are_read():
    fake = '  asm volatile("mov.f32 %0, %0;\\n\\t// end inline asm\\n\\tmov.f32 %0, %0;\\n\\t// begin inline asm" : "+f"(v));'
    v = forbid.check_source(fake, (), "cuda", ["fast_math"], ())
    assert v is not None and v.rule == "unreadable_asm", v
    dot = '  asm volatile("ex2\\x2e" "approx.ftz.f32 %0, %0;" : "+f"(v));'
    v = forbid.check_source(dot, (), "cuda", ["fast_math"], ())
    assert v is not None and v.rule == "fast_math" and "ex2.approx.ftz.f32" in v.reason, v
    assert forbid._unescape(r"\056\u002e\x2e") == "..."


@pytest.mark.parametrize("name", ["decode-attention-h200.yaml", "moe-coarse-tma-h200.yaml"])
def test_the_reader_reads_every_statement_of_the_attention_and_tensor_core_templates(name):
    b = _at_start(name)[3]
    assert "%unreadable statements" not in b.ptx["data"], b.ptx


def test_a_generic_address_in_an_initializer_is_device_state():
    """Session 39's red team: `__constant__ unsigned* at = calls;` is `.const .u64 at =
    generic(calls);`: the loader writes constant memory's generic address, and a store through it
    kept a call counter with no `cvta.const` in the PTX."""
    text = (".const .align 4 .b8 pipe_calls[8];\n"
            ".const .align 8 .u64 pipe_at = generic(pipe_calls);\n"
            ".visible .entry k() { ld.const.u64 %rd1, [pipe_at]; red.global.add.u32 [%rd1], 1; ret; }\n")
    a = ptx.analyze(text)
    action, why = ptx.compare(a, {"code": {}, "asm": {}, "extern": {}, "data": {}}, [])
    assert action == "device_state" and "generic(" in why, (action, why)
    assert ptx.compare(a, a, []) is None  # the approved template's own initializers stay allowed


def test_register_declarations_in_inline_asm_are_read_however_spaced():
    """cuda_bf16.h's __bfloat162char_rz writes `.reg.b8` with no space: a register, nothing else
    (session 39's red team: refused as unreadable)."""
    text = ("// begin inline asm\n{ .reg.b8 b; cvt.rzi.s8.bf16 b, %rs1; cvt.s32.s8 %r1, b; }\n"
            "// end inline asm\n")
    assert "%unreadable statements" not in ptx.analyze(text)["data"]


def test_a_wmma_fragment_load_is_no_accumulator():
    assert ptx.classify("wmma.load.a.sync.aligned.row.m16n16k16.global.bf16") is None
    assert ptx.classify("wmma.mma.sync.aligned.row.col.m16n16k16.f16.f16") == "lower_precision"
    assert ptx.classify("wmma.mma.sync.aligned.row.col.m16n16k16.f32.bf16.bf16.f32") is None


def test_an_instruction_sorted_into_no_action_is_refused_beyond_the_approved_builds_count():
    a = {"code": {}, "asm": {"tensormap.replace.tile.global_address.b1024.b64": 2}, "extern": {}, "data": {}}
    action, why = ptx.compare(a, {"code": {}, "asm": {"tensormap.replace.tile.global_address.b1024.b64": 1},
                                  "extern": {}, "data": {}}, [])
    assert action == "unjudged_ptx" and "2 in the candidate's PTX vs 1" in why
    assert ptx.compare(a, {"code": {}, "asm": dict(a["asm"]), "extern": {}, "data": {}}, []) is None


def test_pipe_render_judges_a_variant_as_its_trial_is(tmp_path, capsys):
    """`pipe render SPEC --variant FILE --compile` holds the variant to the approved template's
    build, as a variant's trial is (session 44's red team judged copies of a spec, whose template
    was then its own baseline, and every variant passed that way)."""
    from runner import cli

    approved(tmp_path, NAMED)
    spec = str(tmp_path / "spec.yaml")
    honest = tmp_path / "honest.cu.j2"
    honest.write_text(APPROVED.replace(EX_LINE, "  return expf(v - m);"))
    assert cli.main(["render", spec, "--variant", str(honest), "--compile", "--set", "UNROLL=1"]) == 0
    assert capsys.readouterr().out.startswith("compiles: the variant of soft.cu.j2")
    rz = tmp_path / "rz.cu.j2"
    rz.write_text(APPROVED.replace(STORE_LINE, '    float t; asm("mul.rz.f32 %0, %1, %2;" : "=f"(t) : "f"(e), "f"(inv));\n'
                                               "    yr[c] = __float2bfloat16(t);"))
    assert cli.main(["render", spec, "--variant", str(rz), "--compile", "--set", "UNROLL=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("forbidden: the variant of soft.cu.j2") and "mul.rz.f32" in err, err
    assert cli.main(["render", spec, "--compile", "--set", "UNROLL=1"]) == 0  # the spec's own template builds
    assert cli.main(["render", spec, "--variant", str(tmp_path / "none.cu.j2"), "--compile"]) == 2
    assert "--variant" in capsys.readouterr().err
