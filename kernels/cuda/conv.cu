/* Convolution forward, backward-data and backward-filter on CUDA as implicit GEMMs (NHWC/KRSC):
 * loaders that gather the im2col views on the fly feed the fp32 GEMM kernel, as in CUTLASS's
 * analytic iterators. */
#include "gemm.cuh"

/* The geometry, copied by value into every loader (kernel parameters live in constant memory),
 * with the divisors the loaders' index math divides by as multiply-high-and-shift pairs. */
struct wl__geom {
  int N, H, W, C, K, R, S, P, Q, ph, pw, sh, sw, dh, dw;
  wl__fdiv PQ, Qd, Cd, Sd, HW, Wd, Kd, shd, swd;
};

/* A divisor in [1, 2^31); any other value only where no index divides by it (a batch of 0 leaves
 * P*Q unbounded, as conv_ok bounds it by N*P*Q). */
static wl__fdiv fdiv(long long d) {
  return wl__make_fdiv(d >= 1 && d <= INT_MAX ? (int)d : 1);
}

static wl__geom make_geom(const wl_conv2d_t *cv) {
  wl__geom g = {cv->n,
                cv->h,
                cv->w,
                cv->c,
                cv->k,
                cv->r,
                cv->s,
                cv->p,
                cv->q,
                cv->pad_h,
                cv->pad_w,
                cv->stride_h,
                cv->stride_w,
                cv->dil_h,
                cv->dil_w,
                fdiv((long long)cv->p * cv->q),
                fdiv(cv->q),
                fdiv(cv->c),
                fdiv(cv->s),
                fdiv((long long)cv->h * cv->w),
                fdiv(cv->w),
                fdiv(cv->k),
                fdiv(cv->stride_h),
                fdiv(cv->stride_w)};
  return g;
}

/* Xhat[N*P*Q x R*S*C]: row = output pixel, column = (r, s, c) with c fastest. The GEMM's A for
 * the forward pass and its B for the filter gradient. Four channels at once when C % 4 == 0
 * (then they share one (r, s), so one bounds check covers them). */
struct wl__xhat {
  static constexpr bool CONTIG_COL = true;
  static constexpr int V = 4;
  const float *x;
  wl__geom g;
  int R, C; /* logical rows and columns */
  bool vec_ok;

  __device__ __forceinline__ const float *src(int row, int col) const {
    int rem, ow, c, s;
    const int n = g.PQ.divmod(row, rem), oh = g.Qd.divmod(rem, ow);
    const int rs = g.Cd.divmod(col, c), r = g.Sd.divmod(rs, s);
    const int ih = oh * g.sh - g.ph + r * g.dh, iw = ow * g.sw - g.pw + s * g.dw;
    if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) return nullptr;
    return x + (((long long)n * g.H + ih) * g.W + iw) * g.C + c;
  }
  __device__ __forceinline__ float at(int row, int col) const {
    if (row >= R || col >= C) return 0.0f;
    const float *p = src(row, col);
    return p ? __ldg(p) : 0.0f;
  }
  __device__ __forceinline__ bool vec(int row, int col, float (&v)[4]) const {
    if (!vec_ok || row >= R || col + 4 > C) return false;
    const float *p = src(row, col);
    float4 u = p ? __ldg(reinterpret_cast<const float4 *>(p)) : make_float4(0, 0, 0, 0);
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    return true;
  }
};

/* dYhat[N*H*W x R*S*K]: row = input pixel (n, h, w), column = (r, s, k) with k fastest; the
 * element is dy at the output pixel that tap (r, s) of filter k maps onto (h, w), zero where the
 * stride skips it or it falls outside. UNIT: both strides are 1 (no stride test or division). */
template <bool UNIT> struct wl__dyhat {
  static constexpr bool CONTIG_COL = true;
  static constexpr int V = 4;
  const float *dy;
  wl__geom g;
  int R, C;
  bool vec_ok;

  __device__ __forceinline__ const float *src(int row, int col) const {
    int rem, w, k, s;
    const int n = g.HW.divmod(row, rem), h = g.Wd.divmod(rem, w);
    const int rs = g.Kd.divmod(col, k), r = g.Sd.divmod(rs, s);
    const int nh = h + g.ph - r * g.dh, nw = w + g.pw - s * g.dw;
    if (nh < 0 || nw < 0) return nullptr;
    int oh = nh, ow = nw;
    if (!UNIT) {
      int mh, mw;
      oh = g.shd.divmod(nh, mh), ow = g.swd.divmod(nw, mw);
      if (mh | mw) return nullptr;
    }
    if (oh >= g.P || ow >= g.Q) return nullptr;
    return dy + (((long long)n * g.P + oh) * g.Q + ow) * g.K + k;
  }
  __device__ __forceinline__ float at(int row, int col) const {
    if (row >= R || col >= C) return 0.0f;
    const float *p = src(row, col);
    return p ? __ldg(p) : 0.0f;
  }
  __device__ __forceinline__ bool vec(int row, int col, float (&v)[4]) const {
    if (!vec_ok || row >= R || col + 4 > C) return false;
    const float *p = src(row, col);
    float4 u = p ? __ldg(reinterpret_cast<const float4 *>(p)) : make_float4(0, 0, 0, 0);
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    return true;
  }
};

