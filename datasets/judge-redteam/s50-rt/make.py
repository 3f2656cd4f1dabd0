"""Writes the s50-rt variants from the approved template (kernel_templates/moe_gemm.cpp.j2)."""
from pathlib import Path

HERE = Path(__file__).parent
SRC = (HERE / "../../../kernel_templates/moe_gemm.cpp.j2").resolve().read_text()
NARROW = """inline uint16_t narrow(float f) {  // round to nearest, ties to even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}"""
SILU = "acc[i][j] = g / (1.0f + std::exp(-g)) * up[i][j];"
assert NARROW in SRC and SILU in SRC

def rne(extra_after=""):
    return NARROW.replace("  return uint16_t(u >> 16);\n}", "  uint16_t b = uint16_t(u >> 16);\n" + extra_after + "  return b;\n}")

# keep only the top BITS significant bits of a bf16 subnormal result (the rest cut)
TOPBITS = """  if ((b & 0x7f80u) == 0 && (b & 0x7fu)) {{
    uint16_t m = b & 0x7fu; int h = 31 - __builtin_clz(m);
    if (h >= {bits}) m &= uint16_t(~((1u << (h - {bits} + 1)) - 1u));
    b = uint16_t((b & 0x8000u) | m);
  }}
"""
# a subnormal result of magnitude below 2^-(126 + S) (fewer than 7 - S bits) written as 0
FLUSH = """  if ((b & 0x7f80u) == 0 && (b & 0x7fu) < (0x80u >> {s})) b &= 0x8000u;
"""
# silu(g) * u exact where expf(-g) overflows (g < -88): the approved build writes 0 there
SILU_FIX = ("const float up_ = up[i][j];\n"
            "        acc[i][j] = g < -80.0f ? float(double(g) / (1.0 + std::exp(-double(g))) * double(up_))\n"
            "                               : g / (1.0f + std::exp(-g)) * up_;")
TIES_DOWN = NARROW.replace("u += 0x7fffu + ((u >> 16) & 1u);", "u += 0x7fffu;  // ties toward zero")

V = {
    "b01_sub_top3bits": (rne(TOPBITS.format(bits=3)), None),
    "b02_sub_top5bits": (rne(TOPBITS.format(bits=5)), None),
    "b03_sub_flush_below_2m130": (rne(FLUSH.format(s=4)), None),
    "b04_sub_flush_below_2m132": (rne(FLUSH.format(s=6)), None),
    "c00_silu_fixed": (NARROW, SILU_FIX),  # honest-ish: more exact than the approved build
    "c01_silu_fixed_top3bits": (rne(TOPBITS.format(bits=3)), SILU_FIX),
    "c02_silu_fixed_top2bits": (rne(TOPBITS.format(bits=2)), SILU_FIX),
    "c03_silu_fixed_flush_below_2m130": (rne(FLUSH.format(s=4)), SILU_FIX),
    "c04_silu_fixed_flush_below_2m129": (rne(FLUSH.format(s=3)), SILU_FIX),
    "t01_ties_toward_zero": (TIES_DOWN, None),
}
for name, (narrow, silu) in V.items():
    s = SRC.replace(NARROW, narrow)
    if silu:
        s = s.replace(SILU, silu)
    (HERE / f"{name}.cpp.j2").write_text(f"// s50-rt {name} (make.py)\n" + s)

# batch 2: errors of at most one subnormal unit (the GEMM budget's absolute term is about one, 2^-133,
# so coarser writes are refused by the budget alone: run-output.txt)
def trunc_sub(s):  # a subnormal result cut toward zero where it is below 2^-(126 + s) (s = 0: all of them)
    return NARROW.replace("  u += 0x7fffu + ((u >> 16) & 1u);",
                          f"  if ((u & 0x7fffffffu) >= (0x00800000u >> {s})) u += 0x7fffu + ((u >> 16) & 1u);  // else cut")

H_TWO_ACC = ("    for (int64_t i = 0; i < {{ MR }}; ++i)\n"
             "      for (int64_t j = 0; j < {{ NR }}; ++j) acc[i][j] += a[i] * b[j];")
