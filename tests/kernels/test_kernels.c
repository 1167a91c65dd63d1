/* Tests of the CPU kernels: each against a naive double-precision loop on random shapes (odd
 * sizes, every transposition, padding, strides, dilation), and every layer's backward pass
 * against finite differences of its double-precision forward. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ref.h"
#include "wltest.h"

/* From the library's internals (kernels/src/internal.h): the static library exports it. */
void wl__ukernel_select(int limit);

/* ------------------------------------------------------------------------------------------------
 * GEMM
 * ----------------------------------------------------------------------------------------------*/

/* Runs one GEMM and returns its worst error in units of the float rounding bound (<= 1 passes),
 * or a large value when the padding of C was touched. */
static double gemm_case(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k, float alpha,
                        float beta, size_t pad) {
  size_t arows = ta == WL_TRANS ? k : m, acols = ta == WL_TRANS ? m : k;
  size_t brows = tb == WL_TRANS ? n : k, bcols = tb == WL_TRANS ? k : n;
  size_t lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
  float *a = ref_alloc(arows * lda), *b = ref_alloc(brows * ldb);
  float *c = ref_alloc(m * ldc), *c0 = ref_alloc(m * ldc);
  double *want = ref_dalloc(m * n), *absum = ref_dalloc(m * n);
  ref_fill(a, arows * lda, -1, 1);
  ref_fill(b, brows * ldb, -1, 1);
  ref_fill(c0, m * ldc, -1, 1);
  for (size_t i = 0; i < m; i++)
    for (size_t j = n; j < ldc; j++) c0[i * ldc + j] = 12345.0f; /* the padding must survive */
  if (beta == 0.0f)
    for (size_t i = 0; i < m; i++)
      for (size_t j = 0; j < n; j++) c0[i * ldc + j] = NAN; /* beta = 0 must not read C */
  memcpy(c, c0, m * ldc * sizeof(float));
  ref_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want, absum);
  int rc = wl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  double worst = rc == 0 ? 0.0 : 1e30;
  for (size_t i = 0; i < m; i++) {
    for (size_t j = 0; j < n; j++) {
      double bound = 2.0 * (double)(k + 2) * FLT_EPSILON * absum[i * n + j] + 1e-30;
      double e = fabs(c[i * ldc + j] - want[i * n + j]) / bound;
      if (!(e <= worst) && !isnan(worst)) worst = e; /* a NaN stays the worst */
    }
    for (size_t j = n; j < ldc; j++)
      if (c[i * ldc + j] != 12345.0f) worst = 1e30;
  }
  free(a), free(b), free(c), free(c0), free(want), free(absum);
  return worst;
}

static size_t odd_size(int max) {
  /* Sizes around the kernel's tile edges (MR 6, NR 16, MC 168, KC 256) and random ones. */
  static const size_t edges[] = {1, 2, 5, 6, 7, 15, 16, 17, 31, 33, 167, 168, 169, 255, 257};
  if (ref_u32() % 2) {
    size_t e = edges[ref_u32() % (sizeof edges / sizeof *edges)];
    if ((int)e <= max) return e;
  }
  return (size_t)ref_int(1, max);
}

static void test_gemm_random(void) {
  static const int threads[] = {1, 2, 3};
  int bad = 0;
  for (int it = 0; it < 90; it++) {
    wl_trans_t ta = (wl_trans_t)(it & 1), tb = (wl_trans_t)((it >> 1) & 1);
    size_t m = odd_size(200), n = odd_size(200), k = odd_size(300);
    float alpha = ref_uniform(-2, 2);
    float beta = it % 3 == 0 ? 0.0f : it % 3 == 1 ? 1.0f : ref_uniform(-2, 2);
    size_t pad = (size_t)ref_int(0, 3);
    wl_kern_set_threads(threads[it % 3]);
    double e = gemm_case(ta, tb, m, n, k, alpha, beta, pad);
    if (!(e <= 1.0) && bad++ < 5)
      fprintf(stderr, "gemm %c%c m=%zu n=%zu k=%zu alpha=%g beta=%g pad=%zu threads=%d: err %g\n",
              ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, beta, pad, threads[it % 3], e);
  }
  wl_kern_set_threads(0);
  CU_ASSERT_EQUAL(bad, 0);
}

/* Past every blocking boundary at once (several MC, KC and NR blocks) and on several threads;
 * then a small C with a long K, which the threads split along K. */
static void test_gemm_large(void) {
  wl_kern_set_threads(2);
  for (int t = 0; t < 4; t++) {
    double e = gemm_case((wl_trans_t)(t & 1), (wl_trans_t)(t >> 1), 389, 301, 613, 1.0f, 0.5f, 1);
    CU_ASSERT(e <= 1.0);
    if (!(e <= 1.0)) fprintf(stderr, "large gemm variant %d: err %g\n", t, e);
  }
  static const size_t ksplit[][3] = {{32, 25, 20000}, {13, 40, 40000}, {60, 64, 4100}};
  for (int t = 0; t < 3; t++) {
    wl_kern_set_threads(2 + t);
    double e = gemm_case((wl_trans_t)(t & 1), WL_TRANS, ksplit[t][0], ksplit[t][1], ksplit[t][2],
                         0.75f, t == 0 ? 0.0f : -1.5f, (size_t)t);
    CU_ASSERT(e <= 1.0);
    if (!(e <= 1.0)) fprintf(stderr, "k-split gemm %d: err %g\n", t, e);
  }
  wl_kern_set_threads(0);
}

/* A micro-kernel this CPU would not otherwise run: limit 1 the portable one, 2 the AVX2 one
 * (where AVX-512 is chosen); gemm through it on odd shapes (edge tiles of every kind). */
static void kernel_cases(int limit, const char *prefix) {
  wl__ukernel_select(limit);
  if (strncmp(wl_kern_isa(), prefix, strlen(prefix)) != 0) {
    fprintf(stderr, "(%s kernel not run: this CPU chose %s)", prefix, wl_kern_isa());
    wl__ukernel_select(0);
    return;
  }
  int bad = 0;
  for (int it = 0; it < 12; it++) {
    size_t m = odd_size(100), n = odd_size(100), k = odd_size(300);
    double e = gemm_case((wl_trans_t)(it & 1), (wl_trans_t)((it >> 1) & 1), m, n, k, 1.5f,
                         it % 2 ? 0.0f : -0.5f, 1);
    if (!(e <= 1.0) && bad++ < 3)
      fprintf(stderr, "%s m=%zu n=%zu k=%zu: err %g\n", prefix, m, n, k, e);
  }
  wl__ukernel_select(0);
  CU_ASSERT_EQUAL(bad, 0);
}

