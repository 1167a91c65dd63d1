/* libsched's gate tests: the token alone and held, round-robin order in role order, work
 * conservation, the stall timeout, bypass regions, a holder killed with SIGKILL, several threads
 * of one member, mutual exclusion over many iterations, and the trainer markers. */
#include "sched_test.h"

#include <pthread.h>
#include <wavelet/wavelet.h>

static wl_sched_t *join_role(const char *g, unsigned waves, int role, uint32_t gate_timeout_ms) {
  wl_sched_config_t c = t_config(g, waves, 0);
  c.role = role;
  c.gate_timeout_ms = gate_timeout_ms;
  wl_sched_t *s = NULL;
  if (wl_sched_join(&s, &c)) return NULL;
  return s;
}

static void test_alone(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_t *s = join_role(g, 2, -1, 5000);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  CU_ASSERT_EQUAL(wl_gate_held(s), 0);
  CU_ASSERT_EQUAL(wl_gate_release(s), -ENOENT);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  CU_ASSERT_EQUAL(wl_gate_held(s), 1);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD); /* the hot path */
  CU_ASSERT_EQUAL(wl_gate_release(s), 0);
  CU_ASSERT_EQUAL(wl_gate_held(s), 0);
  CU_ASSERT_EQUAL(wl_gate_release(s), -ENOENT);
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.gate_waits, 0);
  CU_ASSERT_EQUAL(st.gate_releases, 1);
  CU_ASSERT_EQUAL(st.group_grants, 1);
  CU_ASSERT_EQUAL(wl_gate_enter(NULL), WL_GATE_OPEN);
  wl_sched_leave(s);
}

/* Shared between the test and its children (MAP_SHARED before fork). */
typedef struct board_s {
  int order[64];
  int n;
  int rising;     /* members in their rising phase now */
  int violations; /* times two were */
  int done;
  int letting_go; /* child_turn: set just before its release */
} board_t;

