/* Generates wl-bench-alloc's traces: a training loop's allocation pattern and a random mix. */
#include "traces.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX
#define KiB  ((uint64_t)1 << 10)
#define MiB  ((uint64_t)1 << 20)

/* ---- random numbers: xoshiro256** seeded by splitmix64, the same sequence everywhere --------*/

typedef struct rng_s {
  uint64_t s[4];
} rng_t;

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void rng_seed(rng_t *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(rng_t *r) {
  uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

/* Uniform in [0, n); the modulo bias is below 2^-40 for the n used here. */
static uint64_t rng_below(rng_t *r, uint64_t n) {
  return n ? rng_next(r) % n : 0;
}

static int rng_chance(rng_t *r, unsigned num, unsigned den) {
  return rng_below(r, den) < num;
}

/* ---- the generator: ops, slots and live-byte accounting -------------------------------------*/

typedef struct gen_s {
  wl__bench_trace_t *t;
  rng_t rng;
  uint64_t *slot_size;
  uint8_t *slot_stream;
  size_t slot_cap;
  uint32_t *free_slots;
  size_t nfree, free_cap;
  size_t live;
  int oom;
} gen_t;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t n = *cap ? *cap : 1024;
  while (n < need) n *= 2;
  void *q = realloc(*p, n * elem);
  if (!q) return -ENOMEM;
  *p = q;
  *cap = n;
  return 0;
}

static void emit(gen_t *g, uint8_t kind, uint8_t stream, uint32_t slot, uint64_t size,
                 uint16_t lag) {
  wl__bench_trace_t *t = g->t;
  if (g->oom) return;
  if (grow((void **)&t->ops, &t->cap, t->nops + 1, sizeof *t->ops)) {
    g->oom = 1;
    return;
  }
  t->ops[t->nops++] = (wl__bench_op_t){size, slot, kind, stream, lag};
}

static uint32_t g_alloc(gen_t *g, uint64_t size, unsigned stream) {
  wl__bench_trace_t *t = g->t;
  uint32_t slot;
  if (g->nfree) {
    slot = g->free_slots[--g->nfree];
  } else {
    slot = t->nslots;
    if (slot >= g->slot_cap) {
      size_t n = g->slot_cap ? g->slot_cap * 2 : 1024;
      uint64_t *sz = realloc(g->slot_size, n * sizeof *sz);
      if (sz) g->slot_size = sz;
      uint8_t *st = realloc(g->slot_stream, n * sizeof *st);
      if (st) g->slot_stream = st;
      if (!sz || !st) {
        g->oom = 1;
        return 0;
      }
      g->slot_cap = n;
    }
    t->nslots++;
  }
  g->slot_size[slot] = size;
  g->slot_stream[slot] = (uint8_t)stream;
  emit(g, WL__OP_ALLOC, (uint8_t)stream, slot, size, 0);
  t->allocs++;
  g->live += size;
  if (g->live > t->live_peak) t->live_peak = g->live;
  if (!t->min_size || size < t->min_size) t->min_size = size;
  if (size > t->max_size) t->max_size = size;
  return slot;
}

static void g_free(gen_t *g, uint32_t slot, unsigned stream) {
  wl__bench_trace_t *t = g->t;
  if (g->oom || slot == NONE) return;
  if (grow((void **)&g->free_slots, &g->free_cap, g->nfree + 1, sizeof *g->free_slots)) {
    g->oom = 1;
    return;
  }
  emit(g, WL__OP_FREE, (uint8_t)stream, slot, 0, 0);
  t->frees++;
  if (g->slot_stream[slot] != stream) t->cross_stream_frees++;
  g->live -= g->slot_size[slot];
  g->free_slots[g->nfree++] = slot;
}

static void g_work(gen_t *g, unsigned stream) {
  emit(g, WL__OP_WORK, (uint8_t)stream, 0, 0, 0);
}

static void g_done(gen_t *g, unsigned stream, unsigned lag) {
  emit(g, WL__OP_DONE, (uint8_t)stream, 0, 0, (uint16_t)lag);
}

/* Ends an iteration: the GPU has caught up (a loss.item() or an optimizer step synchronises). */
static void g_iter(gen_t *g) {
  g_done(g, WL__BENCH_ALL_STREAMS, 0);
  emit(g, WL__OP_ITER, 0, 0, 0, 0);
}

/* Marks the measured range: from the end of the first iteration (warm-up: the allocators map or
 * fault in their memory there) to the end of the last. */
static int finish(gen_t *g) {
  wl__bench_trace_t *t = g->t;
  free(g->slot_size);
  free(g->slot_stream);
  free(g->free_slots);
  if (g->oom) {
    wl__bench_trace_free(t);
    return -ENOMEM;
  }
  size_t first_iter = SIZE_MAX, last_iter = 0, samples = 0;
  for (size_t i = 0; i < t->nops; i++)
    if (t->ops[i].kind == WL__OP_ITER) {
      if (first_iter == SIZE_MAX) first_iter = i;
      last_iter = i;
    }
  t->measure_from = t->iterations > 1 ? first_iter + 1 : 0;
  t->measure_to = last_iter + 1;
  for (size_t i = 0; i < t->nops; i++) {
    if (i == t->measure_from) t->sample_from = samples;
    if (i == t->measure_to) t->sample_to = samples;
    if (t->ops[i].kind == WL__OP_ALLOC || t->ops[i].kind == WL__OP_FREE) samples++;
  }
  if (t->measure_to >= t->nops) t->sample_to = samples;
  t->nsamples_total = samples;
  return 0;
}

/* ---- the DNN trace --------------------------------------------------------------------------*/

/* One layer of the model. Activation and workspace sizes are per sample; the rest absolute. */
typedef struct layer_s {
  uint64_t act;            /* output activation, kept for backward */
  uint64_t saved;          /* an extra tensor kept for backward (BN statistics), 0: none */
  uint64_t wgt, bias;      /* parameter tensors (fp32), 0: none */
  uint64_t tmp;            /* a small temporary allocated and freed inside the layer, 0: none */
  uint32_t ws_fwd, ws_bwd; /* workspace in quarters of the layer's activation, 0: none */
} layer_t;

enum { S_MAIN = 0, S_COMM = 1, S_COPY = 2 };

#define ACT_ELEM     2u         /* bf16 activations under autocast */
#define WS_MAX       (64 * MiB) /* a conv workspace limit, as frameworks set one */
#define BUCKET_BYTES (25 * MiB) /* DDP's default gradient bucket */

static uint64_t jitter8(rng_t *r, uint64_t c) {
  /* 0.75x .. 1.25x, a multiple of 8: real networks rarely use the same width twice. */
  uint64_t v = c * (6 + rng_below(r, 5)) / 8;
  return v < 8 ? 8 : v / 8 * 8;
}

/* A ResNet-like CNN on 112x112 images: a 7x7 stride-2 stem, (conv, bn, relu) triples over four
 * stages (56x56 down to 7x7) in ResNet-50's 3:4:6:3 proportion, then avgpool, fc 4096, logits
 * 1000. The largest activations come out at tens of MiB. */
static void dnn_model(rng_t *r, layer_t *ly, uint32_t L) {
  memset(ly, 0, L * sizeof *ly);
  uint64_t cin = 64;
  ly[0] =
      (layer_t){.act = 64 * 56 * 56 * ACT_ELEM, .wgt = 3 * 64 * 49 * 4, .ws_fwd = 2, .ws_bwd = 4};
  uint32_t nbody = L - 4;
  for (uint32_t j = 0; j < nbody; j++) {
    uint32_t q = j * 16 / nbody, stage = q < 3 ? 0 : q < 7 ? 1 : q < 13 ? 2 : 3;
    uint64_t hw = (56u >> stage) * (56u >> stage);
    layer_t *l = &ly[1 + j];
    switch (j % 3) {
    case 0: { /* conv */
      uint64_t cout = jitter8(r, 64u << stage), k = rng_chance(r, 1, 3) ? 1 : 3;
      l->act = cout * hw * ACT_ELEM;
      l->wgt = cin * cout * k * k * 4;
      l->bias = rng_chance(r, 1, 2) ? cout * 4 : 0;
      l->ws_fwd = rng_chance(r, 2, 3) ? 1 + (uint32_t)rng_below(r, 8) : 0;
      l->ws_bwd = rng_chance(r, 2, 3) ? 1 + (uint32_t)rng_below(r, 8) : 0;
      cin = cout;
      break;
    }
    case 1: /* batch norm: saves mean and inverse std, reduces through a small temporary */
      l->act = cin * hw * ACT_ELEM;
      l->saved = 2 * cin * 4;
      l->wgt = cin * 4;
      l->bias = cin * 4;
      l->tmp = 2 * cin * 4;
      break;
    default: /* relu */
      l->act = cin * hw * ACT_ELEM;
      break;
    }
  }
  ly[L - 3] = (layer_t){.act = cin * ACT_ELEM};
  ly[L - 2] = (layer_t){.act = 4096 * ACT_ELEM, .wgt = cin * 4096 * 4, .bias = 4096 * 4};
  ly[L - 1] = (layer_t){.act = 1000 * ACT_ELEM, .wgt = 4096 * 1000 * 4, .bias = 1000 * 4};
}

static uint64_t ws_bytes(uint64_t act, uint32_t quarters) {
  uint64_t b = act * quarters / 4;
  return b > WS_MAX ? WS_MAX : b < 256 ? 256 : b;
}

/* DDP-style buckets on the communication stream, shared by both models' backward passes. */
typedef struct buckets_s {
  uint32_t slot[8], free_at[8], n;
  uint64_t acc;
} buckets_t;

static void buckets_step(gen_t *g, buckets_t *b, uint64_t grad_bytes, uint32_t i) {
  b->acc += grad_bytes;
  if (b->acc && (b->acc >= BUCKET_BYTES || i == 0) && b->n < 8) {
    b->slot[b->n] = g_alloc(g, b->acc < 2 * BUCKET_BYTES ? b->acc : 2 * BUCKET_BYTES, S_COMM);
    b->free_at[b->n++] = i >= 2 ? i - 2 : 0;
    g_work(g, S_COMM);
    b->acc = 0;
  }
  for (uint32_t k = 0; k < b->n;)
    if (i <= b->free_at[k]) {
      g_free(g, b->slot[k], S_COMM);
      b->slot[k] = b->slot[--b->n];
      b->free_at[k] = b->free_at[b->n];
    } else {
      k++;
    }
}

int wl__bench_trace_dnn(wl__bench_trace_t *t, uint64_t seed, uint32_t iterations) {
  memset(t, 0, sizeof *t);
  t->name = "dnn";
  t->model = "cnn";
  t->nstreams = 3;
  t->iterations = iterations;
  gen_t g = {.t = t};
  rng_seed(&g.rng, seed);
  uint32_t L = 40 + (uint32_t)rng_below(&g.rng, 81);
  layer_t *ly = malloc(L * sizeof *ly);
  uint32_t *act = malloc(L * sizeof *act), *saved = malloc(L * sizeof *saved);
  uint32_t *wg = malloc(L * sizeof *wg), *bg = malloc(L * sizeof *bg);
  uint32_t *params = malloc(L * 6 * sizeof *params);
  if (!ly || !act || !saved || !wg || !bg || !params) {
    g.oom = 1;
    goto out;
  }
  dnn_model(&g.rng, ly, L);

  /* The batch puts the kept activations at about 24 MiB per layer: a few GiB in all. */
  uint64_t in_sample = 3 * 112 * 112 * ACT_ELEM, per_sample = in_sample;
  for (uint32_t i = 0; i < L; i++) per_sample += ly[i].act;
  uint64_t batch = (uint64_t)L * 24 * MiB / per_sample;
  batch = batch < 8 ? 8 : batch > 1024 ? 1024 : batch;
  t->layers = L;
  t->batch = (uint32_t)batch;
  t->activation_bytes = per_sample * batch;
  uint64_t in_bytes = in_sample * batch;

  /* Prologue: parameters and Adam's two moments live for the whole run. */
  uint32_t nparams = 0;
  for (uint32_t i = 0; i < L; i++)
    for (int k = 0; k < 2; k++) {
      uint64_t b = k ? ly[i].bias : ly[i].wgt;
      if (!b) continue;
      for (int m = 0; m < 3; m++) params[nparams++] = g_alloc(&g, b, S_MAIN);
      t->param_bytes += b;
    }

  uint32_t next_input = NONE;
  for (uint32_t it = 0; it < iterations && !g.oom; it++) {
    uint32_t input = next_input != NONE ? next_input : g_alloc(&g, in_bytes, S_MAIN);
    next_input = NONE;
    /* Every fourth iteration a loader thread copies the next batch in on a stream of its own;
     * the main stream frees it (a cross-stream free). */
    int prefetch = it % 4 == 3;

    for (uint32_t i = 0; i < L; i++) {
      const layer_t *l = &ly[i];
      uint64_t a = l->act * batch;
      uint32_t ws = l->ws_fwd ? g_alloc(&g, ws_bytes(a, l->ws_fwd), S_MAIN) : NONE;
      uint32_t tmp = l->tmp ? g_alloc(&g, l->tmp, S_MAIN) : NONE;
      act[i] = g_alloc(&g, a, S_MAIN);
      saved[i] = l->saved ? g_alloc(&g, l->saved, S_MAIN) : NONE;
      g_work(&g, S_MAIN);
      g_free(&g, ws, S_MAIN);
      g_free(&g, tmp, S_MAIN);
      g_done(&g, S_MAIN, 2);
      if (prefetch && i == L / 2) {
        next_input = g_alloc(&g, in_bytes, S_COPY);
        g_work(&g, S_COPY);
      }
      if (prefetch && i == L / 2 + 2) g_done(&g, S_COPY, 0);
    }

    uint32_t loss = g_alloc(&g, 4, S_MAIN);
    g_work(&g, S_MAIN);
    uint32_t gout = g_alloc(&g, ly[L - 1].act * batch, S_MAIN);
    g_free(&g, loss, S_MAIN);

    /* Backward: gradients of the activations come and go; weight gradients stay for the
     * optimizer, and full buckets of them are all-reduced on the communication stream. */
    buckets_t bk = {0};
    for (uint32_t i = L; i-- > 0;) {
      const layer_t *l = &ly[i];
      uint64_t a = l->act * batch;
      uint32_t ws = l->ws_bwd ? g_alloc(&g, ws_bytes(a, l->ws_bwd), S_MAIN) : NONE;
      uint32_t tmp = l->tmp ? g_alloc(&g, l->tmp, S_MAIN) : NONE;
      uint32_t gin = i > 0 ? g_alloc(&g, ly[i - 1].act * batch, S_MAIN) : NONE;
      wg[i] = l->wgt ? g_alloc(&g, l->wgt, S_MAIN) : NONE;
      bg[i] = l->bias ? g_alloc(&g, l->bias, S_MAIN) : NONE;
      g_work(&g, S_MAIN);
      g_free(&g, ws, S_MAIN);
      g_free(&g, tmp, S_MAIN);
      g_free(&g, gout, S_MAIN);
      g_free(&g, act[i], S_MAIN);
      g_free(&g, saved[i], S_MAIN);
      gout = gin;
      buckets_step(&g, &bk, l->wgt + l->bias, i);
      g_done(&g, S_MAIN, 2);
      g_done(&g, S_COMM, 1);
    }
    while (bk.n) g_free(&g, bk.slot[--bk.n], S_COMM);
    g_free(&g, input, S_MAIN);

    /* The optimizer step, then the gradients go. */
    uint32_t norm = g_alloc(&g, 4, S_MAIN);
    for (uint32_t i = 0; i < L; i++) {
      g_free(&g, wg[i], S_MAIN);
      g_free(&g, bg[i], S_MAIN);
      if (i % 8 == 7) g_work(&g, S_MAIN);
    }
    g_work(&g, S_MAIN);
    g_free(&g, norm, S_MAIN);
    g_iter(&g);
  }
  /* Epilogue: an unconsumed prefetched batch, then the parameters. */
  g_free(&g, next_input, S_MAIN);
  for (uint32_t k = 0; k < nparams; k++) g_free(&g, params[k], S_MAIN);
  g_done(&g, WL__BENCH_ALL_STREAMS, 0);
out:
  free(ly);
  free(act);
  free(saved);
  free(wg);
  free(bg);
  free(params);
  return finish(&g);
}

/* ---- the transformer trace ------------------------------------------------------------------*/

/* The tensors one transformer block keeps for backward (bf16 activations, fp32 statistics). */
typedef struct tblock_s {
  uint32_t x, ln1_stats, ln1, qkv, attn, lse, x2, ln2_stats, ln2, fc1, gelu;
  uint32_t cast[4]; /* autocast's bf16 copies of the four weight matrices, saved by the matmuls */
} tblock_t;

/* A GPT-like decoder trained with bf16 autocast and flash attention: per block LayerNorm, QKV
 * projection, attention (which keeps its output and log-sum-exp), output projection, residual,
 * LayerNorm, a 4x MLP with GELU, residual; then the final LayerNorm, tied-embedding logits and a
 * cross-entropy computed in fp32, the largest tensors of the step. Backward walks the blocks in
 * reverse: activation gradients come and go, weight gradients stay for the optimizer, buckets of
 * them go to the communication stream. */
int wl__bench_trace_transformer(wl__bench_trace_t *t, uint64_t seed, uint32_t iterations) {
  memset(t, 0, sizeof *t);
  t->name = "dnn";
  t->model = "transformer";
  t->nstreams = 2;
  t->iterations = iterations;
  gen_t g = {.t = t};
  rng_seed(&g.rng, seed ^ 0x5452414e53464d52ull);
  uint64_t H = 768 + 256 * rng_below(&g.rng, 2), heads = H / 64, S = 1024u << rng_below(&g.rng, 2);
  uint64_t V = 50304, F = 4 * H;
  uint32_t L = 12 + (uint32_t)rng_below(&g.rng, 13);
  /* The batch puts the kept activations at about 4 GiB, as GPT-2 small and medium have at a
   * batch of a few sequences. */
  uint64_t per_sample = S * H * ACT_ELEM * 15 + S * heads * 4 + 4 * S * 4;
  uint64_t batch = (4ull << 30) / (per_sample * L);
  batch = batch < 1 ? 1 : batch > 64 ? 64 : batch;
  uint64_t T = batch * S, act = T * H * ACT_ELEM, stats = T * 4;
  t->layers = L;
  t->batch = (uint32_t)batch;
  t->activation_bytes = per_sample * batch * L;
  uint64_t W[4] = {H * 3 * H, H * H, H * F, F * H}, B[4] = {3 * H, H, F, H};
  tblock_t *blk = calloc(L, sizeof *blk);
  uint32_t *wg = calloc((size_t)L * 10 + 4, sizeof *wg);
  uint32_t *params = calloc(((size_t)L * 10 + 4) * 3, sizeof *params);
  if (!blk || !wg || !params) {
    g.oom = 1;
    goto out;
  }
  /* Parameters (fp32) and Adam's two moments: per block two LayerNorms and four linears; the
   * embedding (tied with the logits), the positions and the final LayerNorm. */
  uint32_t np = 0;
  for (uint32_t i = 0; i <= L; i++) {
    uint64_t sizes[10], n = 0;
    if (i < L) {
      sizes[n++] = 2 * H * 4, sizes[n++] = 2 * H * 4;
      for (int k = 0; k < 4; k++) sizes[n++] = W[k] * 4, sizes[n++] = B[k] * 4;
    } else {
      sizes[n++] = V * H * 4, sizes[n++] = S * H * 4, sizes[n++] = 2 * H * 4;
    }
    for (uint64_t k = 0; k < n; k++) {
      for (int m = 0; m < 3; m++) params[np++] = g_alloc(&g, sizes[k], S_MAIN);
      t->param_bytes += sizes[k];
    }
  }

  for (uint32_t it = 0; it < iterations && !g.oom; it++) {
    uint32_t ids = g_alloc(&g, T * 8, S_MAIN);
    uint32_t x = g_alloc(&g, act, S_MAIN); /* token plus position embeddings */
    g_work(&g, S_MAIN);
    for (uint32_t i = 0; i < L; i++) {
      tblock_t *b = &blk[i];
      b->x = x;
      b->ln1_stats = g_alloc(&g, 2 * stats, S_MAIN);
      b->ln1 = g_alloc(&g, act, S_MAIN);
      b->cast[0] = g_alloc(&g, W[0] * ACT_ELEM, S_MAIN);
      b->qkv = g_alloc(&g, 3 * act, S_MAIN);
      b->attn = g_alloc(&g, act, S_MAIN);
      b->lse = g_alloc(&g, batch * heads * S * 4, S_MAIN);
      b->cast[1] = g_alloc(&g, W[1] * ACT_ELEM, S_MAIN);
      uint32_t proj = g_alloc(&g, act, S_MAIN);
      b->x2 = g_alloc(&g, act, S_MAIN);
      g_free(&g, proj, S_MAIN);
      b->ln2_stats = g_alloc(&g, 2 * stats, S_MAIN);
      b->ln2 = g_alloc(&g, act, S_MAIN);
      b->cast[2] = g_alloc(&g, W[2] * ACT_ELEM, S_MAIN);
      b->fc1 = g_alloc(&g, T * F * ACT_ELEM, S_MAIN);
      b->gelu = g_alloc(&g, T * F * ACT_ELEM, S_MAIN);
      b->cast[3] = g_alloc(&g, W[3] * ACT_ELEM, S_MAIN);
      uint32_t fc2 = g_alloc(&g, act, S_MAIN);
      x = g_alloc(&g, act, S_MAIN);
      g_free(&g, fc2, S_MAIN);
      g_work(&g, S_MAIN);
      g_done(&g, S_MAIN, 2);
    }
    uint32_t lnf_stats = g_alloc(&g, 2 * stats, S_MAIN), lnf = g_alloc(&g, act, S_MAIN);
    uint32_t emb_cast = g_alloc(&g, V * H * ACT_ELEM, S_MAIN);
    uint32_t logits = g_alloc(&g, T * V * ACT_ELEM, S_MAIN);
    uint32_t up = g_alloc(&g, T * V * 4, S_MAIN); /* logits.float() */
    uint32_t logp = g_alloc(&g, T * V * 4, S_MAIN);
    g_free(&g, up, S_MAIN);
    uint32_t loss = g_alloc(&g, 4, S_MAIN);
    g_work(&g, S_MAIN);
    g_done(&g, S_MAIN, 1);

    /* Backward. */
    uint32_t nwg = 0;
    buckets_t bk = {0};
    uint32_t glogp = g_alloc(&g, T * V * 4, S_MAIN);
    g_free(&g, loss, S_MAIN);
    g_free(&g, logp, S_MAIN);
    uint32_t glogits = g_alloc(&g, T * V * ACT_ELEM, S_MAIN);
    g_free(&g, glogp, S_MAIN);
    uint32_t gx = g_alloc(&g, act, S_MAIN);
    wg[nwg++] = g_alloc(&g, V * H * 4, S_MAIN); /* the tied embedding's gradient */
    g_free(&g, glogits, S_MAIN);
    g_free(&g, logits, S_MAIN);
    g_free(&g, emb_cast, S_MAIN);
    g_free(&g, lnf, S_MAIN);
    g_free(&g, lnf_stats, S_MAIN);
    g_free(&g, x, S_MAIN);
    g_work(&g, S_MAIN);
    for (uint32_t i = L; i-- > 0;) {
      tblock_t *b = &blk[i];
      uint64_t grads = 0;
      /* fc2, gelu, fc1 */
      uint32_t ggelu = g_alloc(&g, T * F * ACT_ELEM, S_MAIN);
      wg[nwg++] = g_alloc(&g, W[3] * 4, S_MAIN);
      g_free(&g, b->gelu, S_MAIN);
      g_free(&g, b->cast[3], S_MAIN);
      uint32_t gfc1 = g_alloc(&g, T * F * ACT_ELEM, S_MAIN);
      g_free(&g, ggelu, S_MAIN);
      g_free(&g, b->fc1, S_MAIN);
      uint32_t gln2 = g_alloc(&g, act, S_MAIN);
      wg[nwg++] = g_alloc(&g, W[2] * 4, S_MAIN);
      g_free(&g, gfc1, S_MAIN);
      g_free(&g, b->ln2, S_MAIN);
      g_free(&g, b->cast[2], S_MAIN);
      /* ln2, then the residual's two gradients add up */
      uint32_t part = g_alloc(&g, act, S_MAIN);
      g_free(&g, gln2, S_MAIN);
      g_free(&g, b->ln2_stats, S_MAIN);
      uint32_t gx2 = g_alloc(&g, act, S_MAIN);
      g_free(&g, part, S_MAIN);
      g_free(&g, gx, S_MAIN);
      g_free(&g, b->x2, S_MAIN);
      g_work(&g, S_MAIN);
      g_done(&g, S_MAIN, 2);
      /* projection, attention (flash backward accumulates dq in fp32), qkv */
      uint32_t gattn = g_alloc(&g, act, S_MAIN);
      wg[nwg++] = g_alloc(&g, W[1] * 4, S_MAIN);
      g_free(&g, b->cast[1], S_MAIN);
      uint32_t dq = g_alloc(&g, T * H * 4, S_MAIN);
      uint32_t gqkv = g_alloc(&g, 3 * act, S_MAIN);
      g_free(&g, dq, S_MAIN);
      g_free(&g, gattn, S_MAIN);
      g_free(&g, b->attn, S_MAIN);
      g_free(&g, b->lse, S_MAIN);
      uint32_t gln1 = g_alloc(&g, act, S_MAIN);
      wg[nwg++] = g_alloc(&g, W[0] * 4, S_MAIN);
      g_free(&g, gqkv, S_MAIN);
      g_free(&g, b->qkv, S_MAIN);
      g_free(&g, b->cast[0], S_MAIN);
      g_free(&g, b->ln1, S_MAIN);
      part = g_alloc(&g, act, S_MAIN);
      g_free(&g, gln1, S_MAIN);
      g_free(&g, b->ln1_stats, S_MAIN);
      gx = g_alloc(&g, act, S_MAIN);
      g_free(&g, part, S_MAIN);
      g_free(&g, gx2, S_MAIN);
      g_free(&g, b->x, S_MAIN);
      /* the small gradients: four biases, two LayerNorms */
      for (int k = 0; k < 4; k++) wg[nwg++] = g_alloc(&g, B[k] * 4, S_MAIN), grads += B[k] * 4;
      for (int k = 0; k < 2; k++) wg[nwg++] = g_alloc(&g, 2 * H * 4, S_MAIN), grads += 2 * H * 4;
      for (int k = 0; k < 4; k++) grads += W[k] * 4;
      g_work(&g, S_MAIN);
      buckets_step(&g, &bk, grads, i);
      g_done(&g, S_MAIN, 2);
      g_done(&g, S_COMM, 1);
    }
    wg[nwg++] = g_alloc(&g, S * H * 4, S_MAIN); /* positions */
    g_free(&g, gx, S_MAIN);
    g_free(&g, ids, S_MAIN);
    buckets_step(&g, &bk, V * H * 4, 0);
    while (bk.n) g_free(&g, bk.slot[--bk.n], S_COMM);
    uint32_t norm = g_alloc(&g, 4, S_MAIN);
    for (uint32_t k = 0; k < nwg; k++) {
      g_free(&g, wg[k], S_MAIN);
      if (k % 8 == 7) g_work(&g, S_MAIN);
    }
    g_work(&g, S_MAIN);
    g_free(&g, norm, S_MAIN);
    g_iter(&g);
  }
  for (uint32_t k = 0; k < np; k++) g_free(&g, params[k], S_MAIN);
  g_done(&g, WL__BENCH_ALL_STREAMS, 0);
out:
  free(blk);
  free(wg);
  free(params);
  return finish(&g);
}

/* ---- the random trace -----------------------------------------------------------------------*/

#define RANDOM_STREAMS 4
#define RANDOM_STEP    1000

/* 256 B .. 64 MiB: a power of two chosen uniformly, then uniform within it (log-uniform,
 * without floating point so every platform generates the same trace). */
static uint64_t random_size(rng_t *r) {
  unsigned k = 8 + (unsigned)rng_below(r, 18);
  return ((uint64_t)1 << k) + rng_below(r, (uint64_t)1 << k);
}

int wl__bench_trace_random(wl__bench_trace_t *t, uint64_t seed, uint32_t iterations,
                           size_t live_cap) {
  memset(t, 0, sizeof *t);
  t->name = "random";
  t->nstreams = RANDOM_STREAMS;
  t->iterations = iterations;
  gen_t g = {.t = t};
  rng_seed(&g.rng, seed ^ 0x52414e444f4d2121ull); /* not the DNN trace's sequence */
  uint32_t *live = NULL;
  size_t nlive = 0, live_capn = 0;
  for (uint32_t it = 0; it < iterations && !g.oom; it++) {
    for (int k = 0; k < RANDOM_STEP && !g.oom; k++) {
      int want = nlive == 0 || rng_below(&g.rng, 10) < 6;
      uint64_t size = random_size(&g.rng);
      if (want && g.live + size > live_cap && nlive) want = 0; /* at the cap: free instead */
      if (want) {
        if (grow((void **)&live, &live_capn, nlive + 1, sizeof *live)) {
          g.oom = 1;
          break;
        }
        live[nlive++] = g_alloc(&g, size, (unsigned)rng_below(&g.rng, RANDOM_STREAMS));
      } else {
        size_t idx = rng_below(&g.rng, nlive);
        uint32_t slot = live[idx];
        live[idx] = live[--nlive];
        unsigned s = g.slot_stream[slot];
        /* One free in ten happens on another stream (the block was last used there). */
        if (rng_chance(&g.rng, 1, 10))
          s = (s + 1 + (unsigned)rng_below(&g.rng, RANDOM_STREAMS - 1)) % RANDOM_STREAMS;
        g_free(&g, slot, s);
      }
      if (rng_chance(&g.rng, 1, 8)) g_work(&g, (unsigned)rng_below(&g.rng, RANDOM_STREAMS));
      if (rng_chance(&g.rng, 1, 16)) g_done(&g, (unsigned)rng_below(&g.rng, RANDOM_STREAMS), 1);
    }
    g_iter(&g);
  }
  while (nlive && !g.oom) {
    uint32_t slot = live[--nlive];
    g_free(&g, slot, g.slot_stream[slot]);
  }
  g_done(&g, WL__BENCH_ALL_STREAMS, 0);
  free(live);
  return finish(&g);
}

void wl__bench_trace_free(wl__bench_trace_t *t) {
  free(t->ops);
  t->ops = NULL;
  t->nops = t->cap = 0;
}
