/* libwavelet.so's process state: lazy initialisation from any entry point, the real entry points
 * (resolved without ever reaching our own hooks), fork and exit handling, and the stats. */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__thread wl__tls_t wl__tls __attribute__((tls_model("initial-exec")));
__thread wl__stats_t *wl__st __attribute__((tls_model("initial-exec")));

int wl__mode_now = -1;
int wl__exiting;
wl__dlsym_fn wl__real_dlsym;

void *wl__real_fn[WL__H_COUNT];

const char *const wl__hook_name[WL__H_COUNT] = {
#define WL__NAME(n) [WL__H_##n] = #n,
    WL__DRV_HOOKS(WL__NAME) WL__RT_HOOKS(WL__NAME) WL__NCCL_HOOKS(WL__NAME)
        WL__DRV_PRIVATE(WL__NAME)
#undef WL__NAME
};

/* ---- the real dlsym --------------------------------------------------------------------------*/

/* dlvsym is never hooked, so asking it for dlsym cannot come back to us. The versions: glibc
 * 2.34 moved dlsym into libc (GLIBC_2.34); before, x86-64 had GLIBC_2.2.5 and aarch64
 * GLIBC_2.17; i386 GLIBC_2.0. */
WL_NO_SANITIZE void wl__real_dlsym_init(void) {
  if (__atomic_load_n(&wl__real_dlsym, __ATOMIC_ACQUIRE)) return;
  static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
  void *p = NULL;
  for (size_t i = 0; !p && i < sizeof versions / sizeof versions[0]; i++)
    p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
  if (!p) p = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
  if (!p) return; /* wl__dlsym_policy then forwards nothing (see dlsym.c) */
  __atomic_store_n(&wl__real_dlsym, (wl__dlsym_fn)p, __ATOMIC_RELEASE);
}

/* ---- real entry points -----------------------------------------------------------------------*/

static void *drv_lib;                    /* our handle on libcuda.so.1 (NODELETE) */
static unsigned char tried[WL__H_COUNT]; /* driver names: looked up once libcuda was loaded */

static bool is_driver(wl__hook_id_t id) {
  return id < WL__H_DRV_END || id > WL__H_NCCL_END;
}

/* A library the process has already loaded, by one of its names; NULL when none is. */
static void *loaded(const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    if (h) return h; /* kept: the reference is harmless and saves lookups */
  }
  return NULL;
}

/* The library an entry point we call comes from stays loaded: the pointer is cached, and a
 * program that dlcloses that library (and loads it again elsewhere) must not leave us calling
 * into unmapped code (wl-ip-reload crashed in trace mode before). A dlopen of a loaded object
 * only counts it up; the program's own dlclose then leaves it mapped until exit, as the
 * references loaded() keeps already did for libraries found by name. */
static void pin_object(const void *p, int flags) {
  Dl_info di;
  if (!p || !dladdr(p, &di) || !di.dli_fname || !di.dli_fname[0]) return; /* "": the program */
  (void)dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD | flags);
}

void *wl__real_slow(wl__hook_id_t id) {
  if (id >= WL__H_COUNT) return NULL;
  void *p = __atomic_load_n(&wl__real_fn[id], __ATOMIC_ACQUIRE);
  if (p) return p;
  wl__real_dlsym_init();
  if (!wl__real_dlsym) return NULL;
  const char *name = wl__hook_name[id];
  if (!name) return NULL; /* a list boundary, not a name */
  if (is_driver(id)) {
    void *h = __atomic_load_n(&drv_lib, __ATOMIC_ACQUIRE);
    if (!h) {
      static const char *const so[] = {"libcuda.so.1", "libcuda.so"};
      h = loaded(so, 2);
    }
    if (h) p = wl__real_dlsym(h, name);
    if (!p) p = wl__real_dlsym(RTLD_NEXT, name);
    if (h) __atomic_store_n(&tried[id], 1, __ATOMIC_RELAXED);
  } else if (id < WL__H_RT_END) {
    p = wl__real_dlsym(RTLD_NEXT, name);
    if (!p) {
      /* A runtime loaded with RTLD_LOCAL (Python extensions) is not in the global scope. */
      static const char *const so[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                       "libcudart.so"};
      void *h = loaded(so, 4);
      if (h) p = wl__real_dlsym(h, name);
    }
  } else {
    p = wl__real_dlsym(RTLD_NEXT, name);
    if (!p) {
      static const char *const so[] = {"libnccl.so.2", "libnccl.so"};
      void *h = loaded(so, 2);
      if (h) p = wl__real_dlsym(h, name);
    }
  }
  if (p == wl__wrapper_fn[id]) p = NULL; /* never our own wrapper */
  if (p) {
    pin_object(p, 0);
    __atomic_store_n(&wl__real_fn[id], p, __ATOMIC_RELEASE);
  }
  return p;
}

