/* The CPU GEMM: BLIS-style blocking (NC x KC panels of B, MC x KC blocks of A, packed), the 12x32
 * micro-kernel tile, and a 2-D split of C across the pool's threads. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Sized for a 48 KiB L1 (a KC x NR panel of B is 32 KiB), a 512 KiB+ L2 (the MC x KC block of A,
 * 168 KiB) and a shared L3 (the KC x NC panel of B); the values BLIS uses for Haswell/Zen. */
#define MC 168
#define KC 256
#define NC 4064

/* ------------------------------------------------------------------------------------------------
 * Packing of plain row-major matrices
 * ----------------------------------------------------------------------------------------------*/

/* op(A) = A: rows are contiguous in k, so a panel reads MR rows side by side. */
static void pack_a_n(const wl__operand_t *op, size_t i0, size_t mc, size_t p0, size_t kc,
                     float *dst) {
  const size_t lda = op->ld;
  for (size_t ip = 0; ip < mc; ip += WL__MR, dst += kc * WL__MR) {
    size_t mr = mc - ip < WL__MR ? mc - ip : WL__MR;
    const float *row[WL__MR];
    for (size_t i = 0; i < WL__MR; i++) row[i] = op->p + (i0 + ip + (i < mr ? i : 0)) * lda + p0;
    if (mr == WL__MR) {
      for (size_t p = 0; p < kc; p++)
        for (size_t i = 0; i < WL__MR; i++) dst[p * WL__MR + i] = row[i][p];
    } else {
      for (size_t p = 0; p < kc; p++)
        for (size_t i = 0; i < WL__MR; i++) dst[p * WL__MR + i] = i < mr ? row[i][p] : 0.0f;
    }
  }
}

/* op(A) = A^T: A is k x m, so each k step of a panel is MR contiguous floats. */
static void pack_a_t(const wl__operand_t *op, size_t i0, size_t mc, size_t p0, size_t kc,
                     float *dst) {
  const size_t lda = op->ld;
  for (size_t ip = 0; ip < mc; ip += WL__MR, dst += kc * WL__MR) {
    size_t mr = mc - ip < WL__MR ? mc - ip : WL__MR;
    const float *src = op->p + p0 * lda + i0 + ip;
    for (size_t p = 0; p < kc; p++, src += lda) {
      size_t i = 0;
      for (; i < mr; i++) dst[p * WL__MR + i] = src[i];
      for (; i < WL__MR; i++) dst[p * WL__MR + i] = 0.0f;
    }
  }
}

/* op(B) = B: B is k x n, each k step of a panel is NR contiguous floats. */
static void pack_b_n(const wl__operand_t *op, size_t p0, size_t kc, size_t j0, size_t nc,
                     float *dst) {
  const size_t ldb = op->ld;
  for (size_t jp = 0; jp < nc; jp += WL__NR, dst += kc * WL__NR) {
    size_t nr = nc - jp < WL__NR ? nc - jp : WL__NR;
    const float *src = op->p + p0 * ldb + j0 + jp;
    if (nr == WL__NR) {
      for (size_t p = 0; p < kc; p++, src += ldb)
        memcpy(dst + p * WL__NR, src, sizeof(float) * WL__NR);
    } else {
      for (size_t p = 0; p < kc; p++, src += ldb) {
        size_t j = 0;
        for (; j < nr; j++) dst[p * WL__NR + j] = src[j];
        for (; j < WL__NR; j++) dst[p * WL__NR + j] = 0.0f;
      }
    }
  }
}

/* op(B) = B^T: B is n x k; read each of the NR rows contiguously, write the panel strided (it
 * is 16 KiB and stays in L1). */
static void pack_b_t(const wl__operand_t *op, size_t p0, size_t kc, size_t j0, size_t nc,
                     float *dst) {
  const size_t ldb = op->ld;
  for (size_t jp = 0; jp < nc; jp += WL__NR, dst += kc * WL__NR) {
    size_t nr = nc - jp < WL__NR ? nc - jp : WL__NR;
    for (size_t j = 0; j < WL__NR; j++) {
      if (j < nr) {
        const float *src = op->p + (j0 + jp + j) * ldb + p0;
        for (size_t p = 0; p < kc; p++) dst[p * WL__NR + j] = src[p];
      } else {
        for (size_t p = 0; p < kc; p++) dst[p * WL__NR + j] = 0.0f;
      }
    }
  }
}

void wl__operand_a(wl__operand_t *op, wl_trans_t trans, const float *a, size_t lda) {
  op->pack = trans == WL_TRANS ? pack_a_t : pack_a_n;
  op->p = a;
  op->ld = lda;
  op->ctx = NULL;
}

void wl__operand_b(wl__operand_t *op, wl_trans_t trans, const float *b, size_t ldb) {
  op->pack = trans == WL_TRANS ? pack_b_t : pack_b_n;
  op->p = b;
  op->ld = ldb;
  op->ctx = NULL;
}

