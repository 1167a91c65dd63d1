/* For tests only: a training-shaped driver-API program. Each iteration allocates one activation
 * per layer on its stream (a launch after each: the forward pass), then frees them in reverse
 * (backward), with the trainer markers of wavelet/wavelet.h (weak: no-ops without Wavelet).
 *   wl-ip-replica ITERATIONS LAYERS MIB [nccl|nccl-static]
 * Prints "done N" and exits 0, or "out of memory at iteration I" and exits 2. With "nccl" it
 * calls ncclAllReduce (the fake NCCL launches a kernel inside) once per iteration, right after
 * the iteration begins, and prints "nccl-launch done" after the first one. With "nccl-static" it
 * launches a kernel named as NCCL's there itself (NCCL linked into the program: no entry point
 * to hook, only the kernel's name). */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <wavelet/wavelet.h>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    CUresult r_ = (call);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      printf("FAIL %s: %d\n", #call, (int)r_);                                                     \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static const char ptx[] =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry wl_fwd()\n{\n ret;\n}\n"
    ".visible .entry wl_bwd()\n{\n ret;\n}\n"
    ".visible .entry ncclDevKernel_AllReduce_Sum_f32_RING_LL()\n{\n ret;\n}\n";

typedef int (*allreduce_fn)(const void *, void *, size_t, int, int, void *, void *);

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 4) {
    fprintf(stderr, "usage: wl-ip-replica ITERATIONS LAYERS MIB [nccl]\n");
    return 2;
  }
  int iters = atoi(argv[1]), layers = atoi(argv[2]);
  size_t size = (size_t)atoi(argv[3]) << 20;
  int use_nccl = argc > 4 && !strcmp(argv[4], "nccl");
  int static_nccl = argc > 4 && !strcmp(argv[4], "nccl-static");
  if (layers < 1 || layers > 256 || iters < 1 || !size) return 2;
  allreduce_fn allreduce = NULL;
  if (use_nccl) {
    allreduce = (allreduce_fn)dlsym(RTLD_DEFAULT, "ncclAllReduce");
    if (!allreduce) {
      printf("FAIL no ncclAllReduce\n");
      return 1;
    }
  }
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuStreamCreate(&s, 0));
  CUmodule mod;
  CUfunction fwd, bwd;
  CHECK(cuModuleLoadData(&mod, ptx));
  CHECK(cuModuleGetFunction(&fwd, mod, "wl_fwd"));
  CHECK(cuModuleGetFunction(&bwd, mod, "wl_bwd"));
  CUfunction coll;
  CHECK(cuModuleGetFunction(&coll, mod, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
  /* Framework start-up: a first allocation (under Wavelet, the group is joined here, so the
   * markers of the first iteration already count). */
  CUdeviceptr warm;
  CHECK(cuMemAlloc_v2(&warm, 1 << 20));
  CHECK(cuMemFree_v2(warm));
  CUdeviceptr warm_buf = 0; /* what the collective reduces */
  if (use_nccl) CHECK(cuMemAlloc_v2(&warm_buf, 4096));
  CUdeviceptr act[256];
  unsigned long long sum = 0;
  for (int it = 0; it < iters; it++) {
    wl_mark_iteration_begin();
    /* The collective comes first, before the iteration's first allocation takes the token
     * (a gradient all-reduce of the step before, as overlapping DDP schedules it). */
    if (static_nccl) {
      CHECK(cuLaunchKernel(coll, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
      if (it == 0) printf("nccl-launch done\n");
    }
    if (use_nccl) {
      allreduce((void *)(uintptr_t)warm_buf, (void *)(uintptr_t)warm_buf, 1, 0, 0, NULL, s);
      if (it == 0) {
        void *(*fnq)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "wltest_nccl_function");
        printf("nccl-launch done\n");
        printf("nccl-function %llu\n", fnq ? (unsigned long long)(uintptr_t)fnq() : 0ull);
      }
    }
    for (int l = 0; l < layers; l++) {
      CUresult r = cuMemAllocAsync(&act[l], size, s);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        printf("out of memory at iteration %d\n", it);
        return 2;
      }
      CHECK(r);
      unsigned char *p = (unsigned char *)(uintptr_t)act[l];
      p[0] = (unsigned char)(it + l);
      p[size - 1] = (unsigned char)l;
      sum += p[0] + p[size - 1];
      CHECK(cuLaunchKernel(fwd, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
      usleep(2000);
    }
    wl_mark_backward_begin();
    for (int l = layers - 1; l >= 0; l--) {
      CHECK(cuLaunchKernel(bwd, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
      CHECK(cuMemFreeAsync(act[l], s));
      usleep(2000);
    }
    wl_mark_iteration_end();
  }
  printf("done %d (checksum %llu)\n", iters, sum);
  return 0;
}
