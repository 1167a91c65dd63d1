/* The BF16 and TF32 GEMMs for Hopper (sm_90a): TMA tile loads into 128-byte-swizzled shared
 * memory through a multistage mbarrier pipeline, one producer warpgroup and two consumer
 * warpgroups issuing wgmma.mma_async (bf16 m64nNk16, tf32 m64nNk8; fp32 accumulate), and a masked
 * fp32 epilogue; any M, N, K. BF16: all four transpositions natively (wgmma reads either operand
 * K-major or MN-major). TF32: wgmma reads K-major only, so the operands are first rounded to TF32
 * into a K-major scratch copy (wl__tf32_pack). */
#if !defined(WL_CUDA_EMU) /* tests/kernels/emu models the sm_90 pieces itself */
#include <cuda.h> /* CUtensorMap and its enums only: the driver function comes through the runtime */
#include <cudaTypedefs.h>
#endif

#include "gemm.cuh"

/* The device pass for sm_90a has wgmma and setmaxnreg; every other pass compiles the kernel to a
 * trap, and the host takes it only where the build has sm_90a code and the device runs it
 * (wl__wgmma_usable). */
#if (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)) || defined(WL_CUDA_EMU)
#define WL_WGMMA 1
#else
#define WL_WGMMA 0
#endif

/* Tile shape: BM x BN of C per block, a k-tile 128 bytes deep (BK = 64 bf16 or 32 fp32), the
 * width of the 128-byte swizzle, so every TMA box is 64 rows of 128 bytes (8 KiB) and a k-tile of
 * an operand is R/64 such boxes. One wgmma reads 32 bytes of K (k16 bf16, k8 tf32), so a k-tile is
 * 4 of them for either type and the descriptors are the same. */
#define WL__WG_BM        128
#define WL__WG_STAGES    4
#define WL__WG_BOX_BYTES (64 * 64 * 2)
#define WL__WG_THREADS   384 /* warpgroup 0 loads, 1 and 2 multiply */

/* T: uint16_t (bf16) or float (tf32: fp32 already rounded to TF32). */
template <class T> struct wl__wg_elem {
  static constexpr int BK = 128 / (int)sizeof(T); /* elements in a 128-byte k-tile row */
  static constexpr bool TF32 = sizeof(T) == 4;
};

template <int BN> struct wl__wg_shape {
  static constexpr int A_BYTES = WL__WG_BM * 128;
  static constexpr int B_BYTES = BN * 128;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  /* the stages, then 2 mbarriers per stage; + 1 KiB: the dynamic shared memory is only
   * 16-byte aligned, the swizzle atoms need 1024 */
  static constexpr int SMEM = WL__WG_STAGES * (STAGE_BYTES + 16) + 1024;
};

/* A wgmma shared-memory matrix descriptor with the 128-byte swizzle: start address, leading and
 * stride byte offsets (all in 16-byte units), layout type 1 in bits 62-63. */
__device__ __forceinline__ uint64_t wl__wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3ffff) >> 4) | ((uint64_t)((lbo >> 4) & 0x3fff) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3fff) << 32) | (1ull << 62);
}

/* ------------------------------------------------------------------------------------------------
 * sm_90a instructions (PTX ISA: mbarrier, cp.async.bulk.tensor, wgmma)
 * ----------------------------------------------------------------------------------------------*/
#if defined(WL_CUDA_EMU)

static inline void wl__mbar_init(uint32_t bar, uint32_t count) {
  wl__emu_mbar_init(bar, count);
}
static inline void wl__mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  wl__emu_mbar_arrive(bar, bytes);
}
static inline void wl__mbar_arrive(uint32_t bar) {
  wl__emu_mbar_arrive(bar, 0);
}
static inline void wl__mbar_wait(uint32_t bar, uint32_t parity) {
  while (!wl__emu_mbar_done(bar, parity)) wl__emu_yield();
}
static inline void wl__tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0,
                                int c1) {
  wl__emu_tma_load(dst, map, bar, c0, c1);
}
static inline void wl__wg_fence(void) {}
static inline void wl__wg_commit(void) {
  wl__emu_wg_commit();
}
template <int N> static inline void wl__wg_wait(void) {
  wl__emu_wg_wait(N);
}
static inline void wl__mbar_init_fence(void) {}
static inline void wl__setmaxnreg_producer(void) {}
static inline void wl__setmaxnreg_consumer(void) {}
template <class T, int BN, bool TA, bool TB>
static inline void wl__wgmma(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  wl__emu_wgmma(d, BN, da, db, TA, TB, wl__wg_elem<T>::TF32 ? WL__EMU_WG_TF32 : WL__EMU_WG_BF16);
}

#elif WL_WGMMA

__device__ __forceinline__ void wl__mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void wl__mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void wl__mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/* Waits until the phase with the given parity has completed. */
__device__ __forceinline__ void wl__mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}

/* One 64 x 64 box of a 2-D tensor map at (c0 inner, c1 outer) into shared memory; the bytes
 * complete on bar. Outside the tensor the box is filled with zeros. */
__device__ __forceinline__ void wl__tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                             int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
               : "memory");
}

/* Make the initialised barriers visible to the copy engine. */
__device__ __forceinline__ void wl__mbar_init_fence(void) {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* Registers move from the producer warpgroup (40 each) to the consumers (232 each): 128 x 40 +
 * 256 x 232 = 384 x 168, the budget at entry. */
__device__ __forceinline__ void wl__setmaxnreg_producer(void) {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
}
__device__ __forceinline__ void wl__setmaxnreg_consumer(void) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
}

