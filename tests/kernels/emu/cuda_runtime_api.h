/* The CUDA runtime calls the kernels, their tests and wavelet-bench's cuda backend make, on host
 * memory: the host emulation of the CUDA kernels (tests/kernels/emu) links this instead of
 * libcudart. Work runs at the call, so a stream is only a handle that must be live; device memory
 * is host memory, counted against an emulated capacity (WAVELET_EMU_DEVICE_MEMORY, bytes with
 * K/M/G; default: the host's), and copies and memsets must stay inside a live allocation. Error
 * codes are CUDA's. C and C++. */
#ifndef WAVELET_TESTS_EMU_CUDA_RUNTIME_API_H
#define WAVELET_TESTS_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError_enum_emu {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75 };

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };

#define cudaStreamDefault     0x00
#define cudaStreamNonBlocking 0x01

typedef struct CUstream_st_emu *cudaStream_t;
typedef struct CUmemPoolHandle_st_emu *cudaMemPool_t;

struct cudaDeviceProp {
  char name[256];
  int major, minor;
  int l2CacheSize;
};

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *p, cudaStream_t stream);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev);
/* The kernel is its host function's address, as the emulated launch names it. */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t err);

/* The emulated device's SM count (cudaDevAttrMultiProcessorCount): 4 by default, so that small
 * problems have more tiles than SMs and take the persistent GEMM (132, an H200's, under
 * WAVELET_EMU_CHECK_ONLY); n > 0 sets it, n <= 0 restores the default. Not CUDA's: tests only. */
void wl__emu_set_sm_count(int n);
/* wgmma.mma_async instructions issued so far by the calling process, per warpgroup thread, of
 * input kind 0 (bf16) or 1 (tf32): tests that must know a wgmma path ran, not a fallback. Not
 * CUDA's: tests only. */
unsigned long long wl__emu_wgmma_issued(int kind);

#ifdef __cplusplus
}

/* The runtime's C++ overload: a kernel passed as itself. */
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *func, enum cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void *>(func), attr, value);
}
#endif

#endif
