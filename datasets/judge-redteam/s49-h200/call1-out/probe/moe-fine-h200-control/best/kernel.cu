// Grouped expert GEMM for MoE (issue 22) on the tensor cores through mma.sync: bf16 in, fp32
// accumulation, one rounding to bf16. The tokens an expert gets are known only on the device.
//
// Layout:
//   x    bf16  [R, K]      R = T * TOPK rows, sorted by expert
//   w    bf16  [E, N, K]   expert e's weight as nn.Linear keeps it (out x in): w[e] is the
//                          column-major B operand of mma row.col as it lies (ldmatrix, no .trans)
//   offs int32 [E]         cumulative end row of each expert: expert e owns rows
//                          offs[e - 1] .. offs[e] - 1 (offs[-1] = 0), torch._grouped_mm's
//                          convention; groups may be empty, one may hold every row
//   y    bf16  [R, NO]     ACT none: NO = N, y[r] = x[r] w[e(r)]^T
//                          ACT swiglu: NO = N / 2, y[r, c] = silu(h[c]) * h[c + N / 2] with
//                          h = x[r] w[e(r)]^T in fp32 (gate columns first, then up)
//   ws   fp32  [WSW]       split-K workspace (SPLITK > 1): a ticket counter per output tile,
//                          then SPLITK slabs [R, N] of partial sums; the runner's, zero before
//                          a call and zero again after it
//   T    int               tokens; the only size known at run time. E, N, K, TOPK compiled in.
//
// Tiles. Expert e's rows are cut in ceil(n_e / BM) row tiles (the last one ragged: its rows
// past the group are zero-filled by cp.async and never stored); the row tiles of all experts
// are numbered in expert order, 0 .. MTR - 1. MTR is known only on the device, so the grid is
// sized by its bound MT = min(R, (R + E (BM - 1)) / BM) (each tile holds a row, and
// sum ceil(n_e / BM) <= (R + E (BM - 1)) / BM): grid = MT * NT * SPLITK, NT = N / BN column
// tiles. A block past MTR returns before touching shared memory.
//   blockIdx.x = tile * SPLITK + split: the K splits of one tile are neighbours.
//   tile -> (row tile mt, column tile nt) in groups of GM row tiles: inside a group the row
//   tile runs fastest, so the blocks resident at once share GM tiles of x and NT * GM / ...
//   column tiles of an expert's weight (GM 1: every column tile of one row tile in turn, x read
//   once from HBM; a larger GM: an expert's weight tile read once for GM of its row tiles).
//   mt -> (expert, row tile of the expert): every warp scans offs itself (a lane owns
//   ceil(E / 32) neighbouring experts, a shuffle scan over the lanes, a ballot finds the owner):
//   no shared memory, no barrier, no second launch, no host sync.
//
// Main loop: a block of WM x WN warps computes a BM x BN tile; warp (wm, wn) a TM x TN part
// (TM = BM / WM, TN = BN / WN) as (TM / 16) x (TN / 8) m16n8k16 tiles. The K range of the split
// (K / SPLITK) streams through STAGES shared-memory stages of BM x BK of x and BN x BK of w,
// 16-byte cp.async.cg copies (STAGES - 1 k-tiles in flight while one is computed), one barrier
// per k-tile. Shared rows are BK * 2 bytes whose 16-byte chunks are XOR-swizzled by the row,
// so that the 8 row addresses of every ldmatrix phase hit 8 different bank groups (and the
// copies' stores stay whole 128-byte lines).
//
// Fused SwiGLU (ACT swiglu): output tile nt (BN / 2 columns) needs gate columns
// nt * BN / 2 + c and up columns N / 2 + nt * BN / 2 + c. The B tile's row i (warp part
// wn = i / TN, j = i % TN) is gate column nt * BN/2 + wn * TN/2 + j for j < TN / 2 and the up
// column of the same output column otherwise: each thread then holds the gate of an output
// in n8 tile jn and its up in n8 tile jn + TN / 16, at the same fragment position.
//
// Split-K (SPLITK > 1, deterministic): split s of a tile writes its fp32 partials (valid rows
// only) to slab s of ws, fences, and takes a ticket from the tile's counter. The block that
// draws SPLITK - 1 is the last: it adds the slabs in the order s = 0, 1, ..., SPLITK - 1
// (its own from registers, in its place), writes zeros over the slabs it read and its own,
// sets the counter back to 0, and runs the epilogue. The sum's order never depends on which
// split finished last: the same bits run to run.
//
// Parameters:
//   E, N, K, TOPK     the op's sizes, compiled in (single-valued search parameters)
//   BM, BN, BK        block tile (rows, weight columns, depth); BM 16: one m16 row tile, for
//                     small T where weight streaming is all that matters
//   WM, WN            warps along rows and columns (TM = BM / WM, TN = BN / WN: multiples of 16)
//   STAGES            cp.async pipeline depth (STAGES - 1 k-tiles in flight)
//   SPLITK            K splits (1, 2, 4): more blocks, and more bytes in flight, when few tiles exist
//   GM                row tiles of a raster group (L2 reuse of x or of w, above)
//   ACT               "none" or "swiglu"
//   PERSIST           1: a block a resident slot, looping over the tiles, the next tile's copies
//                     in flight during this one's epilogue (the tensor-copy path with a producer
//                     warpgroup only; its header says how); 0: a block a tile
#include <cuda_bf16.h>

