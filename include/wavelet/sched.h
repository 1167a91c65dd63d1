/* libsched: the per-GPU group of co-located replicas, its memory ledger, the phase detector and
 * the tick-tock gate. */
#ifndef WAVELET_SCHED_H
#define WAVELET_SCHED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <wavelet/alloc.h> /* WL_API, wl_budget_t, wl_out_fn */

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------
 * Version and limits
 * ----------------------------------------------------------------------------------------------*/
#define WL_SCHED_VERSION_MAJOR 0
#define WL_SCHED_VERSION_MINOR 1

/* Member slots in a group; the number of waves K is at most this too. */
#define WL_SCHED_MAX_MEMBERS 64
/* Longest group name (characters, without the terminating NUL). */
#define WL_SCHED_GROUP_MAX 48

/* wl_sched_config_t.mem_limit: derive the limit (WAVELET_MEM_LIMIT, else device memory minus a
 * safety margin, else none). An explicit 0 means no limit: the ledger only accounts. */
#define WL_SCHED_MEM_DEFAULT SIZE_MAX

/* wl_sched_config_t.flags */
#define WL_SCHED_SHARED      0x1u /* create the group so other users may join it (mode 0666) */
#define WL_SCHED_MANUAL_GATE 0x2u /* wl_sched_event and the markers do not drive the gate */
/* With a group and gpu_uuid: when the group is another GPU's, join the GPU's own group under that
 * name (wl_sched_group_gpu_name) instead, and join that one first whenever it exists. The choice
 * is made under a lock on the named group's file, so the processes of one GPU sharing a name end
 * in one group even while the name's other GPU's members come and go. */
#define WL_SCHED_GPU_ALT 0x4u

/* wl_gate_enter's non-negative results. */
#define WL_GATE_HELD   0 /* the caller's member holds the rising-phase token */
#define WL_GATE_OPEN   1 /* not gated: no usable group (left, degraded, forked child) */
#define WL_GATE_BYPASS 2 /* not gated: the calling thread is inside a bypass region */

/* ------------------------------------------------------------------------------------------------
 * Types
 * ----------------------------------------------------------------------------------------------*/
typedef struct wl_sched_s wl_sched_t;
typedef struct wl_phase_s wl_phase_t;

typedef struct wl_sched_config_s {
  /* Group name: [A-Za-z0-9._-], 1..WL_SCHED_GROUP_MAX characters, not starting with '.' or '-'.
   * NULL: derived from gpu_uuid (see wl_sched_group_name). */
  const char *group;
  /* The GPU the member's memory is on (its UUID, "GPU-…" or hex digits), NULL when none: a group
   * is one GPU's, and a joiner naming another GPU than its live members is refused (-EXDEV). */
  const char *gpu_uuid;
  /* Wave index in [0, waves), -1: the smallest free one (order of joining). */
  int role;
  /* K >= 2 waves. Set by the member that creates the group; later members adopt the group's. */
  unsigned waves;
  /* Group memory budget in bytes (WL_SCHED_MEM_DEFAULT or 0, see above); set by the creator. */
  size_t mem_limit;
  /* When mem_limit is WL_SCHED_MEM_DEFAULT: a percentage of device_memory (1..100), 0: unset. */
  unsigned mem_limit_percent;
  /* Device memory in bytes, 0 when unknown; for percentages and the default limit. */
  size_t device_memory;
  /* How long a ledger request may wait by default, for wl_sched_budget's callers (ms). */
  uint32_t alloc_timeout_ms;
  /* A holder keeping the token longer than this loses it (ms, 0: never); set by the creator. */
  uint32_t gate_timeout_ms;
  unsigned flags;
} wl_sched_config_t;

