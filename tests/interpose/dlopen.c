/* wl-ip-dlopen LIBWAVELET: a program that does not preload libwavelet.so but loads it with
 * dlopen(RTLD_LOCAL) after the driver (as a plugin host or Python's ctypes would), allocates and
 * frees through the entry points it exports, dlcloses it, lets its threads run for a while, and
 * calls the same entry points again. Every answer must be the driver's, whatever WAVELET_MODE
 * says, and nothing may crash once the library is closed.
 * Memory allocated from the driver before the library was loaded is freed through it: "early
 * free 0" (passed through; the library never saw it allocated).
 * Prints "first alloc 0 free 0 async 0 free-async 0", "early free 0", "stays loaded yes|no", the
 * round trip's line prefixed "after dlclose" and "dlopen ok"; exits 3 when the loader refuses
 * the library. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*set_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*sync_fn)(void);

typedef struct ours_s {
  alloc_fn alloc;
  free_fn free;
  alloc_async_fn alloc_async;
  free_async_fn free_async;
} ours_t;

static void round_trip(const ours_t *o, sync_fn sync, const char *label) {
  CUdeviceptr a = 0, b = 0;
  CUresult ra = o->alloc(&a, 1 << 20);
  CUresult rf = ra == CUDA_SUCCESS ? o->free(a) : CUDA_ERROR_UNKNOWN;
  CUresult rb = o->alloc_async(&b, 2 << 20, NULL);
  CUresult rg = rb == CUDA_SUCCESS ? o->free_async(b, NULL) : CUDA_ERROR_UNKNOWN;
  sync();
  printf("%s alloc %d free %d async %d free-async %d\n", label, (int)ra, (int)rf, (int)rb, (int)rg);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: wl-ip-dlopen LIBWAVELET\n");
    return 2;
  }
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!cu) {
    fprintf(stderr, "wl-ip-dlopen: %s\n", dlerror());
    return 2;
  }
  init_fn init = (init_fn)dlsym(cu, "cuInit");
  get_fn get = (get_fn)dlsym(cu, "cuDeviceGet");
  retain_fn retain = (retain_fn)dlsym(cu, "cuDevicePrimaryCtxRetain");
  set_fn set = (set_fn)dlsym(cu, "cuCtxSetCurrent");
  sync_fn sync = (sync_fn)dlsym(cu, "cuCtxSynchronize");
  alloc_fn early_alloc = (alloc_fn)dlsym(cu, "cuMemAlloc_v2");
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr early = 0;
  if (!init || !get || !retain || !set || !sync || !early_alloc || init(0) || get(&dev, 0) ||
      retain(&ctx, dev) || set(ctx) || early_alloc(&early, 3 << 20)) {
    fprintf(stderr, "wl-ip-dlopen: the driver did not start\n");
    return 2;
  }

  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "wl-ip-dlopen: %s\n", dlerror());
    return 3;
  }
  ours_t o = {(alloc_fn)dlsym(h, "cuMemAlloc_v2"), (free_fn)dlsym(h, "cuMemFree_v2"),
              (alloc_async_fn)dlsym(h, "cuMemAllocAsync"),
              (free_async_fn)dlsym(h, "cuMemFreeAsync")};
  if (!o.alloc || !o.free || !o.alloc_async || !o.free_async) {
    fprintf(stderr, "wl-ip-dlopen: %s does not export the allocation entry points\n", argv[1]);
    return 2;
  }
  round_trip(&o, sync, "first");
  printf("early free %d\n", (int)o.free(early));
  fflush(stdout);

  dlclose(h);
  usleep(300000); /* the library's threads (trace flusher, trim, gate helper) run meanwhile */
  void *again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
  printf("stays loaded %s\n", again ? "yes" : "no");
  if (!again) {
    fflush(stdout);
    return 1; /* the pointers below would lead into unmapped memory */
  }
  dlclose(again);
  round_trip(&o, sync, "after dlclose");
  printf("dlopen ok\n");
  return 0;
}
