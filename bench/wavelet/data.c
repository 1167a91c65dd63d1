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

/* An idx file, plain or gzip. gzread is not used: it returns a clean end of file for a gzip
 * stream cut off in its trailer (the CRC and length) and skips garbage after the last member, so
 * both would load as good data. Here gzip is inflated member by member up to the file's end. */
typedef struct src_s {
  FILE *f;
  int gz;       /* the file starts with gzip's magic (1f 8b) */
  int done;     /* gzip: the last member ended with the file */
  z_stream z;   /* gzip: inflate's state, reading from in */
  char why[96]; /* what went wrong (read returned -1) */
  uint8_t in[16384];
} src_t;

/* Refills the input buffer, keeping what is left; the bytes read, 0 at the end of the file, or
 * -1 on a read error. */
static long refill(src_t *s) {
  if (s->z.avail_in) memmove(s->in, s->z.next_in, s->z.avail_in);
  size_t n = fread(s->in + s->z.avail_in, 1, sizeof s->in - s->z.avail_in, s->f);
  s->z.next_in = s->in;
  s->z.avail_in += (uInt)n;
  if (n == 0 && ferror(s->f)) {
    snprintf(s->why, sizeof s->why, "read error: %s", strerror(errno ? errno : EIO));
    return -1;
  }
  return (long)n;
}

static int src_open(src_t *s, const char *path) {
  memset(s, 0, sizeof *s);
  errno = 0;
  s->f = fopen(path, "rb");
  if (!s->f) return -(errno ? errno : EIO);
  if (refill(s) < 0) return -EIO;
  s->gz = s->z.avail_in >= 2 && s->in[0] == 0x1f && s->in[1] == 0x8b;
  if (s->gz && inflateInit2(&s->z, 15 + 16) != Z_OK) return -ENOMEM; /* 16: gzip only */
  return 0;
}

static void src_close(src_t *s) {
  if (s->gz) inflateEnd(&s->z);
  if (s->f) fclose(s->f);
}

/* After a gzip member: the file ends, or another member follows (gzip allows concatenation);
 * anything else is garbage. 0, or -1 with why. */
static int member_end(src_t *s) {
  if (s->z.avail_in < 2 && refill(s) < 0) return -1;
  if (s->z.avail_in == 0) {
    s->done = 1;
    return 0;
  }
  if (s->z.avail_in >= 2 && s->z.next_in[0] == 0x1f && s->z.next_in[1] == 0x8b) {
    inflateReset(&s->z);
    return 0;
  }
  snprintf(s->why, sizeof s->why, "unexpected data after the gzip stream");
  return -1;
}

/* Reads up to len bytes; returns the count (short only at the end of the data), or -1 with why
 * (a read error, a corrupt or truncated gzip stream, garbage after it). */
static long long src_read(src_t *s, uint8_t *buf, size_t len) {
  if (!s->gz) {
    /* What the magic check read first is served before the file. */
    size_t got = 0;
    if (s->z.avail_in) {
      got = len < s->z.avail_in ? len : s->z.avail_in;
      memcpy(buf, s->z.next_in, got);
      s->z.next_in += got;
      s->z.avail_in -= (uInt)got;
    }
    got += fread(buf + got, 1, len - got, s->f);
    if (got < len && ferror(s->f)) {
      snprintf(s->why, sizeof s->why, "read error: %s", strerror(errno ? errno : EIO));
      return -1;
    }
    return (long long)got;
  }
  size_t got = 0;
  while (got < len && !s->done) {
    if (s->z.avail_in == 0) {
      long n = refill(s);
      if (n < 0) return -1;
      if (n == 0) {
        snprintf(s->why, sizeof s->why, "truncated gzip stream");
        return -1;
      }
    }
    size_t want = len - got;
    if (want > (1u << 30)) want = 1u << 30;
    s->z.next_out = buf + got;
    s->z.avail_out = (uInt)want;
    int r = inflate(&s->z, Z_NO_FLUSH);
    got += want - s->z.avail_out;
    if (r == Z_STREAM_END) {
      if (member_end(s)) return -1;
    } else if (r != Z_OK && r != Z_BUF_ERROR) {
      snprintf(s->why, sizeof s->why, "%s", s->z.msg ? s->z.msg : "corrupt gzip data");
      return -1;
    }
  }
  return (long long)got;
}

int wb_idx_read(const char *path, int kind, size_t *items, uint8_t **out, char *err,
                size_t errlen) {
  *items = 0;
  *out = NULL;
  if (kind != 1 && kind != 3) return fail(err, errlen, -EINVAL, "%s: bad idx kind", path);
  const char *what = kind == 3 ? "images" : "labels";
  src_t *f = malloc(sizeof *f);
  if (!f) return fail(err, errlen, -ENOMEM, "%s: %s", path, strerror(ENOMEM));
  int rc = src_open(f, path);
  if (rc) {
    src_close(f);
    free(f);
    return fail(err, errlen, rc, "%s: %s", path, strerror(-rc));
  }
  uint8_t *buf = NULL;
  size_t hlen = 4 + 4 * (size_t)kind;
  uint8_t h[16];
  long long got = src_read(f, h, hlen);
  if (got < 0) {
    rc = fail(err, errlen, -EIO, "%s: %s (not a valid gzip or idx file)", path, f->why);
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
  got = src_read(f, buf, body);
  if (got < 0) {
    rc = fail(err, errlen, -EIO, "%s: %s", path, f->why);
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
  got = src_read(f, &extra, 1);
  if (got < 0) {
    rc = fail(err, errlen, -EIO, "%s: %s, after the %u %s", path, f->why, dim[0], what);
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
  src_close(f);
  free(f);
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
