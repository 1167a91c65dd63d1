/* An interposer of its own, preloaded after libwavelet.so: it defines cuMemAlloc_v2 and forwards
 * to what dlsym(RTLD_NEXT) answers it, as such libraries do. Its next is the driver's function
 * (or a wrapper of ours), never its own: that would call itself forever. Says on stderr what it
 * was given and how many calls it forwarded. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
static alloc_fn next_alloc;
static unsigned calls;

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  calls++;
  if (!next_alloc || next_alloc == cuMemAlloc_v2) return CUDA_ERROR_NOT_INITIALIZED;
  return next_alloc(p, n);
}

__attribute__((constructor)) static void find_next(void) {
  next_alloc = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
  Dl_info d = {0};
  const char *who = !next_alloc                                     ? "nothing"
                    : next_alloc == cuMemAlloc_v2                   ? "itself"
                    : dladdr((void *)next_alloc, &d) && d.dli_fname ? d.dli_fname
                                                                    : "unknown";
  fprintf(stderr, "wl-ip-next: next cuMemAlloc_v2 is %s\n", who);
}

__attribute__((destructor)) static void report(void) {
  fprintf(stderr, "wl-ip-next: %u calls forwarded\n", calls);
}
