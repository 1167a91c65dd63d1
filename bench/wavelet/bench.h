/* wavelet-bench's options and the per-replica results the replicas report to the parent. */
#ifndef WB_BENCH_H
#define WB_BENCH_H

#include "data.h"
#include "net.h"
#include "reducer.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#define WB_MAX_EPOCH_EVALS 64

typedef enum wb_mode_e { WB_SINGLE = 0, WB_COLOCATE = 1, WB_TICKTOCK = 2 } wb_mode_t;

typedef struct wb_opts_s {
  wb_backend_kind_t backend;
  wb_model_t model;
  wb_mode_t mode;
  int replicas;
  uint64_t steps; /* 0: epochs decide */
  unsigned epochs;
  size_t batch;
  size_t mem_limit; /* 0: none */
  uint64_t seed;
  int threads; /* kernel threads per replica */
  wb_opt_t opt;
  float lr;
  size_t train_samples, test_samples; /* 0: all */
  const char *data;                   /* directory or "synthetic" */
  const char *trace_dir;              /* NULL: no traces */
  char group[48];                     /* the libsched group of colocate and ticktock */
  uint32_t alloc_timeout_ms;
  int json, quiet;
  int cosine;          /* learning rate from lr down to 0 along a half cosine over the run */
  int eval_each_epoch; /* test accuracy after every epoch (progress lines and JSON) */
  /* Data parallelism: gpus ranks on this machine (0: off), nodes machines, this one node;
   * replica k of every rank forms communicator k. */
  int gpus, nodes, node;
  const char *nccl_id;      /* multi-node: the id file prefix on a shared file system */
  const char *save_weights; /* rank 0 writes replica k's final parameters to PATH.k */
  uint32_t dp_timeout_ms;   /* how long an all-reduce waits for the other ranks */
  /* cuda colocate/ticktock: each replica is this binary exec'd under LD_PRELOAD=libwavelet.so
   * (the interposer gates and budgets it, as it would an unmodified trainer), unless
   * gate_embedded asks for the old way (forked, libsched's embedded API). */
  const char *preload_arg; /* --preload, NULL: found next to the binary */
  int gate_embedded;       /* --gate embedded */
  int via_preload;         /* this run's replicas are exec'd under the preload */
  char preload[4096];      /* the resolved libwavelet.so (via_preload) */
  int argc;                /* the command line, for the exec'd replicas */
  char **argv;
} wb_opts_t;

/* Ranks on this machine (1 without --gpus) and over all machines. */
static inline int wb_local_ranks(const wb_opts_t *o) {
  return o->gpus ? o->gpus : 1;
}
static inline int wb_ranks(const wb_opts_t *o) {
  return wb_local_ranks(o) * (o->nodes ? o->nodes : 1);
}

/* Steps in an epoch: every rank walks the same order in global batches of ranks x batch, and a
 * last global batch too small to give every rank a sample is dropped. */
static inline size_t wb_steps_per_epoch(size_t samples, size_t batch, int ranks) {
  size_t gb = batch * (size_t)ranks;
  return samples / gb + (samples % gb >= (size_t)ranks ? 1 : 0);
}

typedef enum wb_status_e {
  WB_ST_NONE = 0,
  WB_ST_OK = 1,
  WB_ST_OOM = 2,  /* ran out of memory under the limit */
  WB_ST_ERROR = 3 /* anything else (message says what) */
} wb_status_t;

typedef struct wb_result_s {
  int role;          /* the process's slot: local rank * replicas + replica */
  int rank, replica; /* global data-parallel rank (0 without --gpus) and replica index */
  pid_t pid;
  int status; /* wb_status_t */
  uint64_t steps, samples;
  uint64_t start_ns, end_ns; /* training, CLOCK_MONOTONIC */
  /* Published at every iteration's end, so a replica that dies shows what it had reached. */
  size_t peak, trough, group_peak;
  uint64_t mem_wait_ns, gate_wait_ns;
  int gate_wait_known;  /* 0: not measured (under the preload without a trace to read it from) */
  int mem_wait_known;   /* the same for mem_wait_ns */
  uint64_t gate_grants; /* the token's grants (tick-tock) */
  double first_loss, last_loss, train_acc; /* first and last 10 % of the steps; NaN: not measured */
  double test_acc, test_loss;              /* NaN: not measured */
  uint64_t params;
  uint64_t allreduce_ns, allreduces; /* gradient all-reduce time, including waiting for peers */
  uint64_t checksum;                 /* FNV-1a of the final weights (have_checksum) */
  int have_checksum;
  int save_failed; /* --save-weights could not write the file (msg says why); the results stand */
  unsigned epochs_evaluated; /* with eval_each_epoch: test accuracy after epoch i + 1 */
  float epoch_acc[WB_MAX_EPOCH_EVALS];
  float epoch_s[WB_MAX_EPOCH_EVALS]; /* training seconds up to that epoch's end */
  char msg[480];
} wb_result_t;

