/* For tests only: a thread body that takes every hooked path a trainer's thread takes
 * (synchronous and stream-ordered memory, launches) until told to stop, shared by the test
 * programs that race the interposer's exit and fork against busy threads. */
#ifndef WLTEST_CHURN_H
#define WLTEST_CHURN_H

#include <cuda.h>

typedef struct wltest_churn_s {
  CUcontext ctx;
  CUfunction fn;    /* a kernel of no arguments */
  _Atomic int stop; /* set to end every churning thread */
  unsigned rounds;  /* loops done, all threads together */
} wltest_churn_t;

static void *wltest_churn(void *arg) {
  wltest_churn_t *c = arg;
  if (cuCtxSetCurrent(c->ctx) != CUDA_SUCCESS) return NULL;
  CUstream s = NULL;
  cuStreamCreate(&s, 0);
  for (unsigned i = 0; !c->stop; i++) {
    CUdeviceptr d = 0, e = 0;
    if (cuMemAlloc_v2(&d, (size_t)(1 + i % 7) << 16) == CUDA_SUCCESS) cuMemFree_v2(d);
    if (cuMemAllocAsync(&e, (size_t)(1 + i % 5) << 18, s) == CUDA_SUCCESS) cuMemFreeAsync(e, s);
    cuLaunchKernel(c->fn, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
    __atomic_add_fetch(&c->rounds, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

#endif
