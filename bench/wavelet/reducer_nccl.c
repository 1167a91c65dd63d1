/* The cuda backend's all-reduce: NCCL, opened at run time (the bench runs where libnccl is
 * missing, and only --gpus needs it), one communicator per replica index, the id handed from
 * rank 0 through the launcher's shared memory or, across machines, through a file. */
#include "reducer.h"

#ifdef WB_HAVE_CUDA
#include "util.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef WB_HAVE_NCCL_H
#include <nccl.h>

typedef struct nccl_api_s {
  void *lib;
  ncclResult_t (*get_version)(int *);
  ncclResult_t (*get_unique_id)(ncclUniqueId *);
  ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*red_op_create_pre_mul_sum)(ncclRedOp_t *, void *, ncclDataType_t,
                                            ncclScalarResidence_t, ncclComm_t);
  ncclResult_t (*red_op_destroy)(ncclRedOp_t, ncclComm_t);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t *);
  const char *(*get_error_string)(ncclResult_t);
} nccl_api_t;

static nccl_api_t api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static char api_why[256];

static void api_load(void) {
  /* WAVELET_NCCL_LIB names the library when it is not on the loader's path. */
  const char *env = getenv("WAVELET_NCCL_LIB");
  const char *names[] = {env && *env ? env : "libnccl.so.2", "libnccl.so"};
  for (size_t i = 0; i < 2 && !api.lib; i++) api.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!api.lib) {
    snprintf(api_why, sizeof api_why, "cannot load NCCL (%s): %s", names[0], dlerror());
    return;
  }
#define SYM(field, name)                                                                           \
  do {                                                                                             \
    *(void **)&api.field = dlsym(api.lib, name);                                                   \
    if (!api.field) {                                                                              \
      snprintf(api_why, sizeof api_why, "NCCL lacks %s (2.11 or newer is needed)", name);          \
      api.lib = NULL;                                                                              \
      return;                                                                                      \
    }                                                                                              \
  } while (0)
  SYM(get_version, "ncclGetVersion");
  SYM(get_unique_id, "ncclGetUniqueId");
  SYM(comm_init_rank, "ncclCommInitRank");
  SYM(all_reduce, "ncclAllReduce");
  SYM(red_op_create_pre_mul_sum, "ncclRedOpCreatePreMulSum");
  SYM(red_op_destroy, "ncclRedOpDestroy");
  SYM(comm_destroy, "ncclCommDestroy");
  SYM(comm_abort, "ncclCommAbort");
  SYM(comm_get_async_error, "ncclCommGetAsyncError");
  SYM(get_error_string, "ncclGetErrorString");
#undef SYM
}

int wb_nccl_available(int *version, char *why, size_t len) {
  pthread_once(&api_once, api_load);
  *version = 0;
  if (!api.lib) {
    snprintf(why, len, "%s", api_why);
    return 0;
  }
  api.get_version(version);
  return 1;
}

typedef struct nc_s {
  ncclComm_t comm;
  float *one; /* the barrier's one float on the device */
} nc_t;

static int make_id(unsigned char *id, void *arg, char *why, size_t len) {
  (void)arg;
  ncclResult_t e = api.get_unique_id((ncclUniqueId *)id);
  if (e != ncclSuccess) {
    snprintf(why, len, "ncclGetUniqueId: %s", api.get_error_string(e));
    return -EIO;
  }
  return 0;
}

int wb__nccl_create(wb_reducer_t *r, char *why, size_t len) {
  int version;
  if (!wb_nccl_available(&version, why, len)) return -ENOSYS;
  nc_t *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  ncclUniqueId id;
  _Static_assert(sizeof id == WB_DP_ID_BYTES, "ncclUniqueId is 128 bytes");
  int rc = wb__dp_share_id(&r->cfg, (unsigned char *)&id, make_id, NULL, why, len);
  if (rc) {
    free(c);
    return rc;
  }
  /* Blocking: NCCL's bootstrap has its own timeout for ranks that never arrive. */
  ncclResult_t e = api.comm_init_rank(&c->comm, r->cfg.nranks, id, r->cfg.rank);
  if (r->cfg.rank == 0 && r->cfg.id_path) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", r->cfg.id_path, r->cfg.comm);
    unlink(path); /* every rank has read it: init returns when all have joined */
  }
  if (e != ncclSuccess) {
    snprintf(why, len, "ncclCommInitRank (rank %d of %d): %s", r->cfg.rank, r->cfg.nranks,
             api.get_error_string(e));
    free(c);
    return -EIO;
  }
  if (cudaMalloc((void **)&c->one, sizeof *c->one) != cudaSuccess) {
    snprintf(why, len, "cudaMalloc of the barrier's float failed");
    api.comm_destroy(c->comm);
    free(c);
    return -EIO;
  }
  r->nccl = c;
  return 0;
}

