/* One wavelet-bench replica: joins the group, trains with the markers (tick-tock) or without
 * (colocate), traces its memory wave, evaluates, and reports to the parent. */
#include "bench.h"
#include "rng.h"

#include "util.h"

#include <wavelet/kernels.h>
#include <wavelet/sched.h>
#include <wavelet/trace.h>
#include <wavelet/wavelet.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Progress lines at most this often. */
#define PROGRESS_NS (5ull * 1000000000ull)

typedef struct rep_s {
  const wb_opts_t *o;
  wb_result_t *res;
  wb_meter_t meter;
  wl_sched_t *sched;
  wl_trace_writer_t *trace;
  int ticktock;
} rep_t;

static void emit_marker(rep_t *r, unsigned kind) {
  if (!r->trace) return;
  wl_trace_event_t ev = {.kind = WL_TRACE_MARKER, .aux = (uint16_t)kind};
  wl_trace_emit(r->trace, &ev);
}

static void on_mark(void *arg, wb_mark_t m) {
  rep_t *r = arg;
  switch (m) {
  case WB_MARK_BEGIN:
    if (r->ticktock) {
      uint64_t t0 = wl__now_ns();
      wl_iteration_begin(); /* blocks until this replica holds the rising-phase token */
      uint64_t waited = wl__now_ns() - t0;
      r->res->gate_wait_ns += waited;
      if (r->trace) {
        wl_trace_event_t ev = {
            .kind = WL_TRACE_GATE_GRANT, .aux = (uint16_t)r->res->role, .arg = waited};
        wl_trace_emit(r->trace, &ev);
      }
    }
    emit_marker(r, WL_TRACE_MARK_ITER_BEGIN);
    break;
  case WB_MARK_BACKWARD:
    emit_marker(r, WL_TRACE_MARK_BACKWARD);
    if (r->ticktock) wl_backward_begin(); /* the peak: the token goes to the next wave */
    break;
  case WB_MARK_EVAL_BEGIN:
    if (r->ticktock) wl_iteration_begin();
    break;
  case WB_MARK_EVAL_END:
    if (r->ticktock) wl_iteration_end();
    break;
  case WB_MARK_END:
    wb_meter_mark_trough(&r->meter);
    emit_marker(r, WL_TRACE_MARK_ITER_END);
    if (r->ticktock) wl_iteration_end();
    break;
  }
}

static int fail(wb_result_t *res, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(wb_result_t *res, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res->msg, sizeof res->msg, fmt, ap);
  va_end(ap);
  res->status = status;
  return 1;
}

