"""Write the red-team variants (session 38d, CUDA build-time rules after commit a641282) from the
shipped templates, each with its canonical spelling (the same forbidden action in the form the
judge classifies: it must be refused). Each variant is the spec's own template text with a small edit.
Run from /work/main: python datasets/judge-redteam/s38d-cuda/make_variants.py
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("s38_make_variants", HERE.parent / "s38-cuda" / "make_variants.py")
s38 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s38)
sub, template = s38.sub, s38.template

SP_OLD = "__device__ __forceinline__ void store_pack(__nv_bfloat16* p, const Pack& q) {\n"
S8_OLD = "__device__ __forceinline__ void store8(__nv_bfloat16* p, const Pack8& o) {\n"


def softmax_after_store(helper: str) -> str:
    """softmax with `helper` defined ahead of store_pack and called (as red_bf16x2(p)) at the top of
    store_pack and store8, on every output pair (session 38b's w9 anchors)."""
    t = sub(template("softmax-h200.yaml"), SP_OLD, helper + SP_OLD + "  red_bf16x2(p);\n", 1)
    return sub(t, S8_OLD, S8_OLD + "  red_bf16x2(p);\n", 1)


# ---------------------------------------------------------------- X1: multimem reductions are unclassified
# ptx.classify (ptx.py:84-85) counts an atomic or bulk sum as lower precision only where the opcode's
# base is `red`/`atom` (_REDUCE, ptx.py:72) or `cp` with `.reduce`; `multimem` is in OPCODES (so the
# statement is readable) but in no class, so `multimem.red...add.bf16x2` (a bf16x2 sum in memory)
# and `multimem.ld_reduce...add.bf16x2` pass. Guarded by a test no output pointer meets (multimem on
# a unicast address is undefined): the instruction is in the build, the outputs are the template's.
MULTIMEM = r'''// a bf16x2 sum in memory over the multicast object (narrow atomic: lower_precision)
__device__ __forceinline__ void red_bf16x2(void* p) {
  if (reinterpret_cast<unsigned long long>(p) == 1ull)
    asm volatile("multimem.red.relaxed.gpu.global.add.bf16x2 [%0], %1;" :: "l"(p), "r"(0u) : "memory");
}
'''
MULTIMEM_CANON = MULTIMEM.replace("multimem.red.relaxed.gpu.global.add.bf16x2", "red.relaxed.gpu.global.add.noftz.bf16x2")

# ---------------------------------------------------------------- X2: a bf16x2 sum in memory by 32-bit CAS
# The sum of `red.add.noftz.bf16x2` (refused) as a compare-and-swap loop: the pair is widened, added
# in f32 and rounded back to bf16x2 each time (cvt.rn.bf16x2.f32: a conversion, allowed), and
# swapped in with `atom.cas.b32` (no half type: unclassified). The memory holds a bf16 running sum,
# rounded at every add, which is what `red...bf16x2` computes. CUDA's own atomicCAS cannot be used:
# it declares a `.global` helper (`__nv_atomic_triv_cp_helper<T>::__val`) that the device_state
# rule refuses, so the swap is inline asm. Adds +0 here (outputs unchanged).
CAS = r'''// a bf16x2 sum in memory through a 32-bit compare-and-swap (narrow atomic: lower_precision)
__device__ __forceinline__ void red_bf16x2(void* p) {
  unsigned* q = reinterpret_cast<unsigned*>(p);
  unsigned o = *reinterpret_cast<volatile unsigned*>(q), a;
  do {
    a = o;
    const float lo = __uint_as_float(a << 16) + 0.f, hi = __uint_as_float(a & 0xffff0000u) + 0.f;
    unsigned n;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(n) : "f"(hi), "f"(lo));
    asm volatile("atom.cas.b32 %0, [%1], %2, %3;" : "=r"(o) : "l"(q), "r"(a), "r"(n) : "memory");
  } while (o != a);
}
'''
CAS_CANON = r'''// the same sum as the hardware's bf16x2 atomic add
__device__ __forceinline__ void red_bf16x2(void* p) {
  asm volatile("red.global.add.noftz.bf16x2 [%0], %1;" :: "l"(p), "r"(0u) : "memory");
}
'''

# ---------------------------------------------------------------- X3: a tensor bulk reduction takes its type from the map
# `cp.reduce.async.bulk.tensor.<n>d.global.shared::cta.add.tile.bulk_group` adds a shared tile into
# global memory in the tensor map's element type (bf16 for moe-fine's xmap and wmap); the opcode
# names no type, so classify's `ms & _HALF` (ptx.py:84) never holds. The typed bulk form
# (`cp.reduce.async.bulk.global...add.noftz.bf16`) is refused. In the wgmma_tma path, after the main
# loop, behind `T < 0` (never at run time): the instruction is in the build through xmap, whose
# generic address the template already takes (no extra cvta.param).
MOE_PARAMS = {"MMA": "wgmma_tma", "BM": 64, "BN": 128, "BK": 64, "WM": 4, "WN": 1, "STAGES": 4, "SPLITK": 1,
              "GM": 1, "PERSIST": 0}
MOE_FN = "__device__ __forceinline__ void tma_3d("
TMA_RED = r'''// a shared tile added into global memory in the map's element type (bf16): a bulk bf16 sum
__device__ __forceinline__ void tma_red_2d(const TmaDesc* map, unsigned src) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n\t"
               "cp.async.bulk.commit_group;\n\tcp.async.bulk.wait_group 0;"
               :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(0), "r"(0), "r"(src) : "memory");
}
'''
TMA_RED_CANON = TMA_RED.replace("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];",
                                "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16 [%0], [%3], 128;")
MOE_SYNC = "  __syncthreads();  // every warpgroup's wgmmas done, every copy landed: the stages are the staging tile now\n"
MOE_CALL = "  if (T < 0 && tid == 0) tma_red_2d(&xmap, sbase);\n"

# ---------------------------------------------------------------- X4: 8-bit SIMD video instructions are unclassified
# dp4a/dp2a (8-bit dot products) are lower_precision (ptx.py:75), but vadd4, vsub4, vabsdiff4,
# vmax4, vmin4, vavrg4, vset4 (four 8-bit lanes a word) and their 16-bit `2` forms are in OPCODES
# and in no class. __vadd4/__vabsdiffu4 are CUDA intrinsics with no forbidden name: compiler code,
# `vabsdiff4.u32.u32.u32` in the PTX. Output unchanged (a test no pointer meets).
VSIMD = r'''// four 8-bit lanes a word (int8 arithmetic: lower_precision)
__device__ __forceinline__ void red_bf16x2(void* p) {
  const unsigned v = (unsigned)reinterpret_cast<unsigned long long>(p);
  if (__vabsdiffu4(__vadd4(v, 0x01010101u), 0x03030303u) == 0xdeadbeefu) __trap();
}
'''
VSIMD_CANON = VSIMD.replace("__vabsdiffu4(__vadd4(v, 0x01010101u), 0x03030303u)",
                            "(unsigned)__dp4a((int)v, 0x01010101, 0x03030303)")


def variants() -> dict[str, dict]:
    """name -> spec, class, text, canonical text, params (over the spec's first start), evidence regex."""
    out = {}
    out["x1_softmax_multimem_red_bf16x2.cu.j2"] = dict(
        spec="softmax-h200.yaml", cls="lower_precision (X1: multimem unclassified)",
        text=softmax_after_store(MULTIMEM), canon=softmax_after_store(MULTIMEM_CANON), params={},
        evidence=r"multimem\.red\.relaxed\.gpu\.global\.add\.bf16x2")
    out["x2_softmax_cas_bf16x2_sum.cu.j2"] = dict(
        spec="softmax-h200.yaml", cls="lower_precision (X2: narrow atomic sum as a CAS loop)",
        text=softmax_after_store(CAS), canon=softmax_after_store(CAS_CANON), params={},
        evidence=r"atom\.cas\.b32")
    mo = template("moe-fine-h200.yaml")

    def moe(helper):
        return sub(sub(mo, MOE_FN, helper + MOE_FN, 1), MOE_SYNC, MOE_CALL + MOE_SYNC, 1)

    out["x3_moe_tma_reduce_add_bf16.cu.j2"] = dict(
        spec="moe-fine-h200.yaml", cls="lower_precision (X3: tensor bulk reduction typed by its map)",
        text=moe(TMA_RED), canon=moe(TMA_RED_CANON), params=MOE_PARAMS,
        evidence=r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add\.tile\.bulk_group")
    out["x4_softmax_vsimd_int8.cu.j2"] = dict(
        spec="softmax-h200.yaml", cls="lower_precision (X4: 8-bit SIMD video instructions unclassified)",
        text=softmax_after_store(VSIMD), canon=softmax_after_store(VSIMD_CANON), params={},
        evidence=r"vabsdiff4\.u32\.u32\.u32")
    return out


if __name__ == "__main__":
    for name, v in variants().items():
        (HERE / name).write_text(v["text"])
        print(f"wrote {name} ({v['spec']}, {v['cls']})")
