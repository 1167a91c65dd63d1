/* The CUDA driver double's streams, events and stream capture: each stream is a timeline of tickets
 * whose completion follows the clock (simulated kernel durations) and the holds tests place, so
 * tests decide when "GPU work" finishes. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define D drv__state

static bool is_default(CUstream s) {
  return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* Per-thread default streams live in D.streams (so that synchronisations and context releases
 * see them) but are not counted as created streams; a thread's goes away when the thread ends. */
static pthread_key_t pt_key;

static void pt_thread_exit(void *unused) {
  (void)unused;
  pthread_mutex_lock(&D.lock);
  for (struct CUstream_st **pp = &D.streams; *pp;) {
    struct CUstream_st *s = *pp;
    if (!s->per_thread || !pthread_equal(s->owner, pthread_self())) {
      pp = &s->next;
      continue;
    }
    /* Its work still completes on its timeline, like a destroyed stream's. */
    *pp = s->next;
    s->zombie = true;
    s->next = D.zombies;
    D.zombies = s;
  }
  pthread_mutex_unlock(&D.lock);
}

__attribute__((constructor)) static void pt_key_init(void) {
  pthread_key_create(&pt_key, pt_thread_exit);
}

/* The calling thread's per-thread default stream in ctx, made on first use. */
static struct CUstream_st *per_thread_stream(struct CUctx_st *ctx) {
  for (struct CUstream_st *x = D.streams; x; x = x->next)
    if (x->per_thread && x->ctx == ctx && pthread_equal(x->owner, pthread_self())) return x;
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->magic = DRV_STREAM_MAGIC;
  s->ctx = ctx;
  s->per_thread = true;
  s->owner = pthread_self();
  s->next = D.streams;
  D.streams = s;
  pthread_setspecific(pt_key, s); /* any non-NULL value: the exit hook runs */
  return s;
}

struct CUstream_st *drv_stream_find(struct CUctx_st *ctx, CUstream s) {
  if (!ctx && is_default(s)) return NULL;
  if (s == CU_STREAM_PER_THREAD) return per_thread_stream(ctx);
  if (is_default(s)) return &ctx->null_stream;
  for (struct CUstream_st *x = D.streams; x; x = x->next)
    if (x == s && !x->per_thread) return x;
  return NULL;
}

CUresult drv_stream_get(CUstream h, struct CUstream_st **out) {
  *out = drv_stream_find(drv_current(), h);
  if (!*out) return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown stream %p", (void *)h);
  return CUDA_SUCCESS;
}

static struct CUevent_st *event_find(CUevent e) {
  for (struct CUevent_st *x = D.events; x; x = x->next)
    if (x == e) return x;
  return NULL;
}

uint64_t drv_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the timeline ----------------------------------------------------------------------------*/

static void stamp(struct CUevent_st *e, uint64_t gen, uint64_t t) {
  if (e && e->gen == gen) {
    e->t_ns = t;
    e->stamped = true;
  }
}

void drv_stream_advance(struct CUstream_st *s, uint64_t now) {
  /* Streams waiting on each other's heads recurse back and forth: bounded (the rest advances
   * at the next call). */
  static __thread int depth;
  if (depth > 32) return;
  while (s->head) {
    drv_item_t *it = s->head;
    if (it->hold) return;
    uint64_t start = it->t_enq > s->t_done ? it->t_enq : s->t_done;
    if (it->wait_stream) {
      if (it->wait_stream->done < it->wait_ticket) {
        depth++;
        drv_stream_advance(it->wait_stream, now);
        depth--;
        if (s->head != it) continue; /* advanced (and it freed) by a nested call */
      }
      if (it->wait_stream->done < it->wait_ticket) return;
      /* The waited-for work completed by the other stream's last completion. */
      if (it->wait_stream->t_done > start) start = it->wait_stream->t_done;
    }
    uint64_t end = start + it->ns;
    if (end > now) return;
    s->done = it->ticket;
    s->t_done = end;
    stamp(it->event, it->event_gen, end);
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    free(it);
  }
}

