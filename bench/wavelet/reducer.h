/* wavelet-bench's gradient all-reduce across data-parallel ranks: NCCL on the cuda backend,
 * a sum over process-shared memory on the cpu backend (where the "GPUs" are rank processes). */
#ifndef WB_REDUCER_H
#define WB_REDUCER_H

#include "backend.h"

#include <stddef.h>
#include <stdint.h>

/* The rendezvous the launcher maps before it starts the ranks of this machine (a memfd, so
 * that ranks exec'd under the preload map it too): per communicator
 * (one per replica index) a barrier, an abort flag, the NCCL id of the run, and on the cpu
 * backend one slot of `floats` floats per rank. */
typedef struct wb_dp_s wb_dp_t;

/* NULL with errno set when the memory cannot be mapped. floats may be 0 (NCCL needs no slots). */
wb_dp_t *wb_dp_create(int comms, int local_ranks, size_t floats);
/* Rank dead_rank's replica `comm` failed or died (comm -1: all of that rank's): every rank
 * waiting in (or later entering) a collective of that communicator returns -ECONNABORTED; the
 * other replicas' communicators go on. Safe to call repeatedly. */
void wb_dp_abort(wb_dp_t *dp, int comm, int dead_rank);
void wb_dp_destroy(wb_dp_t *dp);
/* The memfd behind the rendezvous (close-on-exec: a launcher that execs a rank clears that
 * flag in the child), and the rendezvous seen from an exec'd rank through that descriptor
 * (NULL with errno set). */
int wb_dp_fd(const wb_dp_t *dp);
wb_dp_t *wb_dp_attach(int fd);

typedef struct wb_reducer_cfg_s {
  wb_dp_t *dp;         /* this machine's rendezvous */
  int comm;            /* which communicator: the replica index */
  int rank, nranks;    /* global, over all machines */
  int local_rank;      /* on this machine */
  int local_ranks;     /* ranks on this machine */
  wb_backend_t *be;    /* the buffers' backend: cuda uses NCCL on be->stream */
  const char *id_path; /* multi-node NCCL: rank 0 writes the id to id_path.<comm>, the others
                        * read it there (a shared file system); NULL: through dp */
  uint32_t timeout_ms; /* how long a collective waits for the other ranks */
} wb_reducer_cfg_t;

typedef struct wb_reducer_s wb_reducer_t;

/* Joins communicator cfg->comm. 0 or a negative errno with one line in why. */
int wb_reducer_create(wb_reducer_t **out, const wb_reducer_cfg_t *cfg, char *why, size_t len);
/* buf = the sum over the ranks of weight_r * buf_r, the same bits on every rank (weight 1/N
 * gives the mean). buf is a tensor of the backend. 0, -ECONNABORTED (another rank failed),
 * -ETIMEDOUT, or -EIO (NCCL or CUDA); why then says which. */
int wb_reducer_allreduce(wb_reducer_t *r, float *buf, size_t n, float weight);
/* Waits for every rank of the communicator. Same returns. */
int wb_reducer_barrier(wb_reducer_t *r);
/* The reason of the last failure. */
const char *wb_reducer_why(const wb_reducer_t *r);
/* Leaves; failed != 0 tells the other ranks (through the rendezvous) to stop waiting. */
void wb_reducer_destroy(wb_reducer_t *r, int failed);

/* 1 when libnccl could be loaded (it is opened at run time, so the bench runs without it);
 * its version (e.g. 22807) in *version. why says what was missing. */
int wb_nccl_available(int *version, char *why, size_t len);

/* ---- internal, shared by reducer.c and reducer_nccl.c --------------------------------------*/

/* Waits until *word != val, the abort flag is set or deadline (CLOCK_MONOTONIC ns) passes:
 * 0, -ECONNABORTED or -ETIMEDOUT. */
int wb__dp_wait_change(wb_dp_t *dp, int comm, const uint32_t *word, uint32_t val,
                       uint64_t deadline_ns);
void wb__dp_wake(uint32_t *word);
int wb__dp_dead_rank(const wb_dp_t *dp, int comm);

#define WB_DP_ID_BYTES 128 /* an ncclUniqueId */

/* Hands an id from rank 0 (which makes it with make) to the other ranks of cf->comm: through
 * the rendezvous, or with cf->id_path through the file id_path.<comm>, which rank 0 creates
 * (refusing one that exists: it would be stale) and the others poll for. The abort flag and
 * cf->timeout_ms end the wait. 0 or a negative errno with one line in why. */
int wb__dp_share_id(const wb_reducer_cfg_t *cf, unsigned char *id,
                    int (*make)(unsigned char *id, void *arg, char *why, size_t len), void *arg,
                    char *why, size_t len);

#ifdef WB_HAVE_CUDA
int wb__nccl_create(wb_reducer_t *r, char *why, size_t len);
int wb__nccl_allreduce(wb_reducer_t *r, float *buf, size_t n, float weight);
void wb__nccl_destroy(wb_reducer_t *r, int failed);
#endif

struct wb_reducer_s {
  wb_reducer_cfg_t cfg;
  void *nccl;   /* the NCCL communicator, or NULL on the cpu path */
  uint32_t gen; /* cpu path: barriers passed */
  char why[320];
};

#endif