static board_t *board_new(void) {
  board_t *b =
      mmap(NULL, sizeof(board_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(b, 0, sizeof *b);
  return b;
}

typedef struct gate_arg_s {
  const char *group;
  unsigned waves;
  int role;
  board_t *board;
  int iterations;
  unsigned hold_ms;
  uint32_t gate_timeout_ms;
} gate_arg_t;

/* Joins with a role, reports 'j', waits for 'e', enters, records its role, holds hold_ms,
 * releases, reports 'r', waits for 'q'. */
static int child_turn(int up, int down, void *argp) {
  gate_arg_t *a = argp;
  wl_sched_t *s = join_role(a->group, a->waves, a->role, a->gate_timeout_ms);
  if (!s) return 1;
  t_note(up, 'j');
  if (t_read(down, 20000) != 'e') return 2;
  if (wl_gate_enter(s) != WL_GATE_HELD) return 3;
  int i = __atomic_fetch_add(&a->board->n, 1, __ATOMIC_ACQ_REL);
  a->board->order[i & 63] = a->role;
  t_note(up, 'h');
  t_sleep_ms(a->hold_ms);
  __atomic_store_n(&a->board->letting_go, 1, __ATOMIC_SEQ_CST);
  int rc = wl_gate_release(s);
  t_note(up, rc == 0 ? 'r' : 'x');
  t_read(down, 20000);
  wl_sched_leave(s);
  return 0;
}

static void test_round_robin(void) {
  char g[64];
  t_group(g, sizeof g);
  board_t *b = board_new();
  wl_sched_t *s = join_role(g, 4, 0, 5000);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  /* Roles 3, 2 and 1 start waiting in that order; the turns still go 1, 2, 3. */
  gate_arg_t a3 = {g, 4, 3, b, 1, 20, 5000}, a2 = a3, a1 = a3;
  a2.role = 2;
  a1.role = 1;
  t_child_t k3 = t_spawn(child_turn, &a3), k2 = t_spawn(child_turn, &a2),
            k1 = t_spawn(child_turn, &a1);
  t_child_t *ks[3] = {&k3, &k2, &k1};
  for (int i = 0; i < 3; i++) {
    CU_ASSERT_EQUAL_FATAL(t_read(ks[i]->up, 10000), 'j');
    t_note(ks[i]->down, 'e');
    wl_sched_member_t m;
    CU_ASSERT_TRUE(T_UNTIL(5000, t_member(s, ks[i]->pid, &m) && m.waiting_gate));
  }
  CU_ASSERT_EQUAL(wl_gate_release(s), 0);
  for (int i = 2; i >= 0; i--) {
    CU_ASSERT_EQUAL(t_read(ks[i]->up, 10000), 'h');
    CU_ASSERT_EQUAL(t_read(ks[i]->up, 10000), 'r');
  }
  CU_ASSERT_EQUAL(b->n, 3);
  CU_ASSERT_EQUAL(b->order[0], 1);
  CU_ASSERT_EQUAL(b->order[1], 2);
  CU_ASSERT_EQUAL(b->order[2], 3);
  for (int i = 0; i < 3; i++) {
    t_note(ks[i]->down, 'q');
    CU_ASSERT_EQUAL(t_wait(ks[i], 10000), 0);
  }
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.group_grants, 4);
  wl_sched_leave(s);
  munmap(b, sizeof *b);
}

static void test_work_conserving(void) {
  /* A member that does not ask is skipped: the other gets the token again at once. */
  char g[64];
  t_group(g, sizeof g);
  board_t *b = board_new();
  wl_sched_t *s = join_role(g, 2, 0, 5000);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  gate_arg_t a = {g, 2, 1, b, 1, 0, 5000};
  t_child_t k = t_spawn(child_turn, &a);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  for (int i = 0; i < 5; i++) {
    CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
    CU_ASSERT_EQUAL(wl_gate_release(s), 0);
  }
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.gate_waits, 0);
  CU_ASSERT_EQUAL(st.gate_enters, 5);
  t_note(k.down, 'e');
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 'h');
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 'r');
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  wl_sched_leave(s);
  munmap(b, sizeof *b);
}

static void test_stall_timeout(void) {
  char g[64];
  t_group(g, sizeof g);
  board_t *b = board_new();
  wl_sched_t *s = join_role(g, 2, 0, 200);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  /* The child holds for 1.5 s, far past the 200 ms timeout. */
  gate_arg_t a = {g, 2, 1, b, 1, 1500, 200};
  t_child_t k = t_spawn(child_turn, &a);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  t_note(k.down, 'e');
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'h');
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  /* taken by revocation, before the child let go */
  CU_ASSERT_EQUAL(__atomic_load_n(&b->letting_go, __ATOMIC_SEQ_CST), 0);
  /* The stalled holder finds it lost the token. */
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 'x');
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.group_revocations, 1);
  CU_ASSERT_EQUAL(wl_gate_held(s), 1);
  CU_ASSERT_EQUAL(wl_gate_release(s), 0);
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  wl_sched_leave(s);
  munmap(b, sizeof *b);
}

static void test_bypass(void) {
  char g[64];
  t_group(g, sizeof g);
  board_t *b = board_new();
  wl_sched_t *s = join_role(g, 2, 0, 5000);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  gate_arg_t a = {g, 2, 1, b, 1, 300, 5000};
  t_child_t k = t_spawn(child_turn, &a);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  t_note(k.down, 'e');
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'h');
  /* Inside (nested) bypass regions: never blocks, never takes the token. */
  wl_gate_bypass_begin(s);
  wl_gate_bypass_begin(s);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_BYPASS);
  wl_gate_bypass_end(s);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_BYPASS);
  wl_gate_bypass_end(s);
  wl_gate_bypass_end(s); /* unbalanced: ignored */
  CU_ASSERT_EQUAL(wl_gate_held(s), 0);
  /* Outside: waits for the child's release. */
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 'r');
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.gate_bypassed, 2);
  CU_ASSERT_EQUAL(st.gate_waits, 1);
  CU_ASSERT_EQUAL(wl_gate_release(s), 0);
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  wl_sched_leave(s);
  munmap(b, sizeof *b);
}

