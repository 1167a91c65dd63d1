/* The trace writer: a lock-free single-producer ring per thread, drained by one flusher at a
 * time that merges the rings into time order and appends checksummed blocks to the file. The
 * rings live in a shared mapping of PATH.rings, so the events of a killed process stay in the
 * page cache for the reader to recover (rings.h). */
#include "internal.h"
#include "log.h"
#include "rings.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define RING_DEFAULT 8192u
#define RING_MAX     WL__RINGS_MAX_EVENTS

typedef wl__ring_t ring_t;

/* Bumped in every child of fork(2): a writer belongs to the process that opened it. */
static _Atomic unsigned fork_epoch;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t tsc_lock = PTHREAD_MUTEX_INITIALIZER;
static void forget_ring(void);
static void reg_prepare(void);
static void reg_parent(void);
static void reg_child(void);
static void in_child(void) {
  reg_child();
  atomic_fetch_add_explicit(&fork_epoch, 1, memory_order_relaxed);
  forget_ring(); /* so the emit path's ring lookup takes the slow path, which checks the epoch */
  /* The parent's flusher may have held it: the child's flushers must still re-anchor. */
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&tsc_lock, &fresh, sizeof fresh);
}
static void atfork_init(void) {
  pthread_atfork(reg_prepare, reg_parent, in_child);
}

struct wl_trace_writer_s {
  uint64_t id;                        /* never 0, never reused in this process (tl_ring) */
  struct wl_trace_writer_s *reg_next; /* the open writers (reg_head), under reg_lock */
  int fd, own_fd, inline_flush;
  unsigned epoch; /* fork_epoch at open */
  uint64_t origin;
  size_t ring_events;
  pthread_key_t key;

  /* The rings file (PATH.rings), or rf == NULL: rings on the heap, nothing to recover. */
  wl__rings_header_t *rf; /* mapping of the header and the string journal */
  size_t rf_map_bytes;
  int rf_fd;
  char *rf_path;
  uint32_t *free_slots; /* slots of retired rings, for reuse */
  size_t nfree, free_cap;
  const uint64_t *fl_pos; /* during a flush: each ring's next event, for the commit */

  pthread_mutex_t rings_lock; /* the ring list */
  ring_t **rings;
  size_t nrings, rings_cap;
  uint64_t retired_events, retired_dropped; /* of rings already freed */

  pthread_mutex_t flush_lock; /* one flusher at a time; guards everything below */
  uint8_t *block;             /* WL_TRACE_BLOCK_HEADER + WL__WRITE_PAYLOAD */
  size_t fill;
  uint32_t nrec;
  uint64_t seq, records, blocks, bytes, flushes, lost;
  uint64_t last_time; /* latest event time written */
  size_t *heap;
  size_t heap_cap;
  int error;

  pthread_mutex_t str_lock; /* interned strings */
  char **strs;              /* by id - 1 */
  uint32_t *str_hash;       /* open addressing: id, 0 = empty */
  size_t str_hash_cap;
  uint32_t nstrings;
  uint8_t *pending; /* encoded STRING records not yet written */
  size_t pending_len, pending_cap;

  /* 0 open; 1 finishing or finished: emits are no-ops. Set before anything is written at the
   * end, so an emit racing the finish never reaches a closed file or freed memory (the memory
   * stays until wl_trace_writer_close). */
  _Atomic int closed;
  int file_done;    /* under flush_lock: the END is written and the file closed */
  size_t kick_mask; /* an emit at head % (ring/4) == 0 checks the fill and may wake the flusher */

  pthread_t thread;
  /* Read without a lock by an emit's kick, which may race the finish that clears it (a stale 1
   * only signals a condition nobody waits on). */
  _Atomic int have_thread;
  int stop, kicked;
  uint32_t interval_ms;
  pthread_mutex_t thr_lock;
  pthread_cond_t thr_cv;
};

static void ring_free(wl_trace_writer_t *w, ring_t *r);

/* The calling thread's ring of the writer it emitted to last: one TLS load instead of
 * pthread_getspecific on every event. Writers are told apart by a number never reused (a new
 * writer may get a freed one's address). */
static _Atomic uint64_t writer_ids;
static __thread struct {
  uint64_t id;
  ring_t *ring;
} tl_ring __attribute__((tls_model("initial-exec")));

static void forget_ring(void) {
  tl_ring.id = 0;
  tl_ring.ring = NULL;
}

/* At the thread's exit: its ring may be freed once drained, so this thread forgets it (an
 * event it emits later in its teardown gets a new ring). */
static void ring_dead(void *p) {
  ring_t *r = p;
  if (tl_ring.ring == r) tl_ring.id = 0;
  atomic_store_explicit(&r->dead, 1, memory_order_release);
}

void wl_trace_writer_config_default(wl_trace_writer_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->fd = -1;
  cfg->inline_flush = 1;
  cfg->rings_file = 1;
  cfg->header.role = -1;
  cfg->header.device = -1;
  cfg->header.clock = WL_TRACE_CLOCK_MONOTONIC;
}

