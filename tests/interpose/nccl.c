/* For tests only: a stand-in for libnccl.so.2 whose collectives launch a kernel through the
 * driver (as NCCL's do), so a test can see whether that launch was gated. */
#include <cuda.h>
#include <stddef.h>

#define EXT __attribute__((visibility("default")))

int ncclAllReduce(const void *, void *, size_t, int, int, void *, CUstream);
int ncclGroupEnd(void);
void *wltest_nccl_function(void);

static CUfunction fn;

/* The collective's kernel (a PTX image the driver double loads), made on first use. */
EXT void *wltest_nccl_function(void) {
  static const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                            ".visible .entry nccl_allreduce()\n{\n ret;\n}\n";
  if (!fn) {
    CUmodule m;
    if (cuModuleLoadData(&m, ptx) == CUDA_SUCCESS) cuModuleGetFunction(&fn, m, "nccl_allreduce");
  }
  return (void *)fn;
}

EXT int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, void *comm, CUstream st) {
  (void)s, (void)r, (void)n, (void)t, (void)op, (void)comm;
  return cuLaunchKernel((CUfunction)wltest_nccl_function(), 1, 1, 1, 32, 1, 1, 0, st, NULL, NULL) ==
                 CUDA_SUCCESS
             ? 0
             : 3;
}

EXT int ncclGroupEnd(void) {
  return 0;
}
