/* Pinned host allocations: the jemalloc arena of pinned.c (when it is built in) over chunks from
 * the real cuMemHostAlloc. Without it, pinned allocations pass through and are accounted. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#if defined(WL_HAVE_PINNED)
#include "pinned.h"

static int chunk_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  __typeof__(&cuMemHostAlloc) real = (__typeof__(&cuMemHostAlloc))wl__real(WL__H_cuMemHostAlloc);
  if (!real) return -ENOMEM;
  WL_NEST_BEGIN();
  CUresult r = real(out, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
  WL_NEST_END();
  return r == CUDA_SUCCESS ? 0 : -ENOMEM;
}

static void chunk_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  (void)size;
  __typeof__(&cuMemFreeHost) real = (__typeof__(&cuMemFreeHost))wl__real(WL__H_cuMemFreeHost);
  if (real) real(p);
}

int wl__pinned_ready;

void wl__pinned_setup(void) {
  static const wl__pinned_ops_t ops = {.chunk_alloc = chunk_alloc, .chunk_free = chunk_free};
  /* Our dlsym is a hook: jemalloc's library is searched with the real one (set by init;
   * -EBUSY after a reset, when it is loaded already). */
  wl__pinned_set_library(NULL, __atomic_load_n(&wl__real_dlsym, __ATOMIC_ACQUIRE));
  int rc = wl__pinned_init(&ops);
  /* Other failures were reported by pinned.c, in one line that says why. */
  if (rc == -EINVAL || rc == -EALREADY)
    wl__warn("pinned host arena unavailable (%d); pinned allocations pass through", rc);
  __atomic_store_n(&wl__pinned_ready, rc == 0, __ATOMIC_RELEASE);
}

/* The primary context each device's chunks are pinned under, retained once for good: the
 * program's last cuDevicePrimaryCtxRelease would destroy it with the chunks, and the arena would
 * carve its next blocks from freed pages (liballoc's VMM provider retains it the same way). */
static int retained[WL_PINNED_KEYS];

static void retain_primary(int d) {
  __typeof__(&cuDevicePrimaryCtxRetain) retain =
      (__typeof__(&cuDevicePrimaryCtxRetain))wl__real(WL__H_cuDevicePrimaryCtxRetain);
  CUcontext c;
  if (__atomic_exchange_n(&retained[d], 1, __ATOMIC_ACQ_REL)) return;
  if (!retain || retain(&c, d) != CUDA_SUCCESS)
    wl__warn_once("cannot retain device %d's primary context", d);
}

/* Pinned memory belongs to the context it was allocated in: the arena keeps each device's blocks
 * in chunks pinned under that device's primary context (its key), so a reset of one device takes
 * only its own. Under a context the program created the driver answers: a chunk pinned there
 * would go with that context's cuCtxDestroy, blocks other contexts hold in it included, and a
 * block of a primary context's chunk would outlive the context it was asked for. With no current
 * context the driver answers too (a chunk could not be pinned anyway). */
void *wl__pinned_serve(size_t size, unsigned flags) {
  if (!__atomic_load_n(&wl__pinned_ready, __ATOMIC_ACQUIRE)) return NULL;
  /* Where a capture prohibits this thread's synchronous calls the driver answers (on an H200 it
   * refuses a pinned allocation then, and invalidates the capture). */
  if (WL_UNLIKELY(__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)) && wl__capture_prohibits())
    return NULL;
  int d = wl__current_primary();
  if (d < 0) return NULL;
  if (d < WL_PINNED_KEYS && WL_UNLIKELY(!__atomic_load_n(&retained[d], __ATOMIC_ACQUIRE)))
    retain_primary(d);
  return wl__pinned_alloc_for(size, flags, d);
}

int wl__pinned_release(void *p) {
  if (!__atomic_load_n(&wl__pinned_ready, __ATOMIC_ACQUIRE)) return -ENOENT;
  /* cuMemFreeHost waits for the device (on an H200 it waited for a copy from the block still
   * running), and programs count on it: freed at once, the block could go to the next
   * cudaMallocHost under that copy. Not during a capture, which a synchronisation would break. */
  int key = wl__pinned_key(p);
  if (key >= 0 && !__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)) wl__device_synchronize(key);
  return wl__pinned_free(p);
}

