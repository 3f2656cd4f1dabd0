// Row softmax: bf16 in, fp32 math, bf16 out.
//
// Geometry (derived in the spec from the parameters and the row length N):
//   T0    = N / EPT rounded up to a power of two (at least 32): threads that share a row
//   TPR   = min(T0, TMAX)             threads of one block on one row
//   SPLIT = min(8, T0 / TPR)          blocks on one row: a thread-block cluster
//   RPB   = TMAX / TPR (at least 1)   rows per block when a row needs less than a block
//   grid  = ceil(M / RPB) * SPLIT, block = TPR * RPB, cluster = SPLIT
// Blocks of one cluster combine their partial maxima and sums through distributed
// shared memory, so a row of 131072 is spread over up to 8 SMs and can stay on chip.
//
// Parameters and what they trade:
//   EPT    elements per thread (a target: rows too long for 8 blocks give each thread
//          more). More: more 16-byte loads in flight per thread and cheaper reductions;
//          fewer: more threads and more rows in flight.
//   TMAX   the most threads in one block. Small blocks pack several per SM and overlap
//          one block's reduction with another's loads; 1024 keeps long rows in one block
//          (no cluster) or spreads them over fewer.
//   VEC    bf16 elements per access: 8 is one 16-byte load, 4 is 8 bytes. Rows whose length
//          is not a multiple of VEC take a scalar path (decided at compile time).
//   HOLD   what stays in registers between the reductions and the store:
//          "f32"  the exponentials (one read of x, one exp per element; most registers);
//          "bf16" the raw bf16 input (one read of x, half the registers, exp computed twice);
//          "none" nothing: an online pass for max and sum, then a second read of x, which
//                 hits L2 while the row is still there; both passes keep 4 vector loads
//                 per thread in flight.
//          "tma"  a persistent kernel: each block (TMAX <= 512 compute threads and one
//                 producer warp; TMAX = 1024 takes "f32") keeps a ring of NSLOT
//                 shared-memory slots that the bulk-copy engine (cp.async.bulk, completion
//                 on a "full" mbarrier per slot) refills as soon as the compute warps
//                 release a slot (an "empty" mbarrier per slot), so the next rows' loads
//                 run during this row's reductions and stores. A tile is several short
//                 rows (one slot of up to 64 KiB / MINB), one row, or one block's part of a
//                 row spread over a cluster (16 KiB slots); values are held as f32 in
//                 registers when they fit (the slots are released at once), else read
//                 from the slots again (released as the output pass moves past them).
//                 Rows whose length is not a multiple of 8 (16-byte copies) use "f32".
//          "ring" a persistent grid with no producer warp: every thread copies its own
//                 part of the rows ahead (row groups of RPB rows, or this block's part of a
//                 row spread over a cluster) into a shared-memory ring of NP pieces
//                 (cp.async, one commit group a piece; a row group is SUBR pieces, one when
//                 it fits 64 KiB / MINB, else 32 KiB pieces), refills a piece as soon as its
//                 output is stored, and reads back only what it copied, so the ring needs
//                 no barrier of its own. One reduction a row: each thread's
//                 (max, sum of exp) pair, merged online over the row; the exponentials stay
//                 in registers when they fit (one exp per element), else the output pass
//                 reads the stage again. Needs N % VEC == 0 and room for two stages (the
//                 spec's RING); otherwise the grid is not persistent and "ring" takes "f32".
//          A hold that would not fit the block's register file falls back to "none".
//   MINB   blocks per SM the register allocation must allow (1, 2, 4; capped so a thread
//          keeps 64 registers): more blocks overlap one block's reduction and barriers with
//          another's loads, at the price of registers for the held row.
//   LOAD   "default" or "cs" (evict-first, __ldcs): x is read once.
//   STORE  "default" or "cs" (streaming store, __stcs): y is never read back here.
//          "bulk" (HOLD "tma" only): a block writes its tile's output into the slots the tile
//          came from and one thread stores them with the bulk-copy engine
//          (cp.async.bulk.global.shared), so the compute warps issue shared-memory stores
//          instead of global ones; the slots refill only once that store has read them
//          (one tile later), so the ring keeps one tile fewer ahead. It needs the tile in
//          registers, a whole tile a block, and two tiles of slots; otherwise it stores as
//          "default".
#include <cuda_bf16.h>

