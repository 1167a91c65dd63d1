/* For tests only: fork while other threads are inside the hooks. Worker threads allocate, free
 * and launch in a loop (so at any instant one may hold a pointer-map shard or be rebuilding one,
 * liballoc's lock, a trace ring or the group's lock) while the main thread forks again and again;
 * each child makes a few hooked calls and _exits. A child that does not exit 0 within a deadline (a
 * hang: it is killed) is a failure. Prints "forker: forks N ok K failed F hung H" and exits 0 when
 * all ok. "wl-ip-forker N early": the forks come while another thread's first hooked call
 * initialises the interposer (its init lock held). */
#include <cuda.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "churn.h"

#define THREADS     4
#define DEADLINE_MS 30000 /* per child: generous, a hang is what it catches, not slowness */

static CUcontext ctx;
static CUfunction kfn;
static wltest_churn_t ch; /* its stop and rounds serve every thread here, the forks too */

static const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry wl_forker_kernel()\n{\n ret;\n}\n";

static int setup(void) {
  CUdevice dev;
  CUmodule m;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx) || cuModuleLoadData(&m, ptx) ||
      cuModuleGetFunction(&kfn, m, "wl_forker_kernel"))
    return -1;
  ch.ctx = ctx;
  ch.fn = kfn;
  return 0;
}

/* Many live pointers, then all freed, again and again: the pointer map's shards grow, fill with
 * tombstones and are rebuilt (a rehash, an mmap and a munmap under the shard's lock). */
#define HOARD 4096
static void *hoard(void *arg) {
  (void)arg;
  static CUdeviceptr p[HOARD];
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return NULL;
  while (!ch.stop) {
    int n = 0;
    while (n < HOARD && !ch.stop && cuMemAlloc_v2(&p[n], 4096) == CUDA_SUCCESS) n++;
    while (n > 0) cuMemFree_v2(p[--n]);
    __atomic_add_fetch(&ch.rounds, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

/* The child: a few hooked calls of each kind. Exit code says which failed. */
static void child(void) {
  alarm(DEADLINE_MS / 1000 + 5); /* a hang kills the child even if the parent's deadline fails */
  for (int i = 0; i < 3; i++) {
    CUdeviceptr d = 0, e = 0;
    if (cuMemAlloc_v2(&d, (size_t)(i + 1) << 20) != CUDA_SUCCESS) _exit(3);
    if (cuMemFree_v2(d) != CUDA_SUCCESS) _exit(4);
    if (cuMemAllocAsync(&e, 1 << 20, NULL) != CUDA_SUCCESS) _exit(5);
    if (cuMemFreeAsync(e, NULL) != CUDA_SUCCESS) _exit(6);
    if (cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) _exit(7);
  }
  _exit(0);
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* 0 exited 0; 1 exited otherwise; 2 still running at the deadline (killed). */
static int reap(pid_t pid, int *status) {
  long long end = now_ms() + DEADLINE_MS;
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return WIFEXITED(*status) && WEXITSTATUS(*status) == 0 ? 0 : 1;
    if (r < 0) return 1;
    if (now_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, status, 0);
      return 2;
    }
    usleep(200);
  }
}

typedef struct tally_s {
  int ok, failed, hung;
} tally_t;

/* Waits for child i and counts how it ended; the first few failures and hangs say so. */
static void tally(tally_t *t, int i, pid_t pid) {
  int st = 0, r = pid < 0 ? 1 : reap(pid, &st);
  if (r == 0) {
    t->ok++;
  } else if (r == 1) {
    if (t->failed++ < 5)
      fprintf(stderr, "forker: child %d: %s %d\n", i,
              pid < 0         ? "fork"
              : WIFEXITED(st) ? "exit"
                              : "signal",
              pid < 0         ? -1
              : WIFEXITED(st) ? WEXITSTATUS(st)
                              : WTERMSIG(st));
  } else if (t->hung++ < 5) {
    fprintf(stderr, "forker: child %d hung (killed)\n", i);
  }
}

/* "early": the first hooked call of the process (the interposer's initialisation, under its
 * lock) runs on another thread while main forks again and again; the children must not find
 * that lock held for good. */
static void *first_call(void *arg) {
  (void)arg;
  CUdeviceptr d;
  /* cuInit and the context calls are not hooked: the allocation is the first hooked call */
  if (setup() == 0 && cuMemAlloc_v2(&d, 4096) == CUDA_SUCCESS && cuMemFree_v2(d) == CUDA_SUCCESS)
    __atomic_store_n(&ch.rounds, 1, __ATOMIC_RELEASE);
  return NULL;
}

static int early(int forks) {
  pthread_t t;
  pthread_create(&t, NULL, first_call, NULL);
  pid_t pids[64];
  if (forks > 64) forks = 64;
  for (int i = 0; i < forks; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      alarm(DEADLINE_MS / 1000 + 5);
      /* its own context: the parent's may not exist yet */
      if (setup()) _exit(2);
      child();
    }
  }
  pthread_join(t, NULL);
  tally_t n = {0};
  for (int i = 0; i < forks; i++) tally(&n, i, pids[i]);
  printf("forker: forks %d ok %d failed %d hung %d\n", forks, n.ok, n.failed, n.hung);
  return n.ok == forks && ch.rounds ? 0 : 1;
}

int main(int argc, char **argv) {
  int forks = argc > 1 ? atoi(argv[1]) : 100;
  alarm(600); /* the parent itself hanging (at exit, in a hook) fails the test too */
  if (argc > 2 && !strcmp(argv[2], "early")) return early(forks);
  if (setup()) {
    printf("forker: setup failed\n");
    return 1;
  }
  pthread_t t[THREADS + 1];
  for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, wltest_churn, &ch);
  pthread_create(&t[THREADS], NULL, hoard, NULL);
  /* every thread inside its loop before the first fork (at most 5 s) */
  for (int i = 0; i < 5000 && __atomic_load_n(&ch.rounds, __ATOMIC_RELAXED) < 50; i++) usleep(1000);
  tally_t n = {0};
  for (int i = 0; i < forks; i++) {
    pid_t pid = fork();
    if (pid == 0) child();
    tally(&n, i, pid);
  }
  ch.stop = 1;
  for (int i = 0; i <= THREADS; i++) pthread_join(t[i], NULL);
  printf("forker: forks %d ok %d failed %d hung %d\n", forks, n.ok, n.failed, n.hung);
  return n.ok == forks ? 0 : 1;
}
