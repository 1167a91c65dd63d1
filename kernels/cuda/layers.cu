/* The CUDA layer kernels besides GEMM and convolution: max and global-average pooling, bias,
 * ReLU, axpy/scale, softmax cross-entropy, SGD and Adam, reductions. Deterministic: no atomics
 * on floats (a one-block kernel where a reduction has to be global). */
#include <float.h>
#include <math.h>

#include "common.cuh"

#define GRID_STRIDE(i, n)                                                                          \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)(n);         \
       i += (long long)gridDim.x * blockDim.x)

/* ------------------------------------------------------------------------------------------------
 * Pooling
 * ----------------------------------------------------------------------------------------------*/

struct wl__pgeom {
  int N, H, W, C, R, S, P, Q, ph, pw, sh, sw;
};

static wl__pgeom make_pgeom(const wl_pool2d_t *pl) {
  wl__pgeom g = {pl->n, pl->h, pl->w,     pl->c,     pl->r,        pl->s,
                 pl->p, pl->q, pl->pad_h, pl->pad_w, pl->stride_h, pl->stride_w};
  return g;
}

/* The first maximum of window (oh, ow) in scan order, as the CPU kernel picks it: the offset of
 * that element from the image's base at channel 0 plus c. */
__device__ __forceinline__ long long wl__argmax(const wl__pgeom &g, const float *xn, int oh, int ow,
                                                int c, float *best_out) {
  const int hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  const int h0 = max(hs, 0), w0 = max(ws, 0), h1 = min(hs + g.R, g.H), w1 = min(ws + g.S, g.W);
  long long arg = ((long long)h0 * g.W + w0) * g.C + c;
  float best = xn[arg];
  for (int h = h0; h < h1; h++)
    for (int w = w0; w < w1; w++) {
      long long at = ((long long)h * g.W + w) * g.C + c;
      float v = xn[at];
      if (v > best) best = v, arg = at;
    }
  if (best_out) *best_out = best;
  return arg;
}

__global__ void wl__maxpool_fwd(wl__pgeom g, const float *x, float *y) {
  const long long total = (long long)g.N * g.P * g.Q * g.C;
  GRID_STRIDE(i, total) {
    const int c = (int)(i % g.C);
    long long pix = i / g.C;
    const int ow = (int)(pix % g.Q), oh = (int)(pix / g.Q % g.P), n = (int)(pix / g.Q / g.P);
    float best;
    wl__argmax(g, x + (long long)n * g.H * g.W * g.C, oh, ow, c, &best);
    y[i] = best;
  }
}

/* One thread per input element: the sum of dy over the windows whose first maximum it is. No
 * atomics, and every element of dx is written. */
__global__ void wl__maxpool_bwd(wl__pgeom g, const float *x, const float *dy, float *dx) {
  const long long total = (long long)g.N * g.H * g.W * g.C;
  GRID_STRIDE(i, total) {
    const int c = (int)(i % g.C);
    long long pix = i / g.C;
    const int w = (int)(pix % g.W), h = (int)(pix / g.W % g.H), n = (int)(pix / g.W / g.H);
    const float *xn = x + (long long)n * g.H * g.W * g.C;
    const long long self = ((long long)h * g.W + w) * g.C + c;
    /* Output rows whose window covers h: oh*sh - ph <= h < oh*sh - ph + R. */
    const int oh0 = max(0, (h + g.ph - g.R + g.sh) / g.sh), oh1 = min(g.P - 1, (h + g.ph) / g.sh);
    const int ow0 = max(0, (w + g.pw - g.S + g.sw) / g.sw), ow1 = min(g.Q - 1, (w + g.pw) / g.sw);
    float sum = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++)
      for (int ow = ow0; ow <= ow1; ow++)
        if (wl__argmax(g, xn, oh, ow, c, nullptr) == self)
          sum += dy[(((long long)n * g.P + oh) * g.Q + ow) * g.C + c];
    dx[i] = sum;
  }
}

static int pool_ok(const wl_pool2d_t *pl) {
  if (!pl || pl->p <= 0 || pl->q <= 0 || pl->stride_h <= 0 || pl->stride_w <= 0) return -EINVAL;
  return 0;
}