static int child_holder(int up, int down, void *argp) {
  gate_arg_t *a = argp;
  wl_sched_t *s = join_role(a->group, a->waves, a->role, a->gate_timeout_ms);
  if (!s || wl_gate_enter(s) != WL_GATE_HELD) return 1;
  t_note(up, 'h');
  for (;;) pause();
}

static void test_kill_holding_token(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_t *s = join_role(g, 2, 0, 60000); /* no timeout: only death frees the token */
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  gate_arg_t a = {g, 2, 1, NULL, 1, 0, 60000};
  t_child_t k = t_spawn(child_holder, &a);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'h');
  killer_t kl = {k.pid, 200, 0};
  pthread_t th;
  pthread_create(&th, NULL, killer_thread, &kl);
  int rc = wl_gate_enter(s);
  uint64_t done = wl__now_ns();
  pthread_join(th, NULL);
  CU_ASSERT_EQUAL(rc, WL_GATE_HELD);
  /* after the kill, by reaping the dead holder (not by the 60 s timeout's revocation) */
  uint64_t killed = __atomic_load_n(&kl.killed_ns, __ATOMIC_ACQUIRE);
  CU_ASSERT_TRUE(killed && done > killed);
  printf("\n    token of a killed holder passed on in %.1f ms\n", (double)(done - killed) / 1e6);
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.group_reaped, 1);
  CU_ASSERT_EQUAL(st.group_revocations, 0);
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 128 + SIGKILL);
  CU_ASSERT_EQUAL(t_members(s), 1);
  CU_ASSERT_EQUAL(wl_gate_release(s), 0);
  wl_sched_leave(s);
}

typedef struct thr_arg_s {
  wl_sched_t *s;
  int rc;
} thr_arg_t;

static void *enter_thread(void *arg) {
  thr_arg_t *t = arg;
  t->rc = wl_gate_enter(t->s);
  return NULL;
}