/* One member as seen in the segment (a snapshot for tools and messages). */
typedef struct wl_sched_member_s {
  unsigned slot;
  int role;
  pid_t pid;
  uid_t uid;
  int phase; /* wl_phase_kind_t */
  int holds_token;
  int waiting_gate;
  size_t waiting_bytes;  /* ledger request it waits for, 0 when not waiting */
  size_t physical_bytes; /* ledger credit */
  size_t live_bytes;     /* as reported by the member */
  uint64_t heartbeat_ns; /* CLOCK_MONOTONIC */
} wl_sched_member_t;

/* A group as wl_sched_inspect sees it. */
typedef struct wl_sched_group_info_s {
  char group[WL_SCHED_GROUP_MAX + 1];
  char gpu[64]; /* "gpu-" and the UUID's hex digits, "" when no member named one */
  unsigned waves;
  size_t limit, used; /* the ledger: its limit (0: none) and the members' credit */
  int token_role;     /* the holder's role, -1 when the token is free */
  unsigned members;   /* live members */
  unsigned dead;      /* slots of members that are gone, not yet reclaimed */
  uint64_t grants, revocations, denials, deadlocks;
} wl_sched_group_info_t;

typedef struct wl_sched_stats_s {
  /* this member */
  uint64_t gate_enters, gate_waits, gate_wait_ns, gate_releases, gate_revoked, gate_bypassed;
  uint64_t last_handoff_ns; /* token released by the previous holder -> this member running */
  uint64_t ledger_acquires, ledger_waits, ledger_denials, ledger_timeouts, ledger_deadlocks;
  uint64_t reaped; /* dead members this member reclaimed */
  size_t physical_bytes;
  /* the group */
  size_t limit, used;
  unsigned members, waves;
  uint64_t group_grants, group_revocations, group_deadlocks, group_reaped;
} wl_sched_stats_t;

/* ---- phases ----------------------------------------------------------------------------------*/
typedef enum wl_phase_kind_e {
  WL_PHASE_UNKNOWN = 0,    /* not confident: the gate stays open */
  WL_PHASE_ITER_BEGIN = 1, /* this event starts an iteration (ask for the token) */
  WL_PHASE_FORWARD = 2,    /* rising */
  WL_PHASE_BACKWARD = 3,   /* falling, from the peak on (release the token at the peak) */
  WL_PHASE_IDLE = 4        /* at the trough: optimizer step, data loading, between iterations */
} wl_phase_kind_t;

typedef enum wl_phase_event_kind_e {
  WL_PEV_ALLOC = 1,           /* size: bytes allocated */
  WL_PEV_FREE = 2,            /* size: bytes freed */
  WL_PEV_LAUNCH = 3,          /* a kernel launch (only its thread is used) */
  WL_PEV_MARK_ITER_BEGIN = 4, /* the trainer's explicit markers (wavelet/wavelet.h) */
  WL_PEV_MARK_BACKWARD = 5,
  WL_PEV_MARK_ITER_END = 6
} wl_phase_event_kind_t;

typedef struct wl_phase_event_s {
  uint64_t time_ns; /* CLOCK_MONOTONIC */
  uint64_t thread;  /* any stable id of the calling thread (gettid) */
  wl_phase_event_kind_t kind;
  size_t size;
} wl_phase_event_t;

/* wl_phase_result_t.flags */
#define WL_PHASE_F_BEGIN 0x1u /* this event begins an iteration */
#define WL_PHASE_F_PEAK  0x2u /* this event is the iteration's peak */
#define WL_PHASE_F_LOST  0x4u /* the detector lost track: an entry made at the begin was wrong */

typedef enum wl_phase_source_e {
  WL_PHASE_SRC_NONE = 0,
  WL_PHASE_SRC_MARKERS = 1, /* explicit markers were seen: they alone decide */
  WL_PHASE_SRC_PATTERN = 2  /* the learned allocation sequence */
} wl_phase_source_t;

