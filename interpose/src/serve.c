/* alloc and gate modes: device allocations served by liballoc over the CUDA VMM provider (which
 * calls the real driver, never our hooks), under the group's memory budget from libsched. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_DEVICES 16

typedef struct served_s {
  int device; /* -1: slot unused */
  wl_alloc_t *alloc;
  bool failed; /* creation or the driver's VMM failed: pass this device's allocations through */
  /* Served blocks of synchronous allocations (cuMemAlloc, cudaMalloc) now live: a device reset
   * frees those, not stream-ordered ones, so they are kept in the pointer map (a cold path);
   * a served free looks there only while there are any. */
  uint64_t sync_live;
} served_t;

static served_t table[MAX_DEVICES];
static int (*wl__table_unreserve)(void *ctx, uintptr_t addr, size_t size);
static int table_n;
/* Devices given access to each device's served memory (bit d: device d), kept for an allocator
 * made later. Under table_lock with the allocators' creation, so none is missed. */
static unsigned granted[MAX_DEVICES];
static int created_seen; /* a context the program created was current at a hooked call */
/* Each device's primary context as last found: a thread switching between devices (cudaSetDevice)
 * knows it again by a compare, without asking the driver. */
static CUcontext primary_seen[MAX_DEVICES];
/* Bumped in a forked child and when a device stops being served: the per-thread caches go
 * stale. */
static unsigned generation = 1;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

wl_sched_t *wl__member;

/* Per thread: the context last seen, its device (device + 1 for a primary context, -(device + 1)
 * for one the program created) and the table index it maps to (index + 1; 0: none yet). Stale
 * when the generation moved. */
static __thread CUcontext tls_ctx __attribute__((tls_model("initial-exec")));
static __thread int tls_dev __attribute__((tls_model("initial-exec")));
static __thread int tls_idx __attribute__((tls_model("initial-exec")));
static __thread unsigned tls_gen __attribute__((tls_model("initial-exec")));

#define REAL(n) ((__typeof__(&n))wl__real(WL__H_##n))

/* ---- per-thread default streams -------------------------------------------------------------
 * CU_STREAM_PER_THREAD (and the _ptsz entry points' NULL) names another stream in every thread,
 * but liballoc keys stream-ordered reuse by handle: served calls give it a handle of the
 * thread's own instead, this thread-local's address tagged odd (never a real stream's), and the
 * provider records liballoc's events on it only on that thread, the one that can name the stream
 * (elsewhere -EAGAIN: its frees stay pending). At thread exit the thread forgets it with a final
 * event of its own. */
#define PTDS_TAG 5u
static __thread char tls_ptds
    __attribute__((tls_model("initial-exec"), aligned(8))); /* 1: hooked */

static inline void *ptds_handle(void) {
  return (void *)((uintptr_t)&tls_ptds | PTDS_TAG);
}

static inline bool is_ptds(const void *s) {
  return ((uintptr_t)s & 7u) == PTDS_TAG;
}

/* glibc runs these thread_local destructors before any pthread key's (the driver keeps its
 * per-thread streams by key), so the final event goes on the stream while it still exists. */
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *obj, void *dso) __attribute__((weak));
extern void *__dso_handle;
static pthread_key_t ptds_key;
static pthread_once_t ptds_once = PTHREAD_ONCE_INIT;

static void forget_stream(void *handle);

static void ptds_exit(void *unused) {
  (void)unused;
  tls_ptds = 0; /* a later call (another destructor) hooks again */
  forget_stream(ptds_handle());
}

static void ptds_key_init(void) {
  if (pthread_key_create(&ptds_key, ptds_exit)) wl__warn_once("no thread-exit hook for streams");
}

__attribute__((noinline, cold)) static void ptds_hook(void) {
  tls_ptds = 1;
  if (__cxa_thread_atexit_impl && __cxa_thread_atexit_impl(ptds_exit, NULL, &__dso_handle) == 0)
    return;
  pthread_once(&ptds_once, ptds_key_init);
  pthread_setspecific(ptds_key, (void *)1);
}

/* The handle liballoc knows stream by: one of the calling thread's own for its per-thread
 * default stream. */
static inline void *alloc_stream(void *stream) {
  if (WL_LIKELY(stream != CU_STREAM_PER_THREAD)) return stream;
  if (WL_UNLIKELY(!tls_ptds)) ptds_hook();
  return ptds_handle();
}

static int (*vmm_stream_check)(void *ctx, wl_stream_t stream);
static int (*vmm_event_record)(void *ctx, void *event, wl_stream_t stream);

/* The handle synchronous allocations are served on. No free is ever tagged with it, so they take
 * only blocks whose work is done: thread caches and pending lists are per stream, and a block
 * freed in stream order on the legacy stream, reusable there at once, must not come back from
 * cudaMalloc, whose memory any stream may use at once (with work on the legacy stream still
 * reading it). Not a CUDA handle: CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are 1 and 2. */
#define SYNC_STREAM ((void *)(uintptr_t)3)

static int stream_check_ptds(void *ctx, wl_stream_t stream) {
  if (stream == SYNC_STREAM) return 0;
  if (is_ptds(stream)) {
    if (stream != ptds_handle()) return -EINVAL;
    stream = CU_STREAM_PER_THREAD;
  }
  __typeof__(vmm_stream_check) check = __atomic_load_n(&vmm_stream_check, __ATOMIC_RELAXED);
  return check ? check(ctx, stream) : 0;
}

static int event_record_ptds(void *ctx, void *event, wl_stream_t stream) {
  if (stream == SYNC_STREAM) return -EAGAIN; /* nothing is freed on it: nothing to cover */
  if (is_ptds(stream)) {
    if (stream != ptds_handle()) return -EAGAIN; /* another thread's: only it can name it */
    stream = CU_STREAM_PER_THREAD;
  }
  return __atomic_load_n(&vmm_event_record, __ATOMIC_RELAXED)(ctx, event, stream);
}

/* The driver's entry points for liballoc; those that could count against a program's capture
 * wrapped (capture.c). */
void *wl__serve_resolve(void *arg, const char *name) {
  (void)arg;
  return wl__capture_relaxed(name, wl__real_by_name(name));
}

/* liballoc's events into the trace. The allocator's trim thread may emit while the process
 * exits: the writer is finished there, never freed, so a late emit is a no-op. */
static void alloc_hook(void *arg, const wl_alloc_event_t *ev) {
  (void)arg;
  wl_trace_writer_t *w = wl__tracer();
  if (!w) return;
  if (is_ptds(ev->stream)) { /* the trace names the stream as the program did */
    wl_alloc_event_t e = *ev;
    e.stream = CU_STREAM_PER_THREAD;
    wl_trace_alloc_hook(w, &e);
    return;
  }
  wl_trace_alloc_hook(w, ev);
}

