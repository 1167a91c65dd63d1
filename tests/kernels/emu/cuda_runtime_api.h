/* The CUDA runtime calls the kernel tests make, on host memory: the host emulation of the CUDA
 * kernels (tests/kernels/emu) links this instead of libcudart. C and C++. */
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
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75 };

typedef struct CUstream_st_emu *cudaStream_t;

struct cudaDeviceProp {
  char name[256];
  int major, minor;
  int l2CacheSize;
};

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t err);

#ifdef __cplusplus
}
#endif

#endif