/* Polls for completion rather than blocking in the stream, so a rank that died (the launcher's
 * abort flag), an NCCL error or the deadline can end the wait: NCCL's kernels would spin on. */
int wb__nccl_allreduce(wb_reducer_t *r, float *buf, size_t n, float weight) {
  nc_t *c = r->nccl;
  cudaStream_t s = (cudaStream_t)r->cfg.be->stream;
  if (!buf) buf = c->one, n = 1;
  ncclRedOp_t op;
  ncclResult_t e =
      api.red_op_create_pre_mul_sum(&op, &weight, ncclFloat32, ncclScalarHostImmediate, c->comm);
  if (e == ncclSuccess) {
    e = api.all_reduce(buf, buf, n, ncclFloat32, op, c->comm, s);
    api.red_op_destroy(op, c->comm); /* allowed once the call that uses it has returned */
  }
  if (e != ncclSuccess) {
    snprintf(r->why, sizeof r->why, "ncclAllReduce: %s", api.get_error_string(e));
    return -EIO;
  }
  uint64_t deadline = wl__now_ns() + (uint64_t)r->cfg.timeout_ms * 1000000ull;
  for (;;) {
    cudaError_t ce = cudaStreamQuery(s);
    if (ce == cudaSuccess) return 0;
    if (ce != cudaErrorNotReady) {
      snprintf(r->why, sizeof r->why, "all-reduce: %s", cudaGetErrorString(ce));
      return -EIO;
    }
    ncclResult_t ae = ncclSuccess;
    api.comm_get_async_error(c->comm, &ae);
    if (ae != ncclSuccess) {
      snprintf(r->why, sizeof r->why, "ncclAllReduce: %s", api.get_error_string(ae));
      return -EIO;
    }
    uint32_t never = 0;
    int rc = wb__dp_wait_change(r->cfg.dp, r->cfg.comm, &never, 0, wl__now_ns() + 50000ull);
    if (rc == -ECONNABORTED || wl__now_ns() >= deadline) {
      rc = rc == -ECONNABORTED ? rc : -ETIMEDOUT;
      int dead = wb__dp_dead_rank(r->cfg.dp, r->cfg.comm);
      if (rc == -ETIMEDOUT)
        snprintf(r->why, sizeof r->why,
                 "the NCCL all-reduce of replica %d timed out after %u ms waiting for the other "
                 "ranks",
                 r->cfg.comm, r->cfg.timeout_ms);
      else
        snprintf(r->why, sizeof r->why,
                 "the NCCL all-reduce of replica %d was abandoned: rank %d failed or died",
                 r->cfg.comm, dead);
      return rc;
    }
  }
}

void wb__nccl_destroy(wb_reducer_t *r, int failed) {
  nc_t *c = r->nccl;
  if (!c) return;
  /* After a failure the other ranks may never arrive: abort, do not wait. */
  if (failed)
    api.comm_abort(c->comm);
  else
    api.comm_destroy(c->comm);
  cudaFree(c->one);
  free(c);
  r->nccl = NULL;
}

#else /* !WB_HAVE_NCCL_H */

int wb_nccl_available(int *version, char *why, size_t len) {
  *version = 0;
  snprintf(why, len, "this build found no nccl.h: configure with the NCCL headers");
  return 0;
}

int wb__nccl_create(wb_reducer_t *r, char *why, size_t len) {
  (void)r;
  wb_nccl_available(&(int){0}, why, len);
  return -ENOSYS;
}

int wb__nccl_allreduce(wb_reducer_t *r, float *buf, size_t n, float weight) {
  (void)r, (void)buf, (void)n, (void)weight;
  return -ENOSYS;
}

void wb__nccl_destroy(wb_reducer_t *r, int failed) {
  (void)r, (void)failed;
}

#endif /* WB_HAVE_NCCL_H */
#endif /* WB_HAVE_CUDA */