/* Each device's group: the group of its GPU, whose ledger is liballoc's budget for the device
 * (memory on device 1 is not device 0's to book). The first group joined is wl__member, where the
 * process publishes its phase; it takes every group's gate (gate.c). Until exit: then each credit
 * is given back at once (a clean leave, not the kernel's lock drop), and what threads still running
 * map or unmap after that is not booked. Indexed by device ordinal; a device past MAX_DEVICES
 * joins none. */
typedef struct dev_group_s {
  wl_sched_t *member;
  bool failed;        /* the join failed: not tried again */
  wl_budget_t ledger; /* libsched's budget of the member */
  wl_budget_t budget; /* liballoc's, over the ledger (ctx: this entry) */
} dev_group_t;
static dev_group_t groups[MAX_DEVICES];
static int budget_closed;

/* liballoc asks without a deadline first and waits (a deadline) only when that was refused: a
 * wait is counted and traced (BUDGET_WAIT: bytes, ns waited, aux 1 when it ended refused), so
 * the time a replica spends waiting for memory is known from its stats and its trace. */
static int budget_acquire(void *ctx, size_t bytes, uint64_t deadline_ns) {
  const wl_budget_t *l = &((dev_group_t *)ctx)->ledger;
  if (__atomic_load_n(&budget_closed, __ATOMIC_ACQUIRE)) return 0;
  if (!deadline_ns) return l->acquire(l->ctx, bytes, 0);
  uint64_t t0 = wl__now_ns();
  int rc = l->acquire(l->ctx, bytes, deadline_ns);
  uint64_t waited = wl__now_ns() - t0;
  wl__count(WL__ST_BUDGET_WAITS, 1);
  wl__count(WL__ST_BUDGET_WAIT_NS, waited);
  wl__trace_ev(WL_TRACE_BUDGET_WAIT, rc ? 1 : 0, 0, bytes, waited);
  return rc;
}
static void budget_release(void *ctx, size_t bytes) {
  const wl_budget_t *l = &((dev_group_t *)ctx)->ledger;
  if (__atomic_load_n(&budget_closed, __ATOMIC_ACQUIRE)) return;
  l->release(l->ctx, bytes);
}
/* The device was full although the ledger had room (memory it cannot see: contexts, libraries'
 * own allocations, programs outside the group): counted and traced as a budget wait. liballoc
 * calls it again after each watch round with the same deadline: one wait is counted for them. */
static __thread uint64_t tls_wait_deadline;
static int budget_wait_release(void *ctx, size_t bytes, uint64_t deadline_ns) {
  const wl_budget_t *l = &((dev_group_t *)ctx)->ledger;
  if (__atomic_load_n(&budget_closed, __ATOMIC_ACQUIRE) || !l->wait_release) return -ETIMEDOUT;
  uint64_t t0 = wl__now_ns();
  int rc = l->wait_release(l->ctx, bytes, deadline_ns);
  uint64_t waited = wl__now_ns() - t0;
  bool again = deadline_ns == tls_wait_deadline; /* a round of the wait counted before */
  if (!again) wl__count(WL__ST_BUDGET_WAITS, 1);
  tls_wait_deadline = deadline_ns;
  wl__count(WL__ST_BUDGET_WAIT_NS, waited);
  wl__trace_ev(WL_TRACE_BUDGET_WAIT, (rc == -ETIMEDOUT ? 1 : 0) | (again ? 2 : 0), 0, bytes,
               waited);
  return rc;
}
static size_t budget_limit(void *ctx) {
  const wl_budget_t *l = &((dev_group_t *)ctx)->ledger;
  return l->limit ? l->limit(l->ctx) : 0;
}
static int budget_pressed(void *ctx) {
  const wl_budget_t *l = &((dev_group_t *)ctx)->ledger;
  return !__atomic_load_n(&budget_closed, __ATOMIC_ACQUIRE) && l->pressed && l->pressed(l->ctx);
}

