/* For tests only: wl-ip-fuzz SEED STEPS [THREADS]. A seeded random sequence of the driver and
 * runtime calls a trainer and its libraries make (synchronous, pitched, stream-ordered and pool
 * allocations on several streams, frees on other streams, copies, pinned memory, the program's own
 * VMM memory, launches, events, stream captures and the calls they refuse, contexts it creates and
 * destroys, device resets, and calls that must fail), each allocation filled with a byte of its own
 * and read back. With two devices (WLTEST_DEVICE_COUNT=2) it switches between their primary
 * contexts, each allocation freed and its streams used on its own device (synchronous frees from
 * either). With THREADS, each thread runs a sequence of its own (no resets and relaxed captures
 * only: those reach the other threads). It prints a transcript that names no address or size the
 * driver chose: one line per step with the call's answer, and each read-back's verdict. The
 * transcript must be the same without libwavelet.so and under it in every mode (test_interpose):
 * the interposer may serve the memory, never change what the program sees. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXA     96
#define MAXH     16
#define MAXV     8
#define NSTREAMS 5 /* 0: the legacy stream, 1: the per-thread one, 2-4: created (NULL until) */

enum { K_SYNC, K_ASYNC, K_PITCH, K_POOL };
static const char *const kind_name[] = {"sync", "async", "pitch", "pool"};

#define MAXD 2 /* devices used: the first two */

typedef struct alloc_s {
  CUdeviceptr p;
  size_t size;
  int kind, stream, dev; /* stream: an index into its device's streams */
  unsigned char fill;
} alloc_t;

typedef struct vmm_s {
  CUdeviceptr va;
  CUmemGenericAllocationHandle h;
  size_t size;
  unsigned char fill;
} vmm_t;

typedef struct host_s {
  unsigned char *p;
  size_t size;
  int dev; /* the device current when it was pinned: its reset unpins it */
  unsigned char fill;
} host_t;

/* Each thread's own: its generator, memory, streams and transcript. */
static __thread uint64_t rng;
static __thread alloc_t as[MAXA];
static __thread int na;
static __thread host_t hs[MAXH];
static __thread int nh;
static __thread vmm_t vs[MAXV];
static __thread int nv;
static __thread CUstream sts[MAXD][NSTREAMS];
static __thread int cur; /* the device whose primary context is current */
static __thread size_t live_bytes;
static __thread unsigned step;
static __thread FILE *out;
/* Shared: each device's primary context, kernel and default pool (set before the threads start;
 * reloaded by a reset, which runs with one thread only). */
static int ndev;
static CUcontext prims[MAXD];
static CUfunction kfns[MAXD];
static CUmemoryPool pools[MAXD];
#define st      sts[cur]
#define primary prims[cur]
#define DEV     ((CUdevice)cur)
#define kfn     kfns[cur]
#define pool    pools[cur]
static bool threaded; /* several threads: no resets, relaxed captures only */

#define OUT(...)                                                                                   \
  do {                                                                                             \
    fprintf(out, "%u ", step);                                                                     \
    fprintf(out, __VA_ARGS__);                                                                     \
    fprintf(out, "\n");                                                                            \
  } while (0)

