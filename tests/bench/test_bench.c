/* wavelet-bench's own tests: the idx loader on files written here (good, truncated, wrong magic,
 * gzip and plain), the models' gradients against finite differences, short training runs, and
 * the data-parallel all-reduce between processes (sums, a dead rank, a timeout). */
#include "wltest.h"

#include "backend.h"
#include "data.h"
#include "net.h"
#include "reducer.h"
#include "rng.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

static char tmpdir[256];

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* Writes an idx file: magic, dims, then body (len bytes), plain or gzip. */
static void write_idx(const char *path, int gz, uint32_t magic, const uint32_t *dims, int ndims,
                      const uint8_t *body, size_t len) {
  uint8_t h[16];
  put_be32(h, magic);
  for (int i = 0; i < ndims; i++) put_be32(h + 4 + 4 * i, dims[i]);
  size_t hl = 4 + 4 * (size_t)ndims;
  if (gz) {
    gzFile f = gzopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(gzwrite(f, h, (unsigned)hl), (int)hl);
    if (len) CU_ASSERT_EQUAL(gzwrite(f, body, (unsigned)len), (int)len);
    gzclose(f);
  } else {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(fwrite(h, 1, hl, f), hl);
    if (len) CU_ASSERT_EQUAL(fwrite(body, 1, len, f), len);
    fclose(f);
  }
}

static uint8_t *pattern(size_t len, unsigned mod) {
  uint8_t *b = malloc(len);
  for (size_t i = 0; i < len; i++) b[i] = (uint8_t)((i * 7 + 3) % mod);
  return b;
}

static void path_of(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "%s/%s", tmpdir, name);
}

static void check_good(int gz) {
  char ip[512], lp[512];
  path_of(ip, sizeof ip, gz ? "good-images.gz" : "good-images");
  path_of(lp, sizeof lp, gz ? "good-labels.gz" : "good-labels");
  uint32_t idims[3] = {5, 28, 28}, ldims[1] = {5};
  uint8_t *img = pattern(5 * 784, 256), *lab = pattern(5, 10);
  write_idx(ip, gz, 0x803, idims, 3, img, 5 * 784);
  write_idx(lp, gz, 0x801, ldims, 1, lab, 5);
  size_t n = 0;
  uint8_t *out = NULL;
  char err[512] = "";
  CU_ASSERT_EQUAL(wb_idx_read(ip, 3, &n, &out, err, sizeof err), 0);
  CU_ASSERT_EQUAL(n, 5);
  CU_ASSERT(out && memcmp(out, img, 5 * 784) == 0);
  free(out);
  CU_ASSERT_EQUAL(wb_idx_read(lp, 1, &n, &out, err, sizeof err), 0);
  CU_ASSERT_EQUAL(n, 5);
  CU_ASSERT(out && memcmp(out, lab, 5) == 0);
  free(out);
  free(img);
  free(lab);
}

static void test_idx_good_plain(void) {
  check_good(0);
}

static void test_idx_good_gz(void) {
  check_good(1);
}

/* The file must be refused with an error that names it and contains `expect`. */
static void expect_bad(const char *path, int kind, const char *expect) {
  size_t n = 123;
  uint8_t *out = (uint8_t *)1;
  char err[512] = "";
  int rc = wb_idx_read(path, kind, &n, &out, err, sizeof err);
  CU_ASSERT(rc < 0);
  CU_ASSERT_EQUAL(n, 0);
  CU_ASSERT_PTR_NULL(out);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, path));
  CU_ASSERT_PTR_NOT_NULL(strstr(err, expect));
  CU_ASSERT_PTR_NULL(strchr(err, '\n'));
  if (!strstr(err, expect)) fprintf(stderr, "\n  got: %s\n  wanted: %s\n", err, expect);
}

static void test_idx_truncated(void) {
  char p[512];
  uint32_t dims[3] = {5, 28, 28};
  uint8_t *img = pattern(5 * 784, 256);
  for (int gz = 0; gz < 2; gz++) {
    path_of(p, sizeof p, gz ? "trunc.gz" : "trunc");
    write_idx(p, gz, 0x803, dims, 3, img, 4 * 784 + 100);
    expect_bad(p, 3, "truncated: the header announces 5 images (3920 bytes");
    write_idx(p, gz, 0x803, dims, 2, NULL, 0); /* the header itself is cut */
    expect_bad(p, 3, "truncated: expected a 16-byte idx header");
  }
  free(img);
}

static void test_idx_bad_magic(void) {
  char p[512];
  uint32_t dims[3] = {5, 28, 28};
  uint8_t *img = pattern(5 * 784, 256);
  for (int gz = 0; gz < 2; gz++) {
    path_of(p, sizeof p, gz ? "magic.gz" : "magic");
    write_idx(p, gz, 0x0d03, dims, 3, img, 5 * 784); /* float data, not unsigned bytes */
    expect_bad(p, 3, "bad magic 0x00000d03: expected 0x00000803");
    write_idx(p, gz, 0x803, dims, 3, img, 5 * 784);
    expect_bad(p, 1, "bad magic 0x00000803: expected 0x00000801"); /* images given as labels */
  }
  free(img);
}