extern "C" WL_API int wl_cuda_maxpool2d_fwd(const wl_pool2d_t *pl, const float *x, float *y,
                                            void *stream) {
  if (pool_ok(pl) || !x || !y) return -EINVAL;
  size_t total = (size_t)pl->n * pl->p * pl->q * pl->c;
  WL__LAUNCH(wl__maxpool_fwd, wl__blocks(total, 256), 256, wl__stream(stream), make_pgeom(pl), x,
             y);
  return wl__cuda_check_launch();
}

extern "C" WL_API int wl_cuda_maxpool2d_bwd(const wl_pool2d_t *pl, const float *x, const float *dy,
                                            float *dx, void *stream) {
  if (pool_ok(pl) || !x || !dy || !dx) return -EINVAL;
  size_t total = (size_t)pl->n * pl->h * pl->w * pl->c;
  WL__LAUNCH(wl__maxpool_bwd, wl__blocks(total, 256), 256, wl__stream(stream), make_pgeom(pl), x,
             dy, dx);
  return wl__cuda_check_launch();
}

__global__ void wl__avgpool_fwd(long long n, int hw, int c, const float *x, float *y) {
  GRID_STRIDE(i, n * c) {
    const long long img = i / c;
    const int ch = (int)(i % c);
    const float *p = x + img * hw * c + ch;
    float s = 0.0f;
    for (int j = 0; j < hw; j++) s += p[(long long)j * c];
    y[i] = s / (float)hw;
  }
}

__global__ void wl__avgpool_bwd(long long n, int hw, int c, const float *dy, float *dx) {
  const float inv = 1.0f / (float)hw;
  GRID_STRIDE(i, n * hw * c) {
    const int ch = (int)(i % c);
    const long long img = i / ((long long)hw * c);
    dx[i] = dy[img * c + ch] * inv;
  }
}

extern "C" WL_API int wl_cuda_avgpool_global_fwd(size_t n, size_t hw, size_t c, const float *x,
                                                 float *y, void *stream) {
  if (n == 0 || c == 0) return 0;
  if (hw == 0 || !x || !y || !wl__fits_int(hw) || !wl__fits_int(c)) return -EINVAL;
  WL__LAUNCH(wl__avgpool_fwd, wl__blocks(n * c, 256), 256, wl__stream(stream), (long long)n,
             (int)hw, (int)c, x, y);
  return wl__cuda_check_launch();
}

extern "C" WL_API int wl_cuda_avgpool_global_bwd(size_t n, size_t hw, size_t c, const float *dy,
                                                 float *dx, void *stream) {
  if (n == 0 || c == 0) return 0;
  if (hw == 0 || !dy || !dx || !wl__fits_int(hw) || !wl__fits_int(c)) return -EINVAL;
  WL__LAUNCH(wl__avgpool_bwd, wl__blocks(n * hw * c, 256), 256, wl__stream(stream), (long long)n,
             (int)hw, (int)c, dy, dx);
  return wl__cuda_check_launch();
}

/* ------------------------------------------------------------------------------------------------
 * Bias, ReLU, BLAS-1
 * ----------------------------------------------------------------------------------------------*/

__global__ void wl__bias_add(long long rows, int cols, float *y, const float *b) {
  GRID_STRIDE(i, rows * cols) y[i] += b[i % cols];
}

/* A block owns 32 columns; its 32 x 32 threads walk the rows and reduce in shared memory (fixed
 * order, so the result does not vary between runs). */
__global__ void wl__bias_grad(long long rows, int cols, const float *dy, float *db) {
  __shared__ float part[32][33];
  static_assert(sizeof part <= WL__SMEM_STATIC_MAX, "static shared memory");
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (col < cols)
    for (long long r = threadIdx.y; r < rows; r += 32) s += dy[r * cols + col];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float t = 0.0f;
    for (int j = 0; j < 32; j++) t += part[j][threadIdx.x];
    db[col] = t;
  }
}

extern "C" WL_API int wl_cuda_bias_add(size_t rows, size_t cols, float *y, const float *bias,
                                       void *stream) {
  if (rows == 0 || cols == 0) return 0;
  if (!y || !bias || !wl__fits_int(cols)) return -EINVAL;
  WL__LAUNCH(wl__bias_add, wl__blocks(rows * cols, 256), 256, wl__stream(stream), (long long)rows,
             (int)cols, y, bias);
  return wl__cuda_check_launch();
}