__device__ __forceinline__ void wl__wg_fence(void) {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wl__wg_commit(void) {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

/* The accumulator operands of a wgmma: the register list "%0, ..., %63" (then "%64, ..., %127"
 * for n256) in the instruction's text, and 64 "+f" operands from d[o] on. The accumulators stay
 * "+f" operands throughout so the compiler keeps them in the same registers between issue and
 * wait. */
#define WL__WG_REGS_0_63                                                                           \
  "%0, %1, %2, %3, %4, %5, %6, %7, "                                                               \
  "%8, %9, %10, %11, %12, %13, %14, %15, "                                                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, "                                                       \
  "%24, %25, %26, %27, %28, %29, %30, %31, "                                                       \
  "%32, %33, %34, %35, %36, %37, %38, %39, "                                                       \
  "%40, %41, %42, %43, %44, %45, %46, %47, "                                                       \
  "%48, %49, %50, %51, %52, %53, %54, %55, "                                                       \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define WL__WG_REGS_64_127                                                                         \
  "%64, %65, %66, %67, %68, %69, %70, %71, "                                                       \
  "%72, %73, %74, %75, %76, %77, %78, %79, "                                                       \
  "%80, %81, %82, %83, %84, %85, %86, %87, "                                                       \
  "%88, %89, %90, %91, %92, %93, %94, %95, "                                                       \
  "%96, %97, %98, %99, %100, %101, %102, %103, "                                                   \
  "%104, %105, %106, %107, %108, %109, %110, %111, "                                               \
  "%112, %113, %114, %115, %116, %117, %118, %119, "                                               \
  "%120, %121, %122, %123, %124, %125, %126, %127"
#define WL__WG_ACC64(d, o)                                                                         \
  "+f"(d[(o) + 0]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]),        \
      "+f"(d[(o) + 5]), "+f"(d[(o) + 6]), "+f"(d[(o) + 7]), "+f"(d[(o) + 8]), "+f"(d[(o) + 9]),    \
      "+f"(d[(o) + 10]), "+f"(d[(o) + 11]), "+f"(d[(o) + 12]), "+f"(d[(o) + 13]),                  \
      "+f"(d[(o) + 14]), "+f"(d[(o) + 15]), "+f"(d[(o) + 16]), "+f"(d[(o) + 17]),                  \
      "+f"(d[(o) + 18]), "+f"(d[(o) + 19]), "+f"(d[(o) + 20]), "+f"(d[(o) + 21]),                  \
      "+f"(d[(o) + 22]), "+f"(d[(o) + 23]), "+f"(d[(o) + 24]), "+f"(d[(o) + 25]),                  \
      "+f"(d[(o) + 26]), "+f"(d[(o) + 27]), "+f"(d[(o) + 28]), "+f"(d[(o) + 29]),                  \
      "+f"(d[(o) + 30]), "+f"(d[(o) + 31]), "+f"(d[(o) + 32]), "+f"(d[(o) + 33]),                  \
      "+f"(d[(o) + 34]), "+f"(d[(o) + 35]), "+f"(d[(o) + 36]), "+f"(d[(o) + 37]),                  \
      "+f"(d[(o) + 38]), "+f"(d[(o) + 39]), "+f"(d[(o) + 40]), "+f"(d[(o) + 41]),                  \
      "+f"(d[(o) + 42]), "+f"(d[(o) + 43]), "+f"(d[(o) + 44]), "+f"(d[(o) + 45]),                  \
      "+f"(d[(o) + 46]), "+f"(d[(o) + 47]), "+f"(d[(o) + 48]), "+f"(d[(o) + 49]),                  \
      "+f"(d[(o) + 50]), "+f"(d[(o) + 51]), "+f"(d[(o) + 52]), "+f"(d[(o) + 53]),                  \
      "+f"(d[(o) + 54]), "+f"(d[(o) + 55]), "+f"(d[(o) + 56]), "+f"(d[(o) + 57]),                  \
      "+f"(d[(o) + 58]), "+f"(d[(o) + 59]), "+f"(d[(o) + 60]), "+f"(d[(o) + 61]),                  \
      "+f"(d[(o) + 62]), "+f"(d[(o) + 63])

/* d (m64 x nN fp32 fragments) += A B for one k16 step; TA/TB: the operand is MN-major in shared
 * memory (the transpose bits, bf16 only). */
template <bool TA, bool TB>
__device__ __forceinline__ void wl__wgmma_n128(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WL__WG_REGS_0_63
               "}, %64, %65, p, 1, 1, %66, %67;\n}\n"
               : WL__WG_ACC64(d, 0)
               : "l"(da), "l"(db), "n"(int(TA)), "n"(int(TB)), "r"(1));
}

template <bool TA, bool TB>
__device__ __forceinline__ void wl__wgmma_n256(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %132, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WL__WG_REGS_0_63
               ", " WL__WG_REGS_64_127 "}, %128, %129, p, 1, 1, %130, %131;\n}\n"
               : WL__WG_ACC64(d, 0), WL__WG_ACC64(d, 64)
               : "l"(da), "l"(db), "n"(int(TA)), "n"(int(TB)), "r"(1));
}

/* TF32: d += A B for one k8 step, both operands K-major (PTX ISA, wgmma.mma_async: "The transpose
 * operation is only supported for the wgmma.mma_async variants with .f16/.bf16 types", so the
 * tf32 form has no imm-trans operands). The tensor core reads each fp32's upper 19 bits; the
 * operands arrive already rounded (cvt.rna, wl__tf32_pack). */
__device__ __forceinline__ void wl__wgmma_tf32_n128(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" WL__WG_REGS_0_63
               "}, %64, %65, p, 1, 1;\n}\n"
               : WL__WG_ACC64(d, 0)
               : "l"(da), "l"(db), "r"(1));
}

__device__ __forceinline__ void wl__wgmma_tf32_n256(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {" WL__WG_REGS_0_63
               ", " WL__WG_REGS_64_127 "}, %128, %129, p, 1, 1;\n}\n"
               : WL__WG_ACC64(d, 0), WL__WG_ACC64(d, 64)
               : "l"(da), "l"(db), "r"(1));
}