#define TPR 32
#define RPB 8
#define SPLIT 1
#define THREADS (TPR * RPB)
#define T (TPR * SPLIT)
#define VEC 8
#define WORDS (VEC / 2)
#define WPR ((TPR + 31) / 32)
#define NCOLS 1000
#define VEC_OK (NCOLS % VEC == 0)
#define ITEMS ((NCOLS + T * VEC - 1) / (T * VEC))
#define NEG_INF (__int_as_float(0xff800000))
#define L2E 1.4426950408889634f
// Registers a thread may spend on the held row (the rest go to addresses and loop state).
// Blocks per SM the compiler must leave room for (MINB), capped so that a thread keeps at
// least 64 registers; each thread's register cap follows from it.
#define MINB_WANT 1
#define MINB_EFF (MINB_WANT < 1024 / THREADS ? MINB_WANT : (1024 / THREADS > 0 ? 1024 / THREADS : 1))
#define REG_CAP (65536 / (THREADS * MINB_EFF) < 255 ? 65536 / (THREADS * MINB_EFF) : 255)
// The ring's held values are only the f32 exponentials (the row waits in shared memory), so
// it leaves 32 registers for the rest where the register paths leave 40: 1024 threads (64
// registers each) then hold 32 exponentials a thread, rows of 32768 without a second exp.
#define REG_MARGIN 40
#define REG_BUDGET (REG_CAP - REG_MARGIN)
#define HOLD_F32 (1 && ITEMS * VEC <= REG_BUDGET)
#define HOLD_BF16 (1 && !HOLD_F32 && ITEMS * WORDS <= REG_BUDGET)

#if VEC == 8
typedef uint4 Raw;
#else
typedef uint2 Raw;
#endif

struct Pack { unsigned w[WORDS]; };

__device__ __forceinline__ Pack as_pack(const Raw v) {
  Pack out;
#if VEC == 8
  out.w[0] = v.x; out.w[1] = v.y; out.w[2] = v.z; out.w[3] = v.w;
#else
  out.w[0] = v.x; out.w[1] = v.y;
#endif
  return out;
}

__device__ __forceinline__ Pack load_pack(const __nv_bfloat16* p) {
  const Raw* r = reinterpret_cast<const Raw*>(p);
  return as_pack(*r);
}

