/* Small blocks: 28 size classes up to 64 KiB (four per power of two above 1 KiB, so at most 25%
 * rounding), served from slabs owned by one stream, with a free bitmap per slab. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int wl__size_class(size_t size) {
  if (size <= 1024) return (int)((size + 255) / 256) - 1; /* size >= 1 */
  size_t n = size - 1;
  int lg = 63 - __builtin_clzll((unsigned long long)n);
  size_t p = (size_t)1 << lg;
  return 4 + (lg - 10) * 4 + (int)((n - p) / (p / 4));
}

size_t wl__class_size(int cls) {
  if (cls < 4) return (size_t)(cls + 1) * 256;
  int k = cls - 4;
  size_t p = (size_t)1 << (10 + k / 4);
  return p + (size_t)(k % 4 + 1) * (p / 4);
}

/* Slabs hold at least 16 objects; small classes get 256 KiB so that a stream's partly used
 * slabs cost little physical memory. */
static size_t slab_bytes(size_t objsize) {
  return objsize <= 8192 ? (size_t)256 << 10 : (size_t)1 << 20;
}

static void slab_list(wl__slab_t *slab) {
  wl__slab_t **head = &slab->owner->partial[slab->cls];
  slab->prev = NULL;
  slab->next = *head;
  if (*head) (*head)->prev = slab;
  *head = slab;
  slab->listed = true;
}

static void slab_unlist(wl__slab_t *slab) {
  if (!slab->listed) return;
  if (slab->prev)
    slab->prev->next = slab->next;
  else
    slab->owner->partial[slab->cls] = slab->next;
  if (slab->next) slab->next->prev = slab->prev;
  slab->prev = slab->next = NULL;
  slab->listed = false;
}

static wl__slab_t *slab_new(wl_alloc_t *a, int cls, size_t req, wl__stream_t *s) {
  size_t osz = wl__class_size(cls), bytes = slab_bytes(osz);
  uint32_t nobj = (uint32_t)(bytes / osz), words = (nobj + 63) / 64;
  wl__slab_t *slab = calloc(1, sizeof *slab + words * sizeof(uint64_t));
  uint32_t *reqs = calloc(nobj, sizeof *reqs);
  if (!slab || !reqs) {
    free(slab);
    free(reqs);
    wl__fail(a, -ENOMEM, req, "out of host memory for the allocator's metadata");
    return NULL;
  }
  wl__block_t *blk = wl__large_alloc(a, bytes, req, s);
  if (!blk) {
    free(slab);
    free(reqs);
    return NULL;
  }
  blk->state = WL__B_SLAB;
  blk->slab = slab;
  slab->blk = blk;
  slab->owner = s;
  slab->cls = (uint32_t)cls;
  slab->objsize = (uint32_t)osz;
  slab->nobj = slab->nfree = nobj;
  slab->req = reqs;
  for (uint32_t i = 0; i < nobj; i++) slab->bits[i / 64] |= 1ull << (i % 64);
  slab->all_next = a->slabs;
  if (a->slabs) a->slabs->all_prev = slab;
  a->slabs = slab;
  s->nslabs++;
  slab_list(slab);
  return slab;
}

/* Gives an empty slab's block back to the large allocator, tagged with its owner's work. */
static void slab_destroy(wl_alloc_t *a, wl__slab_t *slab) {
  slab_unlist(slab);
  if (slab->all_prev)
    slab->all_prev->all_next = slab->all_next;
  else
    a->slabs = slab->all_next;
  if (slab->all_next) slab->all_next->all_prev = slab->all_prev;
  wl__stream_t *owner = slab->owner;
  owner->nslabs--;
  wl__block_t *blk = slab->blk;
  free(slab->req);
  free(slab);
  wl__large_free(a, blk, owner);
}