void *wl__real_by_name(const char *name) {
  for (unsigned i = 0; i < WL__H_COUNT; i++)
    if (wl__hook_name[i] && !strcmp(wl__hook_name[i], name)) return wl__real(i);
  wl__real_dlsym_init();
  if (!wl__real_dlsym) return NULL;
  void *h = __atomic_load_n(&drv_lib, __ATOMIC_ACQUIRE);
  void *p = h ? wl__real_dlsym(h, name) : NULL;
  if (!p) p = wl__real_dlsym(RTLD_NEXT, name);
  if (wl__wrap_ptr(p) != p) return NULL; /* never one of our wrappers */
  pin_object(p, 0);                      /* callers keep it */
  return p;
}

void *wl__real_rt_by_name(const char *name) {
  wl__real_dlsym_init();
  if (!wl__real_dlsym) return NULL;
  void *p = wl__real_dlsym(RTLD_NEXT, name);
  if (!p) {
    static const char *const so[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                     "libcudart.so"};
    void *h = loaded(so, 4);
    if (h) p = wl__real_dlsym(h, name);
  }
  pin_object(p, 0); /* callers keep it (the gate's cudaFuncGetName) */
  return p;
}

void *wl__wrap_ptr(void *p) {
  if (!p) return p;
  for (unsigned i = 0; i < WL__H_DRV_END; i++) {
    void *r = __atomic_load_n(&wl__real_fn[i], __ATOMIC_ACQUIRE);
    if (!r && !__atomic_load_n(&tried[i], __ATOMIC_RELAXED)) r = wl__real_slow(i);
    if (r == p) return wl__wrapper_fn[i];
  }
  return p;
}

void *wl__wrap_entry(const char *sym, void *p) {
  void *w = wl__wrap_ptr(p);
  if (w != p) {
    wl__count(WL__ST_PROCADDR, 1);
    return w;
  }
  if (!p || !sym) return p;
  /* An exported entry point we do not hook (an older variant): nothing to see there. */
  Dl_info di;
  if (dladdr(p, &di) && di.dli_sname && di.dli_saddr == p) return p;
  size_t n = strlen(sym);
  for (unsigned i = 0; i < WL__H_DRV_END; i++) {
    const char *h = wl__hook_name[i];
    if (!h || strncmp(h, sym, n) || (h[n] && h[n] != '_')) continue;
    wl__count(WL__ST_PROCADDR_UNSEEN, 1);
    static uint8_t said[WL__H_DRV_END];
    if (!__atomic_exchange_n(&said[i], 1, __ATOMIC_RELAXED))
      wl__warn("the driver answered %s with %p, which is none of its exported entry points: calls "
               "through it are not seen",
               sym, p);
    break;
  }
  return p;
}

/* ---- threads ---------------------------------------------------------------------------------*/

uint32_t wl__tid_slow(void) {
  uint32_t t = (uint32_t)gettid();
  wl__tls.tid = t;
  return t;
}

/* ---- stats -----------------------------------------------------------------------------------*/

#define STAT_BLOCKS 4096
static wl__stats_t stat_blocks[STAT_BLOCKS];
static unsigned stat_next;

wl__stats_t *wl__stats_slow(void) {
  unsigned i = __atomic_fetch_add(&stat_next, 1, __ATOMIC_RELAXED);
  /* Past the pool, threads share the last block (their counts may race: stats only). */
  wl__stats_t *s = &stat_blocks[i < STAT_BLOCKS ? i : STAT_BLOCKS - 1];
  wl__st = s;
  return s;
}

void wl__stats_sum(uint64_t out[WL__ST_COUNT]) {
  memset(out, 0, sizeof(uint64_t) * WL__ST_COUNT);
  unsigned n = __atomic_load_n(&stat_next, __ATOMIC_RELAXED);
  if (n > STAT_BLOCKS) n = STAT_BLOCKS;
  for (unsigned i = 0; i < n; i++)
    for (unsigned k = 0; k < WL__ST_COUNT; k++)
      out[k] += __atomic_load_n(&stat_blocks[i].v[k], __ATOMIC_RELAXED);
}

