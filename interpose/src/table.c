/* The wrapper of every hook id: a table built where no CUDA header declares the hooks' real
 * types, so one declaration shape fits them all (only their addresses are taken). */
#include "hooks.h"

#include <stddef.h>

#define WL__DECL(n) extern void n(void);
WL__DRV_HOOKS(WL__DECL)
WL__RT_HOOKS(WL__DECL)
WL__NCCL_HOOKS(WL__DECL)
#undef WL__DECL

void *const wl__wrapper_fn[WL__H_COUNT] = {
#define WL__ADDR(n) [WL__H_##n] = (void *)n,
    WL__DRV_HOOKS(WL__ADDR) WL__RT_HOOKS(WL__ADDR) WL__NCCL_HOOKS(WL__ADDR)
#undef WL__ADDR
};
