/* gate mode: the phase detector fed from the hooks, the tick-tock gate entered at the launch
 * hooks, and the token released when the GPU reaches the peak (an event recorded on the
 * launching stream, waited for by a helper thread: never a synchronize inside a hook). */
#include "internal.h"

#include <errno.h>
#include <string.h>

int wl__gate_want;
uint32_t wl__gate_last_launch_tid;

static int last_phase;   /* wl_phase_kind_t the hooks last saw */
static int holding;      /* we entered and have not released */
static int peak_pending; /* a peak event is recorded and the helper waits for it */

static pthread_mutex_t helper_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t helper_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER; /* a pending release happened */
static bool helper_started;
static CUevent peak_event;
static CUcontext peak_ctx;
static uint64_t held_since_ns;

/* A process on several GPUs takes the token of each GPU's group (in the order of their names,
 * the same in every process), not only of the first one's: a process on one of those GPUs alone
 * would otherwise rise there while we do. The tokens held besides wl__member's: */
#define MAX_GATES 16
static pthread_mutex_t extra_lock = PTHREAD_MUTEX_INITIALIZER;
static wl_sched_t *extra[MAX_GATES];
static int nextra;

static void release_extra(void) {
  wl_sched_t *held[MAX_GATES];
  pthread_mutex_lock(&extra_lock);
  int n = nextra;
  memcpy(held, extra, (size_t)n * sizeof held[0]);
  nextra = 0;
  pthread_mutex_unlock(&extra_lock);
  for (int i = 0; i < n; i++) wl_gate_release(held[i]);
}

/* Enters the gate of every group joined, in name order; wl_gate_enter's answer for s (the first
 * group joined, whose token says whether we hold). */
static int enter_all(wl_sched_t *s) {
  wl_sched_t *gs[MAX_GATES];
  int n = wl__serve_groups(gs, MAX_GATES), r = WL_GATE_OPEN;
  bool s_seen = false;
  for (int i = 0; i < n; i++) {
    int ri = wl_gate_enter(gs[i]);
    if (gs[i] == s) {
      r = ri;
      s_seen = true;
    } else if (ri == WL_GATE_HELD) {
      pthread_mutex_lock(&extra_lock);
      if (nextra < MAX_GATES) extra[nextra++] = gs[i];
      pthread_mutex_unlock(&extra_lock);
    }
  }
  if (!s_seen) r = wl_gate_enter(s);
  if (r != WL_GATE_HELD) release_extra(); /* not holding: nothing would give them back */
  return r;
}

#define REAL(n) ((__typeof__(&n))wl__real(WL__H_##n))

static void release_now(wl_sched_t *s) {
  if (!__atomic_exchange_n(&holding, 0, __ATOMIC_ACQ_REL)) return;
  /* Timed before the release: the next holder's grant comes after it, in every trace. */
  uint64_t now = wl__now_ns();
  uint64_t held = now - __atomic_load_n(&held_since_ns, __ATOMIC_RELAXED);
  wl_trace_writer_t *w = wl__tracer();
  if (w) {
    wl_trace_event_t ev = {.time_ns = now,
                           .kind = WL_TRACE_GATE_RELEASE,
                           .aux = (uint16_t)wl_sched_role(s),
                           .arg = held};
    wl_trace_emit(w, &ev);
  }
  int rc = wl_gate_release(s);
  release_extra();
  wl__count(WL__ST_GATE_RELEASES, 1);
  if (rc == -ENOENT) wl__debug("the gate token was taken back before the peak (gate timeout)");
}

/* Waits (outside every hook) for the GPU to reach the recorded peak, then hands the token on. */
static void *helper_main(void *arg) {
  (void)arg;
  __typeof__(&cuCtxSetCurrent) setcur = REAL(cuCtxSetCurrent);
  __typeof__(&cuEventSynchronize) sync = REAL(cuEventSynchronize);
  /* Our own thread: its waits never count against a program's GLOBAL capture (a thread's mode
   * is its own; set once). */
  wl__capture_relax();
  pthread_mutex_lock(&helper_lock);
  for (;;) {
    while (!__atomic_load_n(&peak_pending, __ATOMIC_ACQUIRE))
      pthread_cond_wait(&helper_cv, &helper_lock);
    CUevent ev = peak_event;
    CUcontext ctx = peak_ctx;
    pthread_mutex_unlock(&helper_lock);
    if (setcur && sync && setcur(ctx) == CUDA_SUCCESS) {
      CUresult r = sync(ev);
      if (r != CUDA_SUCCESS) wl__warn_once("waiting for the peak event failed (%d)", (int)r);
    }
    wl_sched_t *s = __atomic_load_n(&wl__member, __ATOMIC_ACQUIRE);
    if (s) release_now(s);
    pthread_mutex_lock(&helper_lock);
    __atomic_store_n(&peak_pending, 0, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&done_cv);
  }
  return NULL;
}

