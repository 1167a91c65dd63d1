/* Shared device-side pieces of the CUDA kernels: launch error handling, GEMM operand loaders
 * (dense matrices; the convolutions add implicit ones), tile staging and mma.sync wrappers. */
#ifndef WAVELET_KERNELS_CUDA_COMMON_CUH
#define WAVELET_KERNELS_CUDA_COMMON_CUH

#if defined(WL_CUDA_EMU) /* tests/kernels/emu: the kernels run on host threads */
#include "cuda_emu.h"
#else
#include <cuda_runtime.h>
#endif
#include <errno.h>
#include <limits.h>
#include <stdint.h>

#include "wavelet/kernels.h"

/* ------------------------------------------------------------------------------------------------
 * Host side: errors
 * ----------------------------------------------------------------------------------------------*/

/* Records err as this thread's last CUDA error and maps it to our negative errno. */
int wl__cuda_fail(cudaError_t err);

/* After a launch: 0, or the mapped error of the launch. */
static inline int wl__cuda_check_launch(void) {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : wl__cuda_fail(err);
}

static inline cudaStream_t wl__stream(void *s) {
  return (cudaStream_t)s;
}

/* Every launch goes through the runtime (<<<>>>, i.e. cudaLaunchKernel) here; k is a kernel or a
 * pointer to one, smem its dynamic shared memory. The emulation in tests/kernels/emu checks the
 * launch against sm_90's limits, then runs the blocks on host threads. */
#if defined(WL_CUDA_EMU)
#define WL__LAUNCH_SMEM(k, grid, block, smem, st, ...)                                             \
  wl__emu_launch(#k, __func__, reinterpret_cast<const void *>(k), grid, block, smem, st,           \
                 [=] { k(__VA_ARGS__); })
#else
#define WL__LAUNCH_SMEM(k, grid, block, smem, st, ...) k<<<grid, block, smem, st>>>(__VA_ARGS__)
#endif
#define WL__LAUNCH(k, grid, block, st, ...) WL__LAUNCH_SMEM(k, grid, block, 0, st, __VA_ARGS__)

/* A block's static shared memory: ptxas refuses more than 48 KiB, and so do the kernels' own
 * asserts where the emulation compiles them. */
#define WL__SMEM_STATIC_MAX (48 * 1024)

/* Element counts as kernels index them: rows and columns below 2^31. */
static inline bool wl__fits_int(size_t x) {
  return x <= 0x7fffffffu;
}

/* Blocks for a grid-stride loop over n elements (capped: the loop covers the rest). */
static inline unsigned wl__blocks(size_t n, unsigned threads) {
#if defined(WL_CUDA_EMU)
  /* emulated blocks run one after another: fewer, longer loops (unless only checked) */
  const size_t most = wl__emu_check_only() ? 65535u * 8u : 3;
#else
  const size_t most = 65535u * 8u;
#endif
  size_t b = (n + threads - 1) / threads;
  return (unsigned)(b < most ? (b ? b : 1) : most);
}

/* ------------------------------------------------------------------------------------------------
 * Division by a divisor known at launch (CUTLASS's FastDivmod idea): the host finds m and s with
 * n / d == umulhi(n, m) >> s for every 0 <= n < 2^31, so a loader's index math is a multiply-high
 * and a shift instead of the dozen-plus instructions of a runtime integer division. With
 * l = ceil(log2 d) and m = ceil(2^(31+l) / d), n m / 2^(31+l) exceeds n / d by less than
 * n / 2^(31+l) < 2^-l <= 1/d, which never reaches the next integer (d == 1 takes n as is).
 * ----------------------------------------------------------------------------------------------*/

__device__ __forceinline__ uint32_t wl__umulhi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

struct wl__fdiv {
  int d;
  uint32_t mul, shr;

  /* n / d and n % d for 0 <= n < 2^31 */
  __device__ __forceinline__ int div(int n) const {
    return d == 1 ? n : (int)(wl__umulhi((uint32_t)n, mul) >> shr);
  }
  __device__ __forceinline__ int divmod(int n, int &rem) const {
    const int q = div(n);
    rem = n - q * d;
    return q;
  }
};

/* d >= 1 */
static inline wl__fdiv wl__make_fdiv(int d) {
  wl__fdiv f = {d, 0, 0};
  if (d > 1) {
    int l = 0;
    while ((1ll << l) < d) l++;
    f.mul = (uint32_t)(((1ull << (31 + l)) + (uint64_t)d - 1) / (uint64_t)d);
    f.shr = (uint32_t)(l - 1);
  }
  return f;
}

/* ------------------------------------------------------------------------------------------------
 * GEMM operands. A loader reads element (r, c) of its logical matrix (A: M x K, B: K x N), zero
 * outside [0, R) x [0, C). CONTIG_COL says along which logical axis memory is contiguous, and
 * vec() loads V elements along it at once (16 bytes) when alignment and bounds allow.
 * ----------------------------------------------------------------------------------------------*/

