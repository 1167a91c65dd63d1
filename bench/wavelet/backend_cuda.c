/* The CUDA backend: tensors from cudaMallocAsync (each drawn from the meter first, so the budget
 * sees the wave), kernels from libwlkernels_cuda on a stream of the backend's own. Built only
 * with the CUDA toolkit; never run without a GPU. */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <wavelet/kernels.h>

#include "util.h"

/* Live allocations' sizes, for giving them back to the meter at free: open addressing. */
typedef struct slot_s {
  void *p;
  size_t bytes;
} slot_t;

typedef struct cu_s {
  cudaStream_t stream;
  slot_t *tab;
  size_t cap, used;
  float *d_loss;
  uint32_t *d_count;
} cu_t;

static size_t h_idx(const cu_t *c, const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
  return (size_t)(x >> 20) & (c->cap - 1);
}

static int tab_put(cu_t *c, void *p, size_t bytes) {
  if ((c->used + 1) * 2 > c->cap) {
    size_t ncap = c->cap ? c->cap * 2 : 1024;
    slot_t *nt = calloc(ncap, sizeof *nt), *old = c->tab;
    if (!nt) return -ENOMEM;
    size_t ocap = c->cap;
    c->tab = nt;
    c->cap = ncap;
    c->used = 0;
    for (size_t i = 0; i < ocap; i++)
      if (old[i].p) tab_put(c, old[i].p, old[i].bytes);
    free(old);
  }
  size_t i = h_idx(c, p);
  while (c->tab[i].p) i = (i + 1) & (c->cap - 1);
  c->tab[i].p = p;
  c->tab[i].bytes = bytes;
  c->used++;
  return 0;
}

/* Removes p (backward-shift deletion); returns its size, 0 when unknown. */
static size_t tab_take(cu_t *c, void *p) {
  if (!c->cap) return 0;
  size_t i = h_idx(c, p);
  while (c->tab[i].p && c->tab[i].p != p) i = (i + 1) & (c->cap - 1);
  if (!c->tab[i].p) return 0;
  size_t bytes = c->tab[i].bytes;
  c->tab[i].p = NULL;
  c->used--;
  for (size_t j = (i + 1) & (c->cap - 1); c->tab[j].p; j = (j + 1) & (c->cap - 1)) {
    slot_t s = c->tab[j];
    c->tab[j].p = NULL;
    c->used--;
    tab_put(c, s.p, s.bytes);
  }
  return bytes;
}

static void *cu_alloc(wb_backend_t *b, size_t bytes) {
  cu_t *c = b->ctx;
  size_t sz = wl__align_up(bytes ? bytes : 1, 256);
  wb_meter_t *m = b->meter;
  int rc = wb_meter_acquire(m, sz, 0);
  if (rc && m->timeout_ms)
    rc = wb_meter_acquire(m, sz, wl__now_ns() + (uint64_t)m->timeout_ms * 1000000ull);
  if (rc) {
    char r[32], l[32], h[32];
    snprintf(b->why, sizeof b->why, "cannot allocate %s: budget refused (held %s, limit %s)",
             wl_format_bytes(sz, r, sizeof r), wl_format_bytes(m->held, h, sizeof h),
             wl_format_bytes(wb_meter_limit(m), l, sizeof l));
    return NULL;
  }
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, sz, c->stream);
  if (e != cudaSuccess || tab_put(c, p, sz)) {
    if (p) cudaFreeAsync(p, c->stream);
    wb_meter_refund(m, sz); /* never held: the peaks go back to what they were */
    char r[32], h[32];
    if (e == cudaErrorMemoryAllocation)
      /* Under the preload this is the interposer's budget refusing (it printed its own line). */
      snprintf(b->why, sizeof b->why,
               "cannot allocate %s (%zu bytes): cudaMallocAsync: out of memory (the budget or "
               "the device is full; held %s)",
               wl_format_bytes(sz, r, sizeof r), sz, wl_format_bytes(m->held, h, sizeof h));
    else
      snprintf(b->why, sizeof b->why, "cannot allocate %zu bytes: cudaMallocAsync: %s", sz,
               cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void cu_free(wb_backend_t *b, void *p) {
  cu_t *c = b->ctx;
  if (!p) return;
  size_t sz = tab_take(c, p);
  cudaFreeAsync(p, c->stream);
  if (sz) wb_meter_release(b->meter, sz);
}

/* The pool's release threshold is 0, so freed memory goes back to the device at each
 * synchronisation; trimming is a synchronisation. */
static void cu_trim(wb_backend_t *b, size_t keep) {
  cu_t *c = b->ctx;
  (void)keep;
  cudaStreamSynchronize(c->stream);
}

static int cu_upload(wb_backend_t *b, void *dst, const void *src, size_t bytes) {
  cu_t *c = b->ctx;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream) == cudaSuccess ? 0
                                                                                            : -EIO;
}

static int cu_download(wb_backend_t *b, void *dst, const void *src, size_t bytes) {
  cu_t *c = b->ctx;
  if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream) != cudaSuccess)
    return -EIO;
  return cudaStreamSynchronize(c->stream) == cudaSuccess ? 0 : -EIO;
}

