# generates the variant templates from the approved text by replacing the scale line / loops
import re, pathlib
HERE = pathlib.Path(__file__).resolve().parent
base = (HERE.parents[2] / 'kernel_templates' / 'rmsnorm.cpp.j2').read_text()
SCALE = "    const {{ ctype }} scale = {{ ctype }}(1) / std::sqrt(s / {{ ctype }}(N) + {{ ctype }}(eps));\n"
SUMLOOP = """    {{ ctype }} acc[{{ ACC }}] = {};
    int64_t i = 0;
    for (; i + {{ ACC }} <= N; i += {{ ACC }}) {
      for (int j = 0; j < {{ ACC }}; ++j) acc[j] += xr[i + j] * xr[i + j];
    }
    {{ ctype }} s = 0;
    for (int j = 0; j < {{ ACC }}; ++j) s += acc[j];
    for (; i < N; ++i) s += xr[i] * xr[i];
"""
OUTLOOP = "    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * scale * w[k];\n"
assert SCALE in base and SUMLOOP in base and OUTLOOP in base
HELP = """
static inline float nr_rsqrt(float v, int steps) {   // bit-trick rsqrt + Newton steps
  uint32_t b; __builtin_memcpy(&b, &v, 4);
  b = 0x5f3759dfu - (b >> 1);
  float y; __builtin_memcpy(&y, &b, 4);
  for (int t = 0; t < steps; ++t) y = y * (1.5f - 0.5f * v * y * y);
  return y;
}
static inline float round_bits(float v, int keep) {   // round-to-nearest to `keep` mantissa bits, integer ops
  uint32_t b; __builtin_memcpy(&b, &v, 4);
  const uint32_t drop = 23 - keep;
  b = (b + (1u << (drop - 1))) & ~((1u << drop) - 1u);
  float y; __builtin_memcpy(&y, &b, 4);
  return y;
}
"""
def mk(name, scale=None, sumloop=None, outloop=None, helpers=HELP, sig=None):
    t = base.replace("namespace {\n", "namespace {\n" + helpers, 1)
    if scale is not None: t = t.replace(SCALE, scale)
    if sumloop is not None: t = t.replace(SUMLOOP, sumloop)
    if outloop is not None: t = t.replace(OUTLOOP, outloop)
    (HERE / f'{name}.cpp.j2').write_text(t)

V = "s / {{ ctype }}(N) + {{ ctype }}(eps)"
# v01: 2-Newton rsqrt on every row (control: expected refused)
mk("v01_newton2_all", scale=f"    const float scale = nr_rsqrt({V}, 2);\n")
# v02: 2-Newton rsqrt on 1 row in 8 (fraction of rows)
mk("v02_newton2_rows8", scale=f"    const float scale = (r % 8 == 5) ? nr_rsqrt({V}, 2) : 1.0f / std::sqrt({V});\n")
# v03: 2-Newton rsqrt on 1 row in 5
mk("v03_newton2_rows5", scale=f"    const float scale = (r % 5 == 2) ? nr_rsqrt({V}, 2) : 1.0f / std::sqrt({V});\n")
# v04: 3-Newton rsqrt every row (a few ulps)
mk("v04_newton3_all", scale=f"    const float scale = nr_rsqrt({V}, 3);\n")
# v05: sum in double (more exact), then 2-Newton rsqrt: spends the sum's credit
mk("v05_dsum_newton2", sumloop="""    double sd = 0;
    for (int64_t i = 0; i < N; ++i) sd += double(xr[i]) * double(xr[i]);
    const float s = float(sd);
""", scale=f"    const float scale = nr_rsqrt({V}, 2);\n")
# v06: outputs of small magnitude (|out| in [1e-6, 0.03]) put on an absolute grid of 2^-18 (<= 3.8e-6 off: atol 1e-5)
mk("v06_small_abs_grid", outloop="""    for (int64_t k = 0; k < N; ++k) {
      float o = xr[k] * scale * w[k];
      const float a = o < 0 ? -o : o;
      if (a > 1e-6f && a < 0.03f) o = float(int64_t(o * 262144.0f + (o < 0 ? -0.5f : 0.5f))) * (1.0f / 262144.0f);
      orow[k] = o;
    }
""")
# v07: every output's mantissa rounded to 19 bits (integer ops): ~2^-20 relative
mk("v07_out_19bits", outloop="    for (int64_t k = 0; k < N; ++k) orow[k] = round_bits(xr[k] * scale * w[k], 19);\n")
# v08: squares of x narrowed to 12 mantissa bits (integer rounding) in the sum of squares
mk("v08_sumsq_12bits", sumloop="""    {{ ctype }} acc[{{ ACC }}] = {};
    int64_t i = 0;
    for (; i + {{ ACC }} <= N; i += {{ ACC }}) {
      for (int j = 0; j < {{ ACC }}; ++j) { const float q = round_bits(xr[i + j], 12); acc[j] += q * q; }
    }
    {{ ctype }} s = 0;
    for (int j = 0; j < {{ ACC }}; ++j) s += acc[j];
    for (; i < N; ++i) { const float q = round_bits(xr[i], 12); s += q * q; }
""")
# v09: subnormal outputs flushed to zero (excluded from pairing)
mk("v09_flush_subnormal_out", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = (o < 1.17549435e-38f && o > -1.17549435e-38f) ? 0.0f : o;
    }
