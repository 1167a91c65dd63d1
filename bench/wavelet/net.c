/* The reference models and their training step: each activation is allocated when its layer
 * runs and freed when backward is through with it, so the memory wave is real. */
#include "net.h"
#include "rng.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fashion-MNIST's pixel mean and standard deviation (over the training set, pixels in [0, 1]). */
#define PIX_MEAN 0.2860f
#define PIX_STD  0.3530f

/* Kernels run on the backend's device: CUDA launches go on its stream. */
#ifdef WB_HAVE_CUDA
#define KRUN(be, fn, ...)                                                                          \
  ((be)->kind == WB_BACKEND_CUDA ? wl_cuda_##fn(__VA_ARGS__, (be)->stream) : wl_##fn(__VA_ARGS__))
#else
#define KRUN(be, fn, ...) wl_##fn(__VA_ARGS__)
#endif

#define TRY(x)                                                                                     \
  do {                                                                                             \
    int rc_ = (x);                                                                                 \
    if (rc_) return rc_;                                                                           \
  } while (0)

static int gemm(wb_backend_t *be, wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k,
                const float *a, size_t lda, const float *b, size_t ldb, float *c, size_t ldc) {
#ifdef WB_HAVE_CUDA
  if (be->kind == WB_BACKEND_CUDA)
    return wl_cuda_sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc, WL_MATH_FP32,
                         be->stream);
#else
  (void)be;
#endif
  return wl_sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc);
}

const char *wb_model_name(wb_model_t m) {
  return m == WB_MLP ? "mlp" : m == WB_CNN ? "cnn" : "resnet";
}

/* ---- building ----------------------------------------------------------------------------*/

static wb_layer_t *add(wb_net_t *n, wb_layer_kind_t kind, const char *name) {
  wb_layer_t *l = &n->l[n->nl++];
  memset(l, 0, sizeof *l);
  l->kind = kind;
  snprintf(l->name, sizeof l->name, "%s", name);
  return l;
}

/* Parameters start on 64-float (256-byte) boundaries. */
static size_t param(wb_net_t *n, size_t count) {
  size_t off = n->nparam;
  n->nparam += (count + 63) & ~(size_t)63;
  return off;
}

static void linear(wb_net_t *n, const char *name, size_t in, size_t out, int relu) {
  wb_layer_t *l = add(n, WB_L_LINEAR, name);
  l->in_f = in, l->out_f = out, l->relu = relu;
  l->in_ps = in, l->out_ps = out;
  l->fan_in = in;
  l->w = param(n, in * out);
  l->b = param(n, out);
}

static void conv(wb_net_t *n, const char *name, int h, int w, int c, int k, int r, int pad) {
  wb_layer_t *l = add(n, WB_L_CONV, name);
  wl_conv2d_t cv = {
      .n = 1, .h = h, .w = w, .c = c, .k = k, .r = r, .s = r, .pad_h = pad, .pad_w = pad};
  wl_conv2d_init(&cv);
  l->cv = cv;
  l->relu = 1;
  l->in_ps = (size_t)h * w * c;
  l->out_ps = (size_t)cv.p * cv.q * k;
  l->fan_in = (size_t)r * r * c;
  l->w = param(n, (size_t)k * r * r * c);
  l->b = param(n, (size_t)k);
}

static void pool(wb_net_t *n, const char *name, int h, int w, int c) {
  wb_layer_t *l = add(n, WB_L_POOL, name);
  wl_pool2d_t pl = {.n = 1, .h = h, .w = w, .c = c, .r = 2, .s = 2};
  wl_pool2d_init(&pl);
  l->pl = pl;
  l->in_ps = (size_t)h * w * c;
  l->out_ps = (size_t)pl.p * pl.q * c;
}

/* y = relu(conv2(relu(conv1(x))) + x): 3 x 3 convolutions, same shape, identity shortcut. */
static void res(wb_net_t *n, const char *name, int h, int w, int c) {
  wb_layer_t *l = add(n, WB_L_RES, name);
  wl_conv2d_t cv = {.n = 1, .h = h, .w = w, .c = c, .k = c, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1};
  wl_conv2d_init(&cv);
  l->cv = l->cv2 = cv;
  l->relu = 1;
  l->in_ps = l->out_ps = (size_t)h * w * c;
  l->fan_in = (size_t)9 * c;
  l->w = param(n, (size_t)9 * c * c);
  l->b = param(n, (size_t)c);
  l->w2 = param(n, (size_t)9 * c * c);
  l->b2 = param(n, (size_t)c);
}