static void test_gemm_generic_kernel(void) {
  wl__ukernel_select(1);
  CU_ASSERT_STRING_EQUAL(wl_kern_isa(), "generic 12x32");
  kernel_cases(1, "generic");
}

static void test_gemm_avx2_kernel(void) {
  kernel_cases(2, "avx2");
}

static void test_gemm_edges(void) {
  float a[12], b[12], c[12];
  ref_fill(a, 12, -1, 1);
  ref_fill(b, 12, -1, 1);
  for (int i = 0; i < 12; i++) c[i] = (float)i;
  /* k = 0: C = beta C. */
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, 3, 4, 0, 1.0f, NULL, 1, NULL, 4, 2.0f, c, 4), 0);
  for (int i = 0; i < 12; i++) CU_ASSERT_EQUAL(c[i], 2.0f * (float)i);
  /* alpha = 0, beta = 0: zero, without reading A, B or C. */
  for (int i = 0; i < 12; i++) c[i] = NAN;
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, 3, 4, 3, 0.0f, a, 3, b, 4, 0.0f, c, 4), 0);
  for (int i = 0; i < 12; i++) CU_ASSERT_EQUAL(c[i], 0.0f);
  /* m = 0 or n = 0: nothing, even with NULL pointers. */
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, 0, 4, 3, 1.0f, NULL, 3, NULL, 4, 0.0f, NULL, 4),
                  0);
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, 3, 0, 3, 1.0f, NULL, 3, NULL, 4, 0.0f, NULL, 4),
                  0);
  /* Bad leading dimensions, NULLs, bad enums. */
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, 3, 4, 3, 1.0f, a, 2, b, 4, 0.0f, c, 4), -EINVAL);
  CU_ASSERT_EQUAL(wl_sgemm(WL_TRANS, WL_NOTRANS, 3, 4, 3, 1.0f, a, 2, b, 4, 0.0f, c, 4), -EINVAL);
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, 3, 4, 3, 1.0f, a, 3, b, 3, 0.0f, c, 4), -EINVAL);
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_TRANS, 3, 4, 3, 1.0f, a, 3, b, 2, 0.0f, c, 4), -EINVAL);
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, 3, 4, 3, 1.0f, a, 3, b, 4, 0.0f, c, 3), -EINVAL);
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, 3, 4, 3, 1.0f, NULL, 3, b, 4, 0.0f, c, 4),
                  -EINVAL);
  CU_ASSERT_EQUAL(wl_sgemm((wl_trans_t)7, WL_NOTRANS, 3, 4, 3, 1.0f, a, 3, b, 4, 0.0f, c, 4),
                  -EINVAL);
}

/* The split of C across threads must not change a single bit (each element sees the same
 * sequence of operations), and the thread count setting is checked. */
static void test_threads(void) {
  CU_ASSERT_EQUAL(wl_kern_set_threads(-1), -EINVAL);
  CU_ASSERT_EQUAL(wl_kern_set_threads(100000), -EINVAL);
  CU_ASSERT_EQUAL(wl_kern_set_threads(3), 0);
  CU_ASSERT_EQUAL(wl_kern_threads(), 3);
  CU_ASSERT_EQUAL(wl_kern_set_threads(0), 0);
  CU_ASSERT(wl_kern_threads() >= 1);
  CU_ASSERT_PTR_NOT_NULL(wl_kern_isa());
  fprintf(stderr, "micro-kernel: %s, default threads %d\n", wl_kern_isa(), wl_kern_threads());

  size_t m = 301, n = 257, k = 129;
  float *a = ref_alloc(m * k), *b = ref_alloc(k * n), *c1 = ref_alloc(m * n),
        *c3 = ref_alloc(m * n);
  ref_fill(a, m * k, -1, 1);
  ref_fill(b, k * n, -1, 1);
  wl_kern_set_threads(1);
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_TRANS, m, n, k, 1.0f, a, k, b, k, 0.0f, c1, n), 0);
  wl_kern_set_threads(3);
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_TRANS, m, n, k, 1.0f, a, k, b, k, 0.0f, c3, n), 0);
  CU_ASSERT_EQUAL(memcmp(c1, c3, m * n * sizeof(float)), 0);
  wl_kern_set_threads(0);
  free(a), free(b), free(c1), free(c3);
}

typedef struct concurrent_s {
  size_t m, n, k;
  const float *a, *b;
  float *c;
  int rc;
} concurrent_t;

static void *concurrent_main(void *p) {
  concurrent_t *t = p;
  for (int i = 0; i < 5 && t->rc == 0; i++)
    t->rc = wl_sgemm(WL_NOTRANS, WL_NOTRANS, t->m, t->n, t->k, 1.0f, t->a, t->k, t->b, t->n, 0.0f,
                     t->c, t->n);
  return NULL;
}

/* Application threads calling at once: one gets the pool, the others run alone; all correct. */
static void test_concurrent_callers(void) {
  enum { T = 3 };
  size_t m = 190, n = 170, k = 150;
  float *a = ref_alloc(m * k), *b = ref_alloc(k * n);
  double *want = ref_dalloc(m * n), *absum = ref_dalloc(m * n);
  ref_fill(a, m * k, -1, 1);
  ref_fill(b, k * n, -1, 1);
  ref_gemm(WL_NOTRANS, WL_NOTRANS, m, n, k, 1.0, a, k, b, n, 0.0, NULL, n, want, absum);
  concurrent_t ts[T];
  pthread_t th[T];
  wl_kern_set_threads(2);
  for (int i = 0; i < T; i++) {
    ts[i] = (concurrent_t){m, n, k, a, b, ref_alloc(m * n), 0};
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, concurrent_main, &ts[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    CU_ASSERT_EQUAL(ts[i].rc, 0);
    CU_ASSERT(ref_err(ts[i].c, want, m * n, 1e-4, 1e-4) <= 1.0);
    free(ts[i].c);
  }
  wl_kern_set_threads(0);
  free(a), free(b), free(want), free(absum);
}

/* The pool's workers do not survive fork(): the child must rebuild the pool, not hang on it. */
static void test_fork_child(void) {
  size_t m = 200, n = 200, k = 200;
  float *a = ref_alloc(m * k), *b = ref_alloc(k * n), *c = ref_alloc(m * n), *cc = ref_alloc(m * n);
  ref_fill(a, m * k, -1, 1);
  ref_fill(b, k * n, -1, 1);
  wl_kern_set_threads(2);
  CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n), 0);
  pid_t pid = fork();
  CU_ASSERT_FATAL(pid >= 0);
  if (pid == 0) {
    alarm(60); /* a hang fails the test instead of stalling it */
    int rc = wl_sgemm(WL_NOTRANS, WL_NOTRANS, m, n, k, 1.0f, a, k, b, n, 0.0f, cc, n);
    _exit(rc == 0 && memcmp(c, cc, m * n * sizeof(float)) == 0 ? 0 : 1);
  }
  int status = 0;
  CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
  CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  wl_kern_set_threads(0);
  free(a), free(b), free(c), free(cc);
}