template <int N> __device__ __forceinline__ void wl__wg_wait(void) {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

template <class T, int BN, bool TA, bool TB>
__device__ __forceinline__ void wl__wgmma(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (wl__wg_elem<T>::TF32) {
    static_assert(!TA && !TB, "tf32 wgmma reads K-major operands only");
    if constexpr (BN == 256)
      wl__wgmma_tf32_n256(d, da, db);
    else
      wl__wgmma_tf32_n128(d, da, db);
  } else if constexpr (BN == 256) {
    wl__wgmma_n256<TA, TB>(d, da, db);
  } else {
    wl__wgmma_n128<TA, TB>(d, da, db);
  }
}

#endif /* WL_WGMMA */

/* ------------------------------------------------------------------------------------------------
 * The kernels. A_MN: A is M-contiguous in memory (ta = WL_TRANS), B_MN: B is N-contiguous
 * (tb = WL_NOTRANS); the other layouts are K-contiguous. Shared memory per stage: A's k-tile
 * (BM/64 boxes) then B's (BN/64 boxes), each box 64 rows of 128 bytes swizzled by TMA in
 * 1024-byte atoms. K-major boxes hold 64 rows of M or N along k; MN-major boxes hold 64 k-rows of
 * 64 consecutive M or N, so:
 *   K-major:  descriptor start at row 0 + 32 bytes per k16 step, SBO = 1024 (8-row groups);
 *   MN-major: start at k-row 16 per k16 step (2048 bytes), SBO = 1024 (8 k-rows), LBO = 8192
 *             (the next 64 of M or N, one box further).
 * Two kernels share the pieces below: one block per tile of C, and a persistent one (a block per
 * SM walks tiles t, t + grid, ...) whose pipeline runs on from one tile into the next.
 * ----------------------------------------------------------------------------------------------*/

#if WL_WGMMA /* the device pass for sm_90a (or the emulation): the pieces use its instructions */

/* Tile t's origin in C. Groups of 8 tile rows walked column by column, so that blocks running at
 * the same time (consecutive t) share A's rows and B's columns in L2. */
__device__ __forceinline__ void wl__wg_tile(int t, int tiles_m, int tiles_n, int bn, int &m0,
                                            int &n0) {
  const int per_group = 8 * tiles_n, group = t / per_group;
  const int first_m = group * 8, rows = min(tiles_m - first_m, 8);
  const int in_group = t % per_group;
  m0 = (first_m + in_group % rows) * WL__WG_BM, n0 = (in_group / rows) * bn;
}

/* One operand's k-tile: ROWS of M or N from mn0 at k0, as ROWS / 64 boxes at dst. MN: the
 * operand is M- or N-contiguous (the tensor map's first coordinate is then M or N). */
template <int ROWS, bool MN>
__device__ __forceinline__ void wl__wg_load_operand(uint32_t dst, const CUtensorMap &map,
                                                    uint32_t full, int mn0, int k0) {
#pragma unroll
  for (int i = 0; i < ROWS / 64; i++) {
    if (MN)
      wl__tma_load(dst + i * WL__WG_BOX_BYTES, &map, full, mn0 + 64 * i, k0);
    else
      wl__tma_load(dst + i * WL__WG_BOX_BYTES, &map, full, k0, mn0 + 64 * i);
  }
}

/* The producer's copies of k-tile k0 of the tile at (m0, n0) into the stage at sa; its bytes
 * complete on full. */
template <int BN, bool A_MN, bool B_MN>
__device__ __forceinline__ void wl__wg_load(const CUtensorMap &map_a, const CUtensorMap &map_b,
                                            uint32_t sa, uint32_t full, int m0, int n0, int k0) {
  /* a box outside the tensor still delivers all its (zero) bytes */
  wl__mbar_expect_tx(full, wl__wg_shape<BN>::STAGE_BYTES);
  wl__wg_load_operand<WL__WG_BM, A_MN>(sa, map_a, full, m0, k0);
  wl__wg_load_operand<BN, B_MN>(sa + wl__wg_shape<BN>::A_BYTES, map_b, full, n0, k0);
}

/* A consumer warpgroup's wgmmas over one k-tile: its 64 rows of A at sa, B at sb; 4 steps of 32
 * bytes of K (k16 bf16 or k8 tf32; MN-major, bf16 only: 16 k-rows of 128 bytes). */
template <class T, int BN, bool A_MN, bool B_MN>
__device__ __forceinline__ void wl__wg_mma(float (&d)[BN / 2], uint32_t sa, uint32_t sb) {
  wl__wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    const uint64_t da = A_MN ? wl__wg_desc(sa + kk * 2048, WL__WG_BOX_BYTES, 1024)
                             : wl__wg_desc(sa + kk * 32, 16, 1024);
    const uint64_t db = B_MN ? wl__wg_desc(sb + kk * 2048, WL__WG_BOX_BYTES, 1024)
                             : wl__wg_desc(sb + kk * 32, 16, 1024);
    wl__wgmma<T, BN, A_MN, B_MN>(d, da, db);
  }
  wl__wg_commit();
}

/* C = alpha D + beta C for a consumer warpgroup's 64 x BN. Fragment of m64nN: warp w of the group
 * holds rows 16w + lane/4 (+8), and in each n8 block j columns 8j + 2(lane%4) (+1): d[4j] (r, c),
 * d[4j+1] (r, c+1), d[4j+2] (r+8, c), d[4j+3] (r+8, c+1). Pairs go out as float2 when C allows. */
