/* The embedded API around the group: the detector driving the gate, the trainer markers and
 * the default member they act on, published phases, member snapshots and stats. */
#define WL_MARKERS_DEFINE 1 /* define the markers here, not weak references */
#include <wavelet/wavelet.h>

#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

static wl_sched_t *default_member;

void wl_sched_set_default(wl_sched_t *s) {
  __atomic_store_n(&default_member, s, __ATOMIC_RELEASE);
}

wl_sched_t *wl_sched_get_default(void) {
  return __atomic_load_n(&default_member, __ATOMIC_ACQUIRE);
}

int wl_sched_publish(wl_sched_t *s, wl_phase_kind_t phase, size_t live_bytes) {
  int rc = wl_sched_status(s);
  if (rc) return rc;
  wl__slot_t *me = &s->shm->slots[s->slot];
  /* Owner-written fields, read by tools without the lock. */
  WL_ST(me->phase, (uint32_t)(phase <= WL_PHASE_IDLE ? phase : WL_PHASE_UNKNOWN));
  WL_ST(me->live_bytes, (uint64_t)live_bytes);
  WL_ST(me->heartbeat_ns, wl__now_ns());
  return 0;
}

/* ---- feeding the detector without a lock ------------------------------------------------------
 * The detector is a sequential state machine. A thread that takes `feeding` (one CAS) feeds its
 * event, then every event other threads queued meanwhile, and lets go; a thread that finds it
 * taken puts its event in a bounded lock-free queue (Vyukov's, one consumer) and returns. A feeder
 * feeds the queued events before its own, so each thread's events keep their order (when a
 * claimed cell is not yet filled, its own joins the queue behind it). After
 * letting go the feeder looks at the queue once more, and a producer tries to take `feeding`
 * after publishing, so no event is left behind. Only a full queue makes a thread wait. */

static bool feed_take(wl_sched_t *s) {
  int zero = 0;
  return __atomic_compare_exchange_n(&s->feeding, &zero, 1, false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_RELAXED);
}

static bool evq_push(wl_sched_t *s, const wl_phase_event_t *ev) {
  uint64_t pos = __atomic_load_n(&s->ev_tail, __ATOMIC_RELAXED);
  for (;;) {
    __typeof__(s->evq[0]) *c = &s->evq[pos % WL__EVQ];
    uint64_t seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
    int64_t d = (int64_t)(seq - pos);
    if (d == 0) {
      if (__atomic_compare_exchange_n(&s->ev_tail, &pos, pos + 1, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
        c->ev = *ev;
        __atomic_store_n(&c->seq, pos + 1, __ATOMIC_SEQ_CST);
        return true;
      }
    } else if (d < 0) {
      return false; /* full */
    } else {
      pos = __atomic_load_n(&s->ev_tail, __ATOMIC_RELAXED);
    }
  }
}

/* The feeder only. False when the next cell is empty (or not yet published). */
static bool evq_pop(wl_sched_t *s, wl_phase_event_t *ev) {
  __typeof__(s->evq[0]) *c = &s->evq[s->ev_head % WL__EVQ];
  if (__atomic_load_n(&c->seq, __ATOMIC_SEQ_CST) != s->ev_head + 1) return false;
  *ev = c->ev;
  __atomic_store_n(&c->seq, s->ev_head + WL__EVQ, __ATOMIC_RELEASE);
  s->ev_head++;
  return true;
}

/* What a batch of events asks of the gate, in order, collapsed: release when an iteration the
 * detector entered for is over (or a new one begins), then enter when the last word was a
 * beginning. */
typedef struct feed_out_s {
  bool release, enter;
  bool publish;
  wl_phase_result_t last;
} feed_out_t;

static void feed_one(wl_sched_t *s, const wl_phase_event_t *ev, feed_out_t *o) {
  wl_phase_result_t r = {0};
  if (s->phase) wl_phase_feed(s->phase, ev, &r);
  int before = __atomic_load_n(&s->last_phase, __ATOMIC_RELAXED);
  if ((int)r.phase != before || (r.flags & (WL_PHASE_F_BEGIN | WL_PHASE_F_PEAK))) o->publish = true;
  __atomic_store_n(&s->last_phase, (int)r.phase, __ATOMIC_RELAXED);
  o->last = r;
  if (r.flags & (WL_PHASE_F_PEAK | WL_PHASE_F_LOST | WL_PHASE_F_BEGIN)) {
    if (o->enter) {
      o->enter = false; /* begun and over within this batch: nothing to hold */
    } else {
      o->release = true;
    }
  }
  if (r.flags & WL_PHASE_F_BEGIN) o->enter = true;
}

/* Feeds every queued event, lets go, and takes over again when one arrived meanwhile. */
static void feed_drain(wl_sched_t *s, feed_out_t *o) {
  for (;;) {
    wl_phase_event_t ev;
    while (evq_pop(s, &ev)) feed_one(s, &ev, o);
    /* ev_head belongs to the feeder: read it before letting go. */
    uint64_t head = s->ev_head;
    __atomic_store_n(&s->feeding, 0, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->evq[head % WL__EVQ].seq, __ATOMIC_SEQ_CST) != head + 1 || !feed_take(s))
      return;
  }
}