/* At the detected peak: record an event on the stream of the peak's work; the helper releases
 * the token when it completes. Falls back to releasing at once when it cannot. */
static void at_peak(wl_sched_t *s, void *stream) {
  __atomic_store_n(&wl__gate_want, 0, __ATOMIC_RELAXED);
  if (!__atomic_load_n(&holding, __ATOMIC_ACQUIRE)) return;
  if (__atomic_load_n(&peak_pending, __ATOMIC_ACQUIRE)) return;
  __typeof__(&cuEventCreate) create = REAL(cuEventCreate);
  __typeof__(&cuEventRecord) record = REAL(cuEventRecord);
  __typeof__(&cuCtxGetCurrent) getcur = REAL(cuCtxGetCurrent);
  CUcontext ctx = NULL;
  pthread_mutex_lock(&helper_lock);
  bool ok = create && record && getcur && getcur(&ctx) == CUDA_SUCCESS && ctx;
  if (ok && (!peak_event || peak_ctx != ctx)) {
    CUevent e = NULL;
    ok = create(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
    if (ok) peak_event = e; /* an event of another context is left behind (rare) */
  }
  if (ok) ok = record(peak_event, (CUstream)stream) == CUDA_SUCCESS;
  if (ok && !helper_started) {
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    ok = wl__thread_create(&t, &at, helper_main, NULL) == 0;
    pthread_attr_destroy(&at);
    helper_started = ok;
  }
  if (ok) {
    peak_ctx = ctx;
    __atomic_store_n(&peak_pending, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&helper_cv);
  }
  pthread_mutex_unlock(&helper_lock);
  if (!ok) {
    wl__warn_once("cannot wait for the GPU to reach the peak; releasing the gate at the host's "
                  "peak instead");
    release_now(s);
  }
}

static void feed(wl_phase_event_kind_t kind, size_t size, void *stream) {
  wl_sched_t *s = __atomic_load_n(&wl__member, __ATOMIC_ACQUIRE);
  if (!s || __atomic_load_n(&wl__exiting, __ATOMIC_ACQUIRE)) return;
  wl_phase_event_t ev = {.time_ns = wl__now_ns(), .thread = wl__tid(), .kind = kind, .size = size};
  int ph = (int)wl_sched_event(s, &ev);
  int prev = __atomic_exchange_n(&last_phase, ph, __ATOMIC_ACQ_REL);
  if (prev == ph && ph != WL_PHASE_ITER_BEGIN) return;
  if (prev != ph) { /* the process's one phase, shown in its other GPUs' groups too */
    wl_sched_t *gs[MAX_GATES];
    int n = wl__serve_groups(gs, MAX_GATES);
    for (int i = 0; i < n; i++)
      if (gs[i] != s) wl_sched_publish(gs[i], (wl_phase_kind_t)ph, 0);
  }
  bool was_rising = prev == WL_PHASE_ITER_BEGIN || prev == WL_PHASE_FORWARD;
  /* A trainer marker reaches libsched directly: we see its iteration first as FORWARD, and
   * trace that as the begin it is, so the trace's iterations follow the markers too. */
  bool begins = ph == WL_PHASE_ITER_BEGIN || (ph == WL_PHASE_FORWARD && !was_rising);
  wl__trace_ev(WL_TRACE_PHASE, (uint16_t)(begins ? WL_PHASE_ITER_BEGIN : ph), 0, 0, 0);
  if (begins) {
    /* A new iteration while still holding (its peak never came): give the token back first so
     * the others get their turn. */
    if (!__atomic_load_n(&peak_pending, __ATOMIC_ACQUIRE)) release_now(s);
    __atomic_store_n(&wl__gate_want, 1, __ATOMIC_RELAXED);
  } else if (ph == WL_PHASE_BACKWARD && was_rising) {
    at_peak(s, stream);
  } else if (was_rising && ph != WL_PHASE_FORWARD) { /* lost, or no backward (evaluation) */
    __atomic_store_n(&wl__gate_want, 0, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&peak_pending, __ATOMIC_ACQUIRE)) release_now(s);
  }
}

