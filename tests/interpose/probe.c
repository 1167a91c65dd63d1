/* For tests only: a driver-API program reaching the driver through all three doors (linked
 * symbols, dlsym, cuGetProcAddress), from several threads, with cross-thread frees, stream-ordered
 * and VMM memory. Its output is the same with and without libwavelet.so; its last lines say what
 * the trace must account (allocations, frees, launches, live bytes). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "churn.h"
#include "wltest_cuda.h"

#undef cuGetProcAddress

static unsigned long long n_alloc, n_free, n_launch, live;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define CHECK(call)                                                                                \
  do {                                                                                             \
    CUresult r_ = (call);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      printf("FAIL %s: %d (line %d)\n", #call, (int)r_, __LINE__);                                 \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static void counted(int allocs, int frees, long long bytes) {
  pthread_mutex_lock(&lock);
  n_alloc += (unsigned long long)allocs;
  n_free += (unsigned long long)frees;
  live += (unsigned long long)bytes;
  pthread_mutex_unlock(&lock);
}

/* Writes a pattern and reads it back: the memory must be real. */
static unsigned long long touch(CUdeviceptr d, size_t size, unsigned seed) {
  unsigned char *p = (unsigned char *)(uintptr_t)d;
  unsigned long long sum = 0;
  for (size_t i = 0; i < size; i += 4096) p[i] = (unsigned char)(seed + i / 4096);
  p[size - 1] = (unsigned char)seed;
  for (size_t i = 0; i < size; i += 4096) sum += p[i];
  return sum + p[size - 1];
}

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                           CUdriverProcAddressQueryResult *);

static CUcontext ctx;
static CUfunction kfn;

/* A kernel handle: a PTX image the driver (or its test double) loads. */
static const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry wl_probe_kernel()\n{\n ret;\n}\n";

static void load_kernel(void) {
  CUmodule m;
  CHECK(cuModuleLoadData(&m, ptx));
  CHECK(cuModuleGetFunction(&kfn, m, "wl_probe_kernel"));
}

typedef struct work_s {
  int id;
  CUdeviceptr keep[64];
  size_t keep_size[64];
  int nkeep;
  unsigned long long sum;
} work_t;

