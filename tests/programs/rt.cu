// wl-prog-rt: the runtime API as a trainer uses it: <<<>>> launches, a training-like memory wave
// per iteration with cudaMallocAsync/cudaFreeAsync, several threads and streams, cudaMalloc,
// pinned host memory, events, cudaMemGetInfo, a captured graph replayed, and the other doors (a
// pool's allocation, a cooperative launch, driver entry points fetched through the runtime).
// Deterministic: the last line is a checksum that is the same on a GPU and on the CUDA test
// doubles; the line before says what was allocated and launched, for an interposer's trace.
#define WL_PROGRAMS_DEFINE_KERNELS
#include "common.cuh"

#include <cuda.h> // the driver's types only: its entry points come from the runtime
#include <pthread.h>

const char *wl_prog = "wl-prog-rt";

enum { LAYERS = 4, WORDS_MAX = 4096 };

static unsigned g_iters = 3, g_scale = 1, g_threads = 2;

typedef struct worker_s {
  unsigned id;
  unsigned long long mallocs, malloc_bytes; // cudaMalloc: calls and bytes asked for
  unsigned long long asyncs, async_bytes;   // cudaMallocAsync
  unsigned long long hosts, host_bytes;     // cudaMallocHost
  unsigned long long sum;                   // the device accumulator, copied back
  uint64_t hash;
} worker_t;

// The words a kernel touches in an allocation: its first ones only, so that large activations
// stay cheap on the doubles (whose device memory is host memory).
static unsigned words(size_t bytes) {
  size_t n = bytes / sizeof(unsigned);
  return n < (size_t)WORDS_MAX ? (unsigned)n : (unsigned)WORDS_MAX;
}

static unsigned grid_for(unsigned n) {
  return (n + 255) / 256;
}