static bool append(struct CUstream_st *s, uint64_t ns, struct CUevent_st *e,
                   struct CUstream_st *wait_stream, uint64_t wait_ticket, uint64_t now) {
  drv_stream_advance(s, now);
  if (wait_stream) {
    drv_stream_advance(wait_stream, now);
    if (wait_stream->done >= wait_ticket) wait_stream = NULL;
  }
  /* Nothing ahead and nothing to wait for: complete at once, as the double always did. */
  if (!s->head && ns == 0 && !wait_stream) {
    s->done = ++s->enq;
    if (now > s->t_done) s->t_done = now;
    if (e) stamp(e, e->gen, s->t_done);
    return true;
  }
  drv_item_t *it = calloc(1, sizeof *it);
  if (!it) return false;
  it->ticket = ++s->enq;
  it->ns = ns;
  it->t_enq = now;
  it->event = e;
  it->event_gen = e ? e->gen : 0;
  it->wait_stream = wait_stream;
  it->wait_ticket = wait_ticket;
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  pthread_cond_broadcast(&D.progress);
  return true;
}

/* The legacy default stream's implicit synchronisation: its work waits for all earlier work of
 * the context's blocking streams (per-thread default streams included), and their work waits
 * for its earlier work. Non-blocking streams are left alone. */
static bool implicit_waits(struct CUstream_st *s, uint64_t now) {
  struct CUctx_st *c = s->ctx;
  struct CUstream_st *legacy = &c->null_stream;
  if (s == legacy) {
    for (struct CUstream_st *x = D.streams; x; x = x->next) {
      if (x->ctx != c || (x->flags & CU_STREAM_NON_BLOCKING)) continue;
      drv_stream_advance(x, now);
      if (x->done < x->enq && !append(s, 0, NULL, x, x->enq, now)) return false;
    }
  } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
    drv_stream_advance(legacy, now);
    if (legacy->done < legacy->enq) return append(s, 0, NULL, legacy, legacy->enq, now);
  }
  return true;
}

bool drv_enqueue(struct CUstream_st *s, uint64_t ns, struct CUevent_st *e,
                 struct CUstream_st *wait_stream, uint64_t wait_ticket) {
  uint64_t now = drv_now();
  return implicit_waits(s, now) && append(s, ns, e, wait_stream, wait_ticket, now);
}

/* When the head item of s (or what it waits for) could next complete; UINT64_MAX: on a hold. */
static uint64_t next_deadline(struct CUstream_st *s) {
  drv_item_t *it = s->head;
  if (!it) return 0;
  if (it->hold) return UINT64_MAX;
  if (it->wait_stream && it->wait_stream->done < it->wait_ticket)
    return next_deadline(it->wait_stream);
  uint64_t start = it->t_enq > s->t_done ? it->t_enq : s->t_done;
  return start + it->ns;
}

static void zombies_reap(void);

/* The lock is let go while waiting: another thread may destroy s meanwhile (a helper waiting for
 * an event while the program destroys its stream), so s is counted as waited on and a zombie is
 * reaped only when its last waiter leaves. */
void drv_stream_wait(struct CUstream_st *s, uint64_t ticket) {
  s->waiters++;
  for (;;) {
    drv_stream_advance(s, drv_now());
    if (s->done >= ticket) break;
    uint64_t dl = next_deadline(s);
    if (dl == UINT64_MAX) {
      pthread_cond_wait(&D.progress, &D.lock);
    } else {
      struct timespec ts = {.tv_sec = (time_t)(dl / 1000000000ull),
                            .tv_nsec = (long)(dl % 1000000000ull)};
      pthread_cond_timedwait(&D.progress, &D.lock, &ts);
    }
  }
  if (--s->waiters == 0 && s->zombie) zombies_reap();
}

void drv_ctx_sync(struct CUctx_st *ctx) {
  drv_stream_wait(&ctx->null_stream, ctx->null_stream.enq);
  /* The list can change while waiting: start over after each wait. */
  for (bool again = true; again;) {
    again = false;
    for (struct CUstream_st *s = D.streams; s; s = s->next) {
      if (s->ctx != ctx) continue;
      drv_stream_advance(s, drv_now());
      if (s->done < s->enq) {
        drv_stream_wait(s, s->enq);
        again = true;
        break;
      }
    }
  }
  drv_pools_trim();
}

