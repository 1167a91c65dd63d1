/* The trace reader: streams a file (or a buffer) block by block through one fixed buffer,
 * checking every checksum and bound, so a damaged or hostile file ends in one clear error line
 * and never in a crash or an allocation that grows with the input. */
#include "internal.h"
#include "recover.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUF_CAP    (2u << 20)   /* holds the largest block with room to spare */
#define READ_CHUNK (256u << 10) /* bytes asked of read(2) at a time */

struct wl_trace_reader_s {
  char name[256];
  int fd;
  unsigned flags;
  uint8_t *own; /* the buffer, when reading a file */
  const uint8_t *buf;
  size_t len, pos;  /* valid bytes in buf, and the read position */
  uint64_t buf_off; /* file offset of buf[0] */
  int eof;          /* no more bytes to read into buf */
  wl_trace_header_t hdr;
  /* the current block's payload */
  const uint8_t *blk;
  size_t blk_len, blk_pos;
  uint64_t blk_off; /* file offset of the payload */
  uint32_t blk_records, blk_seen;
  int blk_unchecked; /* a torn block read in salvage mode */
  uint64_t seq;
  int err;      /* sticky negative errno; 1 after the clean end */
  int pend_err; /* the error to report once a salvaged block is used up */
  uint64_t err_off;
  char msg[512];
  char **strs;
  uint32_t nstrs;
  wl_trace_reader_info_t info;
  char *path;         /* a file's path, for its rings file */
  wl__recover_t *rec; /* recovering a dead writer's events (recover.c), NULL otherwise */
  int regrown;        /* times the file grew while its writer died (recover_instead) */
};

__attribute__((format(printf, 4, 5))) static int fail(wl_trace_reader_t *r, int err, uint64_t off,
                                                      const char *fmt, ...) {
  r->err = err;
  r->err_off = off;
  int n = snprintf(r->msg, sizeof r->msg, "%s: byte %llu: ", r->name, (unsigned long long)off);
  if (n < 0) n = 0;
  if ((size_t)n < sizeof r->msg) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg + n, sizeof r->msg - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return err;
}

/* Makes at least need bytes available at buf + pos, reading more of the file when needed.
 * Returns the bytes available (less than need only at the end of the file), or -errno. */
static long ensure(wl_trace_reader_t *r, size_t need) {
  if (r->len - r->pos >= need || r->eof) return (long)(r->len - r->pos);
  uint8_t *b = r->own;
  size_t keep = r->len - r->pos;
  memmove(b, b + r->pos, keep);
  r->buf_off += r->pos;
  r->pos = 0;
  r->len = keep;
  while (r->len < need && !r->eof) {
    /* Modest reads keep the front of the buffer, where the data is used, in the cache. */
    size_t want = WL_MIN(BUF_CAP - r->len, WL_MAX(need - r->len, READ_CHUNK));
    ssize_t k = read(r->fd, b + r->len, want);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (k == 0) r->eof = 1;
    r->len += (size_t)k;
  }
  return (long)(r->len - r->pos);
}

static uint64_t cur_off(const wl_trace_reader_t *r) {
  return r->buf_off + r->pos;
}

static int read_failed(wl_trace_reader_t *r, long rc) {
  char eb[128];
  const char *es = strerror_r((int)-rc, eb, sizeof eb);
  return fail(r, -EIO, cur_off(r), "read failed: %s", es);
}

static int reader_new(wl_trace_reader_t **out, const char *name, unsigned flags) {
  wl_trace_reader_t *r = calloc(1, sizeof *r);
  *out = r;
  if (!r) return -ENOMEM;
  snprintf(r->name, sizeof r->name, "%s", name ? name : "(trace)");
  r->fd = -1;
  r->flags = flags;
  return 0;
}

