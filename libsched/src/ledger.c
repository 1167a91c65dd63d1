/* The ledger: the group's memory budget shared by its members, as liballoc's wl_budget_t, with
 * futex waits, priority to the gate-token holder and deadlock resolution. */
#include "internal.h"

#include <errno.h>
#include <string.h>

/* Everybody must have been blocked this long before a deadlock is declared: a member's other
 * threads (liballoc's trimmer) may still give memory back. */
#define DEADLOCK_GRACE_NS (100ull * 1000000ull)

static uint64_t add_sat(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

void wl__ledger_kick(wl_sched_t *s) {
  wl__shm_t *h = s->shm;
  WL_ADD(h->ledger_seq, 1);
  if (WL_LD(h->ledger_waiters)) wl__futex_wake(&h->ledger_seq, INT32_MAX);
}

/* Bytes this request must leave free for others: the token holder's wait comes first, then
 * every request that started waiting before ours (FIFO, so large requests are not starved). */
static uint64_t reserved_for_others(wl_sched_t *s, bool waiting, uint64_t since) {
  wl__shm_t *h = s->shm;
  uint32_t t = WL_LD(h->token);
  bool holder = t == s->slot + 1;
  if (holder) return 0;
  uint64_t r = 0;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (i == s->slot || WL_LD(sl->state) != WL__SLOT_LIVE) continue;
    uint64_t wb = WL_LD(sl->wait_bytes);
    if (!wb) continue;
    if (t == i + 1 || !waiting || WL_LD(sl->wait_since_ns) < since) r = add_sat(r, wb);
  }
  return r;
}

/* One waiting thread's request, on its stack, listed in wl_sched_s.ledger_waits. */
struct wl__ledger_wait_s {
  struct wl__ledger_wait_s *next;
  uint64_t bytes;
};

static bool try_grant(wl_sched_t *s, size_t bytes, bool waiting, uint64_t since) {
  wl__shm_t *h = s->shm;
  wl__slot_t *me = &h->slots[s->slot];
  uint64_t limit = WL_LD(h->limit), used = WL_LD(h->used);
  if (limit) {
    if (used > limit) return false;
    /* A resolver's pass: every member is stuck and this request fits if the others wait. */
    bool pass = waiting && WL_LD(me->wait_pass) && bytes <= limit - used;
    uint64_t need = pass ? bytes : add_sat(bytes, reserved_for_others(s, waiting, since));
    if (need > limit - used) return false;
  }
  if (waiting) WL_ST(me->wait_pass, 0);
  WL_ST(h->used, add_sat(used, bytes));
  WL_ST(me->physical_bytes, add_sat(WL_LD(me->physical_bytes), bytes));
  return true;
}

/* The slot's wait_min from this process's waiting requests (exact, so a pass is never given
 * for room that no request of ours can use). */
static void update_wait_min(wl_sched_t *s) {
  wl__slot_t *me = &s->shm->slots[s->slot];
  uint64_t mn = 0;
  for (struct wl__ledger_wait_s *w = s->ledger_waits; w; w = w->next)
    if (!mn || w->bytes < mn) mn = w->bytes;
  uint64_t wb = WL_LD(me->wait_bytes);
  WL_ST(me->wait_min, mn < wb ? mn : wb);
}

static void wait_begin(wl_sched_t *s, struct wl__ledger_wait_s *w, uint64_t now) {
  wl__shm_t *h = s->shm;
  wl__slot_t *me = &h->slots[s->slot];
  if (WL_LD(me->wait_count) == 0) {
    WL_ST(me->wait_since_ns, now);
    WL_ADD(h->ledger_waiters, 1);
  }
  WL_ADD(me->wait_count, 1);
  /* Bounded as the segment's check wants it, or every member would leave the group. */
  uint64_t sum = add_sat(WL_LD(me->wait_bytes), w->bytes);
  WL_ST(me->wait_bytes, sum < WL__BYTES_MAX ? sum : WL__BYTES_MAX);
  w->next = s->ledger_waits;
  s->ledger_waits = w;
  update_wait_min(s);
}

