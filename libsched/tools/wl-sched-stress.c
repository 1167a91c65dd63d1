/* wl-sched-stress: K processes run synthetic tick-tock iterations (rising with the token and
 * budget, peak, falling) and the run is checked: no two members rising at once, never over the
 * budget, hand-off latency, and recovery from a member killed while it holds the token. */
#include "internal.h"

#include <errno.h>
#include <stddef.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXK WL_SCHED_MAX_MEMBERS

typedef struct opts_s {
  unsigned members, iterations, chunks;
  double jitter;
  int kill_one;
  unsigned rise_us, fall_us;
  size_t chunk_bytes, limit;
  uint32_t alloc_timeout_ms, gate_timeout_ms;
  unsigned seed;
  char group[WL_SCHED_GROUP_MAX + 1];
  int quiet;
  int baseline; /* also run with a polling gate (500 us steps, Zico's policy) and compare */
} opts_t;

/* Shared by the members (mapped before fork). */
typedef struct board_s {
  int go;
  int in_rising[MAXK];
  int killed[MAXK];
  int holder; /* member rising now, -1 */
  uint64_t held[MAXK];
  uint64_t done[MAXK];
  uint64_t overlap_violations, budget_violations, budget_waits, budget_failures;
  uint64_t nsamples[MAXK];
  uint64_t kill_ns, recovered_ns;
  uint64_t reaped[MAXK]; /* the group's reaped count as each member saw it at its end */
  int join_failed;
  /* the baseline's polling gate */
  int polling;
  int ptoken; /* holder, -1: free */
  int pwait[MAXK];
  uint64_t prelease_ns;
  uint32_t samples[]; /* [member][iteration] hand-off latency in ns */
} board_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: wl-sched-stress --members K --iterations N [--jitter F] [--kill-one]\n"
          "         [--rise-us U] [--fall-us U] [--chunks C] [--chunk-bytes B] [--mem-limit B]\n"
          "         [--group NAME] [--seed S] [--baseline] [--quiet]\n"
          "K processes in tick-tock: each iteration asks for the rising-phase token, acquires C\n"
          "chunks of budget over about U us, releases the token at the peak, then gives the\n"
          "chunks back over about U us; durations vary by +-F (0..1). Prints one JSON object.\n"
          "--baseline runs the same again with a gate that polls every 500 us (as Zico's policy\n"
          "slept) and reports both hand-off latencies and their ratio.\n");
}

static int parse_uint(const char *name, const char *v, unsigned lo, unsigned hi, unsigned *out) {
  char *end;
  errno = 0;
  unsigned long x = strtoul(v, &end, 10);
  if (errno || !*v || *end || x < lo || x > hi) {
    fprintf(stderr, "wl-sched-stress: %s '%s': expected an integer from %u to %u\n", name, v, lo,
            hi);
    return -1;
  }
  *out = (unsigned)x;
  return 0;
}