/* ------------------------------------------------------------------------------------------------
 * Linear layer (GEMM + bias): y = x W^T + b, checked by finite differences
 * ----------------------------------------------------------------------------------------------*/

static double dot_d(const double *a, const double *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* L = sum g . (x W^T + b) in double. */
static double linear_loss(size_t bn, size_t in, size_t out, const double *x, const double *w,
                          const double *b, const double *g) {
  double s = 0;
  for (size_t i = 0; i < bn; i++)
    for (size_t o = 0; o < out; o++) {
      double y = b[o];
      for (size_t j = 0; j < in; j++) y += x[i * in + j] * w[o * in + j];
      s += g[i * out + o] * y;
    }
  return s;
}

/* Central difference of f at every element of v, compared with the analytic gradient. */
typedef double (*loss_fn)(void *ctx);
static double fd_check(loss_fn f, void *ctx, double *v, size_t n, const float *grad, double eps,
                       double tol) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double save = v[i];
    v[i] = save + eps;
    double lp = f(ctx);
    v[i] = save - eps;
    double lm = f(ctx);
    v[i] = save;
    double num = (lp - lm) / (2 * eps);
    double e = fabs(num - grad[i]) / (tol * (1.0 + fabs(num)));
    if (!(e <= worst) && !isnan(worst)) worst = e; /* a NaN stays the worst */
  }
  return worst;
}

typedef struct linear_ctx_s {
  size_t bn, in, out;
  double *x, *w, *b, *g;
} linear_ctx_t;

static double linear_loss_ctx(void *p) {
  linear_ctx_t *c = p;
  return linear_loss(c->bn, c->in, c->out, c->x, c->w, c->b, c->g);
}

static void test_linear_gradcheck(void) {
  for (int it = 0; it < 4; it++) {
    size_t bn = (size_t)ref_int(1, 9), in = (size_t)ref_int(1, 23), out = (size_t)ref_int(1, 19);
    float *x = ref_alloc(bn * in), *w = ref_alloc(out * in), *b = ref_alloc(out);
    float *y = ref_alloc(bn * out), *g = ref_alloc(bn * out);
    float *dx = ref_alloc(bn * in), *dw = ref_alloc(out * in), *db = ref_alloc(out);
    ref_fill(x, bn * in, -1, 1), ref_fill(w, out * in, -1, 1), ref_fill(b, out, -1, 1);
    ref_fill(g, bn * out, -1, 1);
    /* Forward: y = x W^T + b. Backward: dx = g W, dW = g^T x, db = column sums of g. */
    CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_TRANS, bn, out, in, 1, x, in, w, in, 0, y, out), 0);
    CU_ASSERT_EQUAL(wl_bias_add(bn, out, y, b), 0);
    CU_ASSERT_EQUAL(wl_sgemm(WL_NOTRANS, WL_NOTRANS, bn, in, out, 1, g, out, w, in, 0, dx, in), 0);
    CU_ASSERT_EQUAL(wl_sgemm(WL_TRANS, WL_NOTRANS, out, in, bn, 1, g, out, x, in, 0, dw, in), 0);
    CU_ASSERT_EQUAL(wl_bias_grad(bn, out, g, db), 0);
    linear_ctx_t c = {bn,
                      in,
                      out,
                      ref_dalloc(bn * in),
                      ref_dalloc(out * in),
                      ref_dalloc(out),
                      ref_dalloc(bn * out)};
    ref_to_double(x, c.x, bn * in), ref_to_double(w, c.w, out * in), ref_to_double(b, c.b, out);
    ref_to_double(g, c.g, bn * out);
    /* The forward too: L(x) against sum g.y. */
    double *yd = ref_dalloc(bn * out);
    ref_to_double(y, yd, bn * out);
    CU_ASSERT(fabs(dot_d(yd, c.g, bn * out) - linear_loss_ctx(&c)) <=
              1e-4 * (1.0 + (double)(bn * out * in)));
    CU_ASSERT(fd_check(linear_loss_ctx, &c, c.x, bn * in, dx, 1e-3, 1e-4) <= 1.0);
    CU_ASSERT(fd_check(linear_loss_ctx, &c, c.w, out * in, dw, 1e-3, 1e-4) <= 1.0);
    CU_ASSERT(fd_check(linear_loss_ctx, &c, c.b, out, db, 1e-3, 1e-4) <= 1.0);
    free(x), free(w), free(b), free(y), free(g), free(dx), free(dw), free(db), free(yd);
    free(c.x), free(c.w), free(c.b), free(c.g);
  }
}

/* ------------------------------------------------------------------------------------------------
 * Convolution
 * ----------------------------------------------------------------------------------------------*/

static wl_conv2d_t random_conv(int maxn, int maxhw, int maxc) {
  for (;;) {
    wl_conv2d_t cv = {0};
    cv.n = ref_int(1, maxn);
    cv.h = ref_int(1, maxhw);
    cv.w = ref_int(1, maxhw);
    cv.c = ref_int(1, maxc);
    cv.k = ref_int(1, maxc);
    cv.r = ref_int(1, 5);
    cv.s = ref_int(1, 5);
    cv.pad_h = ref_int(0, 2);
    cv.pad_w = ref_int(0, 2);
    cv.stride_h = ref_int(1, 3);
    cv.stride_w = ref_int(1, 3);
    cv.dil_h = ref_int(1, 2);
    cv.dil_w = ref_int(1, 2);
    if (wl_conv2d_init(&cv) == 0) return cv;
  }
}

static size_t conv_nx(const wl_conv2d_t *cv) {
  return (size_t)cv->n * cv->h * cv->w * cv->c;
}
static size_t conv_nw(const wl_conv2d_t *cv) {
  return (size_t)cv->k * cv->r * cv->s * cv->c;
}
static size_t conv_ny(const wl_conv2d_t *cv) {
  return (size_t)cv->n * cv->p * cv->q * cv->k;
}

static void print_conv(const char *what, const wl_conv2d_t *cv, double err) {
  fprintf(stderr,
          "%s: n%d h%d w%d c%d k%d r%d s%d pad %d,%d stride %d,%d dil %d,%d -> p%d q%d: err %g\n",
          what, cv->n, cv->h, cv->w, cv->c, cv->k, cv->r, cv->s, cv->pad_h, cv->pad_w, cv->stride_h,
          cv->stride_w, cv->dil_h, cv->dil_w, cv->p, cv->q, err);
}

