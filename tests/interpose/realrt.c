/* wl-ip-realrt: the toolkit's real libcudart over the driver double, to check the
 * cuGetProcAddress door against the lookups the real CUDA runtime makes (names, versions,
 * per-thread flags), which our own programs and the runtime double only imitate.
 *
 * Run with LD_LIBRARY_PATH=<toolkit lib>:<doubles> (the real runtime first; the driver double is
 * the only libcuda.so.1) and WLTEST_PROC_LOG=<file>, which the double fills with every answer.
 * The runtime resolves its whole driver table at its first call, then gives up (the double has
 * none of the driver's private export tables): that is expected and printed. Then every logged
 * lookup is asked again through the cuGetProcAddress_v2 this process sees (the interposer's
 * under the preload) and must come back as exactly the variant the driver answered with: the
 * interposer's wrapper of that name where it exports one, the driver's function otherwise.
 * Prints "queries N hooked H mismatches M" and one line per mismatch; exits 0 when it ran. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*proc_v2_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

/* True when p is defined by a library other than the driver double (the preloaded one). */
static int is_wrapper(void *p, const char *driver_file) {
  Dl_info di;
  return p && dladdr(p, &di) && di.dli_fname && strcmp(di.dli_fname, driver_file) != 0;
}

int main(void) {
  const char *log = getenv("WLTEST_PROC_LOG");
  if (!log) {
    fprintf(stderr, "wl-ip-realrt: WLTEST_PROC_LOG is not set\n");
    return 2;
  }
  int n = -1;
  cudaError_t e = cudaGetDeviceCount(&n);
  printf("runtime cudaGetDeviceCount: %d (%s)\n", (int)e, cudaGetErrorName(e));

  /* The driver double, by name as the runtime loads it (which may have unloaded it again on
   * giving up): its file, for dladdr. */
  void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!drv) {
    fprintf(stderr, "wl-ip-realrt: cannot load libcuda.so.1: %s\n", dlerror());
    return 2;
  }
  Dl_info di;
  void *init = dlsym(drv, "cuInit");
  if (!init || !dladdr(init, &di) || !di.dli_fname) {
    fprintf(stderr, "wl-ip-realrt: cannot tell where libcuda.so.1 lives\n");
    return 2;
  }
  char driver_file[4096];
  snprintf(driver_file, sizeof driver_file, "%s", di.dli_fname);
  /* The preload's door when there is one (global), else the driver's own. */
  proc_v2_fn proc = (proc_v2_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
  if (!proc) proc = (proc_v2_fn)dlsym(drv, "cuGetProcAddress_v2");
  if (!proc) {
    fprintf(stderr, "wl-ip-realrt: no cuGetProcAddress_v2\n");
    return 2;
  }

  /* The runtime's lookups only: ours below would be logged too. */
  FILE *f = fopen(log, "r");
  if (!f) {
    fprintf(stderr, "wl-ip-realrt: cannot read %s\n", log);
    return 2;
  }
  typedef struct {
    char name[128], variant[128];
    int version;
    unsigned long long flags;
  } q_t;
  size_t cap = 4096, nq = 0;
  q_t *qs = malloc(cap * sizeof *qs);
  while (qs && nq < cap &&
         fscanf(f, "%127s %d %llu %127s", qs[nq].name, &qs[nq].version, &qs[nq].flags,
                qs[nq].variant) == 4)
    nq++;
  fclose(f);
  if (!qs) return 2;

  unsigned hooked = 0, bad = 0;
  for (size_t i = 0; i < nq; i++) {
    const q_t *q = &qs[i];
    /* A name the preloaded library hooks is in the global scope, outside the driver (which the
     * runtime loaded privately); anything else must come back as the driver's own function. */
    void *want = dlsym(RTLD_DEFAULT, q->variant);
    if (is_wrapper(want, driver_file))
      hooked++;
    else
      want = dlsym(drv, q->variant);
    void *got = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = proc(q->name, &got, q->version, (cuuint64_t)q->flags, &st);
    if (r != CUDA_SUCCESS || !got || got != want) {
      bad++;
      printf("mismatch %s %d %llu: driver answered %s, got %p, dlsym gives %p\n", q->name,
             q->version, q->flags, q->variant, got, want);
    }
  }
  printf("queries %zu hooked %u mismatches %u\n", nq, hooked, bad);
  free(qs);
  return 0;
}