static void wait_end(wl_sched_t *s, struct wl__ledger_wait_s *w) {
  wl__shm_t *h = s->shm;
  wl__slot_t *me = &h->slots[s->slot];
  for (struct wl__ledger_wait_s **p = &s->ledger_waits; *p; p = &(*p)->next) {
    if (*p == w) {
      *p = w->next;
      break;
    }
  }
  uint32_t n = WL_LD(me->wait_count);
  if (n <= 1) {
    WL_ST(me->wait_count, 0);
    WL_ST(me->wait_bytes, 0);
    WL_ST(me->wait_min, 0);
    WL_ST(me->wait_fail, 0);
    WL_ST(me->wait_pass, 0);
    WL_ST(h->ledger_waiters, (uint32_t)wl__sub_sat(WL_LD(h->ledger_waiters), 1));
  } else {
    WL_ST(me->wait_count, n - 1);
    WL_ST(me->wait_bytes, (uint64_t)wl__sub_sat(WL_LD(me->wait_bytes), w->bytes));
    if (!WL_LD(me->wait_bytes)) WL_ST(me->wait_bytes, 1); /* still waiting: keep it nonzero */
    update_wait_min(s);
  }
}

/* Every live member blocked (in the ledger or the gate, one at least in the ledger) for the
 * grace period is not yet a deadlock: a request may fit the free bytes and wait only because the
 * token holder's or an earlier waiter's larger request is reserved ahead of it. Then that
 * request gets a pass (the holder's first, then the earliest waiter's) and the others wait on.
 * Only when no waiting request fits the free bytes does one fail: the most recent waiter that
 * does not hold the token. True when it acted. */
bool wl__ledger_resolve_deadlock(wl_sched_t *s) {
  wl__shm_t *h = s->shm;
  uint64_t now = wl__now_ns(), latest = 0;
  uint64_t limit = WL_LD(h->limit), used = WL_LD(h->used);
  if (!limit) return false; /* nothing waits without a limit */
  uint64_t avail = used < limit ? limit - used : 0;
  unsigned live = 0, blocked = 0;
  int victim = -1, holder_victim = -1, pass = -1;
  uint64_t victim_since = 0, pass_since = 0;
  bool pass_holder = false;
  uint32_t t = WL_LD(h->token);
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (WL_LD(sl->state) != WL__SLOT_LIVE) continue;
    live++;
    bool lw = WL_LD(sl->wait_count) != 0;
    bool gw = WL_LD(sl->gate_waiting) != 0;
    if (lw && WL_LD(sl->wait_fail)) return false; /* a victim is already on its way out */
    uint64_t mn = lw ? WL_LD(sl->wait_min) : 0;
    if (lw && WL_LD(sl->wait_pass)) {
      if (mn && mn <= avail) return false; /* a pass is on its way in */
      WL_ST(sl->wait_pass, 0);             /* stale: somebody else took the room */
    }
    if (!lw && !gw) return false; /* somebody runs: it may release */
    blocked++;
    uint64_t since = lw ? WL_LD(sl->wait_since_ns) : WL_LD(sl->gate_wait_since_ns);
    if (lw && gw && WL_LD(sl->gate_wait_since_ns) > since) since = WL_LD(sl->gate_wait_since_ns);
    if (since > latest) latest = since;
    if (!lw) continue;
    uint64_t ws = WL_LD(sl->wait_since_ns);
    bool holder = t == i + 1;
    if (mn && mn <= avail && !pass_holder && (holder || pass < 0 || ws < pass_since)) {
      pass = (int)i;
      pass_since = ws;
      pass_holder = holder;
    }
    if (holder) {
      holder_victim = (int)i;
    } else if (victim < 0 || ws >= victim_since) {
      /* The most recent waiter fails: it has waited least. */
      victim = (int)i;
      victim_since = ws;
    }
  }
  if (!live || blocked < live || (victim < 0 && holder_victim < 0)) return false;
  if (now < latest || now - latest < DEADLOCK_GRACE_NS) return false;
  if (pass >= 0) {
    char need[32], fr[32];
    wl__debug("group %s: every member waits; pid %d's request of %s fits the %s free, so it "
              "goes first and the others wait",
              s->group, (int)WL_LD(h->slots[pass].pid),
              wl__fmt_bytes(WL_LD(h->slots[pass].wait_min), need, sizeof need),
              wl__fmt_bytes(avail, fr, sizeof fr));
    WL_ST(h->slots[pass].wait_pass, 1);
    wl__ledger_kick(s);
    return true;
  }
  if (victim < 0) victim = holder_victim;
  WL_ST(h->slots[victim].wait_fail, 1);
  WL_ADD(h->deadlocks, 1);
  wl__ledger_kick(s);
  return true;
}

