/* Reads Fashion-MNIST's idx files (validated field by field) and makes synthetic data. */
#include "data.h"
#include "rng.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static int fail(char *err, size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t len, int rc, const char *fmt, ...) {
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* Reads up to len bytes; returns the count, or -1 on a zlib error (a corrupt gzip stream). */
static long long read_full(gzFile f, uint8_t *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    size_t want = len - got;
    if (want > (1u << 30)) want = 1u << 30;
    int r = gzread(f, buf + got, (unsigned)want);
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (long long)got;
}

static const char *gz_why(gzFile f) {
  int code = 0;
  const char *m = gzerror(f, &code);
  return (m && *m) ? m : "read error";
}

int wb_idx_read(const char *path, int kind, size_t *items, uint8_t **out, char *err,
                size_t errlen) {
  *items = 0;
  *out = NULL;
  if (kind != 1 && kind != 3) return fail(err, errlen, -EINVAL, "%s: bad idx kind", path);
  const char *what = kind == 3 ? "images" : "labels";
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (!f) {
    int e = errno ? errno : ENOMEM;
    return fail(err, errlen, -e, "%s: %s", path, strerror(e));
  }
  int rc = 0;
  uint8_t *buf = NULL;
  size_t hlen = 4 + 4 * (size_t)kind;
  uint8_t h[16];
  long long got = read_full(f, h, hlen);
  if (got < 0) {
    rc = fail(err, errlen, -EIO, "%s: %s (not a valid gzip or idx file)", path, gz_why(f));
    goto out;
  }
  if ((size_t)got < hlen) {
    rc = fail(err, errlen, -EPROTO,
              "%s: truncated: expected a %zu-byte idx header for %s, found %lld bytes", path, hlen,
              what, got);
    goto out;
  }
  uint32_t magic = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
  uint32_t want_magic = 0x00000800u | (uint32_t)kind;
  if (magic != want_magic) {
    rc = fail(err, errlen, -EPROTO,
              "%s: bad magic 0x%08x: expected 0x%08x (idx unsigned bytes, %d dimension%s: %s)",
              path, magic, want_magic, kind, kind == 1 ? "" : "s", what);
    goto out;
  }
  uint32_t dim[3];
  for (int i = 0; i < kind; i++)
    dim[i] = (uint32_t)h[4 + 4 * i] << 24 | (uint32_t)h[5 + 4 * i] << 16 |
             (uint32_t)h[6 + 4 * i] << 8 | h[7 + 4 * i];
  if (dim[0] == 0 || dim[0] > WB_IDX_MAX_ITEMS) {
    rc = fail(err, errlen, -EPROTO, "%s: %u %s in the header: expected 1 to %u", path, dim[0], what,
              WB_IDX_MAX_ITEMS);
    goto out;
  }
  if (kind == 3 && (dim[1] != WB_IMG_ROWS || dim[2] != WB_IMG_COLS)) {
    rc = fail(err, errlen, -EPROTO, "%s: images of %u x %u pixels: expected %d x %d", path, dim[1],
              dim[2], WB_IMG_ROWS, WB_IMG_COLS);
    goto out;
  }
  size_t item = kind == 3 ? (size_t)WB_IMG_PIXELS : 1;
  size_t body = (size_t)dim[0] * item;
  buf = malloc(body);
  if (!buf) {
    rc = fail(err, errlen, -ENOMEM, "%s: cannot allocate %zu bytes for %u %s", path, body, dim[0],
              what);
    goto out;
  }
  got = read_full(f, buf, body);
  if (got < 0) {
    rc = fail(err, errlen, -EIO, "%s: %s (corrupt gzip data)", path, gz_why(f));
    goto out;
  }
  if ((size_t)got < body) {
    rc = fail(err, errlen, -EPROTO,
              "%s: truncated: the header announces %u %s (%zu bytes after the %zu-byte header), "
              "found %lld bytes",
              path, dim[0], what, body, hlen, got);
    goto out;
  }
  uint8_t extra;
  got = read_full(f, &extra, 1);
  if (got < 0) {
    rc = fail(err, errlen, -EIO, "%s: %s after the %u %s (corrupt gzip data)", path, gz_why(f),
              dim[0], what);
    goto out;
  }
  if (got > 0) {
    rc = fail(err, errlen, -EPROTO,
              "%s: unexpected data after the %u %s the header announces: expected the file to end",
              path, dim[0], what);
    goto out;
  }
  if (kind == 1) {
    for (size_t i = 0; i < body; i++)
      if (buf[i] >= WB_CLASSES) {
        rc = fail(err, errlen, -EPROTO, "%s: label %u at index %zu: expected 0 to %d", path, buf[i],
                  i, WB_CLASSES - 1);
        goto out;
      }
  }
  *items = dim[0];
  *out = buf;
  buf = NULL;
out:
  free(buf);
  gzclose(f);
  return rc;
}