typedef struct wl_phase_result_s {
  wl_phase_kind_t phase;
  float confidence; /* 0..1; phase is UNKNOWN below the configured minimum */
  uint32_t flags;
  wl_phase_source_t source;
  uint64_t iterations; /* iterations begun (with confidence) so far */
  size_t live_bytes;   /* allocated minus freed bytes seen so far */
  /* With WL_PHASE_F_BEGIN: how many alloc/free events ago the iteration began. 0 unless the
   * detector has seen a pass that starts like an iteration and then differs (an evaluation
   * pass): beginnings then wait until they have matched more events than such a pass did. */
  uint32_t begin_lag;
} wl_phase_result_t;

typedef struct wl_phase_config_s {
  /* Alloc/free events kept for learning the period; 0: 32768. */
  size_t history;
  /* Below this confidence the phase is UNKNOWN; 0: 0.75. */
  float min_confidence;
  /* Longest learnable iteration in alloc/free events; 0: history / 3. */
  size_t max_period;
} wl_phase_config_t;

typedef struct wl_phase_stats_s {
  uint64_t events, learned, lost, resyncs, begins, peaks, noise, pruned;
  size_t period;         /* events in the learned iteration, 0 when none */
  size_t peak_index;     /* index of the peak allocation in it */
  uint64_t false_starts; /* beginnings taken back (or never announced) before the peak */
  unsigned confirm;      /* pattern events a beginning must match before it is announced */
} wl_phase_stats_t;

/* ------------------------------------------------------------------------------------------------
 * Configuration
 * ----------------------------------------------------------------------------------------------*/

/* Fills cfg with the built-in defaults: no group, role -1, 2 waves, WL_SCHED_MEM_DEFAULT,
 * alloc timeout 5000 ms, gate timeout 5000 ms, no flags. */
WL_API void wl_sched_config_default(wl_sched_config_t *cfg);

/* Overrides cfg's fields from the WAVELET_GROUP, WAVELET_ROLE, WAVELET_WAVES, WAVELET_MEM_LIMIT,
 * WAVELET_ALLOC_TIMEOUT_MS and WAVELET_GATE_TIMEOUT_MS variables that are set. A bad value is
 * reported in one line naming the variable and what was expected, and the field keeps its
 * value. WAVELET_GROUP's string is read from the environment (do not unsetenv it while cfg is
 * in use). 0, or -EINVAL when any value was bad. */
WL_API int wl_sched_config_from_env(wl_sched_config_t *cfg);

/* Writes the group name derived from a GPU UUID ("gpu-" and the UUID's hex digits) into buf.
 * 0, -EINVAL (no hex digits), -ENOSPC (len too small). */
WL_API int wl_sched_group_name(const char *gpu_uuid, char *buf, size_t len);

/* Writes the name of gpu_uuid's own group under the name group (group, a dot and 8 hex digits
 * hashing the GPU, group shortened to fit) into buf: the group WL_SCHED_GPU_ALT joins when group
 * is another GPU's. The same for every spelling of the UUID. 0, -EINVAL (a bad name or UUID),
 * -ENOSPC (len too small). */
WL_API int wl_sched_group_gpu_name(const char *group, const char *gpu_uuid, char *buf, size_t len);

/* The budget wl_sched_join(cfg) would meet, without joining (a process told its budget before
 * it joins takes no role): the group named as the join names it (WL_SCHED_GPU_ALT's choice
 * included), its limit and use when it exists, else the limit cfg would give it (0: none) and
 * 0. 0, or -EINVAL (no group to name). */
WL_API int wl_sched_peek(const wl_sched_config_t *cfg, size_t *limit, size_t *used);

/* 0 when name is a valid group name, else -EINVAL. */
WL_API int wl_sched_group_name_check(const char *name);

/* 1 when a group of that name exists (its segment, maybe another user's), 0 when not, -EINVAL for
 * a bad name, or another negative errno. */
WL_API int wl_sched_group_exists(const char *group);