static void fail_message(wl_sched_t *s, size_t bytes, const char *why) {
  wl__shm_t *h = s->shm;
  char req[32], lim[32], used[32], who[640];
  uint64_t limit = WL_LD(h->limit);
  wl__describe_members(s, who, sizeof who);
  wl__warn("group %s: cannot admit %s for pid %d (role %d): %s; budget %s, used %s: %s", s->group,
           wl__fmt_bytes(bytes, req, sizeof req), (int)s->pid, s->role, why,
           limit ? wl__fmt_bytes(limit, lim, sizeof lim) : "none",
           wl__fmt_bytes(WL_LD(h->used), used, sizeof used), who);
}

/* Takes the lock, retrying after timeouts; false when the member is no longer usable (the lock
 * degrades it after repeated timeouts, so this is bounded). */
static bool lock_retry(wl_sched_t *s) {
  for (;;) {
    int rc = wl__lock(s);
    if (rc == 0) return true;
    if (rc != -ETIMEDOUT) return false;
  }
}

/* A waiter's watch round, under the lock: somebody may have died or stalled while it slept. */
static void watch_round(wl_sched_t *s) {
  wl__reap(s);
  uint32_t g = wl__gate_check_stall(s);
  wl__gate_wake(s, g);
}

int wl_sched_acquire(wl_sched_t *s, size_t bytes, uint64_t deadline_ns) {
  if (!wl__usable(s) || bytes == 0) return 0; /* no group: admit, as without one */
  __atomic_add_fetch(&s->st.ledger_acquires, 1, __ATOMIC_RELAXED);
  if (!lock_retry(s)) return 0;
  wl__shm_t *h = s->shm;
  wl__slot_t *me = &h->slots[s->slot];
  uint64_t limit = WL_LD(h->limit);
  if ((limit && bytes > limit) || bytes > WL__BYTES_MAX - WL_LD(me->physical_bytes)) {
    fail_message(s, bytes, "the request is larger than the whole budget");
    WL_ADD(h->denials, 1);
    wl__unlock(s);
    __atomic_add_fetch(&s->st.ledger_denials, 1, __ATOMIC_RELAXED);
    return -ENOMEM;
  }
  bool waiting = false, reaped = false;
  uint64_t since = 0;
  struct wl__ledger_wait_s self = {NULL, bytes};
  int rc;
  for (;;) {
    if (try_grant(s, bytes, waiting, since)) {
      rc = 0;
      break;
    }
    /* Dead members may hold credit: reclaim it before waiting on anybody. */
    if (!reaped) {
      reaped = true;
      if (wl__reap(s)) continue;
    }
    if (waiting && WL_LD(me->wait_fail)) {
      /* Consumed by this thread alone: the member's other waiting threads go on waiting. */
      WL_ST(me->wait_fail, 0);
      fail_message(s, bytes,
                   "every member of the group is waiting (deadlock), so this request "
                   "fails");
      __atomic_add_fetch(&s->st.ledger_deadlocks, 1, __ATOMIC_RELAXED);
      rc = -ENOMEM;
      break;
    }
    uint64_t now = wl__now_ns();
    if (deadline_ns == 0 || now >= deadline_ns) {
      if (deadline_ns) {
        char ms[48];
        snprintf(ms, sizeof ms, "timed out after %llu ms",
                 (unsigned long long)((now - (since ? since : now)) / 1000000ull));
        fail_message(s, bytes, ms);
        __atomic_add_fetch(&s->st.ledger_timeouts, 1, __ATOMIC_RELAXED);
        rc = -ETIMEDOUT;
      } else {
        __atomic_add_fetch(&s->st.ledger_denials, 1, __ATOMIC_RELAXED);
        rc = -ENOMEM;
      }
      break;
    }
    if (!waiting) {
      waiting = true;
      since = now;
      wait_begin(s, &self, now);
      __atomic_add_fetch(&s->st.ledger_waits, 1, __ATOMIC_RELAXED);
    }
    /* A pass for this member is tried at once (once: it may be for another of our threads). */
    bool acted = wl__ledger_resolve_deadlock(s);
    if (WL_LD(me->wait_fail) || (acted && WL_LD(me->wait_pass))) continue;
    uint32_t seq = WL_LD(h->ledger_seq);
    wl__unlock(s);
    uint64_t until = now + WL__WATCH_NS < deadline_ns ? now + WL__WATCH_NS : deadline_ns;
    int w = wl__futex_wait(&h->ledger_seq, seq, until);
    if (!lock_retry(s)) return 0;
    if (w == -ETIMEDOUT) watch_round(s);
  }
  if (rc) WL_ADD(h->denials, 1);
  if (waiting) wait_end(s, &self);
  /* A waiter that gives up frees what was reserved for it: later waiters may fit now, and would
   * otherwise only see it at their next watch round. */
  if (waiting && rc) wl__ledger_kick(s);
  wl__unlock(s);
  return rc;
}