#define E 64
#define N 2816
#define K 2048
#define TOPK 6
#define BM 16
#define BN 128
#define BK 64
#define WM 1
#define WN 4
#define STAGES 4
#define SPLITK 1
#define GM 1
#define SWIGLU 0
#define PERSIST 0

// The grouped GEMM's sizes, worked out from the parameters, and their static asserts.
#define THREADS (WM * WN * 32)
#define TM (BM / WM)                 // a warp's rows
#define TN (BN / WN)                 // a warp's weight columns (gate and up together under SwiGLU)
#define MI (TM / 16)                 // m16 tiles of a warp
#define NJ (TN / 8)                  // n8 tiles of a warp
#define NT (N / BN)                  // column tiles (of w's rows; of y's columns likewise)
#define NO (SWIGLU ? N / 2 : N)      // y's columns
#define BNO (SWIGLU ? BN / 2 : BN)   // y's columns of a tile
#define KSPL (K / SPLITK)            // depth of a split
#define KT (KSPL / BK)               // k-tiles of a split
#define CH (BK / 8)                  // 16-byte chunks of a shared row
#define ROWB (BK * 2)                // bytes of a shared row
#define ABYTES (BM * ROWB)           // a stage: x's BM rows, then w's BN rows
#define STAGEB ((BM + BN) * ROWB)
#define ACH (BM * CH)                // 16-byte copies of a stage's x part, of its w part
#define BCH (BN * CH)
#define RSTEP (THREADS / CH)         // rows between a thread's successive copies
#define EPL ((E + 31) / 32)          // experts a lane scans

static_assert(TM % 16 == 0 && TN % 16 == 0, "a warp's part is whole m16 tiles and pairs of n8 tiles");
static_assert(N % BN == 0 && K % (SPLITK * BK) == 0 && BK % 16 == 0, "whole tiles along N and K");
static_assert(CH == 4 || CH == 8 || CH == 16, "BK 32, 64 or 128: the swizzle's row groups");
static_assert(THREADS % CH == 0, "a thread copies one chunk column of its rows");
static_assert(!SWIGLU || (N % 2 == 0 && (TN / 2) % 8 == 0), "gate and up halves are whole n8 tiles");
static_assert(KT >= 1, "at least one k-tile a split");
static_assert(STAGES >= 2, "a copy in flight while one is computed");

// A CUtensorMap, passed by value (`const __grid_constant__`): 128 opaque bytes (NVRTC has no
// cuda.h). Every path's kernel takes two (the tensor-copy path reads them).
struct alignas(64) TmaDesc { unsigned long long w[16]; };

// The one parameter list of every path's kernel (the specs' kernel.args): the tensor maps first
// (64-byte aligned, by value), then the pointers, T last. A path reads what it needs.
#define MOE_GEMM_PARAMS                                                                        \
  const __grid_constant__ TmaDesc xmap, const __grid_constant__ TmaDesc wmap,                  \
      const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,                \
      const int* __restrict__ offs, __nv_bfloat16* __restrict__ y, float* __restrict__ ws, int T