static void *worker(void *arg) {
  work_t *w = arg;
  CHECK(cuCtxSetCurrent(ctx));
  for (int i = 0; i < 200; i++) {
    size_t size = (size_t)(1 + (i * 7 + w->id * 13) % 50) * 4096;
    CUdeviceptr d;
    CHECK(cuMemAlloc_v2(&d, size));
    w->sum += touch(d, size, (unsigned)i);
    if (i % 5 == 0 && w->nkeep < 64) {
      w->keep[w->nkeep] = d;
      w->keep_size[w->nkeep++] = size;
      counted(1, 0, (long long)size);
    } else {
      CHECK(cuMemFree_v2(d));
      counted(1, 1, 0);
    }
    CHECK(cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    __atomic_add_fetch(&n_launch, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static int doors(void) {
  CUdevice dev;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  load_kernel();
  unsigned long long sum = 0;

  /* 1. linked symbols */
  CUdeviceptr a, b, c;
  CHECK(cuMemAlloc_v2(&a, 1 << 20));
  CHECK(cuMemAlloc_v2(&b, 3 << 20));
  CHECK(cuMemAlloc_v2(&c, 12345));
  sum += touch(a, 1 << 20, 1) + touch(b, 3 << 20, 2) + touch(c, 12345, 3);
  CHECK(cuMemFree_v2(a));
  counted(3, 1, (3 << 20) + 12345);
  printf("linked: ok\n");

  /* 2. dlsym, on the driver's handle and on RTLD_DEFAULT */
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  alloc_fn da = h ? (alloc_fn)dlsym(h, "cuMemAlloc_v2") : NULL;
  free_fn df = (free_fn)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
  if (!da || !df) {
    printf("FAIL dlsym\n");
    return 1;
  }
  CUdeviceptr d;
  CHECK(da(&d, 5 << 20));
  sum += touch(d, 5 << 20, 4);
  CHECK(df(b));
  counted(1, 1, (5 << 20) - (3 << 20));
  printf("dlsym: ok\n");
  /* RTLD_NEXT is relative to the caller, and asking twice gives the same answer. */
  void *o1 = dlsym(RTLD_NEXT, "open"), *o2 = dlsym(RTLD_NEXT, "open");
  void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  printf("rtld_next: %s\n", o1 && o1 == o2 && libc && o1 == dlsym(libc, "open") ? "ok" : "FAIL");

  /* 3. cuGetProcAddress, with versions and the per-thread flag, and its self-lookup */
  gpa_fn gpa = (gpa_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
  void *p = NULL;
  CUdriverProcAddressQueryResult st;
  CHECK(gpa("cuGetProcAddress", &p, 12000, 0, &st));
  gpa_fn gpa2 = (gpa_fn)p;
  CHECK(gpa2("cuMemAlloc", &p, 12000, 0, &st));
  alloc_fn ga = (alloc_fn)p;
  CHECK(gpa2("cuMemFree", &p, 12000, 0, &st));
  free_fn gf = (free_fn)p;
  CHECK(gpa2("cuLaunchKernel", &p, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
  launch_fn gl_ptsz = (launch_fn)p;
  CHECK(gpa2("cuLaunchKernel", &p, 12000, 0, &st));
  launch_fn gl = (launch_fn)p;
  CUdeviceptr e;
  CHECK(ga(&e, 7 << 20));
  sum += touch(e, 7 << 20, 5);
  CHECK(gf(d));
  counted(1, 1, (7 << 20) - (5 << 20));
  CHECK(gl(kfn, 2, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL));
  CHECK(gl_ptsz(kfn, 2, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL));
  n_launch += 2;
  printf("cuGetProcAddress: ok\n");

  /* 4. stream-ordered memory, freed by another thread's call */
  CUstream s;
  CHECK(cuStreamCreate(&s, 0));
  CUdeviceptr f;
  CHECK(cuMemAllocAsync(&f, 9 << 20, s));
  sum += touch(f, 9 << 20, 6);
  counted(1, 0, 9 << 20);
  printf("async: ok\n");

  /* 5. threads; main frees what they kept */
  work_t w[4];
  pthread_t t[4];
  memset(w, 0, sizeof w);
  for (int i = 0; i < 4; i++) {
    w[i].id = i;
    pthread_create(&t[i], NULL, worker, &w[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) {
    sum += w[i].sum;
    for (int k = 0; k < w[i].nkeep; k++) {
      CHECK(cuMemFree_v2(w[i].keep[k]));
      counted(0, 1, -(long long)w[i].keep_size[k]);
    }
  }
  printf("threads: ok\n");

  /* 6. VMM */
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  CUmemGenericAllocationHandle mh;
  CUdeviceptr va;
  CHECK(cuMemCreate(&mh, 2 << 20, &prop, 0));
  CHECK(cuMemAddressReserve(&va, 2 << 20, 2 << 20, 0, 0));
  CHECK(cuMemMap(va, 2 << 20, 0, mh, 0));
  CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK(cuMemSetAccess(va, 2 << 20, &acc, 1));
  sum += touch(va, 2 << 20, 7);
  CHECK(cuMemUnmap(va, 2 << 20));
  CHECK(cuMemRelease(mh));
  CHECK(cuMemAddressFree(va, 2 << 20));
  printf("vmm: ok\n");

  /* 7. pinned host memory */
  void *hp;
  CHECK(cuMemAllocHost_v2(&hp, 100000));
  memset(hp, 1, 100000);
  CHECK(cuMemFreeHost(hp));
  CHECK(cuMemHostAlloc(&hp, 3 << 20, CU_MEMHOSTALLOC_PORTABLE));
  memset(hp, 2, 3 << 20);
  CHECK(cuMemFreeHost(hp));
  printf("pinned: ok\n");

  size_t fr, tot;
  CHECK(cuMemGetInfo_v2(&fr, &tot));
  printf("meminfo: %s\n", fr <= tot ? "ok" : "FAIL");

  printf("checksum %llu\n", sum);
  printf("allocations %llu\nfrees %llu\nlaunches %llu\nlive %llu\n", n_alloc, n_free, n_launch,
         live);
  return 0;
}

/* The process's malloc must be the C library's, also after the pinned arena started. */
static void context(void) {
  CUdevice dev;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
}

/* Killed mid-run: 300 allocations of growing sizes, 100 of them freed, 50 launches, then
 * SIGKILL, with no exit work run: the trace must hold every one of those records. */
static int killed(void) {
  context();
  load_kernel();
  CUdeviceptr p[300];
  for (int i = 0; i < 300; i++) CHECK(cuMemAlloc_v2(&p[i], 4096 * (size_t)(i + 1)));
  for (int i = 0; i < 100; i++) CHECK(cuMemFree_v2(p[i]));
  for (int i = 0; i < 50; i++) CHECK(cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
  fflush(stdout);
  raise(SIGKILL);
  return 1;
}

static int malloc_check(void) {
  context();
  void *hp;
  CHECK(cuMemAllocHost_v2(&hp, 4096));
  CHECK(cuMemFreeHost(hp));
  Dl_info di;
  void *m = dlsym(RTLD_DEFAULT, "malloc");
  if (!m || !dladdr(m, &di) || !di.dli_fname) {
    printf("FAIL no malloc\n");
    return 1;
  }
  const char *base = strrchr(di.dli_fname, '/');
  base = base ? base + 1 : di.dli_fname;
  void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  void *lm = libc ? dlsym(libc, "malloc") : NULL;
  printf("malloc from %s: %s\n", base, lm == m && lm == (void *)malloc ? "glibc" : "OTHER");
  return lm == m && lm == (void *)malloc ? 0 : 1;
}

/* A child forked after CUDA use allocates through the hooks of its own (re-initialised) state. */
static int fork_check(void) {
  context();
  CUdeviceptr d;
  CHECK(cuMemAlloc_v2(&d, 1 << 20));
  pid_t pid = fork();
  if (pid == 0) {
    CUdeviceptr c;
    CUresult r = cuMemAlloc_v2(&c, 2 << 20);
    if (r == CUDA_SUCCESS) r = cuMemFree_v2(c);
    _exit(r == CUDA_SUCCESS ? 0 : 3);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(cuMemFree_v2(d));
  printf("fork: child %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "ok" : "FAIL");
  return 0;
}

/* cuMemGetInfo's view before anything is allocated ("first total T free F": a trainer sizes its
 * cache from it), then "total T free F" with 64 MiB allocated, called by its symbol and through
 * cuGetProcAddress: "proc total T free F". */
static int meminfo(void) {
  context();
  size_t fr, tot;
  CHECK(cuMemGetInfo_v2(&fr, &tot));
  printf("first total %zu free %zu\n", tot, fr);
  CUdeviceptr d;
  CHECK(cuMemAlloc_v2(&d, 64 << 20));
  CHECK(cuMemGetInfo_v2(&fr, &tot));
  printf("total %zu free %zu\n", tot, fr);
  void *fn = NULL;
  CUdriverProcAddressQueryResult qs;
  CHECK(cuGetProcAddress_v2("cuMemGetInfo", &fn, 12000, 0, &qs));
  CHECK(((CUresult(*)(size_t *, size_t *))fn)(&fr, &tot));
  printf("proc total %zu free %zu\n", tot, fr);
  CHECK(cuMemFree_v2(d));
  return 0;
}

/* meminfo-only: one cuMemGetInfo and nothing allocated ("only total T free F"): a launcher
 * sizing the replicas it will start. */
static int meminfo_only(void) {
  context();
  size_t fr, tot;
  CHECK(cuMemGetInfo_v2(&fr, &tot));
  printf("only total %zu free %zu\n", tot, fr);
  return 0;
}

/* A process-directed signal blocked by every thread of the program stays pending until the
 * program unblocks it, and is then handled on the thread that did: helper threads of an
 * interposer must not take it in between (started before the program blocked it, they would
 * have inherited it unblocked). */
static volatile sig_atomic_t handled_tid;
static void on_usr1(int sig) {
  (void)sig;
  handled_tid = (sig_atomic_t)syscall(SYS_gettid);
}

static int signals_check(void) {
  context();
  CUdeviceptr d;
  CUstream s;
  CHECK(cuStreamCreate(&s, 0));
  for (int i = 0; i < 64; i++) { /* whatever threads the hooks start, started now */
    CHECK(cuMemAllocAsync(&d, 1 << 20, s));
    CHECK(cuMemFreeAsync(d, s));
  }
  CHECK(cuStreamSynchronize(s));
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, NULL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  kill(getpid(), SIGUSR1);
  usleep(200000);
  int early = handled_tid != 0;
  pthread_sigmask(SIG_UNBLOCK, &set, NULL); /* delivered here, before this returns */
  printf("signals: handled while blocked %s, on the unblocking thread %s\n", early ? "yes" : "no",
         handled_tid == (sig_atomic_t)syscall(SYS_gettid) ? "yes" : "no");
  CHECK(cuStreamDestroy(s));
  return 0;
}

/* Threads that keep allocating, launching and freeing until the process ends. */
static wltest_churn_t ch;

/* Exit while other threads are inside hooks: main returns (atexit handlers, the trace finished,
 * the group left) while four threads keep calling; first a few forks of the busy process whose
 * children use the hooks of their own (re-initialised) state. Nothing may crash or hang. */
static int exit_race(int forks) {
  context();
  load_kernel();
  ch.ctx = ctx;
  ch.fn = kfn;
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, wltest_churn, &ch);
  int bad = 0;
  for (int i = 0; i < forks; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      CUdeviceptr c;
      CUresult r = cuMemAlloc_v2(&c, 2 << 20);
      if (r == CUDA_SUCCESS) r = cuMemFree_v2(c);
      if (r == CUDA_SUCCESS) r = cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
      _exit(r == CUDA_SUCCESS ? 0 : 3);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) bad++;
  }
  /* every thread well inside its loop (at most 5 s) */
  for (int i = 0; i < 5000 && __atomic_load_n(&ch.rounds, __ATOMIC_RELAXED) < 400; i++)
    usleep(1000);
  printf("exit race: forks %s\n", bad ? "FAIL" : "ok");
  return bad ? 1 : 0; /* returns with the threads still running */
}

/* Odd but legal use: calls before cuInit, NULL outputs, frees of pointers that are not
 * allocations, double frees. Prints only the driver's answers: the same with and without the
 * preload, in every mode. */
#define SHOW(call) printf("%-60s %d\n", #call, (int)(call))
static int odd(void) {
  CUdeviceptr d = 0;
  size_t fr, tot;
  CUdriverProcAddressQueryResult qs;
  void *hp = NULL, *fn = NULL;
  SHOW(cuMemAlloc_v2(&d, 4096));
  SHOW(cuMemGetInfo_v2(&fr, &tot));
  SHOW(cuMemFree_v2((CUdeviceptr)0x7f0000001000ull));
  SHOW(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
  SHOW(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &qs));
  context();
  load_kernel();
  SHOW(cuMemAlloc_v2(NULL, 4096));
  SHOW(cuMemAlloc_v2(&d, 0));
  SHOW(cuMemAllocAsync(NULL, 4096, NULL));
  SHOW(cuMemAllocHost_v2(NULL, 4096));
  SHOW(cuMemHostAlloc(NULL, 4096, 0));
  SHOW(cuMemGetInfo_v2(NULL, NULL));
  SHOW(cuMemGetInfo_v2(&fr, NULL));
  SHOW(cuMemFree_v2(0));
  SHOW(cuMemFree_v2((CUdeviceptr)0x7f0000001000ull));
  SHOW(cuMemFreeAsync((CUdeviceptr)0x7f0000001000ull, NULL));
  SHOW(cuMemFreeHost(NULL));
  SHOW(cuMemFreeHost((void *)0x7f0000002000ull));
  SHOW(cuMemRelease((CUmemGenericAllocationHandle)0x12345));
  SHOW(cuMemUnmap((CUdeviceptr)0x7f0000001000ull, 4096));
  SHOW(cuLaunchKernelEx(NULL, kfn, NULL, NULL));
  SHOW(cuGetProcAddress_v2("cuMemAlloc", NULL, 12000, 0, &qs));
  SHOW(cuGetProcAddress_v2(NULL, &fn, 12000, 0, NULL));
  SHOW(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 12000, 0, &qs));
  /* a double free and a free inside a live block: the driver's error, not a crash */
  SHOW(cuMemAlloc_v2(&d, 1 << 20));
  SHOW(cuMemFree_v2(d + 4096));
  SHOW(cuMemFree_v2(d));
  SHOW(cuMemFree_v2(d));
  SHOW(cuMemAllocHost_v2(&hp, 4096));
  SHOW(cuMemFreeHost((char *)hp + 64));
  SHOW(cuMemFreeHost(hp));
  SHOW(cuMemFreeHost(hp));
  printf("odd: done\n");
  return 0;
}

/* Unusual but legal use with served memory in play: frees through the wrong family of calls,
 * stream-ordered calls on streams that are invalid or were destroyed, mixed classic and
 * stream-ordered frees, pinned flags. Prints only the driver's answers (and whether memory the
 * driver kept is still usable): the same with and without the preload, in every mode. */
static int edge(void) {
  context();
  CUdeviceptr d = 0, e = 0, f = 0;
  void *hp = NULL;
  CUstream s, bogus = (CUstream)(uintptr_t)0x5a5a5a5a5a50ull;
  CHECK(cuStreamCreate(&s, 0));
  /* cuMemFreeHost of device memory fails, and the memory stays allocated */
  SHOW(cuMemAlloc_v2(&d, 1 << 20));
  SHOW(cuMemFreeHost((void *)(uintptr_t)d));
  printf("%-60s %llu\n", "still usable", touch(d, 1 << 20, 9));
  SHOW(cuMemFree_v2(d));
  SHOW(cuMemAllocAsync(&d, 1 << 20, s));
  SHOW(cuMemFreeHost((void *)(uintptr_t)d));
  SHOW(cuMemFreeAsync(d, s));
  /* cuMemFree of page-locked host memory fails, and it stays allocated */
  SHOW(cuMemAllocHost_v2(&hp, 8192));
  SHOW(cuMemFree_v2((CUdeviceptr)(uintptr_t)hp));
  SHOW(cuMemFreeHost(hp));
  SHOW(cuMemHostAlloc(&hp, 8192, CU_MEMHOSTALLOC_WRITECOMBINED));
  SHOW(cuMemFreeHost(hp));
  SHOW(cuMemHostAlloc(&hp, 8192, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  SHOW(cuMemFreeHost(hp));
  SHOW(cuMemHostAlloc(&hp, 8192, 0x100));
  SHOW(cuMemAllocHost_v2(&hp, 0));
  /* classic and stream-ordered frees of each other's memory */
  SHOW(cuMemAlloc_v2(&d, 1 << 20));
  SHOW(cuMemFreeAsync(d, s));
  SHOW(cuMemAllocAsync(&d, 1 << 20, s));
  SHOW(cuMemFree_v2(d));
  SHOW(cuMemAllocAsync(&d, 0, s));
  /* a stream that never existed: refused, and the memory stays allocated */
  SHOW(cuMemAllocAsync(&e, 1 << 20, bogus));
  SHOW(cuMemAlloc_v2(&d, 1 << 20));
  SHOW(cuMemFreeAsync(d, bogus));
  SHOW(cuMemFree_v2(d));
  /* a destroyed stream: the same */
  SHOW(cuMemAllocAsync(&d, 1 << 20, s));
  SHOW(cuMemAllocAsync(&f, 1 << 20, s));
  SHOW(cuMemFreeAsync(d, s));
  SHOW(cuStreamSynchronize(s));
  SHOW(cuStreamDestroy(s));
  SHOW(cuMemAllocAsync(&e, 1 << 20, s));
  SHOW(cuMemFreeAsync(f, s));
  SHOW(cuMemFree_v2(f));
  SHOW(cuStreamDestroy(s));
  /* a new stream, likely at the old one's address */
  CHECK(cuStreamCreate(&s, 0));
  SHOW(cuMemAllocAsync(&d, 1 << 20, s));
  SHOW(cuMemFreeAsync(d, s));
  SHOW(cuStreamSynchronize(s));
  SHOW(cuStreamDestroy(s));
  /* the legacy and per-thread default streams */
  SHOW(cuMemAllocAsync(&d, 1 << 20, CU_STREAM_LEGACY));
  SHOW(cuMemFreeAsync(d, CU_STREAM_PER_THREAD));
  SHOW(cuMemAllocAsync(&d, 1 << 20, CU_STREAM_PER_THREAD));
  SHOW(cuMemFreeAsync(d, NULL));
  size_t fr, tot;
  CHECK(cuMemGetInfo_v2(&fr, &tot));
  printf("meminfo %s\n", fr <= tot ? "ok" : "FAIL");
  printf("edge: done\n");
  return 0;
}

/* ---- capture interaction modes ---------------------------------------------------------------
 * Synchronous allocations and frees (cuMemAlloc_v2, cuMemFree_v2, and through the runtime, loaded
 * RTLD_GLOBAL as a program linked against it would have it, cudaMalloc and cudaFree) while stream
 * captures are in progress: the driver refuses them (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the
 * captures concerned invalidated) where cuThreadExchangeStreamCaptureMode's rule prohibits them,
 * and allows them elsewhere. Prints only the answers: the same with and without the preload, in
 * every mode; its last lines count what succeeded (alloc mode must have served all of it). */
CUresult cuStreamBeginCapture_legacy(CUstream) __asm__("cuStreamBeginCapture");
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);

static struct {
  __typeof__(&cudaMalloc) malloc;
  __typeof__(&cudaFree) free;
  __typeof__(&cudaThreadExchangeStreamCaptureMode) mode;
  __typeof__(&cudaStreamBeginCapture) begin;
  __typeof__(&cudaStreamEndCapture) end;
} rt;

static int rt_load(void) {
  if (!dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL)) return -1;
  rt.malloc = (__typeof__(rt.malloc))dlsym(RTLD_DEFAULT, "cudaMalloc");
  rt.free = (__typeof__(rt.free))dlsym(RTLD_DEFAULT, "cudaFree");
  rt.mode = (__typeof__(rt.mode))dlsym(RTLD_DEFAULT, "cudaThreadExchangeStreamCaptureMode");
  rt.begin = (__typeof__(rt.begin))dlsym(RTLD_DEFAULT, "cudaStreamBeginCapture");
  rt.end = (__typeof__(rt.end))dlsym(RTLD_DEFAULT, "cudaStreamEndCapture");
  return rt.malloc && rt.free && rt.mode && rt.begin && rt.end ? 0 : -1;
}

static int ok_allocs, ok_frees;

/* Prints what a call answered; counts it in *ok when it succeeded. */
static void shown(const char *what, int r, int *ok) {
  printf("%-60s %d\n", what, r);
  if (!r && ok) (*ok)++;
}
#define SA(call) shown(#call, (int)(call), &ok_allocs)
#define SF(call) shown(#call, (int)(call), &ok_frees)
#define SC(call) shown(#call, (int)(call), NULL)

/* Another thread's capture on a stream of its own, begun (by the driver or the runtime) with
 * mode, held until told to end. */
typedef struct capturer_s {
  CUstream s;
  int mode, runtime;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stage; /* 1 begun, 2 told to end, 3 ended */
  int begun, ended;
} capturer_t;

static void cap_set(capturer_t *c, int stage) {
  pthread_mutex_lock(&c->mu);
  c->stage = stage;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static void cap_wait(capturer_t *c, int stage) {
  pthread_mutex_lock(&c->mu);
  while (c->stage < stage) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

static void *cap_main(void *arg) {
  capturer_t *c = arg;
  CHECK(cuCtxSetCurrent(ctx));
  c->begun = c->runtime ? (int)rt.begin((cudaStream_t)c->s, (enum cudaStreamCaptureMode)c->mode)
                        : (int)cuStreamBeginCapture_v2(c->s, (CUstreamCaptureMode)c->mode);
  cap_set(c, 1);
  cap_wait(c, 2);
  CUgraph g = NULL;
  c->ended = c->runtime ? (int)rt.end((cudaStream_t)c->s, (cudaGraph_t *)&g)
                        : (int)cuStreamEndCapture(c->s, &g);
  if (g) cuGraphDestroy(g);
  return NULL;
}

/* A thread's synchronous allocation while main captures. */
static void *alloc_main(void *arg) {
  CHECK(cuCtxSetCurrent(ctx));
  CUdeviceptr d = 0;
  int r = (int)cuMemAlloc_v2(&d, 1 << 20);
  if (!r) cuMemFree_v2(d);
  *(int *)arg = r;
  return NULL;
}

static int capture(void) {
  context();
  load_kernel();
  if (rt_load()) {
    printf("FAIL no runtime\n");
    return 1;
  }
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr kd = 0, d = 0;
  void *kr = NULL, *r = NULL;
  CUgraph g = NULL;
  CUstreamCaptureStatus cs;
  unsigned long long sum = 0;
  SA(cuMemAlloc_v2(&kd, 1 << 20));
  SA(rt.malloc(&kr, 1 << 20));

  printf("-- (a) the thread's own capture, not RELAXED: refused, invalidated, memory kept\n");
  for (int v = 0; v < 4; v++) {
    CUstream cap = v == 3 ? CU_STREAM_PER_THREAD : s;
    if (v == 0) SC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    if (v == 1) SC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    if (v == 2) SC(cuStreamBeginCapture_legacy(s));
    if (v == 3) SC(cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
    d = 0;
    r = NULL;
    SA(cuMemAlloc_v2(&d, 1 << 20));
    SF(cuMemFree_v2(kd));
    SA(rt.malloc(&r, 1 << 20));
    SF(rt.free(kr));
    SC(cuStreamIsCapturing(cap, &cs));
    printf("%-60s %d\n", "status", (int)cs);
    if (v == 3)
      SC(cuStreamEndCapture_ptsz(NULL, &g));
    else
      SC(cuStreamEndCapture(s, &g));
  }
  sum += touch(kd, 1 << 20, 11) + touch((CUdeviceptr)(uintptr_t)kr, 1 << 20, 12);

  printf("-- (b) the thread's own RELAXED capture: allowed\n");
  SC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  d = 0;
  r = NULL;
  SA(cuMemAlloc_v2(&d, 1 << 20));
  SF(cuMemFree_v2(d));
  SA(rt.malloc(&r, 1 << 20));
  SF(rt.free(r));
  SC(cuStreamEndCapture(s, &g));
  SC(cuGraphDestroy(g));

  printf("-- (c, d) another thread's capture: only GLOBAL in a GLOBAL thread is refused\n");
  static const struct {
    int theirs, mine;
  } cases[] = {
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL},
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL},
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED},
      {CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_GLOBAL},
      {CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL},
  };
  for (int i = 0; i < 10; i++) {
    capturer_t c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    c.mode = cases[i % 5].theirs;
    c.runtime = i >= 5; /* the same through the runtime */
    CHECK(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING));
    pthread_t t;
    if (pthread_create(&t, NULL, cap_main, &c)) return 1;
    cap_wait(&c, 1);
    printf("theirs %d (%s), mine %d: begun %d\n", c.mode, c.runtime ? "runtime" : "driver",
           cases[i % 5].mine, c.begun);
    int m = cases[i % 5].mine;
    if (c.runtime)
      SC(rt.mode((enum cudaStreamCaptureMode *)&m));
    else
      SC(cuThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)&m));
    printf("%-60s %d\n", "previous mode", m);
    d = 0;
    r = NULL;
    SA(cuMemAlloc_v2(&d, 1 << 20));
    SF(cuMemFree_v2(d ? d : kd));
    SA(rt.malloc(&r, 1 << 20));
    SF(rt.free(r ? r : kr));
    SC(cuThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)&m));
    cap_set(&c, 2);
    pthread_join(t, NULL);
    printf("%-60s %d\n", "their end", c.ended);
    CHECK(cuStreamDestroy(c.s));
  }
  /* main's GLOBAL capture of its per-thread stream prohibits another GLOBAL thread */
  SC(cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
  int other = -1;
  pthread_t t;
  if (pthread_create(&t, NULL, alloc_main, &other)) return 1;
  pthread_join(t, NULL);
  printf("%-60s %d\n", "another thread's cuMemAlloc_v2", other);
  SC(cuStreamEndCapture_ptsz(NULL, &g));

  printf("-- (e) PyTorch's cudaMalloc in a capture: RELAXED around it\n");
  SC(rt.begin((cudaStream_t)s, cudaStreamCaptureModeGlobal));
  SC(cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
  enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  SC(rt.mode(&m));
  printf("%-60s %d\n", "previous mode", (int)m);
  r = NULL;
  SA(rt.malloc(&r, 1 << 20));
  if (r) sum += touch((CUdeviceptr)(uintptr_t)r, 1 << 20, 13);
  SF(rt.free(r));
  SC(rt.mode(&m));
  printf("%-60s %d\n", "previous mode", (int)m);
  SC(rt.end((cudaStream_t)s, (cudaGraph_t *)&g));
  SC(cuGraphDestroy(g));

  printf("-- after the captures (and one the driver refused to begin: nothing prohibits)\n");
  SC(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
  d = 0;
  SA(cuMemAlloc_v2(&d, 1 << 20));
  SF(cuMemFree_v2(d));
  SF(cuMemFree_v2(kd));
  SF(rt.free(kr));
  CHECK(cuStreamDestroy(s));
  printf("checksum %llu\n", sum);
  printf("succeeded: allocations %d frees %d\n", ok_allocs, ok_frees);
  printf("capture: done\n");
  return 0;
}

/* Per-thread default streams are one stream per thread: a block thread A frees on its own, while
 * its work there is pending, must not go to another thread's allocation on any stream (its
 * per-thread stream, a created one, the legacy one) until that work is done, where the allocator
 * orders nothing between the streams (served memory). A's stream is held
 * (wltest_stream_hold: busy until released) or runs a long kernel before A exits; B checks the
 * event A recorded after its work, so "pending" is the driver's word, not a duration. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);

#define PTDS_SIZE (15u << 20) /* over half of liballoc's 20 MiB chunk, under it, not cached */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stage;
  CUdeviceptr x;
  CUevent e;
  CUfunction slow;
} pt = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, NULL, NULL};

static void pt_set(int stage) {
  pthread_mutex_lock(&pt.mu);
  pt.stage = stage;
  pthread_cond_broadcast(&pt.cv);
  pthread_mutex_unlock(&pt.mu);
}

static void pt_wait(int stage) {
  pthread_mutex_lock(&pt.mu);
  while (pt.stage < stage) pthread_cond_wait(&pt.cv, &pt.mu);
  pthread_mutex_unlock(&pt.mu);
}

/* Thread A: rounds of X allocated, used and freed on its per-thread stream while the stream is
 * held; released after B looked, then the next round once B gave its block back (stages only go
 * up; four a round). B's cuMemFree may synchronise the device ("may perform implicit
 * synchronization"), which the next round's hold would block. */
static void *ptds_holder(void *arg) {
  int rounds = (int)(intptr_t)arg;
  int (*hold)(CUstream) = (int (*)(CUstream))dlsym(RTLD_DEFAULT, "wltest_stream_hold");
  int (*release)(CUstream) = (int (*)(CUstream))dlsym(RTLD_DEFAULT, "wltest_stream_release");
  CHECK(cuCtxSetCurrent(ctx));
  for (int r = 0; r < rounds; r++) {
    CHECK(cuMemAllocAsync(&pt.x, PTDS_SIZE, CU_STREAM_PER_THREAD));
    CHECK(cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, NULL, NULL));
    if (!hold || hold(CU_STREAM_PER_THREAD)) {
      printf("FAIL no stream hold\n");
      exit(1);
    }
    CHECK(cuEventRecord(pt.e, CU_STREAM_PER_THREAD));
    CHECK(cuMemFreeAsync(pt.x, CU_STREAM_PER_THREAD));
    pt_set(4 * r + 1);
    pt_wait(4 * r + 2);
    release(CU_STREAM_PER_THREAD);
    CHECK(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    pt_set(4 * r + 3);
    pt_wait(4 * r + 4);
  }
  return NULL;
}

/* Thread A of the last round: a long kernel on its per-thread stream using X, X freed there,
 * and the thread gone. */
static void *ptds_leaver(void *arg) {
  (void)arg;
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuMemAllocAsync(&pt.x, PTDS_SIZE, CU_STREAM_PER_THREAD));
  CHECK(cuLaunchKernel(pt.slow, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, NULL, NULL));
  CHECK(cuEventRecord(pt.e, CU_STREAM_PER_THREAD));
  CHECK(cuMemFreeAsync(pt.x, CU_STREAM_PER_THREAD));
  return NULL;
}

/* B's allocation by door d (0 a created stream, 1 classic, 2 its per-thread stream, 3 the _ptsz
 * NULL): whether it got X while A's work was pending. The driver double's pools may (they free
 * at once: its kernels took effect at enqueue; CUDA's would order B's stream after A's work);
 * liballoc's must not: it orders nothing between streams. */
static CUdeviceptr ptds_take(const char *round, int d, CUstream s) {
  static const char *const doors[] = {"a created stream", "the legacy stream",
                                      "its per-thread stream", "a _ptsz NULL stream"};
  CUdeviceptr y = 0;
  if (d == 0) CHECK(cuMemAllocAsync(&y, PTDS_SIZE, s));
  if (d == 1) CHECK(cuMemAlloc_v2(&y, PTDS_SIZE));
  if (d == 2) CHECK(cuMemAllocAsync(&y, PTDS_SIZE, CU_STREAM_PER_THREAD));
  if (d == 3) CHECK(cuMemAllocAsync_ptsz(&y, PTDS_SIZE, NULL));
  int pending = cuEventQuery(pt.e) == CUDA_ERROR_NOT_READY;
  printf("ptds %s: B on %s got A's block while A's work was pending: %s\n", round, doors[d],
         y == pt.x && pending ? "yes" : "no");
  return y;
}

/* Freed once A's work is done (cuMemFree waits for the device: a held stream would block it). */
static void ptds_give(int d, CUstream s, CUdeviceptr y) {
  if (d == 0) CHECK(cuMemFreeAsync(y, s));
  if (d == 1) CHECK(cuMemFree_v2(y));
  if (d == 2) CHECK(cuMemFreeAsync(y, CU_STREAM_PER_THREAD));
  if (d == 3) CHECK(cuMemFreeAsync_ptsz(y, NULL));
}

static const char slow_ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                               ".visible .entry wl_probe_slow()\n{\n ret;\n}\n";

static int ptds(void) {
  /* The last round's kernel: long enough that B looks while it runs (a hold cannot outlive
   * its thread: only the thread can name its per-thread stream). */
  setenv("WLTEST_KERNEL_NS_wl_probe_slow", "2000000000", 0);
  context();
  load_kernel();
  CUmodule m;
  CHECK(cuModuleLoadData(&m, slow_ptx));
  CHECK(cuModuleGetFunction(&pt.slow, m, "wl_probe_slow"));
  CHECK(cuEventCreate(&pt.e, CU_EVENT_DISABLE_TIMING));
  CUstream s;
  CHECK(cuStreamCreate(&s, 0));
  pthread_t a;
  pthread_create(&a, NULL, ptds_holder, (void *)(intptr_t)4);
  for (int d = 0; d < 4; d++) {
    pt_wait(4 * d + 1);
    CUdeviceptr y = ptds_take("held", d, s);
    pt_set(4 * d + 2);
    pt_wait(4 * d + 3);
    ptds_give(d, s, y);
    pt_set(4 * d + 4);
  }
  pthread_join(a, NULL);
  /* A thread that frees and ends while its work runs. */
  pthread_create(&a, NULL, ptds_leaver, NULL);
  pthread_join(a, NULL);
  CUdeviceptr y[3];
  for (int d = 2; d >= 0; d--) y[d] = ptds_take("exited", d, s);
  CHECK(cuEventSynchronize(pt.e));
  for (int d = 2; d >= 0; d--) ptds_give(d, s, y[d]);
  CHECK(cuStreamSynchronize(s));
  CHECK(cuCtxSynchronize());
  printf("ptds: done\n");
  return 0;
}

/* ---- libwavelet.so's own driver calls during a program's capture ----------------------------
 * main begins a GLOBAL capture on its stream and stays capturing while thread B (GLOBAL mode, not
 * capturing) allocates, uses and frees stream-ordered memory on its own stream, more than any
 * allocator serving it has mapped, then waits until the freed memory was given back to the
 * driver (a serving allocator's trim: unmapped and released); twice; then main ends the capture.
 * Run under WLTEST_CAPTURE_UNSAFE=vmm, where the driver double counts the VMM calls and event
 * creation as unsafe during capture: the program makes none of them, so without the preload the
 * capture ends well and B's calls succeed, and so they must with it, in every mode. */
static const size_t own_sizes[] = {48u << 20, 72u << 20, 30u << 20};
#define OWN_N (sizeof own_sizes / sizeof own_sizes[0])

/* Until the driver holds less physical memory than bytes (at once without a serving allocator;
 * a real driver has no counters). A wait, not a timed check: a library that never gave the
 * memory back would hang here, and ctest's timeout says so. */
static void own_given_back(size_t bytes) {
  void (*stats)(wltest_driver_stats_t *) =
      (void (*)(wltest_driver_stats_t *))dlsym(RTLD_DEFAULT, "wltest_driver_stats");
  wltest_driver_stats_t st;
  while (stats) {
    stats(&st);
    if (st.phys_bytes < bytes) return;
    usleep(1000);
  }
}

/* Thread B: c->s is its stream, c->stage main's capture (1 begun, 2 B done). */
static void *own_user(void *arg) {
  capturer_t *c = arg;
  CHECK(cuCtxSetCurrent(ctx));
  cap_wait(c, 1);
  unsigned long long sum = 0;
  for (unsigned round = 0; round < 2; round++) {
    CUdeviceptr d[OWN_N] = {0};
    size_t total = 0;
    for (unsigned i = 0; i < OWN_N; i++) {
      SA(cuMemAllocAsync(&d[i], own_sizes[i], c->s));
      SC(cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, c->s, NULL, NULL));
      if (d[i]) sum += touch(d[i], own_sizes[i], round * OWN_N + i);
      total += own_sizes[i];
    }
    for (unsigned i = 0; i < OWN_N; i++) SF(cuMemFreeAsync(d[i], c->s));
    own_given_back(total);
  }
  printf("checksum %llu\n", sum);
  cap_set(c, 2);
  return NULL;
}

static int own_calls(void) {
  context();
  load_kernel();
  CUstream s;
  capturer_t c;
  memset(&c, 0, sizeof c);
  pthread_mutex_init(&c.mu, NULL);
  pthread_cond_init(&c.cv, NULL);
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING));
  pthread_t t;
  if (pthread_create(&t, NULL, own_user, &c)) return 1;
  SC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  SC(cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
  cap_set(&c, 1);
  cap_wait(&c, 2);
  pthread_join(t, NULL);
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  SC(cuStreamIsCapturing(s, &cs));
  printf("%-60s %d\n", "status", (int)cs);
  CUgraph g = NULL;
  SC(cuStreamEndCapture(s, &g));
  if (g) SC(cuGraphDestroy(g));
  CHECK(cuStreamSynchronize(c.s));
  CHECK(cuStreamDestroy(c.s));
  CHECK(cuStreamDestroy(s));
  printf("succeeded: allocations %d frees %d\n", ok_allocs, ok_frees);
  printf("own-calls: done\n");
  return 0;
}

/* ---- CUDA IPC across processes ---------------------------------------------------------------
 * ipc: this process allocates a 1 MiB and a 48 MiB buffer (the second spans several of
 * liballoc's chunks where served), writes a pattern, gets their handles (twice: the same handle)
 * and starts itself as "ipc-open HEX HEX", which opens both (one twice: the same address), checks
 * the pattern, writes its own and closes; then this process sees the child's bytes. Every answer
 * is printed, so the output is the same whoever made the handles, the driver or libwavelet.so. */
#define IPC_BIG ((size_t)48 << 20)

static void hex_of(const CUipcMemHandle *h, char *out) {
  for (size_t i = 0; i < sizeof h->reserved; i++)
    sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static int handle_of(const char *hex, CUipcMemHandle *h) {
  if (strlen(hex) != 2 * sizeof h->reserved) return -1;
  for (size_t i = 0; i < sizeof h->reserved; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    h->reserved[i] = (char)v;
  }
  return 0;
}

/* Bytes at a few offsets, read through the driver. */
static unsigned long long sample(CUdeviceptr d, size_t size) {
  unsigned long long sum = 0;
  for (size_t off = 0; off < size; off += size / 7 + 4093) {
    unsigned char b;
    CHECK(cuMemcpyDtoH(&b, d + off, 1));
    sum = sum * 31 + b;
  }
  return sum;
}

static int ipc_open(int argc, char **argv) {
  context();
  CUipcMemHandle h[2];
  if (argc < 4 || handle_of(argv[2], &h[0]) || handle_of(argv[3], &h[1])) {
    printf("ipc-open: bad handles\n");
    return 2;
  }
  CUdeviceptr d[2] = {0, 0}, again = 0, e = 0;
  const size_t size[2] = {1 << 20, IPC_BIG};
  /* First in a context of the child's own: opened there, readable, closed by its destroy (in
   * alloc and gate modes the importer's first open, made under the primary context). */
  CUdevice dev;
  CUcontext c;
  CHECK(cuCtxGetDevice(&dev));
  CHECK(cuCtxCreate(&c, NULL, 0, dev));
  printf("child: open in a created context %d\n", (int)cuIpcOpenMemHandle(&e, h[0], 1));
  if (e) printf("child: sample there %llu\n", sample(e, size[0]));
  printf("child: destroy %d\n", (int)cuCtxDestroy(c));
  CHECK(cuCtxSetCurrent(ctx));
  printf("child: closed by the destroy %d\n", e && cuIpcCloseMemHandle(e) != CUDA_SUCCESS);
  printf("child: open small %d\n", (int)cuIpcOpenMemHandle(&d[0], h[0], 1));
  printf("child: open big %d\n", (int)cuIpcOpenMemHandle(&d[1], h[1], 1));
  CUresult r = cuIpcOpenMemHandle(&again, h[1], 1);
  printf("child: open big again %d, same address %d\n", (int)r, again == d[1]);
  for (int k = 0; k < 2; k++) {
    if (!d[k]) continue;
    printf("child: sample %d %llu\n", k, sample(d[k], size[k]));
    CHECK(cuMemsetD8(d[k], (unsigned char)(0x60 + k), size[k]));
  }
  printf("child: bad flags refused %d\n", cuIpcOpenMemHandle(&again, h[0], 0x80) != CUDA_SUCCESS);
  printf("child: close big %d\n", (int)cuIpcCloseMemHandle(d[1]));
  printf("child: close big %d\n", (int)cuIpcCloseMemHandle(d[1]));
  printf("child: close small %d\n", (int)cuIpcCloseMemHandle(d[0]));
  printf("child: close unopened refused %d\n", cuIpcCloseMemHandle(d[0]) != CUDA_SUCCESS);
  return 0;
}

static int ipc(void) {
  context();
  CUdeviceptr d[2] = {0, 0};
  const size_t size[2] = {1 << 20, IPC_BIG};
  CUipcMemHandle h[2], h2;
  char hex[2][2 * sizeof h[0].reserved + 1];
  for (int k = 0; k < 2; k++) {
    CHECK(cuMemAlloc_v2(&d[k], size[k]));
    CHECK(cuMemsetD8(d[k], (unsigned char)(0x30 + k), size[k]));
    CHECK(cuMemsetD8(d[k] + size[k] / 3, 0x7e, 4096));
    printf("parent: handle %d %d\n", k, (int)cuIpcGetMemHandle(&h[k], d[k]));
    printf("parent: again, same handle %d\n",
           cuIpcGetMemHandle(&h2, d[k]) == CUDA_SUCCESS && !memcmp(&h2, &h[k], sizeof h2));
    printf("parent: sample %d %llu\n", k, sample(d[k], size[k]));
    hex_of(&h[k], hex[k]);
  }
  /* The driver answers a pointer inside an allocation with the allocation's handle (H200). */
  printf("parent: inside an allocation, the allocation's handle %d\n",
         cuIpcGetMemHandle(&h2, d[1] + 4096) == CUDA_SUCCESS && !memcmp(&h2, &h[1], sizeof h2));
  CUdeviceptr own = 0;
  printf("parent: own handle opened here %d\n", (int)cuIpcOpenMemHandle(&own, h[0], 1));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", "wl-ip-probe", "ipc-open", hex[0], hex[1], (char *)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  printf("parent: child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  for (int k = 0; k < 2; k++) {
    unsigned char b[3];
    CHECK(cuMemcpyDtoH(&b[0], d[k], 1));
    CHECK(cuMemcpyDtoH(&b[1], d[k] + size[k] / 3, 1));
    CHECK(cuMemcpyDtoH(&b[2], d[k] + size[k] - 1, 1));
    printf("parent: bytes %d now %#x %#x %#x\n", k, b[0], b[1], b[2]);
    CHECK(cuMemFree_v2(d[k]));
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

/* pinned-flags: page-locked allocations made with each flag set and by cuMemAllocHost, asked
 * their flags (cuMemHostGetFlags): the driver's answers, printed. In alloc and gate modes the
 * pinned arena serves all but the write-combined one; the answers must not change. */
static int pinned_flags(void) {
  context();
  static const unsigned sets[] = {0, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP,
                                  CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP,
                                  CU_MEMHOSTALLOC_WRITECOMBINED};
  enum { N = sizeof sets / sizeof sets[0] };
  void *p[N + 1];
  for (int i = 0; i <= N; i++) {
    if (i < N)
      CHECK(cuMemHostAlloc(&p[i], 10000 + (size_t)i, sets[i]));
    else
      CHECK(cuMemAllocHost_v2(&p[i], 5000));
    unsigned got = ~0u;
    CUresult r = cuMemHostGetFlags(&got, p[i]);
    printf("pinned-flags: %s %#x: %d %#x\n", i < N ? "cuMemHostAlloc" : "cuMemAllocHost",
           i < N ? sets[i] : 0, (int)r, got);
  }
  for (int i = 0; i <= N; i++) CHECK(cuMemFreeHost(p[i]));
  return 0;
}

/* Open descriptors of this process. */
static int count_fds(void) {
  DIR *dir = opendir("/proc/self/fd");
  int n = 0;
  if (!dir) return -1;
  for (struct dirent *e; (e = readdir(dir)) != NULL;) n += e->d_name[0] != '.';
  closedir(dir);
  return n - 1; /* the directory's own */
}

/* ipc-many (alloc and gate modes): 3000 exported allocations hold no descriptors, and the
 * exports of the live ones survive a third of the others being freed in between (the same
 * handle again; a lost export would make a new one). */
static int ipc_many(void) {
  context();
  enum { N = 3000 };
  CUdeviceptr d[N];
  static CUipcMemHandle h[N];
  int ok = 0;
  for (int i = 0; i < N; i++) CHECK(cuMemAlloc_v2(&d[i], 4096 + (size_t)(i % 7) * 1000));
  int fds0 = count_fds();
  for (int i = 0; i < N; i++) ok += cuIpcGetMemHandle(&h[i], d[i]) == CUDA_SUCCESS;
  int held = count_fds() - fds0;
  for (int i = 0; i < N; i += 3) CHECK(cuMemFree_v2(d[i]));
  int same = 0, kept = 0;
  for (int i = 0; i < N; i++) {
    if (i % 3 == 0) continue;
    CUipcMemHandle again;
    kept++;
    same += cuIpcGetMemHandle(&again, d[i]) == CUDA_SUCCESS && !memcmp(&again, &h[i], sizeof again);
  }
  /* New allocations, perhaps at freed addresses, get new handles. */
  int fresh = 0;
  for (int i = 0; i < N; i += 3) {
    CHECK(cuMemAlloc_v2(&d[i], 4096));
    CUipcMemHandle n;
    fresh += cuIpcGetMemHandle(&n, d[i]) == CUDA_SUCCESS && memcmp(&n, &h[i], sizeof n) != 0;
  }
  for (int i = 0; i < N; i++) CHECK(cuMemFree_v2(d[i]));
  printf("ipc-many: handles %d of %d, descriptors held %d, same handle %d of %d, new handles %d "
         "of %d\n",
         ok, N, held, same, kept, fresh, (N + 2) / 3);
  return 0;
}

/* reset: allocations of every kind live when the program resets the device, by the driver
 * (cuDevicePrimaryCtxReset_v2) and then by the runtime (cudaDeviceReset); after each the
 * device works again. The trace must account every allocation freed (a reset frees them).
 * Device memory is written and read by the driver's copies (real on a GPU too). */
static unsigned long long filled(CUdeviceptr d, size_t size, unsigned char v) {
  CHECK(cuMemsetD8(d, v, size));
  return sample(d, size);
}

static unsigned long long host_filled(void *p, size_t size, unsigned char v) {
  memset(p, v, size);
  return ((unsigned char *)p)[0] + ((unsigned char *)p)[size - 1];
}

typedef struct reset_left_s {
  CUdeviceptr small, async;
  unsigned long long async_sample;
} reset_left_t;

static reset_left_t reset_round(const char *tag) {
  CUstream s;
  CUdeviceptr big, small, async, gone;
  void *pin, *pin_big;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemAlloc_v2(&big, 24u << 20));
  CHECK(cuMemAlloc_v2(&small, 1000));
  CHECK(cuMemAllocAsync(&async, 3u << 20, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemHostAlloc(&pin, 10000, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(cuMemAllocHost_v2(&pin_big, 40u << 20));
  CHECK(cuMemAlloc_v2(&gone, 2u << 20));
  CHECK(cuMemFree_v2(gone));
  unsigned long long async_sample = filled(async, 3u << 20, 3);
  unsigned long long sum = filled(big, 24u << 20, 1) + filled(small, 1000, 2) + async_sample +
                           host_filled(pin, 10000, 4) + host_filled(pin_big, 40u << 20, 5);
  printf("reset: %s: %llu\n", tag, sum);
  return (reset_left_t){small, async, async_sample};
}

/* After a reset: the stream-ordered allocation survived it with its contents ("will not
 * destroy memory allocations by cudaMallocAsync()") and is freed on a new stream; the
 * synchronous one is gone. */
static void reset_after(const char *tag, reset_left_t left) {
  printf("reset: after the %s: stream-ordered kept %d\n", tag,
         sample(left.async, 3u << 20) == left.async_sample);
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  printf("reset: after the %s: its free %d\n", tag, (int)cuMemFreeAsync(left.async, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuStreamDestroy_v2(s));
}

static int reset_probe(void) {
  context();
  CUdevice dev;
  CHECK(cuCtxGetDevice(&dev));
  reset_left_t left = reset_round("before the driver's reset");
  CHECK(cuDevicePrimaryCtxReset_v2(dev));
  /* A pointer from before is unknown now, whoever served it (its free is the program's bug; the
   * answer must be the driver's). Asked before anything new is allocated at its address. */
  printf("reset: free from before the reset refused %d\n",
         cuMemFree_v2(left.small) != CUDA_SUCCESS);
  /* Retained again, as a program does after a reset: on an H200 the old handle answered
   * CONTEXT_IS_DESTROYED (709) to the next copy, where the driver double kept it usable. */
  CUcontext again;
  CHECK(cuDevicePrimaryCtxRetain(&again, dev));
  CHECK(cuDevicePrimaryCtxRelease_v2(dev)); /* the probe's one retain stays */
  ctx = again;
  CHECK(cuCtxSetCurrent(ctx));
  reset_after("driver's reset", left);
  left = reset_round("before the runtime's reset");
  cudaError_t (*rt_reset)(void) = NULL;
  cudaError_t (*rt_malloc)(void **, size_t) = NULL;
  cudaError_t (*rt_free)(void *) = NULL;
  if (dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL)) {
    rt_reset = (__typeof__(rt_reset))dlsym(RTLD_DEFAULT, "cudaDeviceReset");
    rt_malloc = (__typeof__(rt_malloc))dlsym(RTLD_DEFAULT, "cudaMalloc");
    rt_free = (__typeof__(rt_free))dlsym(RTLD_DEFAULT, "cudaFree");
  }
  if (!rt_reset || !rt_malloc || !rt_free) {
    printf("FAIL: no runtime\n");
    return 1;
  }
  void *r1 = NULL, *r2 = NULL;
  printf("reset: cudaMalloc %d\n", (int)rt_malloc(&r1, 5u << 20));
  printf("reset: cudaDeviceReset %d\n", (int)rt_reset());
  printf("reset: cudaMalloc after %d\n", (int)rt_malloc(&r2, 5u << 20));
  if (r2) printf("reset: filled %llu\n", filled((CUdeviceptr)(uintptr_t)r2, 5u << 20, 6));
  reset_after("runtime's reset", left);
  printf("reset: cudaFree %d\n", (int)rt_free(r2));
  printf("reset: done\n");
  return 0;
}

/* reset-capture (the doubles' model; not run on a GPU): a GLOBAL capture left in progress when
 * the device is reset ends with its stream; synchronous allocations afterwards are the
 * program's as usual (in alloc and gate modes served: the interposer must not take the dead
 * capture for a live one). */
static int reset_capture(void) {
  context();
  CUdevice dev;
  CUstream cap;
  CHECK(cuCtxGetDevice(&dev));
  CHECK(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL));
  printf("reset-capture: reset %d\n", (int)cuDevicePrimaryCtxReset_v2(dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUdeviceptr d[3];
  for (int i = 0; i < 3; i++) printf("reset-capture: alloc %d\n", (int)cuMemAlloc_v2(&d[i], 4096));
  for (int i = 0; i < 3; i++) printf("reset-capture: free %d\n", (int)cuMemFree_v2(d[i]));
  return 0;
}

/* The primary contexts of devices 0 and 1, retained; 0 (with a line) when there are fewer. */
static int two_contexts(const char *tag, CUcontext c[2]) {
  int n = 0;
  CHECK(cuInit(0));
  CHECK(cuDeviceGetCount(&n));
  if (n < 2) {
    printf("%s: %d device\n", tag, n);
    return 0;
  }
  for (int i = 0; i < 2; i++) {
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, i));
    CHECK(cuDevicePrimaryCtxRetain(&c[i], dev));
  }
  return 1;
}

/* reset-multi (the driver double with WLTEST_DEVICE_COUNT=2): memory on both devices (served by
 * an allocator each in alloc and gate modes), then device 1 is reset: device 0's synchronous
 * and stream-ordered memory keeps its contents and frees as usual, device 1's synchronous
 * memory is gone, its stream-ordered memory kept. */
static int reset_multi(void) {
  CUcontext c[2];
  if (!two_contexts("reset-multi", c)) return 0;
  CUdeviceptr sync[2], async[2];
  unsigned long long ssum[2], asum[2];
  CUstream s[2];
  for (int i = 0; i < 2; i++) {
    CHECK(cuCtxSetCurrent(c[i]));
    CHECK(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc_v2(&sync[i], 6u << 20));
    CHECK(cuMemAllocAsync(&async[i], 3u << 20, s[i]));
    CHECK(cuStreamSynchronize(s[i]));
    ssum[i] = filled(sync[i], 6u << 20, (unsigned char)(10 + i));
    asum[i] = filled(async[i], 3u << 20, (unsigned char)(20 + i));
    int d = -1;
    CHECK(cuPointerGetAttribute(&d, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, sync[i]));
    printf("reset-multi: device %d's memory on device %d\n", i, d);
  }
  CHECK(cuDevicePrimaryCtxReset_v2(1));
  CHECK(cuCtxSetCurrent(c[1]));
  printf("reset-multi: device 1's synchronous memory gone %d\n",
         cuMemFree_v2(sync[1]) != CUDA_SUCCESS);
  printf("reset-multi: device 1's stream-ordered memory kept %d\n",
         sample(async[1], 3u << 20) == asum[1]);
  CUstream s1;
  CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemFreeAsync(async[1], s1));
  CHECK(cuStreamSynchronize(s1));
  CHECK(cuCtxSetCurrent(c[0]));
  printf("reset-multi: device 0 kept %d %d\n", sample(sync[0], 6u << 20) == ssum[0],
         sample(async[0], 3u << 20) == asum[0]);
  CHECK(cuMemFree_v2(sync[0]));
  CHECK(cuMemFreeAsync(async[0], s[0]));
  CHECK(cuStreamSynchronize(s[0]));
  printf("reset-multi: done\n");
  return 0;
}

/* reset-pinned (WLTEST_DEVICE_COUNT=2): pinned memory allocated under both devices' contexts, a
 * small and a large block under each, device 1's first; a reset of device 1 frees device 1's,
 * and device 0's keep their contents and free as usual; pinned allocations afterwards work. In
 * alloc and gate modes the arena keeps each device's blocks in chunks pinned under its context:
 * device 0's small block once came from the chunk device 1's context pinned first, and the
 * reset unmapped it under the program. */
static int reset_pinned(void) {
  CUcontext c[2];
  if (!two_contexts("reset-pinned", c)) return 0;
  void *small[2], *big[2], *later;
  unsigned long long sum[2] = {0, 0};
  for (int i = 1; i >= 0; i--) {
    CHECK(cuCtxSetCurrent(c[i]));
    CHECK(cuMemHostAlloc(&small[i], 10000, 0));
    CHECK(cuMemHostAlloc(&big[i], 40u << 20, 0));
    sum[i] = host_filled(small[i], 10000, (unsigned char)(7 + i)) +
             host_filled(big[i], 40u << 20, (unsigned char)(9 + i));
  }
  CHECK(cuDevicePrimaryCtxReset_v2(1));
  printf("reset-pinned: device 0's kept %d\n",
         host_filled(small[0], 10000, 7) + host_filled(big[0], 40u << 20, 9) == sum[0]);
  CHECK(cuMemHostAlloc(&later, 10000, 0));
  printf("reset-pinned: a new one %llu\n", host_filled(later, 10000, 10));
  printf("reset-pinned: frees %d %d %d\n", (int)cuMemFreeHost(later), (int)cuMemFreeHost(small[0]),
         (int)cuMemFreeHost(big[0]));
  printf("reset-pinned: done\n");
  return 0;
}

/* pools (WLTEST_DEVICE_COUNT=2): stream-ordered allocations from pools other than the current
 * device's default one, with device 1's context current: from device 0's default pool (device 0's
 * memory, as CUDA gives), from a pool the program made on device 1 (that pool's), and from device
 * 1's default pool. Each answers its device and pool from the driver's pointer attributes. Then
 * the program's pool is made device 1's current one (cuDeviceSetMemPool): cuMemAllocAsync takes
 * it, and after its destroy the default one again. In alloc and gate modes only the default
 * pool's are served: before, every pool's allocation was served from the current device's
 * allocator, device 0's pool's on device 1. */
static int pools(void) {
  CUcontext c[2];
  if (!two_contexts("pools", c)) return 0;
  CUmemoryPool p0, p1, mine;
  CHECK(cuDeviceGetDefaultMemPool(&p0, 0));
  CHECK(cuDeviceGetDefaultMemPool(&p1, 1));
  CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1}};
  CHECK(cuMemPoolCreate(&mine, &props));
  CHECK(cuCtxSetCurrent(c[1]));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const CUmemoryPool from[3] = {p0, mine, p1};
  const char *const name[3] = {"device 0's default", "a pool of the program's",
                               "device 1's default"};
  CUdeviceptr d[3];
  for (int i = 0; i < 3; i++) {
    CHECK(cuMemAllocFromPoolAsync(&d[i], 4u << 20, from[i], s));
    CHECK(cuMemsetD8Async(d[i], (unsigned char)(50 + i), 4u << 20, s));
    CHECK(cuStreamSynchronize(s));
    int dev = -1;
    CHECK(cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d[i]));
    printf("pools: from %s: on device %d, filled %llu\n", name[i], dev, sample(d[i], 4u << 20));
  }
  for (int i = 0; i < 2; i++) {
    CUmemoryPool got = NULL;
    CHECK(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d[i]));
    printf("pools: the pointer from %s names its pool %d\n", name[i], got == from[i]);
  }
  for (int i = 0; i < 3; i++) CHECK(cuMemFreeAsync(d[i], s));
  CHECK(cuStreamSynchronize(s));
  /* Device 0's default pool, device 0 current, device 1's stream: the pool decides ("may be
   * from a device different than that of the specified stream"). */
  CUdeviceptr y;
  int ydev = -1;
  CHECK(cuCtxSetCurrent(c[0]));
  CHECK(cuMemAllocFromPoolAsync(&y, 4u << 20, p0, s));
  CHECK(cuPointerGetAttribute(&ydev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, y));
  printf("pools: device 0's default on device 1's stream: on device %d\n", ydev);
  CHECK(cuMemFreeAsync(y, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuCtxSetCurrent(c[1]));
  /* The program's pool made device 1's current one: cuMemAllocAsync takes it; destroyed, the
   * default one is current again. */
  CUdeviceptr x;
  CUmemoryPool got = NULL;
  CHECK(cuDeviceSetMemPool(1, mine));
  CHECK(cuMemAllocAsync(&x, 4u << 20, s));
  CHECK(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, x));
  printf("pools: cuMemAllocAsync with the program's pool current: from it %d\n", got == mine);
  CHECK(cuMemFreeAsync(x, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemPoolDestroy(mine));
  printf("pools: after its destroy %d\n", (int)cuMemAllocAsync(&x, 4u << 20, s));
  CHECK(cuMemFreeAsync(x, s));
  CHECK(cuStreamSynchronize(s));
  printf("pools: done\n");
  return 0;
}

/* A pool of the program's on device's memory, and a non-blocking stream to allocate on. */
static CUmemoryPool program_pool(int device, CUstream *s) {
  CHECK(cuStreamCreate(s, CU_STREAM_NON_BLOCKING));
  CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
  CUmemoryPool p;
  CHECK(cuMemPoolCreate(&p, &props));
  return p;
}

/* pool-budget: memory from a pool of the program's passes through to the driver, but the group's
 * budget still holds it: under a 256 MiB budget, 200 MiB from the pool fit, 100 MiB more do not
 * (neither from the pool nor from cuMemAlloc), and once the 200 MiB are freed they do. Prints
 * each answer. */
static int pool_budget(void) {
  context();
  CUstream s;
  CUmemoryPool mine = program_pool(0, &s);
  CUdeviceptr a = 0, b = 0, c = 0;
  CUresult ra = cuMemAllocFromPoolAsync(&a, 200u << 20, mine, s);
  CUresult rb = cuMemAllocFromPoolAsync(&b, 100u << 20, mine, s);
  CUresult rc = cuMemAlloc_v2(&c, 100u << 20);
  printf("pool-budget: 200 MiB %d, 100 MiB more %d, cuMemAlloc 100 MiB %d\n", (int)ra, (int)rb,
         (int)rc);
  if (rb == CUDA_SUCCESS) CHECK(cuMemFreeAsync(b, s));
  if (rc == CUDA_SUCCESS) CHECK(cuMemFree_v2(c));
  if (ra == CUDA_SUCCESS) CHECK(cuMemFreeAsync(a, s));
  CHECK(cuStreamSynchronize(s));
  rb = cuMemAllocFromPoolAsync(&b, 100u << 20, mine, s);
  printf("pool-budget: after the free, 100 MiB %d\n", (int)rb);
  if (rb == CUDA_SUCCESS) CHECK(cuMemFreeAsync(b, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemPoolDestroy(mine));
  return 0;
}

/* managed: 8 MiB of managed memory (accounted, never served: the driver's), filled by a kernel
 * and read back, then freed; an unknown attach flag is the driver's error. Prints the answers. */
static int managed(void) {
  context();
  CUdeviceptr m = 0;
  CUresult r = cuMemAllocManaged(&m, 8u << 20, CU_MEM_ATTACH_GLOBAL);
  printf("managed: alloc %d\n", (int)r);
  if (r != CUDA_SUCCESS) return 1;
  CHECK(cuMemsetD8_v2(m, 7, 8u << 20));
  printf("managed: filled %llu\n", sample(m, 8u << 20));
  CHECK(cuMemFree_v2(m));
  CUdeviceptr bad = 0;
  printf("managed: bad flags %d\n", (int)cuMemAllocManaged(&bad, 4096, 0x100));
  return 0;
}

/* pool-device (two devices, 256 MiB budgets): a pool of the program's on device 1, allocated from
 * while device 0 is current, is device 1's memory and booked in device 1's budget: 200 MiB of it
 * leave device 0's 200 MiB room, and 100 MiB more from the pool do not fit device 1's. */
static int pool_device(void) {
  CUcontext c[2];
  if (!two_contexts("pool-device", c)) return 0;
  CHECK(cuCtxSetCurrent(c[0]));
  CUstream s;
  CUmemoryPool on1 = program_pool(1, &s);
  CUdeviceptr a = 0, b = 0, d0 = 0;
  CUresult ra = cuMemAllocFromPoolAsync(&a, 200u << 20, on1, s);
  CUresult r0 = cuMemAlloc_v2(&d0, 200u << 20);
  CUresult rb = cuMemAllocFromPoolAsync(&b, 100u << 20, on1, s);
  printf("pool-device: device 1's pool 200 MiB %d, device 0 200 MiB %d, pool 100 MiB more %d\n",
         (int)ra, (int)r0, (int)rb);
  if (rb == CUDA_SUCCESS) CHECK(cuMemFreeAsync(b, s));
  if (ra == CUDA_SUCCESS) CHECK(cuMemFreeAsync(a, s));
  if (r0 == CUDA_SUCCESS) CHECK(cuMemFree_v2(d0));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemPoolDestroy(on1));
  return 0;
}

/* sync-order: what synchronous allocations and frees promise beside stream-ordered memory.
 * 1. cuMemAlloc's memory is usable on any stream at once, so it is never a block freed in stream
 *    order on the legacy stream while that stream's work (held) may still read it.
 * 2. cuMemFree of cuMemAlloc's memory "may perform implicit synchronization", and programs count
 *    on it: a kernel on a non-blocking stream reading the block, then the free. The driver double
 *    does not synchronise there, so the program prints what it saw and the test asks the served
 *    modes for "yes" (the block cannot go to another stream, or be unmapped, under the kernel).
 * Then the block of 2 is allocated again on another stream: it must be the same work-free block
 * or another, and the kernel over. */
static int sync_order(void) {
  setenv("WLTEST_KERNEL_NS_wl_probe_slow", "300000000", 0);
  context();
  int (*hold)(CUstream) = (int (*)(CUstream))dlsym(RTLD_DEFAULT, "wltest_stream_hold");
  int (*release)(CUstream) = (int (*)(CUstream))dlsym(RTLD_DEFAULT, "wltest_stream_release");
  if (!hold || !release) {
    printf("sync-order: no stream hold\n");
    return 1;
  }
  CUdeviceptr a, c;
  CHECK(cuMemAllocAsync(&a, PTDS_SIZE, NULL)); /* NULL: the legacy stream, as cudaFreeAsync(p, 0) */
  CHECK(hold(NULL));
  CHECK(cuMemFreeAsync(a, NULL));
  CHECK(cuMemAlloc_v2(&c, PTDS_SIZE));
  printf("sync-order: cuMemAlloc got the block freed on the held legacy stream: %s\n",
         c == a ? "yes" : "no");
  CHECK(release(NULL));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemFree_v2(c));
  CUmodule m;
  CUfunction slow;
  CHECK(cuModuleLoadData(&m, slow_ptx));
  CHECK(cuModuleGetFunction(&slow, m, "wl_probe_slow"));
  CUstream nb;
  CUevent e;
  CHECK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr b;
  CHECK(cuMemAlloc_v2(&b, PTDS_SIZE));
  CHECK(cuLaunchKernel(slow, 1, 1, 1, 32, 1, 1, 0, nb, NULL, NULL));
  CHECK(cuEventRecord(e, nb));
  CHECK(cuMemFree_v2(b));
  printf("sync-order: the kernel was over when cuMemFree returned: %s\n",
         cuEventQuery(e) == CUDA_SUCCESS ? "yes" : "no");
  CUstream other;
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d;
  CHECK(cuMemAllocAsync(&d, PTDS_SIZE, other));
  int pending = cuEventQuery(e) == CUDA_ERROR_NOT_READY;
  printf("sync-order: another stream got the block under the kernel: %s\n",
         d == b && pending ? "yes" : "no");
  CHECK(cuMemFreeAsync(d, other));
  CHECK(cuCtxSynchronize());
  /* 3. cuMemFreeHost waits for the device too (measured on an H200: a copy from the block still
   *    running when it was freed), so a served block is not handed out again under a copy. */
  void *h;
  CUdeviceptr t;
  CHECK(cuMemAllocHost_v2(&h, 1 << 20));
  CHECK(cuMemAlloc_v2(&t, 1 << 20));
  CHECK(cuLaunchKernel(slow, 1, 1, 1, 32, 1, 1, 0, nb, NULL, NULL));
  CHECK(cuMemcpyHtoDAsync_v2(t, h, 1 << 20, nb));
  CHECK(cuEventRecord(e, nb));
  CHECK(cuMemFreeHost(h));
  printf("sync-order: the copy was over when cuMemFreeHost returned: %s\n",
         cuEventQuery(e) == CUDA_SUCCESS ? "yes" : "no");
  CHECK(cuCtxSynchronize());
  CHECK(cuMemFree_v2(t));
  printf("sync-order: done\n");
  return 0;
}

/* free-other-device (two devices): a block of device 0 freed in stream order on device 1's
 * legacy stream after a kernel there (a peer read), then asked for again on device 0's legacy
 * stream: the order promised is on device 1's stream, so it must not come back while that kernel
 * runs. */
static int free_other_device(void) {
  setenv("WLTEST_KERNEL_NS_wl_probe_slow", "300000000", 0);
  CUcontext c[2];
  if (!two_contexts("free-other-device", c)) return 0;
  CHECK(cuCtxSetCurrent(c[1]));
  CUmodule m;
  CUfunction slow;
  CHECK(cuModuleLoadData(&m, slow_ptx));
  CHECK(cuModuleGetFunction(&slow, m, "wl_probe_slow"));
  CUevent e;
  CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CHECK(cuCtxSetCurrent(c[0]));
  CUdeviceptr a, q;
  CHECK(cuMemAllocAsync(&a, PTDS_SIZE, CU_STREAM_LEGACY));
  CHECK(cuCtxSynchronize());
  CHECK(cuCtxSetCurrent(c[1]));
  CHECK(cuLaunchKernel(slow, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_LEGACY, NULL, NULL));
  CHECK(cuEventRecord(e, CU_STREAM_LEGACY));
  CHECK(cuMemFreeAsync(a, CU_STREAM_LEGACY));
  CHECK(cuCtxSetCurrent(c[0]));
  CHECK(cuMemAllocAsync(&q, PTDS_SIZE, CU_STREAM_LEGACY));
  CHECK(cuCtxSetCurrent(c[1]));
  int pending = cuEventQuery(e) == CUDA_ERROR_NOT_READY;
  printf("free-other-device: device 0 got the block under device 1's kernel: %s\n",
         q == a && pending ? "yes" : "no");
  CHECK(cuCtxSynchronize());
  CHECK(cuCtxSetCurrent(c[0]));
  CHECK(cuMemFreeAsync(q, CU_STREAM_LEGACY));
  CHECK(cuCtxSynchronize());
  printf("free-other-device: done\n");
  return 0;
}

/* What device `dev` may do with the memory at p: cuMemGetAccess's flags, -1 where it answers
 * nothing (memory that is no VMM mapping: the driver's own cuMemAlloc memory). */
static int access_for(CUdeviceptr p, int dev) {
  CUmemLocation l = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
  unsigned long long f = 0;
  return cuMemGetAccess(&f, &l, p) == CUDA_SUCCESS ? (int)f : -1;
}

/* peer (WLTEST_DEVICE_COUNT=2): device 1 given access to device 0's memory by
 * cuCtxEnablePeerAccess, device 0 to device 1's by cuMemPoolSetAccess on device 1's default
 * pool; memory allocated before and after each. Prints cuMemGetAccess's answers: -1 in plain
 * and trace modes (the driver's memory is no VMM mapping), 3 (read-write) in alloc and gate
 * modes once access was given (0 before): served memory is a VMM mapping, which peer access does
 * not reach by itself. */
static int peer(void) {
  CUcontext c[2];
  if (!two_contexts("peer", c)) return 0;
  CUdeviceptr a, b, x, y;
  CUstream s1;
  CHECK(cuCtxSetCurrent(c[0]));
  CHECK(cuMemAlloc_v2(&a, 4u << 20));
  CHECK(cuCtxSetCurrent(c[1]));
  printf("peer: device 1 on device 0's, before %d\n", access_for(a, 1));
  CHECK(cuCtxEnablePeerAccess(c[0], 0));
  printf("peer: device 1 on device 0's, after %d\n", access_for(a, 1));
  CHECK(cuCtxSetCurrent(c[0]));
  CHECK(cuMemAlloc_v2(&b, 64u << 20));
  printf("peer: device 1 on device 0's, allocated after %d\n", access_for(b + (60u << 20), 1));
  CHECK(cuCtxSetCurrent(c[1]));
  CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemAllocAsync(&x, 4u << 20, s1));
  CHECK(cuStreamSynchronize(s1));
  printf("peer: device 0 on device 1's, before %d\n", access_for(x, 0));
  CUmemoryPool p1;
  CHECK(cuDeviceGetDefaultMemPool(&p1, 1));
  CUmemAccessDesc d0 = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK(cuMemPoolSetAccess(p1, &d0, 1));
  printf("peer: device 0 on device 1's, after %d\n", access_for(x, 0));
  CHECK(cuMemAllocAsync(&y, 64u << 20, s1));
  CHECK(cuStreamSynchronize(s1));
  printf("peer: device 0 on device 1's, allocated after %d\n", access_for(y + (60u << 20), 0));
  CHECK(cuMemFreeAsync(x, s1));
  CHECK(cuMemFreeAsync(y, s1));
  CHECK(cuStreamSynchronize(s1));
  CHECK(cuCtxSetCurrent(c[0]));
  CHECK(cuMemFree_v2(a));
  CHECK(cuMemFree_v2(b));
  printf("peer: done\n");
  return 0;
}

