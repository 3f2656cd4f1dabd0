// Cross-entropy forward: bf16 logits [M, V], int64 targets [M], fp32 loss per row.
//   loss[r] = logsumexp_i(x[r, i]) - x[r, target[r]], and 0 where target[r] == ignore.
// One online pass over the row keeps a running (max, sum of exp) per thread: the logits
// are read once, which is the floor of this op.
//
// Geometry (derived in the spec from the parameters and the vocabulary V):
//   T0    = V / EPT rounded up to a power of two (at least 32): threads that share a row
//   TPR   = min(T0, TMAX)             threads of one block on one row
//   SPLIT = min(8, T0 / TPR)          blocks on one row: a thread-block cluster
//   RPB   = TMAX / TPR (at least 1)   rows per block when a row needs less than a block
//   grid  = ceil(M / RPB) * SPLIT, block = TPR * RPB, cluster = SPLIT
// Blocks of one cluster merge their (max, sum) pairs through distributed shared memory.
//
// Parameters and what they trade:
//   EPT    elements per thread (a target: rows too long for 8 blocks give each thread
//          more). Fewer: more threads (and SMs, through the cluster) on a row, so the
//          4096 rows of a batch fill the GPU sooner; more: fewer pairs to merge.
//   TMAX   the most threads in one block: small blocks pack several per SM.
//   VEC    bf16 elements per access: 8 is one 16-byte load, 4 is 8 bytes. Rows whose length
//          is not a multiple of VEC take a scalar path (decided at compile time).
//   UNROLL vector loads per step of a thread. Steps are software pipelined: the next
//          step's loads are issued before this step's values are folded into the running
//          pair, so 2 * UNROLL accesses can be in flight per thread, against registers.
//   LOAD   "default" or "cs" (evict-first, __ldcs): the logits are read once.
#include <cuda_bf16.h>
#ifndef __CUDACC_RTC__
#include <cassert>  // NVRTC declares assert itself
#endif

#define TPR 256
#define RPB 1
#define SPLIT 2
#define THREADS (TPR * RPB)
#define T (TPR * SPLIT)
#define VEC 8
#define UNROLL 2
#define WORDS (VEC / 2)
#define WPR ((TPR + 31) / 32)
#define NCOLS 128256
#define VEC_OK (NCOLS % VEC == 0)
#define NEG_INF (__int_as_float(0xff800000))
#define L2E 1.4426950408889634f

#if VEC == 8
typedef uint4 Raw;
#else
typedef uint2 Raw;
#endif

struct Pack { unsigned w[WORDS]; };

__device__ __forceinline__ Pack load_pack(const __nv_bfloat16* p) {
  const Raw* r = reinterpret_cast<const Raw*>(p);
  const Raw v = __ldcs(r);
  Pack out;
#if VEC == 8
  out.w[0] = v.x; out.w[1] = v.y; out.w[2] = v.z; out.w[3] = v.w;
#else
  out.w[0] = v.x; out.w[1] = v.y;
#endif
  return out;
}

// bf16 -> fp32 is exact: the bf16 bits are the high half of the fp32 bits.
__device__ __forceinline__ float lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// (max, sum) of an online softmax: merge b into a.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = (m == NEG_INF ? 0.f : s * exp2f((m - mn) * L2E)) + (m2 == NEG_INF ? 0.f : s2 * exp2f((m2 - mn) * L2E));
  m = mn;
}

#if SPLIT > 1
// Cluster barrier: release our shared-memory writes, acquire the other blocks'.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// The same shared variable in block `rank` of this cluster.
__device__ __forceinline__ const float* peer(const float* p, unsigned rank) {
  return static_cast<const float*>(__cluster_map_shared_rank(const_cast<float*>(p), rank));
}
#endif

// Reduce over the TPR threads of a row in this block, then over the SPLIT blocks of the
// cluster. MODE: RMAX reduces m, RSUM reduces s, RPAIR merges online (m, s) pairs. `slot`
// gives every call its own shared-memory area, so no call waits on an earlier one's readers.
#define RMAX 0
#define RSUM 1
#define RPAIR 2
template <int MODE>
__device__ __forceinline__ void join(float& m, float& s, float m2, float s2) {
  if (MODE == RMAX) m = fmaxf(m, m2);
  else if (MODE == RSUM) s += s2;
  else merge(m, s, m2, s2);
}

// Join NW partials (NW a power of two, at most 32): lane l of a warp brings partial l % NW,
// so each group of NW lanes holds them all, and log2(NW) shuffles join them in every lane:
// log2(NW) merges a thread rather than NW - 1 (a merge costs two exponentials).
template <int MODE, int NW>
__device__ __forceinline__ void combine(float& m, float& s, float mp, float sp, bool have) {
  float m2 = have ? mp : (MODE == RSUM ? m : NEG_INF), s2 = have ? sp : 0.f;
#pragma unroll
  for (int o = NW / 2; o > 0; o /= 2)
    join<MODE>(m2, s2, __shfl_xor_sync(0xffffffffu, m2, o), __shfl_xor_sync(0xffffffffu, s2, o));
  if (MODE != RSUM) m = m2;
  if (MODE != RMAX) s = s2;
}