void wl__gate_mem_event(int is_alloc, size_t size, void *stream) {
  feed(is_alloc ? WL_PEV_ALLOC : WL_PEV_FREE, size, stream);
}

void wl__gate_before_alloc(size_t size, void *stream) {
  feed(WL_PEV_ALLOC, size, stream);
  if (__atomic_load_n(&wl__gate_want, __ATOMIC_RELAXED))
    wl__gate_launch_slow(stream, NULL, WL__FN_NONE);
}

typedef CUresult (*func_name_fn)(const char **, CUfunction);
typedef CUresult (*kernel_name_fn)(const char **, CUkernel);
typedef int (*rt_func_name_fn)(const char **, const void *);

/* Looked up by name once (an old driver has neither cuFuncGetName nor cuKernelGetName). */
static void *by_name_once(void **slot, int *tried, const char *name, bool rt) {
  void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (!f && !__atomic_exchange_n(tried, 1, __ATOMIC_ACQ_REL)) {
    f = rt ? wl__real_rt_by_name(name) : wl__real_by_name(name);
    __atomic_store_n(slot, f, __ATOMIC_RELEASE);
  }
  return f;
}

/* Asked only on the way into the gate (once an iteration, and for the NCCL launches that come
 * while an entry is wanted) and when a graph is inspected, so no cache: the driver's answer is a
 * table lookup. */
int wl__is_nccl_kernel(const void *fn, int fn_kind) {
  static void *drv_name, *kern_name, *rt_name;
  static int drv_tried, kern_tried, rt_tried;
  if (!fn || (fn_kind != WL__FN_DRV && fn_kind != WL__FN_RT && fn_kind != WL__FN_KERNEL)) return 0;
  const char *name = NULL;
  WL_NEST_BEGIN(); /* the runtime may call the driver: none of it is ours to count */
  if (fn_kind == WL__FN_DRV) {
    func_name_fn f = (func_name_fn)by_name_once(&drv_name, &drv_tried, "cuFuncGetName", false);
    if (f && f(&name, (CUfunction)(uintptr_t)fn) != CUDA_SUCCESS) name = NULL;
  } else if (fn_kind == WL__FN_KERNEL) {
    kernel_name_fn f =
        (kernel_name_fn)by_name_once(&kern_name, &kern_tried, "cuKernelGetName", false);
    if (f && f(&name, (CUkernel)(uintptr_t)fn) != CUDA_SUCCESS) name = NULL;
  } else {
    rt_func_name_fn f = (rt_func_name_fn)by_name_once(&rt_name, &rt_tried, "cudaFuncGetName", true);
    if (f && f(&name, fn) != 0) name = NULL;
  }
  WL_NEST_END();
  /* Mangled or not, NCCL's kernels carry these in their names (2.19+: ncclDevKernel_, before:
   * ncclKernel_). */
  return name && (strstr(name, "ncclDevKernel") || strstr(name, "ncclKernel")) ? 1 : 0;
}

void wl__gate_launch_thread(void *stream) {
  __atomic_store_n(&wl__gate_last_launch_tid, wl__tid(), __ATOMIC_RELAXED);
  feed(WL_PEV_LAUNCH, 0, stream);
}

