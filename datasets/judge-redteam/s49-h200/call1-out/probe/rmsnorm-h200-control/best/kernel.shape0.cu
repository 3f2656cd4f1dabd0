// RMSNorm over rows: bf16 x times a bf16 weight, fp32 math, bf16 out.
//   y[r, i] = x[r, i] * rsqrt(mean_i(x[r, i]^2) + eps) * w[i]
//
// Geometry (derived in the spec from the parameters and the row length N):
//   T0    = N / EPT rounded up to a power of two (at least 32): threads that share a row
//   TPR   = min(T0, TMAX)             threads of one block on one row
//   SPLIT = min(8, T0 / TPR)          blocks on one row: a thread-block cluster
//   RPB   = TMAX / TPR (at least 1)   rows per block when a row needs less than a block
//   grid  = ceil(M / RPB) * SPLIT, block = TPR * RPB, cluster = SPLIT
// Blocks of one cluster add their partial sums of squares through distributed shared
// memory, so a long row is spread over several SMs and stays in registers.
//
// Parameters and what they trade:
//   EPT    elements per thread (a target: rows too long for 8 blocks give each thread
//          more). More: more 16-byte loads in flight per thread, cheaper reductions;
//          fewer: more threads and more rows in flight.
//   TMAX   the most threads in one block. Small blocks pack several per SM and overlap
//          one block's reduction with another's loads; 1024 keeps long rows in fewer blocks.
//   VEC    bf16 elements per access: 8 is one 16-byte load, 4 is 8 bytes. Rows whose length
//          is not a multiple of VEC take a scalar path (decided at compile time).
//   HOLD   what stays in registers between the sum of squares and the scaling:
//          "f32"  the row as floats (one read of x; most registers);
//          "bf16" the raw bf16 words (one read of x, half the registers, unpacked twice);
//          "none" nothing: the scaling pass reads x again, from L2: the first read asks L2
//                 to keep the row (evict_last), the second marks it last use (evict_first);
//                 both passes keep 4 vector loads per thread in flight.
//          "ring" a persistent grid (as many clusters as fit at once; each takes every
//                 G-th group of RPB rows): every thread copies its own part of the rows
//                 ahead into a shared-memory ring of NP pieces (cp.async, one commit group
//                 a piece; a row group is SUBR pieces of PV vectors a thread, one piece when
//                 it fits 64 KiB / MINB, else 32 KiB pieces), and refills a piece as soon as
//                 its output is stored, so the loads of the rows ahead run through this
//                 row's reduction, barriers and stores. A thread reads back only what it
//                 copied: the ring needs no barrier of its own. The weight stays in
//                 registers for the whole kernel. Needs N % VEC == 0 and more pieces than
//                 a row group (the spec's RING); otherwise the grid is not persistent and
//                 "ring" takes "bf16".
//          A hold that would not fit the block's register file falls back to "none".
//   MINB   blocks per SM the register allocation must allow (1, 2, 4; capped so a thread
//          keeps 64 registers): more blocks overlap one block's reduction and barriers with
//          another's loads, at the price of registers for the held row.
//   LOAD   "default" or "cs" (evict-first, __ldcs) for x: it is read once, and keeping it
//          out of the caches leaves them to the weight, which every row reuses.
//   STORE  "default" or "cs" (streaming store, __stcs) for y.
#include <cuda_bf16.h>

#define TPR 64
#define RPB 16
#define SPLIT 1
#define THREADS (TPR * RPB)
#define T (TPR * SPLIT)
#define VEC 8
#define WORDS (VEC / 2)
#define WPR ((TPR + 31) / 32)
#define NCOLS 4096
#define VEC_OK (NCOLS % VEC == 0)
#define ITEMS ((NCOLS + T * VEC - 1) / (T * VEC))
// Registers a thread may spend on the held row (the rest go to addresses and loop state).
// Blocks per SM the compiler must leave room for (MINB), capped so that a thread keeps at
// least 64 registers; each thread's register cap follows from it.
#define MINB_WANT 1
#define MINB_EFF (MINB_WANT < 1024 / THREADS ? MINB_WANT : (1024 / THREADS > 0 ? 1024 / THREADS : 1))
#define REG_CAP (65536 / (THREADS * MINB_EFF) < 255 ? 65536 / (THREADS * MINB_EFF) : 255)
#define REG_BUDGET (REG_CAP - 40)
#define RING 1
#define PV 2
#define SUBR 4
#define NP 7
#define HOLD_F32 (0 && ITEMS * VEC <= REG_BUDGET)
#define HOLD_BF16 (1 && !HOLD_F32 && ITEMS * WORDS <= REG_BUDGET)

