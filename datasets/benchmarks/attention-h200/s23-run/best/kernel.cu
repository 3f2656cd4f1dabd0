// GQA decode attention (issue 21): one query token per sequence, the context split over
// blocks in splits of a fixed number of tokens (flash-decoding), bf16 in and out, fp32
// softmax and accumulation.
//
// Layout (contiguous, the serving layout):
//   q    bf16  [B, HQ, D]          HQ = HKV * GROUP, D = 128
//   k, v bf16  [B, L, HKV, D]      L the longest context the buffers hold
//   lens int32 [B]                 tokens of sequence b: 1 <= lens[b] <= L (clamped to [0, L])
//   out  bf16  [B, HQ, D]          out[b, h] = softmax(q[b, h] . k[b, :lens[b], h / GROUP]^T / sqrt(D)) v[...]
//   ws   fp32  [B, HKV, WSROW]     workspace: a counter and the splits' partials (below); zero
//                                  before a call, and zero again after it
// Query head h reads KV head h / GROUP (torch's enable_gqa: repeat_interleave).
// B and L are run-time arguments; the template reads neither (only the parameters): one
// binary serves every batch and context length. The kernel reads lens[b] on the device, so a
// captured CUDA graph replays with new lengths.
//
// Geometry (spec: grid = B * HKV * NS, block = NW * 32, NS = ceil(L / SPLIT)):
//   block x = (b * NS + s) * HKV + kvh handles tokens [s * SPLIT, min((s + 1) * SPLIT, lens[b]))
//   of (sequence b, KV head kvh) for the GROUP query heads that share that KV head: their K
//   and V rows are loaded once. The KV heads of one split are neighbours in launch order
//   (their rows are neighbours in memory). Blocks with s >= ns_b = ceil(lens[b] / SPLIT)
//   return at once.
//   Inside a block the split is cut in tiles of TW tokens; warp w takes tiles w, w + NW, ...
//   Each warp streams its tiles through its own ring of STAGES shared-memory stages
//   (cp.async, VEC bytes a copy, no block barrier in the loop) and keeps its own online
//   softmax state. Scores and the weighted sum of V are mma.sync.m16n8k16 (bf16 in, fp32
//   accumulate): the 16 rows of the A operand are the GROUP query heads (the rest zero),
//   S = Q K^T takes K rows as they lie (ldmatrix), O += P V takes V through ldmatrix.trans.
//   P is fp32; it enters the bf16 mma as hi + lo (two mmas, p - hi(p) in the second), so the
//   weights keep about 16 bits: no narrower math than fp32 where the output is bf16.
//
// Combine, in one launch (last block combines, fixed order):
//   1. the NW warps of a block merge their (max, sum, acc) in warp order through shared memory;
//   2. a sequence with one split (ns_b == 1) writes out[] directly and never touches ws;
//   3. otherwise the block writes its partial (acc[D], m, l) per query head to the record
//      (b, kvh, s, h) of ws, fences, and takes a ticket from the counter of (b, kvh) (atomicAdd).
//      The block that draws ns_b - 1 is the last: it reads the ns_b records and combines them in
//      the order s = 0, 1, ..., ns_b - 1 (never the order the blocks finished), writes out[],
//      writes zeros over the records it read and sets the counter back to 0.
//   A sequence's output is then a function of its own q, k, v, lens[b] and the parameters: not
//   of B, of the other sequences, of the grid or of how many SMs were free (the deterministic
//   mode of issue 21, as long as the dispatch picks the configuration by context alone).
//   WAVES > 0 gives that up for whole waves: the launch sizes the splits from B and L (the
//   spec's NS), so a split's tokens (SPLIT above: a multiple of 128, worked out again from
//   gridDim) depend on the batch, and the judge records such kernels as not batch invariant.
// Workspace, per (b, kvh), WSROW = 4 + min(ceil(L / 128), MAXS) * GROUP * 132 floats:
//   [0]                the counter (an int in a float's bits: 0 is 0.0f)
//   [1..3]             unused (records start 16-byte aligned)
//   [4 + (s * GROUP + h) * 132 ...]  acc[0..127], m (log2 domain), l, 2 unused
// SPLIT >= 128, so ceil(L / SPLIT) <= ceil(L / 128); ns_b <= MAXS (the spec's serves).
//
// Parameters:
//   WAVES   0: SPLIT tokens a split, whatever the batch; 1, 2, 4: the splits sized at the launch
//           so that the grid fills about that many whole waves (one wave: 132 SMs times the
//           blocks an SM holds), each a multiple of 128 tokens (SPLIT is then unused)
//   SPLIT   tokens of a split (a power of two, 128 .. 8192): the grid's size and the combine's
//   NW      warps of a block (2, 4, 8)
//   TW      tokens of a warp's tile (16, 32; 64 spilled): a stage holds TW K rows and TW V rows
//   STAGES  cp.async stages of a warp's ring (2, 3, 4): STAGES - 1 tiles in flight a warp
//   VEC     bytes of one cp.async (16: cp.async.cg, 8: cp.async.ca)
//   BULK    1: each row a bulk copy (cp.async.bulk, the TMA engine, 256 bytes, one lane a
//           row), completion on an mbarrier a stage; 0: cp.async copies of VEC bytes
//   HKV, GROUP  the heads (8 and 4 for 32/8, 8 and 8 for 64/8): compiled in
#include <cuda_bf16.h>