extern "C" WL_API int wl_cuda_bias_grad(size_t rows, size_t cols, const float *dy, float *dbias,
                                        void *stream) {
  if (cols == 0) return 0;
  if (!dbias || (rows && !dy) || !wl__fits_int(cols)) return -EINVAL;
  dim3 block(32, 32);
  WL__LAUNCH(wl__bias_grad, (unsigned)((cols + 31) / 32), block, wl__stream(stream),
             (long long)rows, (int)cols, dy, dbias);
  return wl__cuda_check_launch();
}

__global__ void wl__relu_fwd(long long n, const float *x, float *y) {
  GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void wl__relu_bwd(long long n, const float *y, const float *dy, float *dx) {
  GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void wl__axpy(long long n, float alpha, const float *x, float *y) {
  GRID_STRIDE(i, n) y[i] = fmaf(alpha, x[i], y[i]);
}

__global__ void wl__scale(long long n, float alpha, float *x) {
  GRID_STRIDE(i, n) x[i] *= alpha;
}

extern "C" WL_API int wl_cuda_relu_fwd(size_t n, const float *x, float *y, void *stream) {
  if (n == 0) return 0;
  if (!x || !y) return -EINVAL;
  WL__LAUNCH(wl__relu_fwd, wl__blocks(n, 256), 256, wl__stream(stream), (long long)n, x, y);
  return wl__cuda_check_launch();
}

extern "C" WL_API int wl_cuda_relu_bwd(size_t n, const float *y, const float *dy, float *dx,
                                       void *stream) {
  if (n == 0) return 0;
  if (!y || !dy || !dx) return -EINVAL;
  WL__LAUNCH(wl__relu_bwd, wl__blocks(n, 256), 256, wl__stream(stream), (long long)n, y, dy, dx);
  return wl__cuda_check_launch();
}

extern "C" WL_API int wl_cuda_axpy(size_t n, float alpha, const float *x, float *y, void *stream) {
  if (n == 0) return 0;
  if (!x || !y) return -EINVAL;
  WL__LAUNCH(wl__axpy, wl__blocks(n, 256), 256, wl__stream(stream), (long long)n, alpha, x, y);
  return wl__cuda_check_launch();
}

extern "C" WL_API int wl_cuda_scale(size_t n, float alpha, float *x, void *stream) {
  if (n == 0) return 0;
  if (!x) return -EINVAL;
  WL__LAUNCH(wl__scale, wl__blocks(n, 256), 256, wl__stream(stream), (long long)n, alpha, x);
  return wl__cuda_check_launch();
}

/* ------------------------------------------------------------------------------------------------
 * Softmax cross-entropy: a warp per row
 * ----------------------------------------------------------------------------------------------*/

__device__ __forceinline__ float wl__warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float wl__warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* probs and, when loss is given, the mean loss. With a loss the grid is one block, whose warps
 * take rows in turn and add their losses in a fixed order at the end. */
__global__ void wl__softmax_xent_fwd(long long n, int c, const float *logits, const int32_t *labels,
                                     float *probs, float *loss) {
  __shared__ float wsum[32];
  static_assert(sizeof wsum <= WL__SMEM_STATIC_MAX, "static shared memory");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  float my = 0.0f;
  for (long long row = (long long)blockIdx.x * nwarps + warp; row < n;
       row += (long long)gridDim.x * nwarps) {
    const float *x = logits + row * c;
    float *p = probs + row * c;
    float mx = -INFINITY;
    for (int j = lane; j < c; j += 32) mx = fmaxf(mx, x[j]);
    mx = wl__warp_max(mx);
    float xl = 0.0f;
    int lab = labels ? labels[row] : 0;
    bool lab_ok = lab >= 0 && lab < c;
    if (labels && lab_ok) xl = x[lab]; /* before p (which may be x) overwrites it */
    __syncwarp();
    float s = 0.0f;
    for (int j = lane; j < c; j += 32) {
      float e = expf(x[j] - mx); /* not __expf: its error grows with |x| */
      p[j] = e;
      s += e;
    }
    s = wl__warp_sum(s);
    const float inv = 1.0f / s;
    for (int j = lane; j < c; j += 32) p[j] *= inv;
    if (loss && lane == 0) my += lab_ok ? logf(s) - (xl - mx) : NAN;
  }
  if (!loss) return;
  if (lane == 0) wsum[warp] = my;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (int w = 0; w < nwarps; w++) t += wsum[w];
    *loss = n ? t / (float)n : 0.0f;
  }
}

extern "C" WL_API int wl_cuda_softmax_xent_fwd(size_t n, size_t c, const float *logits,
                                               const int32_t *labels, float *probs, float *loss,
                                               void *stream) {
  if (n == 0 && !loss) return 0;
  if (n > 0 && (c == 0 || !logits || !probs || (loss && !labels) || !wl__fits_int(c)))
    return -EINVAL; /* n = 0 with a loss still runs: it writes the loss 0, as the CPU does */
  unsigned blocks = loss ? 1 : wl__blocks(n, 8);
  WL__LAUNCH(wl__softmax_xent_fwd, blocks, loss ? 1024 : 256, wl__stream(stream), (long long)n,
             (int)c, logits, labels, probs, loss);
  return wl__cuda_check_launch();
}

__global__ void wl__softmax_xent_bwd(long long n, int c, const float *probs, const int32_t *labels,
                                     float scale, float *d) {
  GRID_STRIDE(i, n * c) {
    const int j = (int)(i % c);
    const float onehot = labels[i / c] == j ? 1.0f : 0.0f;
    d[i] = scale * (probs[i] - onehot);
  }
}

extern "C" WL_API int wl_cuda_softmax_xent_bwd(size_t n, size_t c, const float *probs,
                                               const int32_t *labels, float scale, float *dlogits,
                                               void *stream) {
  if (n == 0) return 0;
  if (c == 0 || !probs || !labels || !dlogits || !wl__fits_int(c)) return -EINVAL;
  WL__LAUNCH(wl__softmax_xent_bwd, wl__blocks(n * c, 256), 256, wl__stream(stream), (long long)n,
             (int)c, probs, labels, scale, dlogits);
  return wl__cuda_check_launch();
}

__global__ void wl__count_correct(long long n, int c, const float *x, const int32_t *labels,
                                  uint32_t *correct) {
  GRID_STRIDE(row, n) {
    const float *r = x + row * c;
    int best = 0;
    for (int j = 1; j < c; j++)
      if (r[j] > r[best]) best = j;
    if (best == labels[row]) atomicAdd(correct, 1u); /* integer: order does not matter */
  }
}

extern "C" WL_API int wl_cuda_count_correct(size_t n, size_t c, const float *scores,
                                            const int32_t *labels, uint32_t *correct,
                                            void *stream) {
  if (n == 0) return 0;
  if (c == 0 || !scores || !labels || !correct || !wl__fits_int(c)) return -EINVAL;
  WL__LAUNCH(wl__count_correct, wl__blocks(n, 128), 128, wl__stream(stream), (long long)n, (int)c,
             scores, labels, correct);
  return wl__cuda_check_launch();
}

/* ------------------------------------------------------------------------------------------------
 * Optimizers
 * ----------------------------------------------------------------------------------------------*/

__global__ void wl__sgd(long long n, wl_sgd_t o, float *w, const float *g, float *v) {
  GRID_STRIDE(i, n) {
    float gi = g[i] + o.weight_decay * w[i];
    if (o.momentum != 0.0f) {
      float vi = o.momentum * v[i] + gi;
      v[i] = vi;
      gi = o.nesterov ? gi + o.momentum * vi : vi;
    }
    w[i] -= o.lr * gi;
  }
}

__global__ void wl__adam(long long n, wl_adam_t o, float bc1, float bc2_sqrt, float *w,
                         const float *g, float *m, float *v) {
  const float step = o.lr / bc1;
  GRID_STRIDE(i, n) {
    float wi = w[i], gi = g[i];
    if (o.decoupled)
      wi -= o.lr * o.weight_decay * wi;
    else
      gi += o.weight_decay * wi;
    float mi = o.beta1 * m[i] + (1.0f - o.beta1) * gi;
    float vi = o.beta2 * v[i] + (1.0f - o.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - step * mi / (sqrtf(vi) / bc2_sqrt + o.eps);
  }
}

extern "C" WL_API int wl_cuda_sgd_step(const wl_sgd_t *opt, size_t n, float *w, const float *g,
                                       float *v, void *stream) {
  if (!opt) return -EINVAL;
  if (n == 0) return 0;
  if (!w || !g || (opt->momentum != 0.0f && !v)) return -EINVAL;
  WL__LAUNCH(wl__sgd, wl__blocks(n, 256), 256, wl__stream(stream), (long long)n, *opt, w, g, v);
  return wl__cuda_check_launch();
}

extern "C" WL_API int wl_cuda_adam_step(const wl_adam_t *opt, long step, size_t n, float *w,
                                        const float *g, float *m, float *v, void *stream) {
  if (!opt || step < 1 || !(opt->beta1 >= 0.0f && opt->beta1 < 1.0f) ||
      !(opt->beta2 >= 0.0f && opt->beta2 < 1.0f))
    return -EINVAL;
  if (n == 0) return 0;
  if (!w || !g || !m || !v) return -EINVAL;
  /* The bias corrections on the host, as the CPU kernel computes them (in double). */
  float bc1 = (float)(1.0 - pow((double)opt->beta1, (double)step));
  float bc2_sqrt = (float)sqrt(1.0 - pow((double)opt->beta2, (double)step));
  if (!(bc1 > 0.0f) || !(bc2_sqrt > 0.0f)) return -EINVAL;
  WL__LAUNCH(wl__adam, wl__blocks(n, 256), 256, wl__stream(stream), (long long)n, *opt, bc1,
             bc2_sqrt, w, g, m, v);
  return wl__cuda_check_launch();
}

/* ------------------------------------------------------------------------------------------------
 * Reductions: one block, double accumulators for the sums, fixed combination order
 * ----------------------------------------------------------------------------------------------*/

/* max and min that keep a NaN (fmax and fmin drop it), as the CPU reference does. */
static __device__ double wl__nan_max(double a, double b) {
  return a != a ? a : b != b ? b : fmax(a, b);
}
static __device__ double wl__nan_min(double a, double b) {
  return a != a ? a : b != b ? b : fmin(a, b);
}

__global__ void wl__reduce(int op, long long n, const float *x, float *out) {
  __shared__ double part[1024];
  static_assert(sizeof part <= WL__SMEM_STATIC_MAX, "static shared memory");
  double acc;
  if (op == WL_REDUCE_SUM || op == WL_REDUCE_SUMSQ)
    acc = 0.0;
  else
    acc = op == WL_REDUCE_MIN ? INFINITY : -INFINITY;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    double v = x[i];
    switch (op) {
    case WL_REDUCE_SUM:
      acc += v;
      break;
    case WL_REDUCE_SUMSQ:
      acc += v * v;
      break;
    case WL_REDUCE_MAX:
      acc = wl__nan_max(acc, v);
      break;
    case WL_REDUCE_MIN:
      acc = wl__nan_min(acc, v);
      break;
    default:
      acc = wl__nan_max(acc, fabs(v));
      break;
    }
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) {
      double a = part[threadIdx.x], b = part[threadIdx.x + s];
      part[threadIdx.x] = (op == WL_REDUCE_SUM || op == WL_REDUCE_SUMSQ) ? a + b
                          : op == WL_REDUCE_MIN                          ? wl__nan_min(a, b)
                                                                         : wl__nan_max(a, b);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = (float)part[0];
}

extern "C" WL_API int wl_cuda_reduce(wl_reduce_op_t op, size_t n, const float *x, float *out,
                                     void *stream) {
  if (!out || (n && !x) || op < WL_REDUCE_SUM || op > WL_REDUCE_ABSMAX) return -EINVAL;
  if (n == 0 && op != WL_REDUCE_SUM && op != WL_REDUCE_SUMSQ) return -EINVAL;
  WL__LAUNCH(wl__reduce, 1, 1024, wl__stream(stream), (int)op, (long long)n, x, out);
  return wl__cuda_check_launch();
}