#if VEC == 8
typedef uint4 Raw;
#else
typedef uint2 Raw;
#endif

struct Pack { unsigned w[WORDS]; };

__device__ __forceinline__ Pack unpack(const Raw v) {
  Pack out;
#if VEC == 8
  out.w[0] = v.x; out.w[1] = v.y; out.w[2] = v.z; out.w[3] = v.w;
#else
  out.w[0] = v.x; out.w[1] = v.y;
#endif
  return out;
}

__device__ __forceinline__ Pack load_x(const __nv_bfloat16* p) {
  const Raw* r = reinterpret_cast<const Raw*>(p);
  return unpack(*r);
}

// x with an L2 eviction priority (a createpolicy cache hint), for the two reads of the
// streaming path: PRI 0 (the first read) evict_last, so that the row is still in L2 when the
// second read (PRI 1, evict_first: its last use) comes; LOAD "cs" reads evict-first both times.
template <int PRI>
__device__ __forceinline__ Pack load_twice(const __nv_bfloat16* p) {
  unsigned long long pol;
  if (PRI == 0) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  else asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  Raw v;
#if VEC == 8
  asm volatile("ld.global.L2::cache_hint.v4.u32 { %0, %1, %2, %3 }, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
#else
  asm volatile("ld.global.L2::cache_hint.v2.u32 { %0, %1 }, [%2], %3;" : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(pol));
#endif
  return unpack(v);
}

__device__ __forceinline__ Pack load_w(const __nv_bfloat16* p) {  // reused by every row: cached load
  return unpack(__ldg(reinterpret_cast<const Raw*>(p)));
}

__device__ __forceinline__ void store_y(__nv_bfloat16* p, const Pack& q) {
  Raw v;
#if VEC == 8
  v.x = q.w[0]; v.y = q.w[1]; v.z = q.w[2]; v.w = q.w[3];
#else
  v.x = q.w[0]; v.y = q.w[1];
#endif
  *reinterpret_cast<Raw*>(p) = v;
}

// bf16 -> fp32 is exact: the bf16 bits are the high half of the fp32 bits.
__device__ __forceinline__ float lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ unsigned pack2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}
// The held bf16 words, read afresh: an opaque move stops the compiler from keeping the
// unpacked floats of the first loop alive (that would cost the registers HOLD="bf16" saves).
__device__ __forceinline__ unsigned fresh(unsigned w) {
  asm volatile("mov.b32 %0, %0;" : "+r"(w));
  return w;
}

#if SPLIT > 1
// Cluster barrier: release our shared-memory writes, acquire the other blocks'.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
#endif

// The sum of NW partials (NW a power of two, at most 32): lane l of a warp brings partial
// l % NW, so each group of NW lanes holds them all, and log2(NW) shuffles add them in every
// lane (one shared or remote load a thread rather than NW).
template <int NW>
__device__ __forceinline__ float combine(float p) {
#pragma unroll
  for (int o = NW / 2; o > 0; o /= 2) p += __shfl_xor_sync(0xffffffffu, p, o);
  return p;
}

// The sum over the TPR threads of a row in this block, then over the SPLIT blocks of the cluster.
__device__ __forceinline__ float row_sum(float v, float* red, float* cl) {
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
#if TPR > 32
  const int row = threadIdx.x / TPR, lane = threadIdx.x % 32, warp = (threadIdx.x % TPR) / 32;
  if (lane == 0) red[row * WPR + warp] = v;
  __syncthreads();
  v = combine<WPR>(red[row * WPR + lane % WPR]);
#endif
#if SPLIT > 1
  if (threadIdx.x == 0) cl[0] = v;
  cluster_arrive();
  cluster_wait();
  v = combine<SPLIT>(*static_cast<const float*>(__cluster_map_shared_rank(cl, threadIdx.x % 32 % SPLIT)));
#endif
  return v;
}