/* last-error: the runtime's last error after calls that fail, as cudaGetLastError and
 * cudaPeekAtLastError answer it. A served call that fails must leave what the real call would
 * (an out-of-memory, an invalid free), and one that succeeds must not clear an earlier error.
 * Prints only the answers: the same with and without the preload, in every mode. */
static struct {
  __typeof__(&cudaGetLastError) get;
  __typeof__(&cudaPeekAtLastError) peek;
} le;

/* One call's answer, then what the runtime's last error says: peeked, read, read again. */
static void last_show(const char *what, cudaError_t e) {
  int peeked = (int)le.peek();
  int last = (int)le.get();
  int then = (int)le.get();
  printf("%-44s %d peek %d last %d then %d\n", what, (int)e, peeked, last, then);
}

static int last_error(void) {
  if (rt_load()) {
    printf("last-error: no runtime\n");
    return 1;
  }
  le.get = (__typeof__(le.get))dlsym(RTLD_DEFAULT, "cudaGetLastError");
  le.peek = (__typeof__(le.peek))dlsym(RTLD_DEFAULT, "cudaPeekAtLastError");
  __typeof__(&cudaMemGetInfo) info = (__typeof__(info))dlsym(RTLD_DEFAULT, "cudaMemGetInfo");
  __typeof__(&cudaMallocAsync) malloc_async =
      (__typeof__(malloc_async))dlsym(RTLD_DEFAULT, "cudaMallocAsync");
  __typeof__(&cudaFreeAsync) free_async =
      (__typeof__(free_async))dlsym(RTLD_DEFAULT, "cudaFreeAsync");
  __typeof__(&cudaStreamSynchronize) sync =
      (__typeof__(sync))dlsym(RTLD_DEFAULT, "cudaStreamSynchronize");
  if (!le.get || !le.peek || !info || !malloc_async || !free_async || !sync) return 1;
  size_t fr, tot;
  if (info(&fr, &tot)) return 1;
  le.get(); /* the runtime's start-up leaves nothing behind */
  /* Twice the device: the driver's out-of-memory, and the budget's (which is at most that). */
  const size_t huge = 2 * tot;
  void *p = NULL, *q = NULL;
  last_show("cudaMalloc, twice the device", rt.malloc(&p, huge));
  last_show("cudaMallocAsync, twice the device", malloc_async(&p, huge, NULL));
  /* An error stays until it is read: a call that succeeds in between does not clear it. */
  rt.malloc(&p, huge);
  cudaError_t e = rt.malloc(&q, 1 << 20);
  last_show("an error, then cudaMalloc that succeeds", e);
  if (e != cudaSuccess) return 1;
  last_show("cudaFree, interior pointer", rt.free((char *)q + 256));
  last_show("cudaFree", rt.free(q));
  last_show("cudaFree again", rt.free(q));
  e = malloc_async(&q, 1 << 20, NULL);
  last_show("cudaMallocAsync", e);
  if (e != cudaSuccess) return 1;
  last_show("cudaFreeAsync", free_async(q, NULL));
  if (sync(NULL)) return 1;
  last_show("cudaFreeAsync again", free_async(q, NULL));
  printf("last-error: done\n");
  return 0;
}

