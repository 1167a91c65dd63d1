/* A stand-in for libwavelet.so in wavelet-run's tests: loads and does nothing, so the launcher's
 * handling of LD_PRELOAD can be tested before (or without) the interposer. */
int wltest_preload_stub_loaded(void);
__attribute__((visibility("default"))) int wltest_preload_stub_loaded(void) {
  return 1;
}