wl_phase_kind_t wl_sched_event(wl_sched_t *s, const wl_phase_event_t *ev) {
  if (!ev || !wl__usable(s)) return WL_PHASE_UNKNOWN;
  feed_out_t o = {0};
  if (!feed_take(s)) {
    if (evq_push(s, ev)) {
      __atomic_add_fetch(&s->ev_queued, 1, __ATOMIC_RELAXED);
      /* Published: the feeder will see it, unless it let go just before; then it is ours. */
      if (!feed_take(s)) return (wl_phase_kind_t)__atomic_load_n(&s->last_phase, __ATOMIC_RELAXED);
      feed_drain(s, &o);
      goto act;
    }
    /* The queue is full: the one case where a thread waits for another. */
    __atomic_add_fetch(&s->ev_waited, 1, __ATOMIC_RELAXED);
    while (!feed_take(s)) sched_yield();
  }
  /* Events queued before ours go first: one of them may be this thread's own. A cell another
   * producer has claimed but not yet filled stops the popping, and this thread's own event may
   * sit behind it; ours then joins the queue too, so it is fed after them, by whoever holds
   * `feeding` when the gap fills. */
  wl_phase_event_t q;
  while (evq_pop(s, &q)) feed_one(s, &q, &o);
  if (__atomic_load_n(&s->ev_tail, __ATOMIC_SEQ_CST) == s->ev_head) {
    feed_one(s, ev, &o);
  } else {
    __atomic_add_fetch(&s->ev_queued, 1, __ATOMIC_RELAXED);
    while (!evq_push(s, ev)) { /* full behind the gap: wait for it to fill */
      while (evq_pop(s, &q)) feed_one(s, &q, &o);
      sched_yield();
    }
  }
  feed_drain(s, &o);
act:
  if (o.publish) wl_sched_publish(s, o.last.phase, o.last.live_bytes);
  if (s->flags & WL_SCHED_MANUAL_GATE) return o.last.phase;
  /* A new iteration while still holding (no peak seen) gives the token back first, so the
   * others get their turn. */
  if (o.release || o.enter) {
    __atomic_add_fetch(&s->auto_seq, 1, __ATOMIC_SEQ_CST);
    if (__atomic_exchange_n(&s->auto_entered, 0, __ATOMIC_SEQ_CST)) wl_gate_release(s);
  }
  if (o.enter) {
    /* Another thread may feed this iteration's peak (or the next beginning) while this one waits
     * at the gate: its release found nothing entered yet, so the token, once here, goes back at
     * once. The store and the second look pair with that thread's count and exchange above. */
    uint64_t seq = __atomic_load_n(&s->auto_seq, __ATOMIC_SEQ_CST);
    if (wl_gate_enter(s) == WL_GATE_HELD) {
      __atomic_store_n(&s->auto_entered, 1, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&s->auto_seq, __ATOMIC_SEQ_CST) != seq &&
          __atomic_exchange_n(&s->auto_entered, 0, __ATOMIC_SEQ_CST))
        wl_gate_release(s);
    }
  }
  return o.last.phase;
}

