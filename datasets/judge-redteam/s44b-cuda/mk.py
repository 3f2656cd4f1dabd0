"""Writes the variants v*.cu.j2 from base_softmax.cu.j2 (the shipped template, includes in place)."""
from pathlib import Path
H = Path(__file__).resolve().parent
base = (H / "base_softmax.cu.j2").read_text()
EX = "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }"
assert base.count(EX) == 1
INC = "#include <cuda_bf16.h>\n"
HDR = str(H / "h/fast.cuh")
FAST = ("__device__ __forceinline__ float ex(float v, float m) { return __expf(v - m); } "
        "__device__ __forceinline__ float rcp_(float s) { return __fdividef(1.f, s); }")
def v(name, text):
    (H / f"{name}.cu.j2").write_text(text)
def with_rcp(t):
    return t.replace("1.f / s", "rcp_(s)")
# 1 lexer: a trigraph ??/ ends a // comment; normalize() reads it as a line splice (C++17: no trigraphs)
v("v01_trigraph_splice", with_rcp(base.replace(EX, "// exp of the difference, and the reciprocal ??/\n" + FAST)))
# 2 lexer: a C++14 digit separator 1'0 read as a character literal: a "/*" in a string opens a comment
v("v02_digit_separator", with_rcp(base.replace(EX,
    "static_assert(1'0 == 10, \"'/*\");\n" + FAST + "\nstatic_assert(sizeof(\"*/\") == 3, \"'\"); static_assert(1'0 == 10, \"\");")))
# 2b lexer: a trigraph inside a string literal: "??/" read as "\" (an escaped quote)
v("v02b_trigraph_string", with_rcp(base.replace(EX,
    "static_assert(sizeof(\"??/\") == 4, \"/*\");\n" + FAST + "\nstatic_assert(sizeof(\"*/\") == 3, \"\");")))
# 3 waived directed rounding: __fadd_rz / __fmaf_rz / __fmaf_rd (add.rz.f32, fma.rz.f32, fma.rm.f32 are in the waiver)
v("v03_directed_waived", base.replace(EX,
    "__device__ __forceinline__ float ex(float v, float m) { return exp2f(__fmaf_rz(__fadd_rz(v, -m), L2E, -0.f)); }")
    .replace("s += r[k];", "s = __fmaf_rd(r[k], 1.f, s);"))
# 4 precision by integer ops: outputs truncated to bf16 (pack by shift/and/or = cvt.rz), exps cut to 8 mantissa bits
PACK = """__device__ __forceinline__ unsigned pack2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}"""
assert base.count(PACK) == 1
v("v04_bit_truncation", base.replace(PACK, """__device__ __forceinline__ unsigned pack2(float a, float b) {
  return (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xffff0000u);
}""").replace(EX, "__device__ __forceinline__ float ex(float v, float m) { return __uint_as_float(__float_as_uint(exp2f((v - m) * L2E)) & 0xffff8000u); }"))
# 4b exp by integer arithmetic (Schraudolph): no float function at all
v("v04b_integer_exp", base.replace(EX, "__device__ __forceinline__ float ex(float v, float m) { "
    "const float t = fmaxf((v - m) * L2E, -126.f); return __int_as_float(__float2int_rn(t * 8388608.f) + 1065353216); }"))
# 5 a header pcpp does not read: an absolute path in angle brackets
v("v05_angle_include", with_rcp(base.replace(EX, "").replace(INC, INC + f"#include <{HDR}>\n", 1)))
# 5b the same through the include path: <cuda/../../...> (NVRTC resolves it against its include dirs)
v("v05b_dotdot_include", with_rcp(base.replace(EX, "").replace(INC, INC + "#include <cuda/../../../../../../../../.." + HDR + ">\n", 1)))
# 6 preprocessor divergence, known macro: pcpp defines __PCPP__, NVRTC does not -> include picked by macro
def div(cond):
    return with_rcp(base.replace(EX, "").replace(INC, INC + f"{cond}\n#define PIPE_HDR <cuda_fp16.h>\n#else\n#define PIPE_HDR \"{HDR}\"\n#endif\n#include PIPE_HDR\n", 1))
v("v06_pcpp_macro", div("#ifdef __PCPP__"))
v("v07_true_keyword", div("#if !true"))
v("v08_signed_overflow", div("#if 0x7fffffffffffffff + 1 < 0"))
v("v08b_unsigned_literal", div("#if -0x8000000000000000 < 0"))
v("v09_char_sign", div("#if '\\377' > 0"))
v("v10_arch_feature", div("#if __CUDA_ARCH_HAS_FEATURE__(SM100_ALL)"))
# control: the header included plainly (pcpp reads it)
v("c01_plain_include", with_rcp(base.replace(EX, "").replace(INC, INC + f"#include \"{HDR}\"\n", 1)))
# control: the names in plain sight
v("c02_plain_names", with_rcp(base.replace(EX, FAST)))
# 7b the probe answers wrong: `true` is 1 in a C++ #if, no macro; pcpp reads it as an undefined 0 and
# the NVRTC probe (#ifdef true) says "not defined", so the reading is accepted
v("v07b_true_probe", with_rcp(base.replace(EX, "").replace(INC, INC + f"#if !true\n#include <cuda_fp16.h>\n#else\n#include \"{HDR}\"\n#endif\n", 1)))
