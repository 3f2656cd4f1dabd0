"""Write the red-team variants of session 39 (CUDA build-time judge after 231f33f, which added the
SASS reader) from the shipped templates, by text edits, each with its canonical spelling (the same
action in the form the judge reads: it must be refused). `y*` are findings (accepted, yet doing a
forbidden thing); `f*` are false positives (honest variants the judge refuses; their "canonical" is
the same variant without the honest construct, which must be accepted).
Run from /work/main: python datasets/judge-redteam/s39-cuda/make_variants.py
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("s38_make_variants", HERE.parent / "s38-cuda" / "make_variants.py")
s38 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s38)
sub, template = s38.sub, s38.template

SM = "softmax-h200.yaml"
DA = "decode-attention-h200.yaml"

# ---------------------------------------------------------------- Y1: constant memory written through an initializer
# A `__constant__` pointer initialised with the address of a `__constant__` array compiles to
# `.const .u64 pipe_at = generic(pipe_calls);`: the loader writes the array's generic address into
# the constant bank, and the kernel loads it (`ld.const.u64`) and stores through it. No `cvta.const`
# (the counted spelling), no `.global` declaration (the other counted one): ptx.analyze's "data"
# part is empty. Block 0's thread 0 counts the calls; every thread reads the count of the calls
# before this one (kept in constant memory across launches, as session 30 showed on the H200 for
# the cvta.const spelling). Here it only scales `inv` on the 2^32-1th call: the outputs are the
# template's, the state is in the build.
SM_INV = "  const float inv = 1.f / s;\n"
SM_INV_STATE = "  const float inv = 1.f / s * (calls_so_far() == 0xffffffffu ? 2.f : 1.f);\n"
SM_EX = "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }"
CONST_INIT = r'''__constant__ unsigned pipe_calls[2];
// the generic address of pipe_calls, written into the constant bank by the loader (no cvta.const)
__constant__ unsigned* pipe_at = pipe_calls;
// the calls before this one, kept in constant memory across launches; block 0 counts this one
__device__ __forceinline__ unsigned calls_so_far() {
  unsigned* p = pipe_at;
  const unsigned n = *reinterpret_cast<volatile unsigned*>(p);
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(p, 1u);
  return n;
}
'''
# canonical: the generic address taken in the kernel with `cvta.const.u64` (session 38's v4 without its
# space: counted against the approved build's 0, refused as device_state). (`const_cast<unsigned*>
# (pipe_calls)` is no canonical: NVVM drops a store into __constant__ data it can see.)
CONST_CANON = CONST_INIT.replace("  unsigned* p = pipe_at;\n",
                                 "  unsigned long long a;\n  asm(\"cvta.const.u64 %0, pipe_calls;\" : \"=l\"(a));\n"
                                 "  unsigned* p = reinterpret_cast<unsigned*>(a);\n")


def softmax_const(helper: str) -> str:
    return sub(sub(template(SM), SM_EX, helper + SM_EX, 1), SM_INV, SM_INV_STATE)


# ---------------------------------------------------------------- Y2: decode attention's P rounded to bf16 (narrower than TF32)
# The template feeds the fp32 probabilities P to the bf16 mma as hi + lo (16 bits kept: "no
# narrower math than fp32", its header). This variant keeps only the top 16 bits of each fp32 P
# (one prmt: bf16 by truncation, no conversion instruction at all) and drops the lo part and the
# lo half's add: P V is a bf16 x bf16 product of P cut to 8 significant bits, narrower than TF32
# (11 bits), which the judge refuses by name (`.tf32`, `cvt.rna.tf32.f32`, `mma...tf32`).
# With PVM=2 it halves the P V mmas; with PVM=1 (the start) it drops the split's cvt, sub, cvt
# and the x2/x3 adds.
DA_SPLIT = """  const __nv_bfloat162 h = __floats2bfloat162_rn(p0, p1);
  hi = *reinterpret_cast<const unsigned*>(&h);
  const float2 hf = __bfloat1622float2(h);
  lo = pack_bf16(p0 - hf.x, p1 - hf.y);
