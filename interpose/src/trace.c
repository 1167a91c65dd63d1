/* The trace of this process (WAVELET_TRACE): libwltrace's writer, opened at init, flushed every
 * 100 ms by its thread (so a killed process leaves a readable file) and finished at exit. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

wl_trace_writer_t *wl__trace;
/* The writer finished at exit: never freed, because a thread still running then may have loaded
 * it a moment before and emit into it (a no-op once finished). */
static wl_trace_writer_t *finished;

void wl__trace_ev(uint16_t kind, uint16_t aux, uint64_t addr, uint64_t size, uint64_t arg) {
  wl_trace_writer_t *w = wl__tracer();
  if (w) wl_trace_emit_rec(w, kind, aux, addr, size, arg);
}

/* The trainer's markers (wl_iteration_begin, ...: exported by this library, libsched's) as
 * MARKER events in trace and alloc modes, which write no phase events: a trace then has its
 * iterations from the markers, the analysis's strongest source. Not in gate mode: its phase
 * events carry the markers' iterations already, and begin where the gate is entered (the next
 * allocation), while a marker comes earlier: a launch between the two would start a rising phase
 * before the grant and look like an overlap with the replica holding the token. */
static void on_marker(int kind) {
  /* Only in the modes named: the hook is set while init runs, before the mode is published
   * (-1 then), and a marker from another thread in that window must not reach a gate-mode trace. */
  int mode = __atomic_load_n(&wl__mode_now, __ATOMIC_ACQUIRE);
  if (mode != WL__MODE_TRACE && mode != WL__MODE_ALLOC) return;
  uint16_t aux = kind == WL_PEV_MARK_ITER_BEGIN ? WL_TRACE_MARK_ITER_BEGIN
                 : kind == WL_PEV_MARK_BACKWARD ? WL_TRACE_MARK_BACKWARD
                 : kind == WL_PEV_MARK_ITER_END ? WL_TRACE_MARK_ITER_END
                                                : 0;
  if (aux) wl__trace_ev(WL_TRACE_MARKER, aux, 0, 0, 0);
}

/* "%p" in the path becomes the process id. */
static void expand(const char *in, char *out, size_t cap) {
  size_t o = 0;
  for (const char *p = in; *p && o + 1 < cap; p++) {
    if (p[0] == '%' && p[1] == 'p') {
      o += (size_t)snprintf(out + o, cap - o, "%d", (int)getpid());
      if (o >= cap) o = cap - 1;
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = 0;
}

int wl__trace_open(void) {
  char path[sizeof wl__opts.trace + 32];
  expand(wl__opts.trace, path, sizeof path);
  wl_trace_writer_config_t cfg;
  wl_trace_writer_config_default(&cfg);
  cfg.path = path;
  cfg.flush_interval_ms = 100;
  cfg.header.role = wl__opts.sched.role;
  cfg.header.waves = wl__opts.mode >= WL__MODE_ALLOC ? wl__opts.sched.waves : 0;
  if (wl__opts.sched.mem_limit != WL_SCHED_MEM_DEFAULT)
    cfg.header.mem_limit = wl__opts.sched.mem_limit;
  gethostname(cfg.header.host, sizeof cfg.header.host - 1);
  wl_trace_writer_t *w = NULL;
  int rc = wl_trace_writer_open(&w, &cfg);
  if (rc == -EBUSY) {
    /* Another live process writes that path (a WAVELET_TRACE without %p, inherited by several
     * processes): this one's trace goes beside it, and the first one's is left whole. */
    char alt[sizeof path];
    int n = snprintf(alt, sizeof alt, "%s.%d", path, (int)getpid());
    if (n > 0 && (size_t)n < sizeof alt) {
      wl__warn("the trace %s is being written by another live process: this one writes %s (a "
               "%%p in WAVELET_TRACE gives each process its own)",
               path, alt);
      cfg.path = alt;
      rc = wl_trace_writer_open(&w, &cfg);
      if (!rc) memcpy(path, alt, (size_t)n + 1);
    }
  }
  if (rc) {
    wl__error("cannot write the trace to %s: %s; no trace", path, strerror(-rc));
    return rc;
  }
  __atomic_store_n(&wl__trace, w, __ATOMIC_RELEASE);
  wl_sched_set_marker_hook(on_marker);
  wl__debug("tracing to %s", path);
  return 0;
}

void wl__trace_close(void) {
  wl_trace_writer_t *w = __atomic_exchange_n(&wl__trace, NULL, __ATOMIC_ACQ_REL);
  if (!w) return;
  __atomic_store_n(&finished, w, __ATOMIC_RELEASE);
  /* Finish, not close: the memory stays for emits that loaded the writer before it was taken
   * away (they become no-ops); no wait, no use after free. */
  int rc = wl_trace_writer_finish(w);
  wl_trace_writer_stats_t st;
  wl_trace_writer_stats(w, &st);
  if (rc) wl__error("the trace could not be written completely: %s", strerror(-rc));
  if (st.dropped)
    wl__warn("the trace dropped %llu of %llu events (rings full)", (unsigned long long)st.dropped,
             (unsigned long long)st.events);
}
