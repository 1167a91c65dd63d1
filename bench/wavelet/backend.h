/* wavelet-bench's backends: where tensors live (liballoc on the CPU, cudaMallocAsync on CUDA),
 * the meter that counts their memory against a budget, and the kernels' dispatch. */
#ifndef WB_BACKEND_H
#define WB_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include <wavelet/alloc.h>
#include <wavelet/sched.h>

/* The meter wraps the budget every byte of a replica is drawn from: the group's ledger
 * (colocate, ticktock) or a local limit (single). It counts what the replica holds, its peak,
 * its trough at iteration ends, the group's combined peak as sampled at each acquire, and the
 * time spent waiting for memory. */
typedef struct wb_meter_s {
  wl_budget_t inner; /* the ledger's budget; unused when sched is NULL */
  wl_sched_t *sched; /* NULL: a local limit */
  size_t limit;      /* local limit, 0: none */
  size_t held, peak, trough, group_peak;
  size_t iter_peak; /* the highest holding since the caller last reset it to held */
  uint64_t wait_ns, waits, denials;
  uint32_t timeout_ms;  /* how long an allocation may wait for memory */
  uint64_t wait_cap_ns; /* while nonzero, the longest any wait may be (setup) */
  void *trace;          /* a wl_trace_writer_t for BUDGET_WAIT events, or NULL */
  /* The last grant and the peaks before it, so that refunding it undoes it. */
  struct {
    size_t bytes, held, peak, iter_peak, group_peak;
  } last;
} wb_meter_t;

void wb_meter_init(wb_meter_t *m, wl_sched_t *sched, size_t limit, uint32_t timeout_ms);
/* liballoc's view of the meter (valid while m lives). */
void wb_meter_budget(wb_meter_t *m, wl_budget_t *out);
int wb_meter_acquire(wb_meter_t *m, size_t bytes, uint64_t deadline_ns);
void wb_meter_release(wb_meter_t *m, size_t bytes);
/* Gives back the last grant, never used (the memory could not be had): released, and the peaks
 * as if it had not been made. Any other bytes are simply released. */
void wb_meter_refund(wb_meter_t *m, size_t bytes);
size_t wb_meter_limit(wb_meter_t *m);
/* At an iteration end: the trough is the lowest holding seen there. */
void wb_meter_mark_trough(wb_meter_t *m);

typedef enum wb_backend_kind_e { WB_BACKEND_CPU = 0, WB_BACKEND_CUDA = 1 } wb_backend_kind_t;

typedef struct wb_backend_s wb_backend_t;
struct wb_backend_s {
  wb_backend_kind_t kind;
  const char *name;
  void *ctx;
  void *stream; /* cudaStream_t on CUDA */
  wb_meter_t *meter;
  /* Tensors: NULL when memory cannot be had; why then holds one line (request, budget). */
  void *(*alloc)(wb_backend_t *b, size_t bytes);
  void (*free)(wb_backend_t *b, void *p);
  /* Gives memory that is no longer used back to the budget, keeping about keep bytes. */
  void (*trim)(wb_backend_t *b, size_t keep);
  /* Host <-> tensor copies (synchronous on return for download). 0 or negative errno. */
  int (*upload)(wb_backend_t *b, void *dst, const void *src, size_t bytes);
  int (*download)(wb_backend_t *b, void *dst, const void *src, size_t bytes);
  /* Mean softmax cross-entropy loss in *loss (host), probabilities in place of the logits. */
  int (*xent_fwd)(wb_backend_t *b, size_t n, size_t c, float *logits, const int32_t *labels,
                  float *loss);
  /* Correct predictions, added to *correct (host). */
  int (*count)(wb_backend_t *b, size_t n, size_t c, const float *scores, const int32_t *labels,
               size_t *correct);
  /* Waits for queued work (CUDA); 0 or negative errno. */
  int (*finish)(wb_backend_t *b);
  void (*destroy)(wb_backend_t *b);
  char why[320];
};

/* The CPU backend: liballoc over the host provider, budget = the meter, tensors on stream NULL.
 * trace_hook/trace_arg (may be NULL) see every allocator event. 0 or negative errno. */
int wb_backend_cpu_create(wb_backend_t **out, wb_meter_t *meter, wl_alloc_hook_fn trace_hook,
                          void *trace_arg);

/* The CUDA backend on device `device` modulo the device count (cudaSetDevice for the calling
 * thread): cudaMallocAsync on a stream of its own, each allocation drawn from the meter first.
 * -ENOSYS when built without CUDA, -ENODEV without a usable device (why says which). */
int wb_backend_cuda_create(wb_backend_t **out, wb_meter_t *meter, int device, char *why,
                           size_t len);

/* 1 when this build has the CUDA backend. */
int wb_have_cuda(void);
/* 0 when a CUDA device is usable (asked in a child process, so this process does not touch
 * CUDA before it forks its replicas); -ENOSYS without CUDA support, -ENODEV without a device. */
int wb_cuda_probe(void);

#endif