template <int BN>
__device__ __forceinline__ void wl__wg_epilogue(const float (&d)[BN / 2], int row0, int n0, int M,
                                                int N, float alpha, float beta, float *C,
                                                long long ldc, int lane) {
  const bool pair = ((uintptr_t)C % 8 == 0) && (ldc % 2 == 0);
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    const int col = n0 + j * 8 + 2 * (lane & 3);
    if (col >= N) continue;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int row = row0 + 8 * h;
      if (row >= M) continue;
      const float x = alpha * d[4 * j + 2 * h], y = alpha * d[4 * j + 2 * h + 1];
      float *p = C + (long long)row * ldc + col;
      if (pair && col + 1 < N) {
        float2 v = make_float2(x, y);
        if (beta != 0.0f) {
          const float2 o = *reinterpret_cast<const float2 *>(p);
          v.x += beta * o.x, v.y += beta * o.y;
        }
        *reinterpret_cast<float2 *>(p) = v;
      } else {
        p[0] = beta == 0.0f ? x : x + beta * p[0];
        if (col + 1 < N) p[1] = beta == 0.0f ? y : y + beta * p[1];
      }
    }
  }
}

/* The dynamic shared memory's first 1024-byte boundary (the swizzle atoms need it; the launch asks
 * for the slack). The stages start there, then the mbarriers: full[s] (the copies' bytes), then
 * empty[s] (the consumer warps are done with the stage). Thread 0 initialises them. */
template <int BN> __device__ __forceinline__ uint32_t wl__wg_setup(int tid) {
#if defined(WL_CUDA_EMU)
  unsigned char *wl__wg_smem = wl__emu_smem();
#else
  extern __shared__ __align__(1024) unsigned char wl__wg_smem[];
#endif
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wl__wg_smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  if (tid == 0) {
    const uint32_t bars = base + WL__WG_STAGES * wl__wg_shape<BN>::STAGE_BYTES;
    for (int s = 0; s < WL__WG_STAGES; s++) {
      wl__mbar_init(bars + 8u * (uint32_t)s, 1);
      wl__mbar_init(bars + 8u * (uint32_t)(WL__WG_STAGES + s), 8); /* consumer warps */
    }
    wl__mbar_init_fence();
  }
  __syncthreads();
  return base;
}

/* The producer's copies of one tile's k-tiles, the block's k-tiles it0 .. it0 + ktiles - 1 (the
 * same running count as wl__wg_consume's), each into its stage once the consumers have given it
 * back: the first round waits on the phase before the barrier's first, already complete. */
template <class T, int BN, bool A_MN, bool B_MN>
__device__ __forceinline__ void wl__wg_produce(const CUtensorMap &map_a, const CUtensorMap &map_b,
                                               uint32_t base, uint32_t it0, int ktiles, int m0,
                                               int n0) {
  typedef wl__wg_shape<BN> shape;
  const uint32_t bars = base + WL__WG_STAGES * shape::STAGE_BYTES;
  for (int kt = 0; kt < ktiles; kt++) {
    const uint32_t it = it0 + (uint32_t)kt, s = it % WL__WG_STAGES;
    wl__mbar_wait(bars + 8u * (WL__WG_STAGES + s), ((it / WL__WG_STAGES) & 1u) ^ 1u);
    wl__wg_load<BN, A_MN, B_MN>(map_a, map_b, base + s * shape::STAGE_BYTES, bars + 8u * s, m0, n0,
                                kt * wl__wg_elem<T>::BK);
  }
}

/* A consumer warpgroup's k-loop over one tile: the block's k-tiles it0 .. it0 + ktiles - 1 (the
 * stage is the running count mod STAGES, its phase the count / STAGES, so a persistent block's
 * pipeline runs on from tile to tile), each stage given back once the next k-tile's wgmmas are
 * issued and the previous group has finished reading it. The last k-tile's stage stays held, its
 * wgmmas complete on return: the caller gives it back when another tile follows. */
template <class T, int BN, bool A_MN, bool B_MN>
__device__ __forceinline__ void wl__wg_consume(float (&d)[BN / 2], uint32_t base, uint32_t it0,
                                               int ktiles, int cw, int lane) {
  typedef wl__wg_shape<BN> shape;
  const uint32_t bars = base + WL__WG_STAGES * shape::STAGE_BYTES;
  for (int kt = 0; kt < ktiles; kt++) {
    const uint32_t it = it0 + (uint32_t)kt, s = it % WL__WG_STAGES;
    wl__mbar_wait(bars + 8u * s, (it / WL__WG_STAGES) & 1u);
    const uint32_t sa = base + s * shape::STAGE_BYTES;
    wl__wg_mma<T, BN, A_MN, B_MN>(d, sa + cw * WL__WG_BOX_BYTES, sa + shape::A_BYTES);
    /* this k-tile's group may still run; the previous one has finished reading its stage */
    wl__wg_wait<1>();
    if (kt > 0) {
      __syncwarp();
      if (lane == 0) wl__mbar_arrive(bars + 8u * (WL__WG_STAGES + (it - 1) % WL__WG_STAGES));
    }
  }
  wl__wg_wait<0>();
}

#endif /* WL_WGMMA */

/* One block per tile: block b computes tile b. */
template <class T, int BN, bool A_MN, bool B_MN>
__global__ void __launch_bounds__(WL__WG_THREADS, 1)
    wl__gemm_wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                          const __grid_constant__ CUtensorMap map_b, int M, int N, int K,
                          float alpha, float beta, float *C, long long ldc, int tiles_m,
                          int tiles_n) {
#if WL_WGMMA
  const int tid = threadIdx.x, wg = tid / 128;
  const uint32_t base = wl__wg_setup<BN>(tid);
  int m0, n0;
  wl__wg_tile(blockIdx.x, tiles_m, tiles_n, BN, m0, n0);
  const int ktiles = (K + wl__wg_elem<T>::BK - 1) / wl__wg_elem<T>::BK;

  if (wg == 0) { /* producer: one thread issues every copy; the others give up registers */
    wl__setmaxnreg_producer();
    if (tid == 0) wl__wg_produce<T, BN, A_MN, B_MN>(map_a, map_b, base, 0, ktiles, m0, n0);
  } else { /* consumers: warpgroup 1 computes rows [0, 64) of the tile, warpgroup 2 [64, 128) */
    wl__setmaxnreg_consumer();
    const int cw = wg - 1, lane = tid & 31;
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;

    wl__wg_consume<T, BN, A_MN, B_MN>(d, base, 0, ktiles, cw, lane);
    const int row0 = m0 + cw * 64 + ((tid & 127) >> 5) * 16 + (lane >> 2);
    wl__wg_epilogue<BN>(d, row0, n0, M, N, alpha, beta, C, ldc, lane);
  }
#else
  __trap(); /* not built for sm_90a: the host never launches this (wl__wgmma_usable) */
#endif
}

