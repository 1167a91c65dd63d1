/* Stream captures in progress, with the mode each was begun with and the thread that began it, so
 * that a synchronous allocation or free we would serve goes to the driver instead wherever the
 * driver refuses it (cuThreadExchangeStreamCaptureMode's rule:
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the captures concerned invalidated). Only captures begun
 * through our hooks are known; the calling thread's own mode is asked from the driver. Consulted
 * only while a capture is in progress: without one the allocation hooks test a count
 * (wl__captures) and nothing else. */
#include "internal.h"

#include <string.h>

/* Past this many captures at once, one more is counted but not recorded: then every thread not
 * in RELAXED mode is taken as prohibited (the driver decides). */
#define RECS_MAX 64

typedef struct rec_s {
  uintptr_t stream;
  uint32_t key_tid;   /* the owner, for a per-thread default stream (another in every thread) */
  uint32_t owner_tid; /* the thread that began it */
  int mode;           /* CUstreamCaptureMode */
} rec_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static rec_t recs[RECS_MAX];
static unsigned nrecs, unrecorded;

#define REAL(n) ((__typeof__(&n))wl__real(WL__H_##n))

int wl__captures;

static rec_t key_of(void *stream) {
  uint32_t me = wl__tid();
  return (rec_t){(uintptr_t)stream, stream == CU_STREAM_PER_THREAD ? me : 0, me, 0};
}

/* Under the lock: the index of the newest (last) or oldest record of stream's key, or -1. */
static int find(rec_t k, bool newest) {
  int found = -1;
  for (unsigned i = 0; i < nrecs; i++)
    if (recs[i].stream == k.stream && recs[i].key_tid == k.key_tid) {
      found = (int)i;
      if (!newest) break;
    }
  return found;
}

/* Under the lock: removes record i, keeping the order (the newest of a key is the last). */
static void drop(int i) {
  memmove(&recs[i], &recs[i + 1], (nrecs - (unsigned)i - 1) * sizeof recs[0]);
  nrecs--;
}

/* Counted and recorded before the driver begins the capture, and taken back when it refused:
 * a synchronous allocation on another thread meanwhile goes to the driver, which decides. Were
 * it recorded after, such an allocation could be served while the driver would refuse it. */
void wl__capture_begin(void *stream, int mode) {
  rec_t r = key_of(stream);
  r.mode = mode;
  pthread_mutex_lock(&lock);
  bool full = nrecs == RECS_MAX;
  if (!full)
    recs[nrecs++] = r;
  else
    unrecorded++;
  pthread_mutex_unlock(&lock);
  __atomic_add_fetch(&wl__captures, 1, __ATOMIC_RELAXED);
  if (full)
    wl__warn_once("more than %d stream captures at once; synchronous allocations go to the driver "
                  "while they last",
                  RECS_MAX);
}

/* Takes k off the count, never below 0. */
static void uncount(unsigned k) {
  int n = __atomic_load_n(&wl__captures, __ATOMIC_RELAXED), left;
  do {
    left = n > (int)k ? n - (int)k : 0;
  } while (n > 0 && !__atomic_compare_exchange_n(&wl__captures, &n, left, true, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED));
}

/* Forgets one capture of stream (the newest when the begin failed, the oldest when a capture
 * ended), and uncounts it. */
static void forget(void *stream, bool newest) {
  pthread_mutex_lock(&lock);
  int i = find(key_of(stream), newest);
  if (i >= 0)
    drop(i);
  else if (unrecorded)
    unrecorded--;
  pthread_mutex_unlock(&lock);
  uncount(1);
}

void wl__capture_begin_failed(void *stream) {
  forget(stream, true);
}

void wl__capture_ended(void *stream, CUresult r) {
  /* Ended (an invalidated or unjoined capture ends too); any other failure leaves it going. */
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
      r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
    forget(stream, false);
}

/* Puts the calling thread in RELAXED mode; its previous mode, -1 when the driver cannot say. */
int wl__capture_relax(void) {
  __typeof__(&cuThreadExchangeStreamCaptureMode) x = REAL(cuThreadExchangeStreamCaptureMode);
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (!x || x(&m) != CUDA_SUCCESS) return -1;
  return (int)m;
}