/* ctx's legacy stream no longer waits for s. */
static void legacy_unwait(struct CUctx_st *ctx, struct CUstream_st *s) {
  for (drv_item_t *it = ctx->null_stream.head; it; it = it->next)
    if (it->wait_stream == s) it->wait_stream = NULL;
}

/* Frees what a stream still holds and unhooks the events recorded on it (they stay complete). */
static void stream_forget(struct CUstream_st *s) {
  while (s->head) {
    drv_item_t *it = s->head;
    s->head = it->next;
    stamp(it->event, it->event_gen, drv_now());
    free(it);
  }
  s->tail = NULL;
  s->done = s->enq;
  for (struct CUevent_st *e = D.events; e; e = e->next)
    if (e->stream == s) e->stream = NULL;
  struct CUstream_st *lists[] = {D.streams, D.zombies};
  for (int l = 0; l < 2; l++)
    for (struct CUstream_st *x = lists[l]; x; x = x->next)
      for (drv_item_t *it = x->head; it; it = it->next)
        if (it->wait_stream == s) it->wait_stream = NULL;
  for (int d = 0; d < DRV_MAXDEV; d++)
    if (D.primary[d]) legacy_unwait(D.primary[d], s);
  for (struct CUctx_st *c = D.created; c; c = c->next) legacy_unwait(c, s);
}

/* Destroyed streams are freed once their work has completed. */
static void zombies_reap(void) {
  uint64_t now = drv_now();
  for (struct CUstream_st **pp = &D.zombies; *pp;) {
    struct CUstream_st *s = *pp;
    drv_stream_advance(s, now);
    if (s->head || s->waiters) {
      pp = &s->next;
      continue;
    }
    *pp = s->next;
    stream_forget(s);
    free(s);
  }
}

void drv_ctx_drop_objects(struct CUctx_st *ctx) {
  /* Streams first: their abandoned items stamp events, which must still be alive then. */
  stream_forget(&ctx->null_stream);
  for (struct CUstream_st **pp = &D.streams; *pp;) {
    struct CUstream_st *s = *pp;
    if (s->ctx != ctx) {
      pp = &s->next;
      continue;
    }
    *pp = s->next;
    stream_forget(s);
    if (s->graph) drv_graph_free(s->graph);
    s->graph = NULL;
    s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!s->per_thread) {
      D.st.streams--;
      D.st.dropped++;
    }
    /* Unknown from now on; a thread still waiting on it frees it when it leaves. */
    s->zombie = true;
    s->next = D.zombies;
    D.zombies = s;
  }
  for (struct CUstream_st **pp = &D.zombies; *pp;) {
    struct CUstream_st *s = *pp;
    if (s->ctx != ctx) {
      pp = &s->next;
      continue;
    }
    stream_forget(s);
    if (s->waiters) {
      pp = &s->next;
      continue;
    }
    *pp = s->next;
    free(s);
  }
  for (struct CUevent_st **pp = &D.events; *pp;) {
    struct CUevent_st *e = *pp;
    if (e->ctx != ctx) {
      pp = &e->next;
      continue;
    }
    *pp = e->next;
    D.st.events--;
    D.st.dropped++;
    free(e);
  }
  drv_graph_execs_drop(ctx);
  /* Threads waiting on the abandoned work find it complete. */
  pthread_cond_broadcast(&D.progress);
}

