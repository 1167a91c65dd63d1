/* The data-parallel rendezvous the launcher shares with its rank processes, and the cpu
 * backend's all-reduce over it: each rank writes its weighted gradient into its own slot, and
 * after a barrier every rank sums the slots in rank order (the same bits everywhere). */
#include "reducer.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Waiters look at the abort flag at least this often. */
#define POLL_NS (100ull * 1000000ull)

typedef struct comm_s {
  uint32_t count;    /* ranks arrived at the current barrier */
  uint32_t gen;      /* barriers passed: the futex word */
  uint32_t abort;    /* set: every waiter returns -ECONNABORTED */
  int32_t dead;      /* the rank reported failed first, -1: none */
  uint32_t id_ready; /* the NCCL id below is set */
  unsigned char id[WB_DP_ID_BYTES];
} __attribute__((aligned(64))) comm_t;

/* The mapping's head: what an exec'd rank needs to find its way in it (wb_dp_attach). */
typedef struct dp_head_s {
  int comms, ranks;
  size_t floats, bytes;
} dp_head_t;

/* A process's handle on the mapping: forked ranks share the parent's, exec'd ones attach. */
struct wb_dp_s {
  int comms, ranks;
  size_t floats, bytes;
  int fd;       /* the memfd behind the mapping */
  void *base;   /* the mapping: head, comms, slots */
  comm_t *c;    /* comms of them */
  float *slots; /* [comm][rank][floats] */
};

static size_t slot_floats(size_t floats) {
  return wl__align_up(floats ? floats : 1, 16); /* 64-byte slots */
}

static size_t head_bytes(int comms) {
  return wl__align_up(wl__align_up(sizeof(dp_head_t), 64) + (size_t)comms * sizeof(comm_t), 4096);
}

/* The handle over a mapping whose head is set. */
static wb_dp_t *dp_handle(void *p, int fd) {
  const dp_head_t *h = p;
  wb_dp_t *dp = calloc(1, sizeof *dp);
  if (!dp) return NULL;
  dp->comms = h->comms;
  dp->ranks = h->ranks;
  dp->floats = h->floats;
  dp->bytes = h->bytes;
  dp->fd = fd;
  dp->base = p;
  dp->c = (comm_t *)((char *)p + wl__align_up(sizeof(dp_head_t), 64));
  dp->slots = h->floats ? (float *)((char *)p + head_bytes(h->comms)) : NULL;
  return dp;
}

wb_dp_t *wb_dp_create(int comms, int local_ranks, size_t floats) {
  if (comms < 1 || local_ranks < 1) {
    errno = EINVAL;
    return NULL;
  }
  size_t head = head_bytes(comms);
  size_t slots = floats ? (size_t)comms * (size_t)local_ranks * slot_floats(floats) : 0;
  size_t bytes = head + slots * sizeof(float);
  /* A memfd, so that a rank exec'd under the preload (cuda) can map it too. */
  int fd = memfd_create("wavelet-bench-dp", MFD_CLOEXEC);
  if (fd < 0) return NULL;
  if (ftruncate(fd, (off_t)bytes)) {
    int e = errno;
    close(fd);
    errno = e;
    return NULL;
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    errno = e;
    return NULL;
  }
  *(dp_head_t *)p =
      (dp_head_t){.comms = comms, .ranks = local_ranks, .floats = floats, .bytes = bytes};
  wb_dp_t *dp = dp_handle(p, fd);
  if (!dp) {
    munmap(p, bytes);
    close(fd);
    errno = ENOMEM;
    return NULL;
  }
  for (int i = 0; i < comms; i++) dp->c[i].dead = -1;
  return dp;
}

int wb_dp_fd(const wb_dp_t *dp) {
  return dp ? dp->fd : -1;
}

