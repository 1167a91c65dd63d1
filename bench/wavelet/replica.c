/* One wavelet-bench replica: joins the group, trains with the markers (tick-tock) or without
 * (colocate), with --gpus on its shard of every global batch with its gradients all-reduced
 * across the ranks, traces its memory wave, evaluates, and reports to the parent. */
#include "bench.h"
#include "rng.h"

#include "util.h"

#include <wavelet/kernels.h>
#include <wavelet/sched.h>
#include <wavelet/trace.h>
#include <wavelet/wavelet.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
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
  int k, local_rank, rank, nranks; /* replica index; data-parallel ranks (1 without --gpus) */
  char label[32];                  /* "replica 1", or "rank 2 replica 1" with --gpus */
  wb_reducer_t *red;               /* NULL without --gpus */
  float weight;                    /* this rank's share of the current global batch */
  wb_markers_t mk;                 /* where the markers go: libsched's, or the preload's */
} rep_t;

static void emit_marker(rep_t *r, unsigned kind) {
  if (!r->trace) return;
  wl_trace_event_t ev = {.kind = WL_TRACE_MARKER, .aux = (uint16_t)kind};
  wl_trace_emit(r->trace, &ev);
}

/* Copies the meter's figures into the shared results (at every iteration's end and at the end),
 * so that the launcher has them even when the replica dies mid-run. */
static void publish(rep_t *r) {
  wb_result_t *res = r->res;
  res->peak = r->meter.peak;
  res->trough = r->meter.trough == SIZE_MAX ? 0 : r->meter.trough;
  /* Under the preload the meter sees only this replica: the group's total is not known here. */
  res->group_peak = r->o->via_preload ? 0 : r->meter.group_peak;
  res->mem_wait_ns = r->meter.wait_ns;
  res->end_ns = wl__now_ns();
}