/* Setup calls that cannot fail in a sane run: a failure ends the run (the transcript says so). */
#define MUST(call)                                                                                 \
  do {                                                                                             \
    CUresult r_ = (call);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      fflush(out);                                                                                 \
      printf("%u FAIL %s = %d\n", step, #call, (int)r_);                                           \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static uint32_t rnd(void) { /* xorshift64* */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}

static uint32_t below(uint32_t n) {
  return n ? rnd() % n : 0;
}

/* Mostly small (a framework's many small tensors), some medium, a few large. */
static size_t pick_size(void) {
  uint32_t c = below(100);
  if (c < 60) return 1 + below(64 << 10);
  if (c < 92) return (64 << 10) + below(4 << 20);
  return (4 << 20) + below(28 << 20);
}

static const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry wl_fuzz_kernel()\n{\n ret;\n}\n";

static void load_kernel(void) {
  CUmodule m;
  MUST(cuModuleLoadData(&m, ptx));
  MUST(cuModuleGetFunction(&kfn, m, "wl_fuzz_kernel"));
}

/* Makes device d's primary context current. */
static void use_dev(int d) {
  if (d == cur) return;
  cur = d;
  MUST(cuCtxSetCurrent(prims[d]));
}

/* Every device's work done (a read-back may look at any device's memory). */
static void sync_all(void) {
  int was = cur;
  for (int d = 0; d < ndev; d++) {
    use_dev(d);
    MUST(cuCtxSynchronize());
  }
  use_dev(was);
}

/* A stream index with a live stream (created ones made on first use). */
static int pick_stream(void) {
  int i = (int)below(NSTREAMS);
  if (i >= 2 && !st[i])
    MUST(cuStreamCreate(&st[i], below(2) ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT));
  return i;
}

static CUstream stream_of(int i) {
  return i == 1 ? CU_STREAM_PER_THREAD : st[i];
}

/* The device an allocation lies on, as the driver says (-1 when there is none). */
static int ordinal(CUdeviceptr p, bool ok) {
  int d = -1;
  if (ok && cuPointerGetAttribute(&d, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) != CUDA_SUCCESS)
    d = -2;
  return d;
}

/* With two devices, now and then: a created stream of the other device for a stream-ordered
 * allocation made while this one's context stays current ("cuMemAllocAsync allocates from the
 * current mempool of the provided stream's device"): a->dev and a->stream name it. */
static bool other_device(alloc_t *a) {
  if (ndev < 2 || below(4)) return false;
  int here = cur, there = 1 - cur;
  use_dev(there);
  int i = 2 + (int)below(NSTREAMS - 2);
  if (!st[i]) MUST(cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING));
  use_dev(here);
  a->dev = there;
  a->stream = i;
  return true;
}

/* ---- read-back: a few bytes of an allocation against its fill --------------------------------*/

static bool check_bytes(CUdeviceptr p, size_t size, unsigned char fill) {
  size_t at[3] = {0, size / 2, size - 1};
  for (int i = 0; i < 3; i++) {
    unsigned char b = (unsigned char)~fill;
    if (cuMemcpyDtoH_v2(&b, p + at[i], 1) != CUDA_SUCCESS || b != fill) return false;
  }
  return true;
}

static void verify(int i) {
  sync_all();
  OUT("verify %s %s", kind_name[as[i].kind],
      check_bytes(as[i].p, as[i].size, as[i].fill) ? "ok" : "BAD");
}

static void drop(int i) {
  live_bytes -= as[i].size;
  as[i] = as[--na];
}

/* ---- the operations --------------------------------------------------------------------------*/

static void op_alloc(int kind) {
  if (na == MAXA || live_bytes > (768u << 20)) return;
  alloc_t a = {
      .size = pick_size(), .kind = kind, .dev = cur, .fill = (unsigned char)(1 + below(250))};
  CUresult r;
  bool rt = kind <= K_ASYNC && below(2); /* through the runtime: its own hooks */
  if (rt) {
    void *v = NULL;
    cudaError_t e;
    if (kind == K_SYNC) {
      e = cudaMalloc(&v, a.size);
      if (e == cudaSuccess) e = cudaMemset(v, a.fill, a.size);
    } else if (other_device(&a)) {
      e = cudaMallocAsync(&v, a.size, sts[a.dev][a.stream]);
      if (e == cudaSuccess) {
        use_dev(a.dev);
        e = cudaMemsetAsync(v, a.fill, a.size, sts[a.dev][a.stream]);
        use_dev(1 - a.dev);
      }
    } else {
      a.stream = pick_stream();
      CUstream s = stream_of(a.stream);
      e = cudaMallocAsync(&v, a.size, s);
      if (e == cudaSuccess) e = cudaMemsetAsync(v, a.fill, a.size, s);
    }
    a.p = (CUdeviceptr)(uintptr_t)v;
    OUT("alloc %s rt %d on %d", kind_name[kind], (int)e, ordinal(a.p, e == cudaSuccess));
    if (e != cudaSuccess) return;
    as[na++] = a;
    live_bytes += a.size;
    return;
  }
  if (kind == K_SYNC) {
    r = cuMemAlloc_v2(&a.p, a.size);
    if (r == CUDA_SUCCESS) r = cuMemsetD8_v2(a.p, a.fill, a.size);
  } else if (kind == K_PITCH) {
    size_t pitch = 0, width = 1 + below(8192), height = 1 + a.size / width;
    r = cuMemAllocPitch_v2(&a.p, &pitch, width, height, 4);
    a.size = pitch * height;
    if (r == CUDA_SUCCESS) r = cuMemsetD8_v2(a.p, a.fill, a.size);
  } else if (kind == K_ASYNC && other_device(&a)) {
    r = cuMemAllocAsync(&a.p, a.size, sts[a.dev][a.stream]);
    if (r == CUDA_SUCCESS) {
      use_dev(a.dev);
      r = cuMemsetD8Async(a.p, a.fill, a.size, sts[a.dev][a.stream]);
      use_dev(1 - a.dev);
    }
  } else {
    a.stream = pick_stream();
    CUstream s = stream_of(a.stream);
    r = kind == K_POOL ? cuMemAllocFromPoolAsync(&a.p, a.size, pool, s)
                       : cuMemAllocAsync(&a.p, a.size, s);
    if (r == CUDA_SUCCESS) r = cuMemsetD8Async(a.p, a.fill, a.size, s);
  }
  OUT("alloc %s %d on %d", kind_name[kind], (int)r, ordinal(a.p, r == CUDA_SUCCESS));
  if (r != CUDA_SUCCESS) return;
  as[na++] = a;
  live_bytes += a.size;
}

static void op_free(void) {
  if (!na) return;
  int i = (int)below((uint32_t)na);
  alloc_t *a = &as[i];
  CUresult r;
  bool rt = below(2); /* through the runtime, whichever API allocated it */
  void *v = (void *)(uintptr_t)a->p;
  if (a->kind == K_SYNC || a->kind == K_PITCH) {
    r = rt ? (CUresult)cudaFree(v) : cuMemFree_v2(a->p);
  } else {
    /* On its device's streams (a synchronous free may come from the other device's context); on
     * another stream only once the allocating one is done with it (the program's duty). */
    use_dev(a->dev);
    int s = below(3) ? a->stream : pick_stream();
    if (s != a->stream) MUST(cuStreamSynchronize(stream_of(a->stream)));
    r = rt ? (CUresult)cudaFreeAsync(v, stream_of(s)) : cuMemFreeAsync(a->p, stream_of(s));
  }
  OUT("free %s%s %d", kind_name[a->kind], rt ? " rt" : "", (int)r);
  if (r == 0) drop(i);
}

/* Copies the smaller into the larger's start, or the start of the larger into the smaller: the
 * target then holds the source's fill where it was written (the target's fill only changes when
 * it was wholly written). */
static void op_copy(void) {
  if (na < 2) return;
  int a = (int)below((uint32_t)na), b = (int)below((uint32_t)na);
  if (a == b || as[b].size > as[a].size) return;
  sync_all();
  CUresult r = cuMemcpyDtoD_v2(as[b].p, as[a].p, as[b].size);
  OUT("copy %d", (int)r);
  if (r == CUDA_SUCCESS) as[b].fill = as[a].fill;
}

static void op_host(void) {
  if (nh && below(2)) {
    int i = (int)below((uint32_t)nh);
    bool ok = hs[i].p[0] == hs[i].fill && hs[i].p[hs[i].size - 1] == hs[i].fill;
    bool rt = below(2);
    OUT("host free%s %s %d", rt ? " rt" : "", ok ? "ok" : "BAD",
        rt ? (int)cudaFreeHost(hs[i].p) : (int)cuMemFreeHost(hs[i].p));
    hs[i] = hs[--nh];
    return;
  }
  if (nh == MAXH) return;
  host_t h = {.size = 1 + below(1 << 20), .dev = cur, .fill = (unsigned char)(1 + below(250))};
  void *p = NULL;
  int how = (int)below(4);
  int r = how == 0   ? (int)cuMemAllocHost_v2(&p, h.size)
          : how == 1 ? (int)cuMemHostAlloc(&p, h.size, below(2) ? CU_MEMHOSTALLOC_PORTABLE : 0)
          : how == 2 ? (int)cudaMallocHost(&p, h.size)
                     : (int)cudaHostAlloc(&p, h.size, below(2) ? cudaHostAllocPortable : 0);
  OUT("host alloc %d %d", how, r);
  if (r != 0) return;
  h.p = p;
  memset(h.p, h.fill, h.size);
  /* Through the device: a copy of the pinned block into an allocation and back. */
  if (na && as[0].size >= h.size) {
    sync_all();
    MUST(cuMemcpyHtoD_v2(as[0].p, h.p, h.size));
    if (as[0].size == h.size)
      as[0].fill = h.fill;
    else {
      MUST(cuMemsetD8_v2(as[0].p, as[0].fill, as[0].size)); /* back to one fill */
      sync_all();
    }
  }
  hs[nh++] = h;
}

static void op_vmm(void) {
  if (nv && below(2)) {
    int i = (int)below((uint32_t)nv);
    vmm_t *v = &vs[i];
    sync_all();
    bool ok = check_bytes(v->va, v->size, v->fill);
    /* Released while mapped, then unmapped (NCCL's order), or unmapped first. */
    CUresult r1, r2;
    if (below(2)) {
      r1 = cuMemRelease(v->h);
      r2 = cuMemUnmap(v->va, v->size);
    } else {
      r1 = cuMemUnmap(v->va, v->size);
      r2 = cuMemRelease(v->h);
    }
    OUT("vmm free %s %d %d %d", ok ? "ok" : "BAD", (int)r1, (int)r2,
        (int)cuMemAddressFree(v->va, v->size));
    *v = vs[--nv];
    return;
  }
  if (nv == MAXV) return;
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = DEV}};
  size_t g = 0;
  MUST(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  vmm_t v = {.size = g * (1 + below(8)), .fill = (unsigned char)(1 + below(250))};
  CUresult r = cuMemAddressReserve(&v.va, v.size, 0, 0, 0);
  if (r == CUDA_SUCCESS) {
    r = cuMemCreate(&v.h, v.size, &prop, 0);
    if (r != CUDA_SUCCESS) cuMemAddressFree(v.va, v.size);
  }
  if (r == CUDA_SUCCESS) {
    MUST(cuMemMap(v.va, v.size, 0, v.h, 0));
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    MUST(cuMemSetAccess(v.va, v.size, &acc, 1));
    MUST(cuMemsetD8_v2(v.va, v.fill, v.size));
    vs[nv++] = v;
  }
  OUT("vmm create %d", (int)r);
}