/* The three passes against the direct loops; returns the worst error (<= 1 passes). */
static double conv_vs_naive(const wl_conv2d_t *cv, int with_bias) {
  size_t nx = conv_nx(cv), nw = conv_nw(cv), ny = conv_ny(cv);
  float *x = ref_alloc(nx), *w = ref_alloc(nw), *b = ref_alloc((size_t)cv->k), *y = ref_alloc(ny);
  float *dy = ref_alloc(ny), *dx = ref_alloc(nx), *dw = ref_alloc(nw),
        *db = ref_alloc((size_t)cv->k);
  double *xd = ref_dalloc(nx), *wd = ref_dalloc(nw), *bd = ref_dalloc((size_t)cv->k);
  double *want_y = ref_dalloc(ny), *want_dx = ref_dalloc(nx), *want_dw = ref_dalloc(nw);
  double *want_db = ref_dalloc((size_t)cv->k);
  ref_fill(x, nx, -1, 1), ref_fill(w, nw, -1, 1), ref_fill(b, (size_t)cv->k, -1, 1);
  ref_fill(dy, ny, -1, 1);
  ref_fill(dx, nx, 100, 200), ref_fill(dw, nw, 100, 200); /* must be overwritten */
  ref_to_double(x, xd, nx), ref_to_double(w, wd, nw), ref_to_double(b, bd, (size_t)cv->k);
  ref_conv_fwd(cv, xd, wd, with_bias ? bd : NULL, want_y);
  ref_conv_bwd_data(cv, dy, w, want_dx);
  ref_conv_bwd_filter(cv, x, dy, want_dw);
  for (int k = 0; k < cv->k; k++) {
    want_db[k] = 0;
    for (size_t i = 0; i < ny / (size_t)cv->k; i++) want_db[k] += dy[i * (size_t)cv->k + (size_t)k];
  }
  double worst = 0;
  if (wl_conv2d_fwd(cv, x, w, with_bias ? b : NULL, y) != 0) worst = 1e30;
  if (wl_conv2d_bwd_data(cv, dy, w, dx) != 0) worst = 1e30;
  if (wl_conv2d_bwd_filter(cv, x, dy, dw, with_bias ? db : NULL) != 0) worst = 1e30;
  /* Error scale: a sum of up to CRS (or KRS, NPQ) products of magnitude <= 1. */
  double e[4] = {ref_err(y, want_y, ny, 1e-5 * (double)(nw / (size_t)cv->k), 1e-5),
                 ref_err(dx, want_dx, nx, 1e-5 * (double)(nw / (size_t)cv->c), 1e-5),
                 ref_err(dw, want_dw, nw, 1e-5 * (double)(ny / (size_t)cv->k), 1e-5),
                 with_bias ? ref_err(db, want_db, (size_t)cv->k, 1e-5 * (double)ny, 1e-5) : 0.0};
  for (int i = 0; i < 4; i++)
    if (!(e[i] <= worst) && !isnan(worst)) worst = e[i]; /* a NaN stays the worst */
  free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db);
  free(xd), free(wd), free(bd), free(want_y), free(want_dx), free(want_dw), free(want_db);
  return worst;
}

static void test_conv_random(void) {
  int bad = 0;
  for (int it = 0; it < 60; it++) {
    wl_kern_set_threads(1 + it % 2);
    wl_conv2d_t cv = random_conv(3, 12, 9);
    double e = conv_vs_naive(&cv, it % 2);
    if (!(e <= 1.0) && bad++ < 5) print_conv("conv", &cv, e);
  }
  wl_kern_set_threads(0);
  CU_ASSERT_EQUAL(bad, 0);
}

/* Shapes of the reference models, past the GEMM's K block (CRS, KRS > 256) and M block. */
static void test_conv_model_shapes(void) {
  const wl_conv2d_t shapes[] = {
      {.n = 4, .h = 28, .w = 28, .c = 1, .k = 32, .r = 5, .s = 5, .pad_h = 2, .pad_w = 2},
      {.n = 3, .h = 14, .w = 14, .c = 32, .k = 64, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1},
      {.n = 2,
       .h = 15,
       .w = 13,
       .c = 33,
       .k = 17,
       .r = 3,
       .s = 3,
       .pad_h = 1,
       .pad_w = 1,
       .stride_h = 2,
       .stride_w = 2},
      {.n = 2, .h = 9, .w = 9, .c = 40, .k = 24, .r = 1, .s = 1},
  };
  wl_kern_set_threads(2);
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    wl_conv2d_t cv = shapes[i];
    CU_ASSERT_EQUAL_FATAL(wl_conv2d_init(&cv), 0);
    double e = conv_vs_naive(&cv, 1);
    CU_ASSERT(e <= 1.0);
    if (!(e <= 1.0)) print_conv("conv model shape", &cv, e);
  }
  wl_kern_set_threads(0);
}

typedef struct conv_ctx_s {
  const wl_conv2d_t *cv;
  double *x, *w, *b, *g, *y;
} conv_ctx_t;

static double conv_loss(void *p) {
  conv_ctx_t *c = p;
  ref_conv_fwd(c->cv, c->x, c->w, c->b, c->y);
  return dot_d(c->y, c->g, conv_ny(c->cv));
}

static void test_conv_gradcheck(void) {
  for (int it = 0; it < 6; it++) {
    wl_conv2d_t cv = random_conv(2, 7, 4);
    size_t nx = conv_nx(&cv), nw = conv_nw(&cv), ny = conv_ny(&cv), nk = (size_t)cv.k;
    float *x = ref_alloc(nx), *w = ref_alloc(nw), *g = ref_alloc(ny);
    float *dx = ref_alloc(nx), *dw = ref_alloc(nw), *db = ref_alloc(nk);
    ref_fill(x, nx, -1, 1), ref_fill(w, nw, -1, 1), ref_fill(g, ny, -1, 1);
    CU_ASSERT_EQUAL(wl_conv2d_bwd_data(&cv, g, w, dx), 0);
    CU_ASSERT_EQUAL(wl_conv2d_bwd_filter(&cv, x, g, dw, db), 0);
    conv_ctx_t c = {&cv,           ref_dalloc(nx), ref_dalloc(nw), ref_dalloc(nk), ref_dalloc(ny),
                    ref_dalloc(ny)};
    ref_to_double(x, c.x, nx), ref_to_double(w, c.w, nw), ref_to_double(g, c.g, ny);
    for (size_t i = 0; i < nk; i++) c.b[i] = ref_uniform(-1, 1);
    double ex = fd_check(conv_loss, &c, c.x, nx, dx, 1e-3, 1e-4);
    double ew = fd_check(conv_loss, &c, c.w, nw, dw, 1e-3, 1e-4);
    double eb = fd_check(conv_loss, &c, c.b, nk, db, 1e-3, 1e-4);
    CU_ASSERT(ex <= 1.0 && ew <= 1.0 && eb <= 1.0);
    if (!(ex <= 1.0 && ew <= 1.0 && eb <= 1.0)) print_conv("conv gradcheck", &cv, ex + ew + eb);
    free(x), free(w), free(g), free(dx), free(dw), free(db);
    free(c.x), free(c.w), free(c.b), free(c.g), free(c.y);
  }
}