static void test_threads_of_one_member(void) {
  char g[64];
  t_group(g, sizeof g);
  board_t *b = board_new();
  wl_sched_t *s = join_role(g, 2, 0, 5000);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  gate_arg_t a = {g, 2, 1, b, 1, 200, 5000};
  t_child_t k = t_spawn(child_turn, &a);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  t_note(k.down, 'e');
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'h');
  thr_arg_t ta[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    ta[i].s = s;
    ta[i].rc = -1;
    pthread_create(&th[i], NULL, enter_thread, &ta[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(ta[i].rc, WL_GATE_HELD);
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 'r');
  CU_ASSERT_EQUAL(wl_gate_release(s), 0);
  CU_ASSERT_EQUAL(wl_gate_release(s), -ENOENT);
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  wl_sched_leave(s);
  munmap(b, sizeof *b);
}

/* Iterates: enter, rising phase (checks nobody else is rising), release, falling phase. */
static int child_iterate(int up, int down, void *argp) {
  gate_arg_t *a = argp;
  wl_sched_t *s = join_role(a->group, a->waves, a->role, a->gate_timeout_ms);
  if (!s) return 1;
  t_note(up, 'j');
  if (t_read(down, 20000) != 'e') return 2;
  for (int i = 0; i < a->iterations; i++) {
    if (wl_gate_enter(s) != WL_GATE_HELD) return 3;
    if (__atomic_add_fetch(&a->board->rising, 1, __ATOMIC_ACQ_REL) > 1)
      __atomic_add_fetch(&a->board->violations, 1, __ATOMIC_RELAXED);
    for (volatile int spin = 0; spin < 2000; spin++) {
    }
    __atomic_sub_fetch(&a->board->rising, 1, __ATOMIC_ACQ_REL);
    if (wl_gate_release(s)) return 4;
    for (volatile int spin = 0; spin < 2000; spin++) {
    }
  }
  __atomic_add_fetch(&a->board->done, a->iterations, __ATOMIC_RELAXED);
  wl_sched_leave(s);
  return 0;
}

static void test_mutual_exclusion(void) {
  char g[64];
  t_group(g, sizeof g);
  board_t *b = board_new();
  t_child_t k[3];
  gate_arg_t a[3];
  for (int i = 0; i < 3; i++) {
    a[i] = (gate_arg_t){g, 3, i, b, 300, 0, 60000};
    k[i] = t_spawn(child_iterate, &a[i]);
  }
  for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(t_read(k[i].up, 10000), 'j');
  for (int i = 0; i < 3; i++) t_note(k[i].down, 'e');
  for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(t_wait(&k[i], 60000), 0);
  CU_ASSERT_EQUAL(b->done, 900);
  CU_ASSERT_EQUAL(b->violations, 0);
  CU_ASSERT_FALSE(t_shm_exists(g));
  munmap(b, sizeof *b);
}

static void test_markers(void) {
  char g[64];
  t_group(g, sizeof g);
  board_t *b = board_new();
  wl_sched_t *s = join_role(g, 2, 0, 5000);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  CU_ASSERT_PTR_EQUAL(wl_sched_get_default(), s);
  /* The markers drive the default member's gate: in at the begin, out at the backward. */
  wl_mark_iteration_begin();
  CU_ASSERT_EQUAL(wl_gate_held(s), 1);
  wl_sched_member_t m;
  CU_ASSERT_TRUE(t_member(s, getpid(), &m) && m.phase == WL_PHASE_ITER_BEGIN);
  wl_mark_backward_begin();
  CU_ASSERT_EQUAL(wl_gate_held(s), 0);
  CU_ASSERT_TRUE(t_member(s, getpid(), &m) && m.phase == WL_PHASE_BACKWARD);
  wl_mark_iteration_end();
  CU_ASSERT_TRUE(t_member(s, getpid(), &m) && m.phase == WL_PHASE_IDLE);
  /* A step without backward gives the token back at its end. */
  wl_mark_iteration_begin();
  CU_ASSERT_EQUAL(wl_gate_held(s), 1);
  wl_mark_iteration_end();
  CU_ASSERT_EQUAL(wl_gate_held(s), 0);
  /* With another member holding, the begin marker waits for it. */
  gate_arg_t a = {g, 2, 1, b, 1, 200, 5000};
  t_child_t k = t_spawn(child_turn, &a);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  t_note(k.down, 'e');
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'h');
  wl_mark_iteration_begin();
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 'r'); /* it released before we got in */
  CU_ASSERT_EQUAL(wl_gate_held(s), 1);
  wl_mark_backward_begin();
  CU_ASSERT_EQUAL(wl_gate_held(s), 0);
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  wl_sched_leave(s);
  CU_ASSERT_PTR_NULL(wl_sched_get_default());
  wl_mark_iteration_begin(); /* no default member: nothing happens */
  /* Manual mode: the markers no longer touch the gate. */
  wl_sched_config_t c = t_config(g, 2, 0);
  c.flags = WL_SCHED_MANUAL_GATE;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  CU_ASSERT_PTR_EQUAL(wl_sched_get_default(), s);
  wl_mark_iteration_begin();
  CU_ASSERT_EQUAL(wl_gate_held(s), 0);
  CU_ASSERT_TRUE(t_member(s, getpid(), &m) && m.phase == WL_PHASE_ITER_BEGIN);
  wl_sched_leave(s);
  munmap(b, sizeof *b);
}

/* wl_sched_event from several threads at once: no event is lost or fed twice (the detector's
 * count and live bytes say so), whichever thread ends up feeding it. */
#define EV_THREADS 4
#define EV_PAIRS   20000