static void on_mark(void *arg, wb_mark_t m) {
  rep_t *r = arg;
  switch (m) {
  case WB_MARK_BEGIN:
    if (r->ticktock) {
      uint64_t t0 = wl__now_ns();
      /* Embedded: blocks until this replica holds the rising-phase token. Under the preload the
       * marker only tells the interposer, whose gate holds the next launch (its trace has the
       * wait). */
      r->mk.iteration_begin();
      uint64_t waited = wl__now_ns() - t0;
      if (!r->o->via_preload) {
        r->res->gate_wait_ns += waited;
        r->res->gate_grants++;
      }
      if (r->trace) {
        wl_trace_event_t ev = {
            .kind = WL_TRACE_GATE_GRANT, .aux = (uint16_t)r->res->role, .arg = waited};
        wl_trace_emit(r->trace, &ev);
      }
    } else if (r->o->via_preload) {
      /* Ungated under the preload: the marker gates nothing, and the interposer's trace has the
       * iteration from it (what --trace-dir's analysis folds a single replica's wave by). */
      r->mk.iteration_begin();
    }
    emit_marker(r, WL_TRACE_MARK_ITER_BEGIN);
    break;
  case WB_MARK_BACKWARD:
    emit_marker(r, WL_TRACE_MARK_BACKWARD);
    /* the peak: in tick-tock the token goes to the next wave */
    if (r->ticktock || r->o->via_preload) r->mk.backward_begin();
    break;
  case WB_MARK_EVAL_BEGIN:
    if (r->ticktock) r->mk.iteration_begin();
    break;
  case WB_MARK_EVAL_END:
    if (r->ticktock) r->mk.iteration_end();
    break;
  case WB_MARK_END:
    wb_meter_mark_trough(&r->meter);
    publish(r);
    emit_marker(r, WL_TRACE_MARK_ITER_END);
    if (r->ticktock || r->o->via_preload) r->mk.iteration_end();
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

/* The gradient all-reduce, after backward, before the optimizer step: in tick-tock this is the
 * falling phase (the token has gone on at the peak), so a replica waiting here for its peers on
 * the other GPUs never holds up the rising replica of its own GPU. */
static int on_reduce(void *arg, float *g, size_t n) {
  rep_t *r = arg;
  uint64_t t0 = wl__now_ns();
  int rc = wb_reducer_allreduce(r->red, g, n, r->weight);
  r->res->allreduce_ns += wl__now_ns() - t0;
  r->res->allreduces++;
  return rc;
}

#define SETUP_WAIT_NS (5000ull * 1000000ull)

static int setup(rep_t *r, wb_backend_t **be, wb_net_t **net, int role) {
  const wb_opts_t *o = r->o;
  wb_result_t *res = r->res;
  if (o->threads > 0) wl_kern_set_threads(o->threads);
  r->mk = (wb_markers_t){wl_iteration_begin, wl_backward_begin, wl_iteration_end};
  if (o->via_preload) {
    /* The interposer joined (or will join) the group; its budget is the one, so the meter only
     * accounts, and the markers go to its copy of libsched. */
    char why[320];
    if (wb_preload_markers(o->preload, &r->mk, why, sizeof why))
      return fail(res, WB_ST_ERROR, "%s", why);
  } else if (o->mode != WB_SINGLE) {
    /* One libsched group per GPU: its K replicas share that GPU's memory and token. */
    char group[64];
    if (o->gpus)
      snprintf(group, sizeof group, "%s-g%d", o->group, r->local_rank);
    else
      snprintf(group, sizeof group, "%s", o->group);
    wl_sched_config_t cfg;
    wl_sched_config_default(&cfg);
    cfg.group = group;
    cfg.role = r->k;
    cfg.waves = (unsigned)(o->replicas < 2 ? 2 : o->replicas);
    cfg.mem_limit = o->mem_limit; /* 0: the ledger only accounts */
    cfg.alloc_timeout_ms = o->alloc_timeout_ms;
    cfg.gate_timeout_ms = 60000;
    int rc = wl_sched_join(&r->sched, &cfg);
    if (rc) return fail(res, WB_ST_ERROR, "cannot join group %s: %s", group, strerror(-rc));
  }
  wb_meter_init(&r->meter, r->sched, o->mode == WB_SINGLE ? o->mem_limit : 0,
                o->mode == WB_SINGLE || o->via_preload ? 0 : o->alloc_timeout_ms);
  /* Until the start barrier the others give nothing back (they wait there, holding their
   * parameters): a budget that cannot hold every replica's parameters fails in seconds, not at
   * the end of the allocation timeout. */
  r->meter.wait_cap_ns = SETUP_WAIT_NS;
  /* Under the preload the interposer writes the replica's trace (WAVELET_TRACE). */
  if (o->trace_dir && !o->via_preload) {
    char path[4096];
    wb_trace_path(o, role, path, sizeof path);
    wl_trace_writer_config_t tc;
    wl_trace_writer_config_default(&tc);
    tc.path = path;
    tc.flush_interval_ms = 200;
    tc.header.role = r->k;
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
    rc = wb_backend_cuda_create(be, &r->meter, r->local_rank, why, sizeof why);
  else
    rc = wb_backend_cpu_create(be, &r->meter, r->trace ? wl_trace_alloc_hook : NULL, r->trace);
  if (rc)
    return fail(res, WB_ST_ERROR, "cannot start the %s backend: %s",
                o->backend == WB_BACKEND_CUDA ? "cuda" : "cpu", why[0] ? why : strerror(-rc));
  /* Replica k starts from the same weights on every rank. */
  rc = wb_net_create(net, *be, o->model, o->batch, o->opt, o->lr, o->seed + (uint64_t)r->k);
  if (rc == -ENOMEM && (*be)->why[0])
    return fail(res, WB_ST_OOM, "out of memory for the parameters: %s", (*be)->why);
  if (rc) return fail(res, WB_ST_ERROR, "cannot build the model: %s", strerror(-rc));
  (*net)->mark = on_mark;
  (*net)->mark_arg = r;
  res->params = wb_net_param_count(*net);
  return 0;
}

/* After the start barrier, so that a rank that failed its setup has already told the others
 * (the abort flag) and nobody waits for it in NCCL's bootstrap. */
static int join_dp(rep_t *r, wb_backend_t *be, wb_net_t *net, wb_dp_t *dp) {
  const wb_opts_t *o = r->o;
  wb_reducer_cfg_t cfg = {.dp = dp,
                          .comm = r->k,
                          .rank = r->rank,
                          .nranks = r->nranks,
                          .local_rank = r->local_rank,
                          .local_ranks = wb_local_ranks(o),
                          .be = be,
                          .id_path = o->nccl_id,
                          .timeout_ms = o->dp_timeout_ms};
  char why[320] = "";
  int rc = wb_reducer_create(&r->red, &cfg, why, sizeof why);
  if (rc) return fail(r->res, WB_ST_ERROR, "cannot join the all-reduce: %s", why);
  if ((rc = wb_reducer_barrier(r->red)))
    return fail(r->res, WB_ST_ERROR, "%s", wb_reducer_why(r->red));
  net->reduce = on_reduce;
  net->reduce_arg = r;
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

/* WAVELET_BENCH_KILL_AT=RANK:STEP (tests only): that rank's replica 0 kills itself before the
 * step, as a crash would. */
static uint64_t kill_step(const rep_t *r) {
  const char *e = getenv("WAVELET_BENCH_KILL_AT");
  int rank;
  unsigned long long step;
  if (e && sscanf(e, "%d:%llu", &rank, &step) == 2 && rank == r->rank && r->k == 0)
    return (uint64_t)step;
  return UINT64_MAX;
}

static int train(rep_t *r, wb_net_t *net, const wb_data_t *d) {
  const wb_opts_t *o = r->o;
  wb_result_t *res = r->res;
  /* Data parallelism: every rank walks the same shuffled order in global batches of ranks x
   * batch and takes its own slice of each, so N ranks at batch B see what one rank at batch
   * N x B sees. A last global batch too small to give every rank a sample is dropped. */
  size_t n = d->train.n, gb = o->batch * (size_t)r->nranks;
  size_t per_epoch = wb_steps_per_epoch(n, o->batch, r->nranks);
  if (per_epoch == 0)
    return fail(res, WB_ST_ERROR, "%zu training samples cannot feed %d ranks", n, r->nranks);
  uint64_t total = o->steps ? o->steps : (uint64_t)o->epochs * per_epoch;
  uint64_t kill_at = kill_step(r);
  uint32_t *idx = malloc(n * sizeof *idx);
  if (!idx) return fail(res, WB_ST_ERROR, "out of host memory");
  uint64_t window = total / 10 ? total / 10 : 1;
  double first_sum = 0, last_sum = 0;
  uint64_t first_n = 0, last_n = 0, last_correct_base = 0, last_samples_base = 0;
  size_t correct = 0;
  double prog_loss = 0;
  float diverged = 0; /* the non-finite loss that stopped the run */
  uint64_t prog_n = 0, last_print = wl__now_ns();
  res->start_ns = wl__now_ns();
  int rc = 0;
  for (uint64_t s = 0; s < total; s++) {
    uint64_t epoch = s / per_epoch, pos = s % per_epoch;
    if (pos == 0) shuffle(idx, n, o->seed * 1000003ull + (uint64_t)r->k * 7919ull + epoch);
    size_t gfirst = pos * gb, gbs = n - gfirst < gb ? n - gfirst : gb;
    size_t base = gbs / (size_t)r->nranks, extra = gbs % (size_t)r->nranks;
    size_t rk = (size_t)r->rank;
    size_t first = gfirst + rk * base + (rk < extra ? rk : extra);
    size_t bs = base + (rk < extra ? 1 : 0);
    r->weight = (float)((double)bs / (double)gbs); /* each rank's gradient is its slice's mean */
    if (s == kill_at) raise(SIGKILL);
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
    /* NaN or infinity: the weights are gone too, so every later step and the accuracy would be
     * noise reported as a result. */
    if (!isfinite(loss)) {
      diverged = loss;
      break;
    }
    /* As it goes, for a replica that dies before the end. */
    if (s < window) first_sum += loss, first_n++, res->first_loss = first_sum / (double)first_n;
    if (s >= total - window) last_sum += loss, last_n++, res->last_loss = last_sum / (double)last_n;
    prog_loss += loss;
    prog_n++;
    /* The launcher refuses more epochs than the results hold; the bound only guards them. */
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
      if (!o->quiet)
        fprintf(stderr,
                "wavelet-bench: %s: epoch %llu done after %.1f s of training: test accuracy "
                "%.2f%% (loss %.4f)\n",
                r->label, (unsigned long long)epoch + 1,
                (double)res->epoch_s[res->epochs_evaluated - 1], 100 * acc, tl);
    }
    uint64_t now = wl__now_ns();
    if (!o->quiet && (now - last_print >= PROGRESS_NS || s + 1 == total) && total > 1) {
      double el = (double)(now - res->start_ns) / 1e9;
      fprintf(stderr, "wavelet-bench: %s: epoch %llu step %llu/%llu loss %.4f %.1f samples/s\n",
              r->label, (unsigned long long)epoch + 1, (unsigned long long)s + 1,
              (unsigned long long)total, prog_loss / (double)prog_n,
              el > 0 ? (double)res->samples / el : 0.0);
      last_print = now;
      prog_loss = 0;
      prog_n = 0;
    }
  }
  res->end_ns = wl__now_ns();
  free(idx);
  if (res->samples > last_samples_base)
    res->train_acc =
        (double)(correct - last_correct_base) / (double)(res->samples - last_samples_base);
  if (!rc && diverged != 0)
    return fail(res, WB_ST_ERROR, "loss diverged at step %llu (%s): try a smaller --lr",
                (unsigned long long)res->steps, isnan(diverged) ? "NaN" : "infinite");
  if (rc && r->red && !strcmp(net->where, "gradient all-reduce"))
    return fail(res, WB_ST_ERROR, "step %llu: %s", (unsigned long long)res->steps + 1,
                wb_reducer_why(r->red));
  if (rc == -ENOMEM)
    return fail(res, WB_ST_OOM, "out of memory at step %llu, in the %s: %s",
                (unsigned long long)res->steps + 1, net->where, net->be->why);
  if (rc)
    return fail(res, WB_ST_ERROR, "step %llu failed in %s: %s", (unsigned long long)res->steps + 1,
                net->where, strerror(-rc));
  return 0;
}

int wb_replica_run(const wb_opts_t *o, const wb_data_t *d, int role, wb_shared_t *sh, wb_dp_t *dp) {
  wb_result_t *res = &sh->r[role];
  wb_result_reset(res);
  res->role = role;
  res->pid = getpid();
  res->gate_wait_known = !o->via_preload;
  res->mem_wait_known = !o->via_preload;
  rep_t r = {.o = o, .res = res, .ticktock = o->mode == WB_TICKTOCK};
  r.k = role % o->replicas;
  r.local_rank = role / o->replicas;
  r.rank = o->node * wb_local_ranks(o) + r.local_rank;
  r.nranks = wb_ranks(o);
  r.weight = 1.f;
  res->rank = r.rank;
  res->replica = r.k;
  if (o->gpus)
    snprintf(r.label, sizeof r.label, "rank %d replica %d", r.rank, r.k);
  else
    snprintf(r.label, sizeof r.label, "replica %d", r.k);
  wb_backend_t *be = NULL;
  wb_net_t *net = NULL;
  int bad = setup(&r, &be, &net, role);
  if (bad && dp) wb_dp_abort(dp, r.k, r.rank); /* its peers must not wait for it */
  if (bad) {
    /* Out of the group before the barrier: what it took goes back at once, and a member still
     * waiting for memory only this one held learns it will not come (the ledger sees every
     * member left waiting) instead of waiting out its timeout. */
    wb_net_destroy(net);
    net = NULL;
    if (be) be->destroy(be);
    be = NULL;
    wl_sched_leave(r.sched);
    r.sched = NULL;
    r.meter.sched = NULL;
  }
  r.meter.wait_cap_ns = 0;
  /* Every replica reaches the barrier, so a failed one does not leave the others waiting. */
  __atomic_store_n(&sh->arrived[role], 1, __ATOMIC_RELEASE);
  pthread_barrier_wait(&sh->start);
  if (!bad && dp) bad = join_dp(&r, be, net, dp);
  if (!bad) bad = train(&r, net, d);
  if (!bad) {
    int rc = wb_net_eval(net, &d->test, o->test_samples, o->batch, &res->test_acc, &res->test_loss);
    if (rc == -ENOMEM)
      bad = fail(res, WB_ST_OOM, "out of memory in the evaluation, in the %s: %s", net->where,
                 be->why);
    else if (rc)
      bad = fail(res, WB_ST_ERROR, "evaluation failed: %s", strerror(-rc));
  }
  uint64_t end = res->end_ns; /* training's end, not the evaluation's */
  publish(&r);
  res->end_ns = end;
  if (!bad && !wb_net_checksum(net, &res->checksum)) res->have_checksum = 1;
  if (!bad && o->save_weights && r.rank == 0) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", o->save_weights, r.k);
    int rc = wb_net_save(net, path);
    /* The training and its accuracy stand: only the file is missing (the parent exits 1). */
    if (rc) {
      res->save_failed = 1;
      fail(res, res->status, "cannot write %s: %s", path, strerror(-rc));
    }
  }
  if (!bad) res->status = WB_ST_OK;
  wb_reducer_destroy(r.red, bad);
  if (bad && dp) wb_dp_abort(dp, r.k, r.rank);
  wb_net_destroy(net);
  if (be) be->destroy(be);
  if (r.trace) wl_trace_writer_close(r.trace);
  wl_sched_leave(r.sched);
  return bad ? 1 : 0;
}