/* Gives the calling thread back the mode wl__capture_relax() returned. */
void wl__capture_unrelax(int mode) {
  if (mode < 0 || mode == CU_STREAM_CAPTURE_MODE_RELAXED) return;
  CUstreamCaptureMode m = (CUstreamCaptureMode)mode;
  REAL(cuThreadExchangeStreamCaptureMode)(&m);
}

/* The calling thread's interaction mode, read by exchanging it for RELAXED and back (the driver
 * has no query). Unknown: GLOBAL, the mode that is prohibited most. */
static int thread_mode(void) {
  int m = wl__capture_relax();
  wl__capture_unrelax(m);
  return m < 0 ? CU_STREAM_CAPTURE_MODE_GLOBAL : m;
}

/* A GLOBAL thread is prohibited while it has a capture not begun RELAXED or another thread has
 * one begun GLOBAL; a THREAD_LOCAL thread only by its own; a RELAXED one never. */
int wl__capture_prohibits(void) {
  int mode = thread_mode();
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return 0;
  uint32_t me = wl__tid();
  int p = 0;
  pthread_mutex_lock(&lock);
  if (unrecorded) p = 1;
  for (unsigned i = 0; i < nrecs && !p; i++) {
    const rec_t *r = &recs[i];
    if (r->owner_tid == me
            ? r->mode != CU_STREAM_CAPTURE_MODE_RELAXED
            : mode == CU_STREAM_CAPTURE_MODE_GLOBAL && r->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
      p = 1;
  }
  pthread_mutex_unlock(&lock);
  return p;
}

int wl__stream_capturing(void *stream) {
  if (!__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)) return 0;
  /* The legacy default stream cannot be captured. */
  if (!stream || stream == CU_STREAM_LEGACY) return 0;
  __typeof__(&cuStreamIsCapturing) is = REAL(cuStreamIsCapturing);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!is || is((CUstream)stream, &st) != CUDA_SUCCESS) return 1; /* unsure: treat as capture */
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* ---- our own driver calls during captures ----------------------------------------------------
 * liballoc's VMM provider calls the driver on the program's threads (serving stream-ordered
 * allocations on streams that are not capturing) and on its trim thread. Should the driver count
 * one of those calls as potentially unsafe, a call the program never made would invalidate the
 * program's capture (a GLOBAL one prohibits every GLOBAL thread). So while any capture is in
 * progress the provider's calls that change or query memory and event state run with the calling
 * thread in RELAXED mode, which nothing prohibits, and its mode is given back after; otherwise
 * they go straight through. The VMM calls (always 1) are relaxed always: each costs the driver
 * microseconds, two mode exchanges add little, and a capture begun on another thread between the
 * count's test and the call is covered too. The exact (cuda.h-versioned) names liballoc asks
 * for, with the parameters to pass on. Left alone: queries of devices and contexts, init-time
 * calls. */
#define RELAXED_CALLS(X)                                                                           \
  X(cuMemAddressReserve, 1,                                                                        \
    (CUdeviceptr * p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags),      \
    (p, size, align, addr, flags))                                                                 \
  X(cuMemAddressFree, 1, (CUdeviceptr p, size_t size), (p, size))                                  \
  X(cuMemCreate, 1,                                                                                \
    (CUmemGenericAllocationHandle * h, size_t size, const CUmemAllocationProp *prop,               \
     unsigned long long flags),                                                                    \
    (h, size, prop, flags))                                                                        \
  X(cuMemRelease, 1, (CUmemGenericAllocationHandle h), (h))                                        \
  X(cuMemMap, 1,                                                                                   \
    (CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,                       \
     unsigned long long flags),                                                                    \
    (p, size, off, h, flags))                                                                      \
  X(cuMemSetAccess, 1, (CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t n),        \
    (p, size, desc, n))                                                                            \
  X(cuMemUnmap, 1, (CUdeviceptr p, size_t size), (p, size))                                        \
  X(cuMemExportToShareableHandle, 0,                                                               \
    (void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,                    \
     unsigned long long flags),                                                                    \
    (out, h, type, flags))                                                                         \
  X(cuMemImportFromShareableHandle, 0,                                                             \
    (CUmemGenericAllocationHandle * h, void *os, CUmemAllocationHandleType type), (h, os, type))   \
  X(cuStreamQuery, 0, (CUstream s), (s))                                                           \
  X(cuEventCreate, 0, (CUevent * e, unsigned int flags), (e, flags))                               \
  X(cuEventRecord, 0, (CUevent e, CUstream s), (e, s))                                             \
  X(cuEventQuery, 0, (CUevent e), (e))                                                             \
  X(cuEventDestroy, 0, (CUevent e), (e))