/* ---- streams ---------------------------------------------------------------------------------*/

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  DRV_BEGIN(cuStreamCreate, DRV_NEED_CTX);
  if (!phStream) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", Flags));
  zombies_reap();
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  s->magic = DRV_STREAM_MAGIC;
  s->ctx = drv_current();
  s->flags = Flags;
  s->next = D.streams;
  D.streams = s;
  D.st.streams++;
  *phStream = s;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream) {
  DRV_BEGIN(cuStreamDestroy_v2, DRV_NEED_CTX);
  if (is_default(hStream))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "the default stream cannot be destroyed"));
  struct CUstream_st **pp = &D.streams;
  while (*pp && (*pp != hStream || (*pp)->per_thread)) pp = &(*pp)->next;
  if (!*pp)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown stream %p", (void *)hStream));
  struct CUstream_st *s = *pp;
  *pp = s->next;
  D.st.streams--;
  if (s->graph) drv_graph_free(s->graph);
  s->graph = NULL;
  /* cuStreamDestroy returns at once and the device finishes the stream's work: a held stream
   * is let go, and the rest completes on its timeline before the stream is freed. */
  for (drv_item_t *it = s->head; it; it = it->next) {
    if (it->hold) it->t_enq = drv_now();
    it->hold = false;
  }
  s->zombie = true;
  s->next = D.zombies;
  D.zombies = s;
  zombies_reap();
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  DRV_BEGIN(cuStreamQuery, DRV_NEED_CTX);
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  /* "It is invalid to synchronize or query the execution status of a stream which is being
   * captured" (the programming guide): refused, and the capture invalidated, in every mode. */
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return drv_end(drv_capture_refuse(s));
  drv_stream_advance(s, drv_now());
  return drv_end(s->done < s->enq ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  DRV_BEGIN(cuStreamSynchronize, DRV_NEED_CTX);
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return drv_end(drv_capture_refuse(s));
  drv_stream_wait(s, s->enq);
  drv_pools_trim();
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  DRV_BEGIN(cuStreamWaitEvent, DRV_NEED_CTX);
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  struct CUevent_st *e = event_find(hEvent);
  if (!e) return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)hEvent));
  if (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", Flags));
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return drv_end(CUDA_SUCCESS); /* a join */
  /* An event never recorded (or on its own stream) is no wait. */
  bool wait = e->stream && e->stream != s;
  if (!drv_enqueue(s, 0, NULL, wait ? e->stream : NULL, e->ticket))
    return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  return drv_end(CUDA_SUCCESS);
}

/* ---- events ----------------------------------------------------------------------------------*/

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  DRV_BEGIN(cuEventCreate, DRV_NEED_CTX);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  if (!phEvent) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (Flags & ~known) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", Flags));
  if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "an interprocess event must disable timing"));
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  e->magic = DRV_EVENT_MAGIC;
  e->ctx = drv_current();
  e->flags = Flags;
  e->next = D.events;
  D.events = e;
  D.st.events++;
  *phEvent = e;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  DRV_BEGIN(cuEventRecord, DRV_NEED_CTX);
  struct CUevent_st *e = event_find(hEvent);
  if (!e) return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)hEvent));
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (s->ctx != e->ctx)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_HANDLE, "event and stream belong to different contexts"));
  /* Recorded during capture, the event becomes a node of the graph: nothing happens now, and
   * until it is recorded again outside a capture it may not be queried or waited for
   * (CUDA_ERROR_CAPTURED_EVENT). */
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    e->captured = true;
    return drv_end(CUDA_SUCCESS);
  }
  e->captured = false;
  e->gen++;
  e->stamped = false;
  if (!drv_enqueue(s, 0, e, NULL, 0)) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  e->stream = s;
  e->ticket = s->enq;
  return drv_end(CUDA_SUCCESS);
}

static bool event_busy(struct CUevent_st *e) {
  if (!e->stream) return false; /* never recorded, or its stream is gone: complete */
  drv_stream_advance(e->stream, drv_now());
  return e->stream->done < e->ticket;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  DRV_BEGIN(cuEventQuery, DRV_NEED_CTX);
  struct CUevent_st *e = event_find(hEvent);
  if (!e) return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)hEvent));
  if (e->captured) return drv_end(CUDA_ERROR_CAPTURED_EVENT);
  /* An event never recorded counts as complete, as documented. */
  return drv_end(event_busy(e) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  DRV_BEGIN(cuEventSynchronize, DRV_NEED_CTX);
  struct CUevent_st *e = event_find(hEvent);
  if (!e) return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)hEvent));
  if (e->captured) return drv_end(CUDA_ERROR_CAPTURED_EVENT);
  if (e->stream) drv_stream_wait(e->stream, e->ticket);
  drv_pools_trim();
  return drv_end(CUDA_SUCCESS);
}