static void *event_thread(void *arg) {
  wl_sched_t *s = arg;
  uint64_t tid = (uint64_t)gettid();
  for (int i = 0; i < EV_PAIRS; i++) {
    size_t sz = 4096 * (size_t)(1 + (tid + (uint64_t)i) % 64);
    wl_phase_event_t a = {.time_ns = wl__now_ns(), .thread = tid, .kind = WL_PEV_ALLOC, .size = sz};
    wl_sched_event(s, &a);
    wl_phase_event_t f = a;
    f.kind = WL_PEV_FREE;
    wl_sched_event(s, &f);
  }
  return NULL;
}

/* A member of a new group whose detector only feeds (the gate is left alone). NULL on failure. */
static wl_sched_t *join_detector(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 0);
  c.flags = WL_SCHED_MANUAL_GATE;
  wl_sched_t *s;
  if (wl_sched_join(&s, &c) != 0) return NULL;
  if (!s->phase) {
    wl_sched_leave(s);
    return NULL;
  }
  return s;
}

static void test_events_threads(void) {
  wl_sched_t *s = join_detector();
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  pthread_t th[EV_THREADS];
  for (int i = 0; i < EV_THREADS; i++)
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, event_thread, s), 0);
  for (int i = 0; i < EV_THREADS; i++) pthread_join(th[i], NULL);
  /* Alone now, this thread feeds (and so drains anything left). */
  wl_phase_event_t l = {.time_ns = wl__now_ns(), .thread = 1, .kind = WL_PEV_LAUNCH};
  wl_sched_event(s, &l);
  wl_phase_stats_t st;
  wl_phase_stats_get(s->phase, &st);
  CU_ASSERT_EQUAL(st.events, (uint64_t)EV_THREADS * EV_PAIRS * 2 + 1);
  wl_phase_event_t a = {.time_ns = wl__now_ns(), .thread = 1, .kind = WL_PEV_ALLOC, .size = 100};
  wl_phase_result_t r;
  wl_phase_feed(s->phase, &a, &r);
  CU_ASSERT_EQUAL(r.live_bytes, 100); /* every alloc met its free */
  printf("\n    %llu of %d events were queued for another thread, %llu waits on a full queue",
         (unsigned long long)s->ev_queued, EV_THREADS * EV_PAIRS * 2,
         (unsigned long long)s->ev_waited);
  wl_sched_leave(s);
}

/* The interleaving events_threads hits only by chance, made by hand: a producer has claimed a
 * queue cell and not yet filled it (stalled), this thread's alloc is queued behind it while
 * another feeds, and then this thread feeds its free. The free must wait for its alloc. */
/* The detector's gate when one thread feeds an iteration's beginning and waits at the gate (held
 * by another member) while another thread feeds the rest of it, peak and fall: the token, once
 * it comes, goes back at once. Before, the release found nothing entered yet and was lost, and
 * the member kept the token through its falling phase, until its next beginning. */
typedef struct auto_race_s {
  wl_sched_t *s;
  uint64_t ev;
  pthread_mutex_t mu;
} auto_race_t;

static void ar_feed(auto_race_t *a, int alloc, int layer) {
  pthread_mutex_lock(&a->mu);
  wl_phase_event_t e = {.time_ns = a->ev++,
                        .thread = 1,
                        .kind = alloc ? WL_PEV_ALLOC : WL_PEV_FREE,
                        .size = (size_t)(layer + 1) * MiB + 4096 * (size_t)layer};
  pthread_mutex_unlock(&a->mu);
  wl_sched_event(a->s, &e);
}

static void ar_iteration(auto_race_t *a, int from) {
  for (int i = from; i < 10; i++) ar_feed(a, 1, i);
  for (int i = 9; i >= 0; i--) ar_feed(a, 0, i);
}

static void *ar_begin(void *arg) {
  auto_race_t *a = arg;
  ar_feed(a, 1, 0);
  ar_feed(a, 1, 1);
  return NULL;
}