/* capture-free: a served block freed in stream order on a stream the allocator has never seen,
 * while that stream captures (RELAXED: a graph's free node). The allocator must learn of the
 * stream without querying it: a query of a capturing stream invalidates its capture ("it is
 * invalid to ... query the execution status of a stream which is being captured"). Prints the
 * capture's end: the same with and without the preload, in every mode. */
static int capture_free(void) {
  context();
  CUdeviceptr d;
  CHECK(cuMemAlloc_v2(&d, 1 << 20));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUresult r = cuMemFreeAsync(d, s);
  CUgraph g = NULL;
  CUresult e = cuStreamEndCapture(s, &g);
  printf("capture-free: free %s, capture ended %d\n", r == CUDA_SUCCESS ? "ok" : "refused", (int)e);
  if (g) CHECK(cuGraphDestroy(g));
  if (r != CUDA_SUCCESS) CHECK(cuMemFree_v2(d));
  CHECK(cuStreamDestroy_v2(s));
  printf("capture-free: done\n");
  return 0;
}

/* budget-ctx (run with WAVELET_MEM_LIMIT=1G in alloc and gate modes): allocations under a context
 * the program created pass through and are booked in the device's group. With 600 MiB served to
 * the primary context: 600 MiB more under the created context is refused, 300 MiB fits, 200 MiB
 * stream-ordered then does not, nor does it on the created context's stream with the primary
 * context current, where 100 MiB do, which then leave no room for 100 MiB more served; the
 * destroy gives the 300 MiB back, so the primary context's next 300 MiB fits. Every allocation
 * succeeds plain and in trace mode. */