static void *worker(void *arg) {
  worker_t *w = (worker_t *)arg;
  cudaStream_t s[2];
  CK(cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking));
  CK(cudaStreamCreate(&s[1]));
  unsigned long long *acc;
  unsigned *weights, *host;
  CK(cudaMalloc((void **)&acc, sizeof *acc));
  CK(cudaMemset(acc, 0, sizeof *acc));
  CK(cudaMalloc((void **)&weights, WORDS_MAX * sizeof *weights));
  CK(cudaMallocHost((void **)&host, WORDS_MAX * sizeof *host));
  w->mallocs += 2, w->malloc_bytes += sizeof *acc + WORDS_MAX * sizeof *weights;
  w->hosts += 1, w->host_bytes += WORDS_MAX * sizeof *host;
  wl_fill<<<grid_for(WORDS_MAX), 256, 0, s[0]>>>(weights, WORDS_MAX, 7 + w->id);
  CK(cudaGetLastError());
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  w->hash = WL_FNV_INIT;
  for (unsigned it = 0; it < g_iters; it++) {
    cudaStream_t st = s[it % 2];
    CK(cudaEventRecord(start, st));
    // Forward: activations of varied sizes; each one only touches its first words.
    unsigned *act[LAYERS];
    size_t bytes[LAYERS];
    for (unsigned l = 0; l < LAYERS; l++) {
      bytes[l] = (size_t)g_scale * ((l + 1) * 96 * 1024 + w->id * 4096 + it * 512);
      CK(cudaMallocAsync((void **)&act[l], bytes[l], st));
      w->asyncs++, w->async_bytes += bytes[l];
      unsigned n = words(bytes[l]);
      wl_fill<<<grid_for(n), 256, 0, st>>>(act[l], n, it * 131 + l + 1);
      wl_mix<<<grid_for(n), 128, 0, st>>>(act[l], l ? act[l - 1] : weights, n, w->id);
      CK(cudaGetLastError());
    }
    // Backward: in reverse, a gradient per layer, freed with its activation.
    for (unsigned l = LAYERS; l-- > 0;) {
      unsigned n = words(bytes[l]);
      unsigned *grad;
      CK(cudaMallocAsync((void **)&grad, bytes[l], st));
      w->asyncs++, w->async_bytes += bytes[l];
      CK(cudaMemsetAsync(grad, 0, bytes[l], st));
      wl_mix<<<grid_for(n), 256, 0, st>>>(grad, act[l], n, l);
      wl_sum<<<grid_for(n), 256, 0, st>>>(grad, n, acc);
      CK(cudaGetLastError());
      CK(cudaFreeAsync(grad, st));
      CK(cudaFreeAsync(act[l], st));
    }
    wl_mix<<<grid_for(WORDS_MAX), 256, 0, st>>>(weights, weights, WORDS_MAX, it);
    CK(cudaEventRecord(stop, st));
    CK(cudaMemcpyAsync(host, weights, WORDS_MAX * sizeof *host, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    float ms = -1;
    CK(cudaEventElapsedTime(&ms, start, stop));
    if (!(ms >= 0)) {
      fprintf(stderr, "%s: error: elapsed time %f ms\n", wl_prog, ms);
      exit(1);
    }
    w->hash = wl_fnv(w->hash, host, WORDS_MAX * sizeof *host);
  }
  CK(cudaMemcpy(&w->sum, acc, sizeof w->sum, cudaMemcpyDeviceToHost));
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  CK(cudaFreeHost(host));
  CK(cudaFree(weights));
  CK(cudaFree(acc));
  CK(cudaStreamDestroy(s[0]));
  CK(cudaStreamDestroy(s[1]));
  return NULL;
}

// A graph of three launches, captured once and replayed: the replays must act like launches.
static uint64_t graph_part(void) {
  enum { N = 1024 };
  cudaStream_t s;
  unsigned *a, *b;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc((void **)&a, N * sizeof *a));
  CK(cudaMalloc((void **)&b, N * sizeof *b));
  CK(cudaMemset(a, 0, N * sizeof *a));
  wl_fill<<<4, 256, 0, s>>>(b, N, 3);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enum cudaStreamCaptureStatus cs;
  CK(cudaStreamIsCapturing(s, &cs));
  if (cs != cudaStreamCaptureStatusActive) {
    fprintf(stderr, "%s: error: the stream is not capturing\n", wl_prog);
    exit(1);
  }
  wl_mix<<<4, 256, 0, s>>>(a, b, N, 1);
  // PyTorch's caching allocator in a capture: cudaMalloc in RELAXED mode (this THREAD_LOCAL
  // capture prohibits it otherwise), and the thread's mode put back.
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CK(cudaThreadExchangeStreamCaptureMode(&mode));
  unsigned *c;
  CK(cudaMalloc((void **)&c, N * sizeof *c));
  CK(cudaThreadExchangeStreamCaptureMode(&mode));
  if (mode != cudaStreamCaptureModeRelaxed) {
    fprintf(stderr, "%s: error: the capture mode came back as %d\n", wl_prog, (int)mode);
    exit(1);
  }
  wl_mix<<<4, 256, 0, s>>>(b, a, N, 2);
  cudaGraph_t g;
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t x;
  CK(cudaGraphInstantiate(&x, g, 0));
  for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(x, s));
  // The explicit launch APIs too.
  unsigned n = N, k = 5;
  void *args[] = {&a, &b, &n, &k};
  CK(cudaLaunchKernel((const void *)wl_mix, dim3(4), dim3(256), args, 0, s));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(2);
  cfg.blockDim = dim3(128);
  cfg.stream = s;
  CK(cudaLaunchKernelExC(&cfg, (const void *)wl_mix, args));
  unsigned host[N];
  CK(cudaMemcpyAsync(host, a, sizeof host, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaGraphExecDestroy(x));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(c));
  CK(cudaStreamDestroy(s));
  return wl_fnv(WL_FNV_INIT, host, sizeof host);
}

// The kernels a worker launches: its weights' fill, then per iteration two per layer forward,
// two per layer backward and one update.
static unsigned worker_launches(void) {
  return 1 + g_iters * (4 * LAYERS + 1);
}

// The graph part's launches: a fill, two captured, three replays, cudaLaunchKernel, ExC.
enum { GRAPH_LAUNCHES = 8 };

typedef CUresult (*drv_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*drv_free_fn)(CUdeviceptr);