static CUresult elapsed(float *ms, CUevent hStart, CUevent hEnd) {
  if (!ms) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  struct CUevent_st *a = event_find(hStart), *b = event_find(hEnd);
  if (!a || !b)
    return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p",
                      (void *)(a ? (void *)hEnd : (void *)hStart));
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
    return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "an event was created with DISABLE_TIMING");
  if (a->gen == 0 || b->gen == 0)
    return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "an event was never recorded");
  if (event_busy(a) || event_busy(b)) return CUDA_ERROR_NOT_READY;
  if (!a->stamped || !b->stamped)
    return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "an event was recorded during stream capture");
  *ms = (float)((double)((int64_t)b->t_ns - (int64_t)a->t_ns) / 1e6);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
  DRV_BEGIN(cuEventElapsedTime_v2, DRV_NEED_CTX);
  return drv_end(elapsed(pMilliseconds, hStart, hEnd));
}

CUresult CUDAAPI cuEventElapsedTime_v1(float *ms, CUevent start, CUevent end) {
  DRV_BEGIN(cuEventElapsedTime, DRV_NEED_CTX);
  return drv_end(elapsed(ms, start, end));
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent) {
  DRV_BEGIN(cuEventDestroy_v2, DRV_NEED_CTX);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  struct CUevent_st **pp = &D.events;
  while (*pp && *pp != hEvent) pp = &(*pp)->next;
  if (!*pp)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)hEvent));
  struct CUevent_st *e = *pp;
  *pp = e->next;
  /* Work still pending must not stamp freed memory. */
  for (struct CUstream_st *s = D.streams; s; s = s->next)
    for (drv_item_t *it = s->head; it; it = it->next)
      if (it->event == e) it->event = NULL;
  for (struct CUstream_st *s = D.zombies; s; s = s->next)
    for (drv_item_t *it = s->head; it; it = it->next)
      if (it->event == e) it->event = NULL;
  struct CUctx_st *c = e->ctx;
  for (drv_item_t *it = c->null_stream.head; it; it = it->next)
    if (it->event == e) it->event = NULL;
  D.st.events--;
  free(e);
  return drv_end(CUDA_SUCCESS);
}

/* ---- stream capture and graphs ---------------------------------------------------------------*/

CUresult drv_capture_refuse(struct CUstream_st *s) {
  if (s->capture == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_SUCCESS;
  s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  return drv_misuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                    "not permitted on a capturing stream; the capture is invalidated");
}

/* The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode):
 * CU_STREAM_CAPTURE_MODE_GLOBAL (0) until it changes it. */
static __thread int tl_capture_mode;

/* cuThreadExchangeStreamCaptureMode's rule: a thread in GLOBAL mode is prohibited from
 * potentially unsafe calls while it has an ongoing capture not begun RELAXED, or another thread
 * has one begun GLOBAL; in THREAD_LOCAL mode only its own captures count; in RELAXED mode none.
 * An invalidated capture is still ongoing until it is ended (assumed: the docs speak of the
 * sequence, not of its status), so it keeps prohibiting. */
CUresult drv_capture_unsafe(int kind) {
  if (kind == DRV_UNSAFE_VMM && !D.unsafe_vmm) return CUDA_SUCCESS;
  int mode = tl_capture_mode;
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  pthread_t self = pthread_self();
  int n = 0;
  for (struct CUstream_st *s = D.streams; s; s = s->next) {
    if (s->capture == CU_STREAM_CAPTURE_STATUS_NONE) continue;
    bool own = pthread_equal(s->capture_thread, self);
    if (own ? s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED
            : mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                  s->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
      s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      n++;
    }
  }
  if (!n) return CUDA_SUCCESS;
  return drv_misuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                    "not permitted during %d stream capture(s) in this thread's capture mode %d; "
                    "invalidated",
                    n, mode);
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  DRV_BEGIN(cuThreadExchangeStreamCaptureMode, DRV_NEED_INIT);
  if (!mode) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL mode"));
  if ((unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "mode %d", (int)*mode));
  int old = tl_capture_mode;
  tl_capture_mode = (int)*mode;
  *mode = (CUstreamCaptureMode)old;
  return drv_end(CUDA_SUCCESS);
}