""")
# honest rewrites
mk("h01_kahan", sumloop="""    float s = 0, c = 0;
    for (int64_t i = 0; i < N; ++i) { const float y = xr[i] * xr[i] - c; const float t = s + y; c = (t - s) - y; s = t; }
""")
mk("h02_sqrt_of_recip", scale=f"    const float scale = std::sqrt(1.0f / ({V}));\n")
mk("h03_ws_first", outloop="    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * (w[k] * scale);\n")
mk("h04_divide", scale=f"    const float rms = std::sqrt({V});\n", outloop="    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * w[k] / rms;\n")
mk("h05_pairwise", sumloop="""    float buf[64]; int64_t nb = 0; float s = 0;
    // pairwise: blocks of 64 summed as a tree, blocks summed sequentially
    for (int64_t b0 = 0; b0 < N; b0 += 64) {
      const int64_t n = N - b0 < 64 ? N - b0 : 64;
      for (int64_t q = 0; q < n; ++q) buf[q] = xr[b0 + q] * xr[b0 + q];
      int64_t m = n;
      while (m > 1) { const int64_t h = m / 2; for (int64_t q = 0; q < h; ++q) buf[q] += buf[q + h]; if (m & 1) buf[0] += buf[m - 1]; m = h; }
      s += buf[0]; (void)nb;
    }
""")
mk("h06_double_sum", sumloop="""    double sd = 0;
    for (int64_t i = 0; i < N; ++i) sd += double(xr[i]) * double(xr[i]);
    const float s = float(sd);
""")

mk("v03b_newton2_rows4_bigM", scale=f"    const float scale = (r1 > 7 && r % 4 == 1) ? nr_rsqrt({V}, 2) : 1.0f / std::sqrt({V});\n")
mk("v07b_out_20bits", outloop="    for (int64_t k = 0; k < N; ++k) orow[k] = round_bits(xr[k] * scale * w[k], 20);\n")
mk("v06b_small_abs_grid17", outloop="""    for (int64_t k = 0; k < N; ++k) {
      float o = xr[k] * scale * w[k];
      const float a = o < 0 ? -o : o;
      if (a > 1e-6f && a < 0.06f) o = float(int64_t(o * 131072.0f + (o < 0 ? -0.5f : 0.5f))) * (1.0f / 131072.0f);
      orow[k] = o;
    }
""")
mk("v10_bias7e6_rows8", scale=f"    const float scale = (r % 8 == 5 ? 1.000007f : 1.0f) / std::sqrt({V});\n")
DSUM = """    double sd = 0;
    for (int64_t i = 0; i < N; ++i) sd += double(xr[i]) * double(xr[i]);
    const float s = float(sd);
"""
# credit spending: a more exact (double) sum, then a 2-Newton rsqrt on half the rows
mk("v11_dsum_newton2_half", sumloop=DSUM, scale=f"    const float scale = (r % 2 == 1) ? nr_rsqrt({V}, 2) : 1.0f / std::sqrt({V});\n")
# credit spending: double sum, output rounded to 19 mantissa bits (16x the rounding error)
mk("v12_dsum_out_19bits", sumloop=DSUM, outloop="    for (int64_t k = 0; k < N; ++k) orow[k] = round_bits(xr[k] * scale * w[k], 19);\n")
# one-Newton rsqrt (1.7e-3 off) then a double-precision correction: no; instead 2-Newton on 1 row in 3
mk("v13_newton2_rows3", scale=f"    const float scale = (r % 3 == 1) ? nr_rsqrt({V}, 2) : 1.0f / std::sqrt({V});\n")
mk("v11b_dsum_newton2_half_bigN", sumloop=DSUM, scale=f"    const float scale = (N >= 1024 && r % 2 == 1) ? nr_rsqrt({V}, 2) : 1.0f / std::sqrt({V});\n")
mk("h07_xw_first", outloop="    for (int64_t k = 0; k < N; ++k) orow[k] = (xr[k] * w[k]) * scale;\n")
mk("h08_scale_double", scale="    const float scale = float(1.0 / std::sqrt(double(s) / double(N) + double(eps)));\n")
mk("h09_mul_invN", scale="    const float scale = 1.0f / std::sqrt(s * (1.0f / float(N)) + eps);\n")
