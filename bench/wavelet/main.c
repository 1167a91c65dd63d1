/* wavelet-bench: trains the reference models on Fashion-MNIST as one replica, K co-located
 * replicas, or K replicas in tick-tock, on one GPU or data-parallel on N, and reports
 * throughput, memory and accuracy. */
#include "bench.h"

#include "launch.h"
#include "util.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG         "wavelet-bench"
#define MAX_REPLICAS 16
#define MAX_BATCH    4096
#define MAX_GPUS     64
#define MAX_NODES    1024

static void usage(FILE *f) {
  fprintf(f,
          "usage: " PROG " [--backend auto|cpu|cuda] [--model mlp|cnn|resnet] [--replicas K]\n"
          "                     [--mode single|colocate|ticktock] [--steps N | --epochs E]\n"
          "                     [--batch B] [--mem-limit BYTES] [--alloc-timeout-ms MS]\n"
          "                     [--data DIR|synthetic] [--json]\n"
          "                     [--seed S] [--threads T] [--optimizer adam|sgd] [--lr X]\n"
          "                     [--schedule cosine|constant] [--train-samples N]\n"
          "                     [--test-samples N] [--trace-dir DIR]\n"
          "                     [--eval-each-epoch] [--quiet] [--help]\n"
          "                     [--gpus N] [--nodes M --node I --nccl-id PATH]\n"
          "                     [--save-weights PATH] [--preload PATH]\n"
          "                     [--gate preload|embedded]\n"
          "Trains a reference model on Fashion-MNIST and reports samples/s, memory and accuracy.\n"
          "  --backend      cuda when a GPU is present (auto, the default), else cpu\n"
          "  --model        mlp (784-256-128-10), cnn (2 conv+pool, 2 fc; default), resnet\n"
          "  --mode         single (default for 1 replica), colocate (K processes, ungated, one\n"
          "                 memory budget), ticktock (K processes gated by libsched; default\n"
          "                 for K > 1)\n"
          "  --replicas K   1..%d (default 1, or 2 with colocate/ticktock)\n"
          "  --steps N      training steps per replica; --epochs E passes over the data\n"
          "                 (default 1 epoch)\n"
          "  --batch B      1..%d (default 64)\n"
          "  --mem-limit B  memory budget, bytes with K/M/G: the replica's (single) or the\n"
          "                 group's (colocate, ticktock); default none\n"
          "  --alloc-timeout-ms MS  how long an allocation waits for the group's budget before\n"
          "                 it fails (colocate, ticktock); 0: at once, as an unshared GPU\n"
          "                 refuses (default 60000)\n"
          "  --data DIR     the idx files (default " WB_DATA_DEFAULT_DIR "),\n"
          "                 or 'synthetic' for generated images\n"
          "  --seed S       initialisation and data order (default 1); runs are deterministic\n"
          "                 for a seed and thread count\n"
          "  --threads T    kernel threads per replica (default: cores / replicas)\n"
          "  --optimizer    adam (default, lr 0.001) or sgd (momentum 0.9, lr 0.05)\n"
          "  --schedule     learning rate: cosine (default; from --lr down to 0 over the\n"
          "                 run) or constant\n"
          "  --train-samples N, --test-samples N   use the first N samples (default all)\n"
          "  --trace-dir D  each replica writes D/replica-R.wlt (wavelet-trace report)\n"
          "  --eval-each-epoch  test accuracy after every epoch (not counted as training;\n"
          "                 at most %d epochs)\n"
          "  --json         one JSON object on stdout; the table goes to stderr\n"
          "  --quiet        no progress lines\n"
          "  --gpus N       data parallelism: N ranks on this machine, one per GPU, each running\n"
          "                 the mode's replicas on its slice of every global batch of N x B;\n"
          "                 replica k's gradients are averaged over the ranks after backward\n"
          "                 (NCCL on cuda; on cpu the ranks are processes and the all-reduce\n"
          "                 is in shared memory). --ranks N is the same. 1..%d, ranks x\n"
          "                 replicas at most %d\n"
          "  --nodes M, --node I, --nccl-id PATH   cuda only: M machines, this one I (0..M-1),\n"
          "                 each with --gpus N; rank 0 writes the NCCL id to PATH.<replica> on\n"
          "                 a shared file system, new for each run\n"
          "  --save-weights PATH  rank 0 writes replica k's final parameters to PATH.k\n"
          "                 (raw float32, with the layers' alignment padding)\n"
          "  --preload PATH libwavelet.so for the cuda backend's colocate and ticktock (default:\n"
          "                 $WAVELET_PRELOAD, ../lib next to this binary, the install libdir);\n"
          "                 given with single, its replica runs under it in alloc mode\n"
          "  --gate G       cuda colocate/ticktock: preload (default: each replica is this\n"
          "                 binary exec'd under LD_PRELOAD=libwavelet.so, gated and budgeted\n"
          "                 by the interposer) or embedded (forked replicas calling libsched\n"
          "                 directly, as on the cpu backend)\n",
          MAX_REPLICAS, MAX_BATCH, WB_MAX_EPOCH_EVALS, MAX_GPUS, WB_MAX_PROCS);
}

static int bad_arg(const char *opt, const char *what, const char *got) {
  if (got)
    fprintf(stderr, PROG ": %s: expected %s, got '%s'\n", opt, what, got);
  else
    fprintf(stderr, PROG ": %s: expected %s\n", opt, what);
  usage(stderr);
  return 2;
}

static const char *const takes_value[] = {"--backend",
                                          "--model",
                                          "--replicas",
                                          "--mode",
                                          "--steps",
                                          "--epochs",
                                          "--batch",
                                          "--mem-limit",
                                          "--data",
                                          "--seed",
                                          "--threads",
                                          "--optimizer",
                                          "--lr",
                                          "--train-samples",
                                          "--test-samples",
                                          "--trace-dir",
                                          "--schedule",
                                          "--gpus",
                                          "--ranks",
                                          "--nodes",
                                          "--node",
                                          "--nccl-id",
                                          "--save-weights",
                                          "--preload",
                                          "--gate",
                                          "--alloc-timeout-ms",
                                          NULL};

/* The directory of a file path into dir; 0 when it exists and files can be made in it, else the
 * errno that says why not. */
