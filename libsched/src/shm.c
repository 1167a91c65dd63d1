/* The group segment: creation and validation, the robust group lock, liveness, join and leave,
 * reclaiming dead members, and leaving safely when the segment cannot be trusted. */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

/* How long one attempt to take the group lock may wait. Critical sections are microseconds; a
 * dead holder is reported at once by the robust mutex, so only a stopped or wedged holder (or a
 * corrupted lock word) waits this long. */
#define LOCK_WAIT_NS (1000ull * 1000000ull)
/* Consecutive lock timeouts after which the member gives up on the group. */
#define LOCK_FAILURES_MAX 3
/* How long join waits for another joiner holding the init lock. */
#define INIT_WAIT_NS (5000ull * 1000000ull)

/* ---- fork: a child never acts for its parent's member ---------------------------------------*/

/* Segment descriptors of this process (stored + 1, so zero means empty). A forked child closes
 * them: an inherited copy would keep the parent's liveness lock alive after the parent dies
 * (the mapping, which holds the file too, is not inherited at all: MADV_DONTFORK). */
#define FORK_FDS 64
static int fork_fds[FORK_FDS];
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

unsigned wl__fork_generation;

static void seg_maps_forget(void);

static void fork_child(void) {
  __atomic_add_fetch(&wl__fork_generation, 1, __ATOMIC_RELAXED);
  seg_maps_forget();
  for (int i = 0; i < FORK_FDS; i++) {
    int v = __atomic_exchange_n(&fork_fds[i], 0, __ATOMIC_RELAXED);
    if (v > 0) close(v - 1);
  }
}

static void fork_register_once(void) {
  pthread_atfork(NULL, NULL, fork_child);
}

static int fork_track(int fd) {
  pthread_once(&fork_once, fork_register_once);
  for (int i = 0; i < FORK_FDS; i++) {
    int zero = 0;
    if (__atomic_compare_exchange_n(&fork_fds[i], &zero, fd + 1, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED))
      return i;
  }
  return -1; /* more groups than slots: a forked child keeps the lock; only liveness suffers */
}

static void fork_untrack(int index, int fd) {
  if (index < 0) return;
  int v = fd + 1;
  __atomic_compare_exchange_n(&fork_fds[index], &v, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* ---- small helpers ---------------------------------------------------------------------------*/

/* Field 22 of /proc/<pid>/stat (start time in clock ticks since boot) in *start: 1 read; 0 when
 * the process has exited and only its zombie waits for its parent (field 3 'Z' or 'X'); 2 when
 * /proc has no such process (gone, or hidden: hidepid=2 hides other users' processes so); -1
 * when it cannot be read (hidepid=1, no /proc). */
static int proc_start(pid_t pid, uint64_t *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  *start = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 2 : -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int err = errno;
  close(fd);
  if (n < 0) return err == ESRCH ? 0 : -1;
  if (n == 0) return 0;
  buf[n] = 0;
  /* The command name may contain spaces and parentheses: fields start after the last ')'. */
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  p++;
  if (p[0] == ' ' && (p[1] == 'Z' || p[1] == 'X')) return 0;
  for (int field = 3; field < 22 && *p; field++) {
    while (*p == ' ') p++;
    while (*p && *p != ' ') p++;
  }
  *start = strtoull(p, NULL, 10);
  return *start ? 1 : -1;
}

/* The start time recorded at join: 0 when it cannot be read (the pid check then has only the
 * pid). */
static uint64_t proc_start_time(pid_t pid) {
  uint64_t st;
  return proc_start(pid, &st) == 1 ? st : 0;
}

/* ---- liveness locks --------------------------------------------------------------------------
 * A member holds an OFD lock on its slot's byte for as long as it is a member, a joiner (or a
 * leaver) one on the init byte; the kernel drops them when the process dies, however it dies.
 * Where the kernel has no OFD locks (gVisor answers EINVAL), a member is known alive by the pid
 * and start time in its slot (wl__slot_alive), which needs the members to share one PID
 * namespace, and the init lock (wl__life_lock) is flock on the segment file, which also dies
 * with its holder. */
static int no_ofd; /* atomic: 1 once the kernel refused an OFD lock command */

/* True (and remembered) when rc says the kernel has no OFD locks. */
static bool ofd_missing(int rc) {
  if (rc != -EINVAL) return false;
  if (!__atomic_exchange_n(&no_ofd, 1, __ATOMIC_RELAXED))
    wl__info("this kernel has no open file description locks: group members are known alive by "
             "pid and start time, so they must share one PID namespace");
  return true;
}

static int ofd_lock(int fd, off_t off, short type) {
  if (__atomic_load_n(&no_ofd, __ATOMIC_RELAXED)) return -EINVAL;
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = off, .l_len = 1};
  int rc = fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
  ofd_missing(rc);
  return rc;
}

/* 1 when another open file description holds a lock in [off, off + len), 0 when none,
 * negative errno when the query failed (-EINVAL: no OFD locks). */
static int ofd_held(int fd, off_t off, off_t len) {
  if (__atomic_load_n(&no_ofd, __ATOMIC_RELAXED)) return -EINVAL;
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = off, .l_len = len};
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) {
    int rc = -errno;
    ofd_missing(rc);
    return rc;
  }
  return fl.l_type != F_UNLCK;
}

/* The init lock (byte 0: wl__life_lock), on fd, a descriptor of s's segment, which s->fd may
 * not hold yet. */
static int init_lock(wl_sched_t *s, int fd) {
  uint64_t deadline = wl__now_ns() + INIT_WAIT_NS;
  for (;;) {
    int rc = wl__life_lock(fd);
    if (rc == 0) s->init_locked = true;
    if (rc != -EAGAIN) return rc;
    /* Held by another joiner or leaver doing bounded work (or a stopped one). Join is rare. */
    if (wl__now_ns() > deadline) return -EBUSY;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

static void init_unlock(wl_sched_t *s, int fd) {
  s->init_locked = false;
  wl__life_unlock(fd);
}

/* 1 when a joiner or leaver other than s holds the init lock, 0 when none does. */
static int init_held(wl_sched_t *s) {
  /* We hold it ourselves: the one the lock word names is a dead one. (Neither query sees our
   * own lock, and flock's try would take it over.) */
  if (s->init_locked) return 0;
  return wl__life_held(s->fd) != 0; /* unknown: alive (the wait is bounded) */
}

#define UNKNOWN_NOTE                                                                               \
  " (without OFD locks its members cannot be seen: once they are gone, remove it with "            \
  "wl_sched_group_remove)"

/* Start time written into a slot whose member gave up its liveness (degraded): no process has
 * it, so the pid check reads the slot as dead, as dropping the OFD lock does. */
#define START_GONE UINT64_MAX

/* The pid and start time check: whether the process in sl is still the one that joined. */
static bool slot_pid_alive(const wl__slot_t *sl) {
  pid_t pid = WL_LD(sl->pid);
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  uint64_t st = WL_LD(sl->start_time), now;
  if (!st) return true;
  if (st == START_GONE) return false;
  int r = proc_start(pid, &now);
  if (r == 1) return now == st;
  if (r == 0) return false;
  /* Not in /proc, or unreadable there. Gone since kill looked (a zombie is in /proc until
   * reaped, and then its pid is free), or hidden from us (hidepid): kill, asked again, tells.
   * A member that cannot be seen is alive while its pid is: reading it dead would hand its
   * slot, bookings and token to others while it runs. */
  return !(kill(pid, 0) != 0 && errno == ESRCH);
}

/* Whether any member of the segment at h passes the pid check (without OFD locks). */
static bool any_pid_alive(const wl__shm_t *h) {
  for (unsigned i = 0; i < WL__SLOTS; i++)
    if (WL_LD(h->slots[i].state) == WL__SLOT_LIVE && slot_pid_alive(&h->slots[i])) return true;
  return false;
}

int wl_sched_group_name_check(const char *name) {
  if (!name || !*name || name[0] == '.' || name[0] == '-') return -EINVAL;
  size_t n = 0;
  for (const char *p = name; *p; p++, n++) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok || n >= WL_SCHED_GROUP_MAX) return -EINVAL;
  }
  return 0;
}

