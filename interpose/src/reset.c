/* Device reset (cudaDeviceReset, cuDevicePrimaryCtxReset): "destroy all allocations and reset
 * all state" of the device in this process. What we hold on the device must go before the real
 * call, while it can still be destroyed properly: liballoc's events and the gate's peak event
 * are the context's (destroying them after the reset would name dead handles), the pinned
 * arena's chunks are freed by the driver (the arena would hand out unmapped pages), and served
 * memory is ours, not the context's (VMM memory may outlive the reset: the program's blocks
 * would stay allocated and booked). Every allocation the program had on the device is gone
 * with the reset, so each is accounted as freed, as if the program had freed it.
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
  wl__debug("device %d: reset by the program; its allocations are accounted as freed", device);
}