/* A snapshot of a group for tools, without joining it and without its lock (a value may be a
 * moment older than another): its header in *info and its live members, up to cap of them, in
 * out. The number of live members, or -EINVAL (a bad name), -ENOENT, -EACCES, -EPROTO (another
 * layout version), -EBADMSG (not a group segment, or one being made or removed). */
WL_API int wl_sched_inspect(const char *group, wl_sched_group_info_t *info, wl_sched_member_t *out,
                            size_t cap);

/* Removes a group's segment (for launchers cleaning up and for stale groups). Members that still
 * have it mapped keep working on their copy. 0, -ENOENT, -EINVAL or another negative errno. */
WL_API int wl_sched_group_remove(const char *group);

/* Removes a group none of whose members is alive (all killed, or a file left half-made), as its
 * last member does on leaving: a joiner that had opened it joins a new one. 0, -EBUSY (a member
 * is alive, a joiner or leaver is at work, or, without OFD locks, a segment of another layout
 * whose members cannot be told), -ENOENT, -EACCES, -EINVAL or another negative errno. */
WL_API int wl_sched_group_prune(const char *group);

/* Removes the group and every group named after it with a dot and a suffix: those a process on
 * several GPUs joins under that name (one per GPU). 0 when any was removed, else as
 * wl_sched_group_remove. */
WL_API int wl_sched_group_remove_all(const char *group);

/* ------------------------------------------------------------------------------------------------
 * The group
 * ----------------------------------------------------------------------------------------------*/

/* Joins (creating when needed) the group named by cfg and takes a member slot. Safe against any
 * number of concurrent joiners and leavers; dead members are reclaimed first. Returns 0, or
 * -EINVAL (bad name or value), -EACCES (another user's group that is not shared), -EPROTO (a
 * live group with another layout version), -EBADMSG (a live group whose segment is corrupt),
 * -EBUSY (every slot or every role is taken, or another joiner is stuck), -EEXIST (the role is
 * taken), -ERANGE (role >= the group's waves), -EXDEV (the group's live members are on another
 * GPU than cfg->gpu_uuid: the caller is expected to try another name, so its line is at the info
 * level), -ENOMEM, or the errno of a failed system call. Without OFD locks (gVisor, Linux < 3.15)
 * it joins all the same, with pid and start time as the liveness test (see libsched/README.md).
 * Every failure is explained in one message line. */
WL_API int wl_sched_join(wl_sched_t **out, const wl_sched_config_t *cfg);

/* Leaves: returns the member's memory credit, hands the token on, frees the slot, and removes
 * the segment when it was the last member. NULL is ignored. No other call on s may be running
 * or start (as with free). In a forked child it only frees the child's copy. */
WL_API void wl_sched_leave(wl_sched_t *s);

/* 0 while the member is in its group; -ENOTCONN after leaving, -EBADMSG after it left because
 * the segment was corrupt or unusable (it then runs ungated and unaccounted), -ECHILD in a
 * forked child (which never acts for its parent's member). */
WL_API int wl_sched_status(const wl_sched_t *s);

WL_API int wl_sched_role(const wl_sched_t *s);
WL_API unsigned wl_sched_waves(const wl_sched_t *s);
WL_API unsigned wl_sched_slot(const wl_sched_t *s);
WL_API const char *wl_sched_group(const wl_sched_t *s);

/* Moves the member to another wave. 0, -ERANGE, -EEXIST (taken), -EBUSY (holding the token),
 * -ENOTCONN/-EBADMSG/-ECHILD (see wl_sched_status). */
WL_API int wl_sched_set_role(wl_sched_t *s, int role);

/* Publishes the member's phase and live bytes in its slot (for tools and the ledger's messages).
 * 0 or a status error. */
WL_API int wl_sched_publish(wl_sched_t *s, wl_phase_kind_t phase, size_t live_bytes);

/* Snapshot of the live members into out[0..cap); returns how many there are (may exceed cap),
 * or a status error. */
