/* Device reset (cudaDeviceReset, cuDevicePrimaryCtxReset): the driver destroys the device's
 * streams and events, its synchronous, pitched and managed allocations and its context's pinned
 * host memory, not stream-ordered allocations (CUDA 13's header: "cudaDeviceReset() will not
 * destroy memory allocations by cudaMallocAsync()") nor VMM memory, which belongs to no context.
 * Served memory is VMM memory, so what we hold on the device must follow the driver by hand,
 * before the real call, while it can still be destroyed properly: the served blocks of
 * synchronous allocations are freed (they would stay allocated and booked), liballoc's events and
 * the gate's peak event destroyed (after the reset they would be dead handles), the pinned
 * arena's chunks given back (the driver frees them: the arena would carve unmapped pages), and
 * every allocation the reset destroys is accounted as freed, as if the program had freed it.
 *
 * Like the driver, this assumes no other thread uses the device during the reset (CUDA leaves
 * that to the caller). */
#include "internal.h"

void wl__device_reset(int device) {
  if (device < 0) return;
  int mode = wl__mode();
  wl__count(WL__ST_RESETS, 1);
  /* The peak's event first: its wait may still be under way on the helper thread. */
  if (mode == WL__MODE_GATE) wl__gate_reset();
  /* The sweep asks the driver which device each tracked pointer is on: before anything is
   * freed under it. */
  wl__account_reset(device);
  wl__capture_reset(device); /* the captures on its streams end with them */
  if (mode >= WL__MODE_ALLOC) {
    wl__serve_reset(device);
    wl__pinned_reset(device);
  }
  wl__ipc_reset(device); /* trace mode opens handles of ours too */
  wl__debug("device %d: reset by the program; what it destroys is accounted as freed", device);
}
