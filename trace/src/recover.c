/* Recovery of a dead writer's unwritten events from its rings file (rings.h): checks that the
 * file belongs to the trace and that its writer is gone, then merges the rings' remaining events
 * in time order, reading with pread(2) into small fixed buffers (bounded memory, no mapping a
 * hostile file could SIGBUS). */
#include "recover.h"
#include "rings.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_RINGS 1024u /* rings merged; a process with more threads loses the rest */
#define RBUF      32u   /* events buffered per ring */

typedef struct rring_s {
  uint64_t next, end; /* ring positions still to return */
  uint64_t mask;
  uint64_t ev_off; /* file offset of ev[0] */
  uint64_t dropped;
  uint32_t tid;
  uint32_t bpos, blen;
  wl_trace_event_t buf[RBUF];
} rring_t;

struct wl__recover_s {
  int fd;
  wl__rings_header_t h;
  rring_t *rings;
  uint32_t n, *heap, hn;
  size_t drop_i;    /* DROPPED records still to return, ring index */
  uint64_t last_ns; /* time of the last event returned */
};

static int pread_all(int fd, void *buf, size_t n, uint64_t off) {
  uint8_t *p = buf;
  while (n) {
    ssize_t k = pread(fd, p, n, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -EIO;
    p += k;
    n -= (size_t)k;
    off += (uint64_t)k;
  }
  return 0;
}

/* Refills a ring's buffer; 0 when it has nothing left. */
static uint32_t refill(wl__recover_t *c, rring_t *g) {
  g->bpos = g->blen = 0;
  uint64_t left = g->end - g->next;
  if (!left) return 0;
  uint64_t idx = g->next & g->mask;
  uint64_t k = WL_MIN(left, WL_MIN((uint64_t)RBUF, g->mask + 1 - idx)); /* up to the wrap */
  if (pread_all(c->fd, g->buf, (size_t)k * sizeof(wl_trace_event_t),
                g->ev_off + idx * sizeof(wl_trace_event_t))) {
    g->next = g->end; /* unreadable: this ring ends here */
    return 0;
  }
  g->next += k;
  g->blen = (uint32_t)k;
  return g->blen;
}

static uint64_t top_time(const wl__recover_t *c, uint32_t i) {
  const rring_t *g = &c->rings[i];
  return g->buf[g->bpos].time_ns;
}

static void heap_down(wl__recover_t *c, uint32_t i) {
  for (;;) {
    uint32_t l = 2 * i + 1, m = i;
    if (l < c->hn && top_time(c, c->heap[l]) < top_time(c, c->heap[m])) m = l;
    if (l + 1 < c->hn && top_time(c, c->heap[l + 1]) < top_time(c, c->heap[m])) m = l + 1;
    if (m == i) return;
    uint32_t t = c->heap[i];
    c->heap[i] = c->heap[m];
    c->heap[m] = t;
    i = m;
  }
}

int wl__recover_open(wl__recover_t **out, const char *trace_path, const wl_trace_header_t *th,
                     uint64_t blocks_read) {
  *out = NULL;
  char path[4096];
  if (!trace_path ||
      snprintf(path, sizeof path, "%s%s", trace_path, WL_TRACE_RINGS_SUFFIX) >= (int)sizeof path)
    return -ENAMETOOLONG;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  wl__recover_t *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return -ENOMEM;
  }
  c->fd = fd;
  int rc = -EBADMSG;
  struct stat st;
  /* A live writer holds the lock: its rings are still moving, and it will write them itself. */
  if (wl__life_held(fd) == 1) {
    rc = -EBUSY;
    goto fail;
  }
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) goto fail;
  wl__rings_header_t *h = &c->h;
  if (pread_all(fd, h, sizeof *h, 0)) goto fail;
  uint64_t re = h->ring_events;
  if (memcmp(h->magic, WL__RINGS_MAGIC, sizeof h->magic) || h->version != WL__RINGS_VERSION ||
      h->header_bytes != WL__RINGS_HEADER || h->event_bytes != sizeof(wl_trace_event_t) ||
      h->ring_header_bytes != offsetof(wl__ring_t, ev) || re < 2 || re > WL__RINGS_MAX_EVENTS ||
      (re & (re - 1)) || h->slot_bytes != wl__ring_slot_bytes(re) ||
      h->strings_off != WL__RINGS_HEADER || h->strings_cap != WL__RINGS_STR_CAP ||
      h->slots_off != WL__RINGS_SLOTS_OFF || atomic_load(&h->broken))
    goto fail;
  /* The rings of this very trace, not of an earlier one at the same path. */
  if (h->pid != th->pid || h->origin_ns != th->origin_ns || h->wall_ns != th->wall_ns) goto fail;
  uint64_t nslots = atomic_load(&h->nslots);
  uint64_t fit = (uint64_t)st.st_size > h->slots_off
                     ? ((uint64_t)st.st_size - h->slots_off) / h->slot_bytes
                     : 0;
  if (nslots > fit) nslots = fit;
  if (atomic_load(&h->strings_len) > h->strings_cap ||
      h->strings_off + atomic_load(&h->strings_len) > (uint64_t)st.st_size)
    goto fail;
  /* The block the flusher was writing made it into the trace only if the reader got past it. */
  uint64_t pend = atomic_load(&h->pend_seq);
  int pend_done = pend != WL__RINGS_NO_SEQ && pend < blocks_read;

  rc = -ENOMEM;
  c->rings = calloc(WL_MIN(nslots, MAX_RINGS) + 1, sizeof *c->rings);
  c->heap = calloc(WL_MIN(nslots, MAX_RINGS) + 1, sizeof *c->heap);
  if (!c->rings || !c->heap) goto fail;
  for (uint64_t s = 0; s < nslots && c->n < MAX_RINGS; s++) {
    wl__ring_t rh;
    uint64_t off = h->slots_off + s * h->slot_bytes;
    if (pread_all(fd, &rh, sizeof rh, off)) continue;
    if (atomic_load(&rh.state) != WL__RING_ACTIVE || rh.mask != re - 1) continue;
    uint64_t head = atomic_load(&rh.head);
    uint64_t start = pend_done ? atomic_load(&rh.pend_tail) : atomic_load(&rh.tail);
    uint64_t dbase = pend_done ? rh.pend_dropped : rh.dropped_done;
    if (start > head || head - start > re) continue; /* inconsistent: not trusted */
    rring_t *g = &c->rings[c->n];
    g->next = start;
    g->end = head;
    g->mask = re - 1;
    g->ev_off = off + h->ring_header_bytes;
    g->tid = rh.tid;
    uint64_t d = atomic_load(&rh.dropped);
    g->dropped = d > dbase ? d - dbase : 0;
    if (refill(c, g)) c->heap[c->hn++] = c->n;
    c->n++;
  }
  for (uint32_t i = c->hn; i-- > 0;) heap_down(c, i);
  *out = c;
  return 0;