static void test_conv_init(void) {
  wl_conv2d_t cv = {.n = 1, .h = 5, .w = 5, .c = 2, .k = 3, .r = 3, .s = 3};
  CU_ASSERT_EQUAL(wl_conv2d_init(&cv), 0);
  CU_ASSERT(cv.p == cv.h - cv.r + 1 && cv.q == cv.w - cv.s + 1);
  CU_ASSERT(cv.stride_h == 1 && cv.dil_w == 1);
  wl_conv2d_t big = cv;
  big.r = 7; /* larger than the padded input */
  CU_ASSERT_EQUAL(wl_conv2d_init(&big), -EINVAL);
  wl_conv2d_t neg = cv;
  neg.pad_w = -1;
  CU_ASSERT_EQUAL(wl_conv2d_init(&neg), -EINVAL);
  wl_conv2d_t zero = cv;
  zero.c = 0;
  CU_ASSERT_EQUAL(wl_conv2d_init(&zero), -EINVAL);
  CU_ASSERT_EQUAL(wl_conv2d_init(NULL), -EINVAL);
  float x[50];
  CU_ASSERT_EQUAL(wl_conv2d_fwd(&cv, x, NULL, NULL, x), -EINVAL);
  wl_conv2d_t uninit = {.n = 1, .h = 5, .w = 5, .c = 2, .k = 3, .r = 3, .s = 3};
  CU_ASSERT_EQUAL(wl_conv2d_fwd(&uninit, x, x, NULL, x), -EINVAL);
}

/* ------------------------------------------------------------------------------------------------
 * Pooling
 * ----------------------------------------------------------------------------------------------*/

static wl_pool2d_t random_pool(void) {
  for (;;) {
    wl_pool2d_t pl = {0};
    pl.n = ref_int(1, 3), pl.h = ref_int(1, 11), pl.w = ref_int(1, 11), pl.c = ref_int(1, 140);
    pl.r = ref_int(1, 3), pl.s = ref_int(1, 3);
    pl.pad_h = ref_int(0, pl.r - 1), pl.pad_w = ref_int(0, pl.s - 1);
    pl.stride_h = ref_int(0, 3), pl.stride_w = ref_int(0, 3);
    if (wl_pool2d_init(&pl) == 0) return pl;
  }
}

/* Distinct values 0.01 apart in random order: no ties, so finite differences are exact. */
static void fill_distinct(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = (float)i * 0.01f - (float)n * 0.005f;
  for (size_t i = n; i > 1; i--) {
    size_t j = ref_u32() % i;
    float t = x[i - 1];
    x[i - 1] = x[j], x[j] = t;
  }
}

typedef struct pool_ctx_s {
  const wl_pool2d_t *pl;
  double *x, *g, *y;
  size_t ny;
} pool_ctx_t;

static double pool_loss(void *p) {
  pool_ctx_t *c = p;
  ref_maxpool_fwd(c->pl, c->x, c->y);
  return dot_d(c->y, c->g, c->ny);
}

static void test_maxpool(void) {
  int bad = 0;
  for (int it = 0; it < 30; it++) {
    wl_kern_set_threads(1 + it % 2);
    wl_pool2d_t pl = random_pool();
    size_t nx = (size_t)pl.n * pl.h * pl.w * pl.c, ny = (size_t)pl.n * pl.p * pl.q * pl.c;
    float *x = ref_alloc(nx), *y = ref_alloc(ny), *g = ref_alloc(ny), *dx = ref_alloc(nx);
    fill_distinct(x, nx);
    ref_fill(g, ny, -1, 1);
    ref_fill(dx, nx, 5, 6);
    pool_ctx_t c = {&pl, ref_dalloc(nx), ref_dalloc(ny), ref_dalloc(ny), ny};
    ref_to_double(x, c.x, nx), ref_to_double(g, c.g, ny);
    ref_maxpool_fwd(&pl, c.x, c.y);
    double e = 0;
    if (wl_maxpool2d_fwd(&pl, x, y) != 0 || wl_maxpool2d_bwd(&pl, x, g, dx) != 0) e = 1e30;
    double ef = ref_err(y, c.y, ny, 1e-30, 0.0); /* a max is exact */
    double eb = nx <= 4000 ? fd_check(pool_loss, &c, c.x, nx, dx, 1e-4, 1e-5) : 0.0;
    if (!(ef <= e)) e = ef; /* NaN too */
    if (!(eb <= e) && !isnan(e)) e = eb;
    if (!(e <= 1.0) && bad++ < 5)
      fprintf(stderr, "maxpool n%d h%d w%d c%d win %dx%d pad %d,%d stride %d,%d: err %g\n", pl.n,
              pl.h, pl.w, pl.c, pl.r, pl.s, pl.pad_h, pl.pad_w, pl.stride_h, pl.stride_w, e);
    free(x), free(y), free(g), free(dx), free(c.x), free(c.g), free(c.y);
  }
  wl_kern_set_threads(0);
  CU_ASSERT_EQUAL(bad, 0);
}

/* With ties the gradient goes to the first maximum in window order, as documented. */
static void test_maxpool_ties(void) {
  wl_pool2d_t pl = {.n = 2, .h = 6, .w = 7, .c = 5, .r = 2, .s = 3, .stride_h = 1, .stride_w = 2};
  CU_ASSERT_EQUAL_FATAL(wl_pool2d_init(&pl), 0);
  size_t nx = (size_t)pl.n * pl.h * pl.w * pl.c, ny = (size_t)pl.n * pl.p * pl.q * pl.c;
  float *x = ref_alloc(nx), *g = ref_alloc(ny), *dx = ref_alloc(nx);
  double *want = ref_dalloc(nx);
  for (size_t i = 0; i < nx; i++) x[i] = (float)(ref_u32() % 2); /* many ties */
  ref_fill(g, ny, -1, 1);
  for (size_t i = 0; i < nx; i++) want[i] = 0;
  for (int n = 0; n < pl.n; n++)
    for (int p = 0; p < pl.p; p++)
      for (int q = 0; q < pl.q; q++)
        for (int c = 0; c < pl.c; c++) {
          size_t best = SIZE_MAX;
          for (int r = 0; r < pl.r; r++)
            for (int s = 0; s < pl.s; s++) {
              int h = p * pl.stride_h + r, w = q * pl.stride_w + s;
              size_t at = (((size_t)n * pl.h + h) * pl.w + w) * pl.c + c;
              if (best == SIZE_MAX || x[at] > x[best]) best = at;
            }
          want[best] += g[(((size_t)n * pl.p + p) * pl.q + q) * pl.c + c];
        }
  CU_ASSERT_EQUAL(wl_maxpool2d_bwd(&pl, x, g, dx), 0);
  CU_ASSERT(ref_err(dx, want, nx, 1e-6, 1e-6) <= 1.0);
  free(x), free(g), free(dx), free(want);
}