/* Whether another live member is neither waiting for memory nor at the gate: it may give memory
 * back. Under the lock. */
static bool another_runs(wl_sched_t *s) {
  wl__shm_t *h = s->shm;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (i != s->slot && WL_LD(sl->state) == WL__SLOT_LIVE && !WL_LD(sl->wait_count) &&
        !WL_LD(sl->gate_waiting))
      return true;
  }
  return false;
}

/* A caller's rounds of one wait (the same deadline) in which no other member ran. */
static __thread uint64_t tls_wait_deadline;
static __thread unsigned tls_idle_rounds;

/* The device is full though the ledger has room: wait as a ledger request does (so FIFO order,
 * the token holder's priority and deadlock resolution count this member as waiting for bytes),
 * but for any release, then let the caller try the device again. */
int wl_sched_wait_release(wl_sched_t *s, size_t bytes, uint64_t deadline_ns) {
  if (!wl__usable(s) || bytes == 0) return -ETIMEDOUT;
  if (bytes > WL__BYTES_MAX) return -EINVAL; /* no device's: not written where members check */
  uint64_t now = wl__now_ns();
  if (deadline_ns <= now) return -ETIMEDOUT;
  if (!lock_retry(s)) return -ETIMEDOUT;
  wl__shm_t *h = s->shm;
  struct wl__ledger_wait_s self = {NULL, bytes};
  wait_begin(s, &self, now);
  __atomic_add_fetch(&s->st.ledger_waits, 1, __ATOMIC_RELAXED);
  uint32_t seq = WL_LD(h->ledger_seq);
  wl__unlock(s);
  uint64_t until = now + WL__WATCH_NS < deadline_ns ? now + WL__WATCH_NS : deadline_ns;
  int w = wl__futex_wait(&h->ledger_seq, seq, until);
  if (!lock_retry(s)) return -ETIMEDOUT;
  /* Every member waits and the resolver chose this request to fail. */
  bool victim = WL_LD(h->slots[s->slot].wait_fail) != 0;
  if (victim) WL_ST(h->slots[s->slot].wait_fail, 0);
  wait_end(s, &self);
  if (victim) {
    fail_message(s, bytes,
                 "every member of the group is waiting (deadlock) and the device is "
                 "full, so this request fails");
    __atomic_add_fetch(&s->st.ledger_deadlocks, 1, __ATOMIC_RELAXED);
    wl__unlock(s);
    return -ETIMEDOUT;
  }
  bool hopeless = false;
  if (w == -ETIMEDOUT) {
    watch_round(s); /* a dead member's memory is the device's again once its process is gone */
    /* Two rounds went by in which no other member ran (alone, or all of them waiting; two, so
     * that their trim threads, every 100 ms, had their turn): what fills the device is not the
     * group's to free. Fail now, as the driver would have. */
    if (tls_wait_deadline != deadline_ns) tls_idle_rounds = 0;
    tls_wait_deadline = deadline_ns;
    tls_idle_rounds = another_runs(s) ? 0 : tls_idle_rounds + 1;
    hopeless = tls_idle_rounds >= 2;
    if (hopeless)
      fail_message(s, bytes,
                   "the device is full of memory outside the group's ledger and no "
                   "other member runs to give any back");
  }
  wl__unlock(s);
  if (w != -ETIMEDOUT) return 0;
  return hopeless || wl__now_ns() >= deadline_ns ? -ETIMEDOUT : -EAGAIN;
}