// The grouped GEMM's PTX helpers: 16-byte cp.async (zero-filled when invalid), ldmatrix.x4 and
// the full m16n8k16 bf16 mma with fp32 accumulators. Independent of any size macro.

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, L2 only (cg); src-size 0 writes 16 zero bytes and reads nothing,
// so `src` need only be a valid address when `valid` is false.
__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N_>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N_) : "memory"); }

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// d += A B: A a 16x16 row-major fragment (a[0..3]), B a 16x8 column fragment (b[0..1]).
__device__ __forceinline__ void mma16816(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats as a bf16 pair (lo in the low half), each rounded to nearest once.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// silu(g) * u in fp32 (expf, not the fast intrinsic); g -> -inf gives -0 * u, not NaN.
__device__ __forceinline__ float swiglu(float g, float u) { return g / (1.f + expf(-g)) * u; }

// The grouped GEMM's pieces: the tile lookup, a stage's copies, a stage's mma work and the
// split-K reduction. See moe_gemm.cu.j2's header for the scheme.

// Byte offset of 16-byte chunk c of shared row r, swizzled: the 8 rows an ldmatrix phase reads
// at one logical chunk land in 8 different 16-byte bank groups of a 128-byte line.
__device__ __forceinline__ unsigned swz(int r, int c) {
#if CH == 4
  return r * ROWB + ((c ^ ((r >> 1) & 3)) << 4);  // two 64-byte rows a 128-byte line
#else
  return r * ROWB + ((c ^ (r & 7)) << 4);
#endif
}

struct TileRef {
  int e;      // the expert
  int row0;   // the tile's first row of x and y
  int rows;   // its valid rows (1 .. BM); <= 0: no tile (the block returns)
  int mt;     // row tile (0 .. MTR - 1, experts in order), for the split-K counter
  int nt;     // column tile
  int split;  // K split
};

// The block's tile: blockIdx -> (tile, split) -> (mt, nt) by the raster groups, then mt -> its
// expert by a scan of offs. Every warp does the same (no barrier); a block past the last row
// tile gets rows = 0.
__device__ __forceinline__ TileRef find_tile(const int* __restrict__ offs, int R, int bid, int lane) {
  TileRef t;
  t.split = bid % SPLITK;
  const int tile = bid / SPLITK;
  const int mtb = min(R, (R + E * (BM - 1)) / BM);  // the grid's bound on row tiles (the spec's MT)
  const int grp = tile / (GM * NT);
  const int first = grp * GM;
  const int gsz = min(GM, mtb - first);
  const int inr = tile - grp * GM * NT;
  t.mt = first + inr % gsz;
  t.nt = inr / gsz;
  // the lane's experts lane * EPL .. + EPL - 1: their row tiles, then an inclusive scan
  int cnt[EPL];
  int mine = 0;
#pragma unroll
  for (int u = 0; u < EPL; ++u) {
    const int e = lane * EPL + u;
    int n = 0;
    if (e < E) {
      const int hi = min(max(__ldg(offs + e), 0), R);
      const int lo = e ? min(max(__ldg(offs + e - 1), 0), R) : 0;
      n = max(hi - lo, 0);
    }
    cnt[u] = (n + BM - 1) / BM;
    mine += cnt[u];
  }
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  const int excl = incl - mine;
  const unsigned own = __ballot_sync(0xffffffffu, excl <= t.mt && t.mt < incl);
  t.rows = 0;
  t.e = 0;
  t.row0 = 0;
  if (own == 0) return t;  // mt >= the row tiles there are
  const int src = __ffs(own) - 1;
  int e = 0, loc = t.mt - excl;  // the owner lane's: its expert of mt, and mt's row tile inside it
  bool found = false;
#pragma unroll
  for (int u = 0; u < EPL; ++u) {
    if (!found && loc < cnt[u]) {
      e = lane * EPL + u;
      found = true;
    } else if (!found) {
      loc -= cnt[u];
    }
  }
  t.e = __shfl_sync(0xffffffffu, e, src);
  loc = __shfl_sync(0xffffffffu, loc, src);
  const int lo = t.e ? min(max(__ldg(offs + t.e - 1), 0), R) : 0;
  const int hi = min(max(__ldg(offs + t.e), 0), R);
  t.row0 = lo + loc * BM;
  t.rows = min(BM, hi - t.row0);
  return t;
}

// The weight row (of w[e], 0 .. N - 1) that shared B row i of column tile nt holds.
__device__ __forceinline__ int b_row(int i, int nt) {
#if SWIGLU
  const int pw = i / TN, j = i % TN;  // the warp part and the row inside it
  const int c = nt * BNO + pw * (TN / 2) + (j < TN / 2 ? j : j - TN / 2);
  return j < TN / 2 ? c : NO + c;
#else
  return nt * BN + i;
#endif
}

// k-tile kt of the split into the stage at `st`: x rows past the tile's valid rows zero-filled.
__device__ __forceinline__ void load_stage(unsigned st, const char* xg, const char* wg, int kt, int rows, int nt,
                                           int tid) {
  const int c = tid % CH, r0 = tid / CH;
  const long long kb = (long long)kt * BK * 2 + c * 16;
#pragma unroll
  for (int u = 0; u < (ACH + THREADS - 1) / THREADS; ++u) {
    const int r = r0 + u * RSTEP;
    if (ACH % THREADS == 0 || r < BM) {
      const bool ok = r < rows;
      cp16(st + swz(r, c), xg + (ok ? (long long)r * K * 2 + kb : 0), ok);
    }
  }
#pragma unroll
  for (int u = 0; u < (BCH + THREADS - 1) / THREADS; ++u) {
    const int r = r0 + u * RSTEP;
    if (BCH % THREADS == 0 || r < BN) cp16(st + ABYTES + swz(r, c), wg + (long long)b_row(r, nt) * K * 2 + kb, true);
  }
}

// acc += the stage's x rows of this warp times its w rows, BK / 16 k-steps.
__device__ __forceinline__ void compute_stage(unsigned st, float (&acc)[MI][NJ][4], int wm, int wn, int lane) {
#pragma unroll
  for (int ks = 0; ks < BK / 16; ++ks) {
    unsigned a[MI][4], b[NJ][2];
    // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
#pragma unroll
    for (int i = 0; i < MI; ++i)
      ldsm_x4(st + swz(wm * TM + i * 16 + (lane & 15), 2 * ks + (lane >> 4)), a[i][0], a[i][1], a[i][2], a[i][3]);
    // B: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15): two n8 tiles
#pragma unroll
    for (int p = 0; p < NJ / 2; ++p)
      ldsm_x4(st + ABYTES + swz(wn * TN + p * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)),
              b[2 * p][0], b[2 * p][1], b[2 * p + 1][0], b[2 * p + 1][1]);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) mma16816(acc[i][j], a[i], b[j]);
  }
}