static void test_pool_init(void) {
  wl_pool2d_t pl = {.n = 1, .h = 5, .w = 5, .c = 1, .r = 2, .s = 2};
  CU_ASSERT_EQUAL(wl_pool2d_init(&pl), 0);
  CU_ASSERT(pl.stride_h == pl.r && pl.p == (pl.h - pl.r) / pl.r + 1);
  wl_pool2d_t bad = {.n = 1, .h = 5, .w = 5, .c = 1, .r = 2, .s = 2, .pad_h = 2};
  CU_ASSERT_EQUAL(wl_pool2d_init(&bad), -EINVAL); /* a window of padding only */
  CU_ASSERT_EQUAL(wl_pool2d_init(NULL), -EINVAL);
}

typedef struct avg_ctx_s {
  size_t n, hw, c;
  double *x, *g;
} avg_ctx_t;

static double avg_loss(void *p) {
  avg_ctx_t *a = p;
  double s = 0;
  for (size_t i = 0; i < a->n; i++)
    for (size_t k = 0; k < a->c; k++) {
      double m = 0;
      for (size_t j = 0; j < a->hw; j++) m += a->x[(i * a->hw + j) * a->c + k];
      s += a->g[i * a->c + k] * m / (double)a->hw;
    }
  return s;
}

static void test_avgpool_global(void) {
  size_t n = (size_t)ref_int(1, 4), hw = (size_t)ref_int(1, 50), c = (size_t)ref_int(1, 300);
  float *x = ref_alloc(n * hw * c), *y = ref_alloc(n * c), *g = ref_alloc(n * c);
  float *dx = ref_alloc(n * hw * c);
  ref_fill(x, n * hw * c, -1, 1), ref_fill(g, n * c, -1, 1);
  avg_ctx_t a = {n, hw, c, ref_dalloc(n * hw * c), ref_dalloc(n * c)};
  ref_to_double(x, a.x, n * hw * c), ref_to_double(g, a.g, n * c);
  CU_ASSERT_EQUAL(wl_avgpool_global_fwd(n, hw, c, x, y), 0);
  CU_ASSERT_EQUAL(wl_avgpool_global_bwd(n, hw, c, g, dx), 0);
  double *yd = ref_dalloc(n * c);
  ref_to_double(y, yd, n * c);
  CU_ASSERT(fabs(dot_d(yd, a.g, n * c) - avg_loss(&a)) <= 1e-5 * (double)(n * c));
  size_t check = n * hw * c < 3000 ? n * hw * c : 3000; /* the first elements suffice */
  CU_ASSERT(fd_check(avg_loss, &a, a.x, check, dx, 1e-3, 1e-4) <= 1.0);
  free(x), free(y), free(g), free(dx), free(a.x), free(a.g), free(yd);
}

/* ------------------------------------------------------------------------------------------------
 * Bias, ReLU, BLAS-1
 * ----------------------------------------------------------------------------------------------*/

static void test_bias(void) {
  size_t rows = (size_t)ref_int(1, 700), cols = (size_t)ref_int(1, 600);
  float *y = ref_alloc(rows * cols), *b = ref_alloc(cols), *db = ref_alloc(cols);
  double *want = ref_dalloc(rows * cols), *want_db = ref_dalloc(cols);
  ref_fill(y, rows * cols, -1, 1), ref_fill(b, cols, -1, 1);
  for (size_t j = 0; j < cols; j++) want_db[j] = 0;
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) {
      want[i * cols + j] = (double)y[i * cols + j] + b[j];
      want_db[j] += y[i * cols + j];
    }
  CU_ASSERT_EQUAL(wl_bias_grad(rows, cols, y, db), 0);
  CU_ASSERT(ref_err(db, want_db, cols, 1e-6, 1e-6) <= 1.0);
  CU_ASSERT_EQUAL(wl_bias_add(rows, cols, y, b), 0);
  CU_ASSERT(ref_err(y, want, rows * cols, 1e-7, 1e-6) <= 1.0);
  CU_ASSERT_EQUAL(wl_bias_add(2, 2, NULL, b), -EINVAL);
  free(y), free(b), free(db), free(want), free(want_db);
}

typedef struct relu_ctx_s {
  size_t n;
  double *x, *g;
} relu_ctx_t;

static double relu_loss(void *p) {
  relu_ctx_t *r = p;
  double s = 0;
  for (size_t i = 0; i < r->n; i++) s += r->g[i] * (r->x[i] > 0 ? r->x[i] : 0);
  return s;
}

static void test_relu(void) {
  size_t n = (size_t)ref_int(1, 200000); /* large enough, sometimes, for the threaded path */
  float *x = ref_alloc(n), *y = ref_alloc(n), *g = ref_alloc(n), *dx = ref_alloc(n);
  for (size_t i = 0; i < n; i++) {
    float v = ref_uniform(0.01f, 1.0f); /* away from the kink, for finite differences */
    x[i] = ref_u32() % 2 ? v : -v;
  }
  ref_fill(g, n, -1, 1);
  CU_ASSERT_EQUAL(wl_relu_fwd(n, x, y), 0);
  int ok = 1;
  for (size_t i = 0; i < n; i++) ok &= y[i] == (x[i] > 0 ? x[i] : 0.0f);
  CU_ASSERT(ok);
  CU_ASSERT_EQUAL(wl_relu_bwd(n, y, g, dx), 0);
  relu_ctx_t r = {n < 5000 ? n : 5000, ref_dalloc(n), ref_dalloc(n)};
  ref_to_double(x, r.x, n), ref_to_double(g, r.g, n);
  CU_ASSERT(fd_check(relu_loss, &r, r.x, r.n, dx, 1e-4, 1e-6) <= 1.0);
  /* In place, both ways. */
  memcpy(dx, g, n * sizeof(float));
  CU_ASSERT_EQUAL(wl_relu_bwd(n, y, dx, dx), 0);
  ok = 1;
  for (size_t i = 0; i < n; i++) ok &= dx[i] == (x[i] > 0 ? g[i] : 0.0f);
  CU_ASSERT(ok);
  CU_ASSERT_EQUAL(wl_relu_fwd(n, x, x), 0);
  CU_ASSERT_EQUAL(memcmp(x, y, n * sizeof(float)), 0);
  free(x), free(y), free(g), free(dx), free(r.x), free(r.g);
}

