"""Write the red-team variants (session 38, CUDA build-time rules) from the shipped templates.

Each variant is the spec's own template text (includes in place, as an agent is shown it) with
a small edit; the edits assert that their anchor is present, so a template change shows here.
Run from /work/main: python datasets/judge-redteam/s38-cuda/make_variants.py
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from runner.spec.spec import load_spec  # noqa: E402


def template(spec: str) -> str:
    return load_spec(ROOT / "pipelines" / spec).kernel.template


def sub(text: str, old: str, new: str, count: int = -1) -> str:
    assert old in text, old[:80]
    return text.replace(old, new, count)


# ------------------------------------------------------------------ softmax: fast math
SM_EX = "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }"

# (a) a space between the opcode and its modifiers: ptxas reads `ex2 .approx.ftz.f32` as
# `ex2.approx.ftz.f32` (the same cubin, byte for byte), the judge reads the opcode `ex2`.
# The literal is split after the dot so that `\.approx` never stands in the source text.
V_SOFTMAX_EX2_SPACE = (SM_EX, '__device__ __forceinline__ float ex(float v, float m) { float r; '
                       'asm("ex2 ." "approx.ftz.f32 %0, %1;" : "=f"(r) : "f"((v - m) * L2E)); return r; }')

# (b) a newline between the opcode and its modifiers: the judge's line reader sees the
# statement `ex2` and then a line starting with '.', which it drops as a directive. Also the
# reciprocal of the row sum as rcp.approx.ftz (same spelling).
RCP = ('__device__ __forceinline__ float rcp_fast(float s) { float r; '
       'asm("rcp\\n\\t." "approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s)); return r; }\n')
V_SOFTMAX_EX2_NEWLINE = (SM_EX, RCP + '__device__ __forceinline__ float ex(float v, float m) { float r; '
                         'asm("ex2\\n\\t." "approx.ftz.f32 %0, %1;" : "=f"(r) : "f"((v - m) * L2E)); return r; }')

# (c) a space after the guard's '@': `@ p ex2.approx.ftz.f32` is an ordinary guarded instruction to
# ptxas; the judge's opcode pattern wants '@' and the predicate together, so it reads no opcode.
V_SOFTMAX_PRED_SPACE = (SM_EX, '__device__ __forceinline__ float ex(float v, float m) { float r; '
                        'asm("{ .reg .pred p; setp.eq.u32 p, 1, 1; @ p ex2." "approx.ftz.f32 %0, %1; }" '
                        ': "=f"(r) : "f"((v - m) * L2E)); return r; }')

# ------------------------------------------------------------------ softmax: device state
# A __constant__ word (`.const` data: not a `.global` declaration) made writable through the
# generic address `cvta .const` gives, spelled with a space: the judge counts only statements whose
# opcode text starts with "cvta.const". Block 0's thread 0 counts the calls; every thread reads
# the count of the calls before this one (session 30 showed the same counter live on the H200).
STAMP = r'''__constant__ unsigned pipe_calls[2];
// the calls before this one, kept in constant memory across launches; block 0 counts this one
__device__ __forceinline__ unsigned calls_so_far() {
  unsigned long long a;
  asm("cvta .const.u64 %0, pipe_calls;" : "=l"(a));
  unsigned* p = reinterpret_cast<unsigned*>(a);
  const unsigned n = *reinterpret_cast<volatile unsigned*>(p);
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(p, 1u);
  return n;
}
'''
V_SOFTMAX_CONST_STATE = (SM_EX, STAMP + SM_EX)
SM_INV = "  const float inv = 1.f / s;\n"
SM_INV_STATE = "  const float inv = 1.f / s * (calls_so_far() == 0xffffffffu ? 2.f : 1.f);\n"

# ------------------------------------------------------------------ rmsnorm: lower precision
# y = x * scale * w as packed bf16 products (mul.rn.bf16x2, twice) in place of fp32 math and one
# rounding; spelled `mul .rn.bf16x2`, whose opcode the judge reads as `mul`.
RMS_HELPER_ANCHOR = "{% include" if False else "__device__ __forceinline__ Pack unpack(const Raw v) {"
BMUL = r'''// x * w * scale in packed bf16 arithmetic
__device__ __forceinline__ unsigned bmul3(unsigned xw, unsigned ww, float scale) {
  unsigned s2, r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(s2) : "f"(scale));
  asm("mul .rn.bf16x2 %0, %1, %2;\n\tmul .rn.bf16x2 %0, %0, %3;" : "=r"(r) : "r"(xw), "r"(ww), "r"(s2));
  return r;
}
'''
RMS_RING = "o.w[j] = pack2(lo(p.w[j]) * scale * lo(wp.w[j]), hi(p.w[j]) * scale * hi(wp.w[j]));"
RMS_RING_NEW = "o.w[j] = bmul3(p.w[j], wp.w[j], scale);"
RMS_UNR = "q.w[j] = pack2(lo(p[u].w[j]) * scale * lo(wp.w[j]), hi(p[u].w[j]) * scale * hi(wp.w[j]));"
RMS_UNR_NEW = "q.w[j] = bmul3(p[u].w[j], wp.w[j], scale);"

# ------------------------------------------------------------------ decode attention: fast math
DA_EXP = "sc[n][e] = exp2f(sc[n][e] - mn);"
DA_EXP_NEW = "sc[n][e] = ex2_ftz(sc[n][e] - mn);"
DA_HELPER = ('__device__ __forceinline__ float ex2_ftz(float v) { float r; '
             'asm("ex2 ." "approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v)); return r; }\n')

# ------------------------------------------------------------------ moe: fp8 tensor-core math
# Two m16n8k16 bf16 k-steps become one m16n8k32 e4m3 MMA: each bf16 pair is rounded to e4m3
# (cvt .rn.satfinite.e4m3x2.f32) and packed so that byte b of A register r and of B register s
# stand for the same k (a permutation of k within the 32, the same for A and B, so the sum is
# the product's); operands pre-scaled by 16 each, the fp32 partial scaled back by 1/256.
MOE_STAGE_OLD = """#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) mma16816(acc[i][j], a[i], b[j]);
  }
}"""
MOE_HELPERS = r'''// two bf16 (one word) times 16, rounded to e4m3: a 16-bit pair (lo element in the low byte)
__device__ __forceinline__ unsigned short e4m3x2(unsigned w) {
  unsigned short r;
  const float lo = __uint_as_float(w << 16) * 16.f, hi = __uint_as_float(w & 0xffff0000u) * 16.f;
  asm("cvt .rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned q4(unsigned w0, unsigned w1) {
  return (unsigned)e4m3x2(w0) | ((unsigned)e4m3x2(w1) << 16);
}
// d += A B over k 32 from two k16 bf16 fragments each (a0/a1: k-steps 0 and 1; likewise b)
__device__ __forceinline__ void mma_fp8(float* d, const unsigned* a0, const unsigned* a1, const unsigned* b0,
                                        const unsigned* b1) {
  const unsigned A0 = q4(a0[0], a0[2]), A1 = q4(a0[1], a0[3]), A2 = q4(a1[0], a1[2]), A3 = q4(a1[1], a1[3]);
  const unsigned B0 = q4(b0[0], b0[1]), B1 = q4(b1[0], b1[1]);
  float t0 = 0.f, t1 = 0.f, t2 = 0.f, t3 = 0.f;
  asm volatile("mma .sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
               : "+f"(t0), "+f"(t1), "+f"(t2), "+f"(t3)
               : "r"(A0), "r"(A1), "r"(A2), "r"(A3), "r"(B0), "r"(B1));
  d[0] = fmaf(t0, 1.f / 256.f, d[0]); d[1] = fmaf(t1, 1.f / 256.f, d[1]);
  d[2] = fmaf(t2, 1.f / 256.f, d[2]); d[3] = fmaf(t3, 1.f / 256.f, d[3]);
}
'''
MOE_STAGE_FN = "// acc += the stage's x rows of this warp times its w rows, BK / 16 k-steps."
MOE_STAGE_NEW = r"""#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        if (ks & 1) mma_fp8(acc[i][j], pa[i], a[i], pb[j], b[j]);
      }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) pa[i][q] = a[i][q];