static void test_idx_bad_fields(void) {
  char p[512];
  path_of(p, sizeof p, "fields");
  uint8_t *img = pattern(5 * 32 * 32, 256);
  uint32_t dims[3] = {5, 32, 32};
  write_idx(p, 0, 0x803, dims, 3, img, 5 * 32 * 32);
  expect_bad(p, 3, "images of 32 x 32 pixels: expected 28 x 28");
  uint32_t zero[3] = {0, 28, 28};
  write_idx(p, 0, 0x803, zero, 3, NULL, 0);
  expect_bad(p, 3, "0 images in the header: expected 1 to");
  uint8_t lab[4] = {1, 2, 10, 3};
  uint32_t ld[1] = {4};
  write_idx(p, 0, 0x801, ld, 1, lab, 4);
  expect_bad(p, 1, "label 10 at index 2: expected 0 to 9");
  uint8_t lab5[5] = {1, 2, 3, 4, 5};
  write_idx(p, 1, 0x801, ld, 1, lab5, 5);
  expect_bad(p, 1, "unexpected data after the 4 labels");
  free(img);
}

static void test_idx_corrupt_gz(void) {
  char p[512];
  path_of(p, sizeof p, "corrupt.gz");
  uint32_t dims[3] = {50, 28, 28};
  uint8_t *img = pattern(50 * 784, 251);
  write_idx(p, 1, 0x803, dims, 3, img, 50 * 784);
  FILE *f = fopen(p, "r+b");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  fseek(f, 40, SEEK_SET);
  uint8_t junk[64];
  memset(junk, 0xa5, sizeof junk);
  fwrite(junk, 1, sizeof junk, f);
  fclose(f);
  expect_bad(p, 3, "");
  free(img);
  path_of(p, sizeof p, "does-not-exist.gz");
  expect_bad(p, 3, "No such file");
}

/* Reads a whole file into memory; its size in *len. */
static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(*len + 1);
  CU_ASSERT_EQUAL(fread(b, 1, *len, f), *len);
  fclose(f);
  return b;
}

static void spill(const char *path, const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
  FILE *f = fopen(path, "wb");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  CU_ASSERT_EQUAL(fwrite(a, 1, alen, f), alen);
  if (blen) CU_ASSERT_EQUAL(fwrite(b, 1, blen, f), blen);
  fclose(f);
}

/* A gzip file whose idx data is whole but whose stream is not: cut in its trailer (zlib's gzread
 * took that for a clean end), or followed by garbage (which gzread skips). Two members one after
 * the other are one valid gzip file. */
static void test_idx_gz_framing(void) {
  char good[512], p[512];
  path_of(good, sizeof good, "framing-good.gz");
  path_of(p, sizeof p, "framing.gz");
  uint32_t dims[3] = {50, 28, 28};
  uint8_t *img = pattern(50 * 784, 251);
  write_idx(good, 1, 0x803, dims, 3, img, 50 * 784);
  size_t len;
  uint8_t *gz = slurp(good, &len);
  spill(p, gz, len - 8, NULL, 0); /* no CRC, no length */
  expect_bad(p, 3, "truncated gzip stream");
  spill(p, gz, len - 1, NULL, 0); /* the length's last byte */
  expect_bad(p, 3, "truncated gzip stream");
  uint8_t junk[40000];
  memset(junk, 0x5a, sizeof junk);
  spill(p, gz, len, junk, 3);
  expect_bad(p, 3, "unexpected data after the gzip stream");
  spill(p, gz, len, junk, sizeof junk); /* more than one buffer of it */
  expect_bad(p, 3, "unexpected data after the gzip stream");
  spill(p, gz, len, (const uint8_t *)"\x1f", 1); /* half a gzip magic */
  expect_bad(p, 3, "unexpected data after the gzip stream");
  /* The same data as two members: the header in one, the images in the other. */
  uint8_t h[16];
  put_be32(h, 0x803);
  for (int i = 0; i < 3; i++) put_be32(h + 4 + 4 * i, dims[i]);
  gzFile f = gzopen(p, "wb");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  CU_ASSERT_EQUAL(gzwrite(f, h, sizeof h), (int)sizeof h);
  gzclose(f);
  char second[512];
  path_of(second, sizeof second, "framing-2.gz");
  f = gzopen(second, "wb");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  CU_ASSERT_EQUAL(gzwrite(f, img, 50 * 784), 50 * 784);
  gzclose(f);
  size_t l1, l2;
  uint8_t *m1 = slurp(p, &l1), *m2 = slurp(second, &l2);
  spill(p, m1, l1, m2, l2);
  size_t n = 0;
  uint8_t *out = NULL;
  char err[512] = "";
  CU_ASSERT_EQUAL(wb_idx_read(p, 3, &n, &out, err, sizeof err), 0);
  CU_ASSERT_EQUAL(n, 50);
  CU_ASSERT(out && memcmp(out, img, 50 * 784) == 0);
  free(out);
  free(m1);
  free(m2);
  free(gz);
  free(img);
}