void wl__pinned_child(void) {
  memset(retained, 0, sizeof retained); /* the child has no context */
  if (__atomic_exchange_n(&wl__pinned_ready, 0, __ATOMIC_ACQ_REL)) wl__pinned_fork_child();
}

/* The reset frees the pinned memory of the device's context: the device's arena goes with its
 * chunks, freed now while the driver still knows them; a new one is made at the device's next
 * request. The blocks' entries were taken out as freed by the accounting's sweep. */
void wl__pinned_reset(int device) {
  if (__atomic_load_n(&wl__pinned_ready, __ATOMIC_ACQUIRE)) wl__pinned_reset_key(device);
}

/* The driver's cuMemHostGetFlags answer for its own allocation made with each set of the flags
 * the arena serves (PORTABLE, DEVICEMAP): at a block's address it would answer for the chunk
 * (both flags). Asked once per set, with a page of its own, RELAXED (never against a program's
 * capture); bit 31: known. Where the driver will not say, the flags asked for. */
#define FLAGS_KNOWN 0x80000000u
static unsigned flag_answer[4];

static unsigned driver_flags(unsigned f) {
  __typeof__(&cuMemHostAlloc) halloc = (__typeof__(&cuMemHostAlloc))wl__real(WL__H_cuMemHostAlloc);
  __typeof__(&cuMemHostGetFlags) getf =
      (__typeof__(&cuMemHostGetFlags))wl__real(WL__H_cuMemHostGetFlags);
  __typeof__(&cuMemFreeHost) hfree = (__typeof__(&cuMemFreeHost))wl__real(WL__H_cuMemFreeHost);
  unsigned answer = f;
  void *q = NULL;
  if (!halloc || !getf || !hfree) return answer;
  int mode = wl__capture_relax();
  WL_NEST_BEGIN();
  if (halloc(&q, 4096, f) == CUDA_SUCCESS) {
    unsigned got = 0;
    if (getf(&got, q) == CUDA_SUCCESS) answer = got;
    hfree(q);
  }
  WL_NEST_END();
  wl__capture_unrelax(mode);
  return answer;
}

int wl__pinned_flags(void *p, unsigned *flags) {
  unsigned f;
  if (!__atomic_load_n(&wl__pinned_ready, __ATOMIC_ACQUIRE) ||
      wl__pinned_query(p, NULL, NULL, &f) != 0)
    return 0;
  f &= WL_PINNED_F_PORTABLE | WL_PINNED_F_DEVICEMAP;
  unsigned a = __atomic_load_n(&flag_answer[f], __ATOMIC_RELAXED);
  if (!(a & FLAGS_KNOWN)) { /* two threads may both ask: the same answer */
    a = driver_flags(f) | FLAGS_KNOWN;
    __atomic_store_n(&flag_answer[f], a, __ATOMIC_RELAXED);
  }
  *flags = a & ~FLAGS_KNOWN;
  return 1;
}

void wl__pinned_report(void) {
  if (!__atomic_load_n(&wl__pinned_ready, __ATOMIC_ACQUIRE)) return;
  wl__pinned_stats_t st;
  wl__pinned_stats(&st);
  dprintf(2,
          "wavelet:   %-28s %llu served, %llu passed through, %llu chunks (%llu bytes), %llu "
          "live blocks\n",
          "pinned arena", (unsigned long long)st.served, (unsigned long long)st.passed,
          (unsigned long long)st.chunks, (unsigned long long)st.chunk_bytes,
          (unsigned long long)st.live_blocks);
}
#else
void wl__pinned_report(void) {}
void wl__pinned_reset(int device) {
  (void)device;
}
void wl__pinned_setup(void) {}
void *wl__pinned_serve(size_t size, unsigned flags) {
  (void)size;
  (void)flags;
  return NULL;
}
int wl__pinned_release(void *p) {
  (void)p;
  return -ENOENT;
}
void wl__pinned_child(void) {}
int wl__pinned_flags(void *p, unsigned *flags) {
  (void)p;
  (void)flags;
  return 0;
}
#endif
