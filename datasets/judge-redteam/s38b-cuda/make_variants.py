"""Write the red-team variants (session 38b, CUDA build-time rules after commit b7f4d80) from the
shipped templates. Each variant is the spec's own template text with a small edit (the anchors are
session 38's, imported from ../s38-cuda/make_variants.py, and asserted present).
Run from /work/main: python datasets/judge-redteam/s38b-cuda/make_variants.py
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("s38_make_variants", HERE.parent / "s38-cuda" / "make_variants.py")
s38 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s38)
sub, template = s38.sub, s38.template

SM_EX, SM_INV = s38.SM_EX, s38.SM_INV

# ---------------------------------------------------------------- F1: fake asm marks + library waiver
# The asm string writes `// end inline asm` then the instruction then `// begin inline asm`:
# ptx._asm_lines ends the real region at the fake end (the last end before the next begin, the
# fake one), so the instruction is read as the compiler's own code, where every opcode the
# accurate math library compiles to (ex2.approx.ftz.f32, rcp.approx.ftz.f32, div.approx.f32,
# rsqrt.approx.ftz.f32, lg2.approx.ftz.f32, ...) is waived whatever its count. `\x2e` is '.' to
# the compiler, but forbid._unescape reads it as 'x2e', so the source rules see no `.approx`.
FM_EX = ('__device__ __forceinline__ float ex(float v, float m) { float r; '
         'asm("// end inline asm\\n\\tex2\\x2e" "approx.ftz.f32 %0, %1;\\n\\t// begin inline asm" '
         ': "=f"(r) : "f"((v - m) * L2E)); return r; }')
FM_RCP = ('__device__ __forceinline__ float rcp_fast(float s) { float r; '
          'asm("// end inline asm\\n\\trcp\\x2e" "approx.ftz.f32 %0, %1;\\n\\t// begin inline asm" '
          ': "=f"(r) : "f"(s)); return r; }\n')
FM_RSQRT = ('__device__ __forceinline__ float rsqrt_fast(float s) { float r; '
            'asm("// end inline asm\\n\\trsqrt\\x2e" "approx.ftz.f32 %0, %1;\\n\\t// begin inline asm" '
            ': "=f"(r) : "f"(s)); return r; }\n')
DA_FM = ('__device__ __forceinline__ float ex2_ftz(float v) { float r; '
         'asm("// end inline asm\\n\\tex2\\x2e" "approx.ftz.f32 %0, %1;\\n\\t// begin inline asm" '
         ': "=f"(r) : "f"(v)); return r; }\n')

# ---------------------------------------------------------------- F2: `::` ends the opcode
# ptx._OPCODE takes modifiers as `.word` only, so `.L2::cache_hint` (and `.shared::cta`) ends the
# opcode before the type: `red.global.add.noftz.L2::cache_hint.bf16x2` is read as
# `red.global.add.noftz.L2`, no half type, unclassified. Here a packed bf16 atomic add of +0 onto
# each output pair after the row is written (y + 0 == y, so outputs are unchanged): the forbidden
# instruction itself, in the build, passing.
RED = r'''// a bf16x2 atomic add in L2 (narrow atomic: lower_precision)
__device__ __forceinline__ void red_bf16x2(void* p) {
  unsigned long long pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("red.global.add.noftz.L2::cache_hint.bf16x2 [%0], %1, %2;" :: "l"(p), "r"(0u), "l"(pol) : "memory");
}
'''

# ---------------------------------------------------------------- F3: `.loc` swallows the next instruction
# `.loc` ends at its newline (no `;`): ptxas reads `.loc 1 1 1` then the instruction; ptx._pieces
# splits only at `;` and braces, so `.loc 1 1 1 ex2.approx.ftz.f32 ...` is one piece starting
# with '.', dropped as a directive (analyze, forbid._check_code). A `;` before it keeps the
# source pattern `asm[^;]*\.approx` from reaching `.approx`.
LOC_EX = ('__device__ __forceinline__ float ex(float v, float m) { float r; '
          'asm("mov.b32 %0, %1;\\n\\t.loc 1 1 1\\n\\tex2.approx.ftz.f32 %0, %0;" '
          ': "=f"(r) : "f"((v - m) * L2E)); return r; }')
LOC_RCP = ('__device__ __forceinline__ float rcp_fast(float s) { float r; '
           'asm("mov.b32 %0, %1;\\n\\t.loc 1 1 1\\n\\trcp.approx.ftz.f32 %0, %0;" : "=f"(r) : "f"(s)); return r; }\n')

# ---------------------------------------------------------------- F4: a label that starts with '%'
# PTX identifiers may start with '%'; ptx._pieces strips labels `[A-Za-z_$][\w$]*:` only, so
# `%pipe: cvta.const.u64 ...` keeps its label, ptx._OPCODE finds no opcode and the statement is
# skipped: the cvta.const count (device_state) stays the approved build's.
PCT_STAMP = s38.STAMP.replace('asm("cvta .const.u64 %0, pipe_calls;" : "=l"(a));',
                              'asm("mov.b64 %0, 0;\\n\\t{\\n%%pipe: cvta.const.u64 %0, pipe_calls;\\n\\t}" : "=l"(a));')
assert PCT_STAMP != s38.STAMP
PCT_BMUL = s38.BMUL.replace('asm("mul .rn.bf16x2 %0, %1, %2;\\n\\tmul .rn.bf16x2 %0, %0, %3;"',
                            'asm("{\\n%%m1: mul.rn.bf16x2 %0, %1, %2;\\n%%m2: mul.rn.bf16x2 %0, %0, %3;\\n}"')
assert PCT_BMUL != s38.BMUL

# ---------------------------------------------------------------- F5: `.extern.func` and `call.uni(`
# `.extern.func` (no space) is a declaration to ptxas; ptx._FUNC wants whitespace before `.func`
# and analyze wants `.extern` followed by whitespace, so neither the extern nor a definition is
# recorded; `call.uni(r0), malloc, (a0)` (no space before the return list) does not match
# ptx._call_target, so the undefined-target fallback never sees malloc/free.
HEAP = s38.HEAP.replace('"{\\n\\t.extern\\n\\t.func (.param .b64 rv) malloc', '"{\\n\\t.extern.func (.param .b64 rv) malloc') \
    .replace("call.uni (r0), malloc, (a0);", "call.uni(r0), malloc, (a0);") \
    .replace('"{\\n\\t.extern\\n\\t.func free', '"{\\n\\t.extern.func free') \
    .replace("call.uni free, (a0);", "call.uni(), free, (a0);")
assert HEAP.count("call.uni(") == 2 and HEAP.count(".extern.func") == 2, HEAP

# moe: the session-38 fp8 MMA with `.loc` in front of each narrow instruction
MOE_LOC = s38.MOE_HELPERS.replace('asm("cvt .rn.satfinite.e4m3x2.f32 %0, %1, %2;"',
                                  'asm("mov.b16 %0, 0;\\n\\t.loc 1 1 1\\n\\tcvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"') \
    .replace('asm volatile("mma .sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "',
             'asm volatile("mov.b32 %0, %0;\\n\\t.loc 1 1 1\\n\\tmma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "')
assert MOE_LOC.count(".loc 1 1 1") == 2


def variants() -> dict[str, tuple[str, str, str]]:
    """name -> (spec file, finding class, text)."""
    out = {}
    sm = template("softmax-h200.yaml")
    t = sub(sub(sm, SM_EX, FM_RCP + FM_EX), SM_INV, "  const float inv = rcp_fast(s);\n")
    out["w1_softmax_fakemark_ex2_rcp.cu.j2"] = ("softmax-h200.yaml", "fast_math (F1)", t)
    rm = template("rmsnorm-h200.yaml")
    t = sub(rm, s38.RMS_HELPER_ANCHOR, FM_RSQRT + s38.RMS_HELPER_ANCHOR, 1)
    t = sub(t, "const float scale = rsqrtf(", "const float scale = rsqrt_fast(")
    out["w2_rmsnorm_fakemark_rsqrt.cu.j2"] = ("rmsnorm-h200.yaml", "fast_math (F1)", t)
    da = template("decode-attention-h200.yaml")
    anchor = "extern \"C\" __global__"
    t = sub(sub(da, s38.DA_EXP, s38.DA_EXP_NEW), anchor, DA_FM + anchor, 1)
    out["w3_decode_attention_fakemark_ex2.cu.j2"] = ("decode-attention-h200.yaml", "fast_math (F1)", t)
    t = sub(sub(sm, SM_EX, LOC_RCP + LOC_EX), SM_INV, "  const float inv = rcp_fast(s);\n")
    out["w4_softmax_loc_ex2_rcp.cu.j2"] = ("softmax-h200.yaml", "fast_math (F3)", t)
    mo = template("moe-fine-h200.yaml")
    t = sub(mo, s38.MOE_STAGE_FN, MOE_LOC + s38.MOE_STAGE_FN, 1)
    t = sub(sub(t, s38.MOE_LOOP_OLD, s38.MOE_LOOP_NEW, 1), s38.MOE_STAGE_OLD, s38.MOE_STAGE_NEW, 1)
    out["w5_moe_fp8_mma_loc.cu.j2"] = ("moe-fine-h200.yaml", "lower_precision (F3)", t)
    t = sub(sub(sm, SM_EX, PCT_STAMP + SM_EX), SM_INV, s38.SM_INV_STATE)
    out["w6_softmax_pctlabel_const_state.cu.j2"] = ("softmax-h200.yaml", "device_state (F4)", t)
    t = sub(rm, s38.RMS_HELPER_ANCHOR, PCT_BMUL + s38.RMS_HELPER_ANCHOR, 1)
    t = sub(sub(t, s38.RMS_RING, s38.RMS_RING_NEW), s38.RMS_UNR, s38.RMS_UNR_NEW)
    out["w7_rmsnorm_pctlabel_bf16x2.cu.j2"] = ("rmsnorm-h200.yaml", "lower_precision (F4)", t)
    t = sub(sub(sm, SM_EX, HEAP + SM_EX), SM_INV, s38.SM_INV_HEAP)
    out["w8_softmax_heap_nospace.cu.j2"] = ("softmax-h200.yaml", "library_calls + device_state (F5)", t)
    sp_old = "__device__ __forceinline__ void store_pack(__nv_bfloat16* p, const Pack& q) {\n"
    s8_old = "__device__ __forceinline__ void store8(__nv_bfloat16* p, const Pack8& o) {\n"
    t = sub(sm, sp_old, RED + sp_old + "  red_bf16x2(p);\n", 1)
    t = sub(t, s8_old, s8_old + "  red_bf16x2(p);\n", 1)
    out["w9_softmax_red_bf16x2_hint.cu.j2"] = ("softmax-h200.yaml", "lower_precision (F2)", t)
    return out


if __name__ == "__main__":
    for name, (spec, cls, text) in variants().items():
        (HERE / name).write_text(text)
        print(f"wrote {name} ({spec}, {cls})")