#define HKV 8
#define GROUP 4
#define SPLIT 512
#define NW 4
#define TW 16
#define STAGES 4
#define VEC 16
#define BULK 0
#define WAVES 0

#define D 128
#define HQ (HKV * GROUP)
#define THREADS (NW * 32)
#define MAXS 128                      // splits of a sequence at most (the spec's serves)
#define REC 132                       // floats of a record: acc[128], m, l, 2 unused
#define ROWB (D * 2 + 16)             // bytes of a K or V row in shared memory: padded by 16
#define STAGEB (2 * TW * ROWB)        // a stage: TW K rows, then TW V rows
#define RINGB (NW * STAGES * STAGEB)  // the warps' rings
#define CPR (D * 2 / VEC)             // copies of a row
#define NEG_INF (__int_as_float(0xff800000))
// 1 / sqrt(128) * log2(e): scores in the log2 domain, so that exp is exp2
#define SCALE_LOG2 0.12751743074834470f

static_assert(GROUP >= 1 && GROUP <= 8, "the query heads of a group are rows 0..7 of the mma");
static_assert(TW % 16 == 0, "a tile is whole 16-token k-steps of P V");
static_assert(RINGB >= 2 * GROUP * MAXS * 4, "the combine's m and l of every split fit where the rings were");
static_assert(VEC == 8 || VEC == 16, "cp.async of 8 or 16 bytes");
static_assert((2 * TW * CPR) % 32 == 0, "a stage's copies are whole warps' worth");


__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// One copy of VEC bytes into shared memory; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, bool valid) {
  const int n = valid ? VEC : 0;
#if VEC == 16
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
#endif
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// The bulk path: an mbarrier a stage of a warp's ring (count 1: lane 0 arrives with the bytes
// expected), one cp.async.bulk a K or V row, waited on by parity.
__device__ __forceinline__ void mbar_init(unsigned bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_row(unsigned dst, const void* src, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "n"(D * 2), "r"(bar) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// d[0..1] += A B for the rows g = lane / 4 of a m16n8k16 tile whose rows g + 8 are zero:
// A's registers 1 and 3 (rows g + 8) are 0, and the outputs of rows g + 8 are dropped.
__device__ __forceinline__ void mma_top(float& d0, float& d1, unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
  float x2, x3;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %10, %11, %12, %13 };\n"
               : "=f"(d0), "=f"(d1), "=f"(x2), "=f"(x3)
               : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1),
                 "f"(d0), "f"(d1), "f"(0.f), "f"(0.f));
}