static int budget_ctx(void) {
  context();
  CUdevice dev;
  CHECK(cuCtxGetDevice(&dev));
  CUdeviceptr base, big = 0, mid = 0, async = 0, after = 0;
  CHECK(cuMemAlloc_v2(&base, 600u << 20));
  CUcontext c;
  CUstream s;
  CHECK(cuCtxCreate(&c, NULL, 0, dev));
  CUresult r = cuMemAlloc_v2(&big, 600u << 20);
  printf("budget-ctx: created, 600 MiB more %d\n", (int)r);
  if (r == CUDA_SUCCESS) CHECK(cuMemFree_v2(big));
  printf("budget-ctx: created, 300 MiB %d\n", (int)cuMemAlloc_v2(&mid, 300u << 20));
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  r = cuMemAllocAsync(&async, 200u << 20, s);
  printf("budget-ctx: created, 200 MiB stream-ordered %d\n", (int)r);
  /* The created context's stream with the primary context current: still its memory. */
  CHECK(cuCtxSetCurrent(ctx));
  CUdeviceptr other = 0, small = 0, over = 0;
  CUresult ra = cuMemAllocAsync(&other, 200u << 20, s);
  printf("budget-ctx: primary current, 200 MiB on the created context's stream %d\n", (int)ra);
  if (ra == CUDA_SUCCESS) CHECK(cuMemFreeAsync(other, s));
  ra = cuMemAllocAsync(&small, 100u << 20, s);
  printf("budget-ctx: primary current, 100 MiB on it %d\n", (int)ra);
  CUresult ro = cuMemAlloc_v2(&over, 100u << 20);
  printf("budget-ctx: primary, 100 MiB more %d\n", (int)ro);
  if (ro == CUDA_SUCCESS) CHECK(cuMemFree_v2(over));
  if (ra == CUDA_SUCCESS) CHECK(cuMemFreeAsync(small, s));
  CHECK(cuStreamSynchronize(s));
  printf("budget-ctx: destroy %d\n", (int)cuCtxDestroy(c));
  CHECK(cuCtxSetCurrent(ctx));
  if (r == CUDA_SUCCESS) CHECK(cuMemFreeAsync(async, NULL)); /* it outlives the context */
  r = cuMemAlloc_v2(&after, 300u << 20);
  printf("budget-ctx: primary, 300 MiB after the destroy %d\n", (int)r);
  if (r == CUDA_SUCCESS) CHECK(cuMemFree_v2(after));
  CHECK(cuMemFree_v2(base));
  printf("budget-ctx: done\n");
  return 0;
}