static const char *const stat_names[WL__ST_COUNT] = {
    [WL__ST_ALLOCS] = "device allocations",
    [WL__ST_FREES] = "device frees",
    [WL__ST_UNTRACKED_FREES] = "frees of unknown pointers",
    [WL__ST_SERVED] = "served by liballoc",
    [WL__ST_SERVED_FREES] = "freed to liballoc",
    [WL__ST_OOMS] = "out-of-memory returns",
    [WL__ST_HOST_ALLOCS] = "pinned host allocations",
    [WL__ST_HOST_FREES] = "pinned host frees",
    [WL__ST_VMM_CREATES] = "cuMemCreate",
    [WL__ST_VMM_RELEASES] = "cuMemRelease",
    [WL__ST_LAUNCHES] = "kernel launches",
    [WL__ST_GRAPH_LAUNCHES] = "graph launches",
    [WL__ST_GATE_ENTERS] = "gate entries",
    [WL__ST_GATE_WAIT_NS] = "gate wait (ns)",
    [WL__ST_GATE_RELEASES] = "gate releases",
    [WL__ST_GATE_SKIPPED_NCCL] = "gate skipped in NCCL",
    [WL__ST_GATE_SKIPPED_CAPTURE] = "gate skipped in capture",
    [WL__ST_BUDGET_WAITS] = "memory budget waits",
    [WL__ST_BUDGET_WAIT_NS] = "memory budget wait (ns)",
    [WL__ST_NCCL_GRAPHS] = "graphs captured with NCCL",
    [WL__ST_NCCL_EXECS] = "NCCL graphs instantiated",
    [WL__ST_NCCL_GRAPHS_FOUND] = "graphs inspected with NCCL",
    [WL__ST_NCCL_EXEC_UPDATES] = "NCCL graph updates",
    [WL__ST_PROCADDR] = "cuGetProcAddress answers",
    [WL__ST_PROCADDR_UNSEEN] = "answers we cannot wrap",
    [WL__ST_DLSYM] = "dlsym answers",
    [WL__ST_PASSTHROUGH] = "passed through (nested)",
    [WL__ST_IPC_EXPORTS] = "CUDA IPC exports",
    [WL__ST_IPC_OPENS] = "CUDA IPC opens",
    [WL__ST_RESETS] = "device resets",
    [WL__ST_CTX_DESTROYS] = "contexts destroyed",
};

static const char *const kind_names[WL__K_COUNT] = {
    [WL__K_DEVICE] = "device", [WL__K_ASYNC] = "async",        [WL__K_MANAGED] = "managed",
    [WL__K_PITCH] = "pitch",   [WL__K_HOST] = "pinned",        [WL__K_VMM] = "vmm handles",
    [WL__K_SERVED] = "served", [WL__K_MAPPING] = "vmm mapped", [WL__K_IMPORTED] = "vmm imported"};

static void out_stderr(void *arg, const char *text) {
  (void)arg;
  dprintf(2, "wavelet:   %s", text);
}

void wl__stats_report(void) {
  uint64_t v[WL__ST_COUNT], live[WL__K_COUNT], peak[WL__K_COUNT];
  wl__stats_sum(v);
  wl__map_live(live, peak);
  wl__serve_live(&live[WL__K_SERVED], &peak[WL__K_SERVED]);
  int fd = 2;
  dprintf(fd, "wavelet: stats (pid %d, mode %s)\n", (int)getpid(),
          wl__mode_name(__atomic_load_n(&wl__mode_now, __ATOMIC_RELAXED)));
  for (unsigned k = 0; k < WL__ST_COUNT; k++)
    dprintf(fd, "wavelet:   %-28s %20llu\n", stat_names[k], (unsigned long long)v[k]);
  dprintf(fd, "wavelet:   %-28s %20s %20s\n", "live bytes by kind", "now", "peak");
  for (unsigned k = 1; k < WL__K_COUNT; k++)
    dprintf(fd, "wavelet:   %-28s %20llu %20llu\n", kind_names[k], (unsigned long long)live[k],
            (unsigned long long)peak[k]);
  wl__pinned_report();
  wl__serve_report(out_stderr, NULL);
}

