/* wb-weights-diff A B TOL: compares two parameter files of wavelet-bench --save-weights (raw
 * float32) and exits 0 when they have the same size and every difference is within TOL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static float *load(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long bytes = ftell(f);
  fseek(f, 0, SEEK_SET);
  float *p = bytes > 0 ? malloc((size_t)bytes) : NULL;
  if (p && fread(p, 1, (size_t)bytes, f) != (size_t)bytes) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *n = (size_t)bytes / sizeof(float);
  return p;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: wb-weights-diff A B TOL\n");
    return 2;
  }
  size_t na = 0, nb = 0;
  float *a = load(argv[1], &na), *b = load(argv[2], &nb);
  if (!a || !b || na != nb) {
    fprintf(stderr, "wb-weights-diff: cannot read both files, or their sizes differ\n");
    free(a);
    free(b);
    return 1;
  }
  double tol = atof(argv[3]), worst = 0, moved = 0;
  size_t at = 0;
  for (size_t i = 0; i < na; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= worst)) worst = d, at = i; /* a NaN counts as the worst */
    moved += fabs((double)a[i]);
  }
  printf("%zu floats, largest difference %.3g at %zu (tolerance %.3g), mean |w| %.3g\n", na, worst,
         at, tol, moved / (double)na);
  free(a);
  free(b);
  return worst <= tol ? 0 : 1;
}