#if SPLITK > 1
// Split-K: this split's partials to its slab, a ticket, and in the last block of the tile the
// ordered sum into acc, the slabs zeroed and the counter reset. Returns whether this block is
// the last (the one to write y).
__device__ __forceinline__ bool splitk_reduce(float (&acc)[MI][NJ][4], float* __restrict__ ws, int R,
                                              const TileRef& tr, int wm, int wn, int lane, int tid) {
  __shared__ int s_last;
  const int mtb = min(R, (R + E * (BM - 1)) / BM);
  int* cnt = reinterpret_cast<int*>(ws) + tr.mt * NT + tr.nt;
  float* part = ws + ((mtb * NT + 3) & ~3);  // slabs after the counters, 16-byte aligned
  const long long slab = (long long)R * N;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * TM + i * 16 + h * 8 + g;
      if (r >= tr.rows) continue;
      float* pr = part + (long long)tr.split * slab + (long long)(tr.row0 + r) * N;
#pragma unroll
      for (int j = 0; j < NJ; ++j)
        __stcg(reinterpret_cast<float2*>(pr + b_row(wn * TN + j * 8 + 2 * t4, tr.nt)),
               make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]));
    }
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(cnt, 1) == SPLITK - 1;
  __syncthreads();
  if (!s_last) return false;
  __threadfence();  // the other splits' partials, fenced before their tickets, are visible
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * TM + i * 16 + h * 8 + g;
      if (r >= tr.rows) continue;
      float* pr = part + (long long)(tr.row0 + r) * N;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int col = b_row(wn * TN + j * 8 + 2 * t4, tr.nt);
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int s = 0; s < SPLITK; ++s) {
          float2* q = reinterpret_cast<float2*>(pr + s * slab + col);
          float2 v = s == tr.split ? make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]) : __ldcg(q);
          s0 += v.x;
          s1 += v.y;
          __stcg(q, make_float2(0.f, 0.f));  // every slab of the tile zero again, this split's too
        }
        acc[i][j][2 * h] = s0;
        acc[i][j][2 * h + 1] = s1;
      }
    }
  if (tid == 0) *cnt = 0;  // the counter back to 0 for the next call (or graph replay)
  return true;
}
#endif

