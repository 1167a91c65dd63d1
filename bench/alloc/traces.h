/* Allocation traces for wl-bench-alloc: DNN-shaped and random sequences, generated from a seed. */
#ifndef WAVELET_BENCH_ALLOC_TRACES_H
#define WAVELET_BENCH_ALLOC_TRACES_H

#include <stddef.h>
#include <stdint.h>

/* What one trace step does. Only ALLOC and FREE are allocator calls (and timed); the others
 * model the GPU so that liballoc's stream-ordered reuse sees work complete with a lag. */
typedef enum wl__bench_op_kind_e {
  WL__OP_ALLOC = 1, /* slot = allocate size bytes on stream */
  WL__OP_FREE,      /* free slot on stream */
  WL__OP_WORK,      /* enqueue one kernel on stream */
  WL__OP_DONE,      /* the GPU has finished stream's work but the last `lag` kernels */
  WL__OP_ITER       /* end of an iteration (all work done): where the trim variant trims */
} wl__bench_op_kind_t;

/* DONE on every stream. */
#define WL__BENCH_ALL_STREAMS 0xffu
#define WL__BENCH_MAX_STREAMS 8

typedef struct wl__bench_op_s {
  uint64_t size;  /* ALLOC */
  uint32_t slot;  /* ALLOC, FREE: index into the replay's pointer table */
  uint8_t kind;   /* wl__bench_op_kind_t */
  uint8_t stream; /* 0 .. nstreams-1, or WL__BENCH_ALL_STREAMS for DONE */
  uint16_t lag;   /* DONE */
} wl__bench_op_t;

typedef struct wl__bench_trace_s {
  const char *name;
  wl__bench_op_t *ops;
  size_t nops, cap;
  uint32_t nslots, nstreams, iterations;
  /* Ops in [measure_from, measure_to) are measured: after the first (warm-up) iteration, before
   * the epilogue that frees what is left. Samples: the ALLOC/FREE ops among them, counted from
   * the first ALLOC/FREE of the trace. */
  size_t measure_from, measure_to;
  size_t sample_from, sample_to, nsamples_total;
  uint64_t allocs, frees, cross_stream_frees;
  size_t live_peak;          /* requested bytes, as liballoc counts live_peak */
  size_t min_size, max_size; /* of the allocations */
  /* DNN only: the model ("cnn" or "transformer"), its layers (blocks) and batch. */
  const char *model;
  uint32_t layers, batch;
  size_t param_bytes, activation_bytes;
} wl__bench_trace_t;

/* A DNN-shaped trace: a CNN of 40-120 layers (from the seed) at a batch size that puts the
 * activations at a few GiB, `iterations` training iterations. 0 or -ENOMEM. */
int wl__bench_trace_dnn(wl__bench_trace_t *t, uint64_t seed, uint32_t iterations);

/* A DNN-shaped trace of a GPT-like transformer: 12-24 blocks of width 768 or 1024 on 1024 or 2048
 * tokens (from the seed) at a batch that puts the kept activations near 4 GiB, tied-embedding
 * logits over a 50304-token vocabulary, `iterations` iterations. Named "dnn" with model
 * "transformer". 0 or -ENOMEM. */
int wl__bench_trace_transformer(wl__bench_trace_t *t, uint64_t seed, uint32_t iterations);

/* A random trace: `iterations` steps of 1000 allocator calls, sizes 256 B - 64 MiB spread
 * evenly over the powers of two, 60 % allocations, four streams, live bytes capped at
 * live_cap. 0 or -ENOMEM. */
int wl__bench_trace_random(wl__bench_trace_t *t, uint64_t seed, uint32_t iterations,
                           size_t live_cap);

void wl__bench_trace_free(wl__bench_trace_t *t);

#endif