/* Every variant: the legacy ones (no mode) capture in GLOBAL mode, as documented; the _ptsz
 * ones take NULL for the calling thread's per-thread default stream. */
static CUresult begin_capture(CUstream hStream, CUstreamCaptureMode mode) {
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return rc;
  if (s == &s->ctx->null_stream)
    return drv_misuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                      "the legacy default stream cannot be captured");
  if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "mode %d", (int)mode);
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE)
    return drv_misuse(CUDA_ERROR_ILLEGAL_STATE, "the stream is already capturing");
  struct CUgraph_st *g = drv_graph_new();
  if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
  s->graph = g;
  s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  s->capture_id = ++D.next_capture_id;
  s->capture_mode = (int)mode;
  s->capture_thread = pthread_self();
  return CUDA_SUCCESS;
}

static CUstream ptsz(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

CUresult CUDAAPI cuStreamBeginCapture_v1(CUstream hStream) {
  DRV_BEGIN(cuStreamBeginCapture, DRV_NEED_CTX);
  return drv_end(begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL));
}

CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream) {
  DRV_BEGIN(cuStreamBeginCapture_ptsz, DRV_NEED_CTX);
  return drv_end(begin_capture(ptsz(hStream), CU_STREAM_CAPTURE_MODE_GLOBAL));
}

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  DRV_BEGIN(cuStreamBeginCapture_v2, DRV_NEED_CTX);
  return drv_end(begin_capture(hStream, mode));
}

CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  DRV_BEGIN(cuStreamBeginCapture_v2_ptsz, DRV_NEED_CTX);
  return drv_end(begin_capture(ptsz(hStream), mode));
}

/* A capture not begun RELAXED must be ended by the thread that began it. */
static CUresult end_capture(CUstream hStream, CUgraph *phGraph) {
  if (!phGraph) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return rc;
  if (s->capture == CU_STREAM_CAPTURE_STATUS_NONE)
    return drv_misuse(CUDA_ERROR_ILLEGAL_STATE, "the stream is not capturing");
  if (s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      !pthread_equal(s->capture_thread, pthread_self()))
    return drv_misuse(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                      "a capture not begun RELAXED is ended by another thread");
  struct CUgraph_st *g = s->graph;
  bool invalid = s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  s->graph = NULL;
  s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (invalid) {
    drv_graph_free(g);
    *phGraph = NULL;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  g->next = D.graphs;
  D.graphs = g;
  *phGraph = g;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  DRV_BEGIN(cuStreamEndCapture, DRV_NEED_CTX);
  return drv_end(end_capture(hStream, phGraph));
}

CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
  DRV_BEGIN(cuStreamEndCapture_ptsz, DRV_NEED_CTX);
  return drv_end(end_capture(ptsz(hStream), phGraph));
}

/* A stream query's stream, once its output pointer is checked. */
static CUresult query_stream(CUstream h, const void *out, struct CUstream_st **s) {
  if (!out) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  return drv_stream_get(h, s);
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  DRV_BEGIN(cuStreamIsCapturing, DRV_NEED_CTX);
  struct CUstream_st *s;
  CUresult rc = query_stream(hStream, captureStatus, &s);
  if (rc == CUDA_SUCCESS) *captureStatus = (CUstreamCaptureStatus)s->capture;
  return drv_end(rc);
}

CUresult CUDAAPI cuStreamGetDevice(CUstream hStream, CUdevice *device) {
  DRV_BEGIN(cuStreamGetDevice, DRV_NEED_CTX);
  struct CUstream_st *s;
  CUresult rc = query_stream(hStream, device, &s);
  if (rc == CUDA_SUCCESS) *device = s->ctx->device;
  return drv_end(rc);
}

/* A stream's context: the one current at its creation; NULL, CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD are the current context (none current: CUDA_ERROR_INVALID_CONTEXT). A
 * created context's streams are unknown once it is destroyed (CUDA: undefined). No current
 * context is needed for a stream of the program's. */