int wl_sched_group_name(const char *uuid, char *buf, size_t len) {
  if (!uuid || !buf) return -EINVAL;
  char tmp[WL_SCHED_GROUP_MAX + 1] = "gpu-";
  size_t n = 4;
  const char *p = uuid;
  /* "GPU-1234abcd-..." as NVML and nvidia-smi print it, or the bare hex of a CUuuid. */
  if (strncasecmp(p, "GPU-", 4) == 0) p += 4;
  for (; *p; p++) {
    char c = *p;
    if (c == '-') continue;
    bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hex) return -EINVAL;
    if (n >= WL_SCHED_GROUP_MAX) return -EINVAL;
    tmp[n++] = (c >= 'A' && c <= 'F') ? (char)(c - 'A' + 'a') : c;
  }
  if (n == 4) return -EINVAL;
  tmp[n] = 0;
  if (n + 1 > len) return -ENOSPC;
  memcpy(buf, tmp, n + 1);
  return 0;
}

int wl_sched_group_gpu_name(const char *group, const char *gpu_uuid, char *buf, size_t len) {
  char gpu[WL_SCHED_GROUP_MAX + 1];
  if (!group || !buf || wl_sched_group_name_check(group) ||
      wl_sched_group_name(gpu_uuid, gpu, sizeof gpu))
    return -EINVAL;
  uint32_t h = 2166136261u; /* FNV-1a of the canonical spelling, so that every spelling agrees */
  for (const char *p = gpu; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
  /* The suffix always fits: a long name gives way. */
  size_t keep = strlen(group) < WL_SCHED_GROUP_MAX - 9 ? strlen(group) : WL_SCHED_GROUP_MAX - 9;
  if (keep + 10 > len) return -ENOSPC;
  snprintf(buf, len, "%.*s.%08x", (int)keep, group, h);
  return 0;
}

/* The POSIX shared-memory name of a group: 0, or -EINVAL for a bad group name. */
#define SHM_NAME_MAX (WL_SCHED_GROUP_MAX + 16)
static int shm_name_of(const char *group, char name[SHM_NAME_MAX]) {
  if (wl_sched_group_name_check(group)) return -EINVAL;
  snprintf(name, SHM_NAME_MAX, WL__SHM_PREFIX "%s", group);
  return 0;
}

int wl_sched_group_exists(const char *group) {
  char name[SHM_NAME_MAX];
  if (shm_name_of(group, name)) return -EINVAL;
  int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return errno == ENOENT ? 0 : errno == EACCES ? 1 : -errno;
  close(fd);
  return 1;
}

int wl_sched_group_remove(const char *group) {
  char name[SHM_NAME_MAX];
  if (shm_name_of(group, name)) return -EINVAL;
  return shm_unlink(name) == 0 ? 0 : -errno;
}

int wl_sched_group_remove_all(const char *group) {
  int rc = wl_sched_group_remove(group);
  if (rc == -EINVAL) return rc;
  /* Their files under /dev/shm, where glibc puts POSIX shared memory: "wavelet-<group>.*". */
  char prefix[WL_SCHED_GROUP_MAX + 16];
  snprintf(prefix, sizeof prefix, "%s%s.", WL__SHM_PREFIX + 1, group);
  size_t plen = strlen(prefix);
  DIR *dir = opendir("/dev/shm");
  if (!dir) return rc;
  for (struct dirent *de; (de = readdir(dir)) != NULL;)
    if (!strncmp(de->d_name, prefix, plen) &&
        wl_sched_group_remove(de->d_name + strlen(WL__SHM_PREFIX) - 1) == 0)
      rc = 0;
  closedir(dir);
  return rc;
}

/* ---- the group lock --------------------------------------------------------------------------
 * A futex word in the segment plus a process-local mutex (the word names a process, not a
 * thread). Nothing of this process's own bookkeeping lives in the segment, so whatever another
 * process writes there can make us wait (bounded) or leave the group, never write elsewhere. */

/* A contended waiter checks that the holder is alive after this long, then this often. */
#define LOCK_FIRST_CHECK_NS (1ull * 1000000ull)
#define LOCK_CHECK_NS       (10ull * 1000000ull)

/* 1 alive, 0 dead, -1 not a holder this library writes (a corrupt word). */
static int holder_alive(wl_sched_t *s, uint32_t w) {
  uint32_t field = w & 0x7fu;
  if (field == WL__LOCK_JOINER) return init_held(s);
  if (field == 0 || field > WL__SLOTS) return -1;
  /* A slot is only claimed or cleared by a holder of this lock, so a dead holder's slot lock
   * cannot have been taken by anyone else meanwhile. */
  if (wl__slot_alive(s, field - 1) == WL__ALIVE) return 1;
  /* Without OFD locks a leaver reads as dead once it has cleared its own slot (pid 0), still
   * holding the lock: the word's pid (bits 7-30 hold any Linux pid) says whether it runs. */
  pid_t pid = (pid_t)((w >> 7) & 0xffffffu);
  if (__atomic_load_n(&no_ofd, __ATOMIC_RELAXED) && WL_LD(s->shm->slots[field - 1].pid) == 0 &&
      pid > 0 && !(kill(pid, 0) != 0 && errno == ESRCH))
    return 1;
  return 0;
}

/* 0 locked, 1 locked from a dead holder (repair), -ETIMEDOUT, -EBADMSG (corrupt word). */
static int word_lock(wl_sched_t *s, uint32_t me, uint64_t deadline) {
  uint32_t *w = &s->shm->lock_word;
  uint32_t want = me;
  uint64_t check = 0;
  for (;;) {
    uint32_t v = 0;
    if (__atomic_compare_exchange_n(w, &v, want, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
      return 0;
    uint64_t now = wl__now_ns();
    if (!check) check = now + LOCK_FIRST_CHECK_NS;
    if (now >= check) {
      int alive = holder_alive(s, v & ~WL__LOCK_WAITERS);
      if (alive < 0) return -EBADMSG;
      if (!alive) {
        if (__atomic_compare_exchange_n(w, &v, me | (v & WL__LOCK_WAITERS), false, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
          return 1;
        continue;
      }
      check = now + LOCK_CHECK_NS;
    }
    if (now >= deadline) return -ETIMEDOUT;
    if (!(v & WL__LOCK_WAITERS)) {
      if (!__atomic_compare_exchange_n(w, &v, v | WL__LOCK_WAITERS, false, __ATOMIC_RELAXED,
                                       __ATOMIC_RELAXED))
        continue;
      v |= WL__LOCK_WAITERS;
    }
    /* Having waited, take it with the waiters bit: others may still sleep on the word. */
    want = me | WL__LOCK_WAITERS;
    wl__futex_wait(w, v, WL_MIN(deadline, check));
  }
}

/* Takes the local mutex and the word with one deadline: 0, 1 (holder died), -ETIMEDOUT,
 * -EBADMSG. */
static int group_lock(wl_sched_t *s, uint32_t me, uint64_t wait_ns) {
  uint64_t deadline = wl__now_ns() + wait_ns;
  int rc = pthread_mutex_trylock(&s->local_lock);
  if (rc == EBUSY) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* timedlock's clock; a step only changes the bound */
    uint64_t ns = (uint64_t)ts.tv_nsec + wait_ns;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    rc = pthread_mutex_timedlock(&s->local_lock, &ts);
  }
  if (rc) return -ETIMEDOUT;
  rc = word_lock(s, me, deadline);
  if (rc < 0) pthread_mutex_unlock(&s->local_lock);
  return rc;
}

/* Rebuilds the derived values after a member died holding the lock: every mutation keeps each
 * slot self-consistent, so the totals can always be recomputed from the slots. */
static void repair(wl_sched_t *s) {
  wl__shm_t *h = s->shm;
  uint64_t used = 0;
  uint32_t members = 0, waiters = 0;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (WL_LD(sl->state) != WL__SLOT_LIVE) continue;
    members++;
    uint64_t p = WL_LD(sl->physical_bytes);
    used = used > UINT64_MAX - p ? UINT64_MAX : used + p;
    if (WL_LD(sl->wait_count)) waiters++;
  }
  WL_ST(h->used, used);
  WL_ST(h->members, members);
  WL_ST(h->ledger_waiters, waiters);
  uint32_t t = WL_LD(h->token);
  if (t > WL__SLOTS || (t && WL_LD(h->slots[t - 1].state) != WL__SLOT_LIVE)) WL_ST(h->token, 0);
  wl__info("group %s: a member died holding the group lock; state rebuilt", s->group);
}

int wl__lock(wl_sched_t *s) {
  if (!wl__usable(s)) return -ENOTCONN;
  int rc = group_lock(s, WL__LOCK_OWNER(s->slot + 1, s->pid), LOCK_WAIT_NS);
  if (rc >= 0 && wl__usable(s) == false) {
    /* The segment went away while we waited (the SIGBUS handler degraded us). */
    wl__unlock(s);
    return -EBADMSG;
  }
  if (rc == 1) {
    repair(s);
    rc = 0;
  }
  if (rc == 0) {
    __atomic_store_n(&s->lock_failures, 0, __ATOMIC_RELAXED);
    if (wl__validate(s)) return -EBADMSG; /* degraded and unlocked */
    WL_ST(s->shm->slots[s->slot].heartbeat_ns, wl__now_ns());
    return 0;
  }
  if (rc == -ETIMEDOUT) {
    int n = __atomic_add_fetch(&s->lock_failures, 1, __ATOMIC_RELAXED);
    if (n >= LOCK_FAILURES_MAX) {
      wl__degrade(s, false, "the group lock stayed held for 3 s (a stopped member?)");
      return -EBADMSG;
    }
    wl__warn("group %s: the group lock is held for over 1 s; going on without it", s->group);
    return -ETIMEDOUT;
  }
  wl__degrade(s, false, "the group lock word is corrupt");
  return -EBADMSG;
}

void wl__unlock(wl_sched_t *s) {
  uint32_t v = __atomic_exchange_n(&s->shm->lock_word, 0, __ATOMIC_RELEASE);
  if (v & WL__LOCK_WAITERS) wl__futex_wake(&s->shm->lock_word, 1);
  pthread_mutex_unlock(&s->local_lock);
}

/* ---- a segment truncated under us ------------------------------------------------------------
 * Another process with write access can shrink the file; touching a page past its new end raises
 * SIGBUS. The handler puts zeroed private memory where the segment was mapped and marks the
 * member lost, so the faulting access completes (reading zeros, which no check accepts) and the
 * member leaves the group at its next call. Faults elsewhere go to the previous handler. */
#define SEG_MAPS 64
static struct {
  uintptr_t base; /* 0: unused */
  wl_sched_t *s;
} seg_maps[SEG_MAPS];
static struct sigaction bus_prev;

static void bus_handler(int sig, siginfo_t *si, void *uc) {
  int saved = errno;
  uintptr_t a = (uintptr_t)si->si_addr;
  for (int i = 0; si->si_code > 0 && i < SEG_MAPS; i++) {
    uintptr_t base = __atomic_load_n(&seg_maps[i].base, __ATOMIC_ACQUIRE);
    if (!base || a - base >= WL__SEG_SIZE) continue;
    void *m = mmap((void *)base, WL__SEG_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED) break;
    wl_sched_t *s = __atomic_load_n(&seg_maps[i].s, __ATOMIC_ACQUIRE);
    if (s) __atomic_store_n(&s->seg_lost, 1, __ATOMIC_RELEASE);
    errno = saved;
    return;
  }
  errno = saved;
  if (bus_prev.sa_flags & SA_SIGINFO) {
    if (bus_prev.sa_sigaction) {
      bus_prev.sa_sigaction(sig, si, uc);
      return;
    }
  } else if (bus_prev.sa_handler == SIG_IGN) {
    if (si->si_code <= 0) return; /* a sent SIGBUS the program ignores */
  } else if (bus_prev.sa_handler != SIG_DFL) {
    bus_prev.sa_handler(sig);
    return;
  }
  /* The default action, as without us: a fault repeats when we return; a sent signal again. */
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  sigaction(SIGBUS, &dfl, NULL);
  if (si->si_code <= 0) raise(sig);
}

/* (Re)installs the handler unless it is the current one, chaining to whatever was there: a
 * handler the program installed since the last join (or in this forked child) comes next. Under
 * seg_maps_lock. */
static void bus_install(void) {
  struct sigaction cur;
  if (sigaction(SIGBUS, NULL, &cur) != 0 ||
      ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == bus_handler))
    return;
  /* Our handler is not installed now, so none reads bus_prev while it changes. */
  bus_prev = cur;
  struct sigaction sa = {.sa_sigaction = bus_handler, .sa_flags = SA_SIGINFO | SA_ONSTACK};
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGBUS, &sa, NULL) != 0)
    wl__warn("cannot install the SIGBUS handler (%s): a truncated group segment would crash "
             "this process",
             strerror(errno));
}