static int dir_writable(const char *path, char *dir, size_t len) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, len, ".");
  else if (slash == path)
    snprintf(dir, len, "/");
  else
    snprintf(dir, len, "%.*s", (int)(slash - path), path);
  struct stat st;
  if (stat(dir, &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  return access(dir, W_OK | X_OK) == 0 ? 0 : errno;
}

/* 0: go on, 1: exit 0 (help), 2: bad arguments (reported). */
static int parse_args(int argc, char **argv, wb_opts_t *o, int *backend_auto) {
  memset(o, 0, sizeof *o);
  o->model = WB_CNN;
  o->mode = WB_SINGLE;
  o->batch = 64;
  o->seed = 1;
  o->data = WB_DATA_DEFAULT_DIR;
  o->alloc_timeout_ms = 60000;
  o->lr = NAN;
  o->cosine = 1;
  o->dp_timeout_ms = 120000;
  *backend_auto = 1;
  int mode_set = 0, replicas_set = 0, steps_set = 0, epochs_set = 0, node_set = 0;
  for (int i = 1; i < argc; i++) {
    wl__arg_t a;
    int split = wl__arg_split(argc, argv, &i, takes_value, &a);
    const char *arg = a.name, *val = a.val;
    if (split == -ENODATA) return bad_arg(arg, "a value", NULL);
    if (split == -E2BIG) {
      fprintf(stderr, PROG ": %s takes no value, got '%s'\n", arg, val);
      usage(stderr);
      return 2;
    }
    uint64_t v;
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      usage(stdout);
      return 1;
    } else if (!strcmp(arg, "--json")) {
      o->json = 1;
    } else if (!strcmp(arg, "--eval-each-epoch")) {
      o->eval_each_epoch = 1;
    } else if (!strcmp(arg, "--quiet")) {
      o->quiet = 1;
    } else if (!strcmp(arg, "--backend")) {
      *backend_auto = 0;
      if (!strcmp(val, "cpu"))
        o->backend = WB_BACKEND_CPU;
      else if (!strcmp(val, "cuda"))
        o->backend = WB_BACKEND_CUDA;
      else if (!strcmp(val, "auto"))
        *backend_auto = 1;
      else
        return bad_arg("--backend", "auto, cpu or cuda", val);
    } else if (!strcmp(arg, "--model")) {
      if (!strcmp(val, "mlp"))
        o->model = WB_MLP;
      else if (!strcmp(val, "cnn"))
        o->model = WB_CNN;
      else if (!strcmp(val, "resnet"))
        o->model = WB_RESNET;
      else
        return bad_arg("--model", "mlp, cnn or resnet", val);
    } else if (!strcmp(arg, "--mode")) {
      mode_set = 1;
      if (!strcmp(val, "single"))
        o->mode = WB_SINGLE;
      else if (!strcmp(val, "colocate"))
        o->mode = WB_COLOCATE;
      else if (!strcmp(val, "ticktock"))
        o->mode = WB_TICKTOCK;
      else
        return bad_arg("--mode", "single, colocate or ticktock", val);
    } else if (!strcmp(arg, "--replicas")) {
      if (wl__parse_u64(val, 10, 1, MAX_REPLICAS, &v))
        return bad_arg("--replicas", "a whole number from 1 to 16", val);
      o->replicas = (int)v;
      replicas_set = 1;
    } else if (!strcmp(arg, "--steps")) {
      if (wl__parse_u64(val, 10, 1, 100000000, &v))
        return bad_arg("--steps", "a whole number from 1 to 100000000", val);
      o->steps = v;
      steps_set = 1;
    } else if (!strcmp(arg, "--epochs")) {
      if (wl__parse_u64(val, 10, 1, 1000, &v))
        return bad_arg("--epochs", "a whole number from 1 to 1000", val);
      o->epochs = (unsigned)v;
      epochs_set = 1;
    } else if (!strcmp(arg, "--batch")) {
      if (wl__parse_u64(val, 10, 1, MAX_BATCH, &v))
        return bad_arg("--batch", "a whole number from 1 to 4096", val);
      o->batch = (size_t)v;
    } else if (!strcmp(arg, "--mem-limit")) {
      size_t b;
      if (wl__parse_size(val, 0, &b))
        return bad_arg("--mem-limit", "a size in bytes with an optional K/M/G/T suffix", val);
      o->mem_limit = b;
    } else if (!strcmp(arg, "--alloc-timeout-ms")) {
      if (wl__parse_u64(val, 10, 0, 3600000, &v))
        return bad_arg("--alloc-timeout-ms", "a whole number of milliseconds, 0 to 3600000", val);
      o->alloc_timeout_ms = (unsigned)v;
    } else if (!strcmp(arg, "--data")) {
      if (!*val) return bad_arg("--data", "a directory or 'synthetic'", val);
      o->data = val;
    } else if (!strcmp(arg, "--seed")) {
      if (wl__parse_u64(val, 10, 0, UINT64_MAX, &v))
        return bad_arg("--seed", "a whole number", val);
      o->seed = v;
    } else if (!strcmp(arg, "--threads")) {
      if (wl__parse_u64(val, 10, 1, 256, &v))
        return bad_arg("--threads", "a whole number from 1 to 256", val);
      o->threads = (int)v;
    } else if (!strcmp(arg, "--optimizer")) {
      if (!strcmp(val, "adam"))
        o->opt = WB_ADAM;
      else if (!strcmp(val, "sgd"))
        o->opt = WB_SGD;
      else
        return bad_arg("--optimizer", "adam or sgd", val);
    } else if (!strcmp(arg, "--lr")) {
      char *end;
      errno = 0;
      double x = strtod(val, &end);
      /* The optimizers take a float: 1e-50 passes as a double but is 0 (or a denormal that
       * the kernels may flush to 0) in float32. */
      float f = (float)x;
      if (errno || end == val || *end || !(x > 0) || x > 10)
        return bad_arg("--lr", "a learning rate above 0, at most 10", val);
      if (!isfinite(f) || !(f >= FLT_MIN))
        return bad_arg("--lr", "a learning rate float32 holds, from 1.2e-38 to 10", val);
      o->lr = f;
    } else if (!strcmp(arg, "--train-samples") || !strcmp(arg, "--test-samples")) {
      if (wl__parse_u64(val, 10, 1, WB_IDX_MAX_ITEMS, &v))
        return bad_arg(arg, "a whole number from 1 to 10000000", val);
      if (arg[2] == 't' && arg[3] == 'r')
        o->train_samples = (size_t)v;
      else
        o->test_samples = (size_t)v;
    } else if (!strcmp(arg, "--schedule")) {
      if (!strcmp(val, "cosine"))
        o->cosine = 1;
      else if (!strcmp(val, "constant"))
        o->cosine = 0;
      else
        return bad_arg("--schedule", "cosine or constant", val);
    } else if (!strcmp(arg, "--gpus") || !strcmp(arg, "--ranks")) {
      if (wl__parse_u64(val, 10, 1, MAX_GPUS, &v))
        return bad_arg(arg, "a whole number from 1 to 64", val);
      o->gpus = (int)v;
    } else if (!strcmp(arg, "--nodes")) {
      if (wl__parse_u64(val, 10, 1, MAX_NODES, &v))
        return bad_arg(arg, "a whole number from 1 to 1024", val);
      o->nodes = (int)v;
    } else if (!strcmp(arg, "--node")) {
      if (wl__parse_u64(val, 10, 0, MAX_NODES - 1, &v))
        return bad_arg(arg, "a whole number from 0 to 1023", val);
      o->node = (int)v;
      node_set = 1;
    } else if (!strcmp(arg, "--nccl-id")) {
      if (!*val) return bad_arg(arg, "a file path", val);
      o->nccl_id = val;
    } else if (!strcmp(arg, "--save-weights")) {
      if (!*val) return bad_arg(arg, "a file path", val);
      o->save_weights = val;
    } else if (!strcmp(arg, "--preload")) {
      if (!*val) return bad_arg(arg, "the path of libwavelet.so", val);
      o->preload_arg = val;
    } else if (!strcmp(arg, "--gate")) {
      if (!strcmp(val, "preload"))
        o->gate_embedded = 0;
      else if (!strcmp(val, "embedded"))
        o->gate_embedded = 1;
      else
        return bad_arg(arg, "preload or embedded", val);
    } else if (!strcmp(arg, "--trace-dir")) {
      if (!*val) return bad_arg("--trace-dir", "a directory", val);
      o->trace_dir = val;
    } else {
      fprintf(stderr, PROG ": unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (steps_set && epochs_set) {
    fprintf(stderr, PROG ": --steps and --epochs: expected one of them, got both\n");
    usage(stderr);
    return 2;
  }
  if (o->eval_each_epoch && epochs_set && o->epochs > WB_MAX_EPOCH_EVALS) {
    fprintf(stderr,
            PROG ": --eval-each-epoch with --epochs %u: expected at most %d epochs (the results "
                 "hold %d evaluations)\n",
            o->epochs, WB_MAX_EPOCH_EVALS, WB_MAX_EPOCH_EVALS);
    usage(stderr);
    return 2;
  }
  if (!steps_set && !epochs_set) o->epochs = 1;
  if (!mode_set && replicas_set && o->replicas > 1) o->mode = WB_TICKTOCK;
  if (!replicas_set) o->replicas = o->mode == WB_SINGLE ? 1 : 2;
  if (o->mode == WB_SINGLE && o->replicas != 1) {
    fprintf(stderr,
            PROG ": --replicas %d with --mode single: expected 1 replica (colocate or "
                 "ticktock run several)\n",
            o->replicas);
    usage(stderr);
    return 2;
  }
  if (o->mode != WB_SINGLE && o->replicas < 2) {
    fprintf(stderr, PROG ": --replicas 1 with --mode %s: expected 2 or more replicas\n",
            o->mode == WB_COLOCATE ? "colocate" : "ticktock");
    usage(stderr);
    return 2;
  }
  if (o->gpus && o->gpus * o->replicas > WB_MAX_PROCS) {
    fprintf(stderr, PROG ": --gpus %d with %d replicas: expected at most %d processes\n", o->gpus,
            o->replicas, WB_MAX_PROCS);
    usage(stderr);
    return 2;
  }
  if ((o->nodes || node_set || o->nccl_id) && !o->gpus) {
    fprintf(stderr, PROG ": --nodes, --node and --nccl-id: expected with --gpus\n");
    usage(stderr);
    return 2;
  }
  if (o->nodes > 1 && !o->nccl_id) {
    fprintf(stderr, PROG ": --nodes %d: expected --nccl-id PATH (how the machines meet)\n",
            o->nodes);
    usage(stderr);
    return 2;
  }
  if (o->node >= (o->nodes ? o->nodes : 1)) {
    fprintf(stderr, PROG ": --node %d: expected 0 to %d (--nodes %d)\n", o->node,
            (o->nodes ? o->nodes : 1) - 1, o->nodes ? o->nodes : 1);
    usage(stderr);
    return 2;
  }
  struct stat st;
  if (o->trace_dir && (stat(o->trace_dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
    fprintf(stderr, PROG ": --trace-dir %s: expected an existing directory\n", o->trace_dir);
    usage(stderr);
    return 2;
  }
  /* Before the training, not after it: a typo must not cost the run. */
  char dir[4096];
  int e;
  if (o->save_weights && (e = dir_writable(o->save_weights, dir, sizeof dir))) {
    fprintf(stderr,
            PROG ": --save-weights %s: expected a file in an existing, writable directory (%s: "
                 "%s)\n",
            o->save_weights, dir, strerror(e));
    usage(stderr);
    return 2;
  }
  if (isnan(o->lr)) o->lr = o->opt == WB_ADAM ? 1e-3f : 0.05f;
  return 0;
}

/* ---- the report ----------------------------------------------------------------------------*/

static const char *status_name(int s) {
  return s == WB_ST_OK ? "ok" : s == WB_ST_OOM ? "OOM" : s == WB_ST_ERROR ? "error" : "none";
}

static const char *mode_name(wb_mode_t m) {
  return m == WB_SINGLE ? "single" : m == WB_COLOCATE ? "colocate" : "ticktock";
}

typedef struct totals_s {
  double wall_s, samples_per_s, test_acc;
  double epochs_completed; /* the fewest any replica completed (epochs_done) */
  double allreduce_ms;     /* mean all-reduce time per step */
  size_t combined_peak, replica_peak;
  /* Under the preload, from the replicas' traces when there are traces (tr: the largest GPU's
   * combined and physical peaks, the rising times summed over the GPUs, the pair's need). */
  int traced;
  wb_traced_t tr;
  int ok, failed;
  int save_failed;       /* replicas whose weights --save-weights could not write */
  int signal;            /* the termination signal that stopped the run, 0: none */
  int weights_identical; /* every rank's replica k ended with rank 0's replica k's weights */
} totals_t;

/* Processes on this machine: ranks x replicas. */
static int procs(const wb_opts_t *o) {
  return wb_local_ranks(o) * o->replicas;
}

/* Passes over the training set that `steps` steps completed: whole epochs (as the replicas walk
 * them: global batches of ranks x batch, a too-small last one dropped) plus the samples of the
 * epoch in progress over the set's size. --steps 2 at batch 64 on 12,000 samples: 0.0107. */
static double epochs_done(const wb_opts_t *o, size_t n, uint64_t steps) {
  size_t per = wb_steps_per_epoch(n, o->batch, wb_ranks(o));
  if (!per || !n) return 0;
  uint64_t rem = steps % per; /* rem x global batch < n */
  return (double)(steps / per) + (double)rem * (double)(o->batch * (size_t)wb_ranks(o)) / (double)n;
}

static void totals(const wb_opts_t *o, const wb_data_t *d, const wb_shared_t *sh, totals_t *t) {
  memset(t, 0, sizeof *t);
  t->epochs_completed = INFINITY;
  uint64_t t0 = UINT64_MAX, t1 = 0, samples = 0, ar_ns = 0, ars = 0;
  double acc = 0;
  t->weights_identical = 1;
  for (int i = 0; i < procs(o); i++) {
    const wb_result_t *r = &sh->r[i];
    if (r->start_ns && r->start_ns < t0) t0 = r->start_ns;
    if (r->end_ns > t1) t1 = r->end_ns;
    samples += r->samples;
    double ep = epochs_done(o, d->train.n, r->steps);
    if (ep < t->epochs_completed) t->epochs_completed = ep;
    if (r->peak > t->replica_peak) t->replica_peak = r->peak;
    if (r->group_peak > t->combined_peak) t->combined_peak = r->group_peak;
    ar_ns += r->allreduce_ns;
    ars += r->allreduces;
    /* Replica k of every rank must end with the same weights as rank 0's replica k. */
    const wb_result_t *r0 = &sh->r[r->replica];
    if (!r->have_checksum || !r0->have_checksum || r->checksum != r0->checksum)
      t->weights_identical = 0;
    if (r->save_failed) t->save_failed++;
    if (r->status == WB_ST_OK) {
      t->ok++;
      acc += r->test_acc;
    } else {
      t->failed++;
    }
  }
  if (!isfinite(t->epochs_completed)) t->epochs_completed = 0;
  t->wall_s = t1 > t0 ? (double)(t1 - t0) / 1e9 : 0;
  t->samples_per_s = t->wall_s > 0 ? (double)samples / t->wall_s : 0;
  t->test_acc = t->ok ? acc / t->ok : 0;
  t->allreduce_ms = ars ? (double)ar_ns / 1e6 / (double)ars : 0;
}

static void rank_words(const wb_opts_t *o, char *buf, size_t len) {
  if (!o->gpus)
    buf[0] = 0;
  else
    snprintf(buf, len, ", %d rank%s (%s)", wb_ranks(o), wb_ranks(o) == 1 ? "" : "s",
             o->backend == WB_BACKEND_CUDA ? "GPUs" : "processes");
}

static void print_table(FILE *f, const wb_opts_t *o, const wb_data_t *d, const wb_shared_t *sh,
                        const totals_t *t, const char *backend) {
  char a[32], b[32], c[32], rk[64];
  rank_words(o, rk, sizeof rk);
  fprintf(f, "\n" PROG ": %s on %s, %s, %d replica%s%s, batch %zu, %s data (%zu train, %zu test)\n",
          wb_model_name(o->model), backend, mode_name(o->mode), o->replicas,
          o->replicas == 1 ? "" : "s", rk, o->batch, d->source, d->train.n,
          o->test_samples && o->test_samples < d->test.n ? o->test_samples : d->test.n);
  fprintf(f, "memory limit: %s\n\n",
          o->mem_limit ? wl_format_bytes(o->mem_limit, a, sizeof a) : "none");
  /* With --gpus: a rank column, and the all-reduce's time per step (waiting for the slowest
   * rank included) with the weights' checksum. */
  if (o->gpus) fprintf(f, "%-4s ", "rank");
  fprintf(f, "%-7s %-6s %7s %7s %10s %11s %11s %9s %9s %8s %8s", "replica", "status", "steps",
          "epochs", "samples/s", "peak", "trough", "wait mem", "wait gate", "loss", "test acc");
  if (o->gpus) fprintf(f, " %10s  %-16s", "allreduce", "weights");
  fputc('\n', f);
  for (int i = 0; i < procs(o); i++) {
    const wb_result_t *r = &sh->r[i];
    double el = r->end_ns > r->start_ns ? (double)(r->end_ns - r->start_ns) / 1e9 : 0;
    char acc[16] = "-";
    if (r->status == WB_ST_OK) snprintf(acc, sizeof acc, "%.2f%%", 100 * r->test_acc);
    if (o->gpus) fprintf(f, "%-4d ", o->node * o->gpus + i / o->replicas);
    /* Under the preload the gate's wait is the interposer's: known from its trace only. So is
     * the wait for memory (liballoc's, inside the interposer), not measured here. */
    char gw[24] = "-", mw[24] = "-";
    if (r->gate_wait_known) snprintf(gw, sizeof gw, "%.2fs", (double)r->gate_wait_ns / 1e9);
    if (r->mem_wait_known) snprintf(mw, sizeof mw, "%.2fs", (double)r->mem_wait_ns / 1e9);
    char loss[24] = "-"; /* not measured, or diverged */
    if (isfinite(r->last_loss)) snprintf(loss, sizeof loss, "%.4f", r->last_loss);
    fprintf(f, "%-7d %-6s %7llu %7.3f %10.1f %11s %11s %9s %9s %8s %8s", i % o->replicas,
            status_name(r->status), (unsigned long long)r->steps,
            epochs_done(o, d->train.n, r->steps), el > 0 ? (double)r->samples / el : 0.0,
            wl_format_bytes(r->peak, a, sizeof a), wl_format_bytes(r->trough, b, sizeof b), mw, gw,
            loss, acc);
    if (o->gpus) {
      char cs[20] = "-";
      if (r->have_checksum) snprintf(cs, sizeof cs, "%016llx", (unsigned long long)r->checksum);
      fprintf(f, " %8.2fms  %-16s",
              r->allreduces ? (double)r->allreduce_ns / 1e6 / (double)r->allreduces : 0.0, cs);
    }
    fputc('\n', f);
  }
  if (o->gpus) fprintf(f, "%-4s ", "");
  /* Under the preload the group's total lives in the interposer's ledger, not in the meter. */
  fprintf(f, "%-7s %-6s %7s %7.3f %10.1f  combined peak %s%s%s, %.1f s", "all",
          t->failed ? "FAILED" : "ok", "", t->epochs_completed, t->samples_per_s,
          o->via_preload && !t->traced ? "not measured"
                                       : wl_format_bytes(t->combined_peak, c, sizeof c),
          o->mem_limit ? " of " : "",
          o->mem_limit ? wl_format_bytes(o->mem_limit, a, sizeof a) : "", t->wall_s);
  if (o->gpus)
    fprintf(f, "; all-reduce %.2f ms a step%s", t->allreduce_ms,
            t->failed              ? ""
            : t->weights_identical ? "; weights identical across ranks"
                                   : "; weights DIFFER across ranks");
  fputc('\n', f);
  if (t->signal)
    fprintf(f, "stopped by signal %d (%s): the replicas were stopped with it\n", t->signal,
            strsignal(t->signal));
  if (t->traced) {
    fprintf(f, "from the interposer's traces: combined peak of live bytes");
    if (t->tr.phys_known)
      fprintf(f, " (of physical memory, the budget's measure: %s)",
              wl_format_bytes((size_t)t->tr.phys_peak, c, sizeof c));
    if (o->replicas > 1) /* one replica alone overlaps nobody */
      fprintf(f, ", and rising phases overlapped %.1f ms of %.1f ms rising",
              (double)t->tr.overlap_ns / 1e6, (double)t->tr.rising_ns / 1e6);
    fputc('\n', f);
    int capped;
    uint64_t pb = wb_pair_budget(&t->tr, &capped);
    if (o->mode == WB_SINGLE && pb) {
      char p2[32];
      fprintf(f,
              "a tick-tock pair of this replica needs about %s: two copies of its wave at their "
              "best offsets in physical memory (its live bytes x its fragmentation at the peak, "
              "each plus its partly used chunks there)",
              wl_format_bytes((size_t)pb, c, sizeof c));
      fprintf(f, "%s; two aligned peaks need %s\n",
              capped ? ", kept to 95 % of two peaks (the wave leaves tick-tock little to save)"
                     : "",
              wl_format_bytes((size_t)(2 * t->tr.phys_peak), p2, sizeof p2));
    }
  }
  if (o->via_preload)
    fprintf(f, "replicas under %s (%s mode)%s\n", o->preload,
            o->mode == WB_TICKTOCK ? "gate" : "alloc",
            o->trace_dir ? "; memory and gate waits from their traces"
                         : "; memory and gate waits not measured (the interposer's; --trace-dir "
                           "gives them)");
  for (int i = 0; i < procs(o); i++)
    if (sh->r[i].status != WB_ST_OK || sh->r[i].save_failed) {
      if (o->gpus) fprintf(f, "rank %d ", o->node * o->gpus + i / o->replicas);
      fprintf(f, "replica %d: %s\n", i % o->replicas,
              sh->r[i].msg[0] ? sh->r[i].msg : "did not finish");
    }
}

/* JSON string contents: messages come from our own formats, but quote them properly anyway. */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

/* ,"key":number with prec decimals, or null for what was not measured (NaN) and for NaN and
 * infinity from a diverged run, which JSON cannot say: printf's "-nan" would make the whole
 * object unreadable. sep is the separator before the key. */
static void jnum(const char *sep, const char *key, double v, int prec) {
  if (isfinite(v))
    printf("%s\"%s\":%.*f", sep, key, prec, v);
  else
    printf("%s\"%s\":null", sep, key);
}

static void print_json(const wb_opts_t *o, const wb_data_t *d, const wb_shared_t *sh,
                       const totals_t *t, const char *backend) {
  printf("{\"backend\":\"%s\",\"model\":\"%s\",\"mode\":\"%s\",\"replicas\":%d,\"batch\":%zu,",
         backend, wb_model_name(o->model), mode_name(o->mode), o->replicas, o->batch);
  printf("\"gpus\":%d,\"ranks\":%d,\"nodes\":%d,\"node\":%d,", o->gpus, wb_ranks(o),
         o->nodes ? o->nodes : 1, o->node);
  printf("\"steps\":%llu,\"epochs\":%u,\"epochs_completed\":%.4f,\"threads\":%d,\"seed\":%llu,"
         "\"mem_limit\":%zu,",
         (unsigned long long)o->steps, o->epochs, t->epochs_completed, o->threads,
         (unsigned long long)o->seed, o->mem_limit);
  printf("\"optimizer\":\"%s\",\"lr\":%g,\"schedule\":\"%s\",", o->opt == WB_ADAM ? "adam" : "sgd",
         (double)o->lr, o->cosine ? "cosine" : "constant");
  printf("\"data\":");
  json_str(stdout, d->source);
  printf(",\"train_samples\":%zu,\"test_samples\":%zu", d->train.n,
         o->test_samples && o->test_samples < d->test.n ? o->test_samples : d->test.n);
  /* Known from the interposer's traces only. */
  jnum(",", "rising_ms", t->traced ? (double)t->tr.rising_ns / 1e6 : NAN, 3);
  jnum(",", "rising_overlap_ms", t->traced ? (double)t->tr.overlap_ns / 1e6 : NAN, 3);
  char ppeak[32] = "null"; /* the replicas' physical memory together: from their traces only */
  if (t->traced && t->tr.phys_known)
    snprintf(ppeak, sizeof ppeak, "%llu", (unsigned long long)t->tr.phys_peak);
  printf(",\"physical_peak_bytes\":%s,", ppeak);
  /* single under the preload, traced: what a tick-tock pair of this replica needs. */
  int capped = 0;
  uint64_t pb = t->traced && o->mode == WB_SINGLE ? wb_pair_budget(&t->tr, &capped) : 0;
  if (pb)
    printf("\"ticktock_pair_budget_bytes\":%llu,\"ticktock_pair_budget_capped\":%s,",
           (unsigned long long)pb, capped ? "true" : "false");
  else
    printf("\"ticktock_pair_budget_bytes\":null,\"ticktock_pair_budget_capped\":null,");
  printf("\"gate\":\"%s\",\"preload\":", o->mode == WB_SINGLE ? "none"
                                         : o->via_preload     ? "preload"
                                                              : "embedded");
  if (o->via_preload)
    json_str(stdout, o->preload);
  else
    printf("null");
  char cpeak[32] = "null"; /* under the preload the group's total is the interposer's */
  if (!o->via_preload || t->traced) snprintf(cpeak, sizeof cpeak, "%zu", t->combined_peak);
  jnum(",", "samples_per_s", t->samples_per_s, 3);
  printf(",\"peak_bytes\":%s,\"replica_peak_bytes\":%zu", cpeak, t->replica_peak);
  jnum(",", "test_accuracy", t->ok ? t->test_acc : NAN, 5);
  jnum(",", "wall_s", t->wall_s, 3);
  printf(",\"ok\":%s,\"failed\":%d", t->failed ? "false" : "true", t->failed);
  if (t->signal)
    printf(",\"stopped_by_signal\":%d", t->signal);
  else
    printf(",\"stopped_by_signal\":null");
  jnum(",", "allreduce_ms_per_step", t->allreduce_ms, 4);
  printf(",\"weights_identical\":%s,\"weights_saved\":%s,\"per_replica\":[",
         t->weights_identical ? "true" : "false",
         !o->save_weights ? "null"
         : t->save_failed ? "false"
                          : "true");
  for (int i = 0; i < procs(o); i++) {
    const wb_result_t *r = &sh->r[i];
    double el = r->end_ns > r->start_ns ? (double)(r->end_ns - r->start_ns) / 1e9 : 0;
    printf("%s{\"rank\":%d", i ? "," : "", r->rank);
    jnum(",", "allreduce_s", (double)r->allreduce_ns / 1e9, 4);
    jnum(",", "allreduce_ms_per_step",
         r->allreduces ? (double)r->allreduce_ns / 1e6 / (double)r->allreduces : 0.0, 4);
    printf(",\"weights_checksum\":\"%016llx\",\"replica\":%d,\"status\":\"%s\",\"steps\":%llu,"
           "\"samples\":%llu,\"epochs_completed\":%.4f",
           (unsigned long long)r->checksum, i % o->replicas, status_name(r->status),
           (unsigned long long)r->steps, (unsigned long long)r->samples,
           epochs_done(o, d->train.n, r->steps));
    jnum(",", "samples_per_s", el > 0 ? (double)r->samples / el : 0.0, 3);
    printf(",\"peak_bytes\":%zu,\"trough_bytes\":%zu", r->peak, r->trough);
    /* null: not measured (under the preload without a trace to read it from) */
    jnum(",", "mem_wait_s", r->mem_wait_known ? (double)r->mem_wait_ns / 1e9 : NAN, 4);
    jnum(",", "gate_wait_s", r->gate_wait_known ? (double)r->gate_wait_ns / 1e9 : NAN, 4);
    if (r->gate_wait_known)
      printf(",\"gate_grants\":%llu", (unsigned long long)r->gate_grants);
    else
      printf(",\"gate_grants\":null");
    jnum(",", "first_loss", r->first_loss, 5);
    jnum(",", "last_loss", r->last_loss, 5);
    jnum(",", "train_accuracy", r->train_acc, 5);
    jnum(",", "test_accuracy", r->test_acc, 5);
    jnum(",", "test_loss", r->test_loss, 5);
    printf(",\"params\":%llu,\"message\":", (unsigned long long)r->params);
    json_str(stdout, r->msg);
    printf(",\"epoch_test_accuracy\":[");
    for (unsigned e = 0; e < r->epochs_evaluated; e++) {
      printf("%s{\"epoch\":%u", e ? "," : "", e + 1);
      jnum(",", "test_accuracy", (double)r->epoch_acc[e], 5);
      jnum(",", "train_s", (double)r->epoch_s[e], 1);
      printf("}");
    }
    printf("]}");
  }
  printf("]}\n");
}

/* ---- main ----------------------------------------------------------------------------------*/

/* A replica process (forked, or exec'd under the preload): runs, says why it failed. */
static int replica_main(const wb_opts_t *o, const wb_data_t *d, int i, wb_shared_t *sh,
                        wb_dp_t *dp) {
  int rc = wb_replica_run(o, d, i, sh, dp);
  if ((sh->r[i].status != WB_ST_OK || sh->r[i].save_failed) && sh->r[i].msg[0]) {
    if (o->gpus)
      fprintf(stderr, PROG ": rank %d replica %d (pid %d): %s\n", sh->r[i].rank, sh->r[i].replica,
              (int)getpid(), sh->r[i].msg);
    else
      fprintf(stderr, PROG ": replica %d (pid %d): %s\n", i, (int)getpid(), sh->r[i].msg);
  }
  fflush(NULL);
  return rc;
}

static int load_data(const wb_opts_t *o, wb_data_t *d) {
  char err[512];
  if (!strcmp(o->data, "synthetic")) {
    if (wb_data_synthetic(d, o->train_samples ? o->train_samples : 12000,
                          o->test_samples ? o->test_samples : 2000, o->seed)) {
      fprintf(stderr, PROG ": out of memory for the synthetic data\n");
      return 1;
    }
  } else if (wb_data_load(o->data, d, err, sizeof err)) {
    fprintf(stderr, PROG ": %s\n", err);
    return 1;
  }
  wb_data_limit(d, o->train_samples, o->test_samples);
  return 0;
}

/* An exec'd replica: the parent's command line again (so the same options and the same data,
 * loaded again: the exec dropped the parent's copy), the shared memory by descriptor. */
static int child_main(int argc, char **argv, int role, int shared_fd, int dp_fd,
                      const char *preload) {
  wb_opts_t o;
  int backend_auto;
  if (parse_args(argc, argv, &o, &backend_auto)) return 1;
  o.backend = WB_BACKEND_CUDA;
  o.via_preload = 1;
  o.argc = argc;
  o.argv = argv;
  snprintf(o.preload, sizeof o.preload, "%s", preload);
  const char *g = getenv("WAVELET_GROUP");
  snprintf(o.group, sizeof o.group, "%s", g ? g : "");
  wb_shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0);
  if (sh == MAP_FAILED) {
    fprintf(stderr, PROG ": replica %d: cannot map the results: %s\n", role, strerror(errno));
    return 1;
  }
  close(shared_fd);
  wb_dp_t *dp = NULL;
  if (dp_fd >= 0 && !(dp = wb_dp_attach(dp_fd))) {
    fprintf(stderr, PROG ": replica %d: cannot map the all-reduce's rendezvous: %s\n", role,
            strerror(errno));
    return 1;
  }
  wb_data_t d;
  if (load_data(&o, &d)) {
    /* The parent loaded the same data a moment ago; reach the barrier so nobody waits. */
    wb_result_t *res = &sh->r[role];
    wb_result_reset(res);
    res->status = WB_ST_ERROR;
    snprintf(res->msg, sizeof res->msg, "cannot load the data again in the exec'd replica");
    __atomic_store_n(&sh->arrived[role], 1, __ATOMIC_RELEASE);
    pthread_barrier_wait(&sh->start);
    return 1;
  }
  int rc = replica_main(&o, &d, role, sh, dp);
  wb_data_free(&d);
  return rc;
}

/* Resolves and checks libwavelet.so for the replicas under the preload: 0, or the exit status
 * after one line (2: a --preload that is not usable; 1: none found). */
static int find_preload(wb_opts_t *o) {
  char why[1200];
  if (wll_find_preload(o->preload_arg, o->preload, sizeof o->preload, why, sizeof why)) {
    if (o->preload_arg || getenv("WAVELET_PRELOAD")) {
      fprintf(stderr, PROG ": %s\n", why);
      return 2;
    }
    fprintf(stderr,
            PROG ": the cuda backend's %s runs its replicas under libwavelet.so, not found (%s): "
                 "pass --preload PATH, or --gate embedded\n",
            o->mode == WB_COLOCATE ? "colocate" : "ticktock", why);
    return 1;
  }
  if (wb_preload_check(o->preload, why, sizeof why)) {
    fprintf(stderr, PROG ": --preload %s; expected libwavelet.so\n", why);
    return 2;
  }
  return 0;
}

/* How long the replicas have to end after a termination signal before they are killed. */
#define STOP_GRACE_NS (10ull * 1000000000ull)

/* The launcher's signals: blocked from before the first fork and taken in the wait loop, so that
 * a SIGINT, SIGTERM or SIGHUP stops the replicas, reaps them and removes the group instead of
 * leaving them training and the group's segment behind. SIGCHLD wakes the loop. */
static void launcher_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGHUP);
  sigaddset(set, SIGCHLD);
}

/* Starts every replica (forked, or exec'd under the preload) and waits for them all; *sig is the
 * termination signal that stopped them (0: none). */
static int run_replicas(const wb_opts_t *o, const wb_data_t *d, wb_shared_t *sh, int shared_fd,
                        wb_dp_t *dp, int *sig) {
  *sig = 0;
  pthread_barrierattr_t ba;
  pthread_barrierattr_init(&ba);
  pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
  int np = procs(o);
  pthread_barrier_init(&sh->start, &ba, (unsigned)np);
  pthread_barrierattr_destroy(&ba);
  pid_t pids[WB_MAX_PROCS];
  /* A replica that dies before its own reset must not show losses of 0. */
  for (int i = 0; i < np; i++) wb_result_reset(&sh->r[i]);
  sigset_t set, old;
  launcher_signals(&set);
  sigprocmask(SIG_BLOCK, &set, &old);
  pid_t parent = getpid();
  fflush(NULL);
  for (int i = 0; i < np; i++) {
    pids[i] = o->via_preload ? wb_preload_spawn(o, i, shared_fd, wb_dp_fd(dp), &old) : fork();
    if (pids[i] < 0) {
      fprintf(stderr, PROG ": cannot start replica %d: %s\n", i, strerror(errno));
      for (int k = 0; k < i; k++) kill(pids[k], SIGTERM);
      for (int k = 0; k < i; k++) waitpid(pids[k], NULL, 0);
      sigprocmask(SIG_SETMASK, &old, NULL);
      return -1;
    }
    if (pids[i] == 0) {
      /* Dies with the launcher rather than train on unsupervised (a SIGKILL leaves no time to
       * forward anything); the launcher may already be gone. */
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(128 + SIGTERM);
      sigprocmask(SIG_SETMASK, &old, NULL);
      _exit(replica_main(o, d, i, sh, dp));
    }
  }
  int sts[WB_MAX_PROCS] = {0}, left = np, killed = 0;
  uint64_t stop_by = 0;
  while (left > 0) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid == 0) {
      /* Bounded, so a grace period ends even if no child does. */
      struct timespec ts = {.tv_sec = 1};
      int s = sigtimedwait(&set, NULL, &ts);
      if (s == SIGINT || s == SIGTERM || s == SIGHUP) {
        if (!*sig) {
          *sig = s;
          stop_by = wl__now_ns() + STOP_GRACE_NS;
          fprintf(stderr, PROG ": %s: stopping the replicas\n", strsignal(s));
        }
        for (int k = 0; k < np; k++)
          if (pids[k] > 0) kill(pids[k], s);
      }
      if (*sig && !killed && wl__now_ns() > stop_by) {
        fprintf(stderr, PROG ": replicas still running %llu s after the signal: killing them\n",
                STOP_GRACE_NS / 1000000000ull);
        for (int k = 0; k < np; k++)
          if (pids[k] > 0) kill(pids[k], SIGKILL);
        killed = 1;
      }
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int i = 0;
    while (i < np && pids[i] != pid) i++;
    if (i == np) continue;
    sts[i] = st;
    pids[i] = -pids[i]; /* reaped */
    left--;
    /* A replica that ended (died, or an exec'd one that failed to start) before the start
     * barrier would leave the others waiting there. */
    if (!__atomic_load_n(&sh->arrived[i], __ATOMIC_ACQUIRE))
      for (int k = 0; k < np; k++)
        if (pids[k] > 0) kill(pids[k], SIGTERM);
    /* A rank that died or failed would leave its peers waiting in the all-reduce. */
    if (dp && (WIFSIGNALED(st) || WEXITSTATUS(st) != 0))
      wb_dp_abort(dp, i % o->replicas, o->node * o->gpus + i / o->replicas);
  }
  /* A signal after the last replica ended still ends the run as signalled; SIGCHLD's are
   * dropped. Later ones stay blocked: the report and the clean-up finish first. */
  struct timespec zero = {0};
  for (int s; (s = sigtimedwait(&set, NULL, &zero)) > 0;)
    if (s != SIGCHLD && !*sig) *sig = s;
  for (int i = 0; i < np; i++) {
    int st = sts[i];
    if (pids[i] < 0) pids[i] = -pids[i];
    wb_result_t *r = &sh->r[i];
    if (WIFSIGNALED(st)) {
      r->status = WB_ST_ERROR;
      snprintf(r->msg, sizeof r->msg, "killed by signal %d (%s)", WTERMSIG(st),
               strsignal(WTERMSIG(st)));
      if (o->gpus)
        fprintf(stderr, PROG ": rank %d replica %d (pid %d): %s\n",
                o->node * o->gpus + i / o->replicas, i % o->replicas, (int)pids[i], r->msg);
      else
        fprintf(stderr, PROG ": replica %d (pid %d): %s\n", i, (int)pids[i], r->msg);
      r->rank = o->node * o->gpus + i / o->replicas;
      r->replica = i % o->replicas;
    } else if (r->status == WB_ST_NONE) {
      r->status = WB_ST_ERROR;
      snprintf(r->msg, sizeof r->msg, "exited with status %d without a result", WEXITSTATUS(st));
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  wb_opts_t o;
  int backend_auto;
  /* A replica exec'd under the preload by its launcher (a hidden last argument). */
  int role, shared_fd, dp_fd;
  char preload[4096];
  int child =
      wb_preload_child_args(&argc, argv, &role, &shared_fd, &dp_fd, preload, sizeof preload);
  if (child < 0) {
    fprintf(stderr, PROG ": malformed replica argument (it is the launcher's, not a user's)\n");
    return 2;
  }
  if (child) return child_main(argc, argv, role, shared_fd, dp_fd, preload);
  int check = wb_preload_check_child(argc, argv);
  if (check >= 0) return check;
  int prc = parse_args(argc, argv, &o, &backend_auto);
  if (prc) return prc == 1 ? 0 : 2;
  o.argc = argc;
  o.argv = argv;

  if (backend_auto) {
    o.backend = wb_cuda_probe() == 0 ? WB_BACKEND_CUDA : WB_BACKEND_CPU;
  } else if (o.backend == WB_BACKEND_CUDA) {
    if (!wb_have_cuda()) {
      fprintf(stderr, PROG ": --backend cuda: this build has no CUDA backend (configured "
                           "without the CUDA toolkit); use --backend cpu\n");
      return 1;
    }
    if (wb_cuda_probe()) {
      fprintf(stderr, PROG ": --backend cuda: no usable CUDA device or driver on this machine; "
                           "use --backend cpu\n");
      return 1;
    }
  }
  if (o.gpus && o.backend == WB_BACKEND_CUDA) {
    int version;
    char why[256];
    if (!wb_nccl_available(&version, why, sizeof why)) {
      fprintf(stderr, PROG ": --gpus on cuda needs NCCL: %s\n", why);
      return 1;
    }
  } else if (o.nodes > 1) {
    fprintf(stderr,
            PROG ": --nodes %d: the cpu backend's all-reduce is in shared memory on one "
                 "machine; several machines need --backend cuda (NCCL)\n",
            o.nodes);
    return 1;
  }
  /* The cuda backend's colocate and ticktock go through the interposer, as a trainer would; so
   * does single when --preload names it (alloc mode: served by liballoc, not gated), for the
   * physical peak a budget counts and what serving costs against a plain single run. */
  o.via_preload =
      o.backend == WB_BACKEND_CUDA && !o.gate_embedded && (o.mode != WB_SINGLE || o.preload_arg);
  if (o.via_preload || o.preload_arg) {
    int frc = find_preload(&o);
    if (frc) return frc;
  }
  const char *backend = o.backend == WB_BACKEND_CUDA ? "cuda" : "cpu";
  if (o.threads == 0 && o.backend == WB_BACKEND_CPU) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
    o.threads = (int)(cores / (o.replicas * wb_local_ranks(&o)));
    if (o.threads < 1) o.threads = 1;
  }

  wb_data_t d;
  if (load_data(&o, &d)) return 1;
  /* With --steps the epochs depend on the data's size: known only now. */
  size_t per_epoch = wb_steps_per_epoch(d.train.n, o.batch, wb_ranks(&o));
  if (o.eval_each_epoch && o.steps && per_epoch &&
      (o.steps + per_epoch - 1) / per_epoch > WB_MAX_EPOCH_EVALS) {
    fprintf(stderr,
            PROG ": --eval-each-epoch with --steps %llu: expected at most %d epochs (the results "
                 "hold %d evaluations), got %llu of %zu steps\n",
            (unsigned long long)o.steps, WB_MAX_EPOCH_EVALS, WB_MAX_EPOCH_EVALS,
            (unsigned long long)((o.steps + per_epoch - 1) / per_epoch), per_epoch);
    usage(stderr);
    wb_data_free(&d);
    return 2;
  }

  snprintf(o.group, sizeof o.group, "wavelet-bench-%d", (int)getpid());
  /* A memfd, so that replicas exec'd under the preload map the results too (close-on-exec:
   * the launcher clears the flag in those children only). */
  int shfd = memfd_create("wavelet-bench-results", MFD_CLOEXEC);
  wb_shared_t *sh = MAP_FAILED;
  if (shfd >= 0 && ftruncate(shfd, (off_t)sizeof *sh) == 0)
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, shfd, 0);
  if (sh == MAP_FAILED) {
    fprintf(stderr, PROG ": cannot map the results page: %s\n", strerror(errno));
    return 1;
  }
  wb_dp_t *dp = NULL;
  if (o.gpus) {
    /* The cpu all-reduce sums through one slot of the parameters' size per rank. */
    dp = wb_dp_create(o.replicas, o.gpus,
                      o.backend == WB_BACKEND_CPU ? wb_net_param_floats(o.model) : 0);
    if (!dp) {
      fprintf(stderr, PROG ": cannot map the all-reduce's shared memory: %s\n", strerror(errno));
      return 1;
    }
  }
  char rk[64];
  rank_words(&o, rk, sizeof rk);
  if (!o.quiet)
    fprintf(stderr,
            PROG ": %s on %s, %s, %d replica%s%s, batch %zu, %d thread%s each, %zu training "
                 "samples\n",
            wb_model_name(o.model), backend, mode_name(o.mode), o.replicas,
            o.replicas == 1 ? "" : "s", rk, o.batch, o.threads, o.threads == 1 ? "" : "s",
            d.train.n);
  int sig = 0;
  int rc = run_replicas(&o, &d, sh, shfd, dp, &sig);
  /* Under the preload the waits and the group's total are the interposer's: its traces say
   * them (colocate: no gate, no gate wait). */
  wb_traced_t tr;
  int traced = 0;
  if (o.via_preload) {
    for (int i = 0; i < procs(&o); i++) sh->r[i].gate_wait_known = o.mode != WB_TICKTOCK;
    if (o.trace_dir) traced = wb_preload_traces(&o, sh, &tr) == 0;
  }
  if (o.mode != WB_SINGLE || o.via_preload) {
    /* after a crash; normally gone */
    if (o.gpus) {
      for (int g = 0; g < o.gpus; g++) {
        char name[64];
        snprintf(name, sizeof name, "%s-g%d", o.group, g);
        wl_sched_group_remove_all(name);
      }
    } else {
      wl_sched_group_remove_all(o.group);
    }
  }
  wb_dp_destroy(dp);
  if (rc) return 1;
  totals_t t;
  totals(&o, &d, sh, &t);
  t.signal = sig;
  if (traced) {
    t.traced = 1;
    t.combined_peak = (size_t)tr.peak;
    t.tr = tr;
  }
  print_table(o.json ? stderr : stdout, &o, &d, sh, &t, backend);
  if (o.json) print_json(&o, &d, sh, &t, backend);
  wb_data_free(&d);
  munmap(sh, sizeof *sh);
  close(shfd);
  /* Stopped by a signal: what was measured is printed above; exit as a shell reports it. */
  if (sig) return 128 + sig;
  /* Weights that could not be saved: the results above stand, but the run did not do all it
   * was asked. */
  return t.failed || t.save_failed ? 1 : 0;
}