/* DIR/PREFIX-WHAT.gz, else DIR/PREFIX-WHAT; -ENOENT (err says which) when neither exists. */
static int find_file(const char *dir, const char *prefix, const char *what, char *path, size_t len,
                     char *err, size_t errlen) {
  struct stat st;
  snprintf(path, len, "%s/%s-%s.gz", dir, prefix, what);
  if (stat(path, &st) == 0) return 0;
  snprintf(path, len, "%s/%s-%s", dir, prefix, what);
  if (stat(path, &st) == 0) return 0;
  return fail(err, errlen, -ENOENT,
              "%s: no %s-%s.gz or %s-%s: expected the Fashion-MNIST idx files (Debian package "
              "dataset-fashion-mnist), or use --data synthetic",
              dir, prefix, what, prefix, what);
}

static int load_split(const char *dir, const char *prefix, wb_split_t *s, char *err,
                      size_t errlen) {
  char ipath[PATH_MAX], lpath[PATH_MAX];
  if (find_file(dir, prefix, "images-idx3-ubyte", ipath, sizeof ipath, err, errlen) ||
      find_file(dir, prefix, "labels-idx1-ubyte", lpath, sizeof lpath, err, errlen))
    return -ENOENT;
  size_t ni, nl;
  int rc = wb_idx_read(ipath, 3, &ni, &s->images, err, errlen);
  if (rc) return rc;
  rc = wb_idx_read(lpath, 1, &nl, &s->labels, err, errlen);
  if (rc) return rc;
  if (ni != nl)
    return fail(err, errlen, -EPROTO, "%s: %zu labels, but %s has %zu images: expected as many",
                lpath, nl, ipath, ni);
  s->n = ni;
  return 0;
}

int wb_data_load(const char *dir, wb_data_t *d, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  snprintf(d->source, sizeof d->source, "%s", dir);
  int rc = load_split(dir, "train", &d->train, err, errlen);
  if (!rc) rc = load_split(dir, "t10k", &d->test, err, errlen);
  if (rc) wb_data_free(d);
  return rc;
}

/* Class c: a bright horizontal bar at a class-dependent height and a vertical bar at a
 * class-dependent column, on noise; easy to learn, but not by one pixel. */
static void synth_split(wb_split_t *s, size_t n, wb_rng_t *r) {
  for (size_t i = 0; i < n; i++) {
    int c = (int)(wb_rng_next(r) % WB_CLASSES);
    s->labels[i] = (uint8_t)c;
    uint8_t *img = s->images + i * WB_IMG_PIXELS;
    int row = 3 + 2 * c + (int)(wb_rng_next(r) % 3);
    int col = 24 - 2 * c + (int)(wb_rng_next(r) % 3) - 1;
    for (int y = 0; y < WB_IMG_ROWS; y++)
      for (int x = 0; x < WB_IMG_COLS; x++) {
        int v = (int)(wb_rng_next(r) % 96);
        if (y == row || y == row + 1) v += 140;
        if (x == col && c % 2 == 0) v += 100;
        img[y * WB_IMG_COLS + x] = (uint8_t)(v > 255 ? 255 : v);
      }
  }
  s->n = n;
}

int wb_data_synthetic(wb_data_t *d, size_t n_train, size_t n_test, uint64_t seed) {
  memset(d, 0, sizeof *d);
  snprintf(d->source, sizeof d->source, "synthetic");
  d->train.images = malloc(n_train * WB_IMG_PIXELS);
  d->train.labels = malloc(n_train);
  d->test.images = malloc(n_test * WB_IMG_PIXELS);
  d->test.labels = malloc(n_test);
  if (!d->train.images || !d->train.labels || !d->test.images || !d->test.labels) {
    wb_data_free(d);
    return -ENOMEM;
  }
  wb_rng_t r;
  wb_rng_seed(&r, seed ^ 0x5eedda7aull);
  synth_split(&d->train, n_train, &r);
  synth_split(&d->test, n_test, &r);
  return 0;
}

void wb_data_limit(wb_data_t *d, size_t n_train, size_t n_test) {
  if (n_train && n_train < d->train.n) d->train.n = n_train;
  if (n_test && n_test < d->test.n) d->test.n = n_test;
}

void wb_data_free(wb_data_t *d) {
  free(d->train.images);
  free(d->train.labels);
  free(d->test.images);
  free(d->test.labels);
  memset(&d->train, 0, sizeof d->train);
  memset(&d->test, 0, sizeof d->test);
}