static void test_axpy_scale(void) {
  size_t n = (size_t)ref_int(1, 300000);
  float alpha = ref_uniform(-3, 3);
  float *x = ref_alloc(n), *y = ref_alloc(n);
  double *want = ref_dalloc(n);
  ref_fill(x, n, -1, 1), ref_fill(y, n, -1, 1);
  for (size_t i = 0; i < n; i++) want[i] = (double)y[i] + (double)alpha * x[i];
  CU_ASSERT_EQUAL(wl_axpy(n, alpha, x, y), 0);
  CU_ASSERT(ref_err(y, want, n, 1e-6, 1e-6) <= 1.0);
  for (size_t i = 0; i < n; i++) want[i] = (double)x[i] * alpha;
  CU_ASSERT_EQUAL(wl_scale(n, alpha, x), 0);
  CU_ASSERT(ref_err(x, want, n, 1e-7, 1e-6) <= 1.0);
  free(x), free(y), free(want);
}

/* ------------------------------------------------------------------------------------------------
 * Softmax cross-entropy
 * ----------------------------------------------------------------------------------------------*/

typedef struct xent_ctx_s {
  size_t n, c;
  double *x;
  const int32_t *labels;
} xent_ctx_t;

static double xent_loss(void *p) {
  xent_ctx_t *e = p;
  return ref_softmax_xent(e->n, e->c, e->x, e->labels);
}

static void test_softmax_xent(void) {
  for (int it = 0; it < 6; it++) {
    size_t n = (size_t)ref_int(1, 40), c = (size_t)ref_int(1, 30);
    float spread = it < 3 ? 3.0f : 80.0f; /* large logits: exp overflows without the max shift */
    float *x = ref_alloc(n * c), *p = ref_alloc(n * c), *d = ref_alloc(n * c);
    int32_t *labels = malloc(n * sizeof(int32_t));
    ref_fill(x, n * c, -spread, spread);
    for (size_t i = 0; i < n; i++) labels[i] = (int32_t)(ref_u32() % c);
    xent_ctx_t e = {n, c, ref_dalloc(n * c), labels};
    ref_to_double(x, e.x, n * c);
    double *want_p = ref_dalloc(n * c);
    for (size_t i = 0; i < n; i++) {
      double mx = e.x[i * c], s = 0;
      for (size_t j = 0; j < c; j++) mx = e.x[i * c + j] > mx ? e.x[i * c + j] : mx;
      for (size_t j = 0; j < c; j++) s += exp(e.x[i * c + j] - mx);
      for (size_t j = 0; j < c; j++) want_p[i * c + j] = exp(e.x[i * c + j] - mx) / s;
    }
    float loss = NAN;
    CU_ASSERT_EQUAL(wl_softmax_xent_fwd(n, c, x, labels, p, &loss), 0);
    double want_loss = xent_loss(&e);
    CU_ASSERT(fabs(loss - want_loss) <= 1e-5 * (1.0 + fabs(want_loss)));
    CU_ASSERT(ref_err(p, want_p, n * c, 1e-7, 1e-5) <= 1.0);
    CU_ASSERT_EQUAL(wl_softmax_xent_bwd(n, c, p, labels, 1.0f / (float)n, d), 0);
    CU_ASSERT(fd_check(xent_loss, &e, e.x, n * c, d, 1e-5, 1e-4) <= 1.0);
    /* In place: probabilities over the logits, then the gradient over the probabilities. */
    CU_ASSERT_EQUAL(wl_softmax_xent_fwd(n, c, x, labels, x, NULL), 0);
    CU_ASSERT_EQUAL(memcmp(x, p, n * c * sizeof(float)), 0);
    CU_ASSERT_EQUAL(wl_softmax_xent_bwd(n, c, x, labels, 1.0f / (float)n, x), 0);
    CU_ASSERT_EQUAL(memcmp(x, d, n * c * sizeof(float)), 0);
    free(x), free(p), free(d), free(labels), free(e.x), free(want_p);
  }
  float x[6] = {0};
  int32_t bad[2] = {0, 3};
  CU_ASSERT_EQUAL(wl_softmax_xent_fwd(2, 3, x, bad, x, NULL), -EINVAL);
  CU_ASSERT_EQUAL(wl_softmax_xent_bwd(2, 3, x, bad, 1.0f, x), -EINVAL);
}

static void test_count_correct(void) {
  size_t n = (size_t)ref_int(1, 500), c = (size_t)ref_int(1, 12), got = 0, want = 0;
  float *x = ref_alloc(n * c);
  int32_t *labels = malloc(n * sizeof(int32_t));
  for (size_t i = 0; i < n * c; i++) x[i] = (float)(ref_u32() % 5); /* ties: the first wins */
  for (size_t i = 0; i < n; i++) {
    labels[i] = (int32_t)(ref_u32() % c);
    size_t best = 0;
    for (size_t j = 0; j < c; j++)
      if (x[i * c + j] > x[i * c + best]) best = j;
    want += best == (size_t)labels[i];
  }
  CU_ASSERT_EQUAL(wl_count_correct(n, c, x, labels, &got), 0);
  CU_ASSERT_EQUAL(got, want);
  free(x), free(labels);
}

/* ------------------------------------------------------------------------------------------------
 * Optimizers and reductions
 * ----------------------------------------------------------------------------------------------*/

static void test_sgd(void) {
  for (int variant = 0; variant < 4; variant++) {
    wl_sgd_t o = {.lr = ref_uniform(0.01f, 0.5f),
                  .momentum = variant == 0 ? 0.0f : ref_uniform(0.5f, 0.99f),
                  .weight_decay = variant >= 2 ? ref_uniform(0.0f, 0.1f) : 0.0f,
                  .nesterov = variant == 3};
    size_t n = (size_t)ref_int(1, 100000);
    float *w = ref_alloc(n), *g = ref_alloc(n), *v = ref_alloc(n);
    double *wd = ref_dalloc(n), *vd = ref_dalloc(n);
    ref_fill(w, n, -1, 1);
    ref_to_double(w, wd, n);
    for (size_t i = 0; i < n; i++) v[i] = 0, vd[i] = 0;
    for (int step = 0; step < 5; step++) {
      ref_fill(g, n, -1, 1);
      for (size_t i = 0; i < n; i++) {
        double gi = g[i] + (double)o.weight_decay * wd[i];
        if (o.momentum != 0.0f) {
          vd[i] = o.momentum * vd[i] + gi;
          gi = o.nesterov ? gi + o.momentum * vd[i] : vd[i];
        }
        wd[i] -= o.lr * gi;
      }
      CU_ASSERT_EQUAL(wl_sgd_step(&o, n, w, g, variant == 0 ? NULL : v), 0);
    }
    CU_ASSERT(ref_err(w, wd, n, 1e-5, 1e-5) <= 1.0);
    free(w), free(g), free(v), free(wd), free(vd);
  }
  wl_sgd_t m = {.lr = 0.1f, .momentum = 0.9f};
  float w = 1, g = 1;
  CU_ASSERT_EQUAL(wl_sgd_step(&m, 1, &w, &g, NULL), -EINVAL); /* momentum needs a velocity */
}

