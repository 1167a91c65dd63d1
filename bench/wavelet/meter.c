/* The meter: a replica's memory drawn from the group ledger or a local limit, with its peak,
 * trough, the group's combined peak and the time spent waiting. */
#include "backend.h"

#include "util.h"

#include <wavelet/trace.h>

#include <errno.h>
#include <stdbool.h>
#include <string.h>

void wb_meter_init(wb_meter_t *m, wl_sched_t *sched, size_t limit, uint32_t timeout_ms) {
  memset(m, 0, sizeof *m);
  m->sched = sched;
  m->limit = limit;
  m->trough = SIZE_MAX;
  m->timeout_ms = timeout_ms;
  if (sched) wl_sched_budget(sched, &m->inner);
}

int wb_meter_acquire(wb_meter_t *m, size_t bytes, uint64_t deadline_ns) {
  int rc;
  uint64_t t0 = deadline_ns ? wl__now_ns() : 0;
  if (deadline_ns && m->wait_cap_ns && deadline_ns - t0 > m->wait_cap_ns)
    deadline_ns = t0 + m->wait_cap_ns;
  if (m->sched) {
    rc = m->inner.acquire(m->inner.ctx, bytes, deadline_ns);
  } else {
    /* A local limit has nobody to wait for. */
    rc = (m->limit && (bytes > m->limit || m->held > m->limit - bytes)) ? -ENOMEM : 0;
  }
  if (deadline_ns) {
    uint64_t waited = wl__now_ns() - t0;
    m->wait_ns += waited;
    m->waits++;
    if (m->trace) {
      wl_trace_event_t ev = {
          .kind = WL_TRACE_BUDGET_WAIT, .aux = rc ? 1 : 0, .size = bytes, .arg = waited};
      wl_trace_emit(m->trace, &ev);
    }
  }
  if (rc) {
    if (deadline_ns || !m->sched) m->denials++;
    return rc;
  }
  m->last.bytes = bytes;
  m->last.peak = m->peak;
  m->last.iter_peak = m->iter_peak;
  m->last.group_peak = m->group_peak;
  m->held += bytes;
  m->last.held = m->held;
  if (m->held > m->peak) m->peak = m->held;
  if (m->held > m->iter_peak) m->iter_peak = m->held;
  if (m->sched) {
    wl_sched_stats_t st;
    wl_sched_stats_get(m->sched, &st);
    if (st.used > m->group_peak) m->group_peak = st.used;
  } else if (m->held > m->group_peak) {
    m->group_peak = m->held;
  }
  return 0;
}

void wb_meter_release(wb_meter_t *m, size_t bytes) {
  if (m->sched) m->inner.release(m->inner.ctx, bytes);
  m->held = wl__sub_sat(m->held, bytes);
}

void wb_meter_refund(wb_meter_t *m, size_t bytes) {
  bool last = bytes && bytes == m->last.bytes && m->held == m->last.held;
  if (m->sched && m->inner.refund)
    m->inner.refund(m->inner.ctx, bytes);
  else if (m->sched)
    m->inner.release(m->inner.ctx, bytes);
  m->held = wl__sub_sat(m->held, bytes);
  if (!last) return;
  m->peak = m->last.peak;
  m->iter_peak = m->last.iter_peak;
  m->group_peak = m->last.group_peak;
  m->last.bytes = 0;
}

size_t wb_meter_limit(wb_meter_t *m) {
  return m->sched ? m->inner.limit(m->inner.ctx) : m->limit;
}

void wb_meter_mark_trough(wb_meter_t *m) {
  if (m->held < m->trough) m->trough = m->held;
}

static int b_acquire(void *ctx, size_t bytes, uint64_t deadline_ns) {
  return wb_meter_acquire(ctx, bytes, deadline_ns);
}
static void b_release(void *ctx, size_t bytes) {
  wb_meter_release(ctx, bytes);
}
static void b_refund(void *ctx, size_t bytes) {
  wb_meter_refund(ctx, bytes);
}
static size_t b_limit(void *ctx) {
  return wb_meter_limit(ctx);
}

void wb_meter_budget(wb_meter_t *m, wl_budget_t *out) {
  out->ctx = m;
  out->acquire = b_acquire;
  out->release = b_release;
  out->limit = b_limit;
  out->refund = b_refund;
  out->wait_release = NULL; /* its device is the host's: never full behind the meter's back */
}