void wl_sched_release(wl_sched_t *s, size_t bytes) {
  if (!wl__usable(s) || bytes == 0) return;
  if (!lock_retry(s)) return;
  wl__shm_t *h = s->shm;
  wl__slot_t *me = &h->slots[s->slot];
  uint64_t held = WL_LD(me->physical_bytes);
  if (bytes > held) {
    wl__warn_once("group %s: pid %d released %zu bytes but held only %llu; clamped", s->group,
                  (int)s->pid, bytes, (unsigned long long)held);
    bytes = (size_t)held;
  }
  WL_ST(me->physical_bytes, held - bytes);
  WL_ST(h->used, (uint64_t)wl__sub_sat(WL_LD(h->used), bytes));
  wl__ledger_kick(s);
  wl__unlock(s);
}

size_t wl_sched_limit(wl_sched_t *s) {
  if (!wl__usable(s)) return 0;
  return (size_t)WL_LD(s->shm->limit);
}

int wl_sched_set_limit(wl_sched_t *s, size_t bytes) {
  int rc = wl_sched_status(s);
  if (rc) return rc;
  if (bytes > WL__BYTES_MAX) return -EINVAL;
  if (!lock_retry(s)) return wl_sched_status(s);
  WL_ST(s->shm->limit, (uint64_t)bytes);
  wl__ledger_kick(s);
  wl__unlock(s);
  return 0;
}

uint64_t wl_sched_alloc_deadline(const wl_sched_t *s) {
  uint32_t ms = s ? s->alloc_timeout_ms : 0;
  return ms ? wl__now_ns() + (uint64_t)ms * 1000000ull : 0;
}

static int budget_acquire(void *ctx, size_t bytes, uint64_t deadline_ns) {
  return wl_sched_acquire(ctx, bytes, deadline_ns);
}
static void budget_release(void *ctx, size_t bytes) {
  wl_sched_release(ctx, bytes);
}
static size_t budget_limit(void *ctx) {
  return wl_sched_limit(ctx);
}

static int budget_wait_release(void *ctx, size_t bytes, uint64_t deadline_ns) {
  return wl_sched_wait_release(ctx, bytes, deadline_ns);
}

/* Another member waits for the budget: the members waiting, less this one. Read without the
 * lock: a stale answer costs one trim that keeps the threshold, or a chunk given back early. A
 * waiter that died stays counted until someone reaps it, which may be long (reaping follows a
 * refusal or a watch round): so whether some other waiter lives is looked at again after a watch
 * round or when their number changes (an OFD lock query a slot), and a group whose waiters are
 * all dead is not pressing. */
static int budget_pressed(void *ctx) {
  wl_sched_t *s = ctx;
  if (!wl__usable(s)) return 0;
  wl__shm_t *h = s->shm;
  uint32_t n = WL_LD(h->ledger_waiters);
  if (n && WL_LD(h->slots[s->slot].wait_count)) n--;
  if (!n) return 0;
  uint64_t now = wl__now_ns(), seen = __atomic_load_n(&s->press_seen_ns, __ATOMIC_RELAXED);
  if (seen && now - seen < WL__WATCH_NS && __atomic_load_n(&s->press_n, __ATOMIC_RELAXED) == n)
    return __atomic_load_n(&s->press_alive, __ATOMIC_RELAXED);
  int alive = 0;
  for (unsigned i = 0; i < WL__SLOTS && !alive; i++) {
    const wl__slot_t *sl = &h->slots[i];
    if (i != s->slot && WL_LD(sl->state) == WL__SLOT_LIVE && WL_LD(sl->wait_count) &&
        wl__slot_alive(s, i) == WL__ALIVE)
      alive = 1;
  }
  __atomic_store_n(&s->press_alive, alive, __ATOMIC_RELAXED);
  __atomic_store_n(&s->press_n, n, __ATOMIC_RELAXED);
  __atomic_store_n(&s->press_seen_ns, now, __ATOMIC_RELAXED);
  return alive;
}

int wl_sched_budget(wl_sched_t *s, wl_budget_t *out) {
  if (!s || !out) return -EINVAL;
  out->ctx = s;
  out->acquire = budget_acquire;
  out->release = budget_release;
  out->limit = budget_limit;
  out->refund = NULL; /* the ledger keeps no peaks: a refund is a release */
  out->wait_release = budget_wait_release;
  out->pressed = budget_pressed;
  return 0;
}
