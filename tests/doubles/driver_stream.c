/* The CUDA driver double's streams and events: each stream is a timeline of tickets that
 * completes at once unless a test holds it, so tests decide when "GPU work" finishes. */
#include "driver.h"

#include <stdlib.h>

#define D drv__state

static bool is_default(CUstream s) {
  return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

struct CUstream_st *drv_stream_find(struct CUctx_st *ctx, CUstream s) {
  if (is_default(s)) return ctx ? &ctx->null_stream : NULL;
  for (struct CUstream_st *x = D.streams; x; x = x->next)
    if (x == s) return x;
  return NULL;
}

static struct CUevent_st *event_find(CUevent e) {
  for (struct CUevent_st *x = D.events; x; x = x->next)
    if (x == e) return x;
  return NULL;
}

/* Completes a stream's work (it is being destroyed): its events stay complete. */
static void stream_drain(struct CUstream_st *s) {
  s->held = false;
  s->done = s->enq;
  for (struct CUevent_st *e = D.events; e; e = e->next)
    if (e->stream == s) e->stream = NULL;
}

void drv_ctx_drop_objects(struct CUctx_st *ctx) {
  stream_drain(&ctx->null_stream);
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
  for (struct CUstream_st **pp = &D.streams; *pp;) {
    struct CUstream_st *s = *pp;
    if (s->ctx != ctx) {
      pp = &s->next;
      continue;
    }
    *pp = s->next;
    D.st.streams--;
    D.st.dropped++;
    free(s);
  }
}

/* ---- streams ---------------------------------------------------------------------------------*/

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  DRV_BEGIN(cuStreamCreate, DRV_NEED_CTX);
  if (!phStream) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", Flags));
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
  while (*pp && *pp != hStream) pp = &(*pp)->next;
  if (!*pp)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown stream %p", (void *)hStream));
  struct CUstream_st *s = *pp;
  /* cuStreamDestroy returns at once and the device finishes the stream's work. */
  stream_drain(s);
  *pp = s->next;
  D.st.streams--;
  free(s);
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  DRV_BEGIN(cuStreamQuery, DRV_NEED_CTX);
  struct CUstream_st *s = drv_stream_find(drv_current(), hStream);
  if (!s)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown stream %p", (void *)hStream));
  return drv_end(s->done < s->enq ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

/* ---- events ----------------------------------------------------------------------------------*/

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  DRV_BEGIN(cuEventCreate, DRV_NEED_CTX);
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
  struct CUstream_st *s = drv_stream_find(drv_current(), hStream);
  if (!s)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown stream %p", (void *)hStream));
  if (s->ctx != e->ctx)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_HANDLE, "event and stream belong to different contexts"));
  e->stream = s;
  e->ticket = ++s->enq;
  if (!s->held) s->done = s->enq;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  DRV_BEGIN(cuEventQuery, DRV_NEED_CTX);
  struct CUevent_st *e = event_find(hEvent);
  if (!e) return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)hEvent));
  /* An event never recorded counts as complete, as documented. */
  bool busy = e->stream && e->stream->done < e->ticket;
  return drv_end(busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent) {
  DRV_BEGIN(cuEventDestroy_v2, DRV_NEED_CTX);
  struct CUevent_st **pp = &D.events;
  while (*pp && *pp != hEvent) pp = &(*pp)->next;
  if (!*pp)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)hEvent));
  struct CUevent_st *e = *pp;
  *pp = e->next;
  D.st.events--;
  free(e);
  return drv_end(CUDA_SUCCESS);
}

/* ---- test controls ---------------------------------------------------------------------------*/

/* A hold is a piece of work that does not finish: everything enqueued after it waits. */
int wltest_stream_hold(CUstream stream) {
  pthread_mutex_lock(&D.lock);
  struct CUstream_st *s = drv_stream_find(drv_current(), stream);
  if (s && !s->held) {
    s->held = true;
    s->enq++;
  }
  pthread_mutex_unlock(&D.lock);
  return s ? 0 : -1;
}

int wltest_stream_release(CUstream stream) {
  pthread_mutex_lock(&D.lock);
  struct CUstream_st *s = drv_stream_find(drv_current(), stream);
  if (s) {
    s->held = false;
    s->done = s->enq;
  }
  pthread_mutex_unlock(&D.lock);
  return s ? 0 : -1;
}