__device__ __forceinline__ void store_pack(__nv_bfloat16* p, const Pack& q) {
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
// unpacked floats of an earlier loop alive (that would cost the registers HOLD="bf16" saves).
__device__ __forceinline__ unsigned fresh(unsigned w) {
  asm volatile("mov.b32 %0, %0;" : "+r"(w));
  return w;
}
// exp(v - max) as exp2((v - max) * log2e): the difference first. The single FFMA
// exp2(v * log2e - max * log2e) rounds max * log2e alone, and on rows near bf16's largest
// values (1e37 and up) that rounding is 1e30, which exp2 turns into inf for the max itself.
// Padding holds -inf, which gives 0; a live row's max is finite.
__device__ __forceinline__ float ex(float v, float m) { return expf(v - m); }

// (max, sum) of an online softmax: merge b into a. Of the two scale factors one is
// exp(0) = 1, so only the sum of the smaller max is scaled, by exp(-|m - m2|): one
// exponential a merge. Equal maxima (two empty partials, -inf, among them) scale by 1; a
// -inf max against a finite one scales its sum by exp(-inf) = 0.
// Every partial with a -inf max must carry a sum of 0 (0 * 0 here; a NaN sum would spread):
// whoever computes exponentials against a max that may be -inf (a thread that saw nothing,
// or only masked values) takes 0 as that max instead, so that they all come out 0.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const bool first = m >= m2;
  const float big = first ? s : s2, small = first ? s2 : s;
  const float d = m == m2 ? 0.f : fabsf(m - m2);
  s = fmaf(small, exp2f(-d * L2E), big);
  m = fmaxf(m, m2);
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

// Join NW partials (NW a power of two, at most 32): lane l of a warp brings partial l % NW
// (`have` false: none, the identity), so each group of NW lanes holds them all, and
// log2(NW) shuffles join them in every lane: log2(NW) joins a thread rather than NW - 1
// (an RPAIR merge costs an exponential).
template <int MODE, int NW>
__device__ __forceinline__ void combine(float& m, float& s, float mp, float sp, bool have) {
  float m2 = have ? mp : (MODE == RSUM ? m : NEG_INF), s2 = have ? sp : 0.f;
#pragma unroll
  for (int o = NW / 2; o > 0; o /= 2)
    join<MODE>(m2, s2, __shfl_xor_sync(0xffffffffu, m2, o), __shfl_xor_sync(0xffffffffu, s2, o));
  if (MODE != RSUM) m = m2;
  if (MODE != RMAX) s = s2;
}
#define P2(n) ((n) <= 1 ? 1 : (n) <= 2 ? 2 : (n) <= 4 ? 4 : (n) <= 8 ? 8 : (n) <= 16 ? 16 : 32)

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

// The streaming ("none") path keeps UNR vector loads per thread in flight: the next chunk's
// loads are issued before this chunk is folded in.
#define UNR 4

// UNR vectors of the row from column c on, T * VEC apart; -inf past the end.
__device__ __forceinline__ void load_chunk(Pack (&p)[UNR], const __nv_bfloat16* xr, int c, bool live) {
#pragma unroll
  for (int u = 0; u < UNR; ++u) {
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
__device__ __forceinline__ void fold(float& m, float& s, const Pack (&p)[UNR]) {
  float vm = NEG_INF;
#pragma unroll
  for (int u = 0; u < UNR; ++u)
#pragma unroll
    for (int j = 0; j < WORDS; ++j) vm = fmaxf(vm, fmaxf(lo(p[u].w[j]), hi(p[u].w[j])));
  const float mn = fmaxf(m, vm), ml = mn == NEG_INF ? 0.f : mn;  // all -inf so far: sum 0 (merge)
  float acc = (m == NEG_INF) ? 0.f : s * exp2f((m - mn) * L2E);
#pragma unroll
  for (int u = 0; u < UNR; ++u)
#pragma unroll
    for (int j = 0; j < WORDS; ++j) acc += ex(lo(p[u].w[j]), ml) + ex(hi(p[u].w[j]), ml);
  m = mn;
  s = acc;
}

extern "C" __global__ void __launch_bounds__(THREADS, MINB_EFF)
softmax_bf16(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, int M) {
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
  __nv_bfloat16* yr = y + (size_t)(live ? row : 0) * NCOLS;
  float m = NEG_INF, s = 0.f;
#if HOLD_F32 || HOLD_BF16
#if HOLD_F32
  float r[ITEMS * VEC];
#else
  unsigned r[ITEMS * WORDS];
#endif
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int c = (it * T + g) * VEC;
#if VEC_OK
    Pack p;
    if (live && c < NCOLS) {
      p = load_pack(xr + c);
    } else {
#pragma unroll
      for (int j = 0; j < WORDS; ++j) p.w[j] = 0xff80ff80u;  // two bf16 -inf
    }
#pragma unroll
    for (int j = 0; j < WORDS; ++j) {
#if HOLD_F32
      r[it * VEC + 2 * j] = lo(p.w[j]);
      r[it * VEC + 2 * j + 1] = hi(p.w[j]);
#else
      r[it * WORDS + j] = p.w[j];
#endif
    }
#else
#pragma unroll
    for (int j = 0; j < WORDS; ++j) {
      const float a = (live && c + 2 * j < NCOLS) ? __bfloat162float(xr[c + 2 * j]) : NEG_INF;
      const float b = (live && c + 2 * j + 1 < NCOLS) ? __bfloat162float(xr[c + 2 * j + 1]) : NEG_INF;
#if HOLD_F32
      r[it * VEC + 2 * j] = a;
      r[it * VEC + 2 * j + 1] = b;
#else
      r[it * WORDS + j] = pack2(a, b);  // exact: a and b are bf16 values (or -inf)
#endif
    }
#endif
  }
#if HOLD_F32
#pragma unroll
  for (int k = 0; k < ITEMS * VEC; ++k) m = fmaxf(m, r[k]);
  row_reduce<RMAX>(m, s, red, cl, 0);
  const float ml = m;
#pragma unroll
  for (int k = 0; k < ITEMS * VEC; ++k) {
    r[k] = ex(r[k], ml);
    s += r[k];
  }
#else
#pragma unroll
  for (int k = 0; k < ITEMS * WORDS; ++k) m = fmaxf(m, fmaxf(lo(r[k]), hi(r[k])));
  row_reduce<RMAX>(m, s, red, cl, 0);
  const float ml = m;
#pragma unroll
  for (int k = 0; k < ITEMS * WORDS; ++k) {
    const unsigned w = fresh(r[k]);
    s += ex(lo(w), ml) + ex(hi(w), ml);
  }
#endif
  row_reduce<RSUM>(m, s, red, cl, 1);  // m is the row's max in every thread: unchanged
  const float inv = 1.f / s;
#if SPLIT > 1
  cluster_arrive();  // our reads of the peers' sums are done; the matching wait is at the end
#endif
  if (live) {
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int c = (it * T + g) * VEC;
      Pack q;
#pragma unroll
      for (int j = 0; j < WORDS; ++j) {
#if HOLD_F32
        q.w[j] = pack2(r[it * VEC + 2 * j] * inv, r[it * VEC + 2 * j + 1] * inv);
#else
        const unsigned w = fresh(r[it * WORDS + j]);
        q.w[j] = pack2(ex(lo(w), ml) * inv, ex(hi(w), ml) * inv);
#endif
      }
#if VEC_OK
      if (c < NCOLS) store_pack(yr + c, q);
#else
#pragma unroll
      for (int j = 0; j < WORDS; ++j) {
        if (c + 2 * j < NCOLS) yr[c + 2 * j] = __ushort_as_bfloat16((unsigned short)(q.w[j] & 0xffffu));
        if (c + 2 * j + 1 < NCOLS) yr[c + 2 * j + 1] = __ushort_as_bfloat16((unsigned short)(q.w[j] >> 16));
      }
#endif
    }
  }
#else  // no hold: online max and sum in one pass, then a second read of x
#if VEC_OK
  {
    Pack cur[UNR];
    load_chunk(cur, xr, g * VEC, live);
    for (int c0 = g * VEC; live && c0 < NCOLS; c0 += T * VEC * UNR) {
      Pack nxt[UNR];
      load_chunk(nxt, xr, c0 + T * VEC * UNR, live);
      fold(m, s, cur);
#pragma unroll
      for (int u = 0; u < UNR; ++u) cur[u] = nxt[u];
    }
  }
#else
  for (int c = g * VEC; live && c < NCOLS; c += T * VEC) {
    float v[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = c + j < NCOLS ? __bfloat162float(xr[c + j]) : NEG_INF;
    float vm = v[0];
#pragma unroll
    for (int j = 1; j < VEC; ++j) vm = fmaxf(vm, v[j]);
    const float mn = fmaxf(m, vm), mnl = mn == NEG_INF ? 0.f : mn;  // all -inf so far: sum 0 (merge)
    float acc = (m == NEG_INF) ? 0.f : s * exp2f((m - mn) * L2E);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc += ex(v[j], mnl);
    m = mn;
    s = acc;
  }
#endif
  row_reduce<RPAIR>(m, s, red, cl, 2);
  const float inv = 1.f / s, ml = m;
#if SPLIT > 1
  cluster_arrive();
#endif
#if VEC_OK
  for (int c0 = g * VEC; live && c0 < NCOLS; c0 += T * VEC * UNR) {
    Pack p[UNR];
    load_chunk(p, xr, c0, live);  // UNR loads in flight, then UNR stores
#pragma unroll
    for (int u = 0; u < UNR; ++u) {
      const int c = c0 + u * T * VEC;
      if (c < NCOLS) {
        Pack q;
#pragma unroll
        for (int j = 0; j < WORDS; ++j) q.w[j] = pack2(ex(lo(p[u].w[j]), ml) * inv, ex(hi(p[u].w[j]), ml) * inv);
        store_pack(yr + c, q);
      }
    }
  }
#else
  for (int c = g * VEC; live && c < NCOLS; c += T * VEC) {
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c + j < NCOLS) yr[c + j] = __float2bfloat16(ex(__bfloat162float(xr[c + j]), ml) * inv);
  }
#endif
#endif
#if SPLIT > 1
  cluster_wait();  // no block leaves while a peer may still read its shared memory
#endif
}
