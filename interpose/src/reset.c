/* What the driver destroys under us: a device reset (cudaDeviceReset, cuDevicePrimaryCtxReset)
 * and the destruction of a context the program created (cuCtxDestroy).
 *
 * A reset destroys the primary context's streams and events, its synchronous, pitched and
 * managed allocations and its pinned host memory, not stream-ordered allocations (CUDA 13's
 * header: "cudaDeviceReset() will not destroy memory allocations by cudaMallocAsync()") nor VMM
 * memory, which belongs to no context. Served memory is VMM memory, so what we hold on the device
 * must follow the driver by hand, before the real call, while it can still be destroyed
 * properly: the served blocks of synchronous allocations are freed (they would stay allocated and
 * booked), liballoc's events and the gate's peak event destroyed (after the reset they would be
 * dead handles), the pinned arena's chunks given back (the driver frees them: the arena would
 * carve unmapped pages), and every allocation the reset destroys is accounted as freed, as if the
 * program had freed it.
 *
 * cuCtxDestroy takes the same kinds of things of the context it destroys ("will not destroy
 * memory allocations by cuMemCreate(), cuMemAllocAsync() and cuMemAllocFromPoolAsync()"). Only
 * primary contexts are served (serve.c), so nothing of ours goes with it but the accounting of its
 * allocations, the captures on its streams, the handles of ours opened in it and the gate's peak
 * event when it was recorded there.
 *
 * Like the driver, this assumes no other thread uses the device (or the context) meanwhile (CUDA
 * leaves that to the caller). */
#include "internal.h"

unsigned wl__resets;

void wl__device_reset(int device) {
  if (device < 0) return;
  int mode = wl__mode();
  wl__count(WL__ST_RESETS, 1);
  __atomic_add_fetch(&wl__resets, 1, __ATOMIC_RELEASE);
  /* What the reset takes is the primary context's: told by its handle where the driver says
   * which that is (NULL: by the device). */
  CUcontext primary;
  if (wl__primary_of(device, &primary) == 0) return; /* inactive: it holds nothing */
  /* The peak's event first: its wait may still be under way on the helper thread. */
  if (mode == WL__MODE_GATE) wl__gate_reset();
  /* The sweep asks the driver where each tracked pointer lies: before anything is freed under
   * it. */
  wl__account_reset(device, primary);
  wl__capture_reset(device, primary); /* the captures on its streams end with them */
  if (mode >= WL__MODE_ALLOC) {
    wl__serve_reset(device);
    wl__pinned_reset(device);
  }
  wl__ipc_reset(device, primary); /* trace mode opens handles of ours too */
  wl__debug("device %d: reset by the program; what it destroys is accounted as freed", device);
}

void wl__context_destroy(CUcontext ctx) {
  int device = wl__context_device(ctx);
  if (device < 0 || wl__is_primary(ctx, device)) return; /* the driver refuses those */
  wl__count(WL__ST_CTX_DESTROYS, 1);
  if (wl__mode() == WL__MODE_GATE) wl__gate_ctx_destroy(ctx);
  wl__account_ctx_destroy(ctx);
  wl__capture_ctx_destroy(ctx);
  wl__ipc_ctx_destroy(ctx);
  /* Last: a thread's cached answer for this context must not outlive it (a new context may
   * get its address). */
  wl__serve_ctx_destroy(ctx);
  wl__debug("context %p (device %d) destroyed by the program; its allocations are accounted as "
            "freed",
            (void *)ctx, device);
}