// The other doors: 4 KiB from the device's default pool (cudaMallocFromPoolAsync), a cooperative
// launch, and 4 KiB through cuMemAlloc and cuMemFree as cudaGetDriverEntryPointByVersion gives
// them. Adds to the counts; its results stay out of the checksum.
static void doors_part(worker_t *tally, unsigned *launches) {
  enum { N = 1024 };
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  unsigned *a, *b;
  CK(cudaMallocFromPoolAsync((void **)&a, N * sizeof *a, pool, s));
  tally->asyncs++, tally->async_bytes += N * sizeof *a;
  void *fa = NULL, *ff = NULL;
  enum cudaDriverEntryPointQueryResult qa, qf;
  CK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fa, 12000, cudaEnableDefault, &qa));
  CK(cudaGetDriverEntryPointByVersion("cuMemFree", &ff, 12000, cudaEnableDefault, &qf));
  if (!fa || !ff || qa != cudaDriverEntryPointSuccess || qf != cudaDriverEntryPointSuccess) {
    fprintf(stderr, "%s: error: cudaGetDriverEntryPointByVersion found no cuMemAlloc/cuMemFree\n",
            wl_prog);
    exit(1);
  }
  CUdeviceptr d = 0;
  if (((drv_alloc_fn)fa)(&d, N * sizeof *b) != CUDA_SUCCESS) {
    fprintf(stderr, "%s: error: cuMemAlloc through the runtime's entry point failed\n", wl_prog);
    exit(1);
  }
  b = (unsigned *)(uintptr_t)d;
  tally->mallocs++, tally->malloc_bytes += N * sizeof *b;
  wl_fill<<<4, 256, 0, s>>>(b, N, 11);
  unsigned n = N, k = 3;
  void *args[] = {&a, &b, &n, &k};
  CK(cudaLaunchCooperativeKernel((const void *)wl_mix, dim3(4), dim3(256), args, 0, s));
  *launches += 2;
  CK(cudaStreamSynchronize(s));
  CK(cudaFreeAsync(a, s));
  CK(cudaStreamSynchronize(s));
  if (((drv_free_fn)ff)(d) != CUDA_SUCCESS) {
    fprintf(stderr, "%s: error: cuMemFree through the runtime's entry point failed\n", wl_prog);
    exit(1);
  }
  CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv) {
  if (argc > 4) {
    fprintf(stderr, "usage: %s [iterations [sizes-scale [threads]]]\n", wl_prog);
    return 2;
  }
  if (argc > 1) g_iters = (unsigned)wl_arg_size("iterations", argv[1]);
  if (argc > 2) g_scale = (unsigned)wl_arg_size("sizes scale", argv[2]);
  if (argc > 3) g_threads = (unsigned)wl_arg_size("threads", argv[3]);
  if (g_threads > 64 || g_scale > 4096) {
    fprintf(stderr, "%s: at most 64 threads and a sizes scale of 4096\n", wl_prog);
    return 2;
  }
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  CK(cudaSetDevice(0));
  size_t free0, total;
  CK(cudaMemGetInfo(&free0, &total));
  if (free0 > total) {
    fprintf(stderr, "%s: error: cudaMemGetInfo says free %zu > total %zu\n", wl_prog, free0, total);
    return 1;
  }
  printf("%s: iterations %u scale %u threads %u\n", wl_prog, g_iters, g_scale, g_threads);
  worker_t *w = (worker_t *)calloc(g_threads, sizeof *w);
  pthread_t *t = (pthread_t *)calloc(g_threads, sizeof *t);
  for (unsigned i = 0; i < g_threads; i++) {
    w[i].id = i;
    if (pthread_create(&t[i], NULL, worker, &w[i]) != 0) {
      fprintf(stderr, "%s: error: cannot start thread %u\n", wl_prog, i);
      return 1;
    }
  }
  uint64_t h = WL_FNV_INIT;
  for (unsigned i = 0; i < g_threads; i++) {
    pthread_join(t[i], NULL);
    printf("%s: thread %u sum %016llx weights %016llx\n", wl_prog, i, w[i].sum,
           (unsigned long long)w[i].hash);
    h = wl_fnv(h, &w[i].sum, sizeof w[i].sum);
    h = wl_fnv(h, &w[i].hash, sizeof w[i].hash);
  }
  uint64_t gh = graph_part();
  printf("%s: graph %016llx\n", wl_prog, (unsigned long long)gh);
  worker_t doors = {};
  unsigned launches = g_threads * worker_launches() + GRAPH_LAUNCHES;
  doors_part(&doors, &launches);
  // What was asked for and launched, for checking an interposer's trace: the graph part adds
  // three cudaMalloc of 4 KiB; device allocations through the driver's entry points count as
  // cudaMalloc, from a pool as cudaMallocAsync.
  unsigned long long m = 3 + doors.mallocs, mb = 3 * 1024 * sizeof(unsigned) + doors.malloc_bytes,
                     a = doors.asyncs, ab = doors.async_bytes, hc = 0, hb = 0;
  for (unsigned i = 0; i < g_threads; i++) {
    m += w[i].mallocs, mb += w[i].malloc_bytes, a += w[i].asyncs, ab += w[i].async_bytes;
    hc += w[i].hosts, hb += w[i].host_bytes;
  }
  printf("%s: cudaMalloc %llu bytes %llu cudaMallocAsync %llu bytes %llu cudaMallocHost %llu "
         "bytes %llu launches %u\n",
         wl_prog, m, mb, a, ab, hc, hb, launches);
  h = wl_fnv(h, &gh, sizeof gh);
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  printf("%s: checksum %016llx\n", wl_prog, (unsigned long long)h);
  free(w);
  free(t);
  return 0;
}
