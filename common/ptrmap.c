/* The pointer map: open addressing with linear probing and backward-shift deletion, so a free
 * finds its block in O(1) without scanning. Writers hold the owner's lock (liballoc's allocator
 * lock); liballoc's thread caches read it without the lock through a sequence counter (a
 * seqlock), so every slot is read and written atomically and a grown table's old arrays stay
 * readable until the map is freed. */
#include "ptrmap.h"

#include <errno.h>
#include <stdlib.h>

struct wl__ptrtab_s {
  size_t cap;
  wl__ptrtab_t *older; /* retired tables, freed with the map */
  struct {
    uintptr_t key;
    void *val;
  } e[];
};

static size_t slot(uintptr_t key, size_t cap) {
  /* Blocks are 256-aligned: drop the zero bits, then Fibonacci hashing. */
  return (size_t)(((uint64_t)(key >> 8) * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

#define LD(x)    __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

static wl__ptrtab_t *tab_new(size_t cap) {
  wl__ptrtab_t *t = calloc(1, sizeof *t + cap * sizeof t->e[0]);
  if (t) t->cap = cap;
  return t;
}

int wl__ptrmap_init(wl__ptrmap_t *m, size_t cap) {
  m->count = 0;
  m->seq = 0;
  m->tab = tab_new(cap);
  return m->tab ? 0 : -ENOMEM;
}

void wl__ptrmap_free(wl__ptrmap_t *m) {
  for (wl__ptrtab_t *t = m->tab, *o; t; t = o) {
    o = t->older;
    free(t);
  }
  m->tab = NULL;
  m->count = 0;
}

/* A write section: odd sequence numbers tell readers to retry. */
static void write_begin(wl__ptrmap_t *m) {
  ST(m->seq, m->seq + 1);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void write_end(wl__ptrmap_t *m) {
  __atomic_store_n(&m->seq, m->seq + 1, __ATOMIC_RELEASE);
}

static void put_raw(wl__ptrtab_t *t, uintptr_t key, void *val) {
  size_t i = slot(key, t->cap);
  while (t->e[i].key) i = (i + 1) & (t->cap - 1);
  ST(t->e[i].val, val);
  ST(t->e[i].key, key);
}

static int grow(wl__ptrmap_t *m) {
  wl__ptrtab_t *o = m->tab, *n = tab_new(o->cap * 2);
  if (!n) return -ENOMEM;
  for (size_t i = 0; i < o->cap; i++)
    if (o->e[i].key) put_raw(n, o->e[i].key, o->e[i].val);
  n->older = o; /* a reader may still be probing it */
  __atomic_store_n(&m->tab, n, __ATOMIC_RELEASE);
  return 0;
}

int wl__ptrmap_put(wl__ptrmap_t *m, uintptr_t key, void *val) {
  write_begin(m);
  int rc = (m->count + 1) * 2 > m->tab->cap ? grow(m) : 0;
  if (rc == 0) {
    put_raw(m->tab, key, val);
    m->count++;
  }
  write_end(m);
  return rc;
}

void *wl__ptrmap_get(const wl__ptrmap_t *m, uintptr_t key) {
  if (!key) return NULL;
  const wl__ptrtab_t *t = m->tab;
  size_t i = slot(key, t->cap);
  while (t->e[i].key) {
    if (t->e[i].key == key) return t->e[i].val;
    i = (i + 1) & (t->cap - 1);
  }
  return NULL;
}

bool wl__ptrmap_get_unlocked(const wl__ptrmap_t *m, uintptr_t key, void **val) {
  uint64_t s = __atomic_load_n(&m->seq, __ATOMIC_ACQUIRE);
  if (s & 1) return false;
  const wl__ptrtab_t *t = __atomic_load_n(&m->tab, __ATOMIC_ACQUIRE);
  void *v = NULL;
  size_t i = slot(key, t->cap);
  for (size_t n = 0; n < t->cap; n++) { /* bounded: a torn read must not loop forever */
    uintptr_t k = LD(t->e[i].key);
    if (!k) break;
    if (k == key) {
      v = LD(t->e[i].val);
      break;
    }
    i = (i + 1) & (t->cap - 1);
  }
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  if (LD(m->seq) != s) return false;
  *val = v;
  return true;
}

void *wl__ptrmap_del(wl__ptrmap_t *m, uintptr_t key) {
  if (!key) return NULL;
  wl__ptrtab_t *t = m->tab;
  size_t mask = t->cap - 1, i = slot(key, t->cap);
  while (t->e[i].key && t->e[i].key != key) i = (i + 1) & mask;
  if (!t->e[i].key) return NULL;
  void *val = t->e[i].val;
  write_begin(m);
  /* Backward shift: pull later entries of the probe run into the hole. */
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (!t->e[j].key) break;
    size_t home = slot(t->e[j].key, t->cap);
    /* Move j to i when home is not cyclically within (i, j]. */
    if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
      ST(t->e[i].key, t->e[j].key);
      ST(t->e[i].val, t->e[j].val);
      i = j;
    }
  }
  ST(t->e[i].key, (uintptr_t)0);
  ST(t->e[i].val, (void *)NULL);
  m->count--;
  write_end(m);
  return val;
}

void wl__ptrmap_clear(wl__ptrmap_t *m, void (*fn)(void *val)) {
  wl__ptrtab_t *t = m->tab;
  write_begin(m);
  for (size_t i = 0; i < t->cap; i++) {
    if (!t->e[i].key) continue;
    if (fn) fn(t->e[i].val);
    ST(t->e[i].key, (uintptr_t)0);
    ST(t->e[i].val, (void *)NULL);
  }
  m->count = 0;
  write_end(m);
}
