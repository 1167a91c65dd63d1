/* Just enough of CUDA's device side for our kernels to compile as C++ and run on the host: a
 * block's threads are coroutines that switch at barriers, warps exchange values through
 * shared slots, and mma.sync is computed from the fragment layouts of the PTX ISA. It checks the
 * kernels' index arithmetic, tiling and fragment bookkeeping where no GPU is present; it says
 * nothing about their speed or about the hardware's memory model. */
#ifndef WAVELET_TESTS_EMU_CUDA_EMU_H
#define WAVELET_TESTS_EMU_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__      static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct wl__emu_idx {
  unsigned x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
static inline float2 make_float2(float x, float y) {
  float2 v = {x, y};
  return v;
}

extern wl__emu_idx threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

using std::max;
using std::min;

/* A call into libm per multiply-add would dominate the emulation's time; rounding once more is
 * within every test's tolerance. */
#define fmaf(a, b, c) ((a) * (b) + (c))

static inline float4 make_float4(float x, float y, float z, float w) {
  float4 v = {x, y, z, w};
  return v;
}
template <class T> static inline T __ldg(const T *p) {
  return *p;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
[[noreturn]] void __trap(void);

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
float atomicAdd(float *p, float v);
unsigned atomicAdd(unsigned *p, unsigned v);
static inline uint32_t atomicAdd(uint32_t *p, int v) {
  return atomicAdd((unsigned *)p, (unsigned)v);
}

/* bf16 conversions (round to nearest even), as cuda_bf16.h provides them. */
struct __nv_bfloat16 {
  uint16_t bits;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  __nv_bfloat16 h = {(uint16_t)(u >> 16)};
  return h;
}
static inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 h) {
  return h.bits;
}

/* cvt.rna.tf32.f32: keep 10 mantissa bits, round half away from zero. */
static inline uint32_t wl__emu_to_tf32(float x) {
  uint32_t u = __float_as_uint(x);
  return (u + 0x1000u) & ~0x1fffu;
}

/* One warp's mma.sync: kind 0 = m16n8k8 TF32, 1 = m16n8k16 BF16; d += a b. */
void wl__emu_mma(int kind, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

/* Hopper's asynchronous pieces for gemm_wgmma.cu: a block's shared memory is one arena (its
 * "shared addresses" are offsets into it) whose dynamic part starts only 16-byte aligned, as the
 * hardware promises no more, and ends where the launch's size does (any access past it stops the
 * test), mbarriers keep their phase and transaction count beside it, a TMA load copies a box of
 * 64 rows of 128 bytes (64 bf16 or 32 fp32) with the 128-byte swizzle (zeros outside the tensor)
 * at once, and wgmma (bf16 m64nNk16, tf32 m64nNk8: WL__EMU_WG_*) computes the
 * calling thread's accumulator fragment from shared-memory matrix descriptors (the canonical
 * layouts of the PTX ISA) asynchronously: it is queued at issue and its operands are read when
 * wl__emu_wg_wait completes its commit group, after the other threads have run. A TMA load into
 * shared memory that a pending wgmma reads stops the test (a stage given back too early), and
 * the accumulators hold NaN until the wait. A waiting thread yields to the others. */
#define __grid_constant__
struct CUtensorMap { /* what the emulation needs of cuTensorMapEncodeTiled's 2-D map */
  const void *p;
  uint64_t dims[2]; /* inner, outer */
  uint64_t stride;  /* bytes between outer rows */
  uint32_t elem;    /* bytes per element: 2 (bf16) or 4 (fp32); the box is 128 bytes wide */
};
/* wgmma's input types: bf16 (k16, either operand K- or MN-major) and tf32 (k8, both K-major:
 * the PTX ISA has no transpose for tf32; the tensor core reads the upper 19 bits of each fp32). */
enum { WL__EMU_WG_BF16 = 0, WL__EMU_WG_TF32 = 1 };
unsigned char *wl__emu_smem(void); /* the launch's dynamic shared memory (16-byte aligned) */
uint32_t __cvta_generic_to_shared(const void *p);
void wl__emu_yield(void);
void wl__emu_mbar_init(uint32_t bar, uint32_t count);
void wl__emu_mbar_arrive(uint32_t bar, uint32_t tx_bytes);
bool wl__emu_mbar_done(uint32_t bar, uint32_t parity);
void wl__emu_tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1);
void wl__emu_wgmma(float *d, int n, uint64_t da, uint64_t db, bool a_mn, bool b_mn,
                   int kind = WL__EMU_WG_BF16);
void wl__emu_wg_commit(void); /* wgmma.commit_group */
void wl__emu_wg_wait(int n);  /* wgmma.wait_group n */

/* What an sm_90 device (H100, H200) accepts in a launch; the emulated launch refuses the rest as
 * the runtime does. Static shared memory above 48 KiB is refused at build time (ptxas; the
 * kernels' static_asserts do it here). */
#define WL__EMU_MAX_THREADS  1024 /* per block; x and y up to this, z up to 64 */
#define WL__EMU_MAX_BLOCK_Z  64
#define WL__EMU_MAX_GRID_X   2147483647u
#define WL__EMU_MAX_GRID_YZ  65535u
#define WL__EMU_SMEM_DEFAULT (48 * 1024)  /* dynamic shared memory without opting in */
#define WL__EMU_SMEM_OPTIN   (227 * 1024) /* the most cudaFuncSetAttribute may allow */

/* WAVELET_EMU_CHECK_ONLY=1: the launchers size their grids as for a real H100/H200, and the
 * emulated launches are checked but not run (results are garbage): for the launch configurations
 * of shapes too large to emulate. */
bool wl__emu_check_only(void);

/* Runs body on every thread of every block (blocks in turn, on the calling thread), after the
 * checks a real launch of kernel (its host address; name and caller for messages) would pass:
 * a refused launch runs nothing, prints one line and leaves its error for cudaGetLastError. smem:
 * the dynamic shared memory, which the kernel reaches through wl__emu_smem(). */
void wl__emu_launch_fn(const char *name, const char *caller, const void *kernel, dim3 grid,
                       dim3 block, size_t smem, cudaStream_t st, const std::function<void()> &body);
template <class F>
static inline void wl__emu_launch(const char *name, const char *caller, const void *kernel,
                                  dim3 grid, dim3 block, size_t smem, cudaStream_t st, F body) {
  wl__emu_launch_fn(name, caller, kernel, grid, block, smem, st, std::function<void()>(body));
}

#endif
