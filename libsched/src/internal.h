/* libsched internals: the group segment's layout and the declarations shared by its files. */
#ifndef WAVELET_SCHED_INTERNAL_H
#define WAVELET_SCHED_INTERNAL_H

#include <wavelet/sched.h>

#include <linux/futex.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

/* ---- the segment layout (shm.c) ---------------------------------------------------------------
 * One POSIX shared-memory object per group, "/wavelet-<group>". Everything in it may be written
 * by any member, so every value is range-checked on use. Bump WL__LAYOUT_VERSION whenever a byte
 * of this layout changes meaning: a process speaking another version refuses to join. */
#define WL__MAGIC          0x31444843534c5757ull /* "WWLSCHD1" */
#define WL__LAYOUT_VERSION 4u
#define WL__SLOTS          WL_SCHED_MAX_MEMBERS
#define WL__SHM_PREFIX     "/wavelet-"

/* Open-file-description locks on the segment, released by the kernel when a process dies. Their
 * offsets do not depend on the layout, so processes of any version agree on them; keep them so.
 * Byte 0 serialises join, leave and (re)initialisation. Byte 1 + i is held by the live member of
 * slot i for as long as it is a member: liveness without /proc, immune to pid reuse and pid
 * namespaces. No lock in [1, 1 + WL__LOCK_SLOT_SPAN) means nobody is a member. The byte after
 * them is the naming lock (shm.c). */
#define WL__LOCK_INIT      0 /* the byte wl__life_lock takes */
#define WL__LOCK_SLOT(i)   (1 + (off_t)(i))
#define WL__LOCK_SLOT_SPAN 4096
/* Held while a WL_SCHED_GPU_ALT joiner chooses between a name and the GPU's own group under it. */
#define WL__LOCK_NAMING (1 + (off_t)WL__LOCK_SLOT_SPAN)

enum { WL__SEG_INIT = 0, WL__SEG_READY = 1, WL__SEG_DEAD = 2 };
enum { WL__SLOT_FREE = 0, WL__SLOT_LIVE = 1 };
#define WL__HDR_SHARED 0x1u

/* A member slot, written by its owner and, under the group lock, by reapers. 256 bytes. */
typedef struct wl__slot_s {
  uint32_t state; /* WL__SLOT_* */
  uint32_t role;
  uint64_t incarnation; /* unique per join: a reaped-and-reused slot is told apart */
  int32_t pid;
  uint32_t uid;
  uint64_t start_time; /* /proc/<pid>/stat starttime, for messages and the /proc fallback */
  uint64_t join_ns;
  uint64_t heartbeat_ns;
  uint32_t phase;
  uint32_t wait_count; /* this member's threads waiting in the ledger */
  uint64_t live_bytes;
  uint64_t physical_bytes; /* ledger credit */
  /* ledger wait */
  uint64_t wait_bytes; /* sum of the waiting threads' requests; 0: not waiting */
  uint64_t wait_since_ns;
  uint32_t wait_fail; /* set by a deadlock resolver: fail the request */
  uint32_t wait_pass; /* set by a deadlock resolver: a request that fits may skip the others */
  uint64_t wait_min;  /* the smallest waiting request of this member's threads; 0: not waiting */
  /* gate */
  uint32_t gate_waiting;
  uint64_t gate_wait_since_ns;
  uint32_t wake; /* futex word: bumped when the token is granted to this slot */
  uint32_t _pad1;
  uint64_t grants; /* tokens this member got */
  uint8_t _reserved[120];
} wl__slot_t;

typedef struct wl__shm_s {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_size; /* offsetof(slots) */
  uint64_t segment_size;
  uint32_t max_members;
  uint32_t slot_size;
  uint32_t state; /* WL__SEG_* */
  uint32_t flags; /* WL__HDR_* */
  uint32_t creator_uid;
  uint32_t waves;
  uint32_t gate_timeout_ms;
  uint32_t members; /* LIVE slots (derived, checked) */
  uint64_t created_ns;
  uint64_t incarnations;
  uint64_t epoch; /* bumped on every membership change */
  /* The GPU the group is for ("gpu-" and the UUID's hex digits, NUL-padded), "" when no member
   * named one. Written and read under the group lock; read as at most WL__GPU_MAX bytes. */
  char gpu[64];
  /* The group lock (shm.c): 0 free, else the holder (WL__LOCK_OWNER) | WL__LOCK_WAITERS. Not a
   * pthread mutex: glibc's robust mutexes keep a list through the mutex itself, and unlocking
   * one whose links another process overwrote writes to wherever they point. */
  uint32_t lock_word __attribute__((aligned(64)));
  uint32_t _pad_lock[15];
  /* ledger */
  uint64_t limit __attribute__((aligned(64))); /* 0: none */
  uint64_t used;                               /* sum of the LIVE slots' physical_bytes */
  uint32_t ledger_seq;                         /* futex word: bumped on every release */
  uint32_t ledger_waiters;                     /* slots with wait_bytes != 0 (derived) */
  uint64_t denials, deadlocks;
  /* gate */
  uint32_t token __attribute__((aligned(64))); /* 0: free, else holder slot + 1 */
  uint32_t cursor_role;                        /* role of the last holder (round robin) */
  uint64_t token_gen;                          /* bumped on every grant, release and revocation */
  uint64_t grant_ns;                           /* when the current holder got it */
  uint64_t grants, revocations, reaped;
  wl__slot_t slots[WL__SLOTS] __attribute__((aligned(64)));
} wl__shm_t;