/* ------------------------------------------------------------------------------------------------
 * Per-thread packing buffers: kept between calls (a pool worker lives as long as the process),
 * freed when an application thread exits.
 * ----------------------------------------------------------------------------------------------*/

static pthread_key_t ws_key;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;
static _Thread_local float *ws_buf;
static _Thread_local size_t ws_cap; /* floats */

static void ws_free(void *p) {
  free(p);
}

static void ws_key_init(void) {
  pthread_key_create(&ws_key, ws_free);
}

static float *workspace(size_t floats) {
  if (floats <= ws_cap) return ws_buf;
  pthread_once(&ws_once, ws_key_init);
  size_t bytes = (floats * sizeof(float) + 63) & ~(size_t)63;
  float *p = aligned_alloc(64, bytes);
  if (!p) return NULL;
  free(ws_buf);
  ws_buf = p;
  ws_cap = bytes / sizeof(float);
  pthread_setspecific(ws_key, p);
  return p;
}

/* ------------------------------------------------------------------------------------------------
 * The driver
 * ----------------------------------------------------------------------------------------------*/

typedef struct gemm_job_s {
  size_t m, n, k;
  float alpha, beta;
  const wl__operand_t *a, *b;
  float *c;
  size_t ldc;
  int tm, tn; /* the grid of C tiles */
  int next;   /* the next tile to take */
  int err;
  float *parts;   /* K split: (threads - 1) partial m x n sums */
  int parts_used; /* threads that ran the split */
} gemm_job_t;

static size_t round_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

/* C[m0..m1, n0..n1) = alpha * A[:, kb..ke) B[kb..ke, :) + beta * C, on one thread. */
static int gemm_tile(const gemm_job_t *job, size_t m0, size_t m1, size_t n0, size_t n1, size_t kb,
                     size_t ke, float *c, size_t ldc, float beta0) {
  const size_t k = ke - kb;
  const size_t kcmax = k < KC ? k : KC;
  const size_t mcmax = round_up(m1 - m0 < MC ? m1 - m0 : MC, WL__MR);
  const size_t ncmax = round_up(n1 - n0 < NC ? n1 - n0 : NC, WL__NR);
  const size_t asize = round_up(kcmax * mcmax, 16); /* keeps bp 64-byte aligned */
  float *ws = workspace(asize + kcmax * ncmax);
  if (!ws) return -ENOMEM;
  float *ap = ws, *bp = ws + asize;
  wl__ukernel_fn ukr = wl__ukernel();

  for (size_t jc = n0; jc < n1; jc += NC) {
    size_t nc = n1 - jc < NC ? n1 - jc : NC;
    for (size_t pc = kb; pc < ke; pc += KC) {
      size_t kc = ke - pc < KC ? ke - pc : KC;
      float beta = pc == kb ? beta0 : 1.0f; /* later K blocks accumulate */
      job->b->pack(job->b, pc, kc, jc, nc, bp);
      for (size_t ic = m0; ic < m1; ic += MC) {
        size_t mc = m1 - ic < MC ? m1 - ic : MC;
        job->a->pack(job->a, ic, mc, pc, kc, ap);
        for (size_t jr = 0; jr < nc; jr += WL__NR) {
          size_t nr = nc - jr < WL__NR ? nc - jr : WL__NR;
          const float *bpan = bp + jr * kc;
          for (size_t ir = 0; ir < mc; ir += WL__MR) {
            size_t mr = mc - ir < WL__MR ? mc - ir : WL__MR;
            ukr(kc, ap + ir * kc, bpan, c + (ic + ir) * ldc + jc + jr, ldc, job->alpha, beta, mr,
                nr);
          }
        }
      }
    }
  }
  return 0;
}

/* Threads take tiles as they finish the last one, so a thread slowed by another process on its
 * core does not hold the others up. */
static void gemm_task(void *arg, int tid, int nt) {
  gemm_job_t *job = arg;
  int tiles = job->tm * job->tn;
  for (;;) {
    int t = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
    if (t >= tiles) break;
    size_t m0, m1, n0, n1;
    wl__split(job->m, WL__MR, job->tm, t / job->tn, &m0, &m1);
    wl__split(job->n, WL__NR, job->tn, t % job->tn, &n0, &n1);
    if (m0 >= m1 || n0 >= n1) continue;
    int rc = gemm_tile(job, m0, m1, n0, n1, 0, job->k, job->c, job->ldc, job->beta);
    if (rc) __atomic_store_n(&job->err, rc, __ATOMIC_RELAXED);
  }
}

/* A small C with a long K (the filter gradient of a first convolution layer: 32 x 25 outputs,
 * 50 000 pixels) has too few tiles for the threads: split K instead. Thread 0 computes C with its
 * beta, the others a partial sum each, added in thread order afterwards (so the result depends on
 * the thread count, never on timing). */
