/* Allocates and frees through the installed libwlalloc on the host provider. */
#include <wavelet/alloc.h>

#include <stdio.h>

int main(void) {
  wl_provider_t p;
  wl_alloc_t *a;
  if (wl_provider_host_init(&p, 0, 0) || wl_alloc_create(&a, &p, NULL)) return 1;
  void *x = wl_alloc_async(a, 1 << 20, NULL);
  if (!x || wl_free_async(a, x, NULL)) return 1;
  wl_alloc_stats_t st;
  wl_alloc_stats_get(a, &st);
  wl_alloc_destroy(a);
  if (st.allocs != 1 || st.frees != 1) return 1;
  printf("consumer: ok\n");
  return 0;
}
