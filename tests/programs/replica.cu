// wl-prog-replica: a training replica for co-location tests. Each iteration: forward (allocate
// activations with cudaMallocAsync, one kernel each), the peak, backward (a kernel per layer,
// activations freed in reverse), then a synchronisation. Kernel durations come from the GPU, or
// on the CUDA test doubles from WLTEST_KERNEL_NS_wl_fwd / WLTEST_KERNEL_NS_wl_bwd.
#define WL_PROGRAMS_DEFINE_KERNELS
#include "common.cuh"

#include <wavelet/wavelet.h> /* the trainer markers: weak, no-ops without libwavelet.so */

#include <pthread.h>
#include <time.h>
#include <unistd.h>

const char *wl_prog = "wl-prog-replica";

enum { WORDS_MAX = 1024 };

// The forward and backward kernels: named apart so that their durations can differ.
extern "C" __global__ void wl_fwd(unsigned *y, const unsigned *x, unsigned n, unsigned k) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = (x ? x[i] : 0u) * 33u + k + i;
}
extern "C" __global__ void wl_bwd(unsigned *g, const unsigned *y, unsigned n, unsigned k) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    g[i] = g[i] * 7u + (y[i] ^ k);
}
// Stands for a kernel of NCCL linked into the program statically (as in libtorch_cuda.so): no
// NCCL entry point is called, so only the kernel's name tells an interposer what it is. C++
// linkage on purpose: the name it is known by is mangled, as NCCL's are.
__global__ void ncclDevKernel_AllReduce_Sum_u32_RING_LL(unsigned *g, unsigned n) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && n) g[0] += 0u;
}
extern "C" void wltest_host_wl_fwd(const wltest_launch_t *l) {
  unsigned *y = *(unsigned **)l->args[0];
  const unsigned *x = *(const unsigned **)l->args[1];
  unsigned n = *(unsigned *)l->args[2], k = *(unsigned *)l->args[3];
  for (unsigned i = 0; i < n; i++) y[i] = (x ? x[i] : 0u) * 33u + k + i;
}
extern "C" void wltest_host_wl_bwd(const wltest_launch_t *l) {
  unsigned *g = *(unsigned **)l->args[0];
  const unsigned *y = *(const unsigned **)l->args[1];
  unsigned n = *(unsigned *)l->args[2], k = *(unsigned *)l->args[3];
  for (unsigned i = 0; i < n; i++) g[i] = g[i] * 7u + (y[i] ^ k);
}

// --graph: the collective captured into a graph at start-up, on another thread (so that the
// main thread's first launch is the graph's, where a gate decides, as with the plain launch).
struct capture_arg {
  cudaStream_t s;
  unsigned *grad;
  unsigned n;
  cudaGraphExec_t exec;
};
static void *capture_collective(void *p) {
  capture_arg *a = (capture_arg *)p;
  cudaGraph_t g;
  CK(cudaSetDevice(0));
  CK(cudaStreamBeginCapture(a->s, cudaStreamCaptureModeGlobal));
  ncclDevKernel_AllReduce_Sum_u32_RING_LL<<<1, 32, 0, a->s>>>(a->grad, a->n);
  CK(cudaGetLastError());
  CK(cudaStreamEndCapture(a->s, &g));
  CK(cudaGraphInstantiate(&a->exec, g, 0));
  CK(cudaGraphDestroy(g));
  return NULL;
}

static void usage(void) {
  fprintf(stderr,
          "usage: %s [--iters N] [--peak BYTES] [--kernels K] [--hold-ms MS] [--wait-file PATH]"
          " [--quiet] [--markers] [--collective [--graph]]\n"
          "  --iters N     iterations (default 5)\n"
          "  --peak BYTES  activation bytes held at the peak, K/M/G allowed (default 64M)\n"
          "  --kernels K   forward kernels per iteration, one activation each (default 8)\n"
          "  --hold-ms MS  at the peak, wait for the forward kernels, then hold the peak MS ms\n"
          "  --wait-file PATH  at each peak, hold it until PATH exists\n"
          "  --quiet       no per-iteration lines\n"
          "  --markers     call the trainer markers of wavelet/wavelet.h (iteration begin, the\n"
          "                peak, iteration end), as a trainer that knows its phases would\n"
          "  --collective  launch a kernel named as NCCL's all-reduce at each iteration's\n"
          "                beginning (NCCL linked in statically)\n"
          "  --graph       launch that kernel as a CUDA graph, captured at start-up\n",
          wl_prog);
  exit(2);
}

// cudaErrorMemoryAllocation: one clear line, exit status 3.
static void check_alloc(cudaError_t e, unsigned it, unsigned layer, size_t bytes) {
  if (e == cudaErrorMemoryAllocation) {
    printf("%s: out of memory: iteration %u layer %u (%zu bytes): cudaErrorMemoryAllocation\n",
           wl_prog, it, layer, bytes);
    fflush(stdout);
    exit(3);
  }
  CK(e);
}