/* Persistent: gridDim.x blocks (at most one per SM) walk the tiles t = blockIdx.x + i gridDim.x in
 * the order above, so the blocks running at any time still hold consecutive tiles. The stage and
 * its phase follow a k-tile count that runs on across the block's tiles: the producer loads the
 * next tile's first k-tiles while the consumers finish the current one and store it, and no
 * block waits for a tail of launches. The consumers give the last stage of a tile back as soon as
 * its wgmmas are done, before their epilogue. */
template <class T, int BN, bool A_MN, bool B_MN>
__global__ void __launch_bounds__(WL__WG_THREADS, 1)
    wl__gemm_wgmma_persistent_kernel(const __grid_constant__ CUtensorMap map_a,
                                     const __grid_constant__ CUtensorMap map_b, int M, int N, int K,
                                     float alpha, float beta, float *C, long long ldc, int tiles_m,
                                     int tiles_n) {
#if WL_WGMMA
  typedef wl__wg_shape<BN> shape;
  constexpr int BK = wl__wg_elem<T>::BK, STAGES = WL__WG_STAGES;
  const int tid = threadIdx.x, wg = tid / 128;
  const uint32_t base = wl__wg_setup<BN>(tid);
  const uint32_t bars = base + STAGES * shape::STAGE_BYTES;
  auto empty_bar = [&](uint32_t s) { return bars + 8u * (STAGES + s); };
  const int tiles = tiles_m * tiles_n, ktiles = (K + BK - 1) / BK;

  if (wg == 0) {
    wl__setmaxnreg_producer();
    if (tid == 0) {
      uint32_t it = 0; /* k-tiles this block has loaded, over all its tiles */
      for (int t = blockIdx.x; t < tiles; t += gridDim.x, it += (uint32_t)ktiles) {
        int m0, n0;
        wl__wg_tile(t, tiles_m, tiles_n, BN, m0, n0);
        wl__wg_produce<T, BN, A_MN, B_MN>(map_a, map_b, base, it, ktiles, m0, n0);
      }
    }
  } else {
    wl__setmaxnreg_consumer();
    const int cw = wg - 1, lane = tid & 31;
    uint32_t it = 0; /* k-tiles this block has consumed: the same sequence as the producer's */
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int m0, n0;
      wl__wg_tile(t, tiles_m, tiles_n, BN, m0, n0);
      float d[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
      wl__wg_consume<T, BN, A_MN, B_MN>(d, base, it, ktiles, cw, lane);
      it += (uint32_t)ktiles;
      /* the tile's last stage: free for the next tile's loads during this epilogue (none when K
       * is 0: no stage was loaded) */
      if (ktiles > 0) {
        __syncwarp();
        if (lane == 0) wl__mbar_arrive(empty_bar((it - 1) % STAGES));
      }
      const int row0 = m0 + cw * 64 + ((tid & 127) >> 5) * 16 + (lane >> 2);
      wl__wg_epilogue<BN>(d, row0, n0, M, N, alpha, beta, C, ldc, lane);
    }
  }
#else
  __trap();
#endif
}

/* TF32 operands for wgmma, which reads them K-major only (no transpose for tf32): dst is R x K,
 * K contiguous, ldd apart, each element rounded to TF32 as the mma.sync path rounds (cvt.rna, so
 * both paths give the same products), from src R x K with K contiguous (TRANS false: a rounding
 * copy) or K x R with R contiguous (TRANS true: transposed through a 32 x 33 shared tile, so that
 * reads and writes are both coalesced). 32 x 8 threads a 32 x 32 tile; k tiles along x, r tiles
 * along y (grid-stride: y is at most 65535). */
template <bool TRANS>
__global__ void __launch_bounds__(256)
    wl__tf32_pack(int R, int K, const float *__restrict__ src, long long ld,
                  float *__restrict__ dst, long long ldd) {
  __shared__ float tile[32][33];
  const int k0 = blockIdx.x * 32, tx = threadIdx.x, ty = threadIdx.y;
  for (long long r0 = blockIdx.y * 32ll; r0 < R; r0 += gridDim.y * 32ll) {
    if (TRANS) {
#pragma unroll
      for (int i = 0; i < 32; i += 8) {
        const long long k = k0 + ty + i, r = r0 + tx;
        if (k < K && r < R) tile[ty + i][tx] = src[k * ld + r];
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < 32; i += 8) {
        const long long r = r0 + ty + i, k = k0 + tx;
        if (r < R && k < K) dst[r * ldd + k] = __uint_as_float(wl__to_tf32(tile[tx][ty + i]));
      }
      __syncthreads();
    } else {
#pragma unroll
      for (int i = 0; i < 32; i += 8) {
        const long long r = r0 + ty + i, k = k0 + tx;
        if (r < R && k < K) dst[r * ldd + k] = __uint_as_float(wl__to_tf32(src[r * ld + k]));
      }
    }
  }
}

/* ------------------------------------------------------------------------------------------------
 * Host side
 * ----------------------------------------------------------------------------------------------*/

#if defined(WL_CUDA_EMU)
template <class T> static bool wl__wgmma_usable(void) {
  return true;
}