"""
DA_SPLIT_TRUNC = """  hi = __byte_perm(__float_as_uint(p0), __float_as_uint(p1), 0x7632);  // the top halves: bf16, truncated
  lo = 0u;
"""
DA_HILO_0 = "mma_hilo(acc[2 * jj][0], acc[2 * jj][1], ph0, pl0, ph2, pl2, r0, r1);"
DA_HILO_1 = "mma_hilo(acc[2 * jj + 1][0], acc[2 * jj + 1][1], ph0, pl0, ph2, pl2, r2, r3);"
DA_TOP_0 = "mma_top(acc[2 * jj][0], acc[2 * jj][1], ph0, ph2, r0, r1);"
DA_TOP_1 = "mma_top(acc[2 * jj + 1][0], acc[2 * jj + 1][1], ph0, ph2, r2, r3);"
# canonical: P rounded to TF32 first (more precise than the variant's bf16), then split as before
DA_SPLIT_TF32 = """  asm("cvt.rna.tf32.f32 %0, %0;" : "+f"(p0));
  asm("cvt.rna.tf32.f32 %0, %0;" : "+f"(p1));
""" + DA_SPLIT


def decode_trunc() -> str:
    t = sub(template(DA), DA_SPLIT, DA_SPLIT_TRUNC, 1)
    t = sub(t, DA_HILO_0, DA_TOP_0, 1)
    t = sub(t, DA_HILO_1, DA_TOP_1, 1)
    return t


def decode_tf32() -> str:
    return sub(template(DA), DA_SPLIT, DA_SPLIT_TF32, 1)


# ---------------------------------------------------------------- false positives (honest variants refused)
SIG = "softmax_bf16(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, int M) {\n"
INC = "#include <cuda_bf16.h>\n"


def softmax_prologue(code: str, include: str = "") -> str:
    """softmax with `code` at the top of every kernel body (all HOLD branches), `include` after
    cuda_bf16.h."""
    t = sub(template(SM), SIG, SIG + code)
    return sub(t, INC, INC + include, 1) if include else t


# F1: cooperative_groups. The header alone declares the .global `grid_group::thread_scope`, which
# ptx.declared_globals counts as module data the approved build lacks (device_state).
CG_INC = "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n"
SM_WARP = "join<MODE>(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));\n#if TPR > 32"
SM_WARP_CG = ("{ const auto w32 = cg::tiled_partition<32>(cg::this_thread_block());\n"
              "    join<MODE>(m, s, w32.shfl_xor(m, o), w32.shfl_xor(s, o)); }\n#if TPR > 32")


def softmax_cg(use: bool) -> str:
    t = template(SM)
    if use:
        t = sub(sub(t, INC, INC + CG_INC, 1), SM_WARP, SM_WARP_CG, 1)
    return t


# F2, F3: printf and assert: their format and file strings are `.global` data (`$str`), counted
# as module state (device_state), though vprintf and __assertfail themselves are allowed externs.
PRINTF = '  if (M < 0 && threadIdx.x == 0) printf("softmax: M = %d\\n", M);\n'
ASSERT = "  assert(M >= 0);\n"
# F4: a float atomicAdd: PTX `red.global.add.f32` (allowed); its SASS is `REDG.E.ADD.F32.FTZ.RN`
# (f32 atomics flush by definition), which sass.classify counts as fast_math (`REDG.FTZ`).
ATOMIC_F = "  if (M < 0) atomicAdd(reinterpret_cast<float*>(y), 1.f);\n"
# F5: an exact bf16 -> int8 conversion (cuda_bf16.hpp's sm_90 path: `{ .reg.b8 myreg; ...}`): the
# header's `.reg.b8` without a space is a directive the reader does not take (unreadable_ptx).
B2I8 = ("  if (M < 0) reinterpret_cast<signed char*>(y)[threadIdx.x] = __bfloat162char_rz(x[threadIdx.x])"
        " + __bfloat162uchar_rz(x[threadIdx.x + 1]);\n")
# F6: __habs / __hneg on bf16 (exact, allowed as `abs.bf16`/`neg.bf16` in the PTX): ptxas makes them
# `HFMA2.BF16_V2 R0, -RZ.H0_H0, RZ.H0_H0, |R0|.H0_H0`, whose zero operands carry a lane selector,
# so sass._exact_half_idiom does not see the zero: counted as lower_precision.
HABS = "  if (M < 0) { y[threadIdx.x] = __habs(x[threadIdx.x]); y[threadIdx.x + 1] = __hneg(x[threadIdx.x + 1]); }\n"
# F7: a `static const` table in a device function: NVVM puts it in `.global` (read-only data),
# counted as module state (device_state). A `constexpr` local table is accepted (it stays local).
TABLE = ("  if (M < 0) { static const float tab[4] = {1.f, 0.5f, 0.25f, 0.125f};\n"
         "    y[threadIdx.x] = __float2bfloat16_rn(tab[threadIdx.x & 3]); }\n")
# F8: a wmma fragment load of bf16 data (for a bf16-in/fp32-accumulate wmma.mma: allowed): ptx.classify
# takes the load's first type (bf16) for an accumulator (lower_precision). <mma.h> itself does not
# compile here (crt/mma.h is not on NVRTC's include path), so the load is written as PTX.
WMMA = ("  if (M < 0) { unsigned r0, r1, r2, r3;\n"
        '    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.global.bf16 { %0, %1, %2, %3 }, [%4];"\n'
        '                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "l"(x));\n'
        "    reinterpret_cast<unsigned*>(y)[threadIdx.x] = r0 ^ r1 ^ r2 ^ r3; }\n")
NOTHING = "  if (M < 0) y[threadIdx.x] = x[threadIdx.x];\n"


def variants() -> dict:
    """name -> {spec, params (over the spec's first start), text, canon, cls, evidence (regex over the
    accepted build's PTX), kind ('finding': variant accepted, canon refused; 'false_positive':
    variant refused, canon (the same without the honest construct) accepted)}."""
    fp = dict(spec=SM, params={}, kind="false_positive", canon=softmax_prologue(NOTHING))
    return {
        "y1_softmax_const_generic_init_state.cu.j2": dict(
            spec=SM, params={}, kind="finding", cls="state that outlives a call (constant memory written)",
            text=softmax_const(CONST_INIT), canon=softmax_const(CONST_CANON),
            evidence=r"\.const \.align 8 \.u64 pipe_at = generic\(pipe_calls\)|red\.global\.add\.u32|atom\.global\.add\.u32"),
        "y2_decode_attention_p_bf16_trunc.cu.j2": dict(
            spec=DA, params={}, kind="finding", cls="lower_precision (P cut to bf16 before the P V mma)",
            text=decode_trunc(), canon=decode_tf32(),
            evidence=r"prmt\.b32\s+%r\d+, %r\d+, %r\d+, 30258;|mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32"),
        "f1_softmax_cooperative_groups.cu.j2": dict(fp, text=softmax_cg(True), canon=softmax_cg(False),
                                                    cls="device_state (cooperative_groups.h declares a .global)"),
        "f2_softmax_printf.cu.j2": dict(fp, text=softmax_prologue(PRINTF), cls="device_state ($str)"),
        "f3_softmax_assert.cu.j2": dict(fp, text=softmax_prologue(ASSERT), cls="device_state ($str)"),
        "f4_softmax_atomicadd_f32.cu.j2": dict(fp, text=softmax_prologue(ATOMIC_F), cls="fast_math (SASS REDG.FTZ)"),
        "f5_softmax_bf16_to_int8.cu.j2": dict(fp, text=softmax_prologue(B2I8), cls="unreadable_ptx (.reg.b8)"),
        "f6_softmax_habs_bf16.cu.j2": dict(fp, text=softmax_prologue(HABS), cls="lower_precision (SASS HFMA2.BF16_V2 with -RZ.H0_H0)"),
        "f7_softmax_static_table.cu.j2": dict(fp, text=softmax_prologue(TABLE), cls="device_state (static const table)"),
        "f8_softmax_wmma_load_bf16.cu.j2": dict(fp, text=softmax_prologue(WMMA), cls="lower_precision (wmma.load ... .bf16)"),
    }


def main() -> None:
    for name, v in variants().items():
        (HERE / name).write_text(v["text"])
        print("wrote", name)


if __name__ == "__main__":
    main()