static int parse_args(int argc, char **argv, opts_t *o) {
  memset(o, 0, sizeof *o);
  o->members = 2;
  o->iterations = 1000;
  o->jitter = 0.5;
  o->rise_us = 200;
  o->fall_us = 200;
  o->chunks = 8;
  o->chunk_bytes = (size_t)1 << 20;
  o->alloc_timeout_ms = 5000;
  o->gate_timeout_ms = 5000;
  o->seed = 1;
  static const struct option lo[] = {
      {"members", 1, 0, 'k'},  {"iterations", 1, 0, 'n'},  {"jitter", 1, 0, 'j'},
      {"kill-one", 0, 0, 'x'}, {"rise-us", 1, 0, 'r'},     {"fall-us", 1, 0, 'f'},
      {"chunks", 1, 0, 'c'},   {"chunk-bytes", 1, 0, 'b'}, {"mem-limit", 1, 0, 'm'},
      {"group", 1, 0, 'g'},    {"seed", 1, 0, 's'},        {"quiet", 0, 0, 'q'},
      {"baseline", 0, 0, 'B'}, {"help", 0, 0, 'h'},        {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'k':
      if (parse_uint("--members", optarg, 2, MAXK, &o->members)) return -1;
      break;
    case 'n':
      if (parse_uint("--iterations", optarg, 1, 10000000, &o->iterations)) return -1;
      break;
    case 'j': {
      char *end;
      o->jitter = strtod(optarg, &end);
      if (*end || !(o->jitter >= 0 && o->jitter <= 1)) {
        fprintf(stderr, "wl-sched-stress: --jitter '%s': expected a number from 0 to 1\n", optarg);
        return -1;
      }
      break;
    }
    case 'x':
      o->kill_one = 1;
      break;
    case 'r':
      if (parse_uint("--rise-us", optarg, 0, 10000000, &o->rise_us)) return -1;
      break;
    case 'f':
      if (parse_uint("--fall-us", optarg, 0, 10000000, &o->fall_us)) return -1;
      break;
    case 'c':
      if (parse_uint("--chunks", optarg, 1, 4096, &o->chunks)) return -1;
      break;
    case 'b':
    case 'm': {
      size_t v;
      if (wl__parse_size(optarg, 0, &v) || v == 0) {
        fprintf(stderr, "wl-sched-stress: %s '%s': expected bytes with an optional K/M/G suffix\n",
                c == 'b' ? "--chunk-bytes" : "--mem-limit", optarg);
        return -1;
      }
      if (c == 'b')
        o->chunk_bytes = v;
      else
        o->limit = v;
      break;
    }
    case 'g':
      if (wl_sched_group_name_check(optarg)) {
        fprintf(stderr, "wl-sched-stress: --group '%s': expected 1 to %d of A-Z a-z 0-9 . _ -\n",
                optarg, WL_SCHED_GROUP_MAX);
        return -1;
      }
      snprintf(o->group, sizeof o->group, "%s", optarg);
      break;
    case 's':
      if (parse_uint("--seed", optarg, 0, UINT32_MAX - 1, &o->seed)) return -1;
      break;
    case 'q':
      o->quiet = 1;
      break;
    case 'B':
      o->baseline = 1;
      break;
    case 'h':
      usage(stdout);
      exit(0);
    default:
      usage(stderr);
      return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "wl-sched-stress: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return -1;
  }
  if (!o->group[0]) snprintf(o->group, sizeof o->group, "stress-%d", (int)getpid());
  /* Tight but enough for tick-tock: one member at its peak, the others a quarter of theirs
   * on average (a member rising fast may wait for the one falling). */
  if (!o->limit) {
    size_t peak = o->chunk_bytes * o->chunks;
    o->limit = peak + (peak * (o->members - 1)) / 4;
  }
  return 0;
}

static void sleep_us(double us) {
  if (us <= 0) return;
  struct timespec ts = {(time_t)(us / 1e6), (long)(fmod(us, 1e6) * 1000.0)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

static double vary(unsigned *rng, double base, double jitter) {
  double u = (double)rand_r(rng) / ((double)RAND_MAX + 1.0);
  return base * (1.0 + jitter * (2.0 * u - 1.0));
}

/* The baseline's gate: a token on the board, handed to the next waiting member in role order at
 * release, noticed by a waiter that looks every 500 us. Returns the hand-off latency when the
 * caller had to wait, else 0. */
#define POLL_US 500.0
static uint64_t poll_enter(board_t *b, unsigned me) {
  int free_ = -1;
  if (__atomic_compare_exchange_n(&b->ptoken, &free_, (int)me, false, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE) ||
      free_ == (int)me)
    return 0;
  __atomic_store_n(&b->pwait[me], 1, __ATOMIC_SEQ_CST);
  for (;;) {
    sleep_us(POLL_US);
    int t = __atomic_load_n(&b->ptoken, __ATOMIC_ACQUIRE);
    free_ = -1;
    if (t == (int)me ||
        (t == -1 && __atomic_compare_exchange_n(&b->ptoken, &free_, (int)me, false,
                                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)))
      break;
  }
  __atomic_store_n(&b->pwait[me], 0, __ATOMIC_SEQ_CST);
  uint64_t r = __atomic_load_n(&b->prelease_ns, __ATOMIC_ACQUIRE), now = wl__now_ns();
  return now > r ? now - r : 1;
}

static void poll_release(board_t *b, unsigned me, unsigned k) {
  __atomic_store_n(&b->prelease_ns, wl__now_ns(), __ATOMIC_RELEASE);
  for (unsigned d = 1; d < k; d++) {
    unsigned j = (me + d) % k;
    if (__atomic_load_n(&b->pwait[j], __ATOMIC_SEQ_CST)) {
      __atomic_store_n(&b->ptoken, (int)j, __ATOMIC_RELEASE);
      return;
    }
  }
  __atomic_store_n(&b->ptoken, -1, __ATOMIC_RELEASE);
}

static int member(board_t *b, const opts_t *o, unsigned me) {
  wl_sched_config_t c;
  wl_sched_config_default(&c);
  c.group = o->group;
  c.waves = o->members;
  c.role = (int)me;
  c.mem_limit = o->limit;
  c.gate_timeout_ms = o->gate_timeout_ms;
  c.alloc_timeout_ms = o->alloc_timeout_ms;
  c.flags = WL_SCHED_MANUAL_GATE;
  wl_sched_t *s;
  if (wl_sched_join(&s, &c)) {
    __atomic_store_n(&b->join_failed, 1, __ATOMIC_RELAXED);
    return 2;
  }
  while (!__atomic_load_n(&b->go, __ATOMIC_ACQUIRE)) sleep_us(200);
  unsigned rng = o->seed * 7919u + me;
  uint32_t *samples = b->samples + (size_t)me * o->iterations;
  uint64_t waits = 0;
  size_t held = 0;
  bool polling = __atomic_load_n(&b->polling, __ATOMIC_RELAXED);
  for (unsigned it = 0; it < o->iterations; it++) {
    int g = WL_GATE_HELD;
    wl_sched_stats_t st;
    if (polling) {
      uint64_t h = poll_enter(b, me);
      if (h) samples[b->nsamples[me]++] = h > UINT32_MAX ? UINT32_MAX : (uint32_t)h;
      wl_sched_stats_get(s, &st);
    } else {
      g = wl_gate_enter(s);
      wl_sched_stats_get(s, &st);
      if (st.gate_waits != waits) {
        waits = st.gate_waits;
        uint64_t h = st.last_handoff_ns;
        samples[b->nsamples[me]++] = h > UINT32_MAX ? UINT32_MAX : (uint32_t)h;
      }
    }
    uint64_t now = wl__now_ns();
    uint64_t k = __atomic_load_n(&b->kill_ns, __ATOMIC_ACQUIRE);
    if (k && now > k) {
      uint64_t zero = 0;
      __atomic_compare_exchange_n(&b->recovered_ns, &zero, now, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_RELAXED);
    }
    /* Rising: nobody else may be rising now (a killed member does not count). */
    __atomic_store_n(&b->in_rising[me], 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&b->holder, (int)me, __ATOMIC_SEQ_CST);
    for (unsigned j = 0; j < o->members; j++)
      if (j != me && __atomic_load_n(&b->in_rising[j], __ATOMIC_SEQ_CST) &&
          !__atomic_load_n(&b->killed[j], __ATOMIC_SEQ_CST))
        __atomic_add_fetch(&b->overlap_violations, 1, __ATOMIC_RELAXED);
    (void)g;
    for (unsigned ch = 0; ch < o->chunks; ch++) {
      uint64_t w0 = st.ledger_waits;
      int rc = wl_sched_acquire(s, o->chunk_bytes, wl_sched_alloc_deadline(s));
      wl_sched_stats_get(s, &st);
      if (st.ledger_waits != w0) __atomic_add_fetch(&b->budget_waits, 1, __ATOMIC_RELAXED);
      if (rc) {
        __atomic_add_fetch(&b->budget_failures, 1, __ATOMIC_RELAXED);
      } else {
        held += o->chunk_bytes;
        __atomic_store_n(&b->held[me], held, __ATOMIC_SEQ_CST);
        /* What the living members hold can never exceed the budget. */
        uint64_t sum = 0;
        for (unsigned j = 0; j < o->members; j++)
          if (!__atomic_load_n(&b->killed[j], __ATOMIC_SEQ_CST))
            sum += __atomic_load_n(&b->held[j], __ATOMIC_SEQ_CST);
        if (sum > o->limit) __atomic_add_fetch(&b->budget_violations, 1, __ATOMIC_RELAXED);
      }
      sleep_us(vary(&rng, (double)o->rise_us / o->chunks, o->jitter));
    }
    /* The peak: out of the rising phase, then the token goes. */
    __atomic_store_n(&b->holder, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&b->in_rising[me], 0, __ATOMIC_SEQ_CST);
    if (polling)
      poll_release(b, me, o->members);
    else
      wl_gate_release(s);
    /* Falling: the chunks go back (counted down before the ledger sees them). */
    size_t step = held / o->chunks;
    for (unsigned ch = 0; ch < o->chunks && held; ch++) {
      size_t give = ch + 1 == o->chunks ? held : WL_MIN(step, held);
      held -= give;
      __atomic_store_n(&b->held[me], held, __ATOMIC_SEQ_CST);
      wl_sched_release(s, give);
      sleep_us(vary(&rng, (double)o->fall_us / o->chunks, o->jitter));
    }
    __atomic_add_fetch(&b->done[me], 1, __ATOMIC_RELEASE);
  }
  wl_sched_stats_t end;
  wl_sched_stats_get(s, &end);
  __atomic_store_n(&b->reaped[me], end.group_reaped, __ATOMIC_RELEASE);
  wl_sched_leave(s);
  return 0;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Forks the members, kills one when asked, waits for all. Returns how many survivors failed;
 * *victim is the killed member or -1. */
static int run_members(board_t *b, const opts_t *o, bool kill_one, int *victim) {
  pid_t pids[MAXK];
  *victim = -1;
  wl_sched_group_remove(o->group); /* a stale group of an earlier, killed run */
  fflush(stdout);
  for (unsigned i = 0; i < o->members; i++) {
    pids[i] = fork();
    if (pids[i] == 0) _exit(member(b, o, i));
    if (pids[i] < 0) {
      fprintf(stderr, "wl-sched-stress: fork: %s\n", strerror(errno));
      for (unsigned j = 0; j < i; j++) kill(pids[j], SIGKILL);
      return -1;
    }
  }
  __atomic_store_n(&b->go, 1, __ATOMIC_RELEASE);
  if (kill_one) {
    /* Member 0, a quarter of the way in, while it holds the token mid-rise. */
    uint64_t deadline = wl__now_ns() + 60ull * 1000000000ull;
    while (wl__now_ns() < deadline && !b->join_failed) {
      if (__atomic_load_n(&b->done[0], __ATOMIC_ACQUIRE) >= o->iterations / 4 &&
          __atomic_load_n(&b->holder, __ATOMIC_SEQ_CST) == 0) {
        __atomic_store_n(&b->killed[0], 1, __ATOMIC_SEQ_CST);
        __atomic_store_n(&b->kill_ns, wl__now_ns(), __ATOMIC_RELEASE);
        kill(pids[0], SIGKILL);
        *victim = 0;
        break;
      }
      if (__atomic_load_n(&b->done[0], __ATOMIC_ACQUIRE) >= o->iterations) break;
      sleep_us(20);
    }
  }
  int failed = 0;
  for (unsigned i = 0; i < o->members; i++) {
    int st;
    waitpid(pids[i], &st, 0);
    if ((int)i == *victim) continue;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
  }
  wl_sched_group_remove(o->group); /* the victim never left */
  return failed;
}

/* Hand-off latencies of every member, together: p50, p99, max in us; returns how many. */
static size_t handoffs(const board_t *b, const opts_t *o, double *p50, double *p99, double *pmax) {
  size_t nsamples = (size_t)o->members * o->iterations;
  uint32_t *all = malloc((nsamples ? nsamples : 1) * sizeof *all);
  size_t n = 0;
  for (unsigned i = 0; i < o->members; i++)
    for (uint64_t k = 0; k < b->nsamples[i] && all; k++)
      all[n++] = b->samples[(size_t)i * o->iterations + k];
  *p50 = *p99 = *pmax = 0;
  if (n && all) {
    qsort(all, n, sizeof *all, cmp_u32);
    *p50 = all[n / 2] / 1e3;
    *p99 = all[(size_t)((double)(n - 1) * 0.99)] / 1e3;
    *pmax = all[n - 1] / 1e3;
  }
  free(all);
  return n;
}

int main(int argc, char **argv) {
  opts_t o;
  if (parse_args(argc, argv, &o)) return 2;
  size_t nsamples = (size_t)o.members * o.iterations;
  size_t size = sizeof(board_t) + nsamples * sizeof(uint32_t);
  board_t *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (b == MAP_FAILED) {
    fprintf(stderr, "wl-sched-stress: cannot map %zu bytes for the results\n", size);
    return 2;
  }
  b->holder = -1;
  uint64_t t0 = wl__now_ns();
  int victim;
  int failed = run_members(b, &o, o.kill_one, &victim);
  if (failed < 0) return 2;
  double wall = (double)(wl__now_ns() - t0) / 1e9;
  double p50, p99, pmax;
  size_t n = handoffs(b, &o, &p50, &p99, &pmax);
  uint64_t done = 0, expect = 0;
  for (unsigned i = 0; i < o.members; i++) {
    done += b->done[i];
    if ((int)i != victim) expect += o.iterations;
  }
  double recovered_ms = -1;
  if (victim >= 0 && b->recovered_ns > b->kill_ns)
    recovered_ms = (double)(b->recovered_ns - b->kill_ns) / 1e6;
  uint64_t reaped = 0;
  for (unsigned i = 0; i < o.members; i++)
    if ((int)i != victim && b->reaped[i] > reaped) reaped = b->reaped[i];
  /* Recovery is events, not a time: the victim's slot (and the token it held) was reclaimed, and
   * a survivor entered the gate after the kill. How long that took is reported, not judged. */
  bool ok = !failed && !b->join_failed && b->overlap_violations == 0 && b->budget_violations == 0 &&
            done >= expect && (!o.kill_one || (victim >= 0 && recovered_ms >= 0 && reaped >= 1));
  printf("{\"members\":%u,\"iterations\":%u,\"jitter\":%.2f,\"iterations_done\":%llu,"
         "\"overlap_violations\":%llu,\"handoffs\":%zu,\"handoff_us_p50\":%.1f,"
         "\"handoff_us_p99\":%.1f,\"handoff_us_max\":%.1f,\"budget_limit\":%zu,"
         "\"budget_waits\":%llu,\"budget_failures\":%llu,\"budget_violations\":%llu,"
         "\"killed\":%s",
         o.members, o.iterations, o.jitter, (unsigned long long)done,
         (unsigned long long)b->overlap_violations, n, p50, p99, pmax, o.limit,
         (unsigned long long)b->budget_waits, (unsigned long long)b->budget_failures,
         (unsigned long long)b->budget_violations, victim >= 0 ? "true" : "false");
  if (o.kill_one)
    printf(",\"recovered\":%s,\"recovered_ms\":%.1f,\"reaped\":%llu",
           recovered_ms >= 0 ? "true" : "false", recovered_ms, (unsigned long long)reaped);
  /* The main run's counters, for the table (the baseline reuses the board). */
  unsigned long long overlap = b->overlap_violations, bwaits = b->budget_waits,
                     bfails = b->budget_failures, bviol = b->budget_violations,
                     victim_done = victim >= 0 ? b->done[victim] : 0;
  /* The baseline: the same members and ledger, a gate that polls every 500 us. */
  double bp50 = 0, bp99 = 0, bpmax = 0;
  size_t bn = 0;
  uint64_t boverlap = 0;
  if (o.baseline) {
    size_t keep = offsetof(board_t, samples);
    memset(b, 0, keep);
    b->holder = -1;
    b->ptoken = -1;
    b->polling = 1;
    int bv;
    int bf = run_members(b, &o, false, &bv);
    bn = handoffs(b, &o, &bp50, &bp99, &bpmax);
    boverlap = b->overlap_violations;
    ok = ok && bf == 0 && boverlap == 0;
    printf(",\"baseline_handoff_us_p50\":%.1f,\"baseline_handoff_us_p99\":%.1f,"
           "\"baseline_overlap_violations\":%llu,\"handoff_p50_speedup\":%.1f",
           bp50, bp99, (unsigned long long)boverlap, p50 > 0 ? bp50 / p50 : 0.0);
  }
  printf(",\"wall_s\":%.3f,\"ok\":%s}\n", wall, ok ? "true" : "false");
  if (!o.quiet) {
    fprintf(stderr, "wl-sched-stress: %u members x %u iterations in %.2f s\n", o.members,
            o.iterations, wall);
    fprintf(stderr, "  %-22s %10llu of %llu\n", "iterations done", (unsigned long long)done,
            (unsigned long long)expect + victim_done);
    fprintf(stderr, "  %-22s %10llu\n", "overlap violations", overlap);
    fprintf(stderr, "  %-22s %10.1f us p50 %10.1f us p99 (%zu hand-offs)\n", "hand-off", p50, p99,
            n);
    if (o.baseline)
      fprintf(stderr, "  %-22s %10.1f us p50 %10.1f us p99 (%zu hand-offs), %.1fx slower\n",
              "hand-off, 500 us poll", bp50, bp99, bn, p50 > 0 ? bp50 / p50 : 0.0);
    fprintf(stderr, "  %-22s %10llu waits %6llu failures %6llu violations\n", "budget", bwaits,
            bfails, bviol);
    if (o.kill_one) fprintf(stderr, "  %-22s %10.1f ms\n", "recovered after kill", recovered_ms);
    fprintf(stderr, "  %-22s %10s\n", "result", ok ? "ok" : "FAILED");
  }
  munmap(b, size);
  return ok ? 0 : 1;
}