static void op_launch(void) {
  int s = pick_stream();
  OUT("launch %d", (int)cuLaunchKernel(kfn, 1 + below(64), 1, 1, 32 * (1 + below(8)), 1, 1, 0,
                                       stream_of(s), NULL, NULL));
}

static void op_sync(void) {
  if (below(2)) {
    OUT("sync ctx %d", (int)cuCtxSynchronize());
  } else {
    int s = pick_stream();
    OUT("sync stream %d", (int)cuStreamSynchronize(stream_of(s)));
  }
}

static void op_event(void) {
  CUevent e;
  int s = pick_stream();
  MUST(cuEventCreate(&e, below(2) ? CU_EVENT_DISABLE_TIMING : CU_EVENT_DEFAULT));
  CUresult r = cuEventRecord(e, stream_of(s));
  CUresult w = cuEventSynchronize(e);
  OUT("event %d %d %d", (int)r, (int)w, (int)cuEventQuery(e));
  MUST(cuEventDestroy_v2(e));
}

/* A created stream destroyed (its stream-ordered allocations live on: their frees go to the
 * legacy stream from now on), or made. */
static void op_stream(void) {
  int i = 2 + (int)below(NSTREAMS - 2);
  if (!st[i]) {
    pick_stream();
    return;
  }
  OUT("stream destroy %d", (int)cuStreamDestroy_v2(st[i]));
  st[i] = NULL;
  for (int k = 0; k < na; k++)
    if (as[k].dev == cur && as[k].stream == i) as[k].stream = 0;
}