void *wl__small_alloc(wl_alloc_t *a, size_t req, wl__stream_t *s) {
  int cls = wl__size_class(req);
  wl__slab_t *slab = s->partial[cls];
  if (!slab) {
    slab = s->empty[cls];
    if (slab) {
      s->empty[cls] = NULL;
      slab_list(slab);
    } else if (!(slab = slab_new(a, cls, req, s))) {
      return NULL;
    }
  }
  uint32_t words = (slab->nobj + 63) / 64, w = slab->hint;
  while (!slab->bits[w]) w = (w + 1) % words;
  uint32_t idx = w * 64 + (uint32_t)__builtin_ctzll(slab->bits[w]);
  uintptr_t ptr = slab->blk->addr + (uintptr_t)idx * slab->objsize;
  if (wl__ptrmap_put(&a->ptrs, ptr, (void *)((uintptr_t)slab | 1))) {
    wl__fail(a, -ENOMEM, req, "out of host memory for the allocator's metadata");
    return NULL;
  }
  slab->bits[w] &= ~(1ull << (idx % 64));
  slab->hint = w;
  slab->req[idx] = (uint32_t)req;
  if (--slab->nfree == 0) slab_unlist(slab);
  return (void *)ptr;
}

int wl__small_free(wl_alloc_t *a, wl__slab_t *slab, uintptr_t ptr, wl__stream_t *s) {
  uint32_t idx = (uint32_t)((ptr - slab->blk->addr) / slab->objsize);
  slab->req[idx] = 0;
  if (s == slab->owner) {
    wl__small_release(a, slab, idx, s);
    return 0;
  }
  /* Freed on another stream: reusable by the owner only after that stream's work. */
  wl__pending_t *p = wl__pending_new(a);
  if (!p) {
    /* No memory to remember it: leak the slot rather than risk reuse too early. */
    wl__warn_once("out of host memory: a small block freed across streams is not reused");
    return -ENOMEM;
  }
  p->next = NULL;
  p->slab = slab;
  p->index = idx;
  /* A forgotten stream's final event covers what a thread cache freed on it before. */
  p->seq = s->dead ? s->free_seq : ++s->free_seq; /* as wl__large_free */
  if (s->pend_tail)
    s->pend_tail->next = p;
  else
    s->pend_head = p;
  s->pend_tail = p;
  WL__ST_ADD(a, pending_bytes, slab->objsize);
  s->unrec_bytes += slab->objsize;
  wl__stream_tick(a, s);
  return 0;
}

void wl__small_release(wl_alloc_t *a, wl__slab_t *slab, uint32_t index, wl__stream_t *s) {
  (void)s;
  slab->bits[index / 64] |= 1ull << (index % 64);
  slab->nfree++;
  wl__stream_t *owner = slab->owner;
  if (slab->nfree == slab->nobj) {
    slab_unlist(slab);
    if (!owner->dead && !owner->empty[slab->cls])
      owner->empty[slab->cls] = slab; /* one spare per class: no churn at the boundary */
    else
      slab_destroy(a, slab);
  } else if (!slab->listed && !owner->dead) {
    slab_list(slab);
  }
}

void wl__small_drop_empty(wl_alloc_t *a, wl__stream_t *s, bool orphan) {
  for (int c = 0; c < WL__NCLASSES; c++) {
    wl__slab_t *slab = s->empty[c];
    s->empty[c] = NULL;
    if (slab) slab_destroy(a, slab);
    if (orphan)
      while (s->partial[c]) slab_unlist(s->partial[c]);
  }
}

void wl__small_free_all(wl_alloc_t *a) {
  while (a->slabs) {
    wl__slab_t *slab = a->slabs;
    a->slabs = slab->all_next;
    free(slab->req);
    free(slab);
  }
}

int wl__small_check(wl_alloc_t *a, wl__slab_t *slab, size_t *live) {
  (void)a;
  uint32_t nfree = 0;
  for (uint32_t i = 0; i < slab->nobj; i++) {
    bool isfree = slab->bits[i / 64] >> (i % 64) & 1;
    if (isfree) {
      nfree++;
      if (slab->req[i]) return -EFAULT;
    } else {
      if (slab->req[i] > slab->objsize) return -EFAULT;
      *live += slab->req[i];
    }
  }
  if (nfree != slab->nfree) return -EFAULT;
  if (slab->listed != (slab->nfree > 0 && slab->owner->partial[slab->cls] != NULL) && slab->listed)
    return -EFAULT;
  return 0;
}