// Two floats as a bf16 pair (lo in the low half), rounded to nearest.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}
// p = hi + lo, each a bf16 pair: hi = bf16(p), lo = bf16(p - hi) (exact subtraction in fp32).
__device__ __forceinline__ void split_bf16(float p0, float p1, unsigned& hi, unsigned& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(p0, p1);
  hi = *reinterpret_cast<const unsigned*>(&h);
  const float2 hf = __bfloat1622float2(h);
  lo = pack_bf16(p0 - hf.x, p1 - hf.y);
}

// The copies of tile j (tokens t0 .. t0 + TW - 1 of the split) into a stage: row r's K then
// V, CPR copies each; tokens at or past `end` are zero-filled (nothing read).
__device__ __forceinline__ void load_tile(unsigned stage, const char* kb, const char* vb, int t0, int end, int lane) {
#pragma unroll
  for (int u = 0; u < 2 * TW * CPR / 32; ++u) {
    const int q = u * 32 + lane;                 // copy index in the stage
    const int r = (q / CPR) % TW;                // token row
    const int isv = q / (CPR * TW);              // 0: K, 1: V (whole warps: TW * CPR % 32 == 0)
    const int c = q % CPR;                       // copy in the row
    const int t = t0 + r;
    const bool ok = t < end;
    const char* src = (isv ? vb : kb) + (long long)(ok ? t : 0) * (HKV * D * 2) + c * VEC;
    cp_async(stage + (isv * TW + r) * ROWB + c * VEC, src, ok);
  }
}

// The same tile by bulk copies: rows t0 .. end - 1 copied (lane r its K and V row r), the bytes
// expected on the stage's barrier first; V rows at or past `end` written as zeros (their P is
// 0, and 0 times what the smem held could be NaN). The caller waits on the barrier.
__device__ __forceinline__ void load_tile_bulk(unsigned stage, unsigned bar, const char* kb, const char* vb, int t0,
                                               int end, int lane) {
  const int n = min(TW, end - t0);  // >= 1: a tile starts before the end
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the generic reads of this stage before
  if (lane == 0) mbar_expect(bar, (unsigned)n * 2 * D * 2);
  __syncwarp();
  for (int r = lane; r < n; r += 32) {
    bulk_row(stage + r * ROWB, kb + (long long)(t0 + r) * (HKV * D * 2), bar);
    bulk_row(stage + (TW + r) * ROWB, vb + (long long)(t0 + r) * (HKV * D * 2), bar);
  }
  for (int o = lane; o < (TW - n) * (D * 2 / 16); o += 32)
    asm volatile("st.shared.v4.u32 [%0], { %1, %1, %1, %1 };\n"
                 ::"r"(stage + (TW + n + o / (D * 2 / 16)) * ROWB + (o % (D * 2 / 16)) * 16), "r"(0u) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS)
decode_attn_bf16(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                 const __nv_bfloat16* __restrict__ v, const int* __restrict__ lens,
                 __nv_bfloat16* __restrict__ out, float* __restrict__ ws, int B, int L) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int s_last;
  if (blockDim.x != THREADS) __trap();  // the geometry compiled in
#if WAVES
  // the splits sized at the launch (the spec's NS: as many as fill about WAVES whole waves of
  // blocks); a split's tokens, a multiple of 128, worked out again from the grid it launched
  const int ns_all = gridDim.x / (B * HKV);
  const int split = ((L + ns_all - 1) / ns_all + 127) / 128 * 128;
#else
  const int split = SPLIT;
  const int ns_all = (L + SPLIT - 1) / SPLIT;
#endif
  const int kvh = blockIdx.x % HKV;
  const int s = (blockIdx.x / HKV) % ns_all;
  const int b = blockIdx.x / (HKV * ns_all);
  if (b >= B) return;
  const int len = min(max(lens[b], 0), L);
  const int ns = (len + split - 1) / split;  // this sequence's splits
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;  // mma fragment row (query head) and column pair
  if (len == 0) {  // no context: zeros (the domain has lens >= 1)
    if (s == 0)
      for (int o = tid; o < GROUP * D; o += THREADS)
        out[((long long)b * HQ + kvh * GROUP) * D + o] = __float2bfloat16_rn(0.f);
    return;
  }
  if (s >= ns) return;

  const int tok0 = s * split;
  const int end = min(tok0 + split, len);
  const int ntiles = (end - tok0 + TW - 1) / TW;
  const int nmine = ntiles > w ? (ntiles - w + NW - 1) / NW : 0;  // tiles w, w + NW, ...
  const long long kv0 = ((long long)b * L * HKV + kvh) * D * 2;   // bytes to (b, token 0, kvh)
  const char* kb = reinterpret_cast<const char*>(k) + kv0;
  const char* vb = reinterpret_cast<const char*>(v) + kv0;
  const unsigned ring = smem_u32(smem) + w * (STAGES * STAGEB);
#if BULK
  __shared__ __align__(8) unsigned long long bars[NW * STAGES];
  const unsigned bar0 = smem_u32(bars + w * STAGES);  // stage j's barrier: bar0 + 8 j
  if (lane == 0)
    for (int j = 0; j < STAGES; ++j) mbar_init(bar0 + 8 * j);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncwarp();
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i)
    if (i < nmine) load_tile_bulk(ring + i * STAGEB, bar0 + 8 * i, kb, vb, tok0 + (w + i * NW) * TW, end, lane);
