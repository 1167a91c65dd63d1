/* Helpers for libsched's multi-process tests: unique group names, forked children that report
 * back through pipes, bounded waits, and cleanup of /dev/shm. */
#ifndef WAVELET_TESTS_SCHED_TEST_H
#define WAVELET_TESTS_SCHED_TEST_H

#include "internal.h"
#include "wltest.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB    ((size_t)1 << 20)
#define SEC_NS 1000000000ull
#define MS_NS  1000000ull

/* A fresh group name per call, unique to this process: tests never share a segment. */
static inline const char *t_group(char *buf, size_t len) {
  static int counter;
  snprintf(buf, len, "wltest-%d-%d", (int)getpid(), ++counter);
  return buf;
}

static inline wl_sched_config_t t_config(const char *group, unsigned waves, size_t limit) {
  wl_sched_config_t c;
  wl_sched_config_default(&c);
  c.group = group;
  c.waves = waves;
  c.mem_limit = limit;
  return c;
}

static inline bool t_shm_exists(const char *group) {
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/wavelet-%s", group);
  struct stat st;
  return stat(path, &st) == 0;
}

/* Removes every segment this process's tests may have left (called at the end of main). */
static inline int t_cleanup_shm(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "wavelet-wltest-%d-", (int)getpid());
  int left = 0;
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
      char name[300];
      snprintf(name, sizeof name, "/%s", e->d_name);
      shm_unlink(name);
      left++;
    }
  }
  closedir(d);
  return left;
}

/* A forked child with two pipes: it sends one-byte notes up and receives commands down. */
typedef struct t_child_s {
  pid_t pid;
  int up;   /* parent reads */
  int down; /* parent writes */
} t_child_t;

typedef int (*t_child_fn)(int up, int down, void *arg);

static inline t_child_t t_spawn(t_child_fn fn, void *arg) {
  int a[2], b[2];
  t_child_t c = {-1, -1, -1};
  if (pipe(a) || pipe(b)) return c;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(a[0]);
    close(b[1]);
    int rc = fn(a[1], b[0], arg);
    _exit(rc);
  }
  close(a[1]);
  close(b[0]);
  c.pid = pid;
  c.up = a[0];
  c.down = b[1];
  return c;
}

static inline void t_note(int fd, char c) {
  /* A child that already died makes this EPIPE, for the test to report, not a SIGPIPE that ends
   * the whole runner. */
  signal(SIGPIPE, SIG_IGN);
  ssize_t n = write(fd, &c, 1);
  (void)n;
}

/* Reads one note within timeout_ms; the note, or -1 on timeout / EOF. */
static inline int t_read(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, timeout_ms) <= 0) return -1;
  char c;
  return read(fd, &c, 1) == 1 ? (unsigned char)c : -1;
}

/* Waits for a child's exit within timeout_ms; its exit status (>= 0), 128 + signal when
 * killed, or -1 when it did not exit in time (it is then killed). */
static inline int t_wait(t_child_t *c, int timeout_ms) {
  uint64_t deadline = wl__now_ns() + (uint64_t)timeout_ms * MS_NS;
  int st;
  for (;;) {
    pid_t r = waitpid(c->pid, &st, WNOHANG);
    if (r == c->pid) break;
    if (wl__now_ns() > deadline) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &st, 0);
      close(c->up);
      close(c->down);
      return -1;
    }
    struct timespec ts = {0, 2 * 1000000};
    nanosleep(&ts, NULL);
  }
  close(c->up);
  close(c->down);
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

static inline void t_kill(t_child_t *c) {
  kill(c->pid, SIGKILL);
}

static inline void t_sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

/* A thread that SIGKILLs pid after delay_ms and records when (for recovery-time checks). */
typedef struct killer_s {
  pid_t pid;
  unsigned delay_ms;
  uint64_t killed_ns;
} killer_t;

static inline void *killer_thread(void *arg) {
  killer_t *k = arg;
  t_sleep_ms(k->delay_ms);
  __atomic_store_n(&k->killed_ns, wl__now_ns(), __ATOMIC_RELEASE);
  kill(k->pid, SIGKILL);
  return NULL;
}

/* Polls cond (a statement-expression) every 2 ms until true or timeout_ms; true when it held. */
#define T_UNTIL(timeout_ms, cond)                                                                  \
  ({                                                                                               \
    uint64_t _dl = wl__now_ns() + (uint64_t)(timeout_ms)*MS_NS;                                    \
    bool _ok = false;                                                                              \
    for (;;) {                                                                                     \
      if (cond) {                                                                                  \
        _ok = true;                                                                                \
        break;                                                                                     \
      }                                                                                            \
      if (wl__now_ns() > _dl) break;                                                               \
      t_sleep_ms(2);                                                                               \
    }                                                                                              \
    _ok;                                                                                           \
  })

/* Count of members the caller sees (reaping the dead first). */
static inline int t_members(wl_sched_t *s) {
  wl_sched_member_t m[WL_SCHED_MAX_MEMBERS];
  return wl_sched_members(s, m, WL_SCHED_MAX_MEMBERS);
}

/* The member record of pid, or false. */
static inline bool t_member(wl_sched_t *s, pid_t pid, wl_sched_member_t *out) {
  wl_sched_member_t m[WL_SCHED_MAX_MEMBERS];
  int n = wl_sched_members(s, m, WL_SCHED_MAX_MEMBERS);
  for (int i = 0; i < n && i < WL_SCHED_MAX_MEMBERS; i++)
    if (m[i].pid == pid) {
      *out = m[i];
      return true;
    }
  return false;
}

#endif