/* vmm-budget (run with WAVELET_MEM_LIMIT=1G in alloc and gate modes): the program's own VMM
 * memory (cuMemCreate, as PyTorch's expandable segments and NCCL make it) under the budget, held
 * until the driver frees it. 600 MiB handles: a second one does not fit while the first lives;
 * the first released while mapped still holds its memory (a third does not fit) until unmapped;
 * NCCL's free (retain the handle of the mapped address, release it, unmap, release it again)
 * gives it back at the last release. In plain and trace modes every create succeeds. */
static int vmm_budget(void) {
  context();
  const size_t big = 600u << 20;
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  CUmemGenericAllocationHandle a, b, r;
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, big, 2 << 20, 0, 0));
  CHECK(cuMemCreate(&a, big, &prop, 0));
  CUresult rb = cuMemCreate(&b, big, &prop, 0);
  printf("vmm-budget: a second while the first lives %d\n", (int)rb);
  if (rb == CUDA_SUCCESS) CHECK(cuMemRelease(b));
  CHECK(cuMemMap(va, big, 0, a, 0));
  CHECK(cuMemRelease(a));
  rb = cuMemCreate(&b, big, &prop, 0);
  printf("vmm-budget: the first released but mapped %d\n", (int)rb);
  if (rb == CUDA_SUCCESS) CHECK(cuMemRelease(b));
  CHECK(cuMemUnmap(va, big));
  rb = cuMemCreate(&b, big, &prop, 0);
  printf("vmm-budget: the first unmapped %d\n", (int)rb);
  if (rb != CUDA_SUCCESS) return 1;
  /* NCCL's free (ncclCuMemFree): retain the handle of the address, release it, unmap, release
   * it again: the memory goes at the last release. */
  CHECK(cuMemMap(va, big, 0, b, 0));
  CHECK(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)va));
  printf("vmm-budget: retained the same %d\n", r == b);
  CHECK(cuMemRelease(r));
  rb = cuMemCreate(&a, big, &prop, 0);
  printf("vmm-budget: NCCL's free, released once %d\n", (int)rb);
  if (rb == CUDA_SUCCESS) CHECK(cuMemRelease(a));
  CHECK(cuMemUnmap(va, big));
  rb = cuMemCreate(&a, big, &prop, 0);
  printf("vmm-budget: NCCL's free, unmapped %d\n", (int)rb);
  if (rb == CUDA_SUCCESS) CHECK(cuMemRelease(a));
  CHECK(cuMemRelease(r));
  rb = cuMemCreate(&a, big, &prop, 0);
  printf("vmm-budget: NCCL's free, released again %d\n", (int)rb);
  if (rb == CUDA_SUCCESS) CHECK(cuMemRelease(a));
  CHECK(cuMemAddressFree(va, big));
  printf("vmm-budget: done\n");
  return 0;
}