/* Writers of seg_maps; the handler only reads (s before base on the way in, base first on the
 * way out, so a handler that sees a base sees its member or nothing). */
static pthread_mutex_t seg_maps_lock = PTHREAD_MUTEX_INITIALIZER;

static void seg_register(void *map, wl_sched_t *s) {
  pthread_mutex_lock(&seg_maps_lock);
  bus_install();
  for (int i = 0; i < SEG_MAPS; i++) {
    if (__atomic_load_n(&seg_maps[i].base, __ATOMIC_RELAXED)) continue;
    __atomic_store_n(&seg_maps[i].s, s, __ATOMIC_RELEASE);
    __atomic_store_n(&seg_maps[i].base, (uintptr_t)map, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&seg_maps_lock);
    return;
  }
  pthread_mutex_unlock(&seg_maps_lock);
  wl__warn("more than %d group segments mapped: a truncation of this one would crash", SEG_MAPS);
}

static void seg_unregister(void *map) {
  pthread_mutex_lock(&seg_maps_lock);
  for (int i = 0; i < SEG_MAPS; i++) {
    if (__atomic_load_n(&seg_maps[i].base, __ATOMIC_RELAXED) != (uintptr_t)map) continue;
    __atomic_store_n(&seg_maps[i].base, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&seg_maps[i].s, NULL, __ATOMIC_RELEASE);
    break;
  }
  pthread_mutex_unlock(&seg_maps_lock);
}

/* In a forked child: the mappings were not inherited (MADV_DONTFORK), and a new one may land
 * at an old address, so the parent's entries must not match it. */
static void seg_maps_forget(void) {
  pthread_mutex_init(&seg_maps_lock, NULL);
  for (int i = 0; i < SEG_MAPS; i++) {
    __atomic_store_n(&seg_maps[i].base, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&seg_maps[i].s, NULL, __ATOMIC_RELEASE);
  }
}

/* Unmaps a registered mapping of the segment. */
static void seg_unmap(void *map) {
  seg_unregister(map);
  munmap(map, WL__SEG_SIZE);
}

bool wl__lost(const wl_sched_t *cs) {
  wl__degrade((wl_sched_t *)cs, false, "the group segment was truncated by another process");
  return false;
}

/* ---- validation ------------------------------------------------------------------------------*/

/* Checks the constant part of the header; NULL when fine, else what is wrong. */
static const char *header_problem(const wl__shm_t *h) {
  if (WL_LD(h->magic) != WL__MAGIC) return "bad magic number";
  if (WL_LD(h->layout_version) != WL__LAYOUT_VERSION) return "another layout version";
  if (WL_LD(h->header_size) != offsetof(wl__shm_t, slots) ||
      WL_LD(h->segment_size) != WL__SEG_SIZE || WL_LD(h->max_members) != WL__SLOTS ||
      WL_LD(h->slot_size) != sizeof(wl__slot_t))
    return "header sizes do not match";
  uint32_t w = WL_LD(h->waves);
  if (w < 2 || w > WL_SCHED_MAX_MEMBERS) return "wave count out of range";
  if (WL_LD(h->gate_timeout_ms) > 3600u * 1000u) return "gate timeout out of range";
  if (WL_LD(h->limit) > WL__BYTES_MAX) return "memory limit out of range";
  return NULL;
}

/* Checks every value of the segment (lock held); false with what is wrong in why. Derived
 * totals that do not match the slots are repaired. own: also check that our slot is ours. */