fail:
  wl__recover_close(c);
  return rc;
}

int wl__recover_strings(wl__recover_t *c, uint32_t have,
                        int (*take)(void *arg, const uint8_t *rec, size_t size, uint64_t off),
                        void *arg) {
  uint64_t len = atomic_load(&c->h.strings_len), pos = 0;
  uint8_t rec[24 + WL_TRACE_STRING_MAX];
  while (pos + 24 <= len) {
    uint64_t off = c->h.strings_off + pos;
    if (pread_all(c->fd, rec, 24, off)) return -EIO;
    size_t size = (size_t)rec[1] * 8;
    if (rec[0] != WL_TRACE_STRING || size < 24 || size > sizeof rec || pos + size > len)
      return -EBADMSG;
    uint32_t id;
    memcpy(&id, rec + 16, 4);
    if (id > have) {
      if (pread_all(c->fd, rec + 24, size - 24, off + 24)) return -EIO;
      int rc = take(arg, rec, size, off);
      if (rc) return rc;
    }
    pos += size;
  }
  return 0;
}

size_t wl__recover_read(wl__recover_t *c, wl_trace_event_t *evs, size_t n) {
  size_t k = 0;
  while (k < n && c->hn) {
    uint32_t i = c->heap[0];
    rring_t *g = &c->rings[i];
    wl_trace_event_t ev = g->buf[g->bpos];
    /* wl_trace_emit lets no other kind into a ring, so this ring is damaged (or the file is not
     * what it claims): none of it is trusted, and a sparse file cannot make us walk zeros. */
    if (ev.kind == 0 || ev.kind >= WL_TRACE_KIND_COUNT || ev.kind == WL_TRACE_STRING ||
        ev.kind == WL_TRACE_END) {
      g->next = g->end;
      g->dropped = 0;
      c->heap[0] = c->heap[--c->hn];
      heap_down(c, 0);
      continue;
    }
    if (++g->bpos == g->blen && !refill(c, g)) c->heap[0] = c->heap[--c->hn];
    heap_down(c, 0);
    if (ev.kind != WL_TRACE_LAUNCH) ev.grid[0] = ev.grid[1] = ev.grid[2] = 0;
    if (ev.kind != WL_TRACE_LAUNCH && ev.kind != WL_TRACE_MARKER && ev.kind != WL_TRACE_PHASE)
      ev.id = 0;
    evs[k++] = ev;
    c->last_ns = ev.time_ns;
  }
  /* Then what the rings dropped since the last DROPPED record in the trace. */
  while (k < n && !c->hn && c->drop_i < c->n) {
    rring_t *g = &c->rings[c->drop_i++];
    if (!g->dropped) continue;
    wl_trace_event_t ev = {.kind = WL_TRACE_DROPPED, .tid = g->tid, .size = g->dropped};
    ev.time_ns = c->last_ns;
    evs[k++] = ev;
  }
  return k;
}

void wl__recover_close(wl__recover_t *c) {
  if (!c) return;
  if (c->fd >= 0) close(c->fd);
  free(c->rings);
  free(c->heap);
  free(c);
}
