/* The pointer map: open addressing with linear probing and backward-shift deletion, so a free
 * finds its block in O(1) without scanning. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>

static size_t slot(uintptr_t key, size_t cap) {
  /* Blocks are 256-aligned: drop the zero bits, then Fibonacci hashing. */
  return (size_t)(((uint64_t)(key >> 8) * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

int wl__ptrmap_init(wl__ptrmap_t *m, size_t cap) {
  m->cap = cap;
  m->count = 0;
  m->keys = calloc(cap, sizeof *m->keys);
  m->vals = calloc(cap, sizeof *m->vals);
  if (!m->keys || !m->vals) {
    wl__ptrmap_free(m);
    return -ENOMEM;
  }
  return 0;
}

void wl__ptrmap_free(wl__ptrmap_t *m) {
  free(m->keys);
  free(m->vals);
  m->keys = NULL;
  m->vals = NULL;
  m->cap = m->count = 0;
}

static void put_raw(wl__ptrmap_t *m, uintptr_t key, void *val) {
  size_t i = slot(key, m->cap);
  while (m->keys[i]) i = (i + 1) & (m->cap - 1);
  m->keys[i] = key;
  m->vals[i] = val;
  m->count++;
}

static int grow(wl__ptrmap_t *m) {
  wl__ptrmap_t n;
  if (wl__ptrmap_init(&n, m->cap * 2)) return -ENOMEM;
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) put_raw(&n, m->keys[i], m->vals[i]);
  wl__ptrmap_free(m);
  *m = n;
  return 0;
}

int wl__ptrmap_put(wl__ptrmap_t *m, uintptr_t key, void *val) {
  if ((m->count + 1) * 2 > m->cap && grow(m)) return -ENOMEM;
  put_raw(m, key, val);
  return 0;
}

void *wl__ptrmap_get(const wl__ptrmap_t *m, uintptr_t key) {
  if (!key) return NULL;
  size_t i = slot(key, m->cap);
  while (m->keys[i]) {
    if (m->keys[i] == key) return m->vals[i];
    i = (i + 1) & (m->cap - 1);
  }
  return NULL;
}

void *wl__ptrmap_del(wl__ptrmap_t *m, uintptr_t key) {
  if (!key) return NULL;
  size_t mask = m->cap - 1, i = slot(key, m->cap);
  while (m->keys[i] && m->keys[i] != key) i = (i + 1) & mask;
  if (!m->keys[i]) return NULL;
  void *val = m->vals[i];
  /* Backward shift: pull later entries of the probe run into the hole. */
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (!m->keys[j]) break;
    size_t home = slot(m->keys[j], m->cap);
    /* Move j to i when home is not cyclically within (i, j]. */
    if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->keys[i] = 0;
  m->vals[i] = NULL;
  m->count--;
  return val;
}