static bool segment_ok(wl_sched_t *s, bool own, char *why, size_t wlen) {
  wl__shm_t *h = s->shm;
  const char *p = header_problem(h);
  if (p) {
    snprintf(why, wlen, "the segment is corrupt (%s)", p);
    return false;
  }
  if (WL_LD(h->state) != WL__SEG_READY) {
    snprintf(why, wlen, "the segment is corrupt (state %u)", WL_LD(h->state));
    return false;
  }
  uint32_t waves = WL_LD(h->waves);
  uint32_t t = WL_LD(h->token);
  if (t > WL__SLOTS) {
    snprintf(why, wlen, "the segment is corrupt (token holder %u)", t);
    return false;
  }
  if (WL_LD(h->cursor_role) >= waves) {
    snprintf(why, wlen, "the segment is corrupt (round-robin cursor %u)", WL_LD(h->cursor_role));
    return false;
  }
  uint64_t roles = 0, used = 0;
  uint32_t members = 0, waiters = 0;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    uint32_t st = WL_LD(sl->state);
    if (st == WL__SLOT_FREE) continue;
    if (st != WL__SLOT_LIVE) {
      snprintf(why, wlen, "the segment is corrupt (slot %u state %u)", i, st);
      return false;
    }
    uint32_t r = WL_LD(sl->role);
    if (r >= waves || (roles & (1ull << r))) {
      snprintf(why, wlen, "the segment is corrupt (slot %u role %u)", i, r);
      return false;
    }
    roles |= 1ull << r;
    uint32_t wc = WL_LD(sl->wait_count);
    if (WL_LD(sl->pid) <= 0 || WL_LD(sl->gate_waiting) > 1 || WL_LD(sl->wait_fail) > 1 ||
        WL_LD(sl->wait_pass) > 1 || WL_LD(sl->wait_min) > WL__BYTES_MAX ||
        WL_LD(sl->phase) > WL_PHASE_IDLE || wc > 65536 ||
        (wc == 0) != (WL_LD(sl->wait_bytes) == 0) || WL_LD(sl->physical_bytes) > WL__BYTES_MAX ||
        WL_LD(sl->wait_bytes) > WL__BYTES_MAX || WL_LD(sl->live_bytes) > WL__BYTES_MAX) {
      snprintf(why, wlen, "the segment is corrupt (slot %u fields)", i);
      return false;
    }
    members++;
    uint64_t pb = WL_LD(sl->physical_bytes);
    used = used > UINT64_MAX - pb ? UINT64_MAX : used + pb;
    if (wc) waiters++;
  }
  if (t && WL_LD(h->slots[t - 1].state) != WL__SLOT_LIVE) {
    snprintf(why, wlen, "the segment is corrupt (token held by free slot %u)", t - 1);
    return false;
  }
  if (own && !wl__slot_mine(s)) {
    snprintf(why, wlen, "this member's slot %u was taken over", s->slot);
    return false;
  }
  /* Totals are derived from the slots: a mismatch is repaired, not fatal. */
  if (WL_LD(h->members) != members || WL_LD(h->used) != used ||
      WL_LD(h->ledger_waiters) != waiters) {
    wl__warn_once("group %s: group totals did not match the slots; recomputed", s->group);
    WL_ST(h->members, members);
    WL_ST(h->used, used);
    WL_ST(h->ledger_waiters, waiters);
  }
  return true;
}

int wl__validate(wl_sched_t *s) {
  char why[128];
  if (segment_ok(s, true, why, sizeof why) && !__atomic_load_n(&s->seg_lost, __ATOMIC_ACQUIRE))
    return 0;
  /* Zeros where the pages were: say why rather than what the zeros look like. */
  if (__atomic_load_n(&s->seg_lost, __ATOMIC_ACQUIRE))
    snprintf(why, sizeof why, "the group segment was truncated by another process");
  wl__degrade(s, true, why);
  return -EBADMSG;
}

bool wl__slot_mine(wl_sched_t *s) {
  wl__slot_t *sl = &s->shm->slots[s->slot];
  return WL_LD(sl->state) == WL__SLOT_LIVE && WL_LD(sl->incarnation) == s->incarnation &&
         WL_LD(sl->pid) == (int32_t)s->pid;
}

void wl__degrade(wl_sched_t *s, bool locked, const char *why) {
  int expect = WL__ST_LIVE;
  if (!__atomic_compare_exchange_n(&s->state, &expect, WL__ST_DEGRADED, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_RELAXED)) {
    if (locked) wl__unlock(s);
    return;
  }
  if (locked) wl__unlock(s);
  wl__error("group %s: %s; pid %d leaves the group and runs ungated and unaccounted", s->group, why,
            (int)s->pid);
  __atomic_store_n(&s->holding, 0, __ATOMIC_RELEASE);
  /* Dropping the liveness lock lets the others reclaim the slot if they can read it. The mapping
   * stays until wl_sched_leave: other threads may still be waiting on words inside it. */
  if (s->slot < WL__SLOTS) {
    ofd_lock(s->fd, WL__LOCK_SLOT(s->slot), F_UNLCK);
    WL_ST(s->shm->slots[s->slot].start_time, START_GONE); /* the same for the pid check */
    wl__futex_wake(&s->shm->slots[s->slot].wake, INT32_MAX);
  }
  wl__futex_wake(&s->shm->ledger_seq, INT32_MAX);
}

/* ---- liveness and reclaiming -----------------------------------------------------------------*/

int wl__slot_alive(wl_sched_t *s, unsigned i) {
  int rc = ofd_held(s->fd, WL__LOCK_SLOT(i), 1);
  if (rc >= 0) return rc ? WL__ALIVE : WL__DEAD;
  /* No OFD locks (or the query failed): pid and start time. */
  return slot_pid_alive(&s->shm->slots[i]) ? WL__ALIVE : WL__DEAD;
}

void wl__slot_clear(wl_sched_t *s, unsigned i) {
  wl__shm_t *h = s->shm;
  wl__slot_t *sl = &h->slots[i];
  uint64_t phys = WL_LD(sl->physical_bytes);
  WL_ST(h->used, (uint64_t)wl__sub_sat(WL_LD(h->used), phys));
  if (WL_LD(sl->wait_count))
    WL_ST(h->ledger_waiters, (uint32_t)wl__sub_sat(WL_LD(h->ledger_waiters), 1));
  uint32_t role = WL_LD(sl->role);
  bool had_token = WL_LD(h->token) == i + 1;
  WL_ST(sl->gate_waiting, 0);
  WL_ST(sl->wait_bytes, 0);
  WL_ST(sl->wait_count, 0);
  WL_ST(sl->wait_fail, 0);
  WL_ST(sl->wait_pass, 0);
  WL_ST(sl->wait_min, 0);
  WL_ST(sl->physical_bytes, 0);
  WL_ST(sl->live_bytes, 0);
  WL_ST(sl->incarnation, 0);
  WL_ST(sl->pid, 0);
  WL_STR(sl->state, WL__SLOT_FREE);
  WL_ST(h->members, (uint32_t)wl__sub_sat(WL_LD(h->members), 1));
  WL_ADD(h->epoch, 1);
  if (had_token) {
    WL_ST(h->token, 0);
    WL_ADD(h->token_gen, 1);
    uint32_t g = wl__gate_pass(s, role < WL_LD(h->waves) ? role : 0);
    wl__gate_wake(s, g);
  }
  if (phys) wl__ledger_kick(s);
}

unsigned wl__reap(wl_sched_t *s) {
  wl__shm_t *h = s->shm;
  unsigned n = 0;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (i == s->slot || WL_LD(sl->state) != WL__SLOT_LIVE) continue;
    if (wl__slot_alive(s, i) == WL__ALIVE) continue;
    char b[32];
    wl__info("group %s: member pid %d (role %u) is gone; reclaimed its slot, %s of budget%s",
             s->group, (int)WL_LD(sl->pid), WL_LD(sl->role),
             wl__fmt_bytes(WL_LD(sl->physical_bytes), b, sizeof b),
             WL_LD(h->token) == i + 1 ? " and the gate token" : "");
    wl__slot_clear(s, i);
    n++;
  }
  if (n) {
    WL_ADD(h->reaped, n);
    __atomic_add_fetch(&s->st.reaped, n, __ATOMIC_RELAXED);
  }
  return n;
}