/* The markers live in this file on purpose: every program that joins a group links it, so the
 * markers resolve even when libwlsched is linked statically (a weak reference alone would not
 * pull them out of the archive). */
static void (*marker_hook)(int);

void wl_sched_set_marker_hook(void (*fn)(int kind)) {
  __atomic_store_n(&marker_hook, fn, __ATOMIC_RELEASE);
}

static void mark(wl_phase_event_kind_t kind) {
  void (*hook)(int) = __atomic_load_n(&marker_hook, __ATOMIC_ACQUIRE);
  if (hook) hook((int)kind);
  wl_sched_t *s = wl_sched_get_default();
  if (!s) return;
  wl_phase_event_t ev = {.time_ns = wl__now_ns(), .thread = (uint64_t)gettid(), .kind = kind};
  wl_sched_event(s, &ev);
}

void wl_iteration_begin(void) {
  mark(WL_PEV_MARK_ITER_BEGIN);
}

void wl_backward_begin(void) {
  mark(WL_PEV_MARK_BACKWARD);
}

void wl_iteration_end(void) {
  mark(WL_PEV_MARK_ITER_END);
}

int wl_sched_set_role(wl_sched_t *s, int role) {
  int rc = wl_sched_status(s);
  if (rc) return rc;
  if (role < 0 || (unsigned)role >= s->waves) return -ERANGE;
  if (wl__lock(s)) return wl_sched_status(s) ? wl_sched_status(s) : -ETIMEDOUT;
  wl__shm_t *h = s->shm;
  rc = 0;
  if (WL_LD(h->token) == s->slot + 1) {
    rc = -EBUSY;
  } else {
    for (unsigned i = 0; i < WL__SLOTS; i++)
      if (i != s->slot && WL_LD(h->slots[i].state) == WL__SLOT_LIVE &&
          (int)WL_LD(h->slots[i].role) == role)
        rc = -EEXIST;
  }
  if (!rc) {
    WL_ST(h->slots[s->slot].role, (uint32_t)role);
    WL_ADD(h->epoch, 1);
    __atomic_store_n(&s->role, role, __ATOMIC_RELAXED);
  }
  wl__unlock(s);
  return rc;
}

int wl_sched_members(wl_sched_t *s, wl_sched_member_t *out, size_t cap) {
  int rc = wl_sched_status(s);
  if (rc) return rc;
  if (wl__lock(s)) return wl_sched_status(s) ? wl_sched_status(s) : -ETIMEDOUT;
  wl__reap(s); /* a snapshot of the living */
  wl__shm_t *h = s->shm;
  uint32_t t = WL_LD(h->token);
  int n = 0;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (WL_LD(sl->state) != WL__SLOT_LIVE) continue;
    if ((size_t)n < cap) {
      wl_sched_member_t *m = &out[n];
      m->slot = i;
      m->role = (int)WL_LD(sl->role);
      m->pid = WL_LD(sl->pid);
      m->uid = WL_LD(sl->uid);
      m->phase = (int)WL_LD(sl->phase);
      m->holds_token = t == i + 1;
      m->waiting_gate = WL_LD(sl->gate_waiting) != 0;
      m->waiting_bytes = (size_t)WL_LD(sl->wait_bytes);
      m->physical_bytes = (size_t)WL_LD(sl->physical_bytes);
      m->live_bytes = (size_t)WL_LD(sl->live_bytes);
      m->heartbeat_ns = WL_LD(sl->heartbeat_ns);
    }
    n++;
  }
  wl__unlock(s);
  return n;
}

void wl_sched_stats_get(wl_sched_t *s, wl_sched_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (!s) return;
#define CP(f) out->f = __atomic_load_n(&s->st.f, __ATOMIC_RELAXED)
  CP(gate_enters);
  CP(gate_waits);
  CP(gate_wait_ns);
  CP(gate_releases);
  CP(gate_revoked);
  CP(gate_bypassed);
  CP(last_handoff_ns);
  CP(ledger_acquires);
  CP(ledger_waits);
  CP(ledger_denials);
  CP(ledger_timeouts);
  CP(ledger_deadlocks);
  CP(reaped);
#undef CP
  out->waves = s->waves;
  if (!wl__usable(s)) return;
  wl__shm_t *h = s->shm;
  out->physical_bytes = (size_t)WL_LD(h->slots[s->slot].physical_bytes);
  out->limit = (size_t)WL_LD(h->limit);
  out->used = (size_t)WL_LD(h->used);
  out->members = WL_LD(h->members);
  out->group_grants = WL_LD(h->grants);
  out->group_revocations = WL_LD(h->revocations);
  out->group_deadlocks = WL_LD(h->deadlocks);
  out->group_reaped = WL_LD(h->reaped);
}