void wl__gate_launch_slow(void *stream, const void *fn, int fn_kind) {
  /* Never inside NCCL: its peers would wait for us. Its exported entry points mark a region;
   * NCCL linked in statically is known by its kernels' names; a graph by what its capture saw. */
  if (wl__tls.nccl || wl__is_nccl_kernel(fn, fn_kind) ||
      (fn_kind == WL__FN_GRAPH && wl__graph_exec_has_nccl(fn))) {
    wl__count(WL__ST_GATE_SKIPPED_NCCL, 1);
    return;
  }
  if (wl__stream_capturing(stream)) { /* nothing runs now; the graph's launch is gated */
    wl__count(WL__ST_GATE_SKIPPED_CAPTURE, 1);
    return;
  }
  if (!__atomic_exchange_n(&wl__gate_want, 0, __ATOMIC_ACQ_REL)) return;
  wl_sched_t *s = __atomic_load_n(&wl__member, __ATOMIC_ACQUIRE);
  if (!s || __atomic_load_n(&wl__exiting, __ATOMIC_ACQUIRE)) return;
  /* A new iteration while the last one's peak release is still pending: the token goes to the
   * next member when the GPU gets there; then we queue for it like everyone else. */
  if (__atomic_load_n(&peak_pending, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&helper_lock);
    while (__atomic_load_n(&peak_pending, __ATOMIC_ACQUIRE))
      pthread_cond_wait(&done_cv, &helper_lock);
    pthread_mutex_unlock(&helper_lock);
  }
  if (__atomic_load_n(&holding, __ATOMIC_ACQUIRE)) return;
  int role = wl_sched_role(s);
  /* At our trough, about to wait for the token: what we hold unused goes back to the group
   * first, or the member rising now may wait for it while we wait for the token. */
  wl__serve_trim();
  uint64_t t0 = wl__now_ns();
  wl__trace_ev(WL_TRACE_GATE_WAIT, (uint16_t)role, 0, 0, 0);
  int r = enter_all(s);
  uint64_t t1 = wl__now_ns();
  if (r != WL_GATE_HELD) return;
  __atomic_store_n(&held_since_ns, t1, __ATOMIC_RELAXED);
  __atomic_store_n(&holding, 1, __ATOMIC_RELEASE);
  /* Granted while the process exits (at_exit released before): give it straight back. */
  if (__atomic_load_n(&wl__exiting, __ATOMIC_ACQUIRE)) release_now(s);
  wl__count(WL__ST_GATE_ENTERS, 1);
  wl__count(WL__ST_GATE_WAIT_NS, t1 - t0);
  wl_trace_writer_t *w = wl__tracer();
  if (w) { /* stamped by the clock, as the release is: spans compare across processes */
    wl_trace_event_t ev = {
        .time_ns = t1, .kind = WL_TRACE_GATE_GRANT, .aux = (uint16_t)role, .arg = t1 - t0};
    wl_trace_emit(w, &ev);
  }
}

void wl__gate_at_exit(void) {
  wl_sched_t *s = __atomic_load_n(&wl__member, __ATOMIC_ACQUIRE);
  __atomic_store_n(&wl__gate_want, 0, __ATOMIC_RELAXED);
  if (s) release_now(s);
}

/* Before a device reset: the helper's wait for the peak ends first (the token is released when
 * the GPU reaches it, as always), then the event is destroyed while its context lives; the next
 * peak makes a new one. */
void wl__gate_reset(void) {
  __typeof__(&cuEventDestroy_v2) destroy = REAL(cuEventDestroy_v2);
  pthread_mutex_lock(&helper_lock);
  while (__atomic_load_n(&peak_pending, __ATOMIC_ACQUIRE))
    pthread_cond_wait(&done_cv, &helper_lock);
  if (peak_event && destroy) destroy(peak_event);
  peak_event = NULL;
  peak_ctx = NULL;
  pthread_mutex_unlock(&helper_lock);
}

void wl__gate_ctx_destroy(CUcontext ctx) {
  pthread_mutex_lock(&helper_lock);
  bool ours = peak_event && peak_ctx == ctx;
  pthread_mutex_unlock(&helper_lock);
  if (ours) wl__gate_reset(); /* a peak made since is the next peak's, as after a reset */
}

void wl__gate_fork_child(void) {
  pthread_mutex_t fl = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t fc = PTHREAD_COND_INITIALIZER;
  memcpy(&helper_lock, &fl, sizeof fl);
  memcpy(&helper_cv, &fc, sizeof fc);
  memcpy(&done_cv, &fc, sizeof fc);
  memcpy(&extra_lock, &fl, sizeof fl);
  nextra = 0;
  helper_started = false;
  peak_event = NULL;
  peak_ctx = NULL;
  wl__gate_want = 0;
  wl__gate_last_launch_tid = 0;
  last_phase = 0;
  holding = 0;
  peak_pending = 0;
}
