/* The dlsym door: cu[A-Z]* lookups are answered with our wrapper when the real answer is a
 * driver entry point we hook; everything else goes to the real dlsym untouched. */
#include "internal.h"

#include <dlfcn.h>

/* Called by the dlsym entry below with the caller's arguments. Returns the answer, or NULL to
 * let the entry jump to the real dlsym (so that RTLD_NEXT stays relative to the caller). */
void *wl__dlsym_policy(void *handle, const char *name) __attribute__((used));
/* Not instrumented: a sanitizer runtime calls dlsym while it starts, before its shadow memory
 * exists. Every other name is decided here, before anything instrumented runs. */
WL_NO_SANITIZE static bool driver_name(const char *name) {
  return name && name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z';
}

WL_NO_SANITIZE void *wl__dlsym_policy(void *handle, const char *name) {
  wl__real_dlsym_init();
  if (!driver_name(name)) return NULL;
  return wl__dlsym_driver(handle, name);
}

void *wl__dlsym_driver(void *handle, const char *name) {
  if (!wl__real_dlsym || wl__tls.in_init) return NULL;
  int mode = wl__mode();
  if (mode == WL__MODE_OFF) return NULL;
  /* For RTLD_NEXT this asks "next after libwavelet": usually the driver (nothing between us and
   * it defines the name), which is what we map. Any answer we do not wrap is left to the real
   * dlsym, called by the entry below with the caller's return address: RTLD_NEXT then means
   * "after the caller", and RTLD_DEFAULT searches the caller's scope. An interposer preloaded
   * after us that defines the name would otherwise be handed its own function as its next. */
  void *p = wl__real_dlsym(handle, name);
  if (!p) return NULL;
  void *w = wl__wrap_ptr(p);
  if (w == p) return NULL;
  wl__count(WL__ST_DLSYM, 1);
  return w;
}

/* The exported dlsym. On x86-64 it is a few instructions of assembly that call the policy and
 * then *jump* to the real dlsym, so glibc sees the original caller's return address: RTLD_NEXT
 * means "after the caller", as it must (a C wrapper would make it "after libwavelet", and an
 * interposer preloaded after us would find itself). Elsewhere a C wrapper, with that known
 * limitation for RTLD_NEXT. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        ".p2align 4\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  pushq %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  call wl__dlsym_policy\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  testq %rax, %rax\n"
        "  jnz 1f\n"
        "  movq wl__real_dlsym(%rip), %rax\n"
        "  testq %rax, %rax\n"
        "  jz 1f\n"
        "  jmp *%rax\n"
        "1:\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
WL_HOOK void *dlsym(void *handle, const char *name) {
  void *p = wl__dlsym_policy(handle, name);
  if (p) return p;
  return wl__real_dlsym ? wl__real_dlsym(handle, name) : NULL;
}
#endif