WL_API int wl_sched_members(wl_sched_t *s, wl_sched_member_t *out, size_t cap);

/* Cheap counters. */
WL_API void wl_sched_stats_get(wl_sched_t *s, wl_sched_stats_t *out);

/* Prints the stats and the members as a fixed-width table, or one JSON object when json != 0. */
WL_API void wl_sched_stats_print(wl_sched_t *s, wl_out_fn out, void *arg, int json);

/* ------------------------------------------------------------------------------------------------
 * The ledger: the group's memory budget as liballoc's wl_budget_t
 * ----------------------------------------------------------------------------------------------*/

/* Fills *out with a budget on s (valid until wl_sched_leave): acquire(bytes, deadline_ns)
 * returns 0, -ENOMEM (over the limit and not waiting, a request larger than the limit, or a
 * deadlock: every member is waiting, so one request fails) or -ETIMEDOUT; waiting blocks on a
 * futex in the segment and gives priority to the token holder. release never underflows. When s
 * is not usable (see wl_sched_status) acquire admits everything. pressed answers whether another
 * living member waits in the ledger. An allocator given this budget calls it from its trimmer
 * thread at any time: destroy the allocator before wl_sched_leave. 0, or -EINVAL. */
WL_API int wl_sched_budget(wl_sched_t *s, wl_budget_t *out);

/* For a device found full although the ledger had room for bytes (memory the ledger cannot see):
 * waits as a ledger request of bytes would (counted as waiting, in FIFO order and by the deadlock
 * resolver) until a member gives memory back (0), one watch round (100 ms) has passed (-EAGAIN),
 * or deadline_ns on CLOCK_MONOTONIC (-ETIMEDOUT; also without a usable group, when every member
 * waits and the deadlock resolver chose this request to fail, and after two watch rounds of one
 * wait in which no other member ran: nobody in the group can give memory back), or -EINVAL for
 * bytes above 1 PiB. The caller then tries the device again. wl_sched_budget's wait_release. */
WL_API int wl_sched_wait_release(wl_sched_t *s, size_t bytes, uint64_t deadline_ns);

/* The same as the budget's calls, for direct use. */
WL_API int wl_sched_acquire(wl_sched_t *s, size_t bytes, uint64_t deadline_ns);
WL_API void wl_sched_release(wl_sched_t *s, size_t bytes);
WL_API size_t wl_sched_limit(wl_sched_t *s);
/* The configured default wait, as a deadline from now (CLOCK_MONOTONIC ns). */
WL_API uint64_t wl_sched_alloc_deadline(const wl_sched_t *s);

/* Changes the group's limit (launchers, tests). Waiters are woken. 0, -EINVAL (over 1 PiB) or
 * a status error. */
WL_API int wl_sched_set_limit(wl_sched_t *s, size_t bytes);

/* ------------------------------------------------------------------------------------------------
 * The tick-tock gate
 * ----------------------------------------------------------------------------------------------*/

/* Asks for the rising-phase token and blocks (on a futex) until this member holds it. Tokens go
 * to waiting members in round-robin role order; a member not waiting is skipped. Returns at once
 * when the member already holds it. WL_GATE_HELD, WL_GATE_OPEN, WL_GATE_BYPASS (see above); never
 * fails: any problem with the group makes it WL_GATE_OPEN. Any thread may call it. */
WL_API int wl_gate_enter(wl_sched_t *s);

/* Gives the token back (at the peak) and hands it to the next waiting member. 0, -ENOENT when
 * the member does not hold it (never did, or lost it to the gate timeout or a reset), or a
 * status error. */
WL_API int wl_gate_release(wl_sched_t *s);

/* Bypass regions of the calling thread (NCCL calls, stream capture): wl_gate_enter returns
 * WL_GATE_BYPASS without blocking while the thread is inside one. They nest. */