static void build(wb_net_t *n) {
  switch (n->model) {
  case WB_MLP:
    linear(n, "fc1", WB_IMG_PIXELS, 256, 1);
    linear(n, "fc2", 256, 128, 1);
    linear(n, "fc3", 128, WB_CLASSES, 0);
    break;
  case WB_CNN:
    /* TensorFlow's "2 Conv+pooling" tutorial layout (5 x 5 convolutions with 32 and 64 filters,
     * 2 x 2 max pooling), with a 256-unit hidden layer instead of 1024 and dropout. */
    conv(n, "conv1", 28, 28, 1, 32, 5, 2);
    pool(n, "pool1", 28, 28, 32);
    conv(n, "conv2", 14, 14, 32, 64, 5, 2);
    pool(n, "pool2", 14, 14, 64);
    linear(n, "fc1", 7 * 7 * 64, 256, 1);
    linear(n, "fc2", 256, WB_CLASSES, 0);
    break;
  case WB_RESNET: {
    /* Activation memory dominates: 0.52 MiB of activations a sample (0.67 MiB with backward's
     * three gradient buffers) against 0.35 MiB of weights. */
    char nm[16];
    conv(n, "stem", 28, 28, 1, 16, 3, 1);
    for (int i = 0; i < 3; i++) {
      snprintf(nm, sizeof nm, "res1.%d", i + 1);
      res(n, nm, 28, 28, 16);
    }
    pool(n, "pool1", 28, 28, 16);
    conv(n, "conv2", 14, 14, 16, 32, 3, 1);
    for (int i = 0; i < 3; i++) {
      snprintf(nm, sizeof nm, "res2.%d", i + 1);
      res(n, nm, 14, 14, 32);
    }
    pool(n, "pool2", 14, 14, 32);
    linear(n, "fc", 7 * 7 * 32, WB_CLASSES, 0);
    break;
  }
  }
}

size_t wb_net_param_floats(wb_model_t model) {
  wb_net_t *n = calloc(1, sizeof *n);
  if (!n) return 0;
  n->model = model;
  build(n);
  size_t f = n->nparam;
  free(n);
  return f;
}

int wb_net_checksum(wb_net_t *n, uint64_t *sum) {
  size_t bytes = n->nparam * sizeof(float);
  unsigned char *h = malloc(bytes);
  if (!h) return -ENOMEM;
  int rc = n->be->download(n->be, h, n->w, bytes);
  uint64_t x = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes && !rc; i++) x = (x ^ h[i]) * 0x100000001b3ull;
  free(h);
  if (!rc) *sum = x;
  return rc;
}

int wb_net_save(wb_net_t *n, const char *path) {
  size_t bytes = n->nparam * sizeof(float);
  void *h = malloc(bytes);
  if (!h) return -ENOMEM;
  int rc = n->be->download(n->be, h, n->w, bytes);
  FILE *f = rc ? NULL : fopen(path, "wb");
  if (!rc && !f) rc = -errno;
  if (f && fwrite(h, 1, bytes, f) != bytes) rc = -EIO;
  if (f && fclose(f) != 0 && !rc) rc = -EIO;
  free(h);
  return rc;
}

size_t wb_net_param_count(const wb_net_t *n) {
  size_t c = 0;
  for (int i = 0; i < n->nl; i++) {
    const wb_layer_t *l = &n->l[i];
    switch (l->kind) {
    case WB_L_LINEAR:
      c += l->in_f * l->out_f + l->out_f;
      break;
    case WB_L_CONV:
      c += (size_t)l->cv.k * l->cv.r * l->cv.s * l->cv.c + (size_t)l->cv.k;
      break;
    case WB_L_RES:
      c += 2 * ((size_t)l->cv.k * 9 * l->cv.c + (size_t)l->cv.k);
      break;
    default:
      break;
    }
  }
  return c;
}

static void init_uniform(float *p, size_t count, float bound, wb_rng_t *r) {
  for (size_t i = 0; i < count; i++) p[i] = bound * wb_rng_sym(r);
}

static void *talloc(wb_net_t *n, size_t bytes) {
  return n->be->alloc(n->be, bytes);
}