static void write_set(const char *dir, const char *prefix, size_t ni, size_t nl, int gz) {
  char p[600]; /* dir (up to 511) and the file name */
  uint32_t idims[3] = {(uint32_t)ni, 28, 28}, ldims[1] = {(uint32_t)nl};
  uint8_t *img = pattern(ni * 784, 256), *lab = pattern(nl, 10);
  snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte%s", dir, prefix, gz ? ".gz" : "");
  write_idx(p, gz, 0x803, idims, 3, img, ni * 784);
  snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte%s", dir, prefix, gz ? ".gz" : "");
  write_idx(p, gz, 0x801, ldims, 1, lab, nl);
  free(img);
  free(lab);
}

static void test_data_dir(void) {
  char dir[512], err[512] = "";
  path_of(dir, sizeof dir, "set");
  mkdir(dir, 0700);
  wb_data_t d;
  CU_ASSERT_EQUAL(wb_data_load(dir, &d, err, sizeof err), -ENOENT);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "no train-images-idx3-ubyte.gz or train-images-idx3-ubyte"));
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "dataset-fashion-mnist"));
  write_set(dir, "train", 7, 7, 1);
  write_set(dir, "t10k", 3, 3, 0);
  CU_ASSERT_EQUAL_FATAL(wb_data_load(dir, &d, err, sizeof err), 0);
  CU_ASSERT_EQUAL(d.train.n, 7);
  CU_ASSERT_EQUAL(d.test.n, 3);
  wb_data_limit(&d, 5, 0);
  CU_ASSERT_EQUAL(d.train.n, 5);
  CU_ASSERT_EQUAL(d.test.n, 3);
  wb_data_free(&d);
  write_set(dir, "t10k", 3, 4, 0);
  CU_ASSERT(wb_data_load(dir, &d, err, sizeof err) < 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "4 labels, but"));
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "has 3 images: expected as many"));
}

/* ---- models --------------------------------------------------------------------------------*/

typedef struct env_s {
  wb_meter_t meter;
  wb_backend_t *be;
  wb_net_t *net;
} env_t;

static int env_open(env_t *e, wb_model_t model, size_t batch, size_t limit, uint64_t seed) {
  memset(e, 0, sizeof *e);
  wb_meter_init(&e->meter, NULL, limit, 0);
  int rc = wb_backend_cpu_create(&e->be, &e->meter, NULL, NULL);
  if (rc) return rc;
  return wb_net_create(&e->net, e->be, model, batch, WB_ADAM, 1e-3f, seed);
}

static void env_close(env_t *e) {
  wb_net_destroy(e->net);
  if (e->be) e->be->destroy(e->be);
}

static double loss_at(env_t *e, const wb_split_t *s, const uint32_t *idx, size_t bs) {
  float l = 0;
  size_t c = 0;
  CU_ASSERT_EQUAL(wb_net_step(e->net, s, idx, bs, 0, &l, &c), 0);
  return l;
}

/* A layer's parameter blocks (w, b and a residual block's w2, b2): offsets and lengths in
 * floats, and their names; the count. */
static int param_blocks(const wb_layer_t *l, size_t *off, size_t *len, const char **name) {
  static const char *names[4] = {"w", "b", "w2", "b2"};
  size_t o[4] = {l->w, l->b, l->w2, l->b2}, c[4] = {0};
  int nb = 2;
  if (l->kind == WB_L_LINEAR) c[0] = l->in_f * l->out_f, c[1] = l->out_f;
  if (l->kind == WB_L_CONV)
    c[0] = (size_t)l->cv.k * l->cv.r * l->cv.s * l->cv.c, c[1] = (size_t)l->cv.k;
  if (l->kind == WB_L_RES)
    c[0] = c[2] = (size_t)9 * l->cv.c * l->cv.k, c[1] = c[3] = (size_t)l->cv.k, nb = 4;
  if (l->kind == WB_L_POOL) nb = 0;
  for (int k = 0; k < nb; k++) off[k] = o[k], len[k] = c[k], name[k] = names[k];
  return nb;
}

/* The loss's central difference along u (|u| = 1) over the block [off, off + len), step t. */
static double fd_along(env_t *e, const wb_split_t *s, const uint32_t *idx, size_t bs, size_t off,
                       size_t len, const float *u, double t) {
  wb_net_t *n = e->net;
  float *keep = malloc(len * sizeof *keep);
  memcpy(keep, n->w + off, len * sizeof *keep);
  for (size_t i = 0; i < len; i++) n->w[off + i] = (float)(keep[i] + t * u[i]);
  double lp = loss_at(e, s, idx, bs);
  for (size_t i = 0; i < len; i++) n->w[off + i] = (float)(keep[i] - t * u[i]);
  double lm = loss_at(e, s, idx, bs);
  memcpy(n->w + off, keep, len * sizeof *keep);
  free(keep);
  return (lp - lm) / (2 * t);
}