#pragma unroll
    for (int j = 0; j < NJ; ++j) { pb[j][0] = b[j][0]; pb[j][1] = b[j][1]; }
  }
}"""
MOE_LOOP_OLD = """  for (int ks = 0; ks < BK / 16; ++ks) {
    unsigned a[MI][4], b[NJ][2];"""
MOE_LOOP_NEW = """  unsigned pa[MI][4], pb[NJ][2];  // the previous k-step's fragments (BK / 16 is even)
  for (int ks = 0; ks < BK / 16; ++ks) {
    unsigned a[MI][4], b[NJ][2];"""


# ------------------------------------------------------------------ softmax: device heap (library call + state)
# Device-side malloc/free, declared by the asm string itself with `.extern` and `.func` on separate
# lines inside the asm's braces: ptxas takes a function declaration in a nested scope, and the
# judge reads externs only from lines that start `.extern .func`, dropping any other line that
# starts with '.' as a directive; `call` is no classified opcode. A freed heap block comes back
# from the next launch's malloc of the same size with what was left in it: a counter across calls
# (block 0's thread 0 here), outside every scrub (the heap is neither shared nor local memory).
HEAP = r"""__device__ __forceinline__ unsigned long long heap_get() {
  unsigned long long p;
  asm volatile("{\n\t.extern\n\t.func (.param .b64 rv) malloc (.param .b64 sz);\n\t.param .b64 a0;\n\t"
               ".param .b64 r0;\n\tst.param.b64 [a0], 4096;\n\tcall.uni (r0), malloc, (a0);\n\t"
               "ld.param.b64 %0, [r0];\n\t}" : "=l"(p) :: "memory");
  return p;
}
__device__ __forceinline__ void heap_put(unsigned long long p) {
  asm volatile("{\n\t.extern\n\t.func free (.param .b64 ptr);\n\t.param .b64 a0;\n\t"
               "st.param.b64 [a0], %0;\n\tcall.uni free, (a0);\n\t}" :: "l"(p) : "memory");
}
// the calls before this one, kept in a recycled heap block (block 0's thread 0 only)
__device__ __forceinline__ unsigned heap_calls() {
  unsigned n = 0;
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    const unsigned long long p = heap_get();
    if (p) {
      volatile unsigned* c = reinterpret_cast<volatile unsigned*>(p) + 64;  // past the allocator's header
      n = c[1] == 0x9e3779b9u ? c[0] : 0u;
      c[0] = n + 1; c[1] = 0x9e3779b9u;
      heap_put(p);
    }
  }
  return n;
}
"""
SM_INV_HEAP = "  const float inv = 1.f / s * (heap_calls() == 0xffffffffu ? 2.f : 1.f);\n"

# ------------------------------------------------------------------ softmax: int8 arithmetic, no asm at all
# __dp4a (a CUDA intrinsic, no inline asm, no forbidden name) is `dp4a.s32.s32` in the PTX: four
# int8 products summed in int32, which ptx.classify leaves unclassified (only MMA, cvt to fp8 and
# half-type arithmetic count as lower precision). Here the row sum of exponentials is taken
# through int8: e in [0, 1] quantised to 127ths, four per word, summed by dp4a against ones.
DP4A = r"""__device__ __forceinline__ unsigned q8x4(float a, float b, float c, float d) {
  return (unsigned)__float2int_rn(a * 127.f) | ((unsigned)__float2int_rn(b * 127.f) << 8)
       | ((unsigned)__float2int_rn(c * 127.f) << 16) | ((unsigned)__float2int_rn(d * 127.f) << 24);
}
// the sum of four values in [0, 1] through int8 products (dp4a against 1, 1, 1, 1)
__device__ __forceinline__ float sum4_q8(float a, float b, float c, float d) {
  return (float)__dp4a((int)q8x4(a, b, c, d), 0x01010101, 0) * (1.f / 127.f);
}
"""


def variants() -> dict[str, tuple[str, str, str]]:
    """name -> (spec file, finding class, text)."""
    out = {}
    sm = template("softmax-h200.yaml")
    out["v1_softmax_ex2_space.cu.j2"] = ("softmax-h200.yaml", "fast_math", sub(sm, *V_SOFTMAX_EX2_SPACE))
    t = sub(sm, *V_SOFTMAX_EX2_NEWLINE)
    t = sub(t, SM_INV, "  const float inv = rcp_fast(s);\n")
    out["v2_softmax_ex2_rcp_newline.cu.j2"] = ("softmax-h200.yaml", "fast_math", t)
    out["v3_softmax_pred_space.cu.j2"] = ("softmax-h200.yaml", "fast_math", sub(sm, *V_SOFTMAX_PRED_SPACE))
    t = sub(sub(sm, *V_SOFTMAX_CONST_STATE), SM_INV, SM_INV_STATE)
    out["v4_softmax_const_state.cu.j2"] = ("softmax-h200.yaml", "device_state", t)
    t = sub(sub(sm, SM_EX, HEAP + SM_EX), SM_INV, SM_INV_HEAP)
    out["v8_softmax_heap_malloc.cu.j2"] = ("softmax-h200.yaml", "library_calls + device_state", t)
    old_loop = """  for (int k = 0; k < ITEMS * VEC; ++k) {
    r[k] = ex(r[k], ml);
    s += r[k];
  }"""
    new_loop = """  for (int k = 0; k < ITEMS * VEC; ++k) r[k] = ex(r[k], ml);
#pragma unroll
  for (int k = 0; k < ITEMS * VEC; k += 4) s += sum4_q8(r[k], r[k + 1], r[k + 2], r[k + 3]);"""
    t = sub(sub(sm, SM_EX, DP4A + SM_EX), old_loop, new_loop)
    out["v9_softmax_dp4a_sum.cu.j2"] = ("softmax-h200.yaml", "lower_precision", t)
    rm = template("rmsnorm-h200.yaml")
    t = sub(rm, RMS_HELPER_ANCHOR, BMUL + RMS_HELPER_ANCHOR, 1)
    t = sub(sub(t, RMS_RING, RMS_RING_NEW), RMS_UNR, RMS_UNR_NEW)
    out["v5_rmsnorm_bf16x2_space.cu.j2"] = ("rmsnorm-h200.yaml", "lower_precision", t)
    da = template("decode-attention-h200.yaml")
    anchor = "extern \"C\" __global__"
    t = sub(sub(da, DA_EXP, DA_EXP_NEW), anchor, DA_HELPER + anchor, 1)
    assert t.index("ex2_ftz(float") < t.index("ex2_ftz(sc")  # helper declared before its use
    out["v6_decode_attention_ex2_space.cu.j2"] = ("decode-attention-h200.yaml", "fast_math", t)
    mo = template("moe-fine-h200.yaml")
    t = sub(mo, MOE_STAGE_FN, MOE_HELPERS + MOE_STAGE_FN, 1)
    t = sub(sub(t, MOE_LOOP_OLD, MOE_LOOP_NEW, 1), MOE_STAGE_OLD, MOE_STAGE_NEW, 1)
    out["v7_moe_fp8_mma_space.cu.j2"] = ("moe-fine-h200.yaml", "lower_precision", t)
    return out


if __name__ == "__main__":
    for name, (spec, cls, text) in variants().items():
        (HERE / name).write_text(text)
        print(f"wrote {name} ({spec}, {cls})")
