/* The CUDA driver double's internals: one lock, the objects it hands out, call accounting. */
#ifndef WAVELET_TESTS_DOUBLES_DRIVER_H
#define WAVELET_TESTS_DOUBLES_DRIVER_H

/* The library is built with hidden visibility; what the real headers declare is its ABI. */
#pragma GCC visibility push(default)
#include <cuda.h>

#include "wltest_cuda.h"
#pragma GCC visibility pop

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DRV_NDEV        1
#define DRV_GRANULARITY ((size_t)2 << 20)

/* Magic numbers: a handle is only ever looked up in the lists, never trusted, but a dump of a
 * live object says what it is. */
#define DRV_CTX_MAGIC    0x5754435458000001ull
#define DRV_STREAM_MAGIC 0x5754535452000001ull
#define DRV_EVENT_MAGIC  0x5754455654000001ull

/* A stream is a timeline of tickets: work is enqueued (enq) and completes in order (done). An
 * event recorded on it takes the next ticket and is complete once done reaches it. Nothing
 * takes time yet, so work completes as it is enqueued unless the stream is held. */
struct CUstream_st {
  uint64_t magic;
  struct CUctx_st *ctx;
  struct CUstream_st *next;
  unsigned flags;
  uint64_t enq, done;
  bool held;
};

struct CUevent_st {
  uint64_t magic;
  struct CUctx_st *ctx;
  struct CUevent_st *next;
  unsigned flags;
  struct CUstream_st *stream; /* where it was last recorded; NULL: never, or work drained */
  uint64_t ticket;
};

/* A primary context. Its handle stays the same for the life of the process, as the real
 * driver's does; it is usable while retained (refs > 0). */
struct CUctx_st {
  uint64_t magic;
  int device;
  uint64_t refs;
  struct CUstream_st null_stream; /* the legacy default stream (also stands for per-thread) */
};

typedef struct drv_reservation_s {
  uintptr_t base;
  size_t size;
  struct drv_reservation_s *next;
} drv_reservation_t;

typedef struct drv_phys_s {
  CUmemGenericAllocationHandle id;
  size_t size;
  int fd; /* memfd: the "device memory" */
  bool released;
  uint64_t maps; /* live mappings of it */
  struct drv_phys_s *next;
} drv_phys_t;

typedef struct drv_mapping_s {
  uintptr_t addr;
  size_t size;
  drv_phys_t *phys;
  unsigned prot; /* CU_MEM_ACCESS_FLAGS_PROT_* */
  struct drv_mapping_s *next;
} drv_mapping_t;

typedef struct drv_s {
  pthread_mutex_t lock;
  bool initialized;
  const char *fn; /* the call in progress (under the lock), for messages */
  size_t capacity, used;
  struct CUctx_st *primary[DRV_NDEV];
  drv_reservation_t *reservations;
  drv_phys_t *phys;
  drv_mapping_t *mappings;
  struct CUstream_st *streams;
  struct CUevent_st *events;
  CUmemGenericAllocationHandle next_handle;
  CUresult fail_next[WLTEST_FN__COUNT];
  wltest_driver_stats_t st; /* counters kept as they change; copied out by wltest_driver_stats */
} drv_t;

extern drv_t drv__state;

/* ---- call discipline (driver_core.c) ---------------------------------------------------------*/
enum {
  DRV_NEED_NONE = 0, /* works before cuInit */
  DRV_NEED_INIT = 1,
  DRV_NEED_CTX = 2 /* needs a current, retained context */
};

/* Takes the lock, counts the call, then returns an injected failure or the error for a broken
 * precondition (lock released) or CUDA_SUCCESS (lock held until drv_end). */
CUresult drv_begin(wltest_fn_t fn, const char *name, int need);
/* Releases the lock and returns rc. */
CUresult drv_end(CUresult rc);
/* Counts a misuse of the call in progress, prints it, and returns err. Under the lock. */
CUresult drv_misuse(CUresult err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DRV_BEGIN(fn, need)                                                                        \
  do {                                                                                             \
    CUresult begin_rc_ = drv_begin(WLTEST_FN_##fn, #fn, (need));                                   \
    if (begin_rc_ != CUDA_SUCCESS) return begin_rc_;                                               \
  } while (0)

/* The calling thread's current context (valid under the lock after DRV_NEED_CTX). */
struct CUctx_st *drv_current(void);
/* The context behind a CUcontext handle, or NULL. */
struct CUctx_st *drv_ctx_find(CUcontext c);
bool drv_device_valid(int dev);

/* ---- streams (driver_stream.c) ---------------------------------------------------------------*/
/* The stream behind a handle, NULL and CU_STREAM_LEGACY/PER_THREAD meaning ctx's default. */
struct CUstream_st *drv_stream_find(struct CUctx_st *ctx, CUstream s);
/* Frees the streams and events of a context whose last retain was released. */
void drv_ctx_drop_objects(struct CUctx_st *ctx);

#endif