static void tfree(wb_net_t *n, void *p) {
  if (p) n->be->free(n->be, p);
}

int wb_net_create(wb_net_t **out, wb_backend_t *be, wb_model_t model, size_t max_batch,
                  wb_opt_t opt, float lr, uint64_t seed) {
  *out = NULL;
  wb_net_t *n = calloc(1, sizeof *n);
  if (!n) return -ENOMEM;
  n->be = be;
  n->model = model;
  n->max_batch = max_batch;
  n->opt = opt;
  n->lr0 = lr;
  n->lr_scale = 1.f;
  n->sgd = (wl_sgd_t){.lr = lr, .momentum = 0.9f, .weight_decay = 0.f, .nesterov = 0};
  n->adam = (wl_adam_t){.lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  build(n);
  /* Backward needs each layer's input gradient (not the first layer's: its input is the data)
   * and a residual block's inner gradient: two buffers, three with residual blocks. */
  n->ngb = 2;
  for (int i = 0; i < n->nl; i++) {
    const wb_layer_t *l = &n->l[i];
    size_t need = i ? l->in_ps : 0;
    if (l->kind == WB_L_RES) {
      n->ngb = 3;
      if (l->out_ps > need) need = l->out_ps;
    }
    if (need > n->gb_ps) n->gb_ps = need;
  }
  n->hx = malloc(max_batch * WB_IMG_PIXELS * sizeof *n->hx);
  n->hy = malloc(max_batch * sizeof *n->hy);
  float *host = calloc(n->nparam, sizeof *host);
  if (!n->hx || !n->hy || !host) {
    free(host);
    wb_net_destroy(n);
    return -ENOMEM;
  }
  wb_rng_t r;
  wb_rng_seed(&r, seed * 0x2545f4914f6cdd1dull + 1);
  for (int i = 0; i < n->nl; i++) {
    wb_layer_t *l = &n->l[i];
    /* He uniform for layers followed by ReLU; the output layer and the second convolution of a
     * residual block start smaller, so the shortcut carries the signal at first (no batch
     * normalisation here). */
    float bound = sqrtf((l->relu ? 6.f : 3.f) / (float)(l->fan_in ? l->fan_in : 1));
    switch (l->kind) {
    case WB_L_LINEAR:
      init_uniform(host + l->w, l->in_f * l->out_f, bound, &r);
      break;
    case WB_L_CONV:
      init_uniform(host + l->w, (size_t)l->cv.k * l->cv.r * l->cv.s * l->cv.c, bound, &r);
      break;
    case WB_L_RES:
      init_uniform(host + l->w, (size_t)9 * l->cv.c * l->cv.k, bound, &r);
      init_uniform(host + l->w2, (size_t)9 * l->cv.c * l->cv.k, 0.2f * bound, &r);
      break;
    default:
      break;
    }
  }
  size_t bytes = n->nparam * sizeof(float);
  int rc = -ENOMEM;
  snprintf(n->where, sizeof n->where, "parameters");
  n->w = talloc(n, bytes);
  n->g = n->w ? talloc(n, bytes) : NULL;
  n->m = n->g ? talloc(n, bytes) : NULL;
  n->v = (n->m && opt == WB_ADAM) ? talloc(n, bytes) : NULL;
  if (n->m && (opt != WB_ADAM || n->v)) {
    rc = be->upload(be, n->w, host, bytes);
    memset(host, 0, bytes);
    if (!rc) rc = be->upload(be, n->g, host, bytes);
    if (!rc) rc = be->upload(be, n->m, host, bytes);
    if (!rc && n->v) rc = be->upload(be, n->v, host, bytes);
    if (!rc) rc = be->finish(be);
  }
  free(host);
  if (rc) {
    wb_net_destroy(n);
    return rc;
  }
  *out = n;
  return 0;
}

void wb_net_destroy(wb_net_t *n) {
  if (!n) return;
  tfree(n, n->w);
  tfree(n, n->g);
  tfree(n, n->m);
  tfree(n, n->v);
  free(n->hx);
  free(n->hy);
  free(n);
}

/* ---- forward and backward ------------------------------------------------------------------*/

static int oom(wb_net_t *n, const char *pass, const wb_layer_t *l) {
  snprintf(n->where, sizeof n->where, "%s of %s", pass, l ? l->name : "the input");
  return -ENOMEM;
}

/* Runs layer l on x into a new l->y (and l->h). In inference (train = 0) the inner activation
 * of a residual block is freed at once. */
static int layer_fwd(wb_net_t *n, wb_layer_t *l, const float *x, size_t bs, int train) {
  wb_backend_t *be = n->be;
  float *w = n->w;
  l->y = talloc(n, l->out_ps * bs * sizeof(float));
  if (!l->y) return oom(n, "forward", l);
  switch (l->kind) {
  case WB_L_LINEAR:
    TRY(gemm(be, WL_NOTRANS, WL_TRANS, bs, l->out_f, l->in_f, x, l->in_f, w + l->w, l->in_f, l->y,
             l->out_f));
    TRY(KRUN(be, bias_add, bs, l->out_f, l->y, w + l->b));
    break;
  case WB_L_CONV: {
    wl_conv2d_t cv = l->cv;
    cv.n = (int)bs;
    TRY(wl_conv2d_init(&cv));
    TRY(KRUN(be, conv2d_fwd, &cv, x, w + l->w, w + l->b, l->y));
    break;
  }
  case WB_L_POOL: {
    wl_pool2d_t pl = l->pl;
    pl.n = (int)bs;
    TRY(wl_pool2d_init(&pl));
    TRY(KRUN(be, maxpool2d_fwd, &pl, x, l->y));
    break;
  }
  case WB_L_RES: {
    wl_conv2d_t cv = l->cv;
    cv.n = (int)bs;
    TRY(wl_conv2d_init(&cv));
    size_t cnt = l->out_ps * bs;
    l->h = talloc(n, cnt * sizeof(float));
    if (!l->h) return oom(n, "forward", l);
    TRY(KRUN(be, conv2d_fwd, &cv, x, w + l->w, w + l->b, l->h));
    TRY(KRUN(be, relu_fwd, cnt, l->h, l->h));
    TRY(KRUN(be, conv2d_fwd, &cv, l->h, w + l->w2, w + l->b2, l->y));
    TRY(KRUN(be, axpy, cnt, 1.f, x, l->y));
    if (!train) {
      tfree(n, l->h);
      l->h = NULL;
    }
    break;
  }
  }
  if (l->relu) TRY(KRUN(be, relu_fwd, l->out_ps * bs, l->y, l->y));
  return 0;
}

/* Backward through l: dy (gradient of l->y, overwritten) and x (l's input) give the parameter
 * gradients and, when dx is not NULL, the input's gradient in dx; dh is a residual block's
 * scratch. Frees the layer's activations except the output when it is dy. */
static int layer_bwd(wb_net_t *n, wb_layer_t *l, const float *x, float *dy, float *dx, float *dh,
                     size_t bs) {
  wb_backend_t *be = n->be;
  float *w = n->w, *g = n->g;
  size_t cnt = l->out_ps * bs;
  if (l->relu) TRY(KRUN(be, relu_bwd, cnt, l->y, dy, dy));
  /* No layer's backward needs its output past the ReLU: give it back before asking for more. */
  if (l->y != dy) {
    tfree(n, l->y);
    l->y = NULL;
  }
  switch (l->kind) {
  case WB_L_LINEAR:
    TRY(gemm(be, WL_TRANS, WL_NOTRANS, l->out_f, l->in_f, bs, dy, l->out_f, x, l->in_f, g + l->w,
             l->in_f));
    TRY(KRUN(be, bias_grad, bs, l->out_f, dy, g + l->b));
    if (dx)
      TRY(gemm(be, WL_NOTRANS, WL_NOTRANS, bs, l->in_f, l->out_f, dy, l->out_f, w + l->w, l->in_f,
               dx, l->in_f));
    break;
  case WB_L_CONV: {
    wl_conv2d_t cv = l->cv;
    cv.n = (int)bs;
    TRY(wl_conv2d_init(&cv));
    TRY(KRUN(be, conv2d_bwd_filter, &cv, x, dy, g + l->w, g + l->b));
    if (dx) TRY(KRUN(be, conv2d_bwd_data, &cv, dy, w + l->w, dx));
    break;
  }
  case WB_L_POOL: {
    wl_pool2d_t pl = l->pl;
    pl.n = (int)bs;
    TRY(wl_pool2d_init(&pl));
    if (dx) TRY(KRUN(be, maxpool2d_bwd, &pl, x, dy, dx));
    break;
  }
  case WB_L_RES: {
    wl_conv2d_t cv = l->cv;
    cv.n = (int)bs;
    TRY(wl_conv2d_init(&cv));
    TRY(KRUN(be, conv2d_bwd_filter, &cv, l->h, dy, g + l->w2, g + l->b2));
    int rc = KRUN(be, conv2d_bwd_data, &cv, dy, w + l->w2, dh);
    if (!rc) rc = KRUN(be, relu_bwd, cnt, l->h, dh, dh);
    if (!rc) rc = KRUN(be, conv2d_bwd_filter, &cv, x, dh, g + l->w, g + l->b);
    if (!rc && dx) rc = KRUN(be, conv2d_bwd_data, &cv, dh, w + l->w, dx);
    if (!rc && dx) rc = KRUN(be, axpy, cnt, 1.f, dy, dx);
    tfree(n, l->h);
    l->h = NULL;
    TRY(rc);
    break;
  }
  }
  return 0;
}

/* Normalised images and labels of the samples idx[0..bs) (or first..first+bs when idx is NULL)
 * into new tensors n->x and n->y. */
static int load_batch(wb_net_t *n, const wb_split_t *s, const uint32_t *idx, size_t first,
                      size_t bs) {
  for (size_t i = 0; i < bs; i++) {
    size_t k = idx ? idx[i] : first + i;
    const uint8_t *img = s->images + k * WB_IMG_PIXELS;
    float *dst = n->hx + i * WB_IMG_PIXELS;
    for (int p = 0; p < WB_IMG_PIXELS; p++)
      dst[p] = ((float)img[p] * (1.f / 255.f) - PIX_MEAN) * (1.f / PIX_STD);
    n->hy[i] = s->labels[k];
  }
  n->x = talloc(n, bs * WB_IMG_PIXELS * sizeof(float));
  if (!n->x) return oom(n, "loading", NULL);
  n->y = talloc(n, bs * sizeof(int32_t));
  if (!n->y) return oom(n, "loading", NULL);
  TRY(n->be->upload(n->be, n->x, n->hx, bs * WB_IMG_PIXELS * sizeof(float)));
  return n->be->upload(n->be, n->y, n->hy, bs * sizeof(int32_t));
}

/* Frees whatever a step left allocated (after a failure; after a complete step nothing is). */
static void release_step(wb_net_t *n) {
  for (int k = 0; k < 3; k++) {
    tfree(n, n->gb[k]);
    n->gb[k] = NULL;
  }
  for (int i = 0; i < n->nl; i++) {
    tfree(n, n->l[i].y);
    tfree(n, n->l[i].h);
    n->l[i].y = n->l[i].h = NULL;
  }
  tfree(n, n->x);
  tfree(n, n->y);
  n->x = NULL;
  n->y = NULL;
}

static void mark(wb_net_t *n, wb_mark_t m) {
  if (n->mark) n->mark(n->mark_arg, m);
}

static int step(wb_net_t *n, const wb_split_t *s, const uint32_t *idx, size_t bs, int update,
                float *loss, size_t *correct) {
  wb_backend_t *be = n->be;
  be->meter->iter_peak = be->meter->held;
  n->past_peak = 0;
  TRY(load_batch(n, s, idx, 0, bs));
  const float *in = n->x;
  for (int i = 0; i < n->nl; i++) {
    TRY(layer_fwd(n, &n->l[i], in, bs, 1));
    in = n->l[i].y;
  }
  wb_layer_t *last = &n->l[n->nl - 1];
  /* Count before the softmax replaces the logits: the largest score is the same either way. */
  TRY(be->count(be, bs, WB_CLASSES, last->y, n->y, correct));
  TRY(be->xent_fwd(be, bs, WB_CLASSES, last->y, n->y, loss));
  /* The probabilities become the logits' gradient in place. */
  TRY(KRUN(be, softmax_xent_bwd, bs, WB_CLASSES, last->y, n->y, 1.f / (float)bs, last->y));
  /* Backward's gradients rotate through buffers taken now, while this replica still holds
   * the rising-phase token: from here on it only frees, so it never waits for memory that
   * the next replica, rising, is waiting for. */
  for (int k = 0; k < n->ngb; k++) {
    n->gb[k] = talloc(n, n->gb_ps * bs * sizeof(float));
    if (!n->gb[k]) return oom(n, "backward (gradient buffers)", last);
  }
  float *dy = last->y;
  int cur = -1; /* which buffer holds dy (none at first: it is last->y) */
  for (int i = n->nl - 1; i >= 0; i--) {
    wb_layer_t *l = &n->l[i];
    const float *x = i ? n->l[i - 1].y : n->x;
    int a = cur == 0 ? 1 : 0, b = 3 - a - (cur < 0 ? 2 : cur); /* b: used with 3 buffers */
    float *dx = i ? n->gb[a] : NULL;
    TRY(layer_bwd(n, l, x, dy, dx, n->ngb == 3 ? n->gb[b] : NULL, bs));
    if (l->y == dy) {
      tfree(n, l->y);
      l->y = NULL;
    }
    dy = dx;
    cur = a;
    be->trim(be, 0);
    /* The top layers' gradients still add memory: the peak is passed when this replica's
     * holding first drops below its highest of the iteration. That is when the next replica
     * may start rising (the marker gives it the token). */
    if (!n->past_peak && be->meter->held < be->meter->iter_peak) {
      n->past_peak = 1;
      mark(n, WB_MARK_BACKWARD);
    }
  }
  if (!n->past_peak) mark(n, WB_MARK_BACKWARD);
  release_step(n);
  if (update && n->reduce) {
    int rc = n->reduce(n->reduce_arg, n->g, n->nparam);
    if (rc) {
      snprintf(n->where, sizeof n->where, "gradient all-reduce");
      return rc;
    }
  }
  if (update) {
    n->step++;
    n->adam.lr = n->sgd.lr = n->lr0 * n->lr_scale;
    if (n->opt == WB_ADAM)
      TRY(KRUN(be, adam_step, &n->adam, n->step, n->nparam, n->w, n->g, n->m, n->v));
    else
      TRY(KRUN(be, sgd_step, &n->sgd, n->nparam, n->w, n->g, n->m));
  }
  TRY(be->finish(be));
  return 0;
}

int wb_net_step(wb_net_t *n, const wb_split_t *s, const uint32_t *idx, size_t bs, int update,
                float *loss, size_t *correct) {
  if (bs == 0 || bs > n->max_batch) return -EINVAL;
  n->where[0] = 0;
  mark(n, WB_MARK_BEGIN);
  int rc = step(n, s, idx, bs, update, loss, correct);
  if (rc && !n->past_peak) mark(n, WB_MARK_BACKWARD); /* the markers stay paired */
  if (rc) {
    if (!n->where[0]) snprintf(n->where, sizeof n->where, "a kernel (error %d)", rc);
    release_step(n);
  }
  n->be->trim(n->be, 0);
  mark(n, WB_MARK_END);
  return rc;
}

int wb_net_eval(wb_net_t *n, const wb_split_t *s, size_t count, size_t batch, double *acc,
                double *loss) {
  wb_backend_t *be = n->be;
  if (count == 0 || count > s->n) count = s->n;
  if (batch > n->max_batch) batch = n->max_batch;
  size_t correct = 0;
  double sum = 0;
  int rc = 0;
  for (size_t first = 0; first < count && !rc; first += batch) {
    size_t bs = count - first < batch ? count - first : batch;
    mark(n, WB_MARK_EVAL_BEGIN);
    rc = load_batch(n, s, NULL, first, bs);
    const float *in = n->x;
    for (int i = 0; i < n->nl && !rc; i++) {
      rc = layer_fwd(n, &n->l[i], in, bs, 0);
      /* Inference keeps only the newest activation. */
      if (i) {
        tfree(n, n->l[i - 1].y);
        n->l[i - 1].y = NULL;
      }
      in = n->l[i].y;
    }
    float l = 0;
    if (!rc) rc = be->count(be, bs, WB_CLASSES, in, n->y, &correct);
    if (!rc) rc = be->xent_fwd(be, bs, WB_CLASSES, n->l[n->nl - 1].y, n->y, &l);
    sum += (double)l * (double)bs;
    release_step(n);
    be->trim(be, 0);
    mark(n, WB_MARK_EVAL_END);
  }
  if (rc) return rc;
  *acc = (double)correct / (double)count;
  *loss = sum / (double)count;
  return 0;
}