/* ---- init, fork, exit ------------------------------------------------------------------------*/

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool hooks_registered;
static bool forked_child;

static void at_exit(void);
static void fork_child(void);

static int do_init(void) {
  wl__real_dlsym_init();
  wl__opts_load();
  wl__opts_print();
  int mode = wl__opts.mode;
  if (!wl__real_dlsym) {
    wl__error("cannot find the real dlsym; passing every call through");
    return WL__MODE_OFF;
  }
  if (mode != WL__MODE_OFF) {
    /* NODELETE: the driver starts threads; it must never be unmapped under them. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h) __atomic_store_n(&drv_lib, h, __ATOMIC_RELEASE);
    for (unsigned i = 0; i < WL__H_COUNT; i++)
      if (is_driver(i)) wl__real_slow(i);
  }
  if (!hooks_registered) {
    hooks_registered = true;
    /* Loaded by dlopen rather than preloaded, we stay mapped from here on: our threads, this
     * handler and the entry points we answered with (dlsym, cuGetProcAddress) outlive the
     * program's dlclose. (A preloaded library is never unloaded anyway.) */
    pin_object((const void *)do_init, RTLD_NODELETE);
    atexit(at_exit);
  }
  if (mode != WL__MODE_OFF && wl__opts.trace[0] && (!forked_child || strstr(wl__opts.trace, "%p")))
    wl__trace_open();
  if (mode >= WL__MODE_ALLOC && !forked_child) wl__pinned_setup();
  wl__debug("initialised in mode %s (pid %d)", wl__mode_name(mode), (int)getpid());
  return mode;
}

/* At load, before any thread can be inside a hook: registered lazily (at the first hooked
 * call), a fork on another thread could run its prepare handlers meanwhile, and glibc runs in the
 * child only the handlers that existed when the prepare phase began; that child then found
 * init_lock held for good by the initialising thread and waited 5 s in every hooked call. */
__attribute__((constructor)) static void register_fork_handler(void) {
  pthread_atfork(NULL, NULL, fork_child);
}

int wl__init_slow(void) {
  if (wl__tls.in_init) return WL__MODE_OFF; /* a call made by our own init: pass it through */
  int m = __atomic_load_n(&wl__mode_now, __ATOMIC_ACQUIRE);
  if (m >= 0) return m;
  wl__tls.in_init = 1;
  /* Another thread initialising for long (it waits on something that waits on us) must not
   * hang this one: after a while this call passes through. */
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 5;
  if (pthread_mutex_timedlock(&init_lock, &dl) != 0) {
    wl__warn_once("initialisation by another thread takes too long; passing calls through");
    wl__tls.in_init = 0;
    return WL__MODE_OFF;
  }
  m = __atomic_load_n(&wl__mode_now, __ATOMIC_ACQUIRE);
  if (m < 0) {
    m = do_init();
    __atomic_store_n(&wl__mode_now, m, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&init_lock);
  wl__tls.in_init = 0;
  return m;
}

/* The child re-initialises on its first hooked call; what belonged to the parent (its trace
 * file, allocator, group membership, gate) is dropped, never used or freed here. */
static void fork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&init_lock, &fresh, sizeof fresh);
  forked_child = true;
  wl__exiting = 0;
  __atomic_store_n(&wl__trace, NULL, __ATOMIC_RELEASE);
  wl__map_fork_child();
  wl__serve_fork_child();
  wl__gate_fork_child();
  wl__graph_fork_child();
  wl__capture_fork_child();
  wl__ipc_fork_child();
  wl__pinned_child();
  __atomic_store_n(&wl__mode_now, -1, __ATOMIC_RELEASE);
}

/* Runs while other threads may still call hooks: nothing here frees what they may read. First
 * the gate stops (no thread can take the token again), then the token and the ledger credit go
 * back to the group, then the trace is finished (its memory kept: late emits are no-ops). Hooks
 * called after this (other atexit handlers, the runtime's teardown) pass through the same way. */
static void at_exit(void) {
  int m = __atomic_load_n(&wl__mode_now, __ATOMIC_ACQUIRE);
  if (m < 0) return;
  __atomic_store_n(&wl__exiting, 1, __ATOMIC_RELEASE);
  wl__gate_at_exit();
  if (wl__opts.show_stats) wl__stats_report();
  wl__serve_at_exit();
  wl__trace_close();
}