_Static_assert(sizeof(wl__slot_t) == 256, "slot layout");
/* No byte count in the segment may exceed this (1 PiB): larger values mean corruption. */
#define WL__BYTES_MAX ((uint64_t)1 << 50)
#define WL__GPU_MAX   63
#define WL__SEG_SIZE  ((sizeof(wl__shm_t) + 4095) & ~(size_t)4095)

/* The group lock word: bits 0-6 the holder's slot + 1, or WL__LOCK_JOINER for a process joining
 * (it has no slot yet; it holds the init lock instead), bits 7-30 the low bits of its pid (for
 * messages), bit 31 set when someone may be waiting. A holder is alive while it holds its
 * liveness lock (the joiner: the init lock); a dead holder's lock is taken over. */
#define WL__LOCK_WAITERS 0x80000000u
#define WL__LOCK_JOINER  0x7fu
#define WL__LOCK_OWNER(slot_field, pid)                                                            \
  ((uint32_t)(slot_field) | (((uint32_t)(pid)&0xffffffu) << 7))

/* ---- atomics on the segment: relaxed unless ordering matters, always atomic ------------------*/
#define WL_LD(x)     __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define WL_ST(x, v)  __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define WL_LDA(x)    __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define WL_STR(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define WL_ADD(x, v) __atomic_add_fetch(&(x), (v), __ATOMIC_RELAXED)

/* ---- the process-local member (shm.c) --------------------------------------------------------*/
enum { WL__ST_LIVE = 0, WL__ST_LEFT = 1, WL__ST_DEGRADED = 2 };

struct wl_sched_s {
  char group[WL_SCHED_GROUP_MAX + 1];
  char shm_name[WL_SCHED_GROUP_MAX + 16];
  int fd;
  int fd_index; /* in the fork table */
  wl__shm_t *shm;
  pid_t pid;         /* the joining process: a forked child never acts for it */
  unsigned fork_gen; /* wl__fork_generation when it joined */
  uint32_t slot;
  uint64_t incarnation;
  int role;
  unsigned waves;
  int state; /* WL__ST_*, atomic */
  unsigned flags;
  uint32_t alloc_timeout_ms;
  uint32_t gate_timeout_ms;
  int lock_failures; /* consecutive lock timeouts (atomic) */
  bool init_locked;  /* this member (joining or leaving) holds the segment's init lock */
  /* Serialises this process's threads before the group lock word (which names a process). */
  pthread_mutex_t local_lock;
  /* Set by the SIGBUS handler when the segment was truncated under us and the mapping was
   * replaced by zeroed private memory: the member must leave (atomic). */
  int seg_lost;
  /* This process's threads waiting in the ledger (their stack frames), under the group lock:
   * the slot's wait_min must be exact, so the resolver never promises room that is not there. */
  struct wl__ledger_wait_s *ledger_waits;
  /* The budget's pressed() (ledger.c), atomic: when the waiters were last seen alive, and whether
   * one was (a dead waiter stays counted until someone reaps it). */
  uint64_t press_seen_ns;
  uint32_t press_n; /* how many waited then */
  int press_alive;
  /* gate (atomic) */
  int holding;
  uint64_t held_gen;
  /* detector, driven by wl_sched_event (sched.c): whichever thread takes `feeding` feeds its
   * own event and every queued one; a thread that finds it taken queues its event and goes on.
   * No thread ever waits for another in the common case. */
  int feeding; /* atomic: 1 while a thread feeds the detector */
  wl_phase_t *phase;
  int auto_entered;              /* the detector entered the gate this iteration */
  uint64_t auto_seq;             /* release decisions so far (an entering thread's is stale) */
  int last_phase;                /* atomic wl_phase_kind_t: the phase after the last event fed */
  uint64_t ev_head;              /* queue consumer position (the feeding thread only) */
  uint64_t ev_tail;              /* atomic: producers' next position */
  uint64_t ev_queued, ev_waited; /* atomic stats: events queued, queue-full waits */
  struct {
    uint64_t seq; /* atomic: position + 1 when filled, position + WL__EVQ when free again */
    wl_phase_event_t ev;
  } evq[64];
  /* stats (atomic) */
  wl_sched_stats_t st;
};

#define WL__EVQ 64 /* the size of wl_sched_s.evq */