WL_API void wl_gate_bypass_begin(wl_sched_t *s);
WL_API void wl_gate_bypass_end(wl_sched_t *s);

/* 1 when the member holds the token now, else 0 (one relaxed load: for hot paths). */
WL_API int wl_gate_held(const wl_sched_t *s);

/* ------------------------------------------------------------------------------------------------
 * Phase detection
 * ----------------------------------------------------------------------------------------------*/

WL_API void wl_phase_config_default(wl_phase_config_t *cfg);

/* Creates a detector (process-local, not thread-safe: one caller at a time). 0, -EINVAL,
 * -ENOMEM. */
WL_API int wl_phase_create(wl_phase_t **out, const wl_phase_config_t *cfg);
WL_API void wl_phase_destroy(wl_phase_t *p);

/* Feeds one event; returns the phase after it (also in *out when out is not NULL). Markers,
 * once seen, decide alone; otherwise the detector learns the repeating allocation sequence (its
 * period and the index of the peak), follows it with the live bytes and the launching thread,
 * and reports UNKNOWN until it is confident. It allocates only when it learns an iteration
 * longer than any before (its alignment table), never while following one. */
WL_API wl_phase_kind_t wl_phase_feed(wl_phase_t *p, const wl_phase_event_t *ev,
                                     wl_phase_result_t *out);

WL_API void wl_phase_stats_get(const wl_phase_t *p, wl_phase_stats_t *out);
WL_API const char *wl_phase_name(wl_phase_kind_t phase);

/* The member's own detector fed with ev, driving the gate unless WL_SCHED_MANUAL_GATE: it
 * enters at a confident ITER_BEGIN (blocking), releases at the peak and when the detector loses
 * track. Publishes the phase. Returns the phase (UNKNOWN when s is unusable). Thread-safe. */
WL_API wl_phase_kind_t wl_sched_event(wl_sched_t *s, const wl_phase_event_t *ev);

/* The member the trainer markers of wavelet/wavelet.h act on; NULL: none. The first member joined
 * in a process becomes the default. */
WL_API void wl_sched_set_default(wl_sched_t *s);
WL_API wl_sched_t *wl_sched_get_default(void);

/* fn(kind) at every trainer marker of this process (kind one of WL_PEV_MARK_*), before the
 * default member's detector sees it, and also when no member is joined: how a tracer records the
 * markers (libwavelet.so's trace has them in trace and alloc modes). One hook a process; NULL
 * removes it. fn runs on the thread that called the marker and must not call a marker itself. */
WL_API void wl_sched_set_marker_hook(void (*fn)(int kind));

/* ------------------------------------------------------------------------------------------------
 * CPU affinity
 * ----------------------------------------------------------------------------------------------*/

/* The CPUs (logical processor numbers, ascending) member `index` of `count` should run on: the
 * cores close to the GPU at PCI address pci_bus_id ("0000:3b:00.0" or "3b:00.0"; NULL or no such
 * device: the whole machine), split into `count` disjoint sets of whole cores (shared only when
 * there are fewer cores than members, with a warning). Uses hwloc and sysfs, never CUDA. Where
 * hwloc cannot read the topology (sandboxes that hide sysfs, such as gVisor), the CPUs the calling
 * thread may use are split instead, each as its own core, without locality (one warning). Writes
 * up to cap numbers into cpus and returns how many there are, or -EINVAL (bad bus id, index >=
 * count, count 0: checked first, on every machine), -ENOMEM, or -ENODEV when no CPU is usable. */
WL_API int wl_affinity_plan(const char *pci_bus_id, unsigned index, unsigned count, int *cpus,
                            size_t cap);

/* Binds cpus to pid's main thread (threads it creates later inherit it: call it on a child
 * before exec), or with pid 0 to every thread of the calling process. 0 or negative errno. */
WL_API int wl_affinity_apply(pid_t pid, const int *cpus, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* WAVELET_SCHED_H */