template <int MODE>
__device__ __forceinline__ void row_reduce(float& m, float& s, float* red, float* cl, int slot) {
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o /= 2)
    join<MODE>(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
#if TPR > 32
  const int row = threadIdx.x / TPR, lane = threadIdx.x % 32, warp = (threadIdx.x % TPR) / 32;
  float* r = red + slot * 2 * RPB * WPR + 2 * row * WPR;
  if (lane == 0) { r[2 * warp] = m; r[2 * warp + 1] = s; }
  __syncthreads();
  combine<MODE, WPR>(m, s, r[2 * (lane % WPR)], r[2 * (lane % WPR) + 1], true);
#endif
#if SPLIT > 1
  if (threadIdx.x == 0) { cl[2 * slot] = m; cl[2 * slot + 1] = s; }
  cluster_arrive();
  cluster_wait();
  {
    const int b = threadIdx.x % 32 % SPLIT;
    const float* q = peer(cl + 2 * slot, b);
    combine<MODE, SPLIT>(m, s, q[0], q[1], true);
  }
#endif
}

// UNROLL vectors of the row from column c on, UNROLL * T * VEC apart; -inf past the end.
__device__ __forceinline__ void load_chunk(Pack (&p)[UNROLL], const __nv_bfloat16* xr, int c, bool live) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int cu = c + u * T * VEC;
    if (live && cu < NCOLS) {
      p[u] = load_pack(xr + cu);
    } else {
#pragma unroll
      for (int j = 0; j < WORDS; ++j) p[u].w[j] = 0xff80ff80u;  // two bf16 -inf
    }
  }
}

// Fold a chunk into the running (max, sum): one max per chunk, one exp per element.
// exp2((v - max) * log2e): v - max is exact (both bf16 values), so the exponent is right to
// fp32's rounding whatever the logits' size; v * log2e - round(max * log2e), one FFMA, is off
// by half a unit of max * log2e (4% of the sum at logits near 1e6). -inf padding gives 0.
__device__ __forceinline__ void fold(float& m, float& s, const Pack (&p)[UNROLL]) {
  float vm = NEG_INF;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
#pragma unroll
    for (int j = 0; j < WORDS; ++j) vm = fmaxf(vm, fmaxf(lo(p[u].w[j]), hi(p[u].w[j])));
  const float mn = fmaxf(m, vm), mz = mn == NEG_INF ? 0.f : mn;
  float acc = (m == NEG_INF) ? 0.f : s * exp2f((m - mn) * L2E);
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
#pragma unroll
    for (int j = 0; j < WORDS; ++j)
      { acc += exp2f((lo(p[u].w[j]) - mz) * L2E); acc += exp2f((hi(p[u].w[j]) - mz) * L2E); }
  m = mn;
  s = acc;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
xent_bf16(const __nv_bfloat16* __restrict__ x, const long long* __restrict__ target,
          float* __restrict__ loss, int M, int ignore) {
  __shared__ float red[3 * 2 * RPB * WPR];
  __shared__ float cl[6];
  if (blockDim.x != THREADS) __trap();  // the launch geometry must match what was compiled
#if SPLIT > 1
  const int rank = blockIdx.x % SPLIT;  // 1-D clusters tile the grid in order
  const int row = blockIdx.x / SPLIT;
#else
  const int rank = 0;
  const int row = blockIdx.x * RPB + threadIdx.x / TPR;
#endif
  const int g = rank * TPR + threadIdx.x % TPR;  // this thread's place among the row's T threads
  const bool live = row < M;  // dead rows still take part in the barriers and shuffles
  const __nv_bfloat16* xr = x + (size_t)(live ? row : 0) * NCOLS;
  float m = NEG_INF, s = 0.f;
#if VEC_OK
  // Software pipelined: the next UNROLL loads are in flight while this chunk is folded.
  Pack cur[UNROLL];
  load_chunk(cur, xr, g * VEC, live);
  for (int c0 = g * VEC; live && c0 < NCOLS; c0 += T * VEC * UNROLL) {
    Pack nxt[UNROLL];
    load_chunk(nxt, xr, c0 + T * VEC * UNROLL, live);
    fold(m, s, cur);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) cur[u] = nxt[u];
  }
#else
  for (int c = g * VEC; live && c < NCOLS; c += T * VEC) {
    float v[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = c + j < NCOLS ? __bfloat162float(xr[c + j]) : NEG_INF;
    float vm = v[0];
#pragma unroll
    for (int j = 1; j < VEC; ++j) vm = fmaxf(vm, v[j]);
    const float mn = fmaxf(m, vm), mz = mn == NEG_INF ? 0.f : mn;
    float acc = (m == NEG_INF) ? 0.f : s * exp2f((m - mn) * L2E);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc += exp2f((v[j] - mz) * L2E);  // -inf padding gives 0
    m = mn;
    s = acc;
  }
#endif
  row_reduce<RPAIR>(m, s, red, cl, 0);
  if (live && g == 0) {
    const long long t = target[row];
    float out;
    if (t == (long long)ignore) {
      out = 0.f;
    } else if (t < 0 || t >= NCOLS) {
      // a target out of range: a device-side assert, as torch's nll_loss kernel
      // (CUDA_KERNEL_ASSERT): the launch fails with cudaErrorAssert
      assert(t >= 0 && t < NCOLS);
      out = __int_as_float(0x7fc00000);  // NaN where asserts are compiled out (NDEBUG)
    } else {
      // the max less the target's logit first: both are bf16 values, so the difference is exact
      // in fp32; (m + log s) - x loses the loss to rounding where the logits are large
      out = (m - __bfloat162float(xr[t])) + logf(s);
    }
    loss[row] = out;
  }
#if SPLIT > 1
  cluster_arrive();  // our reads of the peers' pairs are done
  cluster_wait();    // no block leaves while a peer may still read its shared memory
#endif
}
