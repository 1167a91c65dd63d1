/* The pointer map: an address -> pointer hash map (open addressing, linear probing,
 * backward-shift deletion) whose writers hold the owner's lock and whose readers may also read
 * without it (a seqlock). Keys are 256-aligned addresses (the hash drops the low bits); 0 is no
 * key. liballoc's small objects and the interposer's CUDA IPC exports use it. */
#ifndef WAVELET_COMMON_PTRMAP_H
#define WAVELET_COMMON_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wl__ptrtab_s wl__ptrtab_t;
typedef struct wl__ptrmap_s {
  wl__ptrtab_t *tab;
  size_t count;
  uint64_t seq; /* odd while a writer changes the table */
} wl__ptrmap_t;

/* cap: a power of two. */
int wl__ptrmap_init(wl__ptrmap_t *m, size_t cap);
void wl__ptrmap_free(wl__ptrmap_t *m);
/* 0, or -ENOMEM when it could not grow. */
int wl__ptrmap_put(wl__ptrmap_t *m, uintptr_t key, void *val);
void *wl__ptrmap_get(const wl__ptrmap_t *m, uintptr_t key);
void *wl__ptrmap_del(wl__ptrmap_t *m, uintptr_t key);
/* Without the lock (the thread caches): true with *val (NULL: absent) when no writer interfered,
 * false when the caller must ask again under the lock. */
bool wl__ptrmap_get_unlocked(const wl__ptrmap_t *m, uintptr_t key, void **val);
/* Empties the map, giving each value to fn first (fn may be NULL). */
void wl__ptrmap_clear(wl__ptrmap_t *m, void (*fn)(void *val));

#endif