static void gemm_ksplit_task(void *arg, int tid, int nt) {
  gemm_job_t *job = arg;
  const size_t mn = job->m * job->n;
  size_t kb, ke;
  wl__split(job->k, KC, nt, tid, &kb, &ke);
  if (tid == 0) __atomic_store_n(&job->parts_used, nt, __ATOMIC_RELAXED);
  int rc = 0;
  if (tid == 0)
    rc = gemm_tile(job, 0, job->m, 0, job->n, kb, ke, job->c, job->ldc, job->beta);
  else if (kb < ke)
    rc = gemm_tile(job, 0, job->m, 0, job->n, kb, ke, job->parts + (size_t)(tid - 1) * mn, job->n,
                   0.0f);
  else
    memset(job->parts + (size_t)(tid - 1) * mn, 0, mn * sizeof(float));
  if (rc) __atomic_store_n(&job->err, rc, __ATOMIC_RELAXED);
}

/* The tm x tn grid for t threads: smallest per-thread tile, counting packing (proportional to the
 * tile's perimeter) against the multiply (its area). */
static void choose_grid(size_t m, size_t n, int t, int *tm, int *tn) {
  size_t pm = (m + WL__MR - 1) / WL__MR, pn = (n + WL__NR - 1) / WL__NR;
  for (; t > 1; t--) {
    double best = 0;
    int bm = 0;
    for (int i = 1; i <= t; i++) {
      if (t % i) continue;
      int j = t / i;
      if ((size_t)i > pm || (size_t)j > pn) continue;
      double rows = (double)((pm + i - 1) / i * WL__MR), cols = (double)((pn + j - 1) / j * WL__NR);
      double cost = rows * cols + 8.0 * (rows + cols);
      if (!bm || cost < best) best = cost, bm = i;
    }
    if (bm) {
      *tm = bm;
      *tn = t / bm;
      return;
    }
  }
  *tm = *tn = 1;
}

int wl__gemm(size_t m, size_t n, size_t k, float alpha, const wl__operand_t *a,
             const wl__operand_t *b, float beta, float *c, size_t ldc) {
  if (m == 0 || n == 0) return 0;
  if (k == 0 || alpha == 0.0f) {
    for (size_t i = 0; i < m; i++) {
      float *row = c + i * ldc;
      if (beta == 0.0f)
        memset(row, 0, n * sizeof(float));
      else if (beta != 1.0f)
        for (size_t j = 0; j < n; j++) row[j] *= beta;
    }
    return 0;
  }
  gemm_job_t job = {m, n, k, alpha, beta, a, b, c, ldc, 1, 1, 0, 0, NULL, 0};
  /* Threads only where each gets 4 MFLOP or more (some 50 us), so waking them pays. */
  double flops = 2.0 * (double)m * (double)n * (double)k;
  int t = wl_kern_threads();
  if ((double)t * 4e6 > flops) t = (int)(flops / 4e6);
  if (t < 1) t = 1;
  /* Up to 4 tiles a thread for balance, while tiles stay big enough (about MC/2 x 2 NR-blocks of
   * 128) that their packing is still a small part of their work. */
  int tiles = t;
  if (t > 1) {
    size_t most = (m / 96 ? m / 96 : 1) * (n / 128 ? n / 128 : 1);
    tiles = 4 * t;
    if ((size_t)tiles > most) tiles = (int)most;
    if (tiles < t) tiles = t;
  }
  if (t > 1 && m * n <= 64 * 64 && k >= (size_t)t * 4 * KC) {
    job.parts = malloc((size_t)(t - 1) * m * n * sizeof(float));
    if (job.parts) {
      wl__parallel(gemm_ksplit_task, &job, t);
      for (int p = 0; job.err == 0 && p < job.parts_used - 1; p++)
        for (size_t i = 0; i < m; i++) {
          const float *src = job.parts + (size_t)p * m * n + i * n;
          float *dst = c + i * ldc;
          for (size_t j = 0; j < n; j++) dst[j] += src[j];
        }
      free(job.parts);
      return job.err;
    } /* no memory for the partial sums: fall back to tiles */
  }
  choose_grid(m, n, tiles, &job.tm, &job.tn);
  wl__parallel(gemm_task, &job, t < job.tm * job.tn ? t : job.tm * job.tn);
  return job.err;
}

int wl_sgemm(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k, float alpha,
             const float *a, size_t lda, const float *b, size_t ldb, float beta, float *c,
             size_t ldc) {
  if ((ta != WL_NOTRANS && ta != WL_TRANS) || (tb != WL_NOTRANS && tb != WL_TRANS)) return -EINVAL;
  if (m == 0 || n == 0) return 0;
  if (!c || ldc < n) return -EINVAL;
  if (k > 0) {
    if (!a || !b) return -EINVAL;
    if (lda < (ta == WL_TRANS ? m : k) || ldb < (tb == WL_TRANS ? k : n)) return -EINVAL;
  }
  wl__operand_t oa, ob;
  wl__operand_a(&oa, ta, a, lda);
  wl__operand_b(&ob, tb, b, ldb);
  return wl__gemm(m, n, k, alpha, &oa, &ob, beta, c, ldc);
}