/* Liveness test hook results. */
enum { WL__DEAD = 0, WL__ALIVE = 1 };

/* Takes the group lock with a bounded wait, repairing the state after a holder's death.
 * 0, or a negative errno after which the caller must not touch the segment (the member may have
 * been degraded: check wl__usable). */
int wl__lock(wl_sched_t *s);
void wl__unlock(wl_sched_t *s);
/* Bumped in every forked child (shm.c): a member joined before the fork is not the child's.
 * Comparing it is how hot paths tell without a getpid system call. */
extern unsigned wl__fork_generation;
/* True when s was joined by this process (not inherited through fork). */
static inline bool wl__mine(const wl_sched_t *s) {
  return s->fork_gen == __atomic_load_n(&wl__fork_generation, __ATOMIC_RELAXED);
}
/* Degrades a member whose segment the SIGBUS handler replaced; returns false. */
bool wl__lost(const wl_sched_t *s);
/* True when s is joined, not degraded and called from the joining process. */
static inline bool wl__usable(const wl_sched_t *s) {
  if (!s || __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != WL__ST_LIVE || !wl__mine(s))
    return false;
  if (WL_UNLIKELY(__atomic_load_n(&s->seg_lost, __ATOMIC_ACQUIRE))) return wl__lost(s);
  return true;
}
/* Leaves the group because of a problem with the segment: one error line, then ungated. Call
 * with the lock held or not (held: it is released). */
void wl__degrade(wl_sched_t *s, bool locked, const char *why);
/* Checks every value in the segment (lock held). 0, or -EBADMSG after degrading the member. */
int wl__validate(wl_sched_t *s);
/* Reclaims every dead member's slot, credit and token (lock held). Returns how many. */
unsigned wl__reap(wl_sched_t *s);
/* 1 when the member in slot i is alive, 0 when dead. */
int wl__slot_alive(wl_sched_t *s, unsigned i);
/* Clears slot i (lock held): its credit goes back, its token to the next waiter. */
void wl__slot_clear(wl_sched_t *s, unsigned i);
/* True while our own slot is still ours (lock held, or a racy hint without it). */
bool wl__slot_mine(wl_sched_t *s);
/* One-line description of the members for messages. */
void wl__describe_members(wl_sched_t *s, char *buf, size_t len);

/* ---- futexes in the segment (shared, not private) --------------------------------------------*/
/* Waits while *word == val, until woken or the absolute CLOCK_MONOTONIC deadline (0: none).
 * 0 (woken or value changed), -ETIMEDOUT, -EINTR. */
int wl__futex_wait(uint32_t *word, uint32_t val, uint64_t deadline_ns);
void wl__futex_wake(uint32_t *word, int n);

/* Waiters wake at least this often to look for dead members and stalled holders: the bound on
 * how long a member's death can go unnoticed by a waiter. */
#define WL__WATCH_NS (100ull * 1000000ull)

/* ---- ledger (ledger.c) -----------------------------------------------------------------------*/
/* Looks for a deadlock (every live member blocked, one in the ledger) and fails one ledger
 * request if so (lock held). True when it picked a victim. */
bool wl__ledger_resolve_deadlock(wl_sched_t *s);
/* Wakes the ledger's waiters after memory came back (lock held or not). */
void wl__ledger_kick(wl_sched_t *s);

/* ---- gate (gate.c) ---------------------------------------------------------------------------*/
/* Hands the token from its holder (slot `from`, or none) to the next waiting member in role
 * order after `after_role` (lock held). Returns the slot granted + 1, or 0 (token now free).
 * Wakes nobody: call wl__gate_wake with the result after unlocking. */
uint32_t wl__gate_pass(wl_sched_t *s, uint32_t after_role);
void wl__gate_wake(wl_sched_t *s, uint32_t granted);
/* Revokes the token from a holder that kept it past the group's timeout (lock held). */
uint32_t wl__gate_check_stall(wl_sched_t *s);

/* ---- options (options.c) ---------------------------------------------------------------------*/
/* Resolves the memory limit from cfg; 0 for none. */
size_t wl__resolve_limit(const wl_sched_config_t *cfg);

/* ---- affinity (affinity.c) -------------------------------------------------------------------*/
/* wl_affinity_plan on an already loaded hwloc topology (a hwloc_topology_t). */
int wl__affinity_plan_topo(void *topology, const char *pci_bus_id, unsigned index, unsigned count,
                           int *cpus, size_t cap);
/* The same on a synthetic topology ("pack:2 core:4 pu:2"), for tests. */
int wl__affinity_plan_synthetic(const char *desc, unsigned index, unsigned count, int *cpus,
                                size_t cap);

/* ---- test hooks (used by tests/sched; no effect otherwise) -----------------------------------*/
/* Offsets within the segment, for tests that corrupt it on purpose. */
wl__shm_t *wl__test_shm(wl_sched_t *s);

#endif