/* vmm-walk (run with WAVELET_MEM_LIMIT=1G in alloc and gate modes): 24 handles of 40 MiB mapped
 * side by side, the middle one through a handle imported from its own export (the same memory,
 * another process's memory as far as the budget knows), every handle released, and the whole
 * range unmapped in one call (the driver takes any union of whole mappings). The memory is freed
 * then, so 1000 MiB fit. Before, the unmap's walk stopped at the mapping of the imported handle
 * (not recorded) and at 16 mappings: the rest stayed booked. */
static int vmm_walk(void) {
  context();
  enum { N = 24, MID = N / 2 };
  const size_t each = 40u << 20;
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  CUmemGenericAllocationHandle h[N], imp;
  CUdeviceptr va;
  int fd = -1;
  CHECK(cuMemAddressReserve(&va, N * each, 2 << 20, 0, 0));
  for (int i = 0; i < N; i++) CHECK(cuMemCreate(&h[i], each, &prop, 0));
  CHECK(cuMemExportToShareableHandle(&fd, h[MID], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CHECK(cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd,
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  for (int i = 0; i < N; i++) CHECK(cuMemMap(va + i * each, each, 0, i == MID ? imp : h[i], 0));
  CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK(cuMemSetAccess(va, N * each, &acc, 1));
  CHECK(cuMemsetD8_v2(va, 7, N * each));
  unsigned char b = 0;
  CHECK(cuMemcpyDtoH_v2(&b, va + MID * each + 5, 1));
  printf("vmm-walk: the imported mapping reads %u\n", b);
  for (int i = 0; i < N; i++) CHECK(cuMemRelease(h[i]));
  CHECK(cuMemRelease(imp));
  CHECK(cuMemUnmap(va, N * each));
  CUmemGenericAllocationHandle big;
  CUresult r = cuMemCreate(&big, 1000u << 20, &prop, 0);
  printf("vmm-walk: %d mappings unmapped at once, then 1000 MiB %d\n", N, (int)r);
  if (r == CUDA_SUCCESS) CHECK(cuMemRelease(big));
  CHECK(cuMemAddressFree(va, N * each));
  printf("vmm-walk: done\n");
  return 0;
}

/* pitch [wide] (run with WAVELET_MEM_LIMIT=1G in alloc and gate modes, on a device of 1200 MiB):
 * pitched memory is booked in the budget. A pitched allocation of ~586 MiB leaves no room for
 * 600 MiB more until it is freed; then, 600 MiB held, a pitched allocation of ~12 MiB fits. With
 * "wide" (the driver double padding rows to WLTEST_PITCH_ALIGN=65536) that allocation is ~500 MiB
 * though only 12 MiB were booked before the call: the rest does not fit, so it is given back
 * as out of memory, and 1000 MiB fit after the 600 are freed (nothing of it left, booked or in the
 * driver). Plain, every allocation succeeds. Before, pitched memory was never booked. */
static int pitch_probe(int argc, char **argv) {
  context();
  bool wide = argc > 2 && !strcmp(argv[2], "wide");
  CUdeviceptr p, d = 0;
  size_t pitch = 0;
  CUresult r;
  if (!wide) {
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1100, 400000, 4));
    r = cuMemAlloc_v2(&d, 600u << 20);
    printf("pitch: 600 MiB beside %zu MiB pitched %d\n", (pitch * 400000) >> 20, (int)r);
    if (r == CUDA_SUCCESS) CHECK(cuMemFree_v2(d));
    CHECK(cuMemFree_v2(p));
  }
  r = cuMemAlloc_v2(&d, 600u << 20);
  printf("pitch: 600 MiB alone %d\n", (int)r);
  if (r != CUDA_SUCCESS) return 1;
  r = cuMemAllocPitch_v2(&p, &pitch, 1100, 8000, 4);
  printf("pitch: rows of 1100 bytes beside them %d\n", (int)r);
  if (r == CUDA_SUCCESS) CHECK(cuMemFree_v2(p));
  CHECK(cuMemFree_v2(d));
  r = cuMemAlloc_v2(&d, 1000u << 20);
  printf("pitch: 1000 MiB after %d\n", (int)r);
  if (r == CUDA_SUCCESS) CHECK(cuMemFree_v2(d));
  printf("pitch: done\n");
  return 0;
}

/* pinned-release: pinned memory allocated and freed, the primary context released for good (its
 * page-locked memory goes with it), retained again, pinned memory allocated and written. In alloc
 * and gate modes the arena's chunk was pinned under that context: the arena retains it, or the
 * second block came from the freed chunk. */
static int pinned_release(void) {
  CUdevice dev;
  void *a, *b;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuMemHostAlloc(&a, 10000, 0));
  printf("pinned-release: first %llu\n", host_filled(a, 10000, 3));
  CHECK(cuMemFreeHost(a));
  CHECK(cuDevicePrimaryCtxRelease(dev));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuMemHostAlloc(&b, 10000, 0));
  printf("pinned-release: second %llu\n", host_filled(b, 10000, 4));
  CHECK(cuMemFreeHost(b));
  CHECK(cuDevicePrimaryCtxRelease(dev));
  printf("pinned-release: done\n");
  return 0;
}