/* A dense row-major matrix, read as itself (TRANS = false: element (r, c) at p[r*ld + c]) or as
 * its transpose (element (r, c) at p[c*ld + r]). */
template <class T, bool TRANS> struct wl__dense {
  static constexpr bool CONTIG_COL = !TRANS;
  static constexpr int V = 16 / sizeof(T);
  const T *p;
  long long ld;
  int R, C;
  bool vec_ok; /* p 16-byte aligned and ld a multiple of V */

  __device__ __forceinline__ T at(int r, int c) const {
    if (r >= R || c >= C) return T(0);
    return TRANS ? p[(long long)c * ld + r] : p[(long long)r * ld + c];
  }
  __device__ __forceinline__ bool vec(int r, int c, T (&v)[V]) const {
    if (!vec_ok) return false;
    const T *q;
    if (!TRANS) {
      if (r >= R || c + V > C) return false;
      q = p + (long long)r * ld + c;
    } else {
      if (c >= C || r + V > R) return false;
      q = p + (long long)c * ld + r;
    }
    uint4 u = __ldg(reinterpret_cast<const uint4 *>(q));
    memcpy(v, &u, 16);
    return true;
  }
};

template <class T, bool TRANS>
static inline wl__dense<T, TRANS> wl__make_dense(const T *p, size_t ld, int R, int C) {
  wl__dense<T, TRANS> d;
  d.p = p;
  d.ld = (long long)ld;
  d.R = R;
  d.C = C;
  d.vec_ok = ((uintptr_t)p % 16 == 0) && (ld % (16 / sizeof(T)) == 0);
  return d;
}

/* A TR x TC tile of a loader's matrix staged through registers: load() issues the global reads
 * (for the next tile, while the current one is multiplied), store() hands each element to the
 * kernel's shared-memory layout. Chunks of V elements run along the loader's contiguous axis. */
template <int TR, int TC, int NT, class L, class T> struct wl__stage {
  static constexpr int V = L::V;
  static constexpr int CHUNKS = TR * TC / V;
  static constexpr int PER = (CHUNKS + NT - 1) / NT;
  static_assert(TR % V == 0 && TC % V == 0, "tile edges must hold whole vectors");
  T v[PER][V];

  __device__ __forceinline__ static void chunk_pos(int chunk, int &r, int &c) {
    if (L::CONTIG_COL) {
      r = chunk / (TC / V);
      c = (chunk % (TC / V)) * V;
    } else {
      c = chunk / (TR / V);
      r = (chunk % (TR / V)) * V;
    }
  }

  __device__ __forceinline__ void load(const L &l, int r0, int c0, int tid) {
#pragma unroll
    for (int i = 0; i < PER; i++) {
      int chunk = tid + i * NT;
      if (CHUNKS % NT != 0 && chunk >= CHUNKS) break;
      int r, c;
      chunk_pos(chunk, r, c);
      if (!l.vec(r0 + r, c0 + c, v[i])) {
#pragma unroll
        for (int e = 0; e < V; e++)
          v[i][e] = L::CONTIG_COL ? l.at(r0 + r, c0 + c + e) : l.at(r0 + r + e, c0 + c);
      }
    }
  }

  template <class F> __device__ __forceinline__ void store(F &&f, int tid) const {
#pragma unroll
    for (int i = 0; i < PER; i++) {
      int chunk = tid + i * NT;
      if (CHUNKS % NT != 0 && chunk >= CHUNKS) break;
      int r, c;
      chunk_pos(chunk, r, c);
#pragma unroll
      for (int e = 0; e < V; e++) {
        if (L::CONTIG_COL)
          f(r, c + e, v[i][e]);
        else
          f(r + e, c, v[i][e]);
      }
    }
  }
};

/* ------------------------------------------------------------------------------------------------
 * Tensor-core instructions (sm_80+; every architecture we build for has them, the guard keeps
 * an older -arch from failing to compile)
 * ----------------------------------------------------------------------------------------------*/

__device__ __forceinline__ uint32_t wl__to_tf32(float x) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
#elif defined(WL_CUDA_EMU)
  r = wl__emu_to_tf32(x);
#else
  r = __float_as_uint(x);
#endif
  return r;
}

/* d += a b for one 16x8x8 TF32 tile (fragments as in the PTX ISA's m16n8k8 layout). */
__device__ __forceinline__ void wl__mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(WL_CUDA_EMU)
  wl__emu_mma(0, d, a, b);
#else
  __trap();
#endif
}

/* d += a b for one 16x8x16 BF16 tile (fp32 accumulate). */
__device__ __forceinline__ void wl__mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(WL_CUDA_EMU)
  wl__emu_mma(1, d, a, b);
#else
  __trap();
#endif
}

#endif