#else
  // The first STAGES - 1 tiles in flight (one commit group a tile, empty past the last).
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < nmine) load_tile(ring + i * STAGEB, kb, vb, tok0 + (w + i * NW) * TW, end, lane);
    cp_commit();
  }
#endif

  // Q as the A operand: rows g < GROUP are query heads kvh * GROUP + g, the rest zero.
  // qa[kk][0] = Q[g][16 kk + 2 t4 ..], qa[kk][1] = Q[g][16 kk + 8 + 2 t4 ..]
  unsigned qa[D / 16][2];
  {
    const unsigned* qr = reinterpret_cast<const unsigned*>(q + ((long long)b * HQ + kvh * GROUP + (g < GROUP ? g : 0)) * D);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qa[kk][0] = g < GROUP ? qr[kk * 8 + t4] : 0u;
      qa[kk][1] = g < GROUP ? qr[kk * 8 + 4 + t4] : 0u;
    }
  }

  // Online softmax state of row g (the quad's four lanes hold the same m; l is the lane's
  // share until the end), acc[j][e] = O[g][8 j + 2 t4 + e].
  float m = NEG_INF, l = 0.f;
  float acc[D / 8][2];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = 0.f;

  for (int i = 0; i < nmine; ++i) {
    {  // refill: tile i + STAGES - 1 into the stage tile i - 1 left (read before the last __syncwarp)
      const int ia = i + STAGES - 1;
#if BULK
      if (ia < nmine)
        load_tile_bulk(ring + (ia % STAGES) * STAGEB, bar0 + 8 * (ia % STAGES), kb, vb, tok0 + (w + ia * NW) * TW, end,
                       lane);
    }
    mbar_wait(bar0 + 8 * (i % STAGES), (i / STAGES) & 1);  // tile i has landed (the barrier's phase i / STAGES)
    __syncwarp();  // and the zeros of its V rows past the end
#else
      if (ia < nmine) load_tile(ring + (ia % STAGES) * STAGEB, kb, vb, tok0 + (w + ia * NW) * TW, end, lane);
      cp_commit();
    }
    cp_wait<STAGES - 1>();  // tile i has landed (this lane's copies) ...
    __syncwarp();           // ... and every lane's
#endif
    const unsigned kst = ring + (i % STAGES) * STAGEB, vst = kst + TW * ROWB;
    const int t0 = tok0 + (w + i * NW) * TW;

    // S = Q K^T: sc[n][e] = score of row g, token t0 + 8 n + 2 t4 + e
    float sc[TW / 8][2];