static int setup(rep_t *r, wb_backend_t **be, wb_net_t **net, int role) {
  const wb_opts_t *o = r->o;
  wb_result_t *res = r->res;
  if (o->threads > 0) wl_kern_set_threads(o->threads);
  if (o->mode != WB_SINGLE) {
    wl_sched_config_t cfg;
    wl_sched_config_default(&cfg);
    cfg.group = o->group;
    cfg.role = role;
    cfg.waves = (unsigned)(o->replicas < 2 ? 2 : o->replicas);
    cfg.mem_limit = o->mem_limit; /* 0: the ledger only accounts */
    cfg.alloc_timeout_ms = o->alloc_timeout_ms;
    cfg.gate_timeout_ms = 60000;
    int rc = wl_sched_join(&r->sched, &cfg);
    if (rc) return fail(res, WB_ST_ERROR, "cannot join group %s: %s", o->group, strerror(-rc));
  }
  wb_meter_init(&r->meter, r->sched, o->mode == WB_SINGLE ? o->mem_limit : 0,
                o->mode == WB_SINGLE ? 0 : o->alloc_timeout_ms);
  if (o->trace_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/replica-%d.wlt", o->trace_dir, role);
    wl_trace_writer_config_t tc;
    wl_trace_writer_config_default(&tc);
    tc.path = path;
    tc.flush_interval_ms = 200;
    tc.header.role = role;
    tc.header.waves = o->mode == WB_SINGLE ? 1u : (uint32_t)o->replicas;
    tc.header.mem_limit = o->mem_limit;
    snprintf(tc.header.device_name, sizeof tc.header.device_name, "%s",
             o->backend == WB_BACKEND_CUDA ? "cuda" : "cpu (host provider)");
    int rc = wl_trace_writer_open(&r->trace, &tc);
    if (rc) return fail(res, WB_ST_ERROR, "%s: cannot write the trace: %s", path, strerror(-rc));
    r->meter.trace = r->trace;
  }
  int rc;
  char why[256] = "";
  if (o->backend == WB_BACKEND_CUDA)
    rc = wb_backend_cuda_create(be, &r->meter, why, sizeof why);
  else
    rc = wb_backend_cpu_create(be, &r->meter, r->trace ? wl_trace_alloc_hook : NULL, r->trace);
  if (rc)
    return fail(res, WB_ST_ERROR, "cannot start the %s backend: %s",
                o->backend == WB_BACKEND_CUDA ? "cuda" : "cpu", why[0] ? why : strerror(-rc));
  rc = wb_net_create(net, *be, o->model, o->batch, o->opt, o->lr, o->seed + (uint64_t)role);
  if (rc == -ENOMEM && (*be)->why[0])
    return fail(res, WB_ST_OOM, "out of memory for the parameters: %s", (*be)->why);
  if (rc) return fail(res, WB_ST_ERROR, "cannot build the model: %s", strerror(-rc));
  (*net)->mark = on_mark;
  (*net)->mark_arg = r;
  res->params = wb_net_param_count(*net);
  return 0;
}

static void shuffle(uint32_t *idx, size_t n, uint64_t seed) {
  wb_rng_t g;
  wb_rng_seed(&g, seed);
  for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(wb_rng_next(&g) % i);
    uint32_t t = idx[i - 1];
    idx[i - 1] = idx[j];
    idx[j] = t;
  }
}

