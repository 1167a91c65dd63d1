/* The CUDA GEMM kernels over operand loaders: fp32 SIMT (shared-memory and register tiling,
 * 16-byte loads, double-buffered) and tensor-core TF32/BF16 with mma.sync; C = alpha A B + beta C
 * for arbitrary M, N, K. The convolutions reuse them with implicit-GEMM loaders. */
#ifndef WAVELET_KERNELS_CUDA_GEMM_CUH
#define WAVELET_KERNELS_CUDA_GEMM_CUH

#include "common.cuh"

/* The epilogue: C is row-major with ldc; beta == 0 never reads C. */
__device__ __forceinline__ void wl__store_c(float *C, long long ldc, int M, int N, int row, int col,
                                            float acc, float alpha, float beta) {
  if (row < M && col < N) {
    float *p = C + (long long)row * ldc + col;
    *p = beta == 0.0f ? alpha * acc : alpha * acc + beta * *p;
  }
}

/* ------------------------------------------------------------------------------------------------
 * FP32 on CUDA cores. A block computes BM x BN of C with (BM/TM)(BN/TN) threads, each a TM x TN
 * register tile split in 4x4 groups spread over the block tile (so that the float4 reads of
 * shared memory by a warp fall in distinct banks). Tiles of A are kept k-major (As[k][m]) so that
 * the inner loop reads both operands as float4.
 * ----------------------------------------------------------------------------------------------*/