static bool wl__tensor_map(CUtensorMap *map, const void *p, size_t rows, size_t cols, size_t ld,
                           unsigned elem) {
  map->p = p;
  map->dims[0] = cols, map->dims[1] = rows;
  map->stride = ld * elem;
  map->elem = elem;
  return true;
}
#else
/* cuTensorMapEncodeTiled through the runtime, so that only libcudart is linked; NULL when the
 * driver lacks it. Looked up once. */
static PFN_cuTensorMapEncodeTiled_v12000 wl__encode_tiled(void) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError(); /* not sticky: the mma.sync path runs instead */
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

/* Whether the current device runs the wgmma kernels of element type T: compute capability 9.0
 * exactly (sm_90a code runs nowhere else), sm_90a among the build's architectures (WL_HAVE_SM90A,
 * from CMake) and its code the one loaded (binary version 90), the tensor-map encoder found, and
 * both kernels built with the registers setmaxnreg's hand-over assumes: the producer gives back 128
 * x (R - 40) and the consumers take 256 x (232 - R), so R >= 168 (ptxas gives exactly 168 for 384
 * threads today, for every instance of either; with fewer, setmaxnreg.inc would wait forever).
 * cudaFuncGetAttributes neither synchronises nor is refused during a stream capture (reading a
 * device variable back would do both). Definite answers are cached per device: 0 = not yet asked, 1
 * = yes, 2 = no. Errors are cleared only when a call made here failed: a pending one is the
 * caller's. */
template <class T> static bool wl__wgmma_usable(void) {
  static int cache[64]; /* per T: one per instance */
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
    cudaGetLastError();
    return false;
  }
  if (dev < 64) {
    int c = __atomic_load_n(&cache[dev], __ATOMIC_RELAXED);
    if (c) return c == 1;
  }
#if !defined(WL_HAVE_SM90A)
  if (dev < 64) __atomic_store_n(&cache[dev], 2, __ATOMIC_RELAXED);
  return false;
#else
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false; /* not cached: a transient failure is not an answer */
  }
  bool ok = major == 9 && minor == 0 && wl__encode_tiled() != nullptr;
  if (ok) {
    /* Both schedules at both widths: the 256-wide tiles hold the most accumulators. */
    const void *kernels[] = {(const void *)wl__gemm_wgmma_kernel<T, 128, false, false>,
                             (const void *)wl__gemm_wgmma_kernel<T, 256, false, false>,
                             (const void *)wl__gemm_wgmma_persistent_kernel<T, 128, false, false>,
                             (const void *)wl__gemm_wgmma_persistent_kernel<T, 256, false, false>};
    for (const void *k : kernels) {
      cudaFuncAttributes fa;
      if (cudaFuncGetAttributes(&fa, k) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      ok = ok && fa.binaryVersion == 90 && fa.numRegs >= 168;
    }
  }
  if (dev < 64) __atomic_store_n(&cache[dev], ok ? 1 : 2, __ATOMIC_RELAXED);
  return ok;
#endif
}

/* A row-major matrix of rows x cols (cols contiguous, ld elements apart) of bf16 (elem 2) or fp32
 * (elem 4) as a 2-D tensor map with boxes of 64 rows of 128 bytes (64 x 64 bf16, 32 x 64 fp32) and
 * the 128-byte swizzle; false when the encoder refuses it. */
static bool wl__tensor_map(CUtensorMap *map, const void *p, size_t rows, size_t cols, size_t ld,
                           unsigned elem) {
  const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)ld * elem};
  const cuuint32_t box[2] = {128 / elem, 64}, estr[2] = {1, 1};
  CUresult r = wl__encode_tiled()(
      map, elem == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
      const_cast<void *>(p), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}
#endif

/* The device's SM count: the persistent grid. Cached per device (0 = not yet asked); not in the
 * emulation, whose tests change it between calls. 0 when unknown. */
static int wl__sm_count(void) {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
    cudaGetLastError();
    return 0;
  }
#if !defined(WL_CUDA_EMU)
  static int cache[64];
  if (dev < 64 && (n = __atomic_load_n(&cache[dev], __ATOMIC_RELAXED)) != 0) return n;
#endif
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
    cudaGetLastError();
    return 0;
  }
#if !defined(WL_CUDA_EMU)
  if (dev < 64) __atomic_store_n(&cache[dev], n, __ATOMIC_RELAXED);
#endif
  return n;
}

/* wl_cuda_gemm_bf16_set_schedule's: the schedule and the persistent grid's cap (0: none). Read
 * with relaxed loads on every call. */
static int wl__wg_sched, wl__wg_max_blocks;