static int read_header(wl_trace_reader_t *r) {
  long got = ensure(r, 16);
  if (got < 0) return read_failed(r, got);
  if (got == 0) return fail(r, -ENODATA, 0, "empty file (no trace header)");
  const char *why = NULL;
  uint64_t at = 0;
  uint32_t hsize = 0;
  if (got >= 16) {
    uint32_t want = wl__get32(r->buf + r->pos + 12);
    if (want >= WL_TRACE_HEADER_SIZE && want <= 4096) {
      got = ensure(r, want);
      if (got < 0) return read_failed(r, got);
    }
  }
  int rc = wl__header_decode(r->buf + r->pos, (size_t)got, &r->hdr, &hsize, &why, &at);
  if (rc) return fail(r, rc, at, "%s", why);
  r->pos += hsize;
  r->info.offset = cur_off(r);
  return 0;
}

int wl_trace_open(wl_trace_reader_t **out, const char *path, unsigned flags) {
  if (!out) return -EINVAL;
  wl_trace_reader_t *r;
  int rc = reader_new(&r, path, flags);
  *out = r;
  if (rc) return rc;
  if (!path) return fail(r, -EINVAL, 0, "no file name");
  r->path = strdup(path);
  if (!r->path) return fail(r, -ENOMEM, 0, "out of memory");
  r->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (r->fd < 0) {
    int e = errno;
    char eb[128];
    const char *es = strerror_r(e, eb, sizeof eb);
    return fail(r, -e, 0, "cannot open: %s", es);
  }
  struct stat st;
  if (fstat(r->fd, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return fail(r, -EISDIR, 0, "is a directory, not a trace");
    r->info.file_bytes = (uint64_t)st.st_size;
  }
  r->own = malloc(BUF_CAP);
  if (!r->own) return fail(r, -ENOMEM, 0, "out of memory");
  r->buf = r->own;
  return read_header(r);
}

int wl_trace_open_mem(wl_trace_reader_t **out, const void *data, size_t len, const char *name,
                      unsigned flags) {
  if (!out) return -EINVAL;
  wl_trace_reader_t *r;
  int rc = reader_new(&r, name, flags);
  *out = r;
  if (rc) return rc;
  if (!data && len) return fail(r, -EINVAL, 0, "no data");
  r->buf = data ? data : (const uint8_t *)"";
  r->len = len;
  r->eof = 1;
  r->info.file_bytes = len;
  return read_header(r);
}

const wl_trace_header_t *wl_trace_reader_header(const wl_trace_reader_t *r) {
  return r ? &r->hdr : NULL;
}

const char *wl_trace_reader_error(const wl_trace_reader_t *r) {
  return r ? r->msg : "";
}

uint64_t wl_trace_reader_error_offset(const wl_trace_reader_t *r) {
  return r ? r->err_off : 0;
}

const char *wl_trace_reader_string(const wl_trace_reader_t *r, uint32_t id) {
  if (!r || id == 0 || id > r->nstrs) return NULL;
  return r->strs[id - 1];
}

void wl_trace_reader_info(const wl_trace_reader_t *r, wl_trace_reader_info_t *out) {
  if (!r) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = r->info;
}

void wl_trace_reader_close(wl_trace_reader_t *r) {
  if (!r) return;
  if (r->fd >= 0) close(r->fd);
  wl__recover_close(r->rec);
  free(r->path);
  for (uint32_t i = 0; i < r->nstrs; i++) free(r->strs[i]);
  free(r->strs);
  free(r->own);
  free(r);
}

static int take_string(wl_trace_reader_t *r, const uint8_t *p, size_t size, uint64_t off);

static int take_journal_string(void *arg, const uint8_t *rec, size_t size, uint64_t off) {
  (void)off;
  wl_trace_reader_t *r = arg;
  /* Offsets in the rings file would mislead in a message about the trace: fail quietly. */
  int rc = take_string(r, rec, size, 0);
  if (rc) {
    r->err = 0;
    r->msg[0] = 0;
    r->err_off = 0;
  }
  return rc;
}

void (*wl__reader_eof_hook)(void *arg);
void *wl__reader_eof_hook_arg;

/* At the trace's end (clean, or cut by a torn write), without an END record: continues with a
 * dead writer's rings when there are any. 1: recovering (any error so far is withdrawn: the cut
 * block's records are all in the rings), 0: nothing to recover, 3: the writer died after
 * writing more of the file (read on: more bytes are there, eof is cleared). */
static int recover_instead(wl_trace_reader_t *r) {
  if (r->rec || !r->path || (r->flags & WL_TRACE_OPEN_NO_RINGS) || r->info.complete) return 0;
  if (wl__reader_eof_hook) wl__reader_eof_hook(wl__reader_eof_hook_arg);
  if (wl__recover_open(&r->rec, r->path, &r->hdr, r->seq)) return 0;
  /* Dead now, but it may have written blocks since we hit the end, and given back their ring
   * slots: the rings start after them, so they must be read from the file first. A dead writer
   * writes no more, so this happens at most once for it (bounded all the same). */
  struct stat st;
  if (r->fd >= 0 && r->regrown < 4 && fstat(r->fd, &st) == 0 &&
      (uint64_t)st.st_size > r->buf_off + r->len) {
    wl__recover_close(r->rec);
    r->rec = NULL;
    r->regrown++;
    r->eof = 0;
    r->info.file_bytes = (uint64_t)st.st_size;
    return 3;
  }
  if (wl__recover_strings(r->rec, r->nstrs, take_journal_string, r)) {
    wl__recover_close(r->rec);
    r->rec = NULL;
    return 0;
  }
  r->err = 0;
  r->pend_err = 0;
  r->msg[0] = 0;
  r->err_off = 0;
  return 1;
}

/* Loads the next block. 1: loaded, 0: clean end of file, 2: the rest comes from the rings,
 * negative errno: failure. */
static int next_block(wl_trace_reader_t *r) {
  if (r->pend_err) return r->pend_err;
  uint64_t off = cur_off(r);
  long got = ensure(r, WL_TRACE_BLOCK_HEADER);
  if (got < 0) return read_failed(r, got);
  if (got == 0) {
    int rv = recover_instead(r);
    return rv == 3 ? next_block(r) : rv ? 2 : 0;
  }
  const uint8_t *h = r->buf + r->pos;
  if (got < (long)WL_TRACE_BLOCK_HEADER) {
    /* A block header cut short is a crash's torn write, unless its bytes already disagree. */
    static const uint8_t magic[4] = {'W', 'L', 'B', 'K'};
    if (memcmp(h, magic, (size_t)WL_MIN(got, 4)) != 0)
      return fail(r, -EBADMSG, off, "bad block magic (corrupted)");
    int rv = recover_instead(r);
    if (rv == 3) return next_block(r);
    if (rv) return 2;
    return fail(r, -ENODATA, off + (uint64_t)got,
                "truncated: the file ends inside the block header at byte %llu",
                (unsigned long long)off);
  }
  if (wl__get32(h) != WL__BLOCK_MAGIC) return fail(r, -EBADMSG, off, "bad block magic (corrupted)");
  if (wl__crc32c(0, h, 28) != wl__get32(h + 28))
    return fail(r, -EBADMSG, off + 28, "block header checksum mismatch (corrupted)");
  uint32_t bytes = wl__get32(h + 4), records = wl__get32(h + 8);
  uint64_t seq = wl__get64(h + 16);
  if (bytes > WL_TRACE_BLOCK_LIMIT || bytes % 8 || records > bytes / 16)
    return fail(r, -EBADMSG, off + 4, "bad block size %u (corrupted)", bytes);
  if (seq != r->seq)
    return fail(r, -EBADMSG, off + 16,
                "block number %llu where %llu was expected (blocks lost or repeated)",
                (unsigned long long)seq, (unsigned long long)r->seq);
  got = ensure(r, WL_TRACE_BLOCK_HEADER + bytes);
  if (got < 0) return read_failed(r, got);
  h = r->buf + r->pos;
  r->blk = h + WL_TRACE_BLOCK_HEADER;
  r->blk_off = off + WL_TRACE_BLOCK_HEADER;
  r->blk_pos = 0;
  r->blk_seen = 0;
  r->blk_records = records;
  r->blk_unchecked = 0;
  if (got < (long)(WL_TRACE_BLOCK_HEADER + bytes)) {
    uint64_t end = off + (uint64_t)got;
    fail(r, -ENODATA, end,
         "truncated: the block at byte %llu needs %u bytes, the file ends %llu bytes into it",
         (unsigned long long)off, WL_TRACE_BLOCK_HEADER + bytes, (unsigned long long)(end - off));
    int rv = recover_instead(r);
    if (rv == 3) { /* the rest of the block was written meanwhile */
      r->err = 0;
      r->msg[0] = 0;
      r->err_off = 0;
      return next_block(r);
    }
    if (rv) return 2;
    if (!(r->flags & WL_TRACE_OPEN_SALVAGE)) return r->err;
    /* Salvage: the prefix a torn write leaves is what was written; use its whole records. */
    r->pend_err = r->err;
    r->err = 0;
    r->blk_len = ((size_t)got - WL_TRACE_BLOCK_HEADER) & ~(size_t)7;
    r->blk_unchecked = 1;
    r->pos += (size_t)got;
    r->info.truncated = 1;
    return 1;
  }
  if (wl__payload_sum(r->blk, bytes) != wl__get32(h + 12))
    return fail(r, -EBADMSG, off, "block checksum mismatch (corrupted)");
  r->blk_len = bytes;
  r->pos += WL_TRACE_BLOCK_HEADER + bytes;
  r->seq++;
  r->info.blocks++;
  return 1;
}

/* Decodes one STRING record of size bytes at p. */
static int take_string(wl_trace_reader_t *r, const uint8_t *p, size_t size, uint64_t off) {
  if (size < 24) return fail(r, -EBADMSG, off, "string record too short (corrupted)");
  uint32_t id = wl__get32(p + 16), len = wl__get32(p + 20);
  if (len > WL_TRACE_STRING_MAX || 24 + (size_t)len > size)
    return fail(r, -EBADMSG, off + 20, "bad string length %u (corrupted)", len);
  if (id != r->nstrs + 1)
    return fail(r, -EBADMSG, off + 16, "string id %u out of order (corrupted)", id);
  if (r->nstrs >= WL_TRACE_STRINGS_MAX)
    return fail(r, -EBADMSG, off, "more than %u strings", WL_TRACE_STRINGS_MAX);
  if ((r->nstrs & (r->nstrs - 1)) == 0 || r->nstrs == 0) {
    uint32_t cap = r->nstrs ? 2 * r->nstrs : 16;
    char **ns = realloc(r->strs, cap * sizeof *ns);
    if (!ns) return fail(r, -ENOMEM, off, "out of memory");
    r->strs = ns;
  }
  char *s = malloc((size_t)len + 1);
  if (!s) return fail(r, -ENOMEM, off, "out of memory");
  memcpy(s, p + 24, len);
  s[len] = 0;
  r->strs[r->nstrs++] = s;
  return 0;
}

static uint64_t add_sat(uint64_t a, uint64_t b) {
  return a + b < a ? UINT64_MAX : a + b;
}

/* Decodes the records of the current block into evs until n events, the block's end or a
 * failure. The position lives in a local: stores into evs could otherwise alias it. */
static size_t decode(wl_trace_reader_t *r, wl_trace_event_t *evs, size_t n) {
  const uint8_t *blk = r->blk;
  size_t pos = r->blk_pos, len = r->blk_len, k = 0;
  uint32_t seen = 0;
  const uint64_t origin = r->hdr.origin_ns;
  while (k < n && pos < len) {
    const uint8_t *p = blk + pos;
    size_t left = len - pos, size = left >= 16 ? (size_t)p[1] * 8 : 0;
    if (WL_UNLIKELY(size < 16 || size > left)) {
      if (r->blk_unchecked) { /* the torn tail of a salvaged block */
        pos = len;
        break;
      }
      fail(r, -EBADMSG, r->blk_off + pos, "bad record size (corrupted)");
      break;
    }
    unsigned kind = p[0];
    if (WL_UNLIKELY(kind == 0 || kind >= WL_TRACE_KIND_COUNT || kind == WL_TRACE_STRING ||
                    kind == WL_TRACE_END || size < wl__record_bytes(kind))) {
      uint64_t off = r->blk_off + pos;
      pos += size;
      seen++;
      if (kind == WL_TRACE_STRING) {
        if (take_string(r, p, size, off)) break;
      } else if (kind == 0 || kind >= WL_TRACE_KIND_COUNT) {
        /* a newer minor's kind: skipped */
      } else if (size < wl__record_bytes(kind)) {
        fail(r, -EBADMSG, off + 1, "%s record of %zu bytes is too short (corrupted)",
             wl_trace_kind_name(kind), size);
        break;
      } else { /* END */
        r->info.complete = 1;
        r->info.end_events = wl__get64(p + 24);
        r->info.end_dropped = wl__get64(p + 32);
      }
      continue;
    }
    pos += size;
    seen++;
    wl_trace_event_t *ev = &evs[k++];
    uint64_t dt = wl__get64(p + 8), f0 = wl__get64(p + 16);
    ev->time_ns = origin + dt < origin ? UINT64_MAX : origin + dt;
    ev->kind = (uint16_t)kind;
    ev->aux = wl__get16(p + 2);
    ev->tid = wl__get32(p + 4);
    ev->size = wl__get64(p + 24);
    ev->arg = wl__get64(p + 32);
    ev->addr = f0;
    ev->id = 0;
    ev->grid[0] = ev->grid[1] = ev->grid[2] = 0;
    if (WL_UNLIKELY(kind >= WL_TRACE_LAUNCH)) {
      if (kind == WL_TRACE_LAUNCH) {
        ev->grid[0] = wl__get32(p + 40);
        ev->grid[1] = wl__get32(p + 44);
        ev->grid[2] = wl__get32(p + 48);
        ev->id = wl__get32(p + 52);
      } else if (kind == WL_TRACE_MARKER || kind == WL_TRACE_PHASE) {
        ev->addr = 0;
        ev->id = (uint32_t)f0;
      } else if (kind == WL_TRACE_DROPPED) {
        r->info.dropped = add_sat(r->info.dropped, ev->size);
      }
    }
  }
  r->blk_pos = pos;
  r->blk_seen += seen;
  if (k && r->blk_unchecked) r->info.salvaged = 1;
  return k;
}

long wl_trace_read(wl_trace_reader_t *r, wl_trace_event_t *evs, size_t n) {
  if (!r) return -EINVAL;
  if (r->err) return r->err > 0 ? 0 : r->err;
  size_t k = 0;
  while (k < n) {
    if (r->rec) {
      size_t got = wl__recover_read(r->rec, evs + k, n - k);
      if (!got) {
        r->err = 1;
        break;
      }
      for (size_t i = k; i < k + got; i++)
        if (evs[i].kind == WL_TRACE_DROPPED)
          r->info.dropped = add_sat(r->info.dropped, evs[i].size);
      r->info.recovered += got;
      k += got;
      continue;
    }
    if (r->blk_pos >= r->blk_len) {
      if (r->blk && !r->blk_unchecked && r->blk_seen != r->blk_records) {
        fail(r, -EBADMSG, r->blk_off - WL_TRACE_BLOCK_HEADER + 8,
             "block holds %u records, its header says %u (corrupted)", r->blk_seen, r->blk_records);
        break;
      }
      r->blk = NULL;
      r->blk_len = r->blk_pos = 0;
      int rc = next_block(r);
      if (rc < 0) {
        r->err = rc;
        r->pend_err = 0;
        break;
      }
      if (rc == 0) {
        r->err = 1;
        break;
      }
      continue; /* 1: a block, 2: the rings */
    }
    k += decode(r, evs + k, n - k);
    if (r->err) break;
  }
  r->info.events += k;
  r->info.offset = r->blk ? r->blk_off + r->blk_pos : cur_off(r);
  if (k) return (long)k;
  return r->err > 0 ? 0 : r->err;
}