template <int BM, int BN, int TM, int TN, class LA, class LB>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
    wl__sgemm_simt(LA la, LB lb, int M, int N, int K, int kchunk, float alpha, float beta, float *C,
                   long long ldc) {
  constexpr int BK = 8, NT = (BM / TM) * (BN / TN);
  constexpr int GM = TM / 4, GN = TN / 4;   /* 4x4 groups per thread */
  constexpr int SM = BM / GM, SN = BN / GN; /* distance between a thread's groups */
  static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are made of 4x4 groups");
  __shared__ __align__(16) float As[2][BK][BM + 4];
  __shared__ __align__(16) float Bs[2][BK][BN + 4];
  static_assert(sizeof As + sizeof Bs <= WL__SMEM_STATIC_MAX, "static shared memory");

  const int tid = threadIdx.x;
  const int tx = tid % (BN / TN), ty = tid / (BN / TN);
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN; /* M on x: 2^31 blocks there */
  wl__stage<BM, BK, NT, LA, float> sa;
  wl__stage<BK, BN, NT, LB, float> sb;
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;

  /* Split-K: block z reduces over [kbeg, kend); kchunk is a multiple of BK, so a tile never
   * reaches into the next block's range (the loaders clip at K). */
  const int kbeg = blockIdx.z * kchunk, kend = min(K, kbeg + kchunk);
  const int ktiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0;
  sa.load(la, m0, kbeg, tid);
  sb.load(lb, kbeg, n0, tid);
  sa.store([&](int r, int c, float v) { As[0][c][r] = v; }, tid);
  sb.store([&](int r, int c, float v) { Bs[0][r][c] = v; }, tid);
  __syncthreads();

  for (int kt = 0; kt < ktiles; kt++) {
    const int cur = kt & 1;
    const bool more = kt + 1 < ktiles;
    if (more) { /* global reads in flight during the multiply below */
      sa.load(la, m0, kbeg + (kt + 1) * BK, tid);
      sb.load(lb, kbeg + (kt + 1) * BK, n0, tid);
    }
#pragma unroll
    for (int k = 0; k < BK; k++) {
      float a[TM], b[TN];
#pragma unroll
      for (int g = 0; g < GM; g++) {
        float4 v = *reinterpret_cast<const float4 *>(&As[cur][k][g * SM + ty * 4]);
        a[g * 4 + 0] = v.x, a[g * 4 + 1] = v.y, a[g * 4 + 2] = v.z, a[g * 4 + 3] = v.w;
      }
#pragma unroll
      for (int g = 0; g < GN; g++) {
        float4 v = *reinterpret_cast<const float4 *>(&Bs[cur][k][g * SN + tx * 4]);
        b[g * 4 + 0] = v.x, b[g * 4 + 1] = v.y, b[g * 4 + 2] = v.z, b[g * 4 + 3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (more) {
      /* The other buffer was last read in the previous iteration, before its barrier. */
      sa.store([&](int r, int c, float v) { As[cur ^ 1][c][r] = v; }, tid);
      sb.store([&](int r, int c, float v) { Bs[cur ^ 1][r][c] = v; }, tid);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TM; i++) {
    int row = m0 + (i / 4) * SM + ty * 4 + (i % 4);
#pragma unroll
    for (int j = 0; j < TN; j++) {
      int col = n0 + (j / 4) * SN + tx * 4 + (j % 4);
      if (gridDim.z == 1)
        wl__store_c(C, ldc, M, N, row, col, acc[i][j], alpha, beta);
      else if (row < M && col < N) /* split-K: C was zeroed, the partial sums add up */
        atomicAdd(C + (long long)row * ldc + col, alpha * acc[i][j]);
    }
  }
}

/* ------------------------------------------------------------------------------------------------
 * Tensor cores with mma.sync (sm_80+). 128 x 128 block tile, 8 warps as 2 x 4, each warp 64 x 32
 * = 4 x 4 mma tiles. Both operands sit in shared memory k-contiguous (As[m][k], Bs[n][k]), the
 * layout the fragments want; the row padding makes the fragment reads of a warp hit 32 distinct
 * banks. TF32: fp32 inputs rounded (cvt.rna) as they are stored, m16n8k8, BK 16. BF16: m16n8k16,
 * BK 32, two bf16 per 32-bit register.
 * ----------------------------------------------------------------------------------------------*/
template <class T> struct wl__mma_traits;
template <> struct wl__mma_traits<float> { /* TF32 */
  static constexpr int BK = 16, KSTEP = 8, PAD = 4;
  typedef uint32_t smem_t;
  __device__ __forceinline__ static smem_t conv(float v) {
    return wl__to_tf32(v);
  }
};
template <> struct wl__mma_traits<uint16_t> { /* BF16 bit patterns */
  static constexpr int BK = 32, KSTEP = 16, PAD = 8;
  typedef uint16_t smem_t;
  __device__ __forceinline__ static smem_t conv(uint16_t v) {
    return v;
  }
};

template <class T, class LA, class LB>
__global__ void __launch_bounds__(256) wl__gemm_mma(LA la, LB lb, int M, int N, int K, float alpha,
                                                    float beta, float *C, long long ldc) {
  typedef wl__mma_traits<T> tr;
  typedef typename tr::smem_t S;
  constexpr int BM = 128, BN = 128, BK = tr::BK, LDS = BK + tr::PAD, NT = 256;
  constexpr int MI = 4, NI = 4; /* mma tiles per warp */
  __shared__ __align__(16) S As[2][BM][LDS];
  __shared__ __align__(16) S Bs[2][BN][LDS];
  static_assert(sizeof As + sizeof Bs <= WL__SMEM_STATIC_MAX, "static shared memory");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN; /* M on x: 2^31 blocks there */
  wl__stage<BM, BK, NT, LA, T> sa;
  wl__stage<BK, BN, NT, LB, T> sb;
  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

  const int ktiles = (K + BK - 1) / BK;
  sa.load(la, m0, 0, tid);
  sb.load(lb, 0, n0, tid);
  sa.store([&](int r, int c, T v) { As[0][r][c] = tr::conv(v); }, tid);
  sb.store([&](int r, int c, T v) { Bs[0][c][r] = tr::conv(v); }, tid);
  __syncthreads();

  for (int kt = 0; kt < ktiles; kt++) {
    const int cur = kt & 1;
    const bool more = kt + 1 < ktiles;
    if (more) {
      sa.load(la, m0, (kt + 1) * BK, tid);
      sb.load(lb, (kt + 1) * BK, n0, tid);
    }
#pragma unroll
    for (int ks = 0; ks < BK; ks += tr::KSTEP) {
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; i++) {
        const int r = wm + i * 16 + g;
        if (sizeof(T) == 4) { /* tf32: one element per register */
          af[i][0] = (uint32_t)As[cur][r][ks + t];
          af[i][1] = (uint32_t)As[cur][r + 8][ks + t];
          af[i][2] = (uint32_t)As[cur][r][ks + t + 4];
          af[i][3] = (uint32_t)As[cur][r + 8][ks + t + 4];
        } else { /* bf16: two k-adjacent elements per register */
          af[i][0] = *reinterpret_cast<const uint32_t *>(&As[cur][r][ks + 2 * t]);
          af[i][1] = *reinterpret_cast<const uint32_t *>(&As[cur][r + 8][ks + 2 * t]);
          af[i][2] = *reinterpret_cast<const uint32_t *>(&As[cur][r][ks + 2 * t + 8]);
          af[i][3] = *reinterpret_cast<const uint32_t *>(&As[cur][r + 8][ks + 2 * t + 8]);
        }
      }
#pragma unroll
      for (int j = 0; j < NI; j++) {
        const int n = wn + j * 8 + g;
        if (sizeof(T) == 4) {
          bf[j][0] = (uint32_t)Bs[cur][n][ks + t];
          bf[j][1] = (uint32_t)Bs[cur][n][ks + t + 4];
        } else {
          bf[j][0] = *reinterpret_cast<const uint32_t *>(&Bs[cur][n][ks + 2 * t]);
          bf[j][1] = *reinterpret_cast<const uint32_t *>(&Bs[cur][n][ks + 2 * t + 8]);
        }
      }
#pragma unroll
      for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) {
          if (sizeof(T) == 4)
            wl__mma_tf32(acc[i][j], af[i], bf[j]);
          else
            wl__mma_bf16(acc[i][j], af[i], bf[j]);
        }
    }
    if (more) {
      sa.store([&](int r, int c, T v) { As[cur ^ 1][r][c] = tr::conv(v); }, tid);
      sb.store([&](int r, int c, T v) { Bs[cur ^ 1][c][r] = tr::conv(v); }, tid);
    }
    __syncthreads();
  }

  /* Accumulator fragment: rows g and g+8, columns 2t and 2t+1 of each 16x8 tile. */
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NI; j++) {
      const int row = m0 + wm + i * 16 + g, col = n0 + wn + j * 8 + 2 * t;
      wl__store_c(C, ldc, M, N, row, col, acc[i][j][0], alpha, beta);
      wl__store_c(C, ldc, M, N, row, col + 1, acc[i][j][1], alpha, beta);
      wl__store_c(C, ldc, M, N, row + 8, col, acc[i][j][2], alpha, beta);
      wl__store_c(C, ldc, M, N, row + 8, col + 1, acc[i][j][3], alpha, beta);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Launchers
 * ----------------------------------------------------------------------------------------------*/

/* fp32 on CUDA cores. Tiles by the shape of C:
 * - N <= 64 with rows enough for the device: 128 x 16, 32 or 64 (8 x 4 per thread), so that a
 *   narrow C (the convolutions' first layers: N = K filters forward, C channels backward-data)
 *   does not waste most of a 128-wide tile;
 * - else 128 x 128 (8 x 8 per thread) when those tiles fill the device, else 64 x 64 (4 x 4);
 * - a long K with few tiles (the filter gradient: M = K filters, K = N*P*Q pixels) is split over
 *   blocks that add into C atomically (then the summation order varies from run to run); only
 *   with beta = 0 and a dense C, which is zeroed first. With M <= 32 the split runs on 32 x 32
 *   tiles of 64 threads and up to 16 blocks per SM, each reducing at least 256 of K: a 16 x 9
 *   filter gradient over 200,704 pixels is then 784 blocks rather than 64 long ones. */
#if defined(WL_CUDA_EMU) /* exercise every tile shape on small problems, unless only checked */
#define WL__FILL_TILES (wl__emu_check_only() ? 132 : 6)
#else
#define WL__FILL_TILES 132 /* SMs of an H100/H200 */
#endif

template <int BM, int BN, int TM, int TN, class LA, class LB>
static void wl__sgemm_simt_go(const LA &la, const LB &lb, int M, int N, int K, int kchunk,
                              int split, float alpha, float beta, float *C, long long ldc,
                              cudaStream_t st) {
  auto kern = wl__sgemm_simt<BM, BN, TM, TN, LA, LB>;
  dim3 grid((M + BM - 1) / BM, (N + BN - 1) / BN, split);
  WL__LAUNCH(kern, grid, (BM / TM) * (BN / TN), st, la, lb, M, N, K, kchunk, alpha, beta, C, ldc);
}

template <class LA, class LB>
static int wl__launch_sgemm_simt(const LA &la, const LB &lb, int M, int N, int K, float alpha,
                                 float beta, float *C, long long ldc, cudaStream_t st) {
  if (M == 0 || N == 0) return 0; /* nothing to write; a grid of 0 blocks fails to launch */
  if ((N + 63) / 64 > 65535) return -EINVAL;
  const long long fill = WL__FILL_TILES;
  const long long mt128 = (M + 127) / 128;
  int bm, bn;
  if (N <= 64 && mt128 >= fill)
    bm = 128, bn = N <= 16 ? 16 : N <= 32 ? 32 : 64;
  else if (mt128 * ((N + 127) / 128) >= fill)
    bm = 128, bn = 128;
  else
    bm = 64, bn = 64;
  long long tiles = ((M + bm - 1) / bm) * (long long)((N + bn - 1) / bn);
  int split = 1;
  if (beta == 0.0f && ldc == N && tiles < 2 * fill && K >= 4096) {
    long long want, most;
    if (bm == 64 && M <= 32) { /* small output: 32 x 32 tiles, many short slices of K */
      bm = bn = 32;
      tiles = (long long)((N + 31) / 32);
      want = (16 * fill + tiles - 1) / tiles, most = K / 256;
    } else {
      want = (2 * fill + tiles - 1) / tiles, most = K / 1024;
    }
    split = (int)(want < most ? want : most);
    if (split > 65535) split = 65535; /* grid z */
    if (split < 1) split = 1;
  }
  int kchunk = (K + split - 1) / split;
  kchunk = (kchunk + 7) / 8 * 8; /* a multiple of BK */
  if (split > 1) {
    split = (K + kchunk - 1) / kchunk;
    cudaError_t e = cudaMemsetAsync(C, 0, sizeof(float) * (size_t)M * (size_t)N, st);
    if (e != cudaSuccess) return wl__cuda_fail(e);
  }
  if (bm == 32)
    wl__sgemm_simt_go<32, 32, 4, 4>(la, lb, M, N, K, kchunk, split, alpha, beta, C, ldc, st);
  else if (bm == 64)
    wl__sgemm_simt_go<64, 64, 4, 4>(la, lb, M, N, K, kchunk, split, alpha, beta, C, ldc, st);
  else if (bn == 16)
    wl__sgemm_simt_go<128, 16, 8, 4>(la, lb, M, N, K, kchunk, split, alpha, beta, C, ldc, st);
  else if (bn == 32)
    wl__sgemm_simt_go<128, 32, 8, 4>(la, lb, M, N, K, kchunk, split, alpha, beta, C, ldc, st);
  else if (bn == 64)
    wl__sgemm_simt_go<128, 64, 8, 4>(la, lb, M, N, K, kchunk, split, alpha, beta, C, ldc, st);
  else
    wl__sgemm_simt_go<128, 128, 8, 8>(la, lb, M, N, K, kchunk, split, alpha, beta, C, ldc, st);
  return wl__cuda_check_launch();
}

template <class T, class LA, class LB>
static int wl__launch_gemm_mma(const LA &la, const LB &lb, int M, int N, int K, float alpha,
                               float beta, float *C, long long ldc, cudaStream_t st) {
  if (M == 0 || N == 0) return 0;
  if ((N + 127) / 128 > 65535) return -EINVAL;
  auto kern = wl__gemm_mma<T, LA, LB>;
  dim3 grid((M + 127) / 128, (N + 127) / 128);
  WL__LAUNCH(kern, grid, 256, st, la, lb, M, N, K, alpha, beta, C, ldc);
  return wl__cuda_check_launch();
}

/* The device's compute capability major (cached per device; 0 when unknown). */
int wl__cuda_cc_major(void);

/* The BF16 GEMM with wgmma and TMA (gemm_wgmma.cu): 1 when it does not apply (not an sm_90 device
 * with sm_90a code, or operands TMA cannot describe: bases not 16-byte aligned, lda or ldb not a
 * multiple of 8), else 0 or the launch's error. The host emulation takes it whenever TMA could. */
int wl__gemm_bf16_wgmma(wl_trans_t ta, wl_trans_t tb, int M, int N, int K, float alpha,
                        const uint16_t *a, size_t lda, const uint16_t *b, size_t ldb, float beta,
                        float *C, size_t ldc, cudaStream_t st);

/* The TF32 GEMM with wgmma and TMA (gemm_wgmma.cu): both operands rounded (cvt.rna) into a K-major
 * scratch copy, then the wgmma kernels. 1 when it does not apply (not an sm_90 device with sm_90a
 * code, wl_cuda_sgemm_tf32_set_wgmma(0), or no memory for the copy), else 0 or the error. */
int wl__gemm_tf32_wgmma(wl_trans_t ta, wl_trans_t tb, int M, int N, int K, float alpha,
                        const float *a, size_t lda, const float *b, size_t ldb, float beta,
                        float *C, size_t ldc, cudaStream_t st);

#endif