static void test_auto_release_while_entering(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 0);
  c.gate_timeout_ms = 2000; /* were the token kept, the last enter would not hang */
  auto_race_t a = {NULL, 1, PTHREAD_MUTEX_INITIALIZER};
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a.s, &c), 0);
  c.flags = WL_SCHED_MANUAL_GATE;
  wl_sched_t *o;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&o, &c), 0);
  for (int k = 0; k < 12; k++) ar_iteration(&a, 0);
  CU_ASSERT_FALSE(wl_gate_held(a.s));
  CU_ASSERT_EQUAL(wl_gate_enter(o), WL_GATE_HELD); /* the other member rises */
  pthread_t t;
  pthread_create(&t, NULL, ar_begin, &a);
  t_sleep_ms(100); /* the thread now waits at the gate */
  ar_iteration(&a, 2);
  wl_gate_release(o);
  pthread_join(t, NULL);
  CU_ASSERT_FALSE(wl_gate_held(a.s));
  CU_ASSERT_EQUAL(wl_gate_enter(o), WL_GATE_HELD); /* free again, at once */
  wl_gate_release(o);
  wl_sched_leave(o);
  wl_sched_leave(a.s);
}

static void test_events_gap(void) {
  wl_sched_t *s = join_detector();
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  uint64_t gap = s->ev_tail;
  CU_ASSERT_EQUAL_FATAL(gap, s->ev_head);
  s->feeding = 1;       /* another thread feeds */
  s->ev_tail = gap + 1; /* and a stalled producer holds cell gap */
  wl_phase_event_t a = {.time_ns = wl__now_ns(), .thread = 7, .kind = WL_PEV_ALLOC, .size = 4096};
  wl_sched_event(s, &a); /* queued behind the gap */
  CU_ASSERT_EQUAL(s->ev_tail, gap + 2);
  s->feeding = 0; /* the feeder let go, stopped by the gap */
  wl_phase_event_t f = a;
  f.kind = WL_PEV_FREE;
  wl_sched_event(s, &f); /* must not be fed before the alloc */
  /* The stalled producer fills its cell. */
  s->evq[gap % WL__EVQ].ev =
      (wl_phase_event_t){.time_ns = wl__now_ns(), .thread = 8, .kind = WL_PEV_LAUNCH};
  __atomic_store_n(&s->evq[gap % WL__EVQ].seq, gap + 1, __ATOMIC_SEQ_CST);
  wl_phase_event_t l = {.time_ns = wl__now_ns(), .thread = 7, .kind = WL_PEV_LAUNCH};
  wl_sched_event(s, &l); /* feeds everything queued, then its own */
  CU_ASSERT_EQUAL(s->ev_head, s->ev_tail);
  wl_phase_stats_t st;
  wl_phase_stats_get(s->phase, &st);
  CU_ASSERT_EQUAL(st.events, 4);
  wl_phase_event_t x = {.time_ns = wl__now_ns(), .thread = 7, .kind = WL_PEV_ALLOC, .size = 100};
  wl_phase_result_t r;
  wl_phase_feed(s->phase, &x, &r);
  CU_ASSERT_EQUAL(r.live_bytes, 100); /* the alloc met its free */
  wl_sched_leave(s);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"alone", test_alone},
      {"round_robin", test_round_robin},
      {"work_conserving", test_work_conserving},
      {"stall_timeout", test_stall_timeout},
      {"bypass", test_bypass},
      {"kill_holding_token", test_kill_holding_token},
      {"threads_of_one_member", test_threads_of_one_member},
      {"mutual_exclusion", test_mutual_exclusion},
      {"markers", test_markers},
      {"events_threads", test_events_threads},
      {"events_gap", test_events_gap},
      {"auto_release_while_entering", test_auto_release_while_entering},
      {NULL, NULL},
  };
  int rc = wl_test_main(argc, argv, "sched_gate", cases);
  int left = t_cleanup_shm();
  if (left) fprintf(stderr, "test_sched_gate: removed %d leftover segments\n", left);
  return rc || left;
}
