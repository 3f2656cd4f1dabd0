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
mk("v00_copy")   # control: the approved text with M passed through
# A: few-row shapes (M < 16: under 64 rows over a shape's 2 rounds x 2 runs) judged by the pools only
mk("a01_smallM_out16bits", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = M < 16 ? round_bits(o, 16) : o;
    }
""")
# A2: few-row shapes: each output pushed 0.9 of the budget away, sign alternating by column
mk("a02_smallM_fullbudget", scale=SCALE + """    float m = 0;
    if (M < 16) {
      for (int64_t k = 0; k < N; ++k) { const float o = xr[k] * scale * w[k]; m += o < 0 ? -o : o; }
      m /= float(N);
    }
    const float at = m < 1e-20f ? 0.0f : (m / 256.0f < 1e-5f ? m / 256.0f : 1e-5f);   // the atol part only where atol is not capped
""", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      const float b = M < 16 ? 0.8f * (at + 1e-5f * (o < 0 ? -o : o)) : 0.0f;
      orow[k] = (k & 1) ? o + b : o - b;
    }
""")
# B: every shape: 1 element in 8 moved 6 ulps (just under the tail's 3 log2 units), sign alternating
mk("b01_cols8_6ulp", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = (k % 8 == 3) ? add_ulps(o, (k & 16) ? 6 : -6) : o;
    }
""")
# B2: b01 + 1 element in 128 rounded to 16 bits (under the tail's 1%)
mk("b02_cols8_6ulp_cols128_16bits", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = (k % 8 == 3) ? add_ulps(o, (k & 16) ? 6 : -6) : (k % 128 == 6) ? round_bits(o, 16) : o;
    }
""")
# C: ACC-1 credit: a double sum (more exact) earns 'better' elements; spend them on 16-bit outputs
mk("c01_dsum", sumloop=DSUM)
mk("c02_dsum_cols32_16bits", sumloop=DSUM, outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = (k % 32 == 6) ? round_bits(o, 16) : o;
    }
""")
# C3: double sum's mean credit spent on half the elements moved 6 ulps (never 'worse' by 3 log2 units)
mk("c03_dsum_half_6ulp", sumloop=DSUM, outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = (k & 1) ? add_ulps(o, (k & 2) ? 6 : -6) : o;
    }
""")
# C4: double sum's tail credit ('better' elements where the approved fp32 chain is 8x off) spent on
# 1 element in 32 rounded to 16 bits on long rows (N >= 2048), 1 in 128 on short ones
mk("c04_dsum_cols32_16bits_bigN", sumloop=DSUM, outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = (N >= 2048 ? k % 32 == 6 : k % 128 == 6) ? round_bits(o, 16) : o;
    }
""")
# A3: few-row shapes of short rows only (M < 16, N <= 1024): the range spec's M = 4 tuning points
mk("a03_smallM_shortN_fullbudget", scale=SCALE + """    float m = 0;
    const bool cut = M < 16 && N <= 1024;
    if (cut) {
      for (int64_t k = 0; k < N; ++k) { const float o = xr[k] * scale * w[k]; m += o < 0 ? -o : o; }
      m /= float(N);
    }
    const float at = m < 1e-20f ? 0.0f : (m / 256.0f < 1e-5f ? m / 256.0f : 1e-5f);   // the atol part only where atol is not capped
""", outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      const float b = cut ? 0.8f * (at + 1e-5f * (o < 0 ? -o : o)) : 0.0f;
      orow[k] = (k & 1) ? o + b : o - b;
    }
""")
mk("c05_dsum_cols16_16bits_bigN", sumloop=DSUM, outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = (N >= 2048 ? k % 16 == 6 : k % 128 == 6) ? round_bits(o, 16) : o;
    }
""")
mk("c06_dsum_3of4_6ulp", sumloop=DSUM, outloop="""    for (int64_t k = 0; k < N; ++k) {
      const float o = xr[k] * scale * w[k];
      orow[k] = (k & 3) ? add_ulps(o, (k & 4) ? 6 : -6) : o;
    }
""")