wb_dp_t *wb_dp_attach(int fd) {
  struct stat st;
  if (fstat(fd, &st)) return NULL;
  if ((size_t)st.st_size < sizeof(dp_head_t)) {
    errno = EINVAL;
    return NULL;
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return NULL;
  const dp_head_t *h = p;
  if (h->bytes != (size_t)st.st_size || h->comms < 1 || h->ranks < 1 ||
      head_bytes(h->comms) > h->bytes) {
    munmap(p, (size_t)st.st_size);
    errno = EINVAL;
    return NULL;
  }
  wb_dp_t *dp = dp_handle(p, fd);
  if (!dp) {
    munmap(p, (size_t)st.st_size);
    errno = ENOMEM;
  }
  return dp;
}

void wb__dp_wake(uint32_t *word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void wb_dp_abort(wb_dp_t *dp, int comm, int dead_rank) {
  if (!dp) return;
  for (int i = 0; i < dp->comms; i++) {
    if (comm >= 0 && i != comm) continue;
    comm_t *c = &dp->c[i];
    int32_t none = -1;
    __atomic_compare_exchange_n(&c->dead, &none, dead_rank, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    __atomic_store_n(&c->abort, 1, __ATOMIC_RELEASE);
    wb__dp_wake(&c->gen);
    wb__dp_wake(&c->id_ready);
  }
}

void wb_dp_destroy(wb_dp_t *dp) {
  if (!dp) return;
  munmap(dp->base, dp->bytes);
  close(dp->fd);
  free(dp);
}

int wb__dp_dead_rank(const wb_dp_t *dp, int comm) {
  return __atomic_load_n(&dp->c[comm].dead, __ATOMIC_ACQUIRE);
}

int wb__dp_wait_change(wb_dp_t *dp, int comm, const uint32_t *word, uint32_t val,
                       uint64_t deadline_ns) {
  comm_t *c = &dp->c[comm];
  for (;;) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != val) return 0;
    if (__atomic_load_n(&c->abort, __ATOMIC_ACQUIRE)) return -ECONNABORTED;
    uint64_t now = wl__now_ns();
    if (now >= deadline_ns) return -ETIMEDOUT;
    uint64_t wait = deadline_ns - now < POLL_NS ? deadline_ns - now : POLL_NS;
    struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000ull),
                          .tv_nsec = (long)(wait % 1000000000ull)};
    syscall(SYS_futex, word, FUTEX_WAIT, val, &ts, NULL, 0);
  }
}

int wb__dp_share_id(const wb_reducer_cfg_t *cf, unsigned char *id,
                    int (*make)(unsigned char *id, void *arg, char *why, size_t len), void *arg,
                    char *why, size_t len) {
  comm_t *c = &cf->dp->c[cf->comm];
  uint64_t deadline = wl__now_ns() + (uint64_t)cf->timeout_ms * 1000000ull;
  char path[4096], tmp[4200];
  if (cf->id_path) snprintf(path, sizeof path, "%s.%d", cf->id_path, cf->comm);
  if (cf->rank == 0) {
    int rc = make(id, arg, why, len);
    if (rc) return rc;
    if (!cf->id_path) {
      memcpy(c->id, id, WB_DP_ID_BYTES);
      __atomic_store_n(&c->id_ready, 1, __ATOMIC_RELEASE);
      wb__dp_wake(&c->id_ready);
      return 0;
    }
    /* Written whole under a temporary name, then linked into place: readers never see half an
     * id, and link refuses a file left by an earlier run, whose id would be stale. */
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write(fd, id, WB_DP_ID_BYTES) == WB_DP_ID_BYTES;
    if (fd >= 0) ok = close(fd) == 0 && ok;
    int err = ok ? (link(tmp, path) == 0 ? 0 : errno) : errno;
    unlink(tmp);
    if (err == EEXIST) {
      snprintf(why, len, "--nccl-id: %s exists (from an earlier run?): remove it", path);
      return -EEXIST;
    }
    if (err) {
      snprintf(why, len, "--nccl-id: cannot write %s: %s", path, strerror(err));
      return -err;
    }
    return 0;
  }
  if (!cf->id_path) {
    int rc = wb__dp_wait_change(cf->dp, cf->comm, &c->id_ready, 0, deadline);
    if (rc) {
      snprintf(why, len, "%s while waiting for rank 0's NCCL id",
               rc == -ETIMEDOUT ? "timed out" : "abandoned");
      return rc;
    }
    memcpy(id, c->id, WB_DP_ID_BYTES);
    return 0;
  }
  for (;;) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
      ssize_t got = read(fd, id, WB_DP_ID_BYTES);
      close(fd);
      if (got == WB_DP_ID_BYTES) return 0;
    }
    uint32_t never = 0;
    int rc =
        wb__dp_wait_change(cf->dp, cf->comm, &never, 0,
                           wl__now_ns() + POLL_NS < deadline ? wl__now_ns() + POLL_NS : deadline);
    if (rc == -ECONNABORTED) {
      snprintf(why, len, "abandoned while waiting for the NCCL id in %s", path);
      return rc;
    }
    if (wl__now_ns() >= deadline) {
      snprintf(why, len, "--nccl-id: no id in %s after %u ms (is rank 0 running?)", path,
               cf->timeout_ms);
      return -ETIMEDOUT;
    }
  }
}

/* ---- the reducer ---------------------------------------------------------------------------*/

static int fail_why(wb_reducer_t *r, int rc) {
  const wb_reducer_cfg_t *cf = &r->cfg;
  if (rc == -ECONNABORTED) {
    int dead = wb__dp_dead_rank(cf->dp, cf->comm);
    if (dead >= 0)
      snprintf(r->why, sizeof r->why,
               "the all-reduce of replica %d was abandoned: rank %d failed or died", cf->comm,
               dead);
    else
      snprintf(r->why, sizeof r->why, "the all-reduce of replica %d was abandoned", cf->comm);
  } else if (rc == -ETIMEDOUT) {
    snprintf(r->why, sizeof r->why,
             "the all-reduce of replica %d timed out after %u ms waiting for the other ranks",
             cf->comm, cf->timeout_ms);
  }
  return rc;
}