/* Calls the driver must refuse, and must be refused as it would: a free inside an allocation, a
 * free of no allocation, an allocation of nothing. */
static void op_bad(void) {
  uint32_t c = below(3);
  if (c == 0 && na) {
    alloc_t *a = &as[below((uint32_t)na)];
    if (a->size < 2) return;
    void *in = (void *)(uintptr_t)(a->p + 1);
    bool sync = a->kind == K_SYNC || a->kind == K_PITCH, rt = below(2);
    int r = sync ? (rt ? (int)cudaFree(in) : (int)cuMemFree_v2(a->p + 1))
                 : (rt ? (int)cudaFreeAsync(in, NULL) : (int)cuMemFreeAsync(a->p + 1, NULL));
    OUT("bad free inside %s%s %d", kind_name[a->kind], rt ? " rt" : "", r);
  } else if (c == 1) {
    CUdeviceptr p = 0;
    OUT("bad alloc 0 %d %d", (int)cuMemAlloc_v2(&p, 0), (int)cuMemAllocAsync(&p, 0, NULL));
  } else {
    int x = 0; /* a host address: never device memory */
    OUT("bad free host %d", (int)cuMemFree_v2((CUdeviceptr)(uintptr_t)&x));
  }
}

static void op_info(void) {
  size_t f = 0, t = 0;
  bool rt = below(2);
  int r = rt ? (int)cudaMemGetInfo(&f, &t) : (int)cuMemGetInfo_v2(&f, &t);
  OUT("meminfo%s %d %d", rt ? " rt" : "", r, r == 0 && f <= t && t > 0);
}