/* Per parameter block, on its own: the analytic gradient g must be nonzero (every block of
 * these models has a nonzero true gradient at this point, so a missing gradient shows), the
 * loss's directional difference along g's own direction must equal |g| (the check with the most
 * signal over the float32 loss), and along random directions u it must equal g.u (which catches
 * a g that is right on part of the block and missing or wrong on the rest). One check over a
 * whole layer would pass a layer whose bias gradient were never written. */
static void grad_check(wb_model_t model) {
  wb_data_t d;
  CU_ASSERT_EQUAL_FATAL(wb_data_synthetic(&d, 8, 2, 7), 0);
  env_t e;
  CU_ASSERT_EQUAL_FATAL(env_open(&e, model, 3, 0, 3), 0);
  uint32_t idx[3] = {0, 3, 5};
  wb_net_t *n = e.net;
  double l0 = loss_at(&e, &d.train, idx, 3);
  CU_ASSERT(isfinite(l0));
  float *g = malloc(n->nparam * sizeof *g), *u = malloc(n->nparam * sizeof *u);
  memcpy(g, n->g, n->nparam * sizeof *g);
  wb_rng_t r;
  wb_rng_seed(&r, 11);
  int checked = 0;
  for (int li = 0; li < n->nl; li++) {
    size_t off[4], len[4];
    const char *bname[4];
    int nb = param_blocks(&n->l[li], off, len, bname);
    for (int bk = 0; bk < nb; bk++) {
      const float *gb = g + off[bk];
      double gn = 0;
      for (size_t i = 0; i < len[bk]; i++) gn += (double)gb[i] * gb[i];
      gn = sqrt(gn);
      checked++;
      CU_ASSERT(gn > 0);
      if (gn > 0) {
        for (size_t i = 0; i < len[bk]; i++) u[i] = (float)(gb[i] / gn);
        double along_g = fd_along(&e, &d.train, idx, 3, off[bk], len[bk], u, 1e-3);
        int ok_g = fabs(along_g - gn) <= 0.02 * gn + 1e-4;
        CU_ASSERT(ok_g);
        if (!ok_g || getenv("WB_GRAD_VERBOSE"))
          fprintf(stderr, "\n  %s %s.%s (%zu): |g| %.6g, difference along g %.6g",
                  wb_model_name(model), n->l[li].name, bname[bk], len[bk], gn, along_g);
      } else {
        fprintf(stderr, "\n  %s %s.%s: the analytic gradient is zero", wb_model_name(model),
                n->l[li].name, bname[bk]);
      }
      /* Random unit directions, Rademacher signs (the same weight on every parameter), where g.u
       * is about |g| / sqrt(len): the tolerance scales with that, plus the float32 loss's noise.
       * A g missing on half its block is off by about 0.7 |g| / sqrt(len) on each direction;
       * three directions keep one lucky draw from hiding it. */
      double un = sqrt((double)len[bk]), scale = gn / un;
      for (int dir = 0; dir < 3; dir++) {
        double gu = 0;
        for (size_t i = 0; i < len[bk]; i++) {
          u[i] = (float)((wb_rng_next(&r) >> 63 ? 1.0 : -1.0) / un);
          gu += (double)gb[i] * u[i];
        }
        double along_u = fd_along(&e, &d.train, idx, 3, off[bk], len[bk], u, 1e-3);
        double err = fabs(along_u - gu), tol = 0.1 * fabs(gu) + 0.1 * scale + 5e-4;
        CU_ASSERT(err <= tol);
        if (!(err <= tol) || getenv("WB_GRAD_VERBOSE"))
          fprintf(stderr,
                  "\n  %s %s.%s direction %d: g.u %.6g, difference along u %.6g (off %.2g, "
                  "tolerance %.2g)",
                  wb_model_name(model), n->l[li].name, bname[bk], dir, gu, along_u, err, tol);
      }
    }
  }
  CU_ASSERT(checked >= 6);
  free(g);
  free(u);
  env_close(&e);
  wb_data_free(&d);
}

static void test_grad_mlp(void) {
  grad_check(WB_MLP);
}
static void test_grad_cnn(void) {
  grad_check(WB_CNN);
}
static void test_grad_resnet(void) {
  grad_check(WB_RESNET);
}

/* Trains `steps` steps and returns the mean loss of the first and last `win` steps. */
static void train(env_t *e, const wb_split_t *s, size_t batch, int steps, int win, double *first,
                  double *last) {
  *first = *last = 0;
  uint32_t *idx = malloc(batch * sizeof *idx);
  for (int st = 0; st < steps; st++) {
    for (size_t i = 0; i < batch; i++) idx[i] = (uint32_t)((st * batch + i) % s->n);
    float l = 0;
    size_t c = 0;
    CU_ASSERT_EQUAL_FATAL(wb_net_step(e->net, s, idx, batch, 1, &l, &c), 0);
    if (st < win) *first += l / win;
    if (st >= steps - win) *last += l / win;
  }
  free(idx);
}