static CUresult stream_ctx(CUstream h, CUcontext *pctx) {
  if (!pctx) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  if (is_default(h)) {
    CUresult rc = drv_ctx_usable(drv_current(), "current");
    if (rc == CUDA_SUCCESS) *pctx = drv_current();
    return rc;
  }
  struct CUstream_st *s = drv_stream_find(NULL, h);
  if (!s) return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown stream %p", (void *)h);
  *pctx = s->ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
  DRV_BEGIN(cuStreamGetCtx, DRV_NEED_INIT);
  return drv_end(stream_ctx(hStream, pctx));
}

CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx) {
  DRV_BEGIN(cuStreamGetCtx_ptsz, DRV_NEED_INIT);
  return drv_end(stream_ctx(hStream, pctx));
}

/* 12.5's ABI: the double has no green contexts, so *pGreenCtx (when asked for) is NULL. */
static CUresult stream_ctx_v2(CUstream h, CUcontext *pCtx, CUgreenCtx *pGreenCtx) {
  CUresult rc = stream_ctx(h, pCtx);
  if (rc == CUDA_SUCCESS && pGreenCtx) *pGreenCtx = NULL;
  return rc;
}

CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx) {
  DRV_BEGIN(cuStreamGetCtx_v2, DRV_NEED_INIT);
  return drv_end(stream_ctx_v2(hStream, pCtx, pGreenCtx));
}

CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx) {
  DRV_BEGIN(cuStreamGetCtx_v2_ptsz, DRV_NEED_INIT);
  return drv_end(stream_ctx_v2(hStream, pCtx, pGreenCtx));
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream,
                                           CUstreamCaptureStatus *captureStatus_out,
                                           cuuint64_t *id_out, CUgraph *graph_out,
                                           const CUgraphNode **dependencies_out,
                                           const CUgraphEdgeData **edgeData_out,
                                           size_t *numDependencies_out) {
  DRV_BEGIN(cuStreamGetCaptureInfo_v3, DRV_NEED_CTX);
  struct CUstream_st *s;
  CUresult rc = query_stream(hStream, captureStatus_out, &s);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  *captureStatus_out = (CUstreamCaptureStatus)s->capture;
  bool active = s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id_out && s->capture != CU_STREAM_CAPTURE_STATUS_NONE) *id_out = s->capture_id;
  if (graph_out) *graph_out = active ? s->graph : NULL;
  /* The double builds graphs as sequences: dependencies are not modelled. */
  if (dependencies_out) *dependencies_out = NULL;
  if (edgeData_out) *edgeData_out = NULL;
  if (numDependencies_out) *numDependencies_out = 0;
  return drv_end(CUDA_SUCCESS);
}

/* ---- test controls ---------------------------------------------------------------------------*/

/* A hold is a piece of work that does not finish: everything enqueued after it waits. */
int wltest_stream_hold(CUstream stream) {
  pthread_mutex_lock(&D.lock);
  struct CUstream_st *s = drv_stream_find(drv_current(), stream);
  int rc = -1;
  if (s) {
    bool held = false;
    for (drv_item_t *it = s->head; it; it = it->next) held |= it->hold;
    rc = 0;
    if (!held) {
      drv_item_t *it = calloc(1, sizeof *it);
      if (it) {
        it->ticket = ++s->enq;
        it->t_enq = drv_now();
        it->hold = true;
        if (s->tail)
          s->tail->next = it;
        else
          s->head = it;
        s->tail = it;
      } else {
        rc = -1;
      }
    }
  }
  pthread_mutex_unlock(&D.lock);
  return rc;
}

int wltest_stream_release(CUstream stream) {
  pthread_mutex_lock(&D.lock);
  struct CUstream_st *s = drv_stream_find(drv_current(), stream);
  if (s) {
    uint64_t now = drv_now();
    for (drv_item_t *it = s->head; it; it = it->next)
      if (it->hold) {
        it->hold = false;
        it->t_enq = now;
      }
    drv_stream_advance(s, now);
    pthread_cond_broadcast(&D.progress);
  }
  pthread_mutex_unlock(&D.lock);
  return s ? 0 : -1;
}
