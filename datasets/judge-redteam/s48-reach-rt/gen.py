# generates the variant templates from the approved text (kernel_templates/rmsnorm.cpp.j2)
import pathlib
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
SIG = "{{ ctype }}* __restrict__ out, int64_t r0, int64_t r1, int64_t N, float eps) {"
assert SCALE in base and SUMLOOP in base and OUTLOOP in base and SIG in base
HELP = """
static inline float round_bits(float v, int keep) {   // round-to-nearest to `keep` mantissa bits, integer ops
  uint32_t b; __builtin_memcpy(&b, &v, 4);
  const uint32_t drop = 23 - keep;
  b = (b + (1u << (drop - 1))) & ~((1u << drop) - 1u);
  float y; __builtin_memcpy(&y, &b, 4);
  return y;
}
static inline float add_ulps(float v, int u) {   // move v by u units of its last place (integer ops)
  uint32_t b; __builtin_memcpy(&b, &v, 4);
  if ((b & 0x7f800000u) < 0x01000000u || (b & 0x7f800000u) == 0x7f800000u) return v;   // tiny, zero, inf: leave
  b = uint32_t(int32_t(b) + u);
  float y; __builtin_memcpy(&y, &b, 4);
  return y;
}
static inline float nr_rsqrt(float v, int steps) {
  uint32_t b; __builtin_memcpy(&b, &v, 4);
  b = 0x5f3759dfu - (b >> 1);
  float y; __builtin_memcpy(&y, &b, 4);
  for (int t = 0; t < steps; ++t) y = y * (1.5f - 0.5f * v * y * y);
  return y;
}
"""
def mk(name, scale=None, sumloop=None, outloop=None):
    t = base.replace("namespace {\n", "namespace {\n" + HELP, 1)
    # the row count travels into rows() (M): r1 - r0 is it at THREADS 1; use the whole M
    t = t.replace(SIG, SIG.replace("int64_t N,", "int64_t N, int64_t M,"))
    t = t.replace("0, M, N, eps);", "0, M, N, M, eps);").replace("r0, r1, N, eps);", "r0, r1, N, M, eps);").replace("chunk < M ? chunk : M, N, eps);", "chunk < M ? chunk : M, N, M, eps);")
    if scale is not None: t = t.replace(SCALE, scale)
    if sumloop is not None: t = t.replace(SUMLOOP, sumloop)
    if outloop is not None: t = t.replace(OUTLOOP, outloop)
    (HERE / f'{name}.cpp.j2').write_text(t)

V = "s / {{ ctype }}(N) + {{ ctype }}(eps)"
DSUM = """    double sd = 0;
    for (int64_t i = 0; i < N; ++i) sd += double(xr[i]) * double(xr[i]);
    const float s = float(sd);
"""

# W1: the single-row shape (M == 1: rmsnorm 1x4096, a decode step) cut to 16 bits: its 4 rows are
# 4 clusters of 4096 elements in the few-row stratum, so the row-clustered se caps diff/se near 4
mk("w01_M1_out16bits", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = M == 1 ? round_bits(o, 16) : o;
    }
""")
# W2: same, each output moved 0.8 of the budget (a02's form)
mk("w02_M1_fullbudget", scale=SCALE + """    float m = 0;
    if (M == 1) {
      for (int64_t k = 0; k < N; ++k) { const float o = xr[k] * scale * w[k]; m += o < 0 ? -o : o; }
      m /= float(N);
    }
    const float at = m < 1e-20f ? 0.0f : (m / 256.0f < 1e-5f ? m / 256.0f : 1e-5f);
""", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      const float b = M == 1 ? 0.8f * (at + 1e-5f * (o < 0 ? -o : o)) : 0.0f;
      orow[k] = (k & 1) ? o + b : o - b;
    }
""")
# W3: long-row shapes with few rows: <= ~36 cheated rows per stratum never reach 6 se over rows.
# range spec: 16x16384 1 row in 4, 32x8192 1 row in 16, 1x4096 every row: outputs to 16 bits
mk("w03_rowclusters_16bits", scale=SCALE + "    const bool cut = M == 1 || (M > 8 && M <= 16 && r % 4 == 1) || (M > 16 && M <= 32 && r % 16 == 1);\n", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = cut ? round_bits(o, 16) : o;
    }
""")
# W4: rmsnorm-cpu's 512x4096: the first 8 rows of each call (1.56% of rows) to 16 bits
mk("w04_first8rows_16bits", scale=SCALE + "    const bool cut = M >= 512 && N >= 4096 && r < 8;\n", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = cut ? round_bits(o, 16) : o;
    }
""")
# W5 (control for W3's bound): 16x16384 every other row (8 of 16 per call, 32 rows of 64: diff/se ~ sqrt(63) = 7.9 > 6)
mk("w05_ctl_half_rows_16bits", scale=SCALE + "    const bool cut = M > 8 && M <= 16 && r % 2 == 1;\n", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = cut ? round_bits(o, 16) : o;
    }
""")