enum {
#define RELAXED_ID(f, always, params, args) RX_##f,
  RELAXED_CALLS(RELAXED_ID) RX_COUNT
#undef RELAXED_ID
};

/* The real entry points, set when liballoc resolves them (the same each time). */
static void *relaxed_real[RX_COUNT];

#define RELAXED_WRAP(f, always, params, args)                                                      \
  static __typeof__(f) relaxed_##f; /* the parameters must match cuda.h's */                       \
  static CUresult relaxed_##f params {                                                             \
    __typeof__(&f) real =                                                                          \
        (__typeof__(&f))__atomic_load_n(&relaxed_real[RX_##f], __ATOMIC_RELAXED);                  \
    if (WL_LIKELY(!(always) && !__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)))                 \
      return real args;                                                                            \
    int mode = wl__capture_relax();                                                                \
    CUresult r = real args;                                                                        \
    wl__capture_unrelax(mode);                                                                     \
    return r;                                                                                      \
  }
RELAXED_CALLS(RELAXED_WRAP)
#undef RELAXED_WRAP

#define RELAXED_STR_(x) #x
#define RELAXED_STR(x)  RELAXED_STR_(x)
static const struct {
  const char *name;
  void *wrapper;
} relaxed_tab[RX_COUNT] = {
#define RELAXED_ENTRY(f, always, params, args) [RX_##f] = {RELAXED_STR(f), (void *)relaxed_##f},
    RELAXED_CALLS(RELAXED_ENTRY)
#undef RELAXED_ENTRY
};

void *wl__capture_relaxed(const char *name, void *real) {
  if (!real) return NULL;
  for (int i = 0; i < RX_COUNT; i++)
    if (!strcmp(name, relaxed_tab[i].name)) {
      __atomic_store_n(&relaxed_real[i], real, __ATOMIC_RELAXED);
      return relaxed_tab[i].wrapper;
    }
  return real;
}

/* Before a device reset (its primary context ctx; NULL when the driver cannot say which: the
 * device's streams) or the destruction of a context the program created (ctx): captures on the
 * streams that go die with them. Each recorded capture the calling thread
 * can name is asked for its device or context while the stream still lives; another thread's
 * per-thread default stream cannot be named here (no other thread may use the device or context
 * meanwhile) and is kept, as is any the driver cannot place. */
static void forget_on(int device, CUcontext ctx) {
  if (!__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)) return;
  __typeof__(&cuStreamGetDevice) getdev = REAL(cuStreamGetDevice);
  __typeof__(&cuStreamGetCtx) getctx = REAL(cuStreamGetCtx);
  if (!getctx && device >= 0) ctx = NULL; /* a driver that cannot say: the device's */
  uint32_t me = wl__tid();
  unsigned gone = 0;
  pthread_mutex_lock(&lock);
  for (unsigned i = 0; i < nrecs;) {
    CUstream s = (CUstream)recs[i].stream;
    CUdevice d = -1;
    CUcontext c = NULL;
    bool mine = recs[i].key_tid == 0 || recs[i].key_tid == me;
    bool on = ctx ? mine && getctx && getctx(s, &c) == CUDA_SUCCESS && c == ctx
                  : mine && getdev && getdev(s, &d) == CUDA_SUCCESS && d == device;
    if (on) {
      drop((int)i);
      gone++;
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&lock);
  uncount(gone);
}

void wl__capture_reset(int device, CUcontext primary) {
  forget_on(device, primary);
}

void wl__capture_ctx_destroy(CUcontext ctx) {
  forget_on(-1, ctx);
}

/* The child's CUDA context does not survive the fork, nor do its captures; the lock may have
 * been held. */
void wl__capture_fork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&lock, &fresh, sizeof fresh);
  nrecs = unrecorded = 0;
  __atomic_store_n(&wl__captures, 0, __ATOMIC_RELAXED);
}