template <class T, int BN, bool A_MN, bool B_MN, bool PERSIST>
static int wl__launch_wgmma(const CUtensorMap &ma, const CUtensorMap &mb, int M, int N, int K,
                            float alpha, float beta, float *C, long long ldc, unsigned grid,
                            cudaStream_t st) {
  const int tiles_m = (M + WL__WG_BM - 1) / WL__WG_BM, tiles_n = (N + BN - 1) / BN;
  auto kern = PERSIST ? wl__gemm_wgmma_persistent_kernel<T, BN, A_MN, B_MN>
                      : wl__gemm_wgmma_kernel<T, BN, A_MN, B_MN>;
  const int smem = wl__wg_shape<BN>::SMEM;
  static_assert(wl__wg_shape<BN>::SMEM <= 227 * 1024, "sm_90's dynamic shared memory per block");
  /* Once per instance and device (the attribute stays set): about a microsecond a call saved. */
  static int smem_set[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return wl__cuda_fail(cudaGetLastError());
  bool set = dev < 64 && __atomic_load_n(&smem_set[dev], __ATOMIC_RELAXED);
  for (int attempt = 0;; attempt++) {
    if (!set) {
      cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return wl__cuda_fail(e);
      if (dev < 64) __atomic_store_n(&smem_set[dev], 1, __ATOMIC_RELAXED);
    }
    WL__LAUNCH_SMEM(kern, grid, WL__WG_THREADS, smem, st, ma, mb, M, N, K, alpha, beta, C, ldc,
                    tiles_m, tiles_n);
    cudaError_t e = cudaGetLastError();
    /* The attribute is the kernel's in the device's context: after a device reset
     * (cudaDeviceReset, by anyone in the process) the new context's kernel has the default
     * limit, and the launch is refused as asking for too much shared memory. Raised again, it
     * is launched once more. */
    if (e == cudaErrorInvalidValue && set && attempt == 0) {
      set = false;
      continue;
    }
    return e == cudaSuccess ? 0 : wl__cuda_fail(e);
  }
}

template <class T, int BN, bool PERSIST>
static int wl__launch_wgmma_t(bool a_mn, bool b_mn, const CUtensorMap &ma, const CUtensorMap &mb,
                              int M, int N, int K, float alpha, float beta, float *C, long long ldc,
                              unsigned grid, cudaStream_t st) {
  if constexpr (wl__wg_elem<T>::TF32) { /* K-major only: the caller packed both operands so */
    return wl__launch_wgmma<T, BN, false, false, PERSIST>(ma, mb, M, N, K, alpha, beta, C, ldc,
                                                          grid, st);
  } else {
    if (!a_mn && !b_mn)
      return wl__launch_wgmma<T, BN, false, false, PERSIST>(ma, mb, M, N, K, alpha, beta, C, ldc,
                                                            grid, st);
    if (!a_mn)
      return wl__launch_wgmma<T, BN, false, true, PERSIST>(ma, mb, M, N, K, alpha, beta, C, ldc,
                                                           grid, st);
    if (!b_mn)
      return wl__launch_wgmma<T, BN, true, false, PERSIST>(ma, mb, M, N, K, alpha, beta, C, ldc,
                                                           grid, st);
    return wl__launch_wgmma<T, BN, true, true, PERSIST>(ma, mb, M, N, K, alpha, beta, C, ldc, grid,
                                                        st);
  }
}

/* The tile width and grid for an M x N C: 128 x 256 tiles when they fill the SMs of an
 * H100/H200, else 128 x 128; persistent (grid below the tile count) per the schedule. */
struct wl__wg_plan {
  int bn;
  long long tiles;
  unsigned grid;
  bool persist;
};

static wl__wg_plan wl__wg_plan_for(int M, int N) {
  wl__wg_plan p;
  const long long tm = (M + WL__WG_BM - 1) / WL__WG_BM;
  p.bn = tm * ((N + 255) / 256) >= WL__FILL_TILES ? 256 : 128;
  p.tiles = tm * ((N + p.bn - 1) / p.bn);
  const int sched = __atomic_load_n(&wl__wg_sched, __ATOMIC_RELAXED);
  const int cap = __atomic_load_n(&wl__wg_max_blocks, __ATOMIC_RELAXED);
  const long long sms = wl__sm_count();
  long long grid = sms > 0 ? sms : p.tiles; /* unknown: as many blocks as tiles */
  if (cap > 0 && cap < grid) grid = cap;
  p.persist = sched == WL_GEMM_SCHED_PERSISTENT ||
              (sched == WL_GEMM_SCHED_AUTO && sms > 0 && p.tiles > sms);
  if (!p.persist || grid > p.tiles) grid = p.tiles;
  p.grid = (unsigned)grid;
  return p;
}

/* The tile plan for M x N and the launch of the kernels of type T over the operands' maps. */
template <class T>
static int wl__wg_run(bool a_mn, bool b_mn, const CUtensorMap &ma, const CUtensorMap &mb, int M,
                      int N, int K, float alpha, float beta, float *C, size_t ldc,
                      cudaStream_t st) {
  const wl__wg_plan p = wl__wg_plan_for(M, N);
  /* the kernels index tiles in int, up to the last tile + the grid (gemm_args bounds M and N,
   * not their product) */
  if (p.tiles + p.grid > 0x7fffffffLL) return -EINVAL;
  const long long lc = (long long)ldc;
  if (p.persist)
    return p.bn == 256 ? wl__launch_wgmma_t<T, 256, true>(a_mn, b_mn, ma, mb, M, N, K, alpha, beta,
                                                          C, lc, p.grid, st)
                       : wl__launch_wgmma_t<T, 128, true>(a_mn, b_mn, ma, mb, M, N, K, alpha, beta,
                                                          C, lc, p.grid, st);
  return p.bn == 256 ? wl__launch_wgmma_t<T, 256, false>(a_mn, b_mn, ma, mb, M, N, K, alpha, beta,
                                                         C, lc, p.grid, st)
                     : wl__launch_wgmma_t<T, 128, false>(a_mn, b_mn, ma, mb, M, N, K, alpha, beta,
                                                         C, lc, p.grid, st);
}

static const char *wl__wg_schedule_name(size_t m, size_t n) {
  if (m == 0 || n == 0 || m > INT_MAX - 256 || n > INT_MAX - 256) return "wgmma";
  return wl__wg_plan_for((int)m, (int)n).persist ? "wgmma persistent" : "wgmma";
}

extern "C" WL_API const char *wl_cuda_gemm_bf16_kernel(void) {
  return wl__wgmma_usable<uint16_t>() ? "wgmma" : "mma.sync";
}

extern "C" WL_API int wl_cuda_gemm_bf16_set_schedule(wl_gemm_sched_t sched, int max_blocks) {
  if (sched != WL_GEMM_SCHED_AUTO && sched != WL_GEMM_SCHED_PERSISTENT &&
      sched != WL_GEMM_SCHED_NONPERSISTENT)
    return -EINVAL;
  if (max_blocks < 0) return -EINVAL;
  __atomic_store_n(&wl__wg_sched, (int)sched, __ATOMIC_RELAXED);
  __atomic_store_n(&wl__wg_max_blocks, max_blocks, __ATOMIC_RELAXED);
  return 0;
}

extern "C" WL_API const char *wl_cuda_gemm_bf16_schedule(size_t m, size_t n) {
  if (!wl__wgmma_usable<uint16_t>()) return "mma.sync";
  return wl__wg_schedule_name(m, n);
}

int wl__gemm_bf16_wgmma(wl_trans_t ta, wl_trans_t tb, int M, int N, int K, float alpha,
                        const uint16_t *a, size_t lda, const uint16_t *b, size_t ldb, float beta,
                        float *C, size_t ldc, cudaStream_t st) {
  /* TMA: 16-byte aligned bases and row strides (a multiple of 8 bf16), strides below 2^40 */
  if (((uintptr_t)a | (uintptr_t)b) % 16 != 0 || lda % 8 != 0 || ldb % 8 != 0) return 1;
  if (lda >= (1ull << 39) || ldb >= (1ull << 39)) return 1;
  if (!wl__wgmma_usable<uint16_t>()) return 1;
  const bool a_mn = ta == WL_TRANS, b_mn = tb == WL_NOTRANS;
  CUtensorMap ma, mb;
  /* A is M x K (ta = N) or stored K x M; B is K x N (tb = N) or stored N x K */
  if (!wl__tensor_map(&ma, a, a_mn ? K : M, a_mn ? M : K, lda, 2) ||
      !wl__tensor_map(&mb, b, b_mn ? K : N, b_mn ? N : K, ldb, 2))
    return 1;
  return wl__wg_run<uint16_t>(a_mn, b_mn, ma, mb, M, N, K, alpha, beta, C, ldc, st);
}

/* ------------------------------------------------------------------------------------------------
 * TF32
 * ----------------------------------------------------------------------------------------------*/

/* wl_cuda_sgemm_tf32_set_wgmma's: 1 = mma.sync only. */
static int wl__tf32_wgmma_off;

extern "C" WL_API int wl_cuda_sgemm_tf32_set_wgmma(int on) {
  if (on != 0 && on != 1) return -EINVAL;
  __atomic_store_n(&wl__tf32_wgmma_off, !on, __ATOMIC_RELAXED);
  return 0;
}

static bool wl__tf32_wgmma_on(void) {
  return !__atomic_load_n(&wl__tf32_wgmma_off, __ATOMIC_RELAXED) && wl__wgmma_usable<float>();
}

extern "C" WL_API const char *wl_cuda_sgemm_tf32_kernel(void) {
  if (wl__tf32_wgmma_on()) return "wgmma";
  return wl__cuda_cc_major() >= 8 ? "mma.sync" : "simt";
}

extern "C" WL_API const char *wl_cuda_sgemm_tf32_schedule(size_t m, size_t n) {
  if (!wl__tf32_wgmma_on()) return wl_cuda_sgemm_tf32_kernel();
  return wl__wg_schedule_name(m, n);
}

/* One operand into its K-major TF32 copy (R x K, ldd apart); trans: stored K x R. */
static int wl__tf32_pack_launch(bool trans, int R, int K, const float *src, size_t ld, float *dst,
                                size_t ldd, cudaStream_t st) {
  const dim3 block(32, 8);
  const long long rt = ((long long)R + 31) / 32;
  const dim3 grid((unsigned)(((long long)K + 31) / 32), (unsigned)(rt < 65535 ? rt : 65535));
  if (trans)
    WL__LAUNCH(wl__tf32_pack<true>, grid, block, st, R, K, src, (long long)ld, dst, (long long)ldd);
  else
    WL__LAUNCH(wl__tf32_pack<false>, grid, block, st, R, K, src, (long long)ld, dst,
               (long long)ldd);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : wl__cuda_fail(e);
}

int wl__gemm_tf32_wgmma(wl_trans_t ta, wl_trans_t tb, int M, int N, int K, float alpha,
                        const float *a, size_t lda, const float *b, size_t ldb, float beta,
                        float *C, size_t ldc, cudaStream_t st) {
  if (!wl__tf32_wgmma_on()) return 1;
  /* Both operands are copied K-major and rounded into one stream-ordered scratch allocation
   * (the default pool's: no device-wide synchronisation), rows padded to 16 bytes for TMA. The
   * copy reads and writes each operand once: (M + N) K x 8 bytes, about 1 GiB at 8192^3, some 0.25
   * ms at the H200's 4.8 TB/s against about 2.5 ms of multiply. */
  const size_t ldk = ((size_t)K + 3) / 4 * 4;
  const size_t elems = ((size_t)M + (size_t)N) * ldk;
  float *buf = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void **>(&buf), elems * sizeof(float), st) != cudaSuccess) {
    cudaGetLastError(); /* no scratch (memory full): the mma.sync path needs none */
    return 1;
  }
  float *ak = buf, *bk = buf + (size_t)M * ldk;
  CUtensorMap ma, mb;
  int rc = 1;
  if (wl__tensor_map(&ma, ak, M, K, ldk, 4) && wl__tensor_map(&mb, bk, N, K, ldk, 4)) {
    /* A is M x K (ta = N: K contiguous) or stored K x M; B is stored N x K (tb = T: K
     * contiguous) or K x N */
    rc = wl__tf32_pack_launch(ta == WL_TRANS, M, K, a, lda, ak, ldk, st);
    if (rc == 0) rc = wl__tf32_pack_launch(tb == WL_NOTRANS, N, K, b, ldb, bk, ldk, st);
    if (rc == 0) rc = wl__wg_run<float>(false, false, ma, mb, M, N, K, alpha, beta, C, ldc, st);
  }
  const cudaError_t e = cudaFreeAsync(buf, st);
  if (e != cudaSuccess && rc <= 0) rc = wl__cuda_fail(e);
  return rc;
}