// One parameter list for every MMA path (MOE_GEMM_PARAMS, common/moe_defs.cuh.j2), so one spec
// (one dispatch table) holds them all. The sync path never reads the maps; the runner passes a
// placeholder where a configuration does not use them (kernel.tensor_maps' `when`).
extern "C" __global__ void __launch_bounds__(THREADS)
moe_gemm_bf16(MOE_GEMM_PARAMS) {
  extern __shared__ __align__(128) unsigned char smem[];
  if (blockDim.x != THREADS) __trap();  // the geometry compiled in
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int R = T * TOPK;

  // 1. this block's (row tile, column tile, split) and the row tile's (expert, rows)
  const TileRef tr = find_tile(offs, R, blockIdx.x, lane);
  if (tr.rows <= 0) return;  // past the last row tile: no work, out before any copy

  // 2. the main loop
  const unsigned sbase = smem_u32(smem);
  const long long k0 = (long long)tr.split * KSPL;
  const char* xg = reinterpret_cast<const char*>(x + (long long)tr.row0 * K + k0);
  const char* wg = reinterpret_cast<const char*>(w + (long long)tr.e * N * K + k0);
  float acc[MI][NJ][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(sbase + s * STAGEB, xg, wg, s, tr.rows, tr.nt, tid);
    cp_commit();
  }
#pragma unroll 1
  for (int kt = 0; kt < KT; ++kt) {
    cp_wait<STAGES - 2>();  // k-tile kt has landed (this thread's copies) ...
    __syncthreads();        // ... and every thread's; and stage (kt - 1) % STAGES is read
    const int nk = kt + STAGES - 1;
    if (nk < KT) load_stage(sbase + (nk % STAGES) * STAGEB, xg, wg, nk, tr.rows, tr.nt, tid);
    cp_commit();
    compute_stage(sbase + (kt % STAGES) * STAGEB, acc, wm, wn, lane);
  }
  cp_wait<0>();  // no copy outstanding when the block exits

  // 3. split-K: the partials summed in split order by the last block of the tile
#if SPLITK > 1
  if (!splitk_reduce(acc, ws, R, tr, wm, wn, lane, tid)) return;
#endif

  // 4. the epilogue: bf16 pairs of valid rows straight from the fragments
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * TM + i * 16 + h * 8 + g;
      if (r >= tr.rows) continue;
      unsigned* yr = reinterpret_cast<unsigned*>(y + (long long)(tr.row0 + r) * NO);
#if SWIGLU
#pragma unroll
      for (int j = 0; j < NJ / 2; ++j) {
        const float* ga = acc[i][j];
        const float* up = acc[i][j + NJ / 2];
        yr[(tr.nt * BNO + wn * (TN / 2) + j * 8 + 2 * t4) / 2] =
            pack_bf16(swiglu(ga[2 * h], up[2 * h]), swiglu(ga[2 * h + 1], up[2 * h + 1]));
      }
#else
#pragma unroll
      for (int j = 0; j < NJ; ++j)
        yr[(tr.nt * BN + wn * TN + j * 8 + 2 * t4) / 2] = pack_bf16(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
#endif
    }
}