/* The real data: a short MLP run must halve the loss and pass 80 % on 2000 test images. */
static void test_train_mlp_fashion(void) {
  wb_data_t d;
  char err[512];
  int rc = wb_data_load(WB_DATA_DEFAULT_DIR, &d, err, sizeof err);
  if (rc) fprintf(stderr, "\n  %s (scripts/setup.sh installs it)\n", err);
  CU_ASSERT_EQUAL_FATAL(rc, 0);
  wb_data_limit(&d, 19200, 2000);
  env_t e;
  CU_ASSERT_EQUAL_FATAL(env_open(&e, WB_MLP, 64, 0, 1), 0);
  double first, last, acc, loss;
  train(&e, &d.train, 64, 300, 20, &first, &last);
  CU_ASSERT_EQUAL(wb_net_eval(e.net, &d.test, 0, 256, &acc, &loss), 0);
  fprintf(stderr, "\n  mlp: loss %.3f -> %.3f, test accuracy %.2f%% ", first, last, 100 * acc);
  CU_ASSERT(last < 0.5 * first);
  CU_ASSERT(acc >= 0.80);
  env_close(&e);
  wb_data_free(&d);
}

/* The residual CNN learns the synthetic classes in a few dozen small steps. */
static void test_train_resnet_synthetic(void) {
  wb_data_t d;
  CU_ASSERT_EQUAL_FATAL(wb_data_synthetic(&d, 640, 200, 5), 0);
  env_t e;
  CU_ASSERT_EQUAL_FATAL(env_open(&e, WB_RESNET, 16, 0, 1), 0);
  double first, last, acc, loss;
  train(&e, &d.train, 16, 40, 8, &first, &last);
  CU_ASSERT_EQUAL(wb_net_eval(e.net, &d.test, 0, 64, &acc, &loss), 0);
  fprintf(stderr, "\n  resnet: loss %.3f -> %.3f, test accuracy %.2f%% ", first, last, 100 * acc);
  CU_ASSERT(last < 0.7 * first);
  CU_ASSERT(acc >= 0.5);
  env_close(&e);
  wb_data_free(&d);
}

/* The same seed gives the same losses, bit for bit. */
static void test_deterministic(void) {
  wb_data_t d;
  CU_ASSERT_EQUAL_FATAL(wb_data_synthetic(&d, 256, 64, 9), 0);
  double r[2][2];
  for (int k = 0; k < 2; k++) {
    env_t e;
    CU_ASSERT_EQUAL_FATAL(env_open(&e, WB_CNN, 16, 0, 42), 0);
    train(&e, &d.train, 16, 6, 3, &r[k][0], &r[k][1]);
    env_close(&e);
  }
  CU_ASSERT_EQUAL(memcmp(r[0], r[1], sizeof r[0]), 0);
  wb_data_free(&d);
}

/* Under a limit the step fails with -ENOMEM, says where and why, and gives its memory back. */
static void test_oom_clean(void) {
  wb_data_t d;
  CU_ASSERT_EQUAL_FATAL(wb_data_synthetic(&d, 64, 16, 9), 0);
  env_t e;
  CU_ASSERT_EQUAL_FATAL(env_open(&e, WB_RESNET, 64, 8u << 20, 1), 0);
  size_t params = e.meter.held;
  uint32_t idx[64];
  for (int i = 0; i < 64; i++) idx[i] = (uint32_t)i;
  float l;
  size_t c = 0;
  CU_ASSERT_EQUAL(wb_net_step(e.net, &d.train, idx, 64, 1, &l, &c), -ENOMEM);
  CU_ASSERT_PTR_NOT_NULL(strstr(e.net->where, "forward of "));
  CU_ASSERT_PTR_NOT_NULL(strstr(e.be->why, "cannot allocate"));
  CU_ASSERT_PTR_NOT_NULL(strstr(e.be->why, "limit 8.0 MiB"));
  CU_ASSERT(e.meter.held <= params);
  CU_ASSERT(e.meter.denials >= 1);
  /* A smaller batch fits afterwards: nothing leaked. */
  CU_ASSERT_EQUAL(wb_net_step(e.net, &d.train, idx, 4, 1, &l, &c), 0);
  env_close(&e);
  wb_data_free(&d);
}

/* ---- the data-parallel all-reduce (cpu: process-shared memory) ---------------------------*/

#define DP_N 1000

typedef struct dp_out_s {
  int rc[4];
  char why[4][320];
  float buf[4][DP_N];
} dp_out_t;

static float dp_value(int rank, size_t i) {
  return (float)(rank + 1) * 0.37f * (float)i - 3.f;
}