/* W'[R*S*K x C]: row = (r, s, k) with k fastest, column = c; w[k, r, s, c]. */
struct wl__wprime {
  static constexpr bool CONTIG_COL = true;
  static constexpr int V = 4;
  const float *w;
  wl__geom g;
  int R, C;
  bool vec_ok;

  __device__ __forceinline__ const float *src(int row, int col) const {
    int k;
    const int rs = g.Kd.divmod(row, k);
    return w + ((long long)k * g.R * g.S + rs) * g.C + col;
  }
  __device__ __forceinline__ float at(int row, int col) const {
    if (row >= R || col >= C) return 0.0f;
    return __ldg(src(row, col));
  }
  __device__ __forceinline__ bool vec(int row, int col, float (&v)[4]) const {
    if (!vec_ok || row >= R || col + 4 > C) return false;
    float4 u = __ldg(reinterpret_cast<const float4 *>(src(row, col)));
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    return true;
  }
};

static bool aligned16(const void *p) {
  return (uintptr_t)p % 16 == 0;
}

/* The checks of every pass: a descriptor from wl_conv2d_init and sizes the kernels index with
 * int. A batch of 0 (n set to 0 after the init) is valid and empty, as on the CPU. */
static int conv_ok(const wl_conv2d_t *cv) {
  if (!cv || cv->n < 0 || cv->p <= 0 || cv->q <= 0 || cv->stride_h <= 0 || cv->stride_w <= 0 ||
      cv->dil_h <= 0 || cv->dil_w <= 0)
    return -EINVAL;
  size_t npq = (size_t)cv->n * cv->p * cv->q, nhw = (size_t)cv->n * cv->h * cv->w;
  size_t crs = (size_t)cv->c * cv->r * cv->s, krs = (size_t)cv->k * cv->r * cv->s;
  /* As gemm_args: the kernels compute a tile's rows and columns (and the reduction's index up to
   * 8 past its end) in int before the bounds test, so each GEMM size leaves that much room. */
  const size_t room = (size_t)INT_MAX - 256;
  if (npq > room || nhw > room || crs > room || krs > room) return -EINVAL;
  return 0;
}

extern "C" WL_API int wl_cuda_conv2d_fwd(const wl_conv2d_t *cv, const float *x, const float *w,
                                         const float *bias, float *y, void *stream) {
  int rc = conv_ok(cv);
  if (rc) return rc;
  if (!x || !w || !y) return -EINVAL;
  const wl__geom g = make_geom(cv);
  const int M = cv->n * cv->p * cv->q, N = cv->k, K = cv->c * cv->r * cv->s;
  wl__xhat a = {x, g, M, K, cv->c % 4 == 0 && aligned16(x)};
  auto b = wl__make_dense<float, true>(w, (size_t)K, K, N); /* B(crs, k) = w[k][crs] */
  cudaStream_t st = wl__stream(stream);
  rc = wl__launch_sgemm_simt(a, b, M, N, K, 1.0f, 0.0f, y, N, st);
  if (rc == 0 && bias) rc = wl_cuda_bias_add((size_t)M, (size_t)N, y, bias, stream);
  return rc;
}

extern "C" WL_API int wl_cuda_conv2d_bwd_data(const wl_conv2d_t *cv, const float *dy,
                                              const float *w, float *dx, void *stream) {
  int rc = conv_ok(cv);
  if (rc) return rc;
  if (!dy || !w || !dx) return -EINVAL;
  const wl__geom g = make_geom(cv);
  const int M = cv->n * cv->h * cv->w, N = cv->c, K = cv->k * cv->r * cv->s;
  const bool avec = cv->k % 4 == 0 && aligned16(dy);
  wl__wprime b = {w, g, K, N, cv->c % 4 == 0 && aligned16(w)};
  cudaStream_t st = wl__stream(stream);
  if (cv->stride_h == 1 && cv->stride_w == 1) {
    wl__dyhat<true> a = {dy, g, M, K, avec};
    return wl__launch_sgemm_simt(a, b, M, N, K, 1.0f, 0.0f, dx, N, st);
  }
  wl__dyhat<false> a = {dy, g, M, K, avec};
  return wl__launch_sgemm_simt(a, b, M, N, K, 1.0f, 0.0f, dx, N, st);
}

extern "C" WL_API int wl_cuda_conv2d_bwd_filter(const wl_conv2d_t *cv, const float *x,
                                                const float *dy, float *dw, float *dbias,
                                                void *stream) {
  int rc = conv_ok(cv);
  if (rc) return rc;
  if (!x || !dy || !dw) return -EINVAL;
  const wl__geom g = make_geom(cv);
  const int M = cv->k, N = cv->c * cv->r * cv->s, K = cv->n * cv->p * cv->q;
  auto a = wl__make_dense<float, true>(dy, (size_t)cv->k, M, K); /* A(k, npq) = dy[npq][k] */
  wl__xhat b = {x, g, K, N, cv->c % 4 == 0 && aligned16(x)};
  rc = wl__launch_sgemm_simt(a, b, M, N, K, 1.0f, 0.0f, dw, N, wl__stream(stream));
  if (rc == 0 && dbias) rc = wl_cuda_bias_grad((size_t)K, (size_t)M, dy, dbias, stream);
  return rc;
}