/* A capture of launches (what the double captures), instantiated and launched several times; in
 * a relaxed capture synchronous allocation and free stay allowed. Or a capture that a synchronous
 * allocation or a free (of a live allocation: it must stay live) invalidates, as the driver's
 * rule for potentially unsafe calls says. */
static void op_capture(void) {
  int i = 2 + (int)below(NSTREAMS - 2);
  if (!st[i]) MUST(cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING));
  CUstream s = st[i];
  static const CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
                                              CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                              CU_STREAM_CAPTURE_MODE_RELAXED};
  CUstreamCaptureMode mode = threaded ? CU_STREAM_CAPTURE_MODE_RELAXED : modes[below(3)];
  MUST(cuStreamBeginCapture_v2(s, mode));
  unsigned n = 1 + below(3);
  CUresult rl = CUDA_SUCCESS, ru = CUDA_SUCCESS, rf = CUDA_SUCCESS;
  for (unsigned k = 0; k < n && rl == CUDA_SUCCESS; k++)
    rl = cuLaunchKernel(kfn, 1 + below(8), 1, 1, 64, 1, 1, 0, s, NULL, NULL);
  CUdeviceptr q = 0;
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED || below(2)) {
    ru = cuMemAlloc_v2(&q, 1 + below(1 << 20));
    if (ru == CUDA_SUCCESS) rf = cuMemFree_v2(q);
  } else {
    for (int k = 0; k < na; k++)
      if (as[k].kind == K_SYNC) {
        rf = cuMemFree_v2(as[k].p); /* refused: it stays live (read back later) */
        if (rf == CUDA_SUCCESS) drop(k);
        break;
      }
  }
  CUgraph g = NULL;
  CUresult re = cuStreamEndCapture(s, &g);
  OUT("capture mode %d: launch %d alloc %d free %d end %d", (int)mode, (int)rl, (int)ru, (int)rf,
      (int)re);
  if (re != CUDA_SUCCESS || !g) return;
  CUgraphExec ge;
  CUresult ri = cuGraphInstantiateWithFlags(&ge, g, 0);
  CUresult rg = CUDA_ERROR_INVALID_VALUE, rw = CUDA_ERROR_INVALID_VALUE;
  if (ri == CUDA_SUCCESS) {
    unsigned m = 1 + below(3);
    for (unsigned k = 0; k < m; k++) rg = cuGraphLaunch(ge, s);
    rw = cuStreamSynchronize(s);
    MUST(cuGraphExecDestroy(ge));
  }
  MUST(cuGraphDestroy(g));
  OUT("graph %d %d %d", (int)ri, (int)rg, (int)rw);
}