static void dp_child(wb_dp_t *dp, dp_out_t *out, int rank, int nranks, float weight,
                     uint32_t timeout_ms) {
  wb_reducer_cfg_t cfg = {.dp = dp,
                          .comm = 0,
                          .rank = rank,
                          .nranks = nranks,
                          .local_rank = rank,
                          .local_ranks = nranks,
                          .timeout_ms = timeout_ms};
  wb_reducer_t *r;
  char why[320] = "";
  int rc = wb_reducer_create(&r, &cfg, why, sizeof why);
  if (!rc) {
    for (size_t i = 0; i < DP_N; i++) out->buf[rank][i] = dp_value(rank, i);
    rc = wb_reducer_allreduce(r, out->buf[rank], DP_N, weight);
    snprintf(why, sizeof why, "%s", wb_reducer_why(r));
    wb_reducer_destroy(r, rc != 0);
  }
  out->rc[rank] = rc;
  snprintf(out->why[rank], sizeof out->why[rank], "%s", why);
}

static dp_out_t *dp_out_map(void) {
  dp_out_t *o = mmap(NULL, sizeof *o, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CU_ASSERT_FATAL(o != MAP_FAILED);
  return o;
}

/* Three ranks with unequal shares: every rank ends with the same bits, the weighted sum in rank
 * order. */
/* A refunded grant (the memory could not be had) leaves no trace in the peaks; a release does,
 * and a refund of anything but the last grant is only a release. Through liballoc's view of the
 * meter too, since liballoc refunds a chunk its provider failed to create. */
static void test_meter_refund(void) {
  wb_meter_t m;
  wb_meter_init(&m, NULL, 1000, 0);
  wl_budget_t b;
  wb_meter_budget(&m, &b);
  CU_ASSERT_PTR_NOT_NULL_FATAL(b.refund);
  CU_ASSERT_EQUAL(b.acquire(b.ctx, 300, 0), 0);
  m.iter_peak = m.held;
  CU_ASSERT_EQUAL(b.acquire(b.ctx, 500, 0), 0);
  CU_ASSERT_EQUAL(m.peak, 800);
  b.refund(b.ctx, 500);
  CU_ASSERT_EQUAL(m.held, 300);
  CU_ASSERT_EQUAL(m.peak, 300);
  CU_ASSERT_EQUAL(m.iter_peak, 300);
  CU_ASSERT_EQUAL(m.group_peak, 300);
  /* A grant that was used, then given back: its peak stays. */
  CU_ASSERT_EQUAL(wb_meter_acquire(&m, 400, 0), 0);
  wb_meter_release(&m, 400);
  CU_ASSERT_EQUAL(m.peak, 700);
  /* Not the last grant: a release, the peaks kept. */
  CU_ASSERT_EQUAL(wb_meter_acquire(&m, 200, 0), 0);
  CU_ASSERT_EQUAL(wb_meter_acquire(&m, 100, 0), 0);
  wb_meter_refund(&m, 200);
  CU_ASSERT_EQUAL(m.held, 400);
  CU_ASSERT_EQUAL(m.peak, 700);
  /* Refused: nothing drawn, nothing to refund. */
  CU_ASSERT_EQUAL(wb_meter_acquire(&m, 700, 0), -ENOMEM);
  CU_ASSERT_EQUAL(m.held, 400);
}

static void test_dp_sum(void) {
  const int n = 3;
  const float w[3] = {0.5f, 0.25f, 0.25f};
  wb_dp_t *dp = wb_dp_create(1, n, DP_N);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
  dp_out_t *out = dp_out_map();
  pid_t pid[3];
  for (int r = 0; r < n; r++) {
    pid[r] = fork();
    CU_ASSERT_FATAL(pid[r] >= 0);
    if (pid[r] == 0) {
      dp_child(dp, out, r, n, w[r], 30000);
      _exit(0);
    }
  }
  for (int r = 0; r < n; r++) {
    int st = 0;
    CU_ASSERT_EQUAL(waitpid(pid[r], &st, 0), pid[r]);
    CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CU_ASSERT_EQUAL(out->rc[r], 0);
  }
  size_t bad = 0;
  for (size_t i = 0; i < DP_N; i++) {
    float want = w[0] * dp_value(0, i);
    for (int r = 1; r < n; r++) want += w[r] * dp_value(r, i);
    for (int r = 0; r < n; r++) bad += memcmp(&out->buf[r][i], &want, sizeof want) != 0;
  }
  CU_ASSERT_EQUAL(bad, 0);
  munmap(out, sizeof *out);
  wb_dp_destroy(dp);
}

/* A rank that dies before the all-reduce: once the launcher (here the test) reports it, the
 * waiting rank returns -ECONNABORTED naming it (its 60 s timeout would give -ETIMEDOUT). */
static void test_dp_dead_rank(void) {
  wb_dp_t *dp = wb_dp_create(1, 2, DP_N);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
  dp_out_t *out = dp_out_map();
  pid_t waiter = fork();
  CU_ASSERT_FATAL(waiter >= 0);
  if (waiter == 0) {
    dp_child(dp, out, 0, 2, 0.5f, 60000);
    _exit(0);
  }
  pid_t dead = fork();
  CU_ASSERT_FATAL(dead >= 0);
  if (dead == 0) _exit(3); /* rank 1 never arrives */
  int st = 0;
  CU_ASSERT_EQUAL(waitpid(dead, &st, 0), dead);
  wb_dp_abort(dp, 0, 1);
  CU_ASSERT_EQUAL(waitpid(waiter, &st, 0), waiter);
  CU_ASSERT_EQUAL(out->rc[0], -ECONNABORTED);
  CU_ASSERT_PTR_NOT_NULL(strstr(out->why[0], "rank 1 failed or died"));
  munmap(out, sizeof *out);
  wb_dp_destroy(dp);
}

/* Nobody else arrives and nobody reports it: the timeout ends the wait, with a reason. */
static void test_dp_timeout(void) {
  wb_dp_t *dp = wb_dp_create(1, 2, DP_N);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
  static dp_out_t out;
  dp_child(dp, &out, 1, 2, 0.5f, 200);
  CU_ASSERT_EQUAL(out.rc[1], -ETIMEDOUT);
  CU_ASSERT_PTR_NOT_NULL(strstr(out.why[1], "timed out after 200 ms"));
  wb_dp_destroy(dp);
}

static void test_dp_bad_config(void) {
  wb_dp_t *dp = wb_dp_create(2, 2, 16);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
  wb_reducer_t *r = NULL;
  char why[320];
  wb_reducer_cfg_t bad[] = {
      {.dp = dp, .comm = 0, .rank = 2, .nranks = 2, .local_rank = 0},   /* rank out of range */
      {.dp = dp, .comm = 2, .rank = 0, .nranks = 2, .local_rank = 0},   /* no such communicator */
      {.dp = dp, .comm = 0, .rank = 2, .nranks = 4, .local_rank = 0},   /* cpu: one machine only */
      {.dp = NULL, .comm = 0, .rank = 0, .nranks = 1, .local_rank = 0}, /* no rendezvous */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CU_ASSERT_EQUAL(wb_reducer_create(&r, &bad[i], why, sizeof why), -EINVAL);
    CU_ASSERT_PTR_NULL(r);
    CU_ASSERT(why[0] != 0);
  }
  /* More floats than the slots hold. */
  wb_reducer_cfg_t one = {.dp = dp, .comm = 1, .rank = 0, .nranks = 1, .local_rank = 0};
  dp = wb_dp_create(2, 1, 16);
  one.dp = dp;
  CU_ASSERT_EQUAL_FATAL(wb_reducer_create(&r, &one, why, sizeof why), 0);
  float buf[32] = {0};
  CU_ASSERT_EQUAL(wb_reducer_allreduce(r, buf, 32, 1.f), -EINVAL);
  CU_ASSERT_EQUAL(wb_reducer_allreduce(r, buf, 16, 1.f), 0);
  wb_reducer_destroy(r, 0);
  wb_dp_destroy(dp);
  wb_dp_destroy(bad[0].dp);
}

/* A rank exec'd under the preload maps the rendezvous through its memfd, at another address:
 * what it sets is what the launcher's handle sees; a descriptor of something else is refused. */
static void test_dp_attach(void) {
  wb_dp_t *dp = wb_dp_create(2, 2, 16);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
  int fd = dup(wb_dp_fd(dp));
  CU_ASSERT_FATAL(fd >= 0);
  wb_dp_t *att = wb_dp_attach(fd);
  CU_ASSERT_PTR_NOT_NULL_FATAL(att);
  CU_ASSERT_EQUAL(wb__dp_dead_rank(att, 0), -1);
  wb_dp_abort(att, 1, 1);
  CU_ASSERT_EQUAL(wb__dp_dead_rank(dp, 1), 1);
  CU_ASSERT_EQUAL(wb__dp_dead_rank(dp, 0), -1);
  wb_dp_destroy(att);
  wb_dp_destroy(dp);
  int bad = memfd_create("wltest-not-dp", MFD_CLOEXEC);
  CU_ASSERT_FATAL(bad >= 0);
  CU_ASSERT_EQUAL(ftruncate(bad, 4096), 0);
  CU_ASSERT_PTR_NULL(wb_dp_attach(bad));
  close(bad);
}

static int make_id(unsigned char *id, void *arg, char *why, size_t len) {
  (void)why, (void)len;
  for (int i = 0; i < WB_DP_ID_BYTES; i++) id[i] = (unsigned char)(i * 7 + *(int *)arg);
  return 0;
}

/* The NCCL id's hand-over (the generator here is a stand-in: NCCL needs a GPU): rank 0's id
 * reaches ranks 1 and 2 of communicator 1 through the shared memory, and through a file. */
static void test_dp_share_id(void) {
  wb_dp_t *dp = wb_dp_create(2, 3, 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dp);
  dp_out_t *out = dp_out_map();
  char prefix[320], path[340], why[320] = "";
  snprintf(prefix, sizeof prefix, "%s/ncclid", tmpdir);
  snprintf(path, sizeof path, "%s.1", prefix);
  int seed = 5;
  for (int via_file = 0; via_file < 2; via_file++) {
    memset(out, 0, sizeof *out);
    pid_t pid[2];
    for (int r = 1; r <= 2; r++) {
      pid[r - 1] = fork();
      CU_ASSERT_FATAL(pid[r - 1] >= 0);
      if (pid[r - 1] == 0) {
        wb_reducer_cfg_t cf = {.dp = dp,
                               .comm = 1,
                               .rank = r,
                               .nranks = 3,
                               .local_rank = r,
                               .id_path = via_file ? prefix : NULL,
                               .timeout_ms = 30000};
        out->rc[r] = wb__dp_share_id(&cf, (unsigned char *)out->buf[r], make_id, &seed, out->why[r],
                                     sizeof out->why[r]);
        _exit(0);
      }
    }
    wb_reducer_cfg_t cf0 = {.dp = dp,
                            .comm = 1,
                            .rank = 0,
                            .nranks = 3,
                            .id_path = via_file ? prefix : NULL,
                            .timeout_ms = 30000};
    CU_ASSERT_EQUAL(
        wb__dp_share_id(&cf0, (unsigned char *)out->buf[0], make_id, &seed, why, sizeof why), 0);
    for (int r = 1; r <= 2; r++) {
      int st = 0;
      CU_ASSERT_EQUAL(waitpid(pid[r - 1], &st, 0), pid[r - 1]);
      CU_ASSERT_EQUAL(out->rc[r], 0);
      CU_ASSERT_EQUAL(memcmp(out->buf[r], out->buf[0], WB_DP_ID_BYTES), 0);
    }
    CU_ASSERT_EQUAL(((unsigned char *)out->buf[1])[3], 3 * 7 + 5);
  }
  /* A file left from an earlier run is refused rather than handed on. */
  wb_reducer_cfg_t again = {
      .dp = dp, .comm = 1, .rank = 0, .nranks = 3, .id_path = prefix, .timeout_ms = 30000};
  unsigned char id[WB_DP_ID_BYTES];
  CU_ASSERT_EQUAL(wb__dp_share_id(&again, id, make_id, &seed, why, sizeof why), -EEXIST);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "exists"));
  /* No rank 0: a waiting rank gives up at its timeout, naming the file. */
  unlink(path);
  wb_reducer_cfg_t lone = {.dp = dp,
                           .comm = 1,
                           .rank = 1,
                           .nranks = 3,
                           .local_rank = 1,
                           .id_path = prefix,
                           .timeout_ms = 200};
  CU_ASSERT_EQUAL(wb__dp_share_id(&lone, id, make_id, &seed, why, sizeof why), -ETIMEDOUT);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, path));
  munmap(out, sizeof *out);
  wb_dp_destroy(dp);
}

