/* wl-bench-hooks: what libwavelet.so adds to a launch (gate mode, gate open; trace mode) and to
 * a stream-ordered allocation (alloc mode, a size the allocator has cached), measured in child
 * processes of this run with and without the preload, on the same driver. Prints one JSON
 * object and a table. */
#include <cuda.h>
#include <dlfcn.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <wavelet/sched.h>

extern char **environ;

#define BATCHES 15

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* ---- child: time one kind of call -----------------------------------------------------------*/

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_fn)(CUdeviceptr, CUstream);
typedef CUresult (*alloc_sync_fn)(CUdeviceptr *, size_t);
typedef CUresult (*get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*set_fn)(CUcontext);

static int child(const char *what, long n) {
  /* Through the dynamic linker as a program linked with -lcuda would be: the preload's exports
   * come first. */
  launch_fn launch = (launch_fn)dlsym(RTLD_DEFAULT, "cuLaunchKernel");
  init_fn init = (init_fn)dlsym(RTLD_DEFAULT, "cuInit");
  if (!launch || !init) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return 1;
    launch = (launch_fn)dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    init = (init_fn)dlsym(RTLD_DEFAULT, "cuInit");
  }
  if (!init || init(0) != CUDA_SUCCESS) return 1;
  /* The loader ignores a preload it cannot load (one line on stderr) and the run goes on
   * unhooked: a hooked run must be one, or its figures would be the plain ones. */
  const char *pre = getenv("LD_PRELOAD");
  Dl_info di = {0};
  if (pre && *pre &&
      (!dladdr((void *)launch, &di) || !di.dli_fname || !strstr(di.dli_fname, "libwavelet"))) {
    fprintf(stderr, "wl-bench-hooks: the preload %s did not load (cuLaunchKernel is %s's)\n", pre,
            di.dli_fname ? di.dli_fname : "nobody");
    return 1;
  }
  double per[BATCHES];
  if (!strcmp(what, "launch")) {
    for (int b = 0; b < BATCHES; b++) {
      double t0 = now_ns();
      for (long i = 0; i < n; i++) launch((CUfunction)0x1, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
      per[b] = (now_ns() - t0) / (double)n;
    }
  } else if (!strcmp(what, "launch-paced")) {
    /* Bursts shorter than the trace's per-thread ring, with pauses in which its flusher thread
     * (100 ms) drains it: the cost the launching thread itself pays. */
    if (n > 4000) n = 4000;
    for (int b = 0; b < BATCHES; b++) {
      usleep(150000);
      double t0 = now_ns();
      for (long i = 0; i < n; i++) launch((CUfunction)0x1, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
      per[b] = (now_ns() - t0) / (double)n;
    }
  } else {
    alloc_fn al = (alloc_fn)dlsym(RTLD_DEFAULT, "cuMemAllocAsync");
    free_fn fr = (free_fn)dlsym(RTLD_DEFAULT, "cuMemFreeAsync");
    get_fn get = (get_fn)dlsym(RTLD_DEFAULT, "cuDeviceGet");
    retain_fn ret = (retain_fn)dlsym(RTLD_DEFAULT, "cuDevicePrimaryCtxRetain");
    set_fn set = (set_fn)dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
    CUdevice d;
    CUcontext c;
    if (!al || !fr || !get || !ret || !set || get(&d, 0) || ret(&c, d) || set(c)) return 1;
    CUdeviceptr p, held;
    /* alloc-sync-live: one synchronous allocation stays live meanwhile, so that a served free
     * also looks in the pointer map (where served synchronous blocks are kept for a reset). */
    if (!strcmp(what, "alloc-sync-live")) {
      alloc_sync_fn as = (alloc_sync_fn)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
      if (!as || as(&held, 4096)) return 1;
    }
    for (int i = 0; i < 100; i++) /* warm: the size is cached */
      if (al(&p, 1 << 20, NULL) || fr(p, NULL)) return 1;
    for (int b = 0; b < BATCHES; b++) {
      double t0 = now_ns();
      for (long i = 0; i < n; i++) {
        al(&p, 1 << 20, NULL);
        fr(p, NULL);
      }
      per[b] = (now_ns() - t0) / (double)n;
    }
  }
  qsort(per, BATCHES, sizeof per[0], cmp);
  printf("%.3f\n", per[BATCHES / 2]);
  return 0;
}

/* One TSC read, as every traced event takes one (the trace's clock): the part of the trace
 * overhead that is the machine's (about 7-10 ns on bare metal, 20-25 ns on some VMs). 0 where
 * there is no TSC. */
static double tsc_read_ns(long n) {
#if defined(__x86_64__)
  double per[BATCHES];
  volatile uint64_t sink = 0;
  for (int b = 0; b < BATCHES; b++) {
    double t0 = now_ns();
    uint64_t acc = 0;
    for (long i = 0; i < n; i++) acc += __builtin_ia32_rdtsc();
    per[b] = (now_ns() - t0) / (double)n;
    sink += acc;
  }
  (void)sink;
  qsort(per, BATCHES, sizeof per[0], cmp);
  return per[BATCHES / 2];
#else
  (void)n;
  return 0;
#endif
}

/* ---- parent: run the children -----------------------------------------------------------------*/

static double run_child(const char *self, const char *what, long n, const char *libdir,
                        const char *preload, const char *const *env) {
  char nbuf[32];
  snprintf(nbuf, sizeof nbuf, "%ld", n);
  char *argv[] = {(char *)self, "--child", (char *)what, nbuf, NULL};
  /* environment: ours without LD_PRELOAD / WAVELET_*, plus the given */
  const char *envp[256];
  int k = 0;
  for (char **e = environ; *e && k < 200; e++)
    if (strncmp(*e, "LD_PRELOAD=", 11) && strncmp(*e, "WAVELET_", 8) &&
        strncmp(*e, "LD_LIBRARY_PATH=", 16))
      envp[k++] = *e;
  static char ld[4200], pre[4200];
  /* libdir first; then ours, where the preload's own libraries may be (a bundle's hwloc): a
   * preload that cannot load is ignored by the loader, and the run would measure nothing. */
  const char *our = getenv("LD_LIBRARY_PATH");
  snprintf(ld, sizeof ld, "LD_LIBRARY_PATH=%s%s%s", libdir, our && *our ? ":" : "", our ? our : "");
  envp[k++] = ld;
  if (preload) {
    snprintf(pre, sizeof pre, "LD_PRELOAD=%s", preload);
    envp[k++] = pre;
  }
  for (const char *const *e = env; e && *e; e++) envp[k++] = *e;
  envp[k] = NULL;
  int fd[2];
  if (pipe(fd)) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
  posix_spawn_file_actions_addclose(&fa, fd[0]);
  pid_t pid;
  int rc = posix_spawn(&pid, self, &fa, NULL, argv, (char **)envp);
  posix_spawn_file_actions_destroy(&fa);
  close(fd[1]);
  if (rc) {
    close(fd[0]);
    return -1;
  }
  char out[64] = {0};
  ssize_t got = read(fd[0], out, sizeof out - 1);
  close(fd[0]);
  int st;
  waitpid(pid, &st, 0);
  if (got <= 0 || !WIFEXITED(st) || WEXITSTATUS(st)) return -1;
  return atof(out);
}

int main(int argc, char **argv) {
  if (argc >= 4 && !strcmp(argv[1], "--child")) return child(argv[2], atol(argv[3]));
  long n = 2000000;
  if (argc >= 3 && !strcmp(argv[1], "--calls")) n = atol(argv[2]);
  if (n < 1000) n = 1000;
  char self[4096];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0) return 1;
  self[k] = 0;
  const char *lib = WL_LIBWAVELET, *nulldir = WL_NULLDRV_DIR, *dbl = WL_DOUBLES_DIR;
  char group[64], genv[96], tenv[256], senv[256];
  snprintf(group, sizeof group, "wl-bench-hooks-%d", (int)getpid());
  snprintf(genv, sizeof genv, "WAVELET_GROUP=%s", group);
  snprintf(tenv, sizeof tenv, "WAVELET_TRACE=/tmp/wl-bench-hooks-%d.wlt", (int)getpid());
  /* The same trace in /dev/shm: its rings in tmpfs pages, not a disk file system's page cache, to
   * tell the file system's part (write faults, writeback) from the writer's on a new machine. */
  snprintf(senv, sizeof senv, "WAVELET_TRACE=/dev/shm/wl-bench-hooks-%d.wlt", (int)getpid());
  const char *gate[] = {"WAVELET_MODE=gate", genv, NULL};
  const char *trace[] = {"WAVELET_MODE=trace", tenv, NULL};
  const char *trace_shm[] = {"WAVELET_MODE=trace", senv, NULL};
  const char *alloc[] = {"WAVELET_MODE=alloc", genv, NULL};

  double l0 = run_child(self, "launch", n, nulldir, NULL, NULL);
  double lg = run_child(self, "launch", n, nulldir, lib, gate);
  /* The paced runs vary from process to process on a VM (where its pages and its two threads
   * land): the median of three processes each, taken in turn. */
  /* Without a writable /dev/shm the interposer would run untraced there and measure nothing:
   * then that figure is null, and the run goes on. */
  const int shm_ok = access("/dev/shm", W_OK) == 0;
  double pp[3], ptr[3], pts[3] = {-1, -1, -1};
  for (int i = 0; i < 3; i++) {
    pp[i] = run_child(self, "launch-paced", 4000, nulldir, NULL, NULL);
    ptr[i] = run_child(self, "launch-paced", 4000, nulldir, lib, trace);
    if (shm_ok) pts[i] = run_child(self, "launch-paced", 4000, nulldir, lib, trace_shm);
  }
  qsort(pp, 3, sizeof pp[0], cmp);
  qsort(ptr, 3, sizeof ptr[0], cmp);
  qsort(pts, 3, sizeof pts[0], cmp);
  double p0 = pp[0] < 0 ? -1 : pp[1], pt = ptr[0] < 0 ? -1 : ptr[1];
  double ps = pts[0] < 0 ? -1 : pts[1];
  double lt = run_child(self, "launch", n, nulldir, lib, trace);
  double a0 = run_child(self, "alloc", n / 20, dbl, NULL, NULL);
  double aa = run_child(self, "alloc", n / 20, dbl, lib, alloc);
  double al = run_child(self, "alloc-sync-live", n / 20, dbl, lib, alloc);
  unlink(tenv + strlen("WAVELET_TRACE="));
  unlink(senv + strlen("WAVELET_TRACE="));
  /* The children never leave their group (libwavelet.so keeps its members to the end): its
   * segment outlives them. */
  wl_sched_group_remove_all(group);
  if (l0 < 0 || lg < 0 || lt < 0 || p0 < 0 || pt < 0 || a0 < 0 || aa < 0 || al < 0) {
    fprintf(stderr, "wl-bench-hooks: a measurement failed\n");
    return 1;
  }
  double lo = lg - l0, to = pt - p0, so = lt - l0, ao = aa - a0;
  double tsc = tsc_read_ns(n / 4);
  char shm_fig[32] = "null"; /* not measured: no /dev/shm, or its child failed */
  if (ps >= 0) snprintf(shm_fig, sizeof shm_fig, "%.2f", ps - p0);
  printf("{\"calls\":%ld,\"launch_plain_ns_p50\":%.2f,\"launch_gate_ns_p50\":%.2f,"
         "\"launch_paced_plain_ns_p50\":%.2f,\"launch_paced_trace_ns_p50\":%.2f,"
         "\"launch_trace_sustained_ns_p50\":%.2f,\"alloc_free_plain_ns_p50\":%.2f,"
         "\"alloc_free_served_ns_p50\":%.2f,\"launch_overhead_ns_p50\":%.2f,"
         "\"trace_overhead_ns_p50\":%.2f,\"trace_sustained_overhead_ns_p50\":%.2f,"
         "\"alloc_overhead_ns_p50\":%.2f,\"alloc_served_call_ns_p50\":%.2f,"
         "\"launch_ratio\":%.3f,\"alloc_ratio\":%.3f,\"tsc_read_ns_p50\":%.2f,"
         "\"trace_overhead_less_tsc_ns_p50\":%.2f,\"alloc_served_call_sync_live_ns_p50\":%.2f,"
         "\"trace_shm_overhead_ns_p50\":%s,"
         "\"targets\":{\"launch_ns\":10,\"trace_ns\":30,\"alloc_ns\":100}}\n",
         n, l0, lg, p0, pt, lt, a0, aa, lo, to, so, ao, aa / 2, l0 > 0 ? lg / l0 : 0,
         a0 > 0 ? aa / a0 : 0, tsc, to - tsc, al / 2, shm_fig);
  fprintf(stderr, "%-40s %12s %12s %12s %8s\n", "call (p50 of 15 batches)", "plain ns", "hooked ns",
          "overhead ns", "target");
  fprintf(stderr, "%-40s %12.2f %12.2f %12.2f %8s\n", "launch, gate mode (gate open)", l0, lg, lo,
          "<= 10");
  fprintf(stderr, "%-40s %12.2f %12.2f %12.2f %8s\n", "launch, trace mode (bursts, 3 procs)", p0,
          pt, to, "<= 30");
  if (ps >= 0)
    fprintf(stderr, "%-40s %12.2f %12.2f %12.2f %8s\n", "  the same, the trace in /dev/shm", p0, ps,
            ps - p0, "-");
  else
    fprintf(stderr, "%-40s %12s %12s %12s %8s\n", "  the same, the trace in /dev/shm", "-",
            "not run", "-", "-");
  fprintf(stderr, "%-40s %12.2f %12.2f %12.2f %8s\n", "launch, trace mode (sustained)", l0, lt, so,
          "-");
  fprintf(stderr, "%-40s %12s %12.2f %12.2f %8s\n", "  of which one TSC read (the clock)", "-", tsc,
          tsc, "-");
  fprintf(stderr, "%-40s %12.2f %12.2f %12.2f %8s\n", "alloc+free pair, alloc mode", a0, aa, ao,
          "-");
  /* A served call never reaches the driver: its whole cost is ours (the target's measure). */
  fprintf(stderr, "%-40s %12s %12.2f %12.2f %8s\n", "one served alloc or free (pair / 2)", "-",
          aa / 2, aa / 2, "<= 100");
  fprintf(stderr, "%-40s %12s %12.2f %12.2f %8s\n", "  the same, a synchronous block live", "-",
          al / 2, al / 2, "-");
  return 0;
}