/* A context the program creates: allocations in it, read back, some freed, then the context
 * destroyed with the rest; the primary context's memory is untouched by it. */
static void op_created(void) {
  CUcontext c;
  MUST(cuCtxCreate(&c, NULL, 0, DEV));
  CUstream s;
  MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d[4];
  int n = 1 + (int)below(4);
  for (int k = 0; k < n; k++) {
    size_t size = pick_size();
    CUresult r = below(2) ? cuMemAlloc_v2(&d[k], size) : cuMemAllocAsync(&d[k], size, s);
    if (r == CUDA_SUCCESS) r = cuMemsetD8Async(d[k], (unsigned char)(k + 1), size, s);
    if (r == CUDA_SUCCESS) r = cuStreamSynchronize(s);
    bool ok = r == CUDA_SUCCESS && check_bytes(d[k], size, (unsigned char)(k + 1));
    OUT("created alloc %d %s", (int)r, ok ? "ok" : "-");
    if (r != CUDA_SUCCESS) d[k] = 0;
  }
  void *h = NULL;
  OUT("created host %d", (int)cuMemAllocHost_v2(&h, 4096));
  for (int k = 0; k < n; k++)
    if (d[k] && below(2)) OUT("created free %d", (int)cuMemFree_v2(d[k]));
  OUT("created destroy %d", (int)cuCtxDestroy(c));
  MUST(cuCtxSetCurrent(primary));
  if (na) verify((int)below((uint32_t)na));
}

/* The device reset: synchronous and pitched memory, the created streams, pinned memory and
 * modules go; stream-ordered memory and VMM memory stay, with their contents. */
static void op_reset(void) {
  OUT("reset %d", (int)cuDevicePrimaryCtxReset_v2(DEV));
  MUST(cuCtxSetCurrent(primary));
  for (int i = na - 1; i >= 0; i--)
    if (as[i].dev == cur && (as[i].kind == K_SYNC || as[i].kind == K_PITCH)) drop(i);
  for (int i = 2; i < NSTREAMS; i++) st[i] = NULL;
  for (int i = 0; i < na; i++)
    if (as[i].dev == cur) as[i].stream = 0;
  for (int i = nh - 1; i >= 0; i--)
    if (hs[i].dev == cur) hs[i] = hs[--nh];
  load_kernel();
  MUST(cuDeviceGetDefaultMemPool(&pool, DEV));
  for (int i = 0; i < na; i++) verify(i);
  for (int i = 0; i < nv; i++)
    OUT("vmm after reset %s", check_bytes(vs[i].va, vs[i].size, vs[i].fill) ? "ok" : "BAD");
}

/* The other device's primary context made current (with two devices). */
static void op_switch(void) {
  if (ndev < 2) return;
  use_dev(1 - cur);
  OUT("device %d", cur);
}