static int train(rep_t *r, wb_net_t *net, const wb_data_t *d, int role) {
  const wb_opts_t *o = r->o;
  wb_result_t *res = r->res;
  size_t n = d->train.n, per_epoch = (n + o->batch - 1) / o->batch;
  uint64_t total = o->steps ? o->steps : (uint64_t)o->epochs * per_epoch;
  uint32_t *idx = malloc(n * sizeof *idx);
  if (!idx) return fail(res, WB_ST_ERROR, "out of host memory");
  uint64_t window = total / 10 ? total / 10 : 1;
  double first_sum = 0, last_sum = 0;
  uint64_t first_n = 0, last_n = 0, last_correct_base = 0, last_samples_base = 0;
  size_t correct = 0;
  double prog_loss = 0;
  uint64_t prog_n = 0, last_print = wl__now_ns();
  res->start_ns = wl__now_ns();
  int rc = 0;
  for (uint64_t s = 0; s < total; s++) {
    uint64_t epoch = s / per_epoch, pos = s % per_epoch;
    if (pos == 0) shuffle(idx, n, o->seed * 1000003ull + (uint64_t)role * 7919ull + epoch);
    size_t first = pos * o->batch, bs = n - first < o->batch ? n - first : o->batch;
    if (s == total - window) {
      last_correct_base = correct;
      last_samples_base = res->samples;
    }
    float loss = 0;
    if (o->cosine) net->lr_scale = (float)(0.5 * (1.0 + cos(M_PI * (double)s / (double)total)));
    rc = wb_net_step(net, &d->train, idx + first, bs, 1, &loss, &correct);
    if (rc) break;
    res->steps++;
    res->samples += bs;
    if (s < window) first_sum += loss, first_n++;
    if (s >= total - window) last_sum += loss, last_n++;
    prog_loss += loss;
    prog_n++;
    if (o->eval_each_epoch && (pos + 1 == per_epoch || s + 1 == total) &&
        res->epochs_evaluated < WB_MAX_EPOCH_EVALS) {
      double acc = 0, tl = 0;
      uint64_t t0 = wl__now_ns();
      rc = wb_net_eval(net, &d->test, o->test_samples, o->batch, &acc, &tl);
      if (rc) break;
      /* Evaluation time does not count as training time. */
      uint64_t spent = wl__now_ns() - t0;
      res->start_ns += spent;
      res->epoch_acc[res->epochs_evaluated] = (float)acc;
      res->epoch_s[res->epochs_evaluated] = (float)((double)(wl__now_ns() - res->start_ns) / 1e9);
      res->epochs_evaluated++;
      fprintf(stderr,
              "wavelet-bench: replica %d: epoch %llu done after %.1f s of training: test accuracy "
              "%.2f%% (loss %.4f)\n",
              role, (unsigned long long)epoch + 1, (double)res->epoch_s[res->epochs_evaluated - 1],
              100 * acc, tl);
    }
    uint64_t now = wl__now_ns();
    if (!o->quiet && (now - last_print >= PROGRESS_NS || s + 1 == total) && total > 1) {
      double el = (double)(now - res->start_ns) / 1e9;
      fprintf(
          stderr, "wavelet-bench: replica %d: epoch %llu step %llu/%llu loss %.4f %.1f samples/s\n",
          role, (unsigned long long)epoch + 1, (unsigned long long)s + 1, (unsigned long long)total,
          prog_loss / (double)prog_n, el > 0 ? (double)res->samples / el : 0.0);
      last_print = now;
      prog_loss = 0;
      prog_n = 0;
    }
  }
  res->end_ns = wl__now_ns();
  free(idx);
  res->first_loss = first_n ? first_sum / (double)first_n : 0;
  res->last_loss = last_n ? last_sum / (double)last_n : 0;
  if (res->samples > last_samples_base)
    res->train_acc =
        (double)(correct - last_correct_base) / (double)(res->samples - last_samples_base);
  if (rc == -ENOMEM)
    return fail(res, WB_ST_OOM, "out of memory at step %llu, in the %s: %s",
                (unsigned long long)res->steps + 1, net->where, net->be->why);
  if (rc)
    return fail(res, WB_ST_ERROR, "step %llu failed in %s: %s", (unsigned long long)res->steps + 1,
                net->where, strerror(-rc));
  return 0;
}

int wb_replica_run(const wb_opts_t *o, const wb_data_t *d, int role, wb_shared_t *sh) {
  wb_result_t *res = &sh->r[role];
  memset(res, 0, sizeof *res);
  res->role = role;
  res->pid = getpid();
  rep_t r = {.o = o, .res = res, .ticktock = o->mode == WB_TICKTOCK};
  wb_backend_t *be = NULL;
  wb_net_t *net = NULL;
  int bad = setup(&r, &be, &net, role);
  /* Every replica reaches the barrier, so a failed one does not leave the others waiting. */
  pthread_barrier_wait(&sh->start);
  __atomic_add_fetch(&sh->started, 1, __ATOMIC_RELEASE);
  if (!bad) bad = train(&r, net, d, role);
  if (!bad) {
    int rc = wb_net_eval(net, &d->test, o->test_samples, o->batch, &res->test_acc, &res->test_loss);
    if (rc == -ENOMEM)
      bad = fail(res, WB_ST_OOM, "out of memory in the evaluation, in the %s: %s", net->where,
                 be->why);
    else if (rc)
      bad = fail(res, WB_ST_ERROR, "evaluation failed: %s", strerror(-rc));
  }
  res->peak = r.meter.peak;
  res->trough = r.meter.trough == SIZE_MAX ? 0 : r.meter.trough;
  res->group_peak = r.meter.group_peak;
  res->mem_wait_ns = r.meter.wait_ns;
  if (!bad) res->status = WB_ST_OK;
  wb_net_destroy(net);
  if (be) be->destroy(be);
  if (r.trace) wl_trace_writer_close(r.trace);
  wl_sched_leave(r.sched);
  return bad ? 1 : 0;
}