static uint64_t now_realtime(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the event clock -------------------------------------------------------------------------
 * CLOCK_MONOTONIC nanoseconds, as the format says, but read from the TSC where the CPU has an
 * invariant one (x86-64, cpuid 0x80000007 EDX bit 8): rdtsc costs a few ns where clock_gettime
 * costs 30-90 on a VM. The TSC is converted by a line (ns0 + (tsc - tsc0) * mult >> 32) that a
 * flusher thread re-anchors against CLOCK_MONOTONIC every flush: never a step back (a line
 * ahead of the clock slows until it meets it, over the next period, then runs at the measured
 * rate; one behind steps forward), so the error stays bounded by the drift of one period. Until a
 * first period has measured the TSC's rate (or with no flusher, or elsewhere) events are stamped by
 * clock_gettime. One clock per process, shared by every writer; a seqlock guards the line, and each
 * thread converts by its own copy of it while the sequence is unchanged. */
typedef struct tsc_line_s {
  /* ns0 + d * mult >> 32 for the first dsw ticks past tsc0 (steering down to the clock), then
   * nsw + (d - dsw) * rate >> 32 (the measured rate): a line that steers never overshoots when
   * the next anchor is late. dsw is UINT64_MAX when the line does not steer. dmax: ticks past
   * tsc0 the line is trusted for (two anchor periods); later events, when the flusher is late,
   * read the clock, so a stalled flusher cannot let the line's error grow. */
  _Atomic uint64_t seq, tsc0, ns0, mult, dsw, nsw, rate, dmax;
} tsc_line_t;
static tsc_line_t tline;
static _Atomic int tsc_state;                /* 0 unknown, 1 usable, -1 not */
static uint64_t tsc_base, ns_base, tsc_last; /* under tsc_lock: the first pair, the last anchor */

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
static inline uint64_t tsc_read(void) {
  return __rdtsc();
}
static int tsc_invariant(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return 0;
  __get_cpuid(0x80000007u, &a, &b, &c, &d);
  return (d >> 8) & 1;
}
#else
static inline uint64_t tsc_read(void) {
  return 0;
}
static int tsc_invariant(void) {
  return 0;
}
#endif

/* Out of line: the emit path's common case keeps fewer registers live. */
static __attribute__((noinline, cold)) uint64_t clock_now(void) {
  return wl__now_ns();
}

/* The line's time d ticks past its anchor, for any d (the anchor's prediction of a late line). */
static inline uint64_t line_at(uint64_t d, uint64_t n0, uint64_t m, uint64_t dsw, uint64_t nsw,
                               uint64_t r) {
  if (WL_LIKELY(d <= dsw)) return n0 + (uint64_t)(((unsigned __int128)d * m) >> 32);
  return nsw + (uint64_t)(((unsigned __int128)(d - dsw) * r) >> 32);
}

/* The same for d <= dmax, where the products fit in 64 bits: dmax ticks are at most
 * WL__TSC_TRUST_MAX_NS (2.5e8) ns at the rate, and neither slope exceeds it (mult * 2^-32 ns a
 * tick), so d * slope < 2.5e8 * 2^32 < 2^60. The same value as line_at, with a 64-bit multiply. */
static inline uint64_t line_at_live(uint64_t d, uint64_t n0, uint64_t m, uint64_t dsw, uint64_t nsw,
                                    uint64_t r) {
  if (WL_LIKELY(d <= dsw)) return n0 + ((d * m) >> 32);
  return nsw + (((d - dsw) * r) >> 32);
}

/* Each thread's copy of the line, read under the sequence and tagged with it: an event compares
 * one shared word, the sequence, instead of reading eight under it, and reads the line from its
 * own thread's memory. Same line as the shared one whenever the tags match (a re-anchor moves the
 * sequence on; it never repeats). seq 0 with mult 0: no line, as the shared one starts. */
static __thread struct {
  uint64_t seq, tsc0, ns0, mult, dsw, nsw, rate, dmax;
} tl_line __attribute__((tls_model("initial-exec")));

static __attribute__((noinline, cold)) uint64_t event_now_reload(void);
static void tline_set(uint64_t t0, uint64_t n0, uint64_t mult, uint64_t dsw, uint64_t nsw,
                      uint64_t rate, uint64_t dmax);

/* The time of an event: the TSC line when it is live, else the clock. */
static inline uint64_t thread_line_time(void);
static inline uint64_t event_now(void) {
  if (WL_UNLIKELY(atomic_load_explicit(&tline.seq, memory_order_acquire) != tl_line.seq))
    return event_now_reload();
  return thread_line_time();
}

/* The time by this thread's copy of the line (the clock when there is none, or it is overdue). */
static inline uint64_t thread_line_time(void) {
  if (WL_UNLIKELY(!tl_line.mult)) return clock_now();
  int64_t d = (int64_t)(tsc_read() - tl_line.tsc0);
  if (d < 0) d = 0; /* another core's TSC a little behind the anchor: never before it */
  if (WL_UNLIKELY((uint64_t)d > tl_line.dmax)) return clock_now(); /* the anchor is overdue */
  return line_at_live((uint64_t)d, tl_line.ns0, tl_line.mult, tl_line.dsw, tl_line.nsw,
                      tl_line.rate);
}

/* The line moved on since this thread's copy: a fresh copy under the sequence (a few tries while
 * a re-anchor writes it; then the clock), and the time from it as event_now takes it. */
static uint64_t event_now_reload(void) {
  for (int tries = 0; tries < 4; tries++) {
    uint64_t s0 = atomic_load_explicit(&tline.seq, memory_order_acquire);
    uint64_t t0 = atomic_load_explicit(&tline.tsc0, memory_order_relaxed);
    uint64_t n0 = atomic_load_explicit(&tline.ns0, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&tline.mult, memory_order_relaxed);
    uint64_t dsw = atomic_load_explicit(&tline.dsw, memory_order_relaxed);
    uint64_t nsw = atomic_load_explicit(&tline.nsw, memory_order_relaxed);
    uint64_t r = atomic_load_explicit(&tline.rate, memory_order_relaxed);
    uint64_t dmax = atomic_load_explicit(&tline.dmax, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if ((s0 & 1) || atomic_load_explicit(&tline.seq, memory_order_relaxed) != s0) continue;
    tl_line.tsc0 = t0;
    tl_line.ns0 = n0;
    tl_line.mult = m;
    tl_line.dsw = dsw;
    tl_line.nsw = nsw;
    tl_line.rate = r;
    tl_line.dmax = dmax;
    tl_line.seq = s0;
    return thread_line_time();
  }
  return clock_now();
}

/* Tests only (internal.h). */
uint64_t wl__trace_clock_now(void) {
  return event_now();
}
void wl__trace_clock_set(const uint64_t line[7]) {
  tline_set(line[0], line[1], line[2], line[3], line[4], line[5], line[6]);
}
uint64_t wl__trace_line_at(uint64_t d, const uint64_t line[7], int live) {
  return live ? line_at_live(d, line[1], line[2], line[3], line[4], line[5])
              : line_at(d, line[1], line[2], line[3], line[4], line[5]);
}

/* A (tsc, ns) pair read as close together as the machine allows: the best of five. Returns
 * the window in ticks (large when the thread was preempted every time: the pair is then not
 * used). */
static uint64_t tsc_pair(uint64_t *tsc, uint64_t *ns) {
  uint64_t best = UINT64_MAX;
  *tsc = *ns = 0;
  for (int i = 0; i < 5; i++) {
    uint64_t a = tsc_read(), n = wl__now_ns(), b = tsc_read();
    if (b - a < best) {
      best = b - a;
      *tsc = a + (b - a) / 2;
      *ns = n;
    }
  }
  return best;
}

static void tline_set(uint64_t t0, uint64_t n0, uint64_t mult, uint64_t dsw, uint64_t nsw,
                      uint64_t rate, uint64_t dmax) {
  uint64_t s = atomic_load_explicit(&tline.seq, memory_order_relaxed);
  atomic_store_explicit(&tline.seq, s + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&tline.tsc0, t0, memory_order_relaxed);
  atomic_store_explicit(&tline.ns0, n0, memory_order_relaxed);
  atomic_store_explicit(&tline.mult, mult, memory_order_relaxed);
  atomic_store_explicit(&tline.dsw, dsw, memory_order_relaxed);
  atomic_store_explicit(&tline.nsw, nsw, memory_order_relaxed);
  atomic_store_explicit(&tline.rate, rate, memory_order_relaxed);
  atomic_store_explicit(&tline.dmax, dmax, memory_order_relaxed);
  atomic_store_explicit(&tline.seq, s + 2, memory_order_release);
}

/* Called by the flushers: measures the TSC's rate over everything seen so far and re-anchors
 * the line. */
static void tsc_anchor(void) {
  int st = atomic_load_explicit(&tsc_state, memory_order_relaxed);
  if (st < 0) return;
  if (pthread_mutex_trylock(&tsc_lock)) return; /* another writer's flusher does it */
  if (st == 0) {
    const char *e = getenv("WAVELET_TRACE_TSC"); /* 0: the clock only (tests, odd machines) */
    if (e && strcmp(e, "0") && strcmp(e, "1")) {
      wl__warn("WAVELET_TRACE_TSC=%s: expected 0 or 1; ignored", e);
      e = NULL;
    }
    st = tsc_invariant() && !(e && e[0] == '0') ? 1 : -1;
    if (st > 0 && tsc_pair(&tsc_base, &ns_base) > 100000) st = 0; /* preempted: next time */
    atomic_store_explicit(&tsc_state, st, memory_order_relaxed);
    pthread_mutex_unlock(&tsc_lock);
    return;
  }
  uint64_t t = 0, n = 0;
  uint64_t window = tsc_pair(&t, &n);
  if (window > 100000 || t <= tsc_base || n <= ns_base ||
      n - ns_base < 50000000ull) { /* under 50 ms: the rate would be too rough */
    pthread_mutex_unlock(&tsc_lock);
    return;
  }
  /* ns per tick * 2^32 over the whole baseline: precise after a few periods. */
  double rate = (double)(n - ns_base) / (double)(t - tsc_base);
  uint64_t mult = (uint64_t)(rate * 4294967296.0);
  uint64_t cur = atomic_load_explicit(&tline.mult, memory_order_relaxed);
  if (!mult || rate > 100.0) { /* nonsense: the clock only */
    atomic_store_explicit(&tsc_state, -1, memory_order_relaxed);
    tline_set(0, 0, 0, 0, 0, 0, 0);
    pthread_mutex_unlock(&tsc_lock);
    return;
  }
  if ((double)window * rate > 20000.0) { /* a pair more than 20 us wide: not precise enough */
    pthread_mutex_unlock(&tsc_lock);
    return;
  }
  uint64_t at = n, m = mult, dsw = UINT64_MAX; /* the new line: from the clock, at the rate */
  uint64_t period = t > tsc_last && tsc_last ? t - tsc_last : (uint64_t)(1e8 / rate);
  if (cur) {
    /* The lock's holder is the only writer: the fields are read without the sequence. */
    uint64_t t0 = atomic_load_explicit(&tline.tsc0, memory_order_relaxed);
    uint64_t pred =
        line_at(t > t0 ? t - t0 : 0, atomic_load_explicit(&tline.ns0, memory_order_relaxed), cur,
                atomic_load_explicit(&tline.dsw, memory_order_relaxed),
                atomic_load_explicit(&tline.nsw, memory_order_relaxed),
                atomic_load_explicit(&tline.rate, memory_order_relaxed));
    double err = (double)n - (double)pred; /* the clock minus the line, now */
    if (err < 0 && err > -1e6) {
      /* Ahead of the clock: starting at the clock would step back, so the line starts where it
       * is and runs slower (by at most a quarter, so it never stands still) until it meets the
       * clock, one period from now, then at the rate. Behind the clock (err >= 0) it steps
       * forward to it, which no thread's events mind; far off, it starts at the clock. */
      at = pred;
      double adj = err / (double)period; /* ns per tick, negative */
      if (adj < -rate / 4) adj = -rate / 4;
      m = (uint64_t)((rate + adj) * 4294967296.0);
      dsw = (uint64_t)(err / adj);
    }
  }
  uint64_t nsw = dsw == UINT64_MAX ? at : at + (uint64_t)(((unsigned __int128)dsw * m) >> 32);
  /* Trusted for two periods (2 ms to 250 ms): past that the flusher is late and events read the
   * clock until it re-anchors, so the error stays that of the rate over two periods. */
  double dmax_ns = 2.0 * (double)period * rate;
  if (dmax_ns < 2e6) dmax_ns = 2e6;
  if (dmax_ns > WL__TSC_TRUST_MAX_NS) dmax_ns = WL__TSC_TRUST_MAX_NS; /* event_now's 64 bits */
  tline_set(t, at, m, dsw, nsw, mult, (uint64_t)(dmax_ns / rate));
  tsc_last = t;
  pthread_mutex_unlock(&tsc_lock);
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (k == 0) return -EIO;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Writes the current block, if it holds anything, and then gives its events' ring slots back
 * (the tails). Before the write, each ring's tail after it and the block's number go to the
 * rings file, so a reader after a kill knows whether this block's events are in the trace or
 * still only in the rings (rings.h). Called with flush_lock held (and rings_lock during a
 * flush). */
static void block_emit(wl_trace_writer_t *w) {
  if (!w->nrec) return;
  uint8_t *payload = w->block + WL_TRACE_BLOCK_HEADER;
  wl__block_header(w->block, payload, (uint32_t)w->fill, w->nrec, w->seq);
  const uint64_t *pos = w->fl_pos;
  if (w->rf) {
    for (size_t i = 0; pos && i < w->nrings; i++) {
      ring_t *r = w->rings[i];
      atomic_store_explicit(&r->pend_tail, pos[i], memory_order_relaxed);
      r->pend_dropped = r->dropped_seen;
    }
    atomic_store_explicit(&w->rf->pend_seq, w->seq, memory_order_release);
  }
  if (!w->error) {
    int rc = write_all(w->fd, w->block, WL_TRACE_BLOCK_HEADER + w->fill);
    if (rc) {
      w->error = rc;
      if (w->rf) atomic_store_explicit(&w->rf->broken, 1, memory_order_release);
      wl__warn("trace: writing the trace failed (%d); further events are discarded", rc);
    }
  }
  for (size_t i = 0; pos && i < w->nrings; i++) {
    ring_t *r = w->rings[i];
    r->dropped_done = r->dropped_seen;
    atomic_store_explicit(&r->tail, pos[i], memory_order_release);
  }
  if (w->rf) atomic_store_explicit(&w->rf->pend_seq, WL__RINGS_NO_SEQ, memory_order_release);
  if (w->error) {
    w->lost += w->nrec;
  } else {
    w->seq++;
    w->blocks++;
    w->records += w->nrec;
    w->bytes += WL_TRACE_BLOCK_HEADER + w->fill;
  }
  w->fill = 0;
  w->nrec = 0;
}

/* Appends len encoded bytes (one record) to the block, starting a new block when full. */
static uint8_t *block_room(wl_trace_writer_t *w, size_t len) {
  if (w->fill + len > WL__WRITE_PAYLOAD) block_emit(w);
  uint8_t *p = w->block + WL_TRACE_BLOCK_HEADER + w->fill;
  w->fill += len;
  w->nrec++;
  return p;
}

static void put_event(wl_trace_writer_t *w, const wl_trace_event_t *ev) {
  if (ev->time_ns > w->last_time) w->last_time = ev->time_ns;
  uint8_t *p = block_room(w, wl__record_bytes(ev->kind));
  wl__record_encode(ev, w->origin, p);
}

/* Heap of ring indices ordered by the time of each ring's next event. */
static uint64_t ring_next_time(ring_t *r, const uint64_t *pos) {
  return r->ev[*pos & r->mask].time_ns;
}

static void heap_down(wl_trace_writer_t *w, size_t n, size_t i, const uint64_t *pos) {
  for (;;) {
    size_t l = 2 * i + 1, m = i;
    if (l < n && ring_next_time(w->rings[w->heap[l]], &pos[w->heap[l]]) <
                     ring_next_time(w->rings[w->heap[m]], &pos[w->heap[m]]))
      m = l;
    if (l + 1 < n && ring_next_time(w->rings[w->heap[l + 1]], &pos[w->heap[l + 1]]) <
                         ring_next_time(w->rings[w->heap[m]], &pos[w->heap[m]]))
      m = l + 1;
    if (m == i) return;
    size_t t = w->heap[i];
    w->heap[i] = w->heap[m];
    w->heap[m] = t;
    i = m;
  }
}

/* Drains every ring. Called with flush_lock held. */
static void flush_locked(wl_trace_writer_t *w) {
  if (w->file_done) return; /* finished: the file is closed, late events are dropped */
  pthread_mutex_lock(&w->rings_lock);
  size_t n = w->nrings;
  if (w->heap_cap < 3 * n) {
    size_t cap = 3 * n + 16;
    size_t *h = realloc(w->heap, cap * sizeof *h);
    if (!h) {
      pthread_mutex_unlock(&w->rings_lock);
      return; /* try again next time; the rings keep their events */
    }
    w->heap = h;
    w->heap_cap = cap;
  }
  /* heap[0..n) the heap, then pos[n] and end[n] as uint64_t in the same scratch. */
  uint64_t *pos = (uint64_t *)(w->heap + n), *end = pos + n;
  w->fl_pos = pos; /* the slots a block frees are given back once it is written */
  for (size_t i = 0; i < n; i++) {
    pos[i] = atomic_load_explicit(&w->rings[i]->tail, memory_order_relaxed);
    end[i] = atomic_load_explicit(&w->rings[i]->head, memory_order_acquire);
  }
  /* Strings after the ring snapshot: every string an event in the snapshot refers to was
   * interned before that event was pushed, so it is written before the event. */
  pthread_mutex_lock(&w->str_lock);
  size_t off = 0;
  while (off < w->pending_len) {
    size_t len = 8u * w->pending[off + 1];
    memcpy(block_room(w, len), w->pending + off, len);
    off += len;
  }
  w->pending_len = 0;
  pthread_mutex_unlock(&w->str_lock);

  size_t hn = 0;
  for (size_t i = 0; i < n; i++)
    if (pos[i] != end[i]) w->heap[hn++] = i;
  for (size_t i = hn; i-- > 0;) heap_down(w, hn, i, pos);
  while (hn) {
    size_t i = w->heap[0];
    ring_t *r = w->rings[i];
    put_event(w, &r->ev[pos[i] & r->mask]);
    pos[i]++;
    if (pos[i] == end[i]) w->heap[0] = w->heap[--hn];
    heap_down(w, hn, 0, pos);
  }

  uint64_t now = event_now();
  for (size_t i = 0; i < n; i++) {
    ring_t *r = w->rings[i];
    uint64_t d = atomic_load_explicit(&r->dropped, memory_order_relaxed);
    if (d != r->dropped_seen) {
      wl_trace_event_t ev = {.time_ns = now, .kind = WL_TRACE_DROPPED, .tid = r->tid};
      ev.size = d - r->dropped_seen;
      put_event(w, &ev);
      r->dropped_seen = d;
    }
  }
  block_emit(w);
  w->fl_pos = NULL;
  /* Free the rings of exited threads once they are empty and written. */
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    ring_t *r = w->rings[i];
    if (atomic_load_explicit(&r->dead, memory_order_acquire) &&
        atomic_load_explicit(&r->head, memory_order_acquire) == pos[i] &&
        r->dropped_seen == atomic_load_explicit(&r->dropped, memory_order_relaxed)) {
      w->retired_events += pos[i];
      w->retired_dropped += r->dropped_seen;
      ring_free(w, r);
      continue;
    }
    w->rings[k++] = r;
  }
  w->nrings = k;
  pthread_mutex_unlock(&w->rings_lock);
  w->flushes++;
}

/* A ring in a slot of the rings file (reusing a retired ring's slot first), or NULL when the
 * file cannot grow. Called with rings_lock held. */
static ring_t *ring_map(wl_trace_writer_t *w) {
  uint64_t sb = w->rf->slot_bytes;
  uint32_t slot;
  int fresh = 0;
  if (w->nfree) {
    slot = w->free_slots[--w->nfree];
  } else {
    slot = atomic_load_explicit(&w->rf->nslots, memory_order_relaxed);
    if (slot >= WL__RINGS_MAX_SLOTS) return NULL;
    if (ftruncate(w->rf_fd, (off_t)(w->rf->slots_off + (uint64_t)(slot + 1) * sb))) return NULL;
    fresh = 1;
  }
  void *m = mmap(NULL, sb, PROT_READ | PROT_WRITE, MAP_SHARED, w->rf_fd,
                 (off_t)(w->rf->slots_off + (uint64_t)slot * sb));
  if (m == MAP_FAILED) {
    if (!fresh) w->free_slots[w->nfree++] = slot;
    return NULL;
  }
  ring_t *r = m;
  memset(r, 0, offsetof(ring_t, ev));
  r->slot = slot;
  if (fresh) atomic_store_explicit(&w->rf->nslots, slot + 1, memory_order_release);
  return r;
}

/* Gives a retired ring's memory back. Called with rings_lock held. */
static void ring_free(wl_trace_writer_t *w, ring_t *r) {
  if (!w->rf) {
    free(r);
    return;
  }
  atomic_store_explicit(&r->state, WL__RING_FREE, memory_order_release);
  if (w->nfree == w->free_cap) {
    size_t cap = w->free_cap ? 2 * w->free_cap : 16;
    uint32_t *f = realloc(w->free_slots, cap * sizeof *f);
    if (!f) { /* the slot stays unused: harmless */
      munmap(r, w->rf->slot_bytes);
      return;
    }
    w->free_slots = f;
    w->free_cap = cap;
  }
  w->free_slots[w->nfree++] = r->slot;
  munmap(r, w->rf->slot_bytes);
}

static __attribute__((noinline, cold)) ring_t *ring_get_slow(wl_trace_writer_t *w);

static inline ring_t *ring_get(wl_trace_writer_t *w) {
  if (WL_LIKELY(tl_ring.id == w->id)) return tl_ring.ring;
  return ring_get_slow(w);
}

static ring_t *ring_get_slow(wl_trace_writer_t *w) {
  /* A forked child would write into its parent's rings (the caller says -ECHILD). */
  if (atomic_load_explicit(&fork_epoch, memory_order_relaxed) != w->epoch) return NULL;
  ring_t *r = pthread_getspecific(w->key);
  if (WL_LIKELY(r != NULL)) {
    tl_ring.id = w->id;
    tl_ring.ring = r;
    return r;
  }
  pthread_mutex_lock(&w->rings_lock);
  if (w->nrings == w->rings_cap) {
    size_t cap = w->rings_cap ? 2 * w->rings_cap : 8;
    ring_t **nr = realloc(w->rings, cap * sizeof *nr);
    if (!nr) {
      pthread_mutex_unlock(&w->rings_lock);
      return NULL;
    }
    w->rings = nr;
    w->rings_cap = cap;
  }
  if (w->rf) {
    r = ring_map(w);
  } else {
    size_t bytes = sizeof *r + w->ring_events * sizeof r->ev[0];
    r = aligned_alloc(64, wl__round_up(bytes, 64));
    if (r) memset(r, 0, sizeof *r);
  }
  if (!r) {
    pthread_mutex_unlock(&w->rings_lock);
    return NULL;
  }
  r->mask = w->ring_events - 1;
  r->tid = (uint32_t)syscall(SYS_gettid);
  atomic_store_explicit(&r->state, WL__RING_ACTIVE, memory_order_release);
  w->rings[w->nrings++] = r;
  pthread_mutex_unlock(&w->rings_lock);
  pthread_setspecific(w->key, r);
  tl_ring.id = w->id;
  tl_ring.ring = r;
  return r;
}

/* Wakes the flusher when a ring is half full, so the producer does not flush in the common
 * case. Called once per quarter ring of events. */
static __attribute__((noinline, cold)) void kick(wl_trace_writer_t *w, ring_t *r, uint64_t head) {
  if (!atomic_load_explicit(&w->have_thread, memory_order_relaxed) ||
      head - atomic_load_explicit(&r->tail, memory_order_acquire) <= r->mask / 2)
    return;
  pthread_mutex_lock(&w->thr_lock);
  w->kicked = 1;
  pthread_cond_signal(&w->thr_cv);
  pthread_mutex_unlock(&w->thr_lock);
}

/* The ring full (the rare case): the flusher did not keep up. Flush here, or wait for the flush
 * under way (at most 10 ms: a flusher stuck in write must not hang the program), else drop. 0
 * when there is room now. */
static __attribute__((noinline, cold)) int ring_full(wl_trace_writer_t *w, ring_t *r,
                                                     uint64_t head) {
  if (w->inline_flush) {
    int locked = pthread_mutex_trylock(&w->flush_lock) == 0;
    if (!locked) {
      struct timespec dl;
      clock_gettime(CLOCK_REALTIME, &dl);
      dl.tv_nsec += 10000000;
      if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
      }
      locked = pthread_mutex_timedlock(&w->flush_lock, &dl) == 0;
    }
    if (locked) {
      if (head - atomic_load_explicit(&r->tail, memory_order_acquire) > r->mask) flush_locked(w);
      pthread_mutex_unlock(&w->flush_lock);
    }
  }
  if (head - atomic_load_explicit(&r->tail, memory_order_acquire) > r->mask) {
    atomic_store_explicit(&r->dropped, atomic_load_explicit(&r->dropped, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    return -ENOBUFS;
  }
  return 0;
}

/* The emit paths' common parts: emit_begin finds the calling thread's next slot (NULL with *rc
 * set when the event goes nowhere), the caller fills the slot, and emit_end publishes it. The
 * _rec and _launch forms store their fields straight into the slot: an event built on the stack
 * and then copied costs two store-forwarding stalls (narrow stores read back wide). */
static inline wl_trace_event_t *emit_begin(wl_trace_writer_t *w, ring_t **rp, uint64_t *headp,
                                           int *rc) {
  if (WL_UNLIKELY(atomic_load_explicit(&w->closed, memory_order_relaxed))) {
    *rc = -EPIPE; /* finished: the memory is still valid, the event goes nowhere */
    return NULL;
  }
  /* The fork check is in ring_get_slow: a child's only thread forgot its ring (in_child). */
  ring_t *r = ring_get(w);
  if (WL_UNLIKELY(!r)) {
    *rc = atomic_load_explicit(&fork_epoch, memory_order_relaxed) != w->epoch ? -ECHILD : -ENOBUFS;
    return NULL;
  }
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  if (WL_UNLIKELY(head - atomic_load_explicit(&r->tail, memory_order_acquire) > r->mask) &&
      (*rc = ring_full(w, r, head)))
    return NULL;
  /* The slots a few events on were last written a ring ago and are rarely cached: ask for them
   * now, so a burst of events does not wait for each line in turn. */
  __builtin_prefetch(&r->ev[(head + 8) & r->mask], 1, 3);
  *rp = r;
  *headp = head;
  return &r->ev[head & r->mask];
}

/* Kinds a caller may emit (STRING and END are the writer's own). */
static inline int bad_kind(unsigned kind) {
  return kind == 0 || kind == WL_TRACE_STRING || kind == WL_TRACE_END ||
         kind >= WL_TRACE_KIND_COUNT;
}

/* The time of an event stamped now: never before this thread's previous event (a re-anchored
 * line may be a few ns behind). */
static inline uint64_t stamp(ring_t *r, uint64_t head, uint64_t t) {
  uint64_t prev = head ? r->ev[(head - 1) & r->mask].time_ns : 0;
  return t > prev ? t : prev;
}

static inline void emit_end(wl_trace_writer_t *w, ring_t *r, uint64_t head) {
  /* Release: the flusher that sees the new head sees the slot. A plain store on x86. */
  atomic_store_explicit(&r->head, head + 1, memory_order_release);
  if (WL_UNLIKELY(((head + 1) & w->kick_mask) == 0)) kick(w, r, head + 1);
}

int wl_trace_emit(wl_trace_writer_t *w, const wl_trace_event_t *ev) {
  if (WL_UNLIKELY(!w || !ev || bad_kind(ev->kind))) return -EINVAL;
  int rc;
  ring_t *r;
  uint64_t head;
  wl_trace_event_t *slot = emit_begin(w, &r, &head, &rc);
  if (WL_UNLIKELY(!slot)) return rc;
  *slot = *ev;
  if (!slot->time_ns) slot->time_ns = stamp(r, head, event_now());
  if (!slot->tid) slot->tid = r->tid;
  emit_end(w, r, head);
  return 0;
}

int wl_trace_emit_rec(wl_trace_writer_t *w, unsigned kind, unsigned aux, uint64_t addr,
                      uint64_t size, uint64_t arg) {
  if (WL_UNLIKELY(!w || bad_kind(kind))) return -EINVAL;
  int rc;
  ring_t *r;
  uint64_t head;
  wl_trace_event_t *slot = emit_begin(w, &r, &head, &rc);
  if (WL_UNLIKELY(!slot)) return rc;
  uint64_t t = event_now(); /* first: the TSC read is the slowest part, the stores overlap it */
  slot->kind = (uint16_t)kind;
  slot->aux = (uint16_t)aux;
  slot->tid = r->tid;
  slot->addr = addr;
  slot->size = size;
  slot->arg = arg;
  memset(slot->grid, 0, sizeof slot->grid + sizeof slot->id);
  slot->time_ns = stamp(r, head, t);
  emit_end(w, r, head);
  return 0;
}

int wl_trace_emit_launch(wl_trace_writer_t *w, uint64_t fn, uint64_t threads, uint64_t stream,
                         const uint32_t grid[3], uint32_t id) {
  if (WL_UNLIKELY(!w)) return -EINVAL;
  int rc;
  ring_t *r;
  uint64_t head;
  wl_trace_event_t *slot = emit_begin(w, &r, &head, &rc);
  if (WL_UNLIKELY(!slot)) return rc;
  uint64_t t = event_now();
  slot->kind = WL_TRACE_LAUNCH;
  slot->aux = 0;
  slot->tid = r->tid;
  slot->addr = fn;
  slot->size = threads;
  slot->arg = stream;
  /* Each grid value read as it was stored (4 bytes): no forwarding stall. */
  slot->grid[0] = grid ? grid[0] : 0;
  slot->grid[1] = grid ? grid[1] : 0;
  slot->grid[2] = grid ? grid[2] : 0;
  slot->id = id;
  slot->time_ns = stamp(r, head, t);
  emit_end(w, r, head);
  return 0;
}

static uint32_t str_hash(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
  return h;
}

uint32_t wl_trace_intern(wl_trace_writer_t *w, const char *s) {
  if (!w || !s) return 0;
  size_t n = strnlen(s, WL_TRACE_STRING_MAX);
  uint32_t h = str_hash(s, n), id = 0;
  pthread_mutex_lock(&w->str_lock);
  /* Look up first: a string already interned keeps its id once the table is full (or cannot
   * grow); only a new one is refused. */
  for (size_t j = h & (w->str_hash_cap - 1); w->str_hash_cap && w->str_hash[j];
       j = (j + 1) & (w->str_hash_cap - 1)) {
    const char *q = w->strs[w->str_hash[j] - 1];
    if (strlen(q) == n && memcmp(q, s, n) == 0) {
      id = w->str_hash[j];
      goto out;
    }
  }
  if (w->nstrings + 1 > w->str_hash_cap / 2) {
    if (w->nstrings >= WL_TRACE_STRINGS_MAX) goto out;
    size_t cap = w->str_hash_cap ? 2 * w->str_hash_cap : 64;
    uint32_t *t = calloc(cap, sizeof *t);
    char **ns = realloc(w->strs, (cap / 2) * sizeof *ns);
    if (!t || !ns) {
      free(t);
      if (ns) w->strs = ns;
      goto out;
    }
    w->strs = ns;
    for (uint32_t i = 0; i < w->nstrings; i++) {
      const char *q = w->strs[i];
      size_t j = str_hash(q, strlen(q)) & (cap - 1);
      while (t[j]) j = (j + 1) & (cap - 1);
      t[j] = i + 1;
    }
    free(w->str_hash);
    w->str_hash = t;
    w->str_hash_cap = cap;
  }
  size_t j = h & (w->str_hash_cap - 1);
  while (w->str_hash[j]) j = (j + 1) & (w->str_hash_cap - 1);
  size_t rec = 24 + wl__round_up(n, 8);
  if (w->pending_len + rec > w->pending_cap) {
    size_t cap = WL_MAX(2 * w->pending_cap, w->pending_len + rec + 4096);
    uint8_t *p = realloc(w->pending, cap);
    if (!p) goto out;
    w->pending = p;
    w->pending_cap = cap;
  }
  char *copy = malloc(n + 1);
  if (!copy) goto out;
  memcpy(copy, s, n);
  copy[n] = 0;
  id = ++w->nstrings;
  w->strs[id - 1] = copy;
  w->str_hash[j] = id;
  uint8_t *p = w->pending + w->pending_len;
  memset(p, 0, rec);
  p[0] = WL_TRACE_STRING;
  p[1] = (uint8_t)(rec / 8);
  /* tid and time stay 0: a string belongs to no thread or moment, and files stay reproducible. */
  wl__put32(p + 16, id);
  wl__put32(p + 20, (uint32_t)n);
  memcpy(p + 24, s, n);
  w->pending_len += rec;
  if (w->rf) { /* the journal: a killed process's strings are recovered with its events */
    uint64_t len = atomic_load_explicit(&w->rf->strings_len, memory_order_relaxed);
    if (len + rec <= w->rf->strings_cap) {
      memcpy((uint8_t *)w->rf + w->rf->strings_off + len, p, rec);
      atomic_store_explicit(&w->rf->strings_len, len + rec, memory_order_release);
    }
  }
out:
  pthread_mutex_unlock(&w->str_lock);
  return id;
}

int wl_trace_flush(wl_trace_writer_t *w) {
  if (!w) return -EINVAL;
  /* A forked child's copy: the file is its parent's (and closed here). */
  if (atomic_load_explicit(&fork_epoch, memory_order_relaxed) != w->epoch) return -ECHILD;
  pthread_mutex_lock(&w->flush_lock);
  flush_locked(w);
  int rc = w->error;
  pthread_mutex_unlock(&w->flush_lock);
  return rc;
}

static void *flusher_main(void *arg) {
  wl_trace_writer_t *w = arg;
  tsc_anchor();
  uint64_t anchored = wl__now_ns();
  pthread_mutex_lock(&w->thr_lock);
  while (!w->stop) {
    if (!w->kicked) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)w->interval_ms * 1000000ull;
      ts.tv_sec += (time_t)(ns / 1000000000ull);
      ts.tv_nsec = (long)(ns % 1000000000ull);
      pthread_cond_timedwait(&w->thr_cv, &w->thr_lock, &ts);
    }
    if (w->stop) break;
    int kicked = w->kicked;
    w->kicked = 0;
    pthread_mutex_unlock(&w->thr_lock);
    wl_trace_flush(w);
    /* Once a period, not on every kick; but also when only kicks wake it (a thread emitting
     * without pause), or the line would expire and every event read the clock. */
    uint64_t now = wl__now_ns();
    if (!kicked || now - anchored >= (uint64_t)w->interval_ms * 1000000ull) {
      tsc_anchor();
      anchored = now;
    }
    pthread_mutex_lock(&w->thr_lock);
  }
  pthread_mutex_unlock(&w->thr_lock);
  return NULL;
}

static void own_command(char *dst, size_t cap) {
  int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t k = read(fd, dst, cap - 1);
  close(fd);
  if (k <= 0) return;
  dst[k] = 0;
  char *nl = strchr(dst, '\n');
  if (nl) *nl = 0;
}

/* ---- the open writers, for fork --------------------------------------------------------------
 * A forked child inherits the descriptors of its parent's trace and rings, and with them their
 * locks (an OFD lock or flock belongs to the open file description): while any child lived, a
 * killed writer read as alive (no recovery) and its path as taken. The child closes its copies
 * (the parent's locks stay: they go with the last descriptor). */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static wl_trace_writer_t *reg_head;

static void reg_add(wl_trace_writer_t *w) {
  pthread_mutex_lock(&reg_lock);
  w->reg_next = reg_head;
  reg_head = w;
  pthread_mutex_unlock(&reg_lock);
}

static void reg_remove(wl_trace_writer_t *w) {
  pthread_mutex_lock(&reg_lock);
  for (wl_trace_writer_t **p = &reg_head; *p; p = &(*p)->reg_next)
    if (*p == w) {
      *p = w->reg_next;
      break;
    }
  pthread_mutex_unlock(&reg_lock);
}

static void reg_prepare(void) {
  pthread_mutex_lock(&reg_lock);
}

static void reg_parent(void) {
  pthread_mutex_unlock(&reg_lock);
}

static void reg_child(void) {
  for (wl_trace_writer_t *w = reg_head; w; w = w->reg_next) {
    if (w->own_fd && w->fd >= 0) close(w->fd);
    if (w->own_fd) w->fd = -1;
    if (w->rf_fd >= 0) close(w->rf_fd);
    w->rf_fd = -1;
    /* A mapping holds its file's description, and so its lock, as a descriptor does. */
    if (w->rf) {
      pthread_setspecific(w->key, NULL); /* no ring_dead into it at this thread's exit */
      for (size_t i = 0; i < w->nrings; i++) munmap(w->rings[i], w->rf->slot_bytes);
      w->nrings = 0;
      munmap(w->rf, w->rf_map_bytes);
      w->rf = NULL;
    }
  }
  pthread_mutex_unlock(&reg_lock);
}

/* Creates PATH.rings and maps its header and string journal. Without it the writer still works,
 * as before: a killed process then loses the events not yet written. 0 or negative errno. */
static int rf_open(wl_trace_writer_t *w, const char *path, const wl_trace_header_t *h) {
  size_t n = strlen(path) + sizeof WL_TRACE_RINGS_SUFFIX;
  w->rf_path = malloc(n);
  if (!w->rf_path) return -ENOMEM;
  snprintf(w->rf_path, n, "%s%s", path, WL_TRACE_RINGS_SUFFIX);
  /* Truncated only once locked: another writer may have it mapped (a shorter file is SIGBUS
   * there). The trace file's lock makes that rare: a stale writer of the rings alone. */
  w->rf_fd = open(w->rf_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (w->rf_fd < 0) goto fail;
  /* Held until the process dies: readers leave a live writer's rings alone. */
  int lrc = wl__life_lock(w->rf_fd);
  if (lrc) {
    close(w->rf_fd); /* not ours: neither truncated nor removed */
    w->rf_fd = -1;
    errno = lrc == -EAGAIN ? EBUSY : -lrc;
    goto fail;
  }
  if (ftruncate(w->rf_fd, 0) || ftruncate(w->rf_fd, (off_t)WL__RINGS_SLOTS_OFF)) goto fail;
  w->rf_map_bytes = (size_t)WL__RINGS_SLOTS_OFF;
  void *m = mmap(NULL, w->rf_map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, w->rf_fd, 0);
  if (m == MAP_FAILED) goto fail;
  wl__rings_header_t *rh = m;
  rh->version = WL__RINGS_VERSION;
  rh->header_bytes = WL__RINGS_HEADER;
  rh->event_bytes = (uint32_t)sizeof(wl_trace_event_t);
  rh->ring_header_bytes = (uint32_t)offsetof(ring_t, ev);
  rh->ring_events = (uint32_t)w->ring_events;
  rh->pid = h->pid;
  rh->slot_bytes = wl__ring_slot_bytes(w->ring_events);
  rh->strings_off = WL__RINGS_HEADER;
  rh->strings_cap = WL__RINGS_STR_CAP;
  rh->slots_off = WL__RINGS_SLOTS_OFF;
  rh->origin_ns = h->origin_ns;
  rh->wall_ns = h->wall_ns;
  atomic_store_explicit(&rh->pend_seq, WL__RINGS_NO_SEQ, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  memcpy(rh->magic, WL__RINGS_MAGIC, sizeof rh->magic);
  w->rf = rh;
  return 0;
fail:;
  int e = -errno;
  if (w->rf_fd >= 0) {
    close(w->rf_fd);
    unlink(w->rf_path);
  }
  w->rf_fd = -1;
  free(w->rf_path);
  w->rf_path = NULL;
  return e ? e : -EIO;
}

/* After a clean close nothing is left to recover: the file goes. */
static void rf_close(wl_trace_writer_t *w, int remove) {
  if (!w->rf_path) return;
  if (remove) unlink(w->rf_path);
  if (w->rf) munmap(w->rf, w->rf_map_bytes); /* a forked child's copy has none */
  if (w->rf_fd >= 0) close(w->rf_fd);
  free(w->rf_path);
  free(w->free_slots);
}

int wl_trace_writer_open(wl_trace_writer_t **out, const wl_trace_writer_config_t *cfg) {
  if (!out || !cfg || (!cfg->path && cfg->fd < 0)) return -EINVAL;
  *out = NULL;
  wl_trace_writer_t *w = calloc(1, sizeof *w);
  if (!w) return -ENOMEM;
  size_t re = cfg->ring_events ? cfg->ring_events : RING_DEFAULT;
  if (re > RING_MAX) re = RING_MAX;
  size_t p2 = 2;
  while (p2 < re) p2 <<= 1;
  w->ring_events = p2;
  w->kick_mask = p2 >= 8 ? p2 / 4 - 1 : 1;
  w->id = atomic_fetch_add_explicit(&writer_ids, 1, memory_order_relaxed) + 1;
  w->rf_fd = -1;
  pthread_once(&atfork_once, atfork_init);
  w->epoch = atomic_load_explicit(&fork_epoch, memory_order_relaxed);
  w->inline_flush = cfg->inline_flush;
  w->interval_ms = cfg->flush_interval_ms;
  w->block = malloc(WL_TRACE_BLOCK_HEADER + WL__WRITE_PAYLOAD);
  if (!w->block) {
    free(w);
    return -ENOMEM;
  }
  if (pthread_key_create(&w->key, ring_dead)) {
    free(w->block);
    free(w);
    return -EAGAIN;
  }
  pthread_mutex_init(&w->rings_lock, NULL);
  pthread_mutex_init(&w->flush_lock, NULL);
  pthread_mutex_init(&w->str_lock, NULL);
  pthread_mutex_init(&w->thr_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->thr_cv, &ca);
  pthread_condattr_destroy(&ca);

  wl_trace_header_t h = cfg->header;
  if (!h.pid) h.pid = (uint32_t)getpid();
  if (!h.origin_ns) h.origin_ns = wl__now_ns();
  if (!h.wall_ns) h.wall_ns = now_realtime();
  if (!h.clock) h.clock = WL_TRACE_CLOCK_MONOTONIC;
  h.device_name[sizeof h.device_name - 1] = 0;
  h.host[sizeof h.host - 1] = 0;
  h.command[sizeof h.command - 1] = 0;
  if (!h.command[0]) own_command(h.command, sizeof h.command);
  w->origin = h.origin_ns;

  int rc = 0;
  if (cfg->path) {
    /* One writer a path, held until the process dies (as the rings' lock): a second one
     * truncated the file under the first, and the rings it had mapped (SIGBUS); two processes
     * of one WAVELET_TRACE did. So: locked first, truncated after. */
    w->fd = open(cfg->path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (w->fd < 0) rc = -errno;
    w->own_fd = 1;
    int lrc = rc ? 0 : wl__life_lock(w->fd);
    if (lrc)
      rc = lrc == -EAGAIN ? -EBUSY : lrc;
    else if (!rc && ftruncate(w->fd, 0))
      rc = -errno;
  } else {
    w->fd = cfg->fd;
  }
  if (!rc) {
    uint8_t hb[WL_TRACE_HEADER_SIZE];
    wl__header_encode(&h, hb);
    rc = write_all(w->fd, hb, sizeof hb);
    w->bytes = sizeof hb;
  }
  if (!rc && cfg->path && cfg->rings_file) {
    int e = rf_open(w, cfg->path, &h);
    if (e)
      wl__warn("trace: cannot keep the rings in %s%s (%s): a killed process will lose its "
               "unwritten events",
               cfg->path, WL_TRACE_RINGS_SUFFIX, strerror(-e));
  }
  if (!rc && w->interval_ms) {
    if (wl__thread_create(&w->thread, NULL, flusher_main, w) == 0)
      atomic_store_explicit(&w->have_thread, 1, memory_order_relaxed);
    else
      rc = -EAGAIN;
  }
  if (rc) {
    if (w->own_fd && w->fd >= 0) close(w->fd);
    rf_close(w, 1);
    pthread_key_delete(w->key);
    free(w->block);
    free(w);
    return rc;
  }
  reg_add(w);
  *out = w;
  return 0;
}

void wl_trace_writer_stats(wl_trace_writer_t *w, wl_trace_writer_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (!w) return;
  pthread_mutex_lock(&w->flush_lock);
  pthread_mutex_lock(&w->rings_lock);
  out->events = w->retired_events;
  out->dropped = w->retired_dropped + w->lost;
  for (size_t i = 0; i < w->nrings; i++) {
    out->events += atomic_load_explicit(&w->rings[i]->head, memory_order_acquire);
    out->dropped += atomic_load_explicit(&w->rings[i]->dropped, memory_order_relaxed);
  }
  out->rings = w->nrings;
  pthread_mutex_unlock(&w->rings_lock);
  out->records = w->records;
  out->blocks = w->blocks;
  out->bytes = w->bytes;
  out->flushes = w->flushes;
  out->error = w->error;
  pthread_mutex_unlock(&w->flush_lock);
}

/* Frees a writer's memory; the rings file stays (rings_file_remove 0) when the process forked and
 * this is the child, or goes. */
static void writer_free(wl_trace_writer_t *w, int remove_rings) {
  reg_remove(w);
  pthread_key_delete(w->key);
  for (size_t i = 0; i < w->nrings; i++) {
    if (w->rf)
      munmap(w->rings[i], w->rf->slot_bytes);
    else
      free(w->rings[i]);
  }
  rf_close(w, remove_rings);
  free(w->rings);
  for (uint32_t i = 0; i < w->nstrings; i++) free(w->strs[i]);
  free(w->strs);
  free(w->str_hash);
  free(w->pending);
  free(w->heap);
  free(w->block);
  pthread_mutex_destroy(&w->rings_lock);
  pthread_mutex_destroy(&w->flush_lock);
  pthread_mutex_destroy(&w->str_lock);
  pthread_mutex_destroy(&w->thr_lock);
  pthread_cond_destroy(&w->thr_cv);
  free(w);
}

int wl_trace_writer_finish(wl_trace_writer_t *w) {
  if (!w) return -EINVAL;
  if (atomic_load_explicit(&fork_epoch, memory_order_relaxed) != w->epoch) return -ECHILD;
  if (atomic_exchange_explicit(&w->closed, 1, memory_order_acq_rel)) {
    pthread_mutex_lock(&w->flush_lock); /* a second call: wait for the first, same answer */
    int rc = w->error;
    pthread_mutex_unlock(&w->flush_lock);
    return rc;
  }
  if (atomic_load_explicit(&w->have_thread, memory_order_relaxed)) {
    pthread_mutex_lock(&w->thr_lock);
    w->stop = 1;
    pthread_cond_signal(&w->thr_cv);
    pthread_mutex_unlock(&w->thr_lock);
    pthread_join(w->thread, NULL);
    atomic_store_explicit(&w->have_thread, 0, memory_order_relaxed);
  }
  pthread_mutex_lock(&w->flush_lock);
  flush_locked(w);
  wl_trace_writer_stats_t st;
  pthread_mutex_unlock(&w->flush_lock);
  wl_trace_writer_stats(w, &st);
  pthread_mutex_lock(&w->flush_lock);
  /* END carries the last event's time and no thread, so a file depends only on its events. */
  wl_trace_event_t end = {.time_ns = WL_MAX(w->last_time, w->origin), .kind = WL_TRACE_END};
  end.size = st.events;
  end.arg = st.dropped;
  put_event(w, &end);
  block_emit(w);
  int rc = w->error;
  if (w->own_fd && close(w->fd) && !rc) rc = -errno;
  w->fd = -1;
  w->file_done = 1; /* nothing more is written */
  /* Nothing is left to recover: the rings file goes now (its mappings stay until close). */
  if (w->rf_path) unlink(w->rf_path);
  pthread_mutex_unlock(&w->flush_lock);
  return rc;
}

int wl_trace_writer_close(wl_trace_writer_t *w) {
  if (!w) return -EINVAL;
  if (atomic_load_explicit(&fork_epoch, memory_order_relaxed) != w->epoch) {
    /* A forked child's copy: the file, its offset and the rings are the parent's (their
     * descriptors closed at the fork, reg_child). */
    writer_free(w, 0);
    return -ECHILD;
  }
  int rc = wl_trace_writer_finish(w);
  writer_free(w, 0); /* the rings file is already gone */
  return rc;
}

void wl_trace_alloc_hook(void *writer, const wl_alloc_event_t *ev) {
  static const uint16_t map[] = {
      [WL_ALLOC_EV_ALLOC] = WL_TRACE_ALLOC,
      [WL_ALLOC_EV_FREE] = WL_TRACE_FREE_REQ,
      [WL_ALLOC_EV_MAP] = WL_TRACE_MAP,
      [WL_ALLOC_EV_UNMAP] = WL_TRACE_UNMAP,
      [WL_ALLOC_EV_PHYS_RELEASE] = WL_TRACE_PHYS_RELEASE,
      [WL_ALLOC_EV_BUDGET_DENY] = WL_TRACE_BUDGET_DENY,
      [WL_ALLOC_EV_OOM] = WL_TRACE_OOM,
  };
  if (!writer || !ev || (unsigned)ev->kind >= sizeof map / sizeof map[0] || !map[ev->kind]) return;
  wl_trace_event_t te = {.time_ns = ev->time_ns, .kind = map[ev->kind]};
  te.addr = ev->ptr;
  te.size = ev->size;
  te.arg = (uint64_t)(uintptr_t)ev->stream;
  if (te.kind == WL_TRACE_BUDGET_DENY || te.kind == WL_TRACE_OOM) te.arg = 0;
  wl_trace_emit(writer, &te);
}
