/* The tick-tock gate: one rising-phase token per group, handed in round-robin role order to the
 * members waiting for it, with futex waits, a stall timeout and per-thread bypass regions. */
#include "internal.h"

#include <errno.h>
#include <limits.h>

static _Thread_local int tl_bypass;

int wl__futex_wait(uint32_t *word, uint32_t val, uint64_t deadline_ns) {
  struct timespec ts, *tp = NULL;
  if (deadline_ns) {
    ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
    ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
    tp = &ts;
  }
  /* WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline; shared (not private) because the
   * word lives in memory mapped by several processes. */
  long rc = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, val, tp, NULL, FUTEX_BITSET_MATCH_ANY);
  if (rc == 0) return 0;
  if (errno == EAGAIN) return 0;
  return -errno;
}

void wl__futex_wake(uint32_t *word, int n) {
  syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* Gives the token to slot i (lock held). */
static void grant(wl_sched_t *s, unsigned i) {
  wl__shm_t *h = s->shm;
  wl__slot_t *sl = &h->slots[i];
  WL_ST(sl->gate_waiting, 0);
  WL_ADD(sl->grants, 1);
  WL_ST(h->cursor_role, WL_LD(sl->role));
  WL_ST(h->grant_ns, wl__now_ns());
  WL_ADD(h->token_gen, 1);
  WL_ADD(h->grants, 1);
  /* Release: a waiter that sees its token without the lock also sees grant_ns and the gen. */
  WL_STR(h->token, i + 1);
  WL_ADD(sl->wake, 1);
}

uint32_t wl__gate_pass(wl_sched_t *s, uint32_t after_role) {
  wl__shm_t *h = s->shm;
  uint32_t waves = WL_LD(h->waves);
  if (waves == 0) waves = 1; /* validated under the lock, but any member may write it */
  int best = -1;
  uint32_t bestd = UINT32_MAX;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (WL_LD(sl->state) != WL__SLOT_LIVE || !WL_LD(sl->gate_waiting)) continue;
    uint32_t r = WL_LD(sl->role) % waves;
    /* Distance after the previous holder's role, so the order is round robin by role. */
    uint32_t d = (r + waves - (after_role % waves) - 1) % waves;
    if (d < bestd) {
      bestd = d;
      best = (int)i;
    }
  }
  if (best < 0) {
    WL_ADD(h->token_gen, 1);
    WL_STR(h->token, 0);
    return 0;
  }
  grant(s, (unsigned)best);
  return (uint32_t)best + 1;
}

void wl__gate_wake(wl_sched_t *s, uint32_t granted) {
  if (granted && granted <= WL__SLOTS) wl__futex_wake(&s->shm->slots[granted - 1].wake, INT_MAX);
}

uint32_t wl__gate_check_stall(wl_sched_t *s) {
  wl__shm_t *h = s->shm;
  uint32_t t = WL_LD(h->token);
  uint32_t limit_ms = WL_LD(h->gate_timeout_ms);
  if (!t || !limit_ms || t > WL__SLOTS) return 0;
  uint64_t now = wl__now_ns(), since = WL_LD(h->grant_ns);
  if (now < since || now - since <= (uint64_t)limit_ms * 1000000ull) return 0;
  bool waiter = false;
  for (unsigned i = 0; i < WL__SLOTS && !waiter; i++)
    waiter = WL_LD(h->slots[i].state) == WL__SLOT_LIVE && WL_LD(h->slots[i].gate_waiting);
  if (!waiter) return 0; /* nobody needs it: keeping it costs nothing */
  wl__slot_t *hs = &h->slots[t - 1];
  wl__warn("group %s: pid %d (role %u) kept the rising-phase token for %llu ms, over the gate "
           "timeout of %u ms (WAVELET_GATE_TIMEOUT_MS); passing it on",
           s->group, (int)WL_LD(hs->pid), WL_LD(hs->role),
           (unsigned long long)((now - since) / 1000000ull), limit_ms);
  WL_ADD(h->revocations, 1);
  return wl__gate_pass(s, WL_LD(hs->role));
}