#if RING
// cp.async of one vector of x into this thread's place in the ring; n = 0 writes zeros
// (padding, rows past M). 16 bytes bypass L1 (.cg); 8 bytes must go through it (.ca).
__device__ __forceinline__ void copy_x(Raw* dst, const __nv_bfloat16* src, int n, unsigned long long pol) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
#if VEC == 8
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(src), "r"(n) : "memory");
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"(d), "l"(src), "r"(n) : "memory");
#endif
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most NP - SUBR groups of this thread are still in flight: the SUBR oldest
// (the row group about to be used) have landed.
__device__ __forceinline__ void wait_ring() { asm volatile("cp.async.wait_group %0;" :: "n"(NP - SUBR) : "memory"); }
#endif

// The streaming ("none") path keeps UNR vector loads of x per thread in flight.
#define UNR 4

// UNR vectors of the row from column c on, T * VEC apart; zeros past the end.
template <int PRI>
__device__ __forceinline__ void load_chunk(Pack (&p)[UNR], const __nv_bfloat16* xr, int c) {
#pragma unroll
  for (int u = 0; u < UNR; ++u) {
    const int cu = c + u * T * VEC;
    if (cu < NCOLS) {
      p[u] = load_twice<PRI>(xr + cu);
    } else {
#pragma unroll
      for (int j = 0; j < WORDS; ++j) p[u].w[j] = 0u;
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, MINB_EFF)
rmsnorm_bf16(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
             __nv_bfloat16* __restrict__ y, int M, float eps) {
  if (blockDim.x != THREADS) __trap();  // the launch geometry must match what was compiled
#if RING
  // Reductions alternate between two sets of slots (by row-group parity): a warp may write
  // the next group's partials while a slower one still reads this group's.
  __shared__ float red[2 * RPB * WPR];
  __shared__ float cl[2];
  extern __shared__ __align__(16) unsigned char dyn[];
  Raw* ring = reinterpret_cast<Raw*>(dyn);  // [NP][PV][THREADS] vectors: a warp's are contiguous
  const int G = gridDim.x / SPLIT;          // clusters in the grid
  const int cid = blockIdx.x / SPLIT;       // 1-D clusters tile the grid in order
  const int rank = blockIdx.x % SPLIT;
  const int units = (M + RPB - 1) / RPB;    // groups of RPB rows
  const int mine = cid < units ? (units - 1 - cid) / G + 1 : 0;  // the same in every block of a cluster
  const int sub = threadIdx.x / TPR;
  const int g = rank * TPR + threadIdx.x % TPR;
  unsigned long long pol = 0;
  // This thread's columns are the same in every row: its weights stay in registers.
#define WHOLD (ITEMS * WORDS <= 64)
#if WHOLD
  Pack wr[ITEMS];
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int c = (it * T + g) * VEC;
    if (c < NCOLS) {
      wr[it] = load_w(w + c);
    } else {
#pragma unroll
      for (int j = 0; j < WORDS; ++j) wr[it].w[j] = 0u;
    }
  }
#endif
  // Piece q of this cluster's stream (row group q / SUBR, its vectors from (q % SUBR) * PV on)
  // into slot q % NP.
  const int pieces = mine * SUBR;
  auto fill = [&](int q) {
    const int k = q / SUBR, h = q % SUBR;
    const int row = (cid + k * G) * RPB + sub;
    const __nv_bfloat16* xr = x + (size_t)(row < M ? row : 0) * NCOLS;
    Raw* sl = ring + (size_t)(q % NP) * PV * THREADS + threadIdx.x;
#pragma unroll
    for (int v = 0; v < PV; ++v) {
      const int c = ((h * PV + v) * T + g) * VEC;
      const bool ok = row < M && c < NCOLS;
      if (h * PV + v < ITEMS) copy_x(sl + v * THREADS, ok ? xr + c : x, ok ? VEC * 2 : 0, pol);
    }
  };
#pragma unroll 1
  for (int q = 0; q < NP; ++q) {
    if (q < pieces) fill(q);
    commit();  // a group, empty or not, for every piece: the waits count groups
  }
#pragma unroll 1
  for (int k = 0; k < mine; ++k) {
    wait_ring();  // this row group's SUBR pieces have landed; NP - SUBR more are in flight
    const int q0 = k * SUBR;
    const int row = (cid + k * G) * RPB + sub;
    float ss = 0.f;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const Pack p = unpack(ring[((size_t)((q0 + it / PV) % NP) * PV + it % PV) * THREADS + threadIdx.x]);
#pragma unroll
      for (int j = 0; j < WORDS; ++j) { const float a = lo(p.w[j]), b = hi(p.w[j]); ss = fmaf(a, a, fmaf(b, b, ss)); }
    }
    const float scale = rsqrtf(row_sum(ss, red + (k & 1) * RPB * WPR, cl + (k & 1)) / (float)NCOLS + eps);
    __nv_bfloat16* yr = y + (size_t)(row < M ? row : 0) * NCOLS;
#pragma unroll
    for (int h = 0; h < SUBR; ++h) {
#pragma unroll
      for (int v = 0; v < PV; ++v) {
        const int it = h * PV + v;
        const int c = (it * T + g) * VEC;
        if (it >= ITEMS || c >= NCOLS || row >= M) continue;
        const Pack p = unpack(ring[((size_t)((q0 + h) % NP) * PV + v) * THREADS + threadIdx.x]);
#if WHOLD
        const Pack wp = wr[it];
#else
        const Pack wp = load_w(w + c);
#endif
        Pack o;
#pragma unroll
        for (int j = 0; j < WORDS; ++j)
          o.w[j] = pack2(lo(p.w[j]) * scale * lo(wp.w[j]), hi(p.w[j]) * scale * hi(wp.w[j]));
        store_y(yr + c, o);
      }
      // This piece's slot is free (the stores just issued consumed its values; the sum pass
      // read it before the reduction): refill it with the piece NP further on.
      if (q0 + h + NP < pieces) fill(q0 + h + NP);
      commit();
    }
  }
#if SPLIT > 1
  cluster_arrive();  // no block leaves while a peer may still read its shared memory
  cluster_wait();
#endif
#else
  __shared__ float red[RPB * WPR];
  __shared__ float cl[1];
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
  __nv_bfloat16* yr = y + (size_t)(live ? row : 0) * NCOLS;
  float ss = 0.f;
#if HOLD_F32 || HOLD_BF16
#if HOLD_F32
  float r[ITEMS * VEC];
#else
  unsigned r[ITEMS * WORDS];
#endif
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int c = (it * T + g) * VEC;
    Pack p;
#if VEC_OK
    if (live && c < NCOLS) {
      p = load_x(xr + c);
    } else {
#pragma unroll
      for (int j = 0; j < WORDS; ++j) p.w[j] = 0u;
    }
#else
#pragma unroll
    for (int j = 0; j < WORDS; ++j) {
      const unsigned short a = (live && c + 2 * j < NCOLS) ? __bfloat16_as_ushort(xr[c + 2 * j]) : 0;
      const unsigned short b = (live && c + 2 * j + 1 < NCOLS) ? __bfloat16_as_ushort(xr[c + 2 * j + 1]) : 0;
      p.w[j] = (unsigned)a | ((unsigned)b << 16);
    }
#endif
#pragma unroll
    for (int j = 0; j < WORDS; ++j) {
#if HOLD_F32
      r[it * VEC + 2 * j] = lo(p.w[j]);
      r[it * VEC + 2 * j + 1] = hi(p.w[j]);
#else
      r[it * WORDS + j] = p.w[j];
#endif
    }
  }