static void test_adam(void) {
  for (int decoupled = 0; decoupled < 2; decoupled++) {
    wl_adam_t o = {.lr = 1e-2f,
                   .beta1 = 0.9f,
                   .beta2 = 0.999f,
                   .eps = 1e-8f,
                   .weight_decay = ref_uniform(0.0f, 0.05f),
                   .decoupled = decoupled};
    size_t n = (size_t)ref_int(1, 70000);
    float *w = ref_alloc(n), *g = ref_alloc(n), *m = ref_alloc(n), *v = ref_alloc(n);
    double *wd = ref_dalloc(n), *md = ref_dalloc(n), *vd = ref_dalloc(n);
    ref_fill(w, n, -1, 1);
    ref_to_double(w, wd, n);
    for (size_t i = 0; i < n; i++) m[i] = v[i] = 0, md[i] = vd[i] = 0;
    for (long step = 1; step <= 6; step++) {
      ref_fill(g, n, -1, 1);
      double bc1 = 1 - pow(o.beta1, (double)step), bc2 = 1 - pow(o.beta2, (double)step);
      for (size_t i = 0; i < n; i++) {
        double gi = g[i];
        if (decoupled)
          wd[i] *= 1 - (double)o.lr * o.weight_decay;
        else
          gi += (double)o.weight_decay * wd[i];
        md[i] = o.beta1 * md[i] + (1 - (double)o.beta1) * gi;
        vd[i] = o.beta2 * vd[i] + (1 - (double)o.beta2) * gi * gi;
        wd[i] -= o.lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + o.eps);
      }
      CU_ASSERT_EQUAL(wl_adam_step(&o, step, n, w, g, m, v), 0);
    }
    CU_ASSERT(ref_err(w, wd, n, 1e-5, 1e-5) <= 1.0);
    free(w), free(g), free(m), free(v), free(wd), free(md), free(vd);
  }
  wl_adam_t o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  float x = 0;
  CU_ASSERT_EQUAL(wl_adam_step(&o, 0, 1, &x, &x, &x, &x), -EINVAL); /* steps count from 1 */
  o.beta2 = 1.0f;
  CU_ASSERT_EQUAL(wl_adam_step(&o, 1, 1, &x, &x, &x, &x), -EINVAL);
}

static void test_reduce(void) {
  size_t n = (size_t)ref_int(1, 500000);
  float *x = ref_alloc(n);
  ref_fill(x, n, -2, 1);
  double sum = 0, sq = 0, mx = x[0], mn = x[0], amx = fabs(x[0]);
  for (size_t i = 0; i < n; i++) {
    sum += x[i], sq += (double)x[i] * x[i];
    mx = x[i] > mx ? x[i] : mx, mn = x[i] < mn ? x[i] : mn;
    amx = fabs(x[i]) > amx ? fabs(x[i]) : amx;
  }
  float out = NAN;
  CU_ASSERT_EQUAL(wl_reduce(WL_REDUCE_SUM, n, x, &out), 0);
  CU_ASSERT(fabs(out - sum) <= 1e-6 * (double)n);
  CU_ASSERT_EQUAL(wl_reduce(WL_REDUCE_SUMSQ, n, x, &out), 0);
  CU_ASSERT(fabs(out - sq) <= 1e-6 * sq);
  CU_ASSERT_EQUAL(wl_reduce(WL_REDUCE_MAX, n, x, &out), 0);
  CU_ASSERT_EQUAL(out, (float)mx);
  CU_ASSERT_EQUAL(wl_reduce(WL_REDUCE_MIN, n, x, &out), 0);
  CU_ASSERT_EQUAL(out, (float)mn);
  CU_ASSERT_EQUAL(wl_reduce(WL_REDUCE_ABSMAX, n, x, &out), 0);
  CU_ASSERT_EQUAL(out, (float)amx);
  CU_ASSERT_EQUAL(wl_reduce(WL_REDUCE_MAX, 0, x, &out), -EINVAL);
  CU_ASSERT_EQUAL(wl_reduce((wl_reduce_op_t)42, n, x, &out), -EINVAL);
  /* A NaN first, last or in between makes every reduction NaN. */
  const size_t at[3] = {0, n / 2, n - 1};
  for (int k = 0; k < 3; k++) {
    float keep = x[at[k]];
    x[at[k]] = NAN;
    for (int op = WL_REDUCE_SUM; op <= WL_REDUCE_ABSMAX; op++) {
      out = 0;
      CU_ASSERT_EQUAL(wl_reduce((wl_reduce_op_t)op, n, x, &out), 0);
      CU_ASSERT(isnan(out));
    }
    x[at[k]] = keep;
  }
  free(x);
}

int main(int argc, char **argv) {
  ref_seed(ref_seed_from_env(20260807));
  static const wl_test_case_t cases[] = {
      {"gemm_random", test_gemm_random},
      {"gemm_large", test_gemm_large},
      {"gemm_generic_kernel", test_gemm_generic_kernel},
      {"gemm_avx2_kernel", test_gemm_avx2_kernel},
      {"gemm_edges", test_gemm_edges},
      {"threads", test_threads},
      {"concurrent_callers", test_concurrent_callers},
      {"fork_child", test_fork_child},
      {"linear_gradcheck", test_linear_gradcheck},
      {"conv_random", test_conv_random},
      {"conv_model_shapes", test_conv_model_shapes},
      {"conv_gradcheck", test_conv_gradcheck},
      {"conv_init", test_conv_init},
      {"maxpool", test_maxpool},
      {"maxpool_ties", test_maxpool_ties},
      {"pool_init", test_pool_init},
      {"avgpool_global", test_avgpool_global},
      {"bias", test_bias},
      {"relu", test_relu},
      {"axpy_scale", test_axpy_scale},
      {"softmax_xent", test_softmax_xent},
      {"count_correct", test_count_correct},
      {"sgd", test_sgd},
      {"adam", test_adam},
      {"reduce", test_reduce},
      {NULL, NULL},
  };
  return wl_test_main(argc, argv, "kernels", cases);
}