void wl_sched_stats_print(wl_sched_t *s, wl_out_fn out, void *arg, int json) {
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  char line[512], a[32], b[32], c[32];
  if (json) {
    snprintf(line, sizeof line,
             "{\"group\":\"%s\",\"role\":%d,\"waves\":%u,\"members\":%u,\"limit\":%zu,"
             "\"used\":%zu,\"physical\":%zu,\"gate_enters\":%llu,\"gate_waits\":%llu,"
             "\"gate_wait_ms\":%.3f,\"gate_revoked\":%llu,\"last_handoff_us\":%.1f,"
             "\"ledger_waits\":%llu,\"ledger_denials\":%llu,\"ledger_timeouts\":%llu,"
             "\"ledger_deadlocks\":%llu,\"reaped\":%llu}\n",
             s ? s->group : "", wl_sched_role(s), st.waves, st.members, st.limit, st.used,
             st.physical_bytes, (unsigned long long)st.gate_enters,
             (unsigned long long)st.gate_waits, (double)st.gate_wait_ns / 1e6,
             (unsigned long long)st.gate_revoked, (double)st.last_handoff_ns / 1e3,
             (unsigned long long)st.ledger_waits, (unsigned long long)st.ledger_denials,
             (unsigned long long)st.ledger_timeouts, (unsigned long long)st.ledger_deadlocks,
             (unsigned long long)st.reaped);
    out(arg, line);
    return;
  }
  snprintf(line, sizeof line, "group %-20s role %d of %u waves, %u members\n", s ? s->group : "-",
           wl_sched_role(s), st.waves, st.members);
  out(arg, line);
  snprintf(line, sizeof line, "  %-22s %12s %12s %12s\n", "memory", "limit", "used", "mine");
  out(arg, line);
  snprintf(line, sizeof line, "  %-22s %12s %12s %12s\n", "",
           st.limit ? wl__fmt_bytes(st.limit, a, sizeof a) : "none",
           wl__fmt_bytes(st.used, b, sizeof b), wl__fmt_bytes(st.physical_bytes, c, sizeof c));
  out(arg, line);
  snprintf(line, sizeof line, "  %-22s %12llu enters %10llu waits %10.3f ms waited %6llu revoked\n",
           "gate", (unsigned long long)st.gate_enters, (unsigned long long)st.gate_waits,
           (double)st.gate_wait_ns / 1e6, (unsigned long long)st.gate_revoked);
  out(arg, line);
  snprintf(line, sizeof line,
           "  %-22s %12llu waits %11llu denied %9llu timed out %5llu deadlocks\n", "ledger",
           (unsigned long long)st.ledger_waits, (unsigned long long)st.ledger_denials,
           (unsigned long long)st.ledger_timeouts, (unsigned long long)st.ledger_deadlocks);
  out(arg, line);
  wl_sched_member_t m[WL_SCHED_MAX_MEMBERS];
  int n = s ? wl_sched_members(s, m, WL_SCHED_MAX_MEMBERS) : 0;
  for (int i = 0; i < n && i < WL_SCHED_MAX_MEMBERS; i++) {
    snprintf(line, sizeof line, "  member pid %-8d role %-3d %-10s %12s held %12s live%s%s\n",
             (int)m[i].pid, m[i].role, wl_phase_name((wl_phase_kind_t)m[i].phase),
             wl__fmt_bytes(m[i].physical_bytes, a, sizeof a),
             wl__fmt_bytes(m[i].live_bytes, b, sizeof b), m[i].holds_token ? " [token]" : "",
             m[i].waiting_gate ? " [waits]" : "");
    out(arg, line);
  }
}
