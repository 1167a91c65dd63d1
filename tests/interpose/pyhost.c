/* wl-ip-pyhost EXTENSION [STEPS]: for tests only, the Python interpreter's part: it knows nothing
 * of CUDA and loads a CUDA-using extension (wl-ip-pyext) with dlopen(RTLD_LOCAL), as `import`
 * does, then calls its training function. Prints the extension's lines and "pyhost done". */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: wl-ip-pyhost EXTENSION [STEPS]\n");
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "wl-ip-pyhost: %s\n", dlerror());
    return 2;
  }
  int (*train)(int) = (int (*)(int))dlsym(h, "wl_ip_ext_train");
  if (!train) {
    fprintf(stderr, "wl-ip-pyhost: %s has no wl_ip_ext_train\n", argv[1]);
    return 2;
  }
  int rc = train(argc == 3 ? atoi(argv[2]) : 3);
  printf("pyhost done %d\n", rc);
  return rc;
}