#if HOLD_F32
#pragma unroll
  for (int k = 0; k < ITEMS * VEC; ++k) ss = fmaf(r[k], r[k], ss);
#else
#pragma unroll
  for (int k = 0; k < ITEMS * WORDS; ++k) { const float a = lo(r[k]), b = hi(r[k]); ss = fmaf(a, a, fmaf(b, b, ss)); }
#endif
#else  // no hold: the scaling pass reads x again
#if VEC_OK
  for (int c0 = g * VEC; live && c0 < NCOLS; c0 += T * VEC * UNR) {
    Pack p[UNR];
    load_chunk<0>(p, xr, c0);  // UNR loads in flight before the first use
#pragma unroll
    for (int u = 0; u < UNR; ++u)
#pragma unroll
      for (int j = 0; j < WORDS; ++j) { const float a = lo(p[u].w[j]), b = hi(p[u].w[j]); ss = fmaf(a, a, fmaf(b, b, ss)); }
  }
#else
  for (int c = g * VEC; live && c < NCOLS; c += T * VEC) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) if (c + j < NCOLS) { const float a = __bfloat162float(xr[c + j]); ss = fmaf(a, a, ss); }
  }
#endif
#endif
  const float scale = rsqrtf(row_sum(ss, red, cl) / (float)NCOLS + eps);