/* The cuda backend opens NCCL at run time: where the library is installed, it must load and
 * have what the bench calls (2.11 or newer); elsewhere the reason names the library. */
static void test_nccl_loads(void) {
  int version = 0;
  char why[256] = "";
  if (wb_nccl_available(&version, why, sizeof why)) {
    printf("(NCCL %d) ", version);
    CU_ASSERT(version >= 21100);
  } else {
    printf("(NCCL not loaded: %s) ", why);
    CU_ASSERT(why[0] != 0);
  }
}

int main(int argc, char **argv) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/wl-test-bench-XXXXXX");
  if (!mkdtemp(tmpdir)) return 2;
  static const wl_test_case_t cases[] = {
      {"idx_good_plain", test_idx_good_plain},
      {"idx_good_gz", test_idx_good_gz},
      {"idx_truncated", test_idx_truncated},
      {"idx_bad_magic", test_idx_bad_magic},
      {"idx_bad_fields", test_idx_bad_fields},
      {"idx_corrupt_gz", test_idx_corrupt_gz},
      {"idx_gz_framing", test_idx_gz_framing},
      {"data_dir", test_data_dir},
      {"grad_mlp", test_grad_mlp},
      {"grad_cnn", test_grad_cnn},
      {"grad_resnet", test_grad_resnet},
      {"train_mlp_fashion", test_train_mlp_fashion},
      {"train_resnet_synthetic", test_train_resnet_synthetic},
      {"deterministic", test_deterministic},
      {"oom_clean", test_oom_clean},
      {"meter_refund", test_meter_refund},
      {"dp_sum", test_dp_sum},
      {"dp_dead_rank", test_dp_dead_rank},
      {"dp_timeout", test_dp_timeout},
      {"dp_bad_config", test_dp_bad_config},
      {"dp_attach", test_dp_attach},
      {"dp_share_id", test_dp_share_id},
      {"nccl_loads", test_nccl_loads},
      {NULL, NULL},
  };
  int rc = wl_test_main(argc, argv, "bench", cases);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return rc;
}
