/* wl-ip-reload: a program that loads the CUDA runtime with dlopen(RTLD_GLOBAL), allocates and
 * frees through cudaMalloc/cudaFree found in the global scope (as code loaded after it would
 * find them), dlcloses it, keeps the address range it occupied busy so that loading it again
 * puts it elsewhere, loads it again and allocates and frees again. Under the preload those
 * names resolve to our hooks, which must not call into the unloaded copy.
 * Prints "unloaded yes|no", "moved yes|no" and "reload ok allocations 2 frees 2". */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);

/* The lowest and highest address of the mappings of file (from /proc/self/maps). */
static int extent(const char *file, uintptr_t *lo, uintptr_t *hi) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[4352];
  *lo = UINTPTR_MAX;
  *hi = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b;
    char path[4096] = "";
    if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %4095s", &a, &b, path) >= 2 && !strcmp(path, file)) {
      if (a < *lo) *lo = a;
      if (b > *hi) *hi = b;
    }
  }
  fclose(f);
  return *hi ? 0 : -1;
}

static int use(const char *round) {
  malloc_fn m = (malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
  free_fn f = (free_fn)dlsym(RTLD_DEFAULT, "cudaFree");
  void *p = NULL;
  if (!m || !f || m(&p, 1 << 20) != cudaSuccess || !p || f(p) != cudaSuccess) {
    fprintf(stderr, "wl-ip-reload: %s: allocation through the runtime failed\n", round);
    return -1;
  }
  return 0;
}

int main(void) {
  void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    fprintf(stderr, "wl-ip-reload: %s\n", dlerror());
    return 2;
  }
  Dl_info di;
  void *own = dlsym(h, "cudaMalloc");
  if (!own || !dladdr(own, &di) || !di.dli_fname) return 2;
  char file[4096];
  snprintf(file, sizeof file, "%s", di.dli_fname);
  if (use("first load")) return 1;
  uintptr_t lo, hi;
  if (extent(file, &lo, &hi)) return 2;
  dlclose(h);
  void *still = dlopen(file, RTLD_NOW | RTLD_NOLOAD);
  printf("unloaded %s\n", still ? "no" : "yes");
  if (still) dlclose(still);
  /* Whatever is free of the old range is taken, so a new copy cannot land there. */
  for (uintptr_t a = lo; a < hi; a += 4096)
    mmap((void *)a, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    fprintf(stderr, "wl-ip-reload: reload: %s\n", dlerror());
    return 2;
  }
  own = dlsym(h, "cudaMalloc");
  printf("moved %s\n", own && ((uintptr_t)own < lo || (uintptr_t)own >= hi) ? "yes" : "no");
  fflush(stdout);
  if (use("second load")) return 1;
  printf("reload ok allocations 2 frees 2\n");
  return 0;
}
