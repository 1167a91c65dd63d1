/* The program's own VMM memory (cuMemCreate, cuMemMap and the rest, as PyTorch's expandable
 * segments and NCCL's buffers use them): accounted in every mode, and in alloc and gate modes
 * booked in its device's group, so the budget covers it as it covers what liballoc serves.
 *
 * The driver frees a handle's memory when its last reference goes: the handle's own
 * (cuMemRelease), one per cuMemRetainAllocationHandle, one per mapping (mapped memory "will not
 * be freed until it is unmapped"). A program may release a handle right after mapping it and
 * unmap much later (NCCL does), so the booking follows the references, not the release: each
 * handle's entry in wl__handles counts them (WL__VMM_REF), and each mapping remembers its handle
 * (wl__mapped). References are dropped before the real call that ends them and put back when it
 * fails: once the driver frees, another thread may get a handle of the same value. */
#include "internal.h"

#include <errno.h>

void wl__vmm_created(uintptr_t h, size_t size, int device, bool booked) {
  unsigned kind =
      WL__K_VMM | ((unsigned)device & 0xffu) << 8 | (booked ? WL__VMM_BOOKED : 0) | WL__VMM_REF;
  if (wl__map_put(wl__handles, h, size, kind) && booked)
    wl__serve_unbook(device, size); /* not recorded: it could not be given back later */
  wl__count(WL__ST_VMM_CREATES, 1);
}

/* One reference of h dropped into r. */
static void unref(uintptr_t h, wl__vmm_ref_t *r) {
  r->h = h;
  r->left = wl__map_ref(wl__handles, h, -1, &r->size, &r->kind);
  if (r->left < 0) r->left = -1;
}

void wl__vmm_release_begin(uintptr_t h, wl__vmm_op_t *op) {
  op->n = 1;
  op->r[0].map = 0;
  unref(h, &op->r[0]);
}

/* Every mapping that starts in [ptr, ptr + size), walked from ptr (the driver unmaps whole
 * mappings only): one reference of its handle each. A mapping we did not record (memory not made
 * through us) ends the walk, as do more than WL__VMM_OP_MAX (their references stay: counted
 * live, booked until exit). */
void wl__vmm_unmap_begin(uintptr_t ptr, size_t size, wl__vmm_op_t *op) {
  op->n = 0;
  for (uintptr_t q = ptr; q - ptr < size && op->n < WL__VMM_OP_MAX;) {
    wl__vmm_ref_t *r = &op->r[op->n];
    unsigned k;
    uint64_t h = 0;
    if (wl__map_take(wl__mappings, q, &r->msize, &k)) break;
    if (wl__map_take(wl__mapped, q, &h, &k)) h = 0;
    r->map = q;
    op->n++;
    if (h)
      unref((uintptr_t)h, r);
    else
      r->left = -1;
    if (!r->msize) break;
    q += r->msize;
  }
}

void wl__vmm_end(const wl__vmm_op_t *op, bool ok) {
  for (int i = 0; i < op->n; i++) {
    const wl__vmm_ref_t *r = &op->r[i];
    if (!ok) { /* still there: every entry as it was */
      if (r->map) {
        wl__map_put(wl__mappings, r->map, r->msize, WL__K_MAPPING);
        if (r->left >= 0) wl__map_put(wl__mapped, r->map, r->h, WL__K_COUNT);
      }
      if (r->left > 0)
        wl__map_ref(wl__handles, r->h, 1, NULL, NULL);
      else if (r->left == 0)
        wl__map_put(wl__handles, r->h, r->size, r->kind);
      continue;
    }
    if (r->map)
      wl__trace_ev(WL_TRACE_UNMAP, 0, (uint64_t)r->map, r->msize, 0);
    else if (r->left >= 0)
      wl__count(WL__ST_VMM_RELEASES, 1);
    if (r->left) continue;
    /* The last reference: the driver freed the memory. The trace's readers take PHYS_RELEASE
     * out of what was unmapped (a handle never mapped never reached their count). */
    if (r->kind & WL__VMM_MAPPED) wl__trace_ev(WL_TRACE_PHYS_RELEASE, 0, 0, r->size, 0);
    if (r->kind & WL__VMM_BOOKED) wl__serve_unbook((int)((r->kind >> 8) & 0xffu), r->size);
  }
}

void wl__vmm_mapped(uintptr_t ptr, size_t size, uintptr_t h) {
  if (wl__map_ref(wl__handles, h, 1, NULL, NULL) <= 0) return; /* not memory made through us */
  wl__map_mark(wl__handles, h, WL__VMM_MAPPED);
  wl__map_put(wl__mappings, ptr, size, WL__K_MAPPING);
  wl__map_put(wl__mapped, ptr, h, WL__K_COUNT);
  wl__trace_ev(WL_TRACE_MAP, 0, (uint64_t)ptr, size, 0);
}

void wl__vmm_retained(uintptr_t h) {
  wl__map_ref(wl__handles, h, 1, NULL, NULL);
}