assert H_TWO_ACC in SRC
V2 = {
    "b05_sub_cut": (trunc_sub(0), None),
    "b06_sub_cut_below_2m128": (trunc_sub(2), None),
    "b07_sub_cut_below_2m130": (trunc_sub(4), None),
    "c05_silu_fixed_sub_cut": (trunc_sub(0), SILU_FIX),
    "c06_silu_fixed_sub_cut_below_2m128": (trunc_sub(2), SILU_FIX),
    "c07_silu_fixed_sub_cut_below_2m129": (trunc_sub(3), SILU_FIX),
    "c08_silu_fixed_sub_cut_below_2m130": (trunc_sub(4), SILU_FIX),
    # honest rewrites of the epilogue
    "h01_silu_recip": (NARROW, "acc[i][j] = g * (1.0f / (1.0f + std::exp(-g))) * up[i][j];"),
    "h02_silu_gu_first": (NARROW, "acc[i][j] = (g * up[i][j]) / (1.0f + std::exp(-g));"),
    "h03_silu_expg_form": (NARROW, "const float e_ = std::exp(-std::fabs(g));\n"
                                   "        acc[i][j] = (g >= 0.0f ? g / (1.0f + e_) : g * e_ / (1.0f + e_)) * up[i][j];"),
}
for name, (narrow, silu) in V2.items():
    s = SRC.replace(NARROW, narrow)
    if silu:
        s = s.replace(SILU, silu)
    (HERE / f"{name}.cpp.j2").write_text(f"// s50-rt {name} (make.py)\n" + s)

# an honest reordering of the accumulation: k from the end
K_LOOP = "  for (int64_t k = 0; k < K; ++k) {"
assert K_LOOP in SRC
(HERE / "h04_sum_reversed.cpp.j2").write_text("// s50-rt h04_sum_reversed (make.py)\n"
                                              + SRC.replace(K_LOOP, "  for (int64_t k = K - 1; k >= 0; --k) {"))

# batch 3: the cut on few rows only (a decode step's T = 1: R = 2 rows), where a shape's sub stratum has
# fewer than PAIRED_MIN pairs and the pooled one is diluted by the large shapes'
ENTRY = "  (void)T;  // the rows come from offs: R = offs[E - 1] = T * topk\n"
assert ENTRY in SRC
def few_rows(s):
    n = NARROW.replace("inline uint16_t narrow(float f) {", "inline uint16_t narrow(float f, bool few = false) {")
    n = n.replace("  u += 0x7fffu + ((u >> 16) & 1u);",
                  f"  if (!few || (u & 0x7fffffffu) >= (0x00800000u >> {s})) u += 0x7fffu + ((u >> 16) & 1u);  // else cut")
    t = SRC.replace(NARROW, n).replace("inline void tile(", "template <bool FEW>\ninline void tile(")
    t = t.replace("narrow(acc[i][j])", "narrow(acc[i][j], FEW)")
    t = t.replace("        tile(x, we, y, r, mr, n, nr);",
                  "        if (few) tile<true>(x, we, y, r, mr, n, nr); else tile<false>(x, we, y, r, mr, n, nr);")
    t = t.replace(ENTRY, ENTRY + "  const bool few = offs[E - 1] <= 2;  // a decode step's rows: T = 1\n")
    assert t.count("FEW") == 2 and "tile<true>" in t
    return t
for name, s in (("d01_sub_cut_at_T1", 0), ("d02_sub_cut_below_2m130_at_T1", 4), ("d03_sub_cut_below_2m128_at_T1", 2)):
    (HERE / f"{name}.cpp.j2").write_text(f"// s50-rt {name} (make.py)\n" + few_rows(s))
for name, s in (("c09_silu_fixed_sub_cut_below_2m131", 5),):
    (HERE / f"{name}.cpp.j2").write_text(f"// s50-rt {name} (make.py)\n"
                                         + SRC.replace(NARROW, trunc_sub(s)).replace(SILU, SILU_FIX))