/* budget-multi (WLTEST_DEVICE_COUNT=2; run with WAVELET_MEM_LIMIT=1G in alloc and gate modes):
 * each device's memory is booked in its own GPU's group. 600 MiB on each device fit a budget of
 * 1 GiB per GPU (with one budget for the process, device 1's was refused), 600 MiB more on
 * device 1 does not, and cuMemGetInfo answers each device's budget. */
static int budget_multi(void) {
  CUcontext c[2];
  if (!two_contexts("budget-multi", c)) return 0;
  CUdeviceptr d[2] = {0, 0}, more = 0;
  for (int i = 0; i < 2; i++) {
    CHECK(cuCtxSetCurrent(c[i]));
    printf("budget-multi: device %d alloc %d\n", i, (int)cuMemAlloc_v2(&d[i], 600u << 20));
  }
  for (int i = 0; i < 2; i++) {
    size_t f = 0, t = 0;
    CHECK(cuCtxSetCurrent(c[i]));
    CHECK(cuMemGetInfo_v2(&f, &t));
    printf("budget-multi: device %d total %zu MiB, free %zu MiB\n", i, t >> 20, f >> 20);
  }
  CUresult r = cuMemAlloc_v2(&more, 600u << 20);
  printf("budget-multi: device 1 more %d\n", (int)r);
  if (r == CUDA_SUCCESS) CHECK(cuMemFree_v2(more));
  for (int i = 0; i < 2; i++) {
    CHECK(cuCtxSetCurrent(c[i]));
    if (d[i]) CHECK(cuMemFree_v2(d[i]));
  }
  printf("budget-multi: done\n");
  return 0;
}

/* ctx (runs on a GPU too): contexts the program creates and destroys. Three rounds on device 0:
 * a context created (cuCtxCreate, CUDA 13's v4), in it a synchronous allocation, a small and a
 * large pinned block, a stream-ordered allocation on a stream of its own and a GLOBAL capture
 * left in progress on that stream; the context destroyed. The stream-ordered allocation survives
 * with its contents (cuCtxDestroy "will not destroy" those) and is freed from the primary
 * context; the rest goes with the context. After each round the primary context allocates
 * device and pinned memory and fills it, and after the last its synchronous allocations
 * succeed (the dead capture prohibits none). */
static int ctx_probe(void) {
  context();
  CUdevice dev;
  CHECK(cuCtxGetDevice(&dev));
  CUdeviceptr keep[3];
  void *pin_keep[3];
  for (int r = 0; r < 3; r++) {
    CUcontext c, cur = NULL;
    CHECK(cuCtxCreate(&c, NULL, 0, dev));
    CHECK(cuCtxGetCurrent(&cur));
    CUdeviceptr d, a;
    void *hs, *hb;
    CUstream s;
    CHECK(cuMemAlloc_v2(&d, 1u << 20));
    CHECK(cuMemAllocHost_v2(&hs, 10000));
    CHECK(cuMemHostAlloc(&hb, 40u << 20, 0));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAllocAsync(&a, 2u << 20, s));
    CHECK(cuMemsetD8Async(a, (unsigned char)(20 + r), 2u << 20, s));
    CHECK(cuStreamSynchronize(s));
    printf("ctx: round %d current %d filled %llu %llu %llu\n", r, cur == c,
           filled(d, 1u << 20, (unsigned char)(10 + r)),
           host_filled(hs, 10000, (unsigned char)(11 + r)),
           host_filled(hb, 40u << 20, (unsigned char)(12 + r)));
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    printf("ctx: round %d destroy %d\n", r, (int)cuCtxDestroy(c));
    CHECK(cuCtxGetCurrent(&cur));
    printf("ctx: round %d popped %d\n", r, cur == NULL || cur == ctx);
    CHECK(cuCtxSetCurrent(ctx));
    unsigned long long kept = sample(a, 2u << 20); /* before the free below */
    printf("ctx: round %d stream-ordered kept %llu, freed %d\n", r, kept,
           (int)cuMemFreeAsync(a, NULL));
    CHECK(cuMemAlloc_v2(&keep[r], 3u << 20));
    CHECK(cuMemHostAlloc(&pin_keep[r], 10000, 0));
    printf("ctx: round %d primary %llu %llu\n", r,
           filled(keep[r], 3u << 20, (unsigned char)(30 + r)),
           host_filled(pin_keep[r], 10000, (unsigned char)(40 + r)));
  }
  CUdeviceptr d[3];
  for (int i = 0; i < 3; i++) printf("ctx: alloc %d\n", (int)cuMemAlloc_v2(&d[i], 4096));
  for (int i = 0; i < 3; i++) printf("ctx: free %d\n", (int)cuMemFree_v2(d[i]));
  for (int r = 0; r < 3; r++) {
    unsigned long long dsum = sample(keep[r], 3u << 20),
                       hsum = host_filled(pin_keep[r], 10000, (unsigned char)(40 + r));
    printf("ctx: kept %llu %llu, freed %d %d\n", dsum, hsum, (int)cuMemFree_v2(keep[r]),
           (int)cuMemFreeHost(pin_keep[r]));
  }
  printf("ctx: done\n");
  return 0;
}

/* hold MIB (runs on a GPU too): allocates MIB MiB (-MIB: all the free memory but MIB MiB),
 * prints "hold: MIB MiB RESULT", waits for a line on stdin, frees, prints "hold: freed". On a
 * device shared by processes (a GPU, or the double's WLTEST_DEVICE_SHM), one run holds memory
 * that another's budget cannot see. */
static int hold(int argc, char **argv) {
  long long arg = argc > 2 ? strtoll(argv[2], NULL, 10) : 0;
  context();
  size_t mib = arg > 0 ? (size_t)arg : 0;
  if (arg < 0) {
    size_t fr = 0, tot = 0;
    CHECK(cuMemGetInfo_v2(&fr, &tot));
    mib = (fr >> 20) > (size_t)-arg ? (fr >> 20) - (size_t)-arg : 0;
  }
  CUdeviceptr d = 0;
  CUresult r = cuMemAlloc_v2(&d, mib << 20);
  printf("hold: %zu MiB %d\n", mib, (int)r);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) line[0] = 0;
  if (r == CUDA_SUCCESS) CHECK(cuMemFree_v2(d));
  printf("hold: freed\n");
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *what = argc > 1 ? argv[1] : "doors";
  if (!strcmp(what, "doors")) return doors();
  if (!strcmp(what, "malloc")) return malloc_check();
  if (!strcmp(what, "fork")) return fork_check();
  if (!strcmp(what, "meminfo")) return meminfo();
  if (!strcmp(what, "meminfo-only")) return meminfo_only();
  if (!strcmp(what, "killed")) return killed();
  if (!strcmp(what, "exit-race")) return exit_race(argc > 2 ? atoi(argv[2]) : 0);
  if (!strcmp(what, "odd")) return odd();
  if (!strcmp(what, "edge")) return edge();
  if (!strcmp(what, "signals")) return signals_check();
  if (!strcmp(what, "ptds")) return ptds();
  if (!strcmp(what, "capture")) return capture();
  if (!strcmp(what, "own-calls")) return own_calls();
  if (!strcmp(what, "ipc")) return ipc();
  if (!strcmp(what, "ipc-open")) return ipc_open(argc, argv);
  if (!strcmp(what, "ipc-many")) return ipc_many();
  if (!strcmp(what, "pinned-flags")) return pinned_flags();
  if (!strcmp(what, "reset")) return reset_probe();
  if (!strcmp(what, "reset-capture")) return reset_capture();
  if (!strcmp(what, "reset-multi")) return reset_multi();
  if (!strcmp(what, "reset-pinned")) return reset_pinned();
  if (!strcmp(what, "ctx")) return ctx_probe();
  if (!strcmp(what, "budget-multi")) return budget_multi();
  if (!strcmp(what, "pinned-release")) return pinned_release();
  if (!strcmp(what, "vmm-budget")) return vmm_budget();
  if (!strcmp(what, "vmm-walk")) return vmm_walk();
  if (!strcmp(what, "pitch")) return pitch_probe(argc, argv);
  if (!strcmp(what, "hold")) return hold(argc, argv);
  if (!strcmp(what, "pools")) return pools();
  if (!strcmp(what, "pool-budget")) return pool_budget();
  if (!strcmp(what, "pool-device")) return pool_device();
  if (!strcmp(what, "managed")) return managed();
  if (!strcmp(what, "peer")) return peer();
  if (!strcmp(what, "budget-ctx")) return budget_ctx();
  if (!strcmp(what, "sync-order")) return sync_order();
  if (!strcmp(what, "free-other-device")) return free_other_device();
  if (!strcmp(what, "last-error")) return last_error();
  if (!strcmp(what, "capture-free")) return capture_free();
  fprintf(
      stderr,
      "usage: wl-ip-probe doors|malloc|fork|meminfo|exit-race [forks]|odd|edge|signals|ptds|"
      "capture|own-calls|ipc|ipc-many|pinned-flags|reset|reset-capture|reset-multi|reset-pinned|"
      "ctx|budget-multi|pinned-release|vmm-budget|pools|peer|budget-ctx|sync-order|"
      "free-other-device|last-error|capture-free|killed|pool-budget|managed|meminfo-only|pool-"
      "device\n");
  return 2;
}