void wl__describe_members(wl_sched_t *s, char *buf, size_t len) {
  wl__shm_t *h = s->shm;
  size_t off = 0;
  buf[0] = 0;
  uint32_t t = WL_LD(h->token);
  for (unsigned i = 0; i < WL__SLOTS && off + 1 < len; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (WL_LD(sl->state) != WL__SLOT_LIVE) continue;
    char p[32], w[32];
    uint64_t wb = WL_LD(sl->wait_bytes);
    wl__fmt_bytes(WL_LD(sl->physical_bytes), p, sizeof p);
    if (wb) wl__fmt_bytes(wb, w, sizeof w);
    int k = snprintf(buf + off, len - off, "%spid %d role %u holds %s%s%s%s%s", off ? "; " : "",
                     (int)WL_LD(sl->pid), WL_LD(sl->role), p, wb ? " (waits for " : "", wb ? w : "",
                     wb ? ")" : "", t == i + 1 ? " [token]" : "");
    if (k < 0) break;
    off += (size_t)k;
  }
  if (off >= len && len > 4) memcpy(buf + len - 4, "...", 4);
}

/* ---- join ------------------------------------------------------------------------------------*/

/* True when the group's name still refers to the open segment fd. */
static bool fd_is_named(int fd, const char *shm_name) {
  struct stat a, b;
  char path[96];
  snprintf(path, sizeof path, "/dev/shm%s", shm_name);
  return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

/* Maps the segment so that fork does not copy the mapping: a mapping holds the open file, and
 * with it our liveness lock, so an inherited one would keep a dead parent "alive". */
static void *map_segment(int fd, wl_sched_t *s) {
  void *m = mmap(NULL, WL__SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return m;
  madvise(m, WL__SEG_SIZE, MADV_DONTFORK);
  /* Before any access: the file may already be shorter than its size said. */
  seg_register(m, s);
  return m;
}

/* What is wrong with a segment of the wrong size. */
static const char *size_problem(int fd) {
  uint64_t magic = 0;
  uint32_t ver = 0;
  if (pread(fd, &magic, sizeof magic, 0) == (ssize_t)sizeof magic && magic == WL__MAGIC &&
      pread(fd, &ver, sizeof ver, 8) == (ssize_t)sizeof ver && ver != WL__LAYOUT_VERSION)
    return "another layout version";
  return "wrong size";
}

static void init_header(wl__shm_t *h, const wl_sched_config_t *cfg, size_t limit) {
  memset(h, 0, sizeof *h);
  h->layout_version = WL__LAYOUT_VERSION;
  h->header_size = (uint32_t)offsetof(wl__shm_t, slots);
  h->segment_size = WL__SEG_SIZE;
  h->max_members = WL__SLOTS;
  h->slot_size = sizeof(wl__slot_t);
  h->flags = (cfg->flags & WL_SCHED_SHARED) ? WL__HDR_SHARED : 0;
  h->creator_uid = (uint32_t)geteuid();
  h->waves = cfg->waves;
  h->gate_timeout_ms = cfg->gate_timeout_ms;
  h->created_ns = wl__now_ns();
  h->limit = limit;
  WL_ST(h->state, WL__SEG_READY);
  WL_STR(h->magic, WL__MAGIC);
}

static const char *uid_note(uid_t uid, char *buf, size_t len) {
  snprintf(buf, len, "uid %u", (unsigned)uid);
  return buf;
}

/* What is in a segment this library cannot use, for the message. */
static void describe_foreign(int fd, char *buf, size_t len) {
  uint64_t magic = 0;
  uint32_t ver = 0;
  if (pread(fd, &magic, sizeof magic, 0) == (ssize_t)sizeof magic && magic == WL__MAGIC &&
      pread(fd, &ver, sizeof ver, 8) == (ssize_t)sizeof ver)
    snprintf(buf, len, "it uses layout version %u and this library speaks version %u", ver,
             WL__LAYOUT_VERSION);
  else
    snprintf(buf, len, "it is not a Wavelet group segment of layout version %u",
             WL__LAYOUT_VERSION);
}

static int pick_role(wl_sched_t *s, int want, int *role) {
  wl__shm_t *h = s->shm;
  unsigned waves = WL_LD(h->waves);
  uint64_t taken = 0;
  for (unsigned i = 0; i < WL__SLOTS; i++)
    if (WL_LD(h->slots[i].state) == WL__SLOT_LIVE) taken |= 1ull << (WL_LD(h->slots[i].role) & 63);
  if (want >= 0) {
    if ((unsigned)want >= waves) {
      wl__error("group %s: role %d is out of range: the group has %u waves (roles 0 to %u)",
                s->group, want, waves, waves - 1);
      return -ERANGE;
    }
    if (taken & (1ull << want)) {
      int pid = 0;
      for (unsigned i = 0; i < WL__SLOTS; i++)
        if (WL_LD(h->slots[i].state) == WL__SLOT_LIVE && (int)WL_LD(h->slots[i].role) == want)
          pid = WL_LD(h->slots[i].pid);
      wl__error("group %s: role %d is taken by pid %d", s->group, want, pid);
      return -EEXIST;
    }
    *role = want;
    return 0;
  }
  for (unsigned r = 0; r < waves; r++)
    if (!(taken & (1ull << r))) {
      *role = (int)r;
      return 0;
    }
  wl__error("group %s is full: all %u waves have a member", s->group, waves);
  return -EBUSY;
}

static int claim_slot(wl_sched_t *s, int role) {
  wl__shm_t *h = s->shm;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    wl__slot_t *sl = &h->slots[i];
    if (WL_LD(sl->state) != WL__SLOT_FREE) continue;
    /* A leaver drops its liveness lock just after freeing its slot: skip such a slot. */
    int lrc = ofd_lock(s->fd, WL__LOCK_SLOT(i), F_WRLCK);
    if (lrc != 0 && !ofd_missing(lrc)) continue; /* without OFD locks the slot is all there is */
    uint64_t inc = WL_ADD(h->incarnations, 1);
    uint64_t now = wl__now_ns();
    WL_ST(sl->role, (uint32_t)role);
    WL_ST(sl->incarnation, inc);
    WL_ST(sl->pid, (int32_t)s->pid);
    WL_ST(sl->uid, (uint32_t)geteuid());
    WL_ST(sl->start_time, proc_start_time(s->pid));
    WL_ST(sl->join_ns, now);
    WL_ST(sl->heartbeat_ns, now);
    WL_ST(sl->phase, (uint32_t)WL_PHASE_UNKNOWN);
    WL_ST(sl->live_bytes, 0);
    WL_ST(sl->physical_bytes, 0);
    WL_ST(sl->wait_bytes, 0);
    WL_ST(sl->wait_count, 0);
    WL_ST(sl->wait_fail, 0);
    WL_ST(sl->wait_pass, 0);
    WL_ST(sl->wait_min, 0);
    WL_ST(sl->gate_waiting, 0);
    WL_ST(sl->grants, 0);
    WL_STR(sl->state, WL__SLOT_LIVE);
    WL_ADD(h->members, 1);
    WL_ADD(h->epoch, 1);
    s->slot = i;
    s->incarnation = inc;
    s->role = role;
    return 0;
  }
  wl__error("group %s is full: all %d member slots are taken", s->group, WL__SLOTS);
  return -EBUSY;
}

/* Adopts the group's settings, warning where this process asked for others. */
static void adopt_settings(wl_sched_t *s, const wl_sched_config_t *cfg, size_t limit) {
  wl__shm_t *h = s->shm;
  s->waves = WL_LD(h->waves);
  s->gate_timeout_ms = WL_LD(h->gate_timeout_ms);
  if (cfg->waves && cfg->waves != s->waves)
    wl__warn("group %s has %u waves; ignoring this process's %u", s->group, s->waves, cfg->waves);
  if (cfg->gate_timeout_ms != s->gate_timeout_ms)
    wl__warn("group %s has a gate timeout of %u ms; ignoring this process's %u ms", s->group,
             s->gate_timeout_ms, cfg->gate_timeout_ms);
  uint64_t gl = WL_LD(h->limit);
  if (cfg->mem_limit != WL_SCHED_MEM_DEFAULT || cfg->mem_limit_percent) {
    if (gl != limit) {
      char a[32], b[32];
      wl__warn("group %s has a memory limit of %s; ignoring this process's %s", s->group,
               gl ? wl__fmt_bytes(gl, a, sizeof a) : "none",
               limit ? wl__fmt_bytes(limit, b, sizeof b) : "none");
    }
  }
}

/* A group is one GPU's: its budget is that GPU's memory and its gate orders that GPU's work. A
 * joiner naming another GPU than the group's live members did is refused (-EXDEV), so that
 * processes sharing a name over several GPUs cannot end up booking two GPUs in one ledger; the
 * caller picks another name. A group without live members is taken over. Under the group lock,
 * after the reap. */
static int claim_gpu(wl_sched_t *s, const wl_sched_config_t *cfg) {
  char want[WL__GPU_MAX + 1];
  if (!cfg->gpu_uuid || wl_sched_group_name(cfg->gpu_uuid, want, sizeof want)) return 0;
  wl__shm_t *h = s->shm;
  char have[WL__GPU_MAX + 1];
  for (size_t i = 0; i < WL__GPU_MAX; i++) have[i] = WL_LD(h->gpu[i]);
  have[WL__GPU_MAX] = 0;
  if (!strcmp(have, want)) return 0;
  if (have[0] && WL_LD(h->members) != 0) {
    /* With WL_SCHED_GPU_ALT the caller goes on to the GPU's own group and says so. */
    if (cfg->flags & WL_SCHED_GPU_ALT)
      wl__debug("group %s is the group of %s, not of %s", s->group, have, want);
    else
      wl__info("group %s is the group of %s, not of %s; not joined", s->group, have, want);
    return -EXDEV;
  }
  size_t n = strlen(want);
  for (size_t i = 0; i < sizeof h->gpu; i++) WL_ST(h->gpu[i], i < n ? want[i] : 0);
  return 0;
}

/* One attempt; 1 means "the segment was being removed: try again". */
static int join_once(wl_sched_t *s, const wl_sched_config_t *cfg, size_t limit) {
  bool shared = (cfg->flags & WL_SCHED_SHARED) != 0;
  int fd = shm_open(s->shm_name, O_RDWR | O_CREAT | O_CLOEXEC, shared ? 0666 : 0600);
  if (fd < 0) {
    int e = errno;
    if (e == EACCES) {
      struct stat st;
      char path[96], u[32];
      snprintf(path, sizeof path, "/dev/shm%s", s->shm_name);
      if (stat(path, &st) == 0)
        wl__error("group %s belongs to %s and is not shared with this user (uid %u); its owner "
                  "can create it shared, or use another WAVELET_GROUP",
                  s->group, uid_note(st.st_uid, u, sizeof u), (unsigned)geteuid());
      else
        wl__error("group %s: cannot open %s: %s", s->group, s->shm_name, strerror(e));
    } else {
      wl__error("group %s: cannot open %s: %s", s->group, s->shm_name, strerror(e));
    }
    return -e;
  }
  int rc = init_lock(s, fd);
  if (rc == 0 && !fd_is_named(fd, s->shm_name)) {
    /* Removed while we waited (its last member left, or wl_sched_group_prune): the group lives
     * on under its name, in a new file. */
    init_unlock(s, fd);
    close(fd);
    return 1;
  }
  if (rc) {
    if (rc == -EBUSY)
      wl__error("group %s: another process has been joining or leaving for 5 s; giving up",
                s->group);
    else
      wl__error("group %s: cannot lock %s: %s", s->group, s->shm_name, strerror(-rc));
    close(fd);
    return rc;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    goto fail;
  }
  bool foreign = st.st_uid != geteuid();
  bool fresh = st.st_size == 0;
  void *map = MAP_FAILED;
  if (!fresh && (size_t)st.st_size == WL__SEG_SIZE) {
    map = map_segment(fd, s);
    if (map == MAP_FAILED) {
      rc = -errno;
      goto fail;
    }
    /* Marked dead yet still under its name (checked above): the remover died before unlinking;
     * it is abandoned (below). */
  }
  const char *problem = NULL;
  if (!fresh) {
    if (map == MAP_FAILED)
      problem = size_problem(fd);
    else if ((problem = header_problem(map)) == NULL &&
             WL_LD(((wl__shm_t *)map)->state) != WL__SEG_READY)
      problem = WL_LD(((wl__shm_t *)map)->state) == WL__SEG_DEAD ? "left by a dying member"
                                                                 : "unfinished initialisation";
  }
  if (fresh || problem) {
    /* Only the owner initialises, and only a segment nobody is a member of. */
    int live = fresh ? 0 : ofd_held(fd, WL__LOCK_SLOT(0), WL__LOCK_SLOT_SPAN);
    /* Without OFD locks only our own layout says who is alive: a segment this library may have
     * left half-made (its size, no magic yet: a joiner killed while initialising) is abandoned,
     * any other that is not ours is taken as in use. */
    bool unknown = ofd_missing(live) &&
                   (map == MAP_FAILED ||
                    (header_problem(map) != NULL && WL_LDA(((wl__shm_t *)map)->magic) != 0));
    if (live < 0) live = unknown || (map != MAP_FAILED && any_pid_alive(map));
    if (foreign || live != 0) {
      char what[128];
      describe_foreign(fd, what, sizeof what);
      if (foreign && fresh) {
        char u[32];
        wl__error("group %s belongs to %s and is not initialised; use another WAVELET_GROUP",
                  s->group, uid_note(st.st_uid, u, sizeof u));
        rc = -EACCES;
      } else if (problem && strcmp(problem, "another layout version") == 0) {
        wl__error("group %s cannot be joined: %s; stop its members or use another WAVELET_GROUP%s",
                  s->group, what, unknown ? UNKNOWN_NOTE : "");
        rc = -EPROTO;
      } else {
        wl__error("group %s cannot be joined: its segment is corrupt (%s) and %s members; "
                  "stop them or remove it with wl_sched_group_remove",
                  s->group, problem ? problem : "unreadable",
                  unknown ? "may still have" : "still has");
        rc = -EBADMSG;
      }
      goto fail_map;
    }
    if (!fresh) wl__info("group %s: replacing an abandoned segment (%s)", s->group, problem);
    if (map != MAP_FAILED) seg_unmap(map);
    map = MAP_FAILED;
    if ((!fresh && ftruncate(fd, 0) != 0) || ftruncate(fd, (off_t)WL__SEG_SIZE) != 0 ||
        fchmod(fd, shared ? 0666 : 0600) != 0) {
      rc = -errno;
      wl__error("group %s: cannot size %s: %s", s->group, s->shm_name, strerror(-rc));
      goto fail;
    }
    map = map_segment(fd, s);
    if (map == MAP_FAILED) {
      rc = -errno;
      goto fail;
    }
    init_header(map, cfg, limit);
  } else if (foreign && !(WL_LD(((wl__shm_t *)map)->flags) & WL__HDR_SHARED)) {
    char u[32];
    wl__error("group %s belongs to %s and was not created shared; use another WAVELET_GROUP",
              s->group, uid_note(st.st_uid, u, sizeof u));
    rc = -EACCES;
    goto fail_map;
  }

  s->fd = fd;
  s->shm = map;
  s->slot = 0;
  s->incarnation = 0;
  __atomic_store_n(&s->state, WL__ST_LIVE, __ATOMIC_RELEASE);
  /* Take the lock by hand: wl__lock validates our own slot, which we do not have yet. */
  int lrc = group_lock(s, WL__LOCK_OWNER(WL__LOCK_JOINER, s->pid), 2000ull * 1000000ull);
  if (lrc == 1) {
    repair(s);
    lrc = 0;
  }
  if (lrc || __atomic_load_n(&s->seg_lost, __ATOMIC_ACQUIRE)) {
    if (lrc == 0) wl__unlock(s);
    rc = lrc == -ETIMEDOUT ? -EBUSY : -EBADMSG;
    wl__error("group %s cannot be joined: its lock %s", s->group,
              lrc == -ETIMEDOUT ? "has been held for 2 s"
              : lrc             ? "word is corrupt"
                                : "is gone (the segment was truncated)");
    goto fail_state;
  }
  /* Everything we are about to read, checked first. */
  char why[128];
  if (!segment_ok(s, false, why, sizeof why)) {
    wl__unlock(s);
    wl__error("group %s cannot be joined: %s", s->group, why);
    rc = -EBADMSG;
    goto fail_state;
  }
  /* Reap with slot = "none" so every slot is examined. */
  s->slot = UINT32_MAX;
  wl__reap(s);
  int role;
  rc = claim_gpu(s, cfg);
  if (!rc) rc = pick_role(s, cfg->role, &role);
  if (!rc) rc = claim_slot(s, role);
  if (!rc) {
    adopt_settings(s, cfg, limit);
    /* Full check now that we have a slot; it degrades and unlocks on failure. */
    if (wl__validate(s)) {
      rc = -EBADMSG;
      goto fail_state;
    }
  }
  wl__unlock(s);
  if (rc) goto fail_state;
  init_unlock(s, fd);
  return 0;

fail_state:
  __atomic_store_n(&s->state, WL__ST_LEFT, __ATOMIC_RELEASE);
  s->shm = NULL;
  s->fd = -1;
fail_map:
  if (map != MAP_FAILED) seg_unmap(map);
fail:
  init_unlock(s, fd);
  close(fd);
  return rc;
}

/* Joins the group called group (a checked name), again while it is being removed. */
static int join_name(wl_sched_t *s, const char *group, const wl_sched_config_t *cfg, size_t limit) {
  snprintf(s->group, sizeof s->group, "%s", group);
  shm_name_of(group, s->shm_name);
  for (int attempt = 0;; attempt++) {
    int rc = join_once(s, cfg, limit);
    if (rc != 1) return rc;
    if (attempt == 100) {
      wl__error("group %s keeps being removed while joining; giving up", s->group);
      return -EBUSY;
    }
  }
}

/* The naming lock of WL_SCHED_GPU_ALT: a byte of the named group's file past the liveness locks
 * (a lock of its own, so that the joins it surrounds take the init lock as always). The
 * descriptor holding it, or -1 when there is none to be had: no OFD locks (gVisor), a file this
 * user cannot open, or a holder for 5 s. The joiner then chooses unlocked, as before the lock. */
static int naming_lock(const char *shm_name, bool shared) {
  uint64_t deadline = wl__now_ns() + INIT_WAIT_NS;
  for (int attempt = 0; attempt < 100; attempt++) {
    int fd = shm_open(shm_name, O_RDWR | O_CREAT | O_CLOEXEC, shared ? 0666 : 0600);
    if (fd < 0) return -1;
    int rc;
    while ((rc = ofd_lock(fd, WL__LOCK_NAMING, F_WRLCK)) == -EAGAIN || rc == -EACCES) {
      if (wl__now_ns() > deadline) break;
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    if (rc == 0 && fd_is_named(fd, shm_name)) return fd;
    close(fd); /* closing drops the lock */
    if (rc) return -1;
    /* The file was removed (its last member left) while we waited: lock the one named now. */
  }
  return -1;
}

/* WL_SCHED_GPU_ALT: the GPU's own group when it exists, else the name, else (the name is another
 * GPU's) the GPU's own group. Without the naming lock, a joiner finding the name taken could
 * create the GPU's own group just after another process of the same GPU looked for it, found
 * none and, the name's members having died meanwhile, took the name over: one GPU, two groups,
 * two budgets. Under the lock the look and the join are one step for every joiner of the name. */
static int join_per_gpu(wl_sched_t *s, const char *group, const wl_sched_config_t *cfg,
                        size_t limit) {
  char alt[WL_SCHED_GROUP_MAX + 1];
  if (wl_sched_group_gpu_name(group, cfg->gpu_uuid, alt, sizeof alt))
    return join_name(s, group, cfg, limit); /* no UUID to name a group by: the name */
  if (wl_sched_group_exists(alt) == 1) return join_name(s, alt, cfg, limit);
  char shm_name[SHM_NAME_MAX];
  shm_name_of(group, shm_name);
  int lock_fd = naming_lock(shm_name, (cfg->flags & WL_SCHED_SHARED) != 0);
  int rc;
  if (wl_sched_group_exists(alt) == 1) {
    rc = join_name(s, alt, cfg, limit);
  } else {
    rc = join_name(s, group, cfg, limit);
    if (rc == -EXDEV) {
      wl__info("group %s is another GPU's; joining %s", group, alt);
      rc = join_name(s, alt, cfg, limit);
    }
  }
  if (lock_fd >= 0) close(lock_fd);
  return rc;
}

int wl_sched_peek(const wl_sched_config_t *cfg, size_t *limit, size_t *used) {
  if (!cfg || !limit || !used) return -EINVAL;
  *limit = *used = 0;
  char derived[WL_SCHED_GROUP_MAX + 1], alt[WL_SCHED_GROUP_MAX + 1], mine[WL_SCHED_GROUP_MAX + 1];
  const char *group = cfg->group;
  if (!group || !*group) {
    if (!cfg->gpu_uuid || wl_sched_group_name(cfg->gpu_uuid, derived, sizeof derived))
      return -EINVAL;
    group = derived;
  }
  wl_sched_group_info_t info;
  /* join_per_gpu's choice: the GPU's own group when it exists, or when the name is another
   * GPU's. */
  if ((cfg->flags & WL_SCHED_GPU_ALT) && cfg->group && cfg->group[0] && cfg->gpu_uuid &&
      wl_sched_group_gpu_name(group, cfg->gpu_uuid, alt, sizeof alt) == 0 &&
      (wl_sched_group_exists(alt) == 1 ||
       (wl_sched_inspect(group, &info, NULL, 0) >= 0 && info.gpu[0] &&
        wl_sched_group_name(cfg->gpu_uuid, mine, sizeof mine) == 0 && strcmp(info.gpu, mine))))
    group = alt;
  if (wl_sched_inspect(group, &info, NULL, 0) >= 0) {
    *limit = info.limit;
    *used = info.used;
  } else {
    *limit = wl__resolve_limit(cfg);
  }
  return 0;
}

int wl_sched_join(wl_sched_t **out, const wl_sched_config_t *cfg_in) {
  if (!out) return -EINVAL;
  *out = NULL;
  wl_sched_config_t cfg;
  if (cfg_in)
    cfg = *cfg_in;
  else
    wl_sched_config_default(&cfg);
  if (cfg.waves == 0) cfg.waves = 2;
  if (cfg.waves < 2 || cfg.waves > WL_SCHED_MAX_MEMBERS) {
    wl__error("waves must be from 2 to %d, not %u", WL_SCHED_MAX_MEMBERS, cfg.waves);
    return -EINVAL;
  }
  if (cfg.role < -1 || cfg.role >= WL_SCHED_MAX_MEMBERS) {
    wl__error("role must be from 0 to %d (or -1 for the order of joining), not %d",
              WL_SCHED_MAX_MEMBERS - 1, cfg.role);
    return -EINVAL;
  }
  if (cfg.gate_timeout_ms > 3600u * 1000u) {
    wl__error("the gate timeout must be at most 3600000 ms, not %u", cfg.gate_timeout_ms);
    return -EINVAL;
  }
  char derived[WL_SCHED_GROUP_MAX + 1];
  const char *group = cfg.group;
  if (!group || !*group) {
    if (!cfg.gpu_uuid || wl_sched_group_name(cfg.gpu_uuid, derived, sizeof derived)) {
      wl__error("no group: set WAVELET_GROUP (or give the GPU's UUID)");
      return -EINVAL;
    }
    group = derived;
  }
  if (wl_sched_group_name_check(group)) {
    wl__error("bad group name '%.64s': expected 1 to %d of A-Z a-z 0-9 . _ -, not starting "
              "with '.' or '-'",
              group, WL_SCHED_GROUP_MAX);
    return -EINVAL;
  }
  size_t limit = wl__resolve_limit(&cfg);
  if (limit > WL__BYTES_MAX) {
    wl__error("group %s: a memory limit above 1 PiB is not a device's", group);
    return -EINVAL;
  }

  wl_sched_t *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->fd = -1;
  s->fd_index = -1;
  s->pid = getpid();
  /* Registered before the member exists, so that no fork can slip in between. */
  pthread_once(&fork_once, fork_register_once);
  s->fork_gen = __atomic_load_n(&wl__fork_generation, __ATOMIC_RELAXED);
  s->flags = cfg.flags;
  s->alloc_timeout_ms = cfg.alloc_timeout_ms;
  s->last_phase = WL_PHASE_UNKNOWN;
  for (uint64_t i = 0; i < WL__EVQ; i++) s->evq[i].seq = i;
  pthread_mutex_init(&s->local_lock, NULL);
  int rc = (cfg.flags & WL_SCHED_GPU_ALT) && cfg.group && cfg.group[0] && cfg.gpu_uuid
               ? join_per_gpu(s, group, &cfg, limit)
               : join_name(s, group, &cfg, limit);
  if (rc) {
    pthread_mutex_destroy(&s->local_lock);
    free(s);
    return rc;
  }
  s->fd_index = fork_track(s->fd);
  wl_phase_config_t pc;
  wl_phase_config_default(&pc);
  if (wl_phase_create(&s->phase, &pc)) s->phase = NULL; /* no detector: markers only drive */
  if (!wl_sched_get_default()) wl_sched_set_default(s);
  wl__debug("group %s: joined as pid %d, slot %u, role %d of %u", s->group, (int)s->pid, s->slot,
            s->role, s->waves);
  *out = s;
  return 0;
}

/* ---- leave -----------------------------------------------------------------------------------*/

void wl_sched_leave(wl_sched_t *s) {
  if (!s) return;
  if (wl_sched_get_default() == s) wl_sched_set_default(NULL);
  if (!wl__mine(s)) {
    /* A forked child: the descriptor was closed at fork; never touch the parent's slot. */
    if (s->phase) wl_phase_destroy(s->phase);
    free(s);
    return;
  }
  if (wl__usable(s)) {
    bool locked_init = init_lock(s, s->fd) == 0;
    if (wl__lock(s) == 0) {
      wl__shm_t *h = s->shm;
      wl__slot_clear(s, s->slot);
      wl__reap(s);
      bool last = WL_LD(h->members) == 0;
      if (last && locked_init && fd_is_named(s->fd, s->shm_name)) {
        WL_ST(h->state, WL__SEG_DEAD);
        shm_unlink(s->shm_name);
      }
      wl__unlock(s);
    }
    __atomic_store_n(&s->state, WL__ST_LEFT, __ATOMIC_RELEASE);
    if (locked_init) init_unlock(s, s->fd);
  }
  __atomic_store_n(&s->state, WL__ST_LEFT, __ATOMIC_RELEASE);
  fork_untrack(s->fd_index, s->fd);
  if (s->shm) seg_unmap(s->shm);
  if (s->fd >= 0) close(s->fd); /* drops the liveness lock */
  if (s->phase) wl_phase_destroy(s->phase);
  pthread_mutex_destroy(&s->local_lock);
  free(s);
}

/* ---- accessors -------------------------------------------------------------------------------*/

int wl_sched_status(const wl_sched_t *s) {
  if (!s) return -EINVAL;
  if (!wl__mine(s)) return -ECHILD;
  switch (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE)) {
  case WL__ST_LIVE:
    /* Truncated under us: leave now (with the message) rather than at the next call. */
    return wl__usable(s) ? 0 : -EBADMSG;
  case WL__ST_DEGRADED:
    return -EBADMSG;
  default:
    return -ENOTCONN;
  }
}

int wl_sched_role(const wl_sched_t *s) {
  return s ? __atomic_load_n(&s->role, __ATOMIC_RELAXED) : -1;
}
unsigned wl_sched_waves(const wl_sched_t *s) {
  return s ? s->waves : 0;
}
unsigned wl_sched_slot(const wl_sched_t *s) {
  return s ? s->slot : 0;
}
const char *wl_sched_group(const wl_sched_t *s) {
  return s ? s->group : NULL;
}

wl__shm_t *wl__test_shm(wl_sched_t *s) {
  return s->shm;
}

/* ---- tools -----------------------------------------------------------------------------------*/

int wl_sched_group_prune(const char *group) {
  char name[SHM_NAME_MAX];
  if (shm_name_of(group, name)) return -EINVAL;
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return -errno;
  /* As a last leaver does: under the init lock, so that no joiner is at work and one that opened
   * the file before the unlink finds it unnamed once it has the lock, and tries again. */
  int rc = wl__life_lock(fd);
  if (rc) {
    close(fd);
    return rc == -EAGAIN ? -EBUSY : rc;
  }
  struct stat st;
  wl__shm_t *h = NULL;
  if (!fd_is_named(fd, name)) {
    rc = -ENOENT; /* removed meanwhile */
  } else if (fstat(fd, &st) != 0) {
    rc = -errno;
  } else {
    /* The liveness locks and the naming lock (held by a joiner choosing between this name and
     * its GPU's own group, maybe over an empty file) do not depend on the layout; the pid check
     * (no OFD locks) does, and an empty file has no member to check. */
    int live = ofd_held(fd, WL__LOCK_SLOT(0), WL__LOCK_NAMING + 1 - WL__LOCK_SLOT(0));
    if (live < 0 && st.st_size == 0) live = 0;
    if (live < 0 && (size_t)st.st_size == WL__SEG_SIZE && (h = malloc(WL__SEG_SIZE)) &&
        pread(fd, h, WL__SEG_SIZE, 0) == (ssize_t)WL__SEG_SIZE && !header_problem(h))
      live = any_pid_alive(h);
    if (live != 0) rc = live < 0 && live != -EINVAL ? live : -EBUSY; /* -EINVAL: cannot tell */
  }
  if (rc == 0) rc = shm_unlink(name) == 0 ? 0 : -errno;
  free(h);
  wl__life_unlock(fd);
  close(fd);
  return rc;
}

int wl_sched_inspect(const char *group, wl_sched_group_info_t *info, wl_sched_member_t *out,
                     size_t cap) {
  char name[SHM_NAME_MAX];
  if (!info || shm_name_of(group, name)) return -EINVAL;
  memset(info, 0, sizeof *info);
  snprintf(info->group, sizeof info->group, "%s", group);
  info->token_role = -1;
  int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return -errno;
  /* A copy, not a mapping: a segment truncated meanwhile cannot fault here. */
  wl__shm_t *h = malloc(WL__SEG_SIZE);
  struct stat st;
  int rc = 0;
  if (!h) {
    rc = -ENOMEM;
  } else if (fstat(fd, &st) != 0) {
    rc = -errno;
  } else if ((size_t)st.st_size != WL__SEG_SIZE) {
    rc = strcmp(size_problem(fd), "another layout version") ? -EBADMSG : -EPROTO;
  } else if (pread(fd, h, WL__SEG_SIZE, 0) != (ssize_t)WL__SEG_SIZE) {
    rc = -EBADMSG;
  } else if (h->magic != WL__MAGIC) {
    rc = -EBADMSG;
  } else if (h->layout_version != WL__LAYOUT_VERSION) {
    rc = -EPROTO;
  } else if (h->state != WL__SEG_READY) {
    rc = -EBADMSG;
  }
  if (rc) goto out;
  memcpy(info->gpu, h->gpu, WL__GPU_MAX);
  info->gpu[WL__GPU_MAX] = 0;
  info->waves = h->waves;
  info->limit = (size_t)WL_MIN(h->limit, WL__BYTES_MAX);
  info->used = (size_t)WL_MIN(h->used, WL__BYTES_MAX);
  info->grants = h->grants;
  info->revocations = h->revocations;
  info->denials = h->denials;
  info->deadlocks = h->deadlocks;
  for (unsigned i = 0; i < WL__SLOTS; i++) {
    const wl__slot_t *sl = &h->slots[i];
    if (sl->state != WL__SLOT_LIVE) continue;
    int alive = ofd_held(fd, WL__LOCK_SLOT(i), 1);
    if (alive < 0) alive = slot_pid_alive(sl);
    if (!alive) {
      info->dead++;
      continue;
    }
    int role = sl->role < WL__SLOTS ? (int)sl->role : -1;
    if (h->token == i + 1) info->token_role = role;
    if (info->members < cap && out) {
      wl_sched_member_t *m = &out[info->members];
      m->slot = i;
      m->role = role;
      m->pid = sl->pid;
      m->uid = sl->uid;
      m->phase = (int)sl->phase;
      m->holds_token = h->token == i + 1;
      m->waiting_gate = sl->gate_waiting != 0;
      m->waiting_bytes = (size_t)WL_MIN(sl->wait_bytes, WL__BYTES_MAX);
      m->physical_bytes = (size_t)WL_MIN(sl->physical_bytes, WL__BYTES_MAX);
      m->live_bytes = (size_t)WL_MIN(sl->live_bytes, WL__BYTES_MAX);
      m->heartbeat_ns = sl->heartbeat_ns;
    }
    info->members++;
  }
  rc = (int)info->members;
out:
  free(h);
  close(fd);
  return rc;
}