#if SPLIT > 1
  cluster_arrive();  // our reads of the peers' sums are done; the matching wait is at the end
#endif
  if (live) {
#if HOLD_F32 || HOLD_BF16
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int c = (it * T + g) * VEC;
      if (c >= NCOLS) continue;
#if VEC_OK
      const Pack wp = load_w(w + c);
#else
      Pack wp;
#pragma unroll
      for (int j = 0; j < WORDS; ++j) {
        const unsigned short a = c + 2 * j < NCOLS ? __bfloat16_as_ushort(w[c + 2 * j]) : 0;
        const unsigned short b = c + 2 * j + 1 < NCOLS ? __bfloat16_as_ushort(w[c + 2 * j + 1]) : 0;
        wp.w[j] = (unsigned)a | ((unsigned)b << 16);
      }
#endif
      Pack q;
#pragma unroll
      for (int j = 0; j < WORDS; ++j) {
#if HOLD_F32
        const float a = r[it * VEC + 2 * j], b = r[it * VEC + 2 * j + 1];
#else
        const unsigned hw = fresh(r[it * WORDS + j]);
        const float a = lo(hw), b = hi(hw);
#endif
        q.w[j] = pack2(a * scale * lo(wp.w[j]), b * scale * hi(wp.w[j]));
      }
#if VEC_OK
      store_y(yr + c, q);
#else
#pragma unroll
      for (int j = 0; j < WORDS; ++j) {
        if (c + 2 * j < NCOLS) yr[c + 2 * j] = __ushort_as_bfloat16((unsigned short)(q.w[j] & 0xffffu));
        if (c + 2 * j + 1 < NCOLS) yr[c + 2 * j + 1] = __ushort_as_bfloat16((unsigned short)(q.w[j] >> 16));
      }
#endif
    }
#elif VEC_OK
    for (int c0 = g * VEC; c0 < NCOLS; c0 += T * VEC * UNR) {
      Pack p[UNR];
      load_chunk<1>(p, xr, c0);
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        const int c = c0 + u * T * VEC;
        if (c < NCOLS) {
          const Pack wp = load_w(w + c);
          Pack q;
#pragma unroll
          for (int j = 0; j < WORDS; ++j)
            q.w[j] = pack2(lo(p[u].w[j]) * scale * lo(wp.w[j]), hi(p[u].w[j]) * scale * hi(wp.w[j]));
          store_y(yr + c, q);
        }
      }
    }
#else
    for (int c = g * VEC; c < NCOLS; c += T * VEC) {
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        if (c + j < NCOLS)
          yr[c + j] = __float2bfloat16(__bfloat162float(xr[c + j]) * scale * __bfloat162float(w[c + j]));
    }
#endif
  }
#if SPLIT > 1
  cluster_wait();  // no block leaves while a peer may still read its shared memory
#endif
#endif  // RING
}