#pragma unroll
    for (int n = 0; n < TW / 8; ++n) {
      sc[n][0] = sc[n][1] = 0.f;
#pragma unroll
      for (int p = 0; p < D / 32; ++p) {  // four 16-byte chunks (two k-steps) a ldmatrix.x4
        unsigned r0, r1, r2, r3;
        ldsm_x4(kst + (n * 8 + (lane & 7)) * ROWB + (4 * p + (lane >> 3)) * 16, r0, r1, r2, r3);
        mma_top(sc[n][0], sc[n][1], qa[2 * p][0], qa[2 * p][1], r0, r1);
        mma_top(sc[n][0], sc[n][1], qa[2 * p + 1][0], qa[2 * p + 1][1], r2, r3);
      }
    }
    // scale, mask past the end, the tile's max of row g over the quad
    float mx = NEG_INF;
#pragma unroll
    for (int n = 0; n < TW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = t0 + n * 8 + 2 * t4 + e;
        sc[n][e] = t < end ? sc[n][e] * SCALE_LOG2 : NEG_INF;
        mx = fmaxf(mx, sc[n][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // a tile starts before `end`, so every tile has a finite score in every row
    const float mn = fmaxf(m, mx);
    const float alpha = exp2f(m - mn);  // 0 on the first tile (m = -inf)
    m = mn;
    float ps = 0.f;
#pragma unroll
    for (int n = 0; n < TW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[n][e] = exp2f(sc[n][e] - mn);  // 0 past the end
        ps += sc[n][e];
      }
    l = l * alpha + ps;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      acc[j][0] *= alpha;
      acc[j][1] *= alpha;
    }
    // O += P V, P as hi + lo bf16: A's columns are tokens, 16 a k-step
#pragma unroll
    for (int kt = 0; kt < TW / 16; ++kt) {
      unsigned ph0, pl0, ph2, pl2;  // A registers 0 (tokens 2 t4 ..) and 2 (tokens 8 + 2 t4 ..)
      split_bf16(sc[2 * kt][0], sc[2 * kt][1], ph0, pl0);
      split_bf16(sc[2 * kt + 1][0], sc[2 * kt + 1][1], ph2, pl2);
#pragma unroll
      for (int jj = 0; jj < D / 16; ++jj) {  // two 8-dim n-tiles a ldmatrix.x4.trans
        unsigned r0, r1, r2, r3;
        ldsm_x4_t(vst + (kt * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ROWB + (2 * jj + (lane >> 4)) * 16,
                  r0, r1, r2, r3);
        mma_top(acc[2 * jj][0], acc[2 * jj][1], ph0, ph2, r0, r1);
        mma_top(acc[2 * jj][0], acc[2 * jj][1], pl0, pl2, r0, r1);
        mma_top(acc[2 * jj + 1][0], acc[2 * jj + 1][1], ph0, ph2, r2, r3);
        mma_top(acc[2 * jj + 1][0], acc[2 * jj + 1][1], pl0, pl2, r2, r3);
      }
    }
    __syncwarp();  // every lane has read this stage before it is refilled
  }
#if !BULK
  cp_wait<0>();
#endif
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // 1. the warps' states through shared memory (the rings are free now), merged in warp order
  __syncthreads();
  float* wst = reinterpret_cast<float*>(smem);  // [NW][GROUP][REC]
  if (g < GROUP) {
    float* r = wst + (w * GROUP + g) * REC;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      r[8 * j + 2 * t4] = acc[j][0];
      r[8 * j + 2 * t4 + 1] = acc[j][1];
    }
    if (t4 == 0) {
      r[D] = m;  // -inf and l = 0 for a warp without tiles: weight 0 below
      r[D + 1] = l;
    }
  }
  __syncthreads();
  float* wsrow = ws + ((long long)b * HKV + kvh) * (4 + (long long)min((L + 127) / 128, MAXS) * GROUP * REC);
  for (int o = tid; o < GROUP * D; o += THREADS) {
    const int h = o / D, d = o % D;
    float mm = NEG_INF;
#pragma unroll
    for (int x = 0; x < NW; ++x) mm = fmaxf(mm, wst[(x * GROUP + h) * REC + D]);
    float ll = 0.f, a = 0.f;
#pragma unroll
    for (int x = 0; x < NW; ++x) {
      const float* r = wst + (x * GROUP + h) * REC;
      const float f = exp2f(r[D] - mm);  // warp 0 always has a tile: mm is finite
      ll += r[D + 1] * f;
      a += r[d] * f;
    }
    if (ns == 1) {  // 2. one split: the answer
      out[((long long)b * HQ + kvh * GROUP + h) * D + d] = __float2bfloat16_rn(a / ll);
    } else {  // 3. this split's record
      float* rec = wsrow + 4 + (s * GROUP + h) * REC;
      rec[d] = a;
      if (d == 0) {
        rec[D] = mm;
        rec[D + 1] = ll;
      }
    }
  }
  if (ns == 1) return;

  // the ticket: the last of the ns blocks of (b, kvh) combines
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(reinterpret_cast<int*>(wsrow), 1) == ns - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // the other blocks' records, fenced before their tickets, are visible

  // The splits' m and l in shared memory (every record at once), then a warp a head turns
  // them into weights wgt[h][x] = exp2(m_x - M_h) / L_h: lane-strided partials and a fixed
  // butterfly, so the order of the sums depends on ns alone (deterministic). Then each
  // output is the sum over the splits in order x = 0, 1, ..., 8 records' loads in flight.
  float* wgt = reinterpret_cast<float*>(smem);  // [GROUP][MAXS]: m_x, then the weights
  float* lsm = wgt + GROUP * MAXS;              // [GROUP][MAXS]: l_x
  for (int o = tid; o < GROUP * ns; o += THREADS) {
    const int h = o / ns, x = o % ns;
    const float* rec = wsrow + 4 + (x * GROUP + h) * REC;
    wgt[h * MAXS + x] = __ldcg(rec + D);
    lsm[h * MAXS + x] = __ldcg(rec + D + 1);
  }
  __syncthreads();
  for (int h = w; h < GROUP; h += NW) {
    float* mh = wgt + h * MAXS;
    const float* lh = lsm + h * MAXS;
    float mm = NEG_INF;
    for (int x = lane; x < ns; x += 32) mm = fmaxf(mm, mh[x]);
#pragma unroll
    for (int o = 16; o; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    float ll = 0.f;
    for (int x = lane; x < ns; x += 32) ll += lh[x] * exp2f(mh[x] - mm);
#pragma unroll
    for (int o = 16; o; o >>= 1) ll += __shfl_xor_sync(0xffffffffu, ll, o);
    const float inv = 1.f / ll;
    for (int x = lane; x < ns; x += 32) mh[x] = exp2f(mh[x] - mm) * inv;  // a lane rewrites its own x
  }
  __syncthreads();
  for (int o = tid; o < GROUP * D; o += THREADS) {
    const int h = o / D, d = o % D;
    const float* r = wsrow + 4 + h * REC + d;
    const float* wh = wgt + h * MAXS;
    float a = 0.f;
#pragma unroll 8
    for (int x = 0; x < ns; ++x) a += __ldcg(r + x * (GROUP * REC)) * wh[x];
    out[((long long)b * HQ + kvh * GROUP + h) * D + d] = __float2bfloat16_rn(a);
  }
  __syncthreads();  // every record read (and m, l above) before the zeros
  for (int o = tid; o < ns * GROUP * REC; o += THREADS) wsrow[4 + o] = 0.f;  // zero again
  if (tid == 0) wsrow[0] = 0.f;  // the counter back to 0 for the next call (or graph replay)
}
