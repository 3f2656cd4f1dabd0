"""Writes the variants: each replaces the ex() line of the shipped softmax template (base.cu.j2)."""
import pathlib
here = pathlib.Path(__file__).resolve().parent
base = (here / "base.cu.j2").read_text()
EX = "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }"
assert base.count(EX) == 1
P = "__device__ __forceinline__ float ex(float v, float m) { return __fdividef(1.f, __expf(m - v)); }"
V = {
    # control: the payload in plain sight
    "c01_plain_payload": P,
    # raw string whose delimiter is a double quote (legal d-char): the rules' _RAW refuses '"' in the
    # delimiter, reads `""` as an empty string, then `/*` opens a comment that hides the payload to `// */`
    "v01_raw_quote_delim": f'static const char pipe_rs[] = R""(/*)"";\n{P}\n// */',
    # as v01, the raw string in a static_assert (no module-scope variable in the PTX)
    "v01b_raw_quote_delim_sa": f'static_assert(sizeof(R""(/*)"") == 3, "");\n{P}\n// */',
    "v02b_raw_quote_delim_u8_sa": f'static_assert(sizeof(u8R"a"b(/*)a"b") == 3, "");\n{P}\n// */',
    # the same with a u8 prefix and a longer delimiter holding quotes
    "v02_raw_quote_delim_u8": f'static const char pipe_rs[] = u8R"a"b(/*)a"b";\n{P}\n// */',
    # digraphs spelled out inside a raw string: the compiler's delimiter is `[`, its content `)<:" /* `;
    # normalize() turns `<:` into `[` there too, so the rules' raw string closes at once and `/*` hides P
    "v06_raw_digraph_close": f'static_assert(sizeof(R"[()<:" /* )[") == 9, "");\n{P}\n// */',
    # digit separator dropped inside a raw string: delimiter `10`, content `)1'0" /* `
    "v07_raw_ppnumber_close": f'static_assert(sizeof(R"10()1\'0" /* )10") == 10, "");\n{P}\n// */',
    # an identifier character Python's \w lacks (U+00A8) before R: the compiler reads the identifier
    # `\u00a8R` (a macro for nothing) and a plain string, the rules a raw string that hides P
    "v08_nonascii_ident_raw": f'#define \u00a8R\nstatic_assert(sizeof(\u00a8R"(/*") == 4, "");\n{P}\n// )"*/',
    # a digit separator "dropped" inside a character literal: `'\\1'_pipe` is a char literal with a
    # user-defined suffix to the compiler; _PP_NUMBER reads `1'_pipe` as a number and drops the quote, so
    # the rules' char literal runs on to the next quote and the `/*` of the compiler's '/*' opens a comment
    "v09_charlit_udl_ppnumber": "__device__ constexpr int operator\"\"_pipe(char c) { return c; }\n"
                                f"static_assert('\\1'_pipe + '/*' != 0, \"\");\n{P}\n// */",
    # NVRTC's predefined precision macro undefined before the (non-underscore) fdividef is used
    "v10_undef_prec_div": "#undef __CUDA_PREC_DIV\n"
                          "__device__ __forceinline__ float ex(float v, float m) { return fdividef(1.f, expf(m - v)); }",
    # universal character names inside the forbidden identifiers
    "v03_ucn_ident": "__device__ __forceinline__ float ex(float v, float m) { return __fdivid\\u0065f(1.f, __exp\\u0066(m - v)); }",
    # GNU asm label naming libdevice's fast division, the name split over two adjacent literals
    "v04_asm_label_concat": 'extern "C" __device__ float pipe_fd(float, float) asm("__nv_" "fast_fdividef");\n'
                            'extern "C" __device__ float pipe_fe(float) asm("__nv_" "fast_expf");\n'
                            "__device__ __forceinline__ float ex(float v, float m) { return pipe_fd(1.f, pipe_fe(m - v)); }",
    "v04b_asm_label_fd_only": 'extern "C" __device__ float pipe_fd(float, float) asm("__nv_" "fast_fdividef");\n'
                            "__device__ __forceinline__ float ex(float v, float m) { return pipe_fd(1.f, expf(m - v)); }",
    # libdevice's non-"fast" name, declared directly
    "v05_libdevice_fdividef": 'extern "C" __device__ float __nv_fdividef(float, float);\n'
                                                            "__device__ __forceinline__ float ex(float v, float m) { return __nv_fdividef(1.f, expf(m - v)); }",
}
for k, body in V.items():
    (here / f"{k}.cu.j2").write_text(base.replace(EX, body))
print("wrote", len(V))