/* A result before anything is measured: the losses and accuracies NaN (null in the JSON, '-' in
 * the table), so a replica that dies early never shows a loss of 0. */
static inline void wb_result_reset(wb_result_t *r) {
  memset(r, 0, sizeof *r);
  r->first_loss = r->last_loss = r->train_acc = NAN;
  r->test_acc = r->test_loss = NAN;
}

#define WB_MAX_PROCS 64

/* The memory the replicas share with the parent (a memfd, so that replicas exec'd under the
 * preload map it too): results and a start barrier. */
typedef struct wb_shared_s {
  pthread_barrier_t start;
  int arrived[WB_MAX_PROCS]; /* replica i reached the barrier (one that ends without would
                              * leave the others waiting there) */
  wb_result_t r[WB_MAX_PROCS];
} wb_shared_t;

/* Runs replica `role` (setup, the start barrier, training, evaluation) and fills *res; role is
 * local rank * replicas + replica index; dp is the data-parallel rendezvous (NULL without
 * --gpus). Returns the process exit status: 0 done, 1 failed (res->msg says why). */
int wb_replica_run(const wb_opts_t *o, const wb_data_t *d, int role, wb_shared_t *sh, wb_dp_t *dp);

/* ---- replicas under the preload (preload.c) --------------------------------------------------*/

/* The trainer markers of the preloaded libwavelet.so. */
typedef struct wb_markers_s {
  void (*iteration_begin)(void);
  void (*backward_begin)(void);
  void (*iteration_end)(void);
} wb_markers_t;

/* Checks that path is libwavelet.so: preloaded into a short-lived copy of this executable, it
 * loads and exports the markers (this process never maps the interposer). 0, or -1 with one
 * line in why. */
int wb_preload_check(const char *path, char *why, size_t len);
/* That copy's main: -1 when argv is not the check's, else its exit status. */
int wb_preload_check_child(int argc, char **argv);
/* The markers of the already preloaded library at path (dlopen RTLD_NOLOAD, not the bench's own
 * libsched): 0, or -1 with one line in why. */
int wb_preload_markers(const char *path, wb_markers_t *m, char *why, size_t len);
/* Starts replica `role` as this executable exec'd under the preload with the interposer's
 * environment; shared_fd and dp_fd (-1: none) are inherited, mask is the child's signal mask
 * (the launcher blocks its own). The child's pid, or -1 with errno. */
pid_t wb_preload_spawn(const wb_opts_t *o, int role, int shared_fd, int dp_fd,
                       const sigset_t *mask);
/* In an exec'd replica: the hidden argument's values. 1 when argv ends with it (argc shortened
 * by 2), 0 when not, -1 when malformed. */
int wb_preload_child_args(int *argc, char **argv, int *role, int *shared_fd, int *dp_fd,
                          char *preload, size_t len);
/* What the replicas' interposer traces say of their GPUs together. */
typedef struct wb_traced_s {
  uint64_t peak;      /* the largest GPU's combined peak of live bytes */
  uint64_t phys_peak; /* of physical memory (mapped plus cached: what the budget holds) */
  int phys_known;     /* every replica traced its physical memory */
  uint64_t rising_ns, overlap_ns; /* summed over the GPUs */
  /* single: two copies of the replica at their best offsets (libwltrace's wl_trace_ticktock_peak:
   * its live wave folded over its iterations, times its fragmentation at the peak, each copy plus
   * its slack there); 0 when its iterations were not found. */
  uint64_t pair_peak;
  /* single: one copy of the same wave (wl_trace_ticktock_peak with k = 1): its physical memory at
   * the live peak, below phys_peak when liballoc's cache was high elsewhere. */
  uint64_t one_peak;
} wb_traced_t;

/* The budget for a tick-tock pair of the traced single replica: pair_peak (in physical memory,
 * what a budget holds), kept at most 95 % of two peaks, the lower of phys_peak and one_peak (with
 * room for two aligned peaks the budget would show nothing: liballoc gives its cache back when a
 * peer waits, so two aligned replicas need two of the lower one). 0 when unknown. *capped: the
 * cap decided it (the wave is too fat for tick-tock to save much memory). */
uint64_t wb_pair_budget(const wb_traced_t *t, int *capped);

/* Reads the replicas' interposer traces (--trace-dir), each once: each replica's memory wait
 * (BUDGET_WAIT events), in ticktock its gate wait and grants (GATE_GRANT events), and per GPU
 * the replicas' waves on one time grid (libwltrace's combined wave). 0, or -1 when a trace
 * could not be read (the outputs then cover what was). */
int wb_preload_traces(const wb_opts_t *o, wb_shared_t *sh, wb_traced_t *out);
/* The trace path of a replica (--trace-dir). */
void wb_trace_path(const wb_opts_t *o, int role, char *buf, size_t len);

#endif