static int cpu_barrier(wb_reducer_t *r) {
  comm_t *c = &r->cfg.dp->c[r->cfg.comm];
  if (__atomic_load_n(&c->abort, __ATOMIC_ACQUIRE)) return fail_why(r, -ECONNABORTED);
  uint32_t g = __atomic_load_n(&c->gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&c->count, 1, __ATOMIC_ACQ_REL) == (uint32_t)r->cfg.nranks) {
    /* The last to arrive resets the count before anyone can see the new generation. */
    __atomic_store_n(&c->count, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->gen, 1, __ATOMIC_RELEASE);
    wb__dp_wake(&c->gen);
    return 0;
  }
  uint64_t deadline = wl__now_ns() + (uint64_t)r->cfg.timeout_ms * 1000000ull;
  return fail_why(r, wb__dp_wait_change(r->cfg.dp, r->cfg.comm, &c->gen, g, deadline));
}

static float *slot(wb_dp_t *dp, int comm, int rank) {
  return dp->slots + ((size_t)comm * (size_t)dp->ranks + (size_t)rank) * slot_floats(dp->floats);
}

static int cpu_allreduce(wb_reducer_t *r, float *buf, size_t n, float weight) {
  wb_dp_t *dp = r->cfg.dp;
  if (n > dp->floats) {
    snprintf(r->why, sizeof r->why, "all-reduce of %zu floats: the slots hold %zu", n, dp->floats);
    return -EINVAL;
  }
  float *mine = slot(dp, r->cfg.comm, r->cfg.rank);
  for (size_t i = 0; i < n; i++) mine[i] = weight * buf[i];
  int rc = cpu_barrier(r);
  if (rc) return rc;
  /* Rank order, on every rank: the sums are the same bits everywhere. */
  memcpy(buf, slot(dp, r->cfg.comm, 0), n * sizeof *buf);
  for (int q = 1; q < r->cfg.nranks; q++) {
    const float *s = slot(dp, r->cfg.comm, q);
    for (size_t i = 0; i < n; i++) buf[i] += s[i];
  }
  /* Nobody writes its slot again before everyone has read them all. */
  return cpu_barrier(r);
}

int wb_reducer_create(wb_reducer_t **out, const wb_reducer_cfg_t *cfg, char *why, size_t len) {
  *out = NULL;
  if (!cfg->dp || cfg->comm < 0 || cfg->comm >= cfg->dp->comms || cfg->nranks < 1 ||
      cfg->rank < 0 || cfg->rank >= cfg->nranks || cfg->local_rank < 0 ||
      cfg->local_rank >= cfg->dp->ranks) {
    snprintf(why, len, "bad data-parallel configuration (rank %d of %d, communicator %d)",
             cfg->rank, cfg->nranks, cfg->comm);
    return -EINVAL;
  }
  wb_reducer_t *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  r->cfg = *cfg;
  if (!r->cfg.timeout_ms) r->cfg.timeout_ms = 120000;
  if (cfg->be && cfg->be->kind == WB_BACKEND_CUDA) {
#ifdef WB_HAVE_CUDA
    int rc = wb__nccl_create(r, why, len);
    if (rc) {
      free(r);
      return rc;
    }
#endif
  } else if (cfg->nranks != cfg->dp->ranks || cfg->rank != cfg->local_rank || !cfg->dp->slots) {
    snprintf(why, len,
             "the cpu all-reduce works in shared memory on one machine: rank %d of %d does "
             "not fit %d local ranks",
             cfg->rank, cfg->nranks, cfg->dp->ranks);
    free(r);
    return -EINVAL;
  }
  *out = r;
  return 0;
}

int wb_reducer_allreduce(wb_reducer_t *r, float *buf, size_t n, float weight) {
#ifdef WB_HAVE_CUDA
  if (r->nccl) return wb__nccl_allreduce(r, buf, n, weight);
#endif
  return cpu_allreduce(r, buf, n, weight);
}

int wb_reducer_barrier(wb_reducer_t *r) {
#ifdef WB_HAVE_CUDA
  if (r->nccl) return wb__nccl_allreduce(r, NULL, 0, 1.f); /* a one-float all-reduce */
#endif
  return cpu_barrier(r);
}

const char *wb_reducer_why(const wb_reducer_t *r) {
  return r->why;
}

void wb_reducer_destroy(wb_reducer_t *r, int failed) {
  if (!r) return;
  if (failed) wb_dp_abort(r->cfg.dp, r->cfg.comm, r->cfg.rank);
#ifdef WB_HAVE_CUDA
  if (r->nccl) wb__nccl_destroy(r, failed);
#endif
  free(r);
}

#ifndef WB_HAVE_CUDA
int wb_nccl_available(int *version, char *why, size_t len) {
  *version = 0;
  snprintf(why, len, "this build has no CUDA backend");
  return 0;
}
#endif
