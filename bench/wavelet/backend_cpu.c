/* The CPU backend: tensors from liballoc over the host provider, kernels from libwlkernels. */
#include "backend.h"

#include <wavelet/kernels.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 2 MiB, the host provider's granularity: small enough that the memory wave of a batch of
 * Fashion-MNIST images is drawn in detail, as it is on a GPU with its 2 MiB granules. */
#define CPU_CHUNK (2u << 20)

typedef struct cpu_s {
  wl_alloc_t *a;
  wl_budget_t budget;
} cpu_t;

static void *cpu_alloc(wb_backend_t *b, size_t bytes) {
  cpu_t *c = b->ctx;
  void *p = wl_alloc_async(c->a, bytes ? bytes : 1, NULL);
  if (!p) {
    wl_alloc_failure_t f;
    if (wl_alloc_last_failure(&f) == 0)
      wl_alloc_failure_format(&f, b->why, sizeof b->why);
    else
      snprintf(b->why, sizeof b->why, "cannot allocate %zu bytes", bytes);
    /* The group's state now, before this replica gives anything back. */
    if (b->meter->sched) {
      wl_sched_stats_t st;
      char u[32], l[32];
      wl_sched_stats_get(b->meter->sched, &st);
      size_t len = strlen(b->why);
      snprintf(b->why + len, sizeof b->why - len, "; the group held %s of its %s budget",
               wl_format_bytes(st.used, u, sizeof u), wl_format_bytes(st.limit, l, sizeof l));
    }
  }
  return p;
}

static void cpu_free(wb_backend_t *b, void *p) {
  cpu_t *c = b->ctx;
  if (p) wl_free_async(c->a, p, NULL);
}

static void cpu_trim(wb_backend_t *b, size_t keep) {
  cpu_t *c = b->ctx;
  wl_alloc_trim(c->a, keep);
}

static int cpu_copy(wb_backend_t *b, void *dst, const void *src, size_t bytes) {
  (void)b;
  memcpy(dst, src, bytes);
  return 0;
}

static int cpu_xent(wb_backend_t *b, size_t n, size_t c, float *logits, const int32_t *labels,
                    float *loss) {
  (void)b;
  return wl_softmax_xent_fwd(n, c, logits, labels, logits, loss);
}

static int cpu_count(wb_backend_t *b, size_t n, size_t c, const float *scores,
                     const int32_t *labels, size_t *correct) {
  (void)b;
  size_t k = 0;
  int rc = wl_count_correct(n, c, scores, labels, &k);
  *correct += k;
  return rc;
}

static int cpu_finish(wb_backend_t *b) {
  (void)b;
  return 0;
}

static void cpu_destroy(wb_backend_t *b) {
  if (!b) return;
  cpu_t *c = b->ctx;
  if (c) wl_alloc_destroy(c->a);
  free(c);
  free(b);
}

int wb_backend_cpu_create(wb_backend_t **out, wb_meter_t *meter, wl_alloc_hook_fn trace_hook,
                          void *trace_arg) {
  *out = NULL;
  wb_backend_t *b = calloc(1, sizeof *b);
  cpu_t *c = calloc(1, sizeof *c);
  if (!b || !c) {
    free(b);
    free(c);
    return -ENOMEM;
  }
  b->kind = WB_BACKEND_CPU;
  b->name = "cpu";
  b->ctx = c;
  b->meter = meter;
  b->alloc = cpu_alloc;
  b->free = cpu_free;
  b->trim = cpu_trim;
  b->upload = cpu_copy;
  b->download = cpu_copy;
  b->xent_fwd = cpu_xent;
  b->count = cpu_count;
  b->finish = cpu_finish;
  b->destroy = cpu_destroy;

  wl_provider_t prov;
  int rc = wl_provider_host_init(&prov, 0, CPU_CHUNK);
  if (rc) {
    cpu_destroy(b);
    return rc;
  }
  wb_meter_budget(meter, &c->budget);
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.va_size = (size_t)16 << 30;
  cfg.chunk_size = CPU_CHUNK;
  cfg.release_threshold = CPU_CHUNK;
  cfg.budget = &c->budget;
  cfg.alloc_timeout_ms = meter->timeout_ms;
  cfg.hook = trace_hook;
  cfg.hook_arg = trace_arg;
  rc = wl_alloc_create(&c->a, &prov, &cfg);
  if (rc) {
    cpu_destroy(b);
    return rc;
  }
  *out = b;
  return 0;
}