static int cu_xent(wb_backend_t *b, size_t n, size_t cl, float *logits, const int32_t *labels,
                   float *loss) {
  cu_t *c = b->ctx;
  int rc = wl_cuda_softmax_xent_fwd(n, cl, logits, labels, logits, c->d_loss, c->stream);
  if (rc) return rc;
  return cu_download(b, loss, c->d_loss, sizeof *loss);
}

static int cu_count(wb_backend_t *b, size_t n, size_t cl, const float *scores,
                    const int32_t *labels, size_t *correct) {
  cu_t *c = b->ctx;
  if (cudaMemsetAsync(c->d_count, 0, sizeof *c->d_count, c->stream) != cudaSuccess) return -EIO;
  int rc = wl_cuda_count_correct(n, cl, scores, labels, c->d_count, c->stream);
  if (rc) return rc;
  uint32_t k = 0;
  rc = cu_download(b, &k, c->d_count, sizeof k);
  *correct += k;
  return rc;
}

static int cu_finish(wb_backend_t *b) {
  cu_t *c = b->ctx;
  return cudaStreamSynchronize(c->stream) == cudaSuccess ? 0 : -EIO;
}

static void cu_destroy(wb_backend_t *b) {
  if (!b) return;
  cu_t *c = b->ctx;
  if (c) {
    if (c->stream) cudaStreamSynchronize(c->stream);
    cudaFree(c->d_loss);
    cudaFree(c->d_count);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->tab);
    free(c);
  }
  free(b);
}

int wb_backend_cuda_create(wb_backend_t **out, wb_meter_t *meter, int device, char *why,
                           size_t len) {
  *out = NULL;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1) {
    snprintf(why, len, "no usable CUDA device (cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return -ENODEV;
  }
  /* Data-parallel ranks: one GPU each (rank % devices); the stream and pool are that GPU's. */
  device %= n;
  if ((e = cudaSetDevice(device)) != cudaSuccess) {
    snprintf(why, len, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    return -ENODEV;
  }
  wb_backend_t *b = calloc(1, sizeof *b);
  cu_t *c = calloc(1, sizeof *c);
  if (!b || !c) {
    free(b);
    free(c);
    return -ENOMEM;
  }
  b->kind = WB_BACKEND_CUDA;
  b->name = "cuda";
  b->ctx = c;
  b->meter = meter;
  b->alloc = cu_alloc;
  b->free = cu_free;
  b->trim = cu_trim;
  b->upload = cu_upload;
  b->download = cu_download;
  b->xent_fwd = cu_xent;
  b->count = cu_count;
  b->finish = cu_finish;
  b->destroy = cu_destroy;
  cudaMemPool_t pool;
  uint64_t zero = 0;
  if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaDeviceGetDefaultMemPool(&pool, device)) != cudaSuccess ||
      (e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero)) != cudaSuccess ||
      (e = cudaMalloc((void **)&c->d_loss, sizeof *c->d_loss)) != cudaSuccess ||
      (e = cudaMalloc((void **)&c->d_count, sizeof *c->d_count)) != cudaSuccess) {
    snprintf(why, len, "CUDA setup failed: %s", cudaGetErrorString(e));
    cu_destroy(b);
    return -EIO;
  }
  b->stream = c->stream;
  *out = b;
  return 0;
}

int wb_have_cuda(void) {
  return 1;
}

int wb_cuda_probe(void) {
  pid_t pid = fork();
  if (pid < 0) return -ENODEV;
  if (pid == 0) _exit(wl_cuda_available() == 0 ? 0 : 1);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -ENODEV;
}

#else /* !WB_HAVE_CUDA */

int wb_backend_cuda_create(wb_backend_t **out, wb_meter_t *meter, int device, char *why,
                           size_t len) {
  (void)meter, (void)device;
  *out = NULL;
  snprintf(why, len, "this build has no CUDA backend (configured without the CUDA toolkit)");
  return -ENOSYS;
}

int wb_have_cuda(void) {
  return 0;
}

int wb_cuda_probe(void) {
  return -ENOSYS;
}

#endif