static void uuid_string(int device, char *buf, size_t len) {
  buf[0] = 0;
  __typeof__(&cuDeviceGet) get = REAL(cuDeviceGet);
  __typeof__(&cuDeviceGetUuid_v2) uu = REAL(cuDeviceGetUuid_v2);
  CUdevice d;
  CUuuid u;
  if (!get || !uu || get(&d, device) != CUDA_SUCCESS || uu(&u, d) != CUDA_SUCCESS) return;
  size_t o = 0;
  o += (size_t)snprintf(buf + o, len - o, "GPU-");
  for (int i = 0; i < 16 && o + 3 < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%02x", (unsigned char)u.bytes[i]);
}

/* Joins the group of device's GPU (under table_lock, once per device): named by the GPU's UUID,
 * or by WAVELET_GROUP. A group is one GPU's, so with WAVELET_GROUP=x each GPU's group is x when x
 * is free or already that GPU's, else x, a dot and a hash of the UUID (libsched's
 * WL_SCHED_GPU_ALT). Processes sharing several GPUs and a name thus meet in one group per GPU
 * whichever device each serves first, and ranks on different GPUs that share a name are never
 * booked in one ledger. Without a UUID the ordinal stands in for it. */
static int join_gpu_group(wl_sched_t **s, wl_sched_config_t *cfg, int device, char *alt,
                          size_t len) {
  if (!cfg->group || cfg->gpu_uuid) return wl_sched_join(s, cfg); /* group_config set the flag */
  /* No UUID to tell GPUs apart: the first device served takes the name. */
  snprintf(alt, len, "%.*s.%d", WL_SCHED_GROUP_MAX - 4, cfg->group, device);
  if (__atomic_load_n(&wl__member, __ATOMIC_ACQUIRE)) cfg->group = alt;
  return wl_sched_join(s, cfg);
}

/* The configuration device's group is joined (or peeked at) with: the options, the GPU's UUID
 * (into uuid), its memory, without a name and a UUID the default group, and with both
 * WL_SCHED_GPU_ALT (a named group is one GPU's: join_gpu_group). */
static void group_config(int device, size_t capacity, wl_sched_config_t *cfg, char *uuid,
                         size_t len) {
  *cfg = wl__opts.sched;
  uuid_string(device, uuid, len);
  cfg->gpu_uuid = uuid[0] ? uuid : NULL;
  cfg->device_memory = capacity;
  if (!cfg->group && !cfg->gpu_uuid) cfg->group = "wavelet-default";
  if (cfg->group && cfg->gpu_uuid) cfg->flags |= WL_SCHED_GPU_ALT;
}

static dev_group_t *join_group(int device, size_t capacity) {
  if (device < 0 || device >= MAX_DEVICES) {
    wl__warn_once("device %d: no group for devices past %d; its memory is not under the budget",
                  device, MAX_DEVICES - 1);
    return NULL;
  }
  dev_group_t *g = &groups[device];
  if (g->member) return g;
  if (g->failed) return NULL;
  wl_sched_config_t cfg;
  char uuid[64], alt[WL_SCHED_GROUP_MAX + 1];
  group_config(device, capacity, &cfg, uuid, sizeof uuid);
  wl_sched_t *s = NULL;
  int rc = join_gpu_group(&s, &cfg, device, alt, sizeof alt);
  if (rc) {
    wl__error("device %d: cannot join the group%s%s (%s): its memory is served without the "
              "shared budget%s",
              device, cfg.group ? " " : "", cfg.group ? cfg.group : "", strerror(-rc),
              wl__member ? "" : ", and there is no gate");
    g->failed = true;
    return NULL;
  }
  wl_sched_budget(s, &g->ledger);
  g->budget = (wl_budget_t){.ctx = g,
                            .acquire = budget_acquire,
                            .release = budget_release,
                            .limit = budget_limit,
                            .wait_release = budget_wait_release,
                            .pressed = budget_pressed};
  __atomic_store_n(&g->member, s, __ATOMIC_RELEASE); /* read without table_lock */
  if (!__atomic_load_n(&wl__member, __ATOMIC_ACQUIRE))
    __atomic_store_n(&wl__member, s, __ATOMIC_RELEASE);
  char a[32];
  size_t lim = wl_sched_limit(s);
  wl__info("device %d: joined group %s as role %d of %u (budget %s)", device, wl_sched_group(s),
           wl_sched_role(s), wl_sched_waves(s), lim ? wl__fmt_bytes(lim, a, sizeof a) : "none");
  return g;
}

/* Who holds device's budget, for an out-of-memory line: "; the group holds 900.0 MiB (this
 * process 600.0 MiB, 1 other member 300.0 MiB)", or "" without a group. */
static void holders(int device, char *buf, size_t len) {
  buf[0] = 0;
  wl_sched_t *m = device >= 0 && device < MAX_DEVICES
                      ? __atomic_load_n(&groups[device].member, __ATOMIC_ACQUIRE)
                      : NULL;
  wl_sched_member_t ms[16];
  int n = m ? wl_sched_members(m, ms, sizeof ms / sizeof ms[0]) : -1;
  if (n <= 0) return;
  size_t mine = 0, others = 0;
  unsigned nothers = 0;
  pid_t me = getpid();
  for (int i = 0; i < n && i < (int)(sizeof ms / sizeof ms[0]); i++) {
    if (ms[i].pid == me) {
      mine += ms[i].physical_bytes;
    } else {
      others += ms[i].physical_bytes;
      nothers++;
    }
  }
  char a[32], b[32], c[32];
  if (!nothers)
    snprintf(buf, len, "; the group holds %s, all this process's",
             wl__fmt_bytes(mine, a, sizeof a));
  else
    snprintf(buf, len, "; the group holds %s (this process %s, %u other member%s %s)",
             wl__fmt_bytes(mine + others, a, sizeof a), wl__fmt_bytes(mine, b, sizeof b), nothers,
             nothers == 1 ? "" : "s", wl__fmt_bytes(others, c, sizeof c));
}

/* The program's own VMM memory (vmm.c) and the allocations that pass through booked are booked in
 * their device's group as liballoc books what it serves: at once when there is room, else after
 * giving back what liballoc holds unused, else after waiting (WAVELET_ALLOC_TIMEOUT_MS) for other
 * members to give memory back. */
int wl__serve_book(int device, size_t bytes, const char *call) {
  if (device < 0 || device >= MAX_DEVICES) return 1;
  dev_group_t *g = &groups[device];
  if (!__atomic_load_n(&g->member, __ATOMIC_ACQUIRE)) {
    __typeof__(&cuDeviceTotalMem_v2) total = REAL(cuDeviceTotalMem_v2);
    size_t cap = 0;
    if (!total || total(&cap, device) != CUDA_SUCCESS) cap = 0;
    pthread_mutex_lock(&table_lock);
    g = join_group(device, cap);
    pthread_mutex_unlock(&table_lock);
    if (!g) return 1;
  }
  if (budget_acquire(g, bytes, 0) == 0) return 0;
  wl__serve_trim();
  if (budget_acquire(g, bytes, 0) == 0) return 0;
  uint64_t deadline = wl_sched_alloc_deadline(g->member);
  if (deadline && budget_acquire(g, bytes, deadline) == 0) return 0;
  char a[32], b[32], h[160];
  size_t lim = wl_sched_limit(g->member);
  holders(device, h, sizeof h);
  wl__error("out of memory: %s of %s on device %d does not fit the group's budget (%s) in time%s; "
            "returning the CUDA out-of-memory error",
            call, wl__fmt_bytes(bytes, a, sizeof a), device,
            lim ? wl__fmt_bytes(lim, b, sizeof b) : "none", h);
  wl__count(WL__ST_OOMS, 1);
  return -ENOMEM;
}

void wl__serve_unbook_kind(unsigned kind, size_t size) {
  if (kind & WL__PASS_BOOKED) wl__serve_unbook((int)((kind >> 8) & 0xffu), size);
}

void wl__serve_unbook(int device, size_t bytes) {
  if (device < 0 || device >= MAX_DEVICES) return;
  dev_group_t *g = &groups[device];
  if (__atomic_load_n(&g->member, __ATOMIC_ACQUIRE)) budget_release(g, bytes);
}

/* The address ranges liballoc reserved, by allocator: a free is known to be ours by its address
 * alone (no accounting-map work on the served path). Ranges are only added (allocators are
 * never destroyed), under table_lock; readers load the count with acquire. */
#define MAX_RANGES 64
typedef struct range_s {
  uintptr_t lo, hi;
  int idx;
} range_t;
static range_t ranges[MAX_RANGES];
static int nranges;
static pthread_mutex_t range_lock = PTHREAD_MUTEX_INITIALIZER;
/* The VMM provider's own functions (the same for every device: set by the first allocator made,
 * read by every allocator's calls, on any thread), and each allocator's provider context, by
 * table index: a reservation is told to its allocator by the context it comes with. */
static int (*vmm_reserve)(void *ctx, size_t size, uintptr_t *addr);
static void *prov_ctx[MAX_DEVICES];

static int reserve_tracked(void *ctx, size_t size, uintptr_t *addr) {
  int rc = __atomic_load_n(&vmm_reserve, __ATOMIC_RELAXED)(ctx, size, addr);
  if (rc) return rc;
  int idx = -1;
  for (int i = 0; i < MAX_DEVICES && idx < 0; i++)
    if (__atomic_load_n(&prov_ctx[i], __ATOMIC_ACQUIRE) == ctx) idx = i;
  /* Under range_lock: one allocator's growth (under its own lock) may meet another's. */
  pthread_mutex_lock(&range_lock);
  int n = __atomic_load_n(&nranges, __ATOMIC_RELAXED);
  if (n == MAX_RANGES || idx < 0) { /* cannot tell its blocks from the driver's: give it back */
    pthread_mutex_unlock(&range_lock);
    __typeof__(wl__table_unreserve) unreserve =
        __atomic_load_n(&wl__table_unreserve, __ATOMIC_RELAXED);
    if (unreserve) unreserve(ctx, *addr, size);
    if (idx < 0)
      wl__warn_once("a reservation of an allocator we do not know; given back");
    else
      wl__warn_once("more than %d address ranges served; no more are reserved", MAX_RANGES);
    return -ENOMEM;
  }
  ranges[n] = (range_t){*addr, *addr + size, idx};
  __atomic_store_n(&nranges, n + 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&range_lock);
  return 0;
}

/* The allocator index whose reservation holds p, or -1. */
static inline int range_of(uintptr_t p) {
  int n = __atomic_load_n(&nranges, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (p >= ranges[i].lo && p < ranges[i].hi) return ranges[i].idx;
  return -1;
}

/* Creates the allocator for a device (under table_lock). NULL when it cannot, with *rc
 * -EAGAIN when that may pass (the driver refused during a stream capture). */
static wl_alloc_t *create(int device, int idx, int *rc_out) {
  *rc_out = 0;
  wl_provider_t prov;
  int rc = wl_provider_vmm_init_with(&prov, device, wl__serve_resolve, NULL);
  if (rc) {
    wl__error("cannot serve device %d from the VMM allocator (%s): passing allocations through",
              device, strerror(-rc));
    return NULL;
  }
  dev_group_t *g = join_group(device, prov.capacity);
  /* Later reservations (liballoc grows its address space) come through the same wrapper. */
  if (!__atomic_load_n(&vmm_reserve, __ATOMIC_RELAXED)) {
    __atomic_store_n(&wl__table_unreserve, prov.unreserve, __ATOMIC_RELAXED);
    __atomic_store_n(&vmm_stream_check, prov.stream_check, __ATOMIC_RELAXED);
    __atomic_store_n(&vmm_event_record, prov.event_record, __ATOMIC_RELAXED);
    __atomic_store_n(&vmm_reserve, prov.reserve, __ATOMIC_RELAXED);
  }
  if (idx >= 0 && idx < MAX_DEVICES) __atomic_store_n(&prov_ctx[idx], prov.ctx, __ATOMIC_RELEASE);
  prov.reserve = reserve_tracked;
  prov.stream_check = stream_check_ptds;
  prov.event_record = event_record_ptds;
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.trim_thread = 1;
  cfg.alloc_timeout_ms = wl__opts.sched.alloc_timeout_ms;
  if (wl__opts.alloc_tcache_set) {
    cfg.tcache_bytes = wl__opts.alloc_tcache;
    cfg.tcache_off = wl__opts.alloc_tcache == 0;
  }
  if (g)
    cfg.budget = &g->budget;
  else if (wl__opts.sched.mem_limit != WL_SCHED_MEM_DEFAULT)
    cfg.mem_limit = wl__opts.sched.mem_limit;
  /* Only when tracing: liballoc stamps every event it reports with the time. */
  if (wl__tracer()) cfg.hook = alloc_hook;
  wl_alloc_t *a = NULL;
  rc = wl_alloc_create(&a, &prov, &cfg);
  *rc_out = rc;
  /* Peers given access before this allocator existed (under table_lock, as wl__serve_grant). */
  for (int peer = 0; !rc && device < MAX_DEVICES && peer < 32; peer++)
    if (granted[device] & 1u << peer && wl_alloc_grant(a, peer))
      wl__warn("device %d's served memory cannot be opened to device %d", device, peer);
  if (rc) {
    if (rc == -EAGAIN)
      wl__debug("device %d: the driver refused to reserve during a stream capture; the allocator "
                "is created later",
                device);
    else
      wl__error("cannot create the allocator for device %d (%s): passing allocations through",
                device, strerror(-rc));
    if (idx >= 0 && idx < MAX_DEVICES) __atomic_store_n(&prov_ctx[idx], NULL, __ATOMIC_RELEASE);
    if (prov.destroy) prov.destroy(prov.ctx);
    return NULL;
  }
  return a;
}

int wl__current_device(CUcontext *ctx_out) {
  __typeof__(&cuCtxGetCurrent) getcur = REAL(cuCtxGetCurrent);
  __typeof__(&cuCtxGetDevice) getdev = REAL(cuCtxGetDevice);
  CUcontext ctx = NULL;
  CUdevice d;
  if (!getcur || !getdev || getcur(&ctx) != CUDA_SUCCESS || !ctx || getdev(&d) != CUDA_SUCCESS)
    return -1;
  if (ctx_out) *ctx_out = ctx;
  return (int)d;
}

/* The primary context's handle, asked with a retain and release while it is active (which
 * changes nothing then); an inactive one cannot be current, and holds nothing. */
int wl__primary_of(int device, CUcontext *primary) {
  __typeof__(&cuDevicePrimaryCtxGetState) state = REAL(cuDevicePrimaryCtxGetState);
  __typeof__(&cuDevicePrimaryCtxRetain) retain = REAL(cuDevicePrimaryCtxRetain);
  __typeof__(&cuDevicePrimaryCtxRelease_v2) release = REAL(cuDevicePrimaryCtxRelease_v2);
  unsigned flags;
  int active = 0;
  *primary = NULL;
  if (!state || !retain || !release || state(device, &flags, &active) != CUDA_SUCCESS) return -1;
  if (!active) return 0;
  if (retain(primary, device) != CUDA_SUCCESS) return -1;
  release(device);
  return 1;
}

bool wl__is_primary(CUcontext ctx, int device) {
  CUcontext primary;
  int st = wl__primary_of(device, &primary);
  if (st < 0) return true; /* cannot tell: taken for the primary */
  return ctx && st == 1 && primary == ctx;
}

int wl__primary_enter(int device, CUcontext *prev) {
  __typeof__(&cuCtxGetCurrent) getcur = REAL(cuCtxGetCurrent);
  __typeof__(&cuCtxSetCurrent) setcur = REAL(cuCtxSetCurrent);
  __typeof__(&cuDevicePrimaryCtxRetain) retain = REAL(cuDevicePrimaryCtxRetain);
  __typeof__(&cuDevicePrimaryCtxRelease_v2) release = REAL(cuDevicePrimaryCtxRelease_v2);
  CUcontext primary = NULL;
  *prev = NULL;
  if (!getcur || !setcur || !retain || !release || getcur(prev) != CUDA_SUCCESS) return -ENOSYS;
  if (retain(&primary, device) != CUDA_SUCCESS) return -ENODEV;
  if (setcur(primary) != CUDA_SUCCESS) {
    release(device);
    return -ENODEV;
  }
  return 0;
}

void wl__primary_leave(int device, CUcontext prev) {
  __typeof__(&cuCtxSetCurrent) setcur = REAL(cuCtxSetCurrent);
  __typeof__(&cuDevicePrimaryCtxRelease_v2) release = REAL(cuDevicePrimaryCtxRelease_v2);
  setcur(prev);
  release(device);
}

/* Whether ctx is device d's primary context: a compare with the one last found, else the driver
 * asked (and the answer kept). */
static bool known_primary(CUcontext ctx, int d) {
  bool seen =
      d >= 0 && d < MAX_DEVICES && __atomic_load_n(&primary_seen[d], __ATOMIC_RELAXED) == ctx;
  if (seen) return true;
  if (!wl__is_primary(ctx, d)) return false;
  if (d >= 0 && d < MAX_DEVICES) __atomic_store_n(&primary_seen[d], ctx, __ATOMIC_RELAXED);
  return true;
}

/* The calling thread's current context, looked at again only when it changed (or a context was
 * destroyed): tls_ctx and tls_dev describe it. 0 when there is none. */
static inline bool current_known(CUcontext *out) {
  __typeof__(&cuCtxGetCurrent) getcur = REAL(cuCtxGetCurrent);
  CUcontext ctx = NULL;
  if (!getcur || getcur(&ctx) != CUDA_SUCCESS || !ctx) return false;
  *out = ctx;
  unsigned gen = __atomic_load_n(&generation, __ATOMIC_RELAXED);
  if (WL_LIKELY(ctx == tls_ctx && tls_gen == gen)) return true;
  __typeof__(&cuCtxGetDevice) getdev = REAL(cuCtxGetDevice);
  CUdevice d;
  if (!getdev || getdev(&d) != CUDA_SUCCESS) return false;
  bool primary = known_primary(ctx, (int)d);
  tls_ctx = ctx;
  tls_dev = primary ? (int)d + 1 : -((int)d + 1);
  tls_idx = 0;
  tls_gen = gen;
  if (!primary && !__atomic_exchange_n(&created_seen, 1, __ATOMIC_RELAXED))
    wl__info("device %d: allocations in contexts the program creates (cuCtxCreate) pass through "
             "to the driver, not served; device memory is booked in the group's budget",
             (int)d);
  return true;
}

static inline bool made_stream(void *stream);

/* A pass-through allocation booked on device d: the kind bits to record (0: nothing booked, no
 * group there), or -ENOMEM. */
static int book_kind(int d, size_t size, const char *call) {
  if (d < 0 || d >= MAX_DEVICES) return 0;
  int rc = wl__serve_book(d, size, call);
  if (rc < 0) return rc;
  return rc == 0 ? (int)(WL__PASS_BOOKED | (unsigned)d << 8) : 0;
}

int wl__serve_book_pass(size_t size, const char *call, void *stream) {
  CUcontext ctx;
  /* During a capture nothing is allocated yet. */
  if (!size || !current_known(&ctx) || __atomic_load_n(&wl__captures, __ATOMIC_RELAXED)) return 0;
  int d = tls_dev > 0 ? tls_dev - 1 : -tls_dev - 1;
  if (made_stream(stream)) {
    /* "From the current mempool of the provided stream's device": the stream's context's. */
    __typeof__(&cuStreamGetCtx) getctx = REAL(cuStreamGetCtx);
    CUcontext sctx = NULL;
    int sd;
    if (getctx && getctx((CUstream)stream, &sctx) == CUDA_SUCCESS && sctx &&
        (sd = wl__context_device(sctx)) >= 0)
      d = sd;
  }
  return book_kind(d, size, call);
}

int wl__serve_book_placed(uintptr_t ptr, size_t size, const char *call) {
  if (!size || __atomic_load_n(&wl__captures, __ATOMIC_RELAXED)) return 0;
  __typeof__(&cuPointerGetAttribute) attr = REAL(cuPointerGetAttribute);
  unsigned type = 0;
  int dev = -1;
  if (!attr || attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)ptr) != CUDA_SUCCESS ||
      type != CU_MEMORYTYPE_DEVICE ||
      attr(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)ptr) != CUDA_SUCCESS || dev < 0)
    return 0; /* host memory (a host pool), or the driver cannot say: nothing to book */
  return book_kind(dev, size, call);
}