/* The token is ours: remember which grant, and how long the hand-off took. */
static int took(wl_sched_t *s, bool waited) {
  wl__shm_t *h = s->shm;
  uint64_t gen = WL_LD(h->token_gen);
  if (waited) {
    uint64_t g = WL_LD(h->grant_ns), now = wl__now_ns();
    __atomic_store_n(&s->st.last_handoff_ns, now > g ? now - g : 0, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&s->held_gen, gen, __ATOMIC_RELAXED);
  __atomic_store_n(&s->holding, 1, __ATOMIC_RELEASE);
  return WL_GATE_HELD;
}

static bool lock_retry(wl_sched_t *s) {
  for (;;) {
    int rc = wl__lock(s);
    if (rc == 0) return true;
    if (rc != -ETIMEDOUT) return false;
  }
}

int wl_gate_held(const wl_sched_t *s) {
  if (!wl__usable(s) || !__atomic_load_n(&s->holding, __ATOMIC_ACQUIRE)) return 0;
  wl__shm_t *h = s->shm;
  return WL_LDA(h->token) == s->slot + 1 &&
         WL_LD(h->token_gen) == __atomic_load_n(&s->held_gen, __ATOMIC_RELAXED);
}

int wl_gate_enter(wl_sched_t *s) {
  if (tl_bypass > 0) {
    if (s) __atomic_add_fetch(&s->st.gate_bypassed, 1, __ATOMIC_RELAXED);
    return WL_GATE_BYPASS;
  }
  if (!wl__usable(s)) return WL_GATE_OPEN;
  /* Hot path: already holding (one acquire load and one relaxed load of the segment). */
  if (wl_gate_held(s)) return WL_GATE_HELD;
  __atomic_add_fetch(&s->st.gate_enters, 1, __ATOMIC_RELAXED);
  if (!lock_retry(s)) return WL_GATE_OPEN;
  wl__shm_t *h = s->shm;
  wl__slot_t *me = &h->slots[s->slot];
  uint32_t mine = s->slot + 1;
  if (WL_LD(h->token) == mine) {
    wl__unlock(s);
    return took(s, false);
  }
  /* A holder that is already dead need not cost a watch round. */
  uint32_t holder = WL_LD(h->token);
  if (holder && holder <= WL__SLOTS && wl__slot_alive(s, holder - 1) == WL__DEAD) wl__reap(s);
  if (WL_LD(h->token) == 0) {
    grant(s, s->slot);
    wl__unlock(s);
    return took(s, false);
  }
  uint64_t t0 = wl__now_ns();
  WL_ST(me->gate_wait_since_ns, t0);
  WL_ST(me->gate_waiting, 1);
  __atomic_add_fetch(&s->st.gate_waits, 1, __ATOMIC_RELAXED);
  for (;;) {
    uint32_t w = WL_LD(me->wake);
    wl__unlock(s);
    int rc = wl__futex_wait(&me->wake, w, wl__now_ns() + WL__WATCH_NS);
    if (!wl__usable(s)) return WL_GATE_OPEN;
    if (WL_LDA(h->token) == mine) {
      int r = took(s, true);
      __atomic_add_fetch(&s->st.gate_wait_ns, wl__now_ns() - t0, __ATOMIC_RELAXED);
      return r;
    }
    if (!lock_retry(s)) return WL_GATE_OPEN;
    uint32_t t = WL_LD(h->token);
    if (t == mine) {
      wl__unlock(s);
      __atomic_add_fetch(&s->st.gate_wait_ns, wl__now_ns() - t0, __ATOMIC_RELAXED);
      return took(s, true);
    }
    if (t == 0) {
      /* Freed without a grant to us (we were granted, then revoked): take it. */
      grant(s, s->slot);
      wl__unlock(s);
      __atomic_add_fetch(&s->st.gate_wait_ns, wl__now_ns() - t0, __ATOMIC_RELAXED);
      return took(s, true);
    }
    if (!WL_LD(me->gate_waiting)) {
      WL_ST(me->gate_wait_since_ns, wl__now_ns());
      WL_ST(me->gate_waiting, 1);
    }
    if (rc == -ETIMEDOUT) {
      /* A watch round: a dead or stalled holder must not hold the group up. */
      wl__reap(s);
      uint32_t g = wl__gate_check_stall(s);
      wl__gate_wake(s, g);
      wl__ledger_resolve_deadlock(s);
      if (WL_LD(h->token) == mine) {
        wl__unlock(s);
        __atomic_add_fetch(&s->st.gate_wait_ns, wl__now_ns() - t0, __ATOMIC_RELAXED);
        return took(s, true);
      }
    }
  }
}

int wl_gate_release(wl_sched_t *s) {
  int rc = wl_sched_status(s);
  if (rc) return rc;
  if (!__atomic_load_n(&s->holding, __ATOMIC_ACQUIRE)) return -ENOENT;
  if (!lock_retry(s)) {
    __atomic_store_n(&s->holding, 0, __ATOMIC_RELEASE);
    return wl_sched_status(s);
  }
  wl__shm_t *h = s->shm;
  uint32_t g = 0;
  bool ours = WL_LD(h->token) == s->slot + 1 &&
              WL_LD(h->token_gen) == __atomic_load_n(&s->held_gen, __ATOMIC_RELAXED);
  if (ours) g = wl__gate_pass(s, (uint32_t)s->role);
  __atomic_store_n(&s->holding, 0, __ATOMIC_RELEASE);
  wl__unlock(s);
  if (!ours) {
    __atomic_add_fetch(&s->st.gate_revoked, 1, __ATOMIC_RELAXED);
    return -ENOENT;
  }
  wl__gate_wake(s, g);
  __atomic_add_fetch(&s->st.gate_releases, 1, __ATOMIC_RELAXED);
  return 0;
}

void wl_gate_bypass_begin(wl_sched_t *s) {
  (void)s;
  tl_bypass++;
}

void wl_gate_bypass_end(wl_sched_t *s) {
  (void)s;
  if (tl_bypass > 0) tl_bypass--;
}
