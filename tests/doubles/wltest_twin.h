/* Host twins of kernels for the CUDA test doubles: a program defines, next to a kernel NAME,
 *   extern "C" void wltest_host_NAME(const wltest_launch_t *launch);
 * and the driver double runs it when a launch of NAME is enqueued, so that the kernel has an
 * effect on a machine without a GPU. On a real GPU the twins are never called. NAME is the
 * kernel's symbol: the plain name of an extern "C" kernel, the mangled one otherwise. To replay
 * captured launches (CUDA graphs) the double must copy the arguments: a program that captures
 * a kernel also defines
 *   extern "C" const unsigned wltest_argsizes_NAME[] = {sizeof(float *), sizeof(int), 0};
 * The executable must export these symbols (link with -rdynamic, CMake ENABLE_EXPORTS). */
#ifndef WAVELET_TESTS_WLTEST_TWIN_H
#define WAVELET_TESTS_WLTEST_TWIN_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wltest_launch_s {
  const char *name;      /* the kernel's symbol */
  unsigned grid[3];      /* x, y, z */
  unsigned block[3];     /* x, y, z */
  unsigned shared_bytes; /* dynamic shared memory */
  void *stream;          /* the CUstream it was enqueued on (the resolved handle) */
  void **args;           /* kernelParams: args[i] points at the i-th argument */
} wltest_launch_t;

typedef void (*wltest_twin_fn)(const wltest_launch_t *launch);

#ifdef __cplusplus
}
#endif
#endif