int main(int argc, char **argv) {
  unsigned iters = 5, kernels = 8;
  unsigned long long peak = 64ull << 20;
  bool quiet = false, markers = false, collective = false, graph = false;
  unsigned long long hold_ms = 0;
  const char *wait_file = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = (unsigned)wl_arg_size("--iters", argv[++i]);
    else if (!strcmp(argv[i], "--peak") && i + 1 < argc)
      peak = wl_arg_size("--peak", argv[++i]);
    else if (!strcmp(argv[i], "--kernels") && i + 1 < argc)
      kernels = (unsigned)wl_arg_size("--kernels", argv[++i]);
    else if (!strcmp(argv[i], "--hold-ms") && i + 1 < argc)
      hold_ms = wl_arg_size("--hold-ms", argv[++i]);
    else if (!strcmp(argv[i], "--wait-file") && i + 1 < argc)
      wait_file = argv[++i];
    else if (!strcmp(argv[i], "--quiet"))
      quiet = true;
    else if (!strcmp(argv[i], "--markers"))
      markers = true;
    else if (!strcmp(argv[i], "--collective"))
      collective = true;
    else if (!strcmp(argv[i], "--graph"))
      graph = true;
    else
      usage();
  }
  if (graph && !collective) usage();
  if (kernels > 4096) {
    fprintf(stderr, "%s: --kernels %u: at most 4096\n", wl_prog, kernels);
    return 2;
  }
  // Equal activations summing to the peak (rounded up to 512 bytes each).
  size_t each = (size_t)((peak + kernels - 1) / kernels);
  each = (each + 511) / 512 * 512;
  size_t words = each / sizeof(unsigned);
  unsigned n = words < (size_t)WORDS_MAX ? (unsigned)words : (unsigned)WORDS_MAX;
  printf("%s: iters %u peak %llu kernels %u activation %zu\n", wl_prog, iters, peak, kernels, each);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned *grad;
  CK(cudaMalloc((void **)&grad, WORDS_MAX * sizeof *grad));
  CK(cudaMemset(grad, 0, WORDS_MAX * sizeof *grad));
  unsigned **act = (unsigned **)calloc(kernels, sizeof *act);
  unsigned *host = (unsigned *)calloc(WORDS_MAX, sizeof *host);
  capture_arg cap = {s, grad, n, NULL};
  if (graph) {
    pthread_t t;
    if (pthread_create(&t, NULL, capture_collective, &cap) != 0 || pthread_join(t, NULL) != 0) {
      fprintf(stderr, "%s: cannot start the capturing thread\n", wl_prog);
      return 1;
    }
  }
  uint64_t h = WL_FNV_INIT;
  for (unsigned it = 0; it < iters; it++) {
    if (markers) wl_mark_iteration_begin();
    if (collective) {
      // The step before's gradient all-reduce, launched as the iteration begins (as overlapping
      // DDP schedules it): it must go through at once even while another replica rises.
      if (graph) {
        CK(cudaGraphLaunch(cap.exec, s));
      } else {
        ncclDevKernel_AllReduce_Sum_u32_RING_LL<<<1, 32, 0, s>>>(grad, n);
        CK(cudaGetLastError());
      }
      if (it == 0) {
        printf("%s: collective-launch done\n", wl_prog);
        fflush(stdout);
      }
    }
    for (unsigned l = 0; l < kernels; l++) {
      check_alloc(cudaMallocAsync((void **)&act[l], each, s), it, l, each);
      wl_fwd<<<(n + 255) / 256, 256, 0, s>>>(act[l], l ? act[l - 1] : NULL, n, it * 1000 + l);
      CK(cudaGetLastError());
    }
    if (!quiet) printf("%s: iter %u peak %zu\n", wl_prog, it, each * kernels);
    if (hold_ms) {
      // Co-location tests: the peak stays allocated for a known time.
      CK(cudaStreamSynchronize(s));
      fflush(stdout);
      struct timespec ts = {(time_t)(hold_ms / 1000), (long)(hold_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    // Co-location tests without timing: the peak stays allocated until the test says so.
    fflush(stdout);
    while (wait_file && access(wait_file, F_OK) != 0) {
      struct timespec ts = {0, 10 * 1000000L};
      nanosleep(&ts, NULL);
    }
    if (markers) wl_mark_backward_begin();
    for (unsigned l = kernels; l-- > 0;) {
      wl_bwd<<<(n + 255) / 256, 256, 0, s>>>(grad, act[l], n, l);
      CK(cudaGetLastError());
      CK(cudaFreeAsync(act[l], s));
    }
    CK(cudaMemcpyAsync(host, grad, WORDS_MAX * sizeof *host, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    uint64_t ih = wl_fnv(WL_FNV_INIT, host, WORDS_MAX * sizeof *host);
    h = wl_fnv(h, &ih, sizeof ih);
    if (!quiet) printf("%s: iter %u done %016llx\n", wl_prog, it, (unsigned long long)ih);
    if (markers) wl_mark_iteration_end();
    fflush(stdout);
  }
  if (graph) CK(cudaGraphExecDestroy(cap.exec));
  CK(cudaFree(grad));
  CK(cudaStreamDestroy(s));
  free(act);
  free(host);
  // What was asked for, for checking an interposer's accounting.
  printf("%s: cudaMalloc 1 bytes %zu cudaMallocAsync %llu bytes %llu\n", wl_prog,
         WORDS_MAX * sizeof *grad, (unsigned long long)iters * kernels,
         (unsigned long long)iters * kernels * each);
  printf("%s: checksum %016llx\n", wl_prog, (unsigned long long)h);
  return 0;
}