/* One thread's sequence, then everything it holds read back and freed. */
static void *sequence(unsigned steps, int first) {
  cur = first;
  MUST(cuCtxSetCurrent(primary));
  for (step = 0; step < steps; step++) {
    uint32_t c = below(1000);
    if (c < 180)
      op_alloc(K_SYNC);
    else if (c < 330)
      op_alloc(K_ASYNC);
    else if (c < 360)
      op_alloc(K_PITCH);
    else if (c < 390)
      op_alloc(K_POOL);
    else if (c < 600)
      op_free();
    else if (c < 640 && na)
      verify((int)below((uint32_t)na));
    else if (c < 660)
      op_switch();
    else if (c < 700)
      op_copy();
    else if (c < 750)
      op_host();
    else if (c < 790)
      op_vmm();
    else if (c < 860)
      op_launch();
    else if (c < 890)
      op_sync();
    else if (c < 910)
      op_event();
    else if (c < 930)
      op_stream();
    else if (c < 950)
      op_bad();
    else if (c < 960)
      op_info();
    else if (c < 985)
      op_capture();
    else if (c < 995)
      op_created();
    else if (!threaded)
      op_reset();
  }
  for (int i = 0; i < na; i++) verify(i);
  while (na) {
    alloc_t *a = &as[0];
    use_dev(a->dev);
    CUresult r =
        a->kind == K_ASYNC || a->kind == K_POOL ? cuMemFreeAsync(a->p, NULL) : cuMemFree_v2(a->p);
    if (r != CUDA_SUCCESS) OUT("final free %d", (int)r);
    drop(0);
  }
  while (nh) MUST(cuMemFreeHost(hs[--nh].p));
  while (nv) {
    vmm_t *v = &vs[--nv];
    MUST(cuMemUnmap(v->va, v->size));
    MUST(cuMemRelease(v->h));
    MUST(cuMemAddressFree(v->va, v->size));
  }
  for (int d = 0; d < ndev; d++) {
    use_dev(d);
    for (int i = 2; i < NSTREAMS; i++)
      if (st[i]) MUST(cuStreamDestroy_v2(st[i]));
  }
  sync_all();
  return NULL;
}

typedef struct job_s {
  pthread_t t;
  uint64_t seed;
  unsigned steps;
  int first; /* the device it starts on */
  char *text;
  size_t len;
} job_t;

static void *thread_main(void *arg) {
  job_t *j = arg;
  rng = j->seed;
  out = open_memstream(&j->text, &j->len);
  if (!out) return NULL;
  sequence(j->steps, j->first);
  fclose(out);
  return NULL;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  out = stdout;
  char *end = NULL;
  unsigned long long seed = argc > 1 ? strtoull(argv[1], &end, 10) : 0;
  unsigned long steps = argc > 2 ? strtoul(argv[2], NULL, 10) : 0;
  unsigned long nthreads = argc > 3 ? strtoul(argv[3], NULL, 10) : 1;
  if (argc < 3 || !end || *end || !steps || steps > 1000000 || !nthreads || nthreads > 8) {
    fprintf(stderr, "usage: wl-ip-fuzz SEED STEPS [THREADS]: a seed, 1 to 1000000 steps and 1 to "
                    "8 threads\n");
    return 2;
  }
  MUST(cuInit(0));
  MUST(cuDeviceGetCount(&ndev));
  if (ndev > MAXD) ndev = MAXD;
  for (cur = ndev - 1; cur >= 0; cur--) { /* device 0's left current */
    MUST(cuDevicePrimaryCtxRetain(&prims[cur], DEV));
    MUST(cuCtxSetCurrent(primary));
    MUST(cuDeviceGetDefaultMemPool(&pool, DEV));
    load_kernel();
  }
  cur = 0;
  unsigned n = (unsigned)steps;
  if (nthreads == 1) {
    rng = seed * 0x9E3779B97F4A7C15ull + 1;
    sequence(n, 0);
  } else {
    /* Each thread's transcript printed whole, in thread order, once all are done. */
    threaded = true;
    job_t jobs[8] = {{0}};
    for (unsigned t = 0; t < nthreads; t++) {
      jobs[t].seed = (seed * 8 + t) * 0x9E3779B97F4A7C15ull + 1;
      jobs[t].steps = n;
      jobs[t].first = (int)(t % (unsigned)ndev);
      if (pthread_create(&jobs[t].t, NULL, thread_main, &jobs[t])) return 1;
    }
    for (unsigned t = 0; t < nthreads; t++) {
      pthread_join(jobs[t].t, NULL);
      printf("thread %u\n%s", t, jobs[t].text ? jobs[t].text : "(no transcript)\n");
      free(jobs[t].text);
    }
  }
  printf("done %u steps\n", n);
  return 0;
}