int wl__current_primary(void) {
  CUcontext ctx;
  return current_known(&ctx) && tls_dev > 0 ? tls_dev - 1 : -1;
}

/* The device of the calling thread's current context, created ones included; -1 when none. */
static int current_any_device(void) {
  CUcontext ctx;
  if (!current_known(&ctx)) return -1;
  return tls_dev > 0 ? tls_dev - 1 : -tls_dev - 1;
}

/* The table index serving device, its allocator made on first use; -1 when it is not served. */
static int index_of_device(int device) {
  int idx = -1;
  pthread_mutex_lock(&table_lock);
  for (int i = 0; i < table_n; i++)
    if (table[i].device == device) idx = i;
  if (idx < 0 && table_n < MAX_DEVICES) {
    int rc;
    wl_alloc_t *a = create(device, table_n, &rc);
    if (rc != -EAGAIN) { /* else this call passes through, and the next one tries again */
      idx = table_n;
      table[idx].device = device;
      table[idx].alloc = a;
      table[idx].failed = a == NULL;
      __atomic_store_n(&table_n, table_n + 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&table_lock);
  if (idx < 0 || __atomic_load_n(&table[idx].failed, __ATOMIC_RELAXED)) return -1;
  return idx;
}

/* The table index for the calling thread's current device, -1 when not served: no current
 * context (before cuInit, or none set on this thread: the driver answers, with its own error;
 * serving here would turn its failure into a success), or one the program created. Served memory
 * lives as long as the process (VMM memory belongs to no context), and liballoc's events belong
 * to the primary context: they could not be recorded on another context's streams, and the
 * memory would outlive the context that cuCtxDestroy is documented to free it with. */
static int current_index(void) {
  CUcontext ctx;
  if (!current_known(&ctx)) return -1;
  if (WL_LIKELY(tls_idx)) return tls_idx - 1;
  int device = tls_dev - 1;
  if (device < 0) return -1;
  int idx = index_of_device(device);
  if (idx >= 0) tls_idx = idx + 1;
  return idx;
}

/* ---- streams the program made ----------------------------------------------------------------
 * A stream belongs to a context, maybe not the current one: "cuMemAllocAsync allocates from the
 * current mempool of the provided stream's device", and liballoc's events, which belong to its
 * device's primary context, can be recorded only on that context's streams. So a stream-ordered
 * call on a stream the program made is served by the allocator of the stream's context: that
 * of its device when it is the device's primary context, none for a context the program created.
 * Each thread remembers the answer for its last few streams (stale when the generation moves:
 * a stream or context destroyed). */
#define STREAM_CACHE 4
static __thread struct {
  void *stream;
  int idx; /* the allocator the stream's context is served by, -1 when none */
  unsigned gen;
} tls_streams[STREAM_CACHE];
static __thread unsigned tls_stream_next;

static inline bool made_stream(void *stream) {
  return stream && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD;
}

static __attribute__((noinline)) int stream_index_slow(void *stream, unsigned gen) {
  __typeof__(&cuStreamGetCtx) getctx = REAL(cuStreamGetCtx);
  CUcontext ctx = NULL;
  int idx = -1, d;
  if (getctx && getctx((CUstream)stream, &ctx) == CUDA_SUCCESS && ctx &&
      (d = wl__context_device(ctx)) >= 0 && d < MAX_DEVICES && known_primary(ctx, d))
    idx = index_of_device(d);
  unsigned k = tls_stream_next++ % STREAM_CACHE;
  tls_streams[k].stream = stream;
  tls_streams[k].idx = idx;
  tls_streams[k].gen = gen;
  return idx;
}

/* The table index whose allocator may use stream (one the program made), -1 when none may. */
static inline int stream_index(void *stream) {
  unsigned gen = __atomic_load_n(&generation, __ATOMIC_RELAXED);
  for (unsigned k = 0; k < STREAM_CACHE; k++)
    if (tls_streams[k].stream == stream && tls_streams[k].gen == gen) return tls_streams[k].idx;
  return stream_index_slow(stream, gen);
}

/* Each device's default pool, asked once (it never changes), and the current pool the program
 * set (cuDeviceSetMemPool), NULL while that is the default one. */
static CUmemoryPool default_pool[MAX_DEVICES];
static CUmemoryPool current_pool[MAX_DEVICES];
static int pool_ever_set; /* the program set a current pool once: cuMemAllocAsync looks */

static CUmemoryPool default_of(int d) {
  CUmemoryPool p = __atomic_load_n(&default_pool[d], __ATOMIC_ACQUIRE);
  if (!p) {
    __typeof__(&cuDeviceGetDefaultMemPool) get = REAL(cuDeviceGetDefaultMemPool);
    if (!get || get(&p, d) != CUDA_SUCCESS) return NULL;
    __atomic_store_n(&default_pool[d], p, __ATOMIC_RELEASE);
  }
  return p;
}

/* Only the default pool's allocations are served: a pool the program made may be another
 * device's, host memory (CUDA 12.2's host pools), shareable (cuMemPoolExportPointer) or set up
 * for other devices' access (cuMemPoolSetAccess), none of which served memory is. */
bool wl__serve_pool(void *pool, void *stream) {
  int d = wl__current_primary();
  if (d < 0 || d >= MAX_DEVICES || !pool) return false;
  CUmemoryPool p = default_of(d);
  if (!p || (CUmemoryPool)pool != p) return false;
  /* "The specified memory pool may be from a device different than that of the specified
   * stream": the pool decides, so a stream of another context gets the driver (the allocator
   * serving such a stream is its own device's). */
  if (!made_stream(stream)) return true;
  int sidx = stream_index(stream);
  return sidx >= 0 && table[sidx].device == d;
}

void wl__serve_set_pool(int device, void *pool) {
  if (device < 0 || device >= MAX_DEVICES) return;
  CUmemoryPool p = default_of(device);
  __atomic_store_n(&current_pool[device], (CUmemoryPool)pool == p ? NULL : (CUmemoryPool)pool,
                   __ATOMIC_RELEASE);
  if ((CUmemoryPool)pool != p) __atomic_store_n(&pool_ever_set, 1, __ATOMIC_RELEASE);
}

/* cuMemAllocAsync takes the device's current pool: served while that is the default one. One the
 * program set stops being current when destroyed ("sets the default mempool ... as the current"),
 * so while one is set the driver is asked which is current. */
bool wl__serve_current_pool(void) {
  if (WL_LIKELY(!__atomic_load_n(&pool_ever_set, __ATOMIC_ACQUIRE))) return true; /* one load */
  int d = wl__current_primary();
  if (d < 0 || d >= MAX_DEVICES) return true; /* serving decides (a context of the program's) */
  if (WL_LIKELY(!__atomic_load_n(&current_pool[d], __ATOMIC_ACQUIRE))) return true;
  __typeof__(&cuDeviceGetMemPool) get = REAL(cuDeviceGetMemPool);
  CUmemoryPool cur = NULL;
  if (!get || get(&cur, d) != CUDA_SUCCESS || cur != default_of(d)) return false;
  __atomic_store_n(&current_pool[d], NULL, __ATOMIC_RELEASE);
  return true;
}

int wl__context_device(CUcontext ctx) {
  __typeof__(&cuCtxGetDevice_v2) getdev2 = REAL(cuCtxGetDevice_v2);
  __typeof__(&cuCtxGetCurrent) getcur = REAL(cuCtxGetCurrent);
  __typeof__(&cuCtxSetCurrent) setcur = REAL(cuCtxSetCurrent);
  __typeof__(&cuCtxGetDevice) getdev = REAL(cuCtxGetDevice);
  CUdevice d = -1;
  if (getdev2) return getdev2(&d, ctx) == CUDA_SUCCESS ? (int)d : -1;
  /* Drivers before 12.8: made current for the question (the top of the thread's stack, put
   * back after). */
  CUcontext prev = NULL;
  if (!getcur || !setcur || !getdev || getcur(&prev) != CUDA_SUCCESS) return -1;
  if (setcur(ctx) != CUDA_SUCCESS) return -1;
  if (getdev(&d) != CUDA_SUCCESS) d = -1;
  setcur(prev);
  return (int)d;
}

void wl__serve_grant(int owner, int peer) {
  if (owner < 0 || owner >= MAX_DEVICES || peer < 0 || peer >= 32 || owner == peer) return;
  pthread_mutex_lock(&table_lock);
  bool fresh = !(granted[owner] & 1u << peer);
  granted[owner] |= 1u << peer;
  int idx = wl__serve_index(owner);
  wl_alloc_t *a = idx >= 0 ? table[idx].alloc : NULL;
  int rc = fresh && a ? wl_alloc_grant(a, peer) : 0;
  pthread_mutex_unlock(&table_lock);
  if (rc)
    wl__warn("device %d's served memory cannot be opened to device %d (%s): its kernels will not "
             "reach it",
             owner, peer, strerror(-rc));
}

/* The devices cuMemPoolSetAccess opens a default pool to: that device's served memory too (the
 * default pool's allocations are served). */
void wl__serve_pool_access(void *pool, const CUmemAccessDesc *map, size_t count) {
  __typeof__(&cuDeviceGetCount) count_fn = REAL(cuDeviceGetCount);
  int n = 0;
  if (!pool || !map || !count_fn || count_fn(&n) != CUDA_SUCCESS) return;
  for (int owner = 0; owner < n && owner < MAX_DEVICES; owner++) {
    if (default_of(owner) != (CUmemoryPool)pool) continue;
    for (size_t i = 0; i < count; i++)
      if (map[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
          map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
        wl__serve_grant(owner, map[i].location.id);
  }
}

/* Before the program destroys a context it created: every thread looks at its current context
 * again, and no primary is known by its address (a new context may get the old one's). */
void wl__serve_ctx_destroy(CUcontext ctx) {
  for (int d = 0; d < MAX_DEVICES; d++) {
    CUcontext seen = ctx;
    __atomic_compare_exchange_n(&primary_seen[d], &seen, NULL, false, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
  }
  __atomic_add_fetch(&generation, 1, __ATOMIC_RELAXED);
}

/* The driver refused a VMM call for a reason other than memory (a sandbox without VMM support,
 * a driver fault): serving would fail every allocation the driver itself can make, so the
 * device's allocations pass through from now on. What was served is still freed by liballoc. */
static void stop_serving(int idx, const wl_alloc_failure_t *f) {
  pthread_mutex_lock(&table_lock);
  bool first = !table[idx].failed;
  __atomic_store_n(&table[idx].failed, true, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&table_lock);
  __atomic_add_fetch(&generation, 1, __ATOMIC_RELAXED);
  if (first)
    wl__error("device %d: the VMM allocator failed (%s, %s); passing this device's allocations "
              "through from now on (booked in the memory budget)",
              table[idx].device, f->what, strerror(-f->error));
}

int wl__serve_alloc(size_t size, void *stream, bool sync, uintptr_t *out) {
  int idx = current_index();
  if (idx < 0) return 0;
  if (!sync && made_stream(stream)) {
    /* Another context's stream: its device's allocator, unless that device's pool is one of
     * the program's (the driver's then); a created context's stream: the driver's. */
    int sidx = stream_index(stream);
    if (WL_UNLIKELY(sidx != idx)) {
      if (sidx < 0 || __atomic_load_n(&current_pool[table[sidx].device], __ATOMIC_RELAXED))
        return 0;
      idx = sidx;
    }
  }
  wl_alloc_t *a = table[idx].alloc;
  bool gate = wl__mode() == WL__MODE_GATE;
  /* Before the memory is taken: an allocation that begins an iteration waits for the token
   * here, or the new iteration's first activations would rise outside it. */
  if (gate) wl__gate_before_alloc(size, stream);
  void *p = wl_alloc_async(a, size, sync ? SYNC_STREAM : alloc_stream(stream));
  if (WL_UNLIKELY(!p)) {
    wl_alloc_failure_t f;
    bool known = wl_alloc_last_failure(&f) == 0;
    if (known && f.error == -EINVAL) return 0; /* e.g. a stream we cannot use */
    /* Refused during a stream capture (not for good, and not the VMM's fault): the driver
     * answers this one, serving goes on. */
    if (known && f.error == -EAGAIN) return 0;
    if (known && f.error != -ENOMEM && f.error != -ETIMEDOUT) {
      stop_serving(idx, &f);
      return 0;
    }
    char line[256], h[160];
    holders(table[idx].device, h, sizeof h);
    if (known && wl_alloc_failure_format(&f, line, sizeof line) >= 0)
      wl__error("out of memory: %s%s; returning the CUDA out-of-memory error", line, h);
    else
      wl__error("out of memory: cannot allocate %zu bytes; returning the CUDA out-of-memory "
                "error",
                size);
    wl__count(WL__ST_OOMS, 1);
    return -ENOMEM;
  }
  wl__count(WL__ST_SERVED, 1);
  /* The phase detector wants the size of each free (gate mode), a reset the synchronous
   * allocations. */
  if (sync) __atomic_add_fetch(&table[idx].sync_live, 1, __ATOMIC_RELAXED);
  if (gate || sync)
    wl__map_put(wl__ptrs, (uintptr_t)p, size,
                WL__K_SERVED | ((unsigned)idx << 8) | (sync ? WL__SERVED_SYNC : 0));
  *out = (uintptr_t)p;
  return 1;
}

int wl__serve_index(int device) {
  int n = __atomic_load_n(&table_n, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (table[i].device == device) return i;
  return -1;
}

/* The synchronous allocations' blocks were freed by the accounting's sweep (wl__serve_free,
 * their exports with them); what is left is stream-ordered memory, which the reset does not
 * free: the allocator stays, and only the streams and events go. */
void wl__serve_reset(int device) {
  int idx = wl__serve_index(device);
  wl_alloc_t *a = idx >= 0 ? __atomic_load_n(&table[idx].alloc, __ATOMIC_ACQUIRE) : NULL;
  if (a) wl_alloc_abandon_streams(a);
  /* The device's streams are gone: their handles may name new streams next. */
  __atomic_add_fetch(&generation, 1, __ATOMIC_RELAXED);
}

int wl__serve_owns(uintptr_t p) {
  return range_of(p) >= 0;
}

wl_alloc_t *wl__serve_alloc_of(uintptr_t p) {
  int idx = range_of(p);
  return idx < 0 ? NULL : table[idx].alloc;
}

/* Device d has finished its work (a synchronous free's implicit synchronisation), from any
 * context. */
void wl__device_synchronize(int d) {
  __typeof__(&cuCtxSynchronize) sync = REAL(cuCtxSynchronize);
  CUcontext prev;
  if (!sync || wl__primary_enter(d, &prev)) return;
  sync();
  wl__primary_leave(d, prev);
}

int wl__serve_free(uintptr_t p, void *stream, bool sync) {
  int idx = range_of(p);
  if (WL_LIKELY(idx < 0)) return 0;
  wl_alloc_t *a = table[idx].alloc;
  if (!a) return 0;
  uint64_t size = 0;
  unsigned kind = 0;
  bool gate = wl__mode() == WL__MODE_GATE;
  bool took = (gate || __atomic_load_n(&table[idx].sync_live, __ATOMIC_RELAXED)) &&
              wl__map_take(wl__ptrs, p, &size, &kind) == 0;
  if (took && (kind & WL__SERVED_SYNC))
    __atomic_sub_fetch(&table[idx].sync_live, 1, __ATOMIC_RELAXED);
  /* Before the free: once freed, another thread may get (and export) the same address. */
  if (WL_UNLIKELY(__atomic_load_n(&wl__ipc_nexports, __ATOMIC_RELAXED))) wl__ipc_forget(p);
  bool captures = __atomic_load_n(&wl__captures, __ATOMIC_RELAXED) != 0;
  /* cudaFree of cudaMalloc memory "may perform implicit synchronization", and programs count on
   * it (a kernel on a non-blocking stream, then cudaFree): the device finishes first, or the
   * block could go to another stream, or be unmapped, under that kernel. Not during a capture,
   * which a synchronisation would break. Stream-ordered memory freed so is the caller's to have
   * finished with ("will not perform any implicit synchronization"). */
  if (sync && took && (kind & WL__SERVED_SYNC) && !captures)
    wl__device_synchronize(table[idx].device);
  /* Freed in stream order on a default stream of another context than the block's device's
   * primary one (after cudaSetDevice, or in a created context): the order promised is on that
   * stream, which liballoc cannot record on; it waits for it here, as below. */
  CUcontext cur;
  if (!sync && !made_stream(stream) && !captures &&
      !(current_known(&cur) && tls_dev == table[idx].device + 1)) {
    __typeof__(&cuStreamSynchronize) ssync = REAL(cuStreamSynchronize);
    if (ssync && ssync((CUstream)stream) == CUDA_SUCCESS) stream = NULL;
  }
  /* Freed on a stream the allocator cannot record on (another device's, or a context the
   * program created): it waits for that stream's work here, then frees on the legacy stream,
   * whose work it needs no more. (Before, the block stayed pending for good.) Not while the
   * stream captures: liballoc's own path answers then. */
  if (made_stream(stream) && WL_UNLIKELY(stream_index(stream) != idx) &&
      !wl__stream_capturing(stream)) {
    __typeof__(&cuStreamSynchronize) ssync = REAL(cuStreamSynchronize);
    if (ssync && ssync((CUstream)stream) == CUDA_SUCCESS) {
      wl__info_once("a served block freed on a stream of another context: the free waits for "
                    "that stream's work");
      stream = NULL;
    }
  }
  if (wl_free_async(a, (void *)p, alloc_stream(stream))) {
    /* Not a live block (a double or interior free): the driver's answer for such a pointer.
     * A live block liballoc would not free (a stream it cannot use: invalid, destroyed) stays
     * allocated, and the driver answers for the stream (it refuses an invalid one before
     * looking at the pointer); before, the call was a success and the block leaked. */
    if (!wl_alloc_usable_size(a, (void *)p)) return -EINVAL;
    if (took) {
      if (kind & WL__SERVED_SYNC) __atomic_add_fetch(&table[idx].sync_live, 1, __ATOMIC_RELAXED);
      wl__map_put(wl__ptrs, p, size, kind);
    }
    return 2;
  }
  wl__count(WL__ST_SERVED_FREES, 1);
  if (gate) wl__gate_mem_event(0, size, stream);
  return 1;
}

/* Every allocator forgets the stream liballoc knows by handle (a final event covers its frees). */
static void forget_stream(void *handle) {
  int n = __atomic_load_n(&table_n, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (table[i].alloc) wl_alloc_stream_forget(table[i].alloc, handle);
}

void wl__serve_stream_destroy(void *stream) {
  /* The default streams are never destroyed (the driver refuses). */
  if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return;
  forget_stream(stream);
  __atomic_add_fetch(&generation, 1, __ATOMIC_RELAXED); /* its handle may name another next */
}

void wl__serve_live(uint64_t *live, uint64_t *peak) {
  *live = *peak = 0;
  int n = __atomic_load_n(&table_n, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (table[i].alloc) {
      wl_alloc_stats_t as;
      wl_alloc_stats_get(table[i].alloc, &as);
      *live += as.live_bytes;
      *peak += as.live_peak;
    }
}

void wl__serve_trim(void) {
  int n = __atomic_load_n(&table_n, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (table[i].alloc) wl_alloc_trim(table[i].alloc, 0);
}

/* The budget's view for the calling thread's device (its current context's, created ones
 * included: their allocations are booked too): its group's limit, less what the group uses, plus
 * what this process holds unused there. */
/* Before this process joins device's group (it joins at its first allocation there): the budget
 * libsched says the join would meet, read without joining (a query must not take one of the
 * group's roles: a launcher asking before it starts the replicas would keep one for good). 0 when
 * *limit is set, -1 when there is no budget to tell. */
static int peek_budget(int device, size_t capacity, size_t *limit, size_t *used) {
  wl_sched_config_t cfg;
  char uuid[64];
  group_config(device, capacity, &cfg, uuid, sizeof uuid);
  return wl_sched_peek(&cfg, limit, used) == 0 && *limit ? 0 : -1;
}

void wl__serve_meminfo(size_t *free_b, size_t *total_b) {
  int d = current_any_device();
  if (d < 0 || d >= MAX_DEVICES) return;
  wl_sched_t *s = __atomic_load_n(&groups[d].member, __ATOMIC_ACQUIRE);
  if (!s) {
    /* Trainers size their caches from this answer before they allocate: the budget's view
     * already, without joining. */
    size_t limit, used;
    if (peek_budget(d, *total_b, &limit, &used)) return;
    size_t total = WL_MIN(limit, *total_b);
    *free_b = WL_MIN(WL_MIN(wl__sub_sat(limit, used), *free_b), total);
    *total_b = total;
    return;
  }
  size_t limit = wl_sched_limit(s);
  if (!limit) return;
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  /* Memory we hold but do not use is free to this process. */
  size_t unused = 0;
  int idx = wl__serve_index(d);
  wl_alloc_t *a = idx >= 0 ? __atomic_load_n(&table[idx].alloc, __ATOMIC_ACQUIRE) : NULL;
  if (a) {
    wl_alloc_stats_t as;
    wl_alloc_stats_get(a, &as);
    unused = wl__sub_sat(as.physical_bytes, as.live_bytes);
  }
  size_t total = WL_MIN(limit, *total_b);
  size_t free_v = wl__sub_sat(limit, st.used) + unused;
  free_v = WL_MIN(free_v, *free_b + unused);
  *free_b = WL_MIN(free_v, total);
  *total_b = total;
}

/* Leaves the groups' accounts at exit: the token is already back (gate.c), each member's ledger
 * credit is returned here. The members themselves are never freed (wl_sched_leave): threads
 * still running, liballoc's trim thread among them, may hold them; their slots are reclaimed
 * when the process is gone and the kernel drops its locks. */
void wl__serve_at_exit(void) {
  __atomic_store_n(&budget_closed, 1, __ATOMIC_RELEASE);
  for (int d = 0; d < MAX_DEVICES; d++) {
    wl_sched_t *s = __atomic_load_n(&groups[d].member, __ATOMIC_ACQUIRE);
    if (!s) continue;
    wl_sched_publish(s, WL_PHASE_IDLE, 0);
    wl_sched_stats_t st;
    wl_sched_stats_get(s, &st);
    if (st.physical_bytes) wl_sched_release(s, st.physical_bytes);
  }
}

int wl__serve_groups(wl_sched_t **out, int cap) {
  int n = 0;
  for (int d = 0; d < MAX_DEVICES && n < cap; d++) {
    wl_sched_t *s = __atomic_load_n(&groups[d].member, __ATOMIC_ACQUIRE);
    if (!s) continue;
    int i = n++;
    for (; i > 0 && strcmp(wl_sched_group(out[i - 1]), wl_sched_group(s)) > 0; i--)
      out[i] = out[i - 1];
    out[i] = s;
  }
  return n;
}

/* Each group's stats (the first one's is the gate's). */
void wl__serve_report(void (*out)(void *, const char *), void *arg) {
  wl_sched_t *first = __atomic_load_n(&wl__member, __ATOMIC_ACQUIRE);
  if (first) wl_sched_stats_print(first, out, arg, 0);
  for (int d = 0; d < MAX_DEVICES; d++) {
    wl_sched_t *s = __atomic_load_n(&groups[d].member, __ATOMIC_ACQUIRE);
    if (s && s != first) wl_sched_stats_print(s, out, arg, 0);
  }
}

void wl__serve_fork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&table_lock, &fresh, sizeof fresh);
  memset(table, 0, sizeof table);
  memset(primary_seen, 0, sizeof primary_seen);
  memset(groups, 0, sizeof groups);
  memset(default_pool, 0, sizeof default_pool);
  memset(current_pool, 0, sizeof current_pool);
  memset(granted, 0, sizeof granted);
  pool_ever_set = 0;
  __atomic_store_n(&nranges, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&table_n, 0, __ATOMIC_RELEASE);
  __atomic_add_fetch(&generation, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&wl__member, NULL, __ATOMIC_RELEASE);
  budget_closed = 0;
}
