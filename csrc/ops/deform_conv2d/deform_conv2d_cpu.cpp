// deform_conv2d and its backward, CPU kernels. Formula: deform_conv2d.h.
//
// The input is read channels-last (copied, about 8 MB of images at a time, unless it already
// is channels_last in the compute dtype: Operands): the four pixels around a sampling point
// are then four contiguous runs of channels, so one tap of one output pixel is a vector loop
// over its offset group's channels, with the bilinear weights computed once per (pixel, offset
// group, tap) rather than once per channel. Per image and per chunk of output pixels (a column
// buffer of chunk x in_channels * kh * kw values, column_chunk_pixels):
//   forward: im2col (parallel over pixels), then the GEMMs (onednn_gemm: oneDNN's, or one per
//     group by BLAS written straight into the output); images smaller than a chunk go several
//     to a chunk, with one GEMM over all their rows; depthwise: direct, a vector loop over
//     channels per (pixel, tap), no columns.
//   backward: the columns again and grad_weight += grad_out x columns (GEMM); grad columns
//     = grad_out^T x weight (GEMM) over the same buffer; grad_input by col2im, parallel
//     over input channels (each thread owns its channels: no races, and the same result
//     for any number of threads); grad_offset and grad_mask from dot products of the grad
//     columns with the four pixels (parallel over pixels). Chunks of many small images: both
//     an image per task (grads_by_image). Depthwise: no columns (depthwise_backward).
// 16-bit inputs are converted to float32 once and computed in float32 (GEMMs included);
// float64 computes in float64. The output is in deform_conv2d_output_format (the input's
// suggested memory format), the gradients contiguous.
//
// The inner loops are compiled twice, for the baseline ISA and for AVX2 + FMA, and the
// second is chosen at run time where the CPU has it: the library is built with generic
// flags, and these loops are most of the time that the GEMMs do not take.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <tuple>
#include <vector>

#include "../common/library.h"
#include "deform_conv2d.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define CUSTOMOPS_DC_AVX2 1
#define CUSTOMOPS_DC_TARGET_AVX2 __attribute__((target("avx2,fma")))
#include <immintrin.h>
#else
#define CUSTOMOPS_DC_AVX2 0
#endif

namespace customops {
namespace {

// Output pixels per column chunk: about kColumnBudget bytes of columns, which stay in the
// last-level cache between im2col and the GEMM that reads them; but, where there is a GEMM
// (not depthwise), at least kMinGemmPixels (within kColumnMaxBytes) when in_channels * kh * kw
// is so large that the budget holds fewer: the GEMM's pixel dimension, and with it its rate,
// would be too small (2 threads, at::mm of 256 x 25088 by 25088 x n: 145 GFLOP/s at n = 80,
// 170 from n = 160; 1x512x32x32 with a 7x7 kernel, forward 130 -> 101 ms).
constexpr int64_t kColumnBudget = 8 << 20;
constexpr int64_t kMinGemmPixels = 256;
constexpr int64_t kColumnMaxBytes = 32 << 20;

// The tensors of one image, in the compute type T, and the geometry.
template <typename T>
struct Image {
  const T* x;     // (height, width, in_channels): channels-last
  const T* off;   // (offset_groups, kh * kw, 2, out_pixels)
  const T* msk;   // (offset_groups, kh * kw, out_pixels), or nullptr
  const T* zero;  // in_channels zeros: what a pixel outside the image reads
  DeformConv2dGeometry g;

  C10_ALWAYS_INLINE BilinearTap<T> tap(
      int64_t oy, int64_t ox, int64_t p, int64_t i, int64_t j, int64_t ok, T* m) const {
    return deform_conv2d_tap_at(g, off, msk, oy, ox, p, i, j, ok, m);
  }

  C10_ALWAYS_INLINE const T* pixel(int64_t idx) const {
    return idx >= 0 ? x + idx * g.in_channels : zero;
  }
};

// Column buffer layout, one row per output pixel: [group][tap][channel within group], so
// that each group's (kh * kw * in_channels / groups) columns are contiguous and match the
// weight permuted to (out_channels, kh, kw, in_channels / groups). Depthwise (one input and
// one output channel per group, no GEMM): [tap][channel], so that a tap's channels are
// contiguous and the loops over them are vector loops, not runs of one channel.
struct ColumnLayout {
  int64_t row, per_group, taps, in_per_group;
  bool depthwise;
  int64_t tap_stride;
  explicit ColumnLayout(const DeformConv2dGeometry& g)
      : row(g.in_channels * g.taps()),
        per_group(g.taps() * g.in_per_group()),
        taps(g.taps()),
        in_per_group(g.in_per_group()),
        depthwise(g.in_per_group() == 1 && g.out_per_group() == 1),
        tap_stride(depthwise ? g.in_channels : in_per_group) {}
};

// Rows of columns a chunk may hold (see kColumnBudget), and output pixels per chunk of one image.
int64_t column_budget_rows(const ColumnLayout& L, int64_t elem_size) {
  const int64_t row = std::max<int64_t>(1, L.row * elem_size);
  const int64_t least = L.depthwise ? 1 : std::min(kMinGemmPixels, kColumnMaxBytes / row);
  return std::max({int64_t(1), kColumnBudget / row, least});
}
int64_t column_chunk_pixels(const DeformConv2dGeometry& g, const ColumnLayout& L, int64_t elem_size) {
  return std::min(g.out_pixels(), column_budget_rows(L, elem_size));
}

// Images per copy of the inputs' channels-last images and of grad_input's accumulator: about
// kColumnBudget bytes, at least one. Whole-batch copies were fresh allocations per call whose
// page faults took most of the copy's time (2 threads, 16x64x128x64 -> 32, 1x1 at stride 2: 19
// of 34 ms of the forward); a copy per image was a few ATen calls per image, which small images
// felt (8x16x28x50 -> 2: forward + backward 1.55 -> 1.75 ms; docs/deform_conv2d.md).
inline int64_t images_per_copy(const DeformConv2dGeometry& g, int64_t elem_size) {
  const int64_t image = std::max<int64_t>(1, g.height * g.width * g.in_channels * elem_size);
  return std::clamp<int64_t>(kColumnBudget / image, 1, std::max<int64_t>(g.batch, 1));
}

// Whole images per chunk, where the column budget (and, for images of kMinGemmPixels or more, a
// copy of the images) holds two or more, else 0 (one image, or a run of its pixels, per chunk):
// images below kMinGemmPixels, whose GEMM per image would run at a low rate; larger ones where
// the chunk's GEMM is batched over its images (batched: the forward of one group into NCHW),
// which saves a GEMM call per image (forward_impl).
int64_t images_per_chunk(const DeformConv2dGeometry& g, const ColumnLayout& L, int64_t elem_size, bool batched) {
  const bool small = g.out_pixels() < kMinGemmPixels;
  if (L.depthwise || !(small || batched)) return 0;
  int64_t images = std::min(
      {g.batch, column_budget_rows(L, elem_size) / g.out_pixels(), small ? g.batch : images_per_copy(g, elem_size)});
  // A batched GEMM's images go whole to the threads: as many to each.
  const int64_t threads = at::get_num_threads();
  if (!small && images > threads) images -= images % threads;
  return images >= 2 ? images : 0;
}

// A run of channels [c, c + n) of one offset group that lies in one group (depthwise: in
// consecutive groups); its values for tap k sit at base + k * tap_stride in a row of the
// column buffer.
struct Run {
  int64_t c, n, base;
};

// The runs of the channels [lo, hi), computed once per call (no division in the inner loops).
inline std::vector<Run> make_runs(const ColumnLayout& L, int64_t lo, int64_t hi) {
  if (L.depthwise) return {Run{lo, hi - lo, lo}};
  std::vector<Run> runs;
  for (int64_t c = lo; c < hi;) {
    const int64_t gc = c / L.in_per_group;
    const int64_t end = std::min(hi, (gc + 1) * L.in_per_group);
    runs.push_back({c, end - c, gc * L.per_group + (c - gc * L.in_per_group)});
    c = end;
  }
  return runs;
}

// The GEMMs take the weight and the columns in one order of (tap, channel) within a group.
// Where the whole call's columns (batch * out_pixels rows of in_channels * taps) are smaller
// than the weight (out_channels rows of in_channels / groups * taps), each chunk's columns are
// transposed, in cache, to the weight's own order [group][channel][tap]; else the weight is
// permuted once to the columns' order (and grad_weight back). A weight-heavy layer would
// otherwise spend more on the weight's copy than on its GEMM (2 threads, 1x1024x8x8 -> 1024
// 3x3: the 38 MB permuted copy 15 ms, the GEMM 8 ms; docs/deform_conv2d.md).
bool gemm_in_weight_order(const DeformConv2dGeometry& g, const ColumnLayout& L) {
  return !L.depthwise && L.taps > 1 && g.batch * g.out_pixels() * g.groups < g.out_channels;
}

// Rows of columns from the columns' order to the weight's (to_weight_order) or back.
void reorder_columns(
    const at::Tensor& src, const at::Tensor& dst, const DeformConv2dGeometry& g, bool to_weight_order) {
  const int64_t n = src.size(0), G = g.groups, K = g.taps(), C = g.in_per_group();
  if (to_weight_order) {
    dst.view({n, G, C, K}).copy_(src.view({n, G, K, C}).transpose(2, 3));
  } else {
    dst.view({n, G, K, C}).copy_(src.view({n, G, C, K}).transpose(2, 3));
  }
}

// The GEMMs of layers with columns run as BLAS's (at::mm) or as oneDNN's: a 1x1 convolution
// (groups as the layer's) over the rows seen as a channels-last (1, k, m, 1) image, whose output
// is again rows. torch's BLAS is MKL, which picks its fast kernels by CPU vendor: on the AMD EPYC
// here (2 threads, 2026-12-07) its sgemm ran these products at 0.16 to 0.21 TFLOP/s, oneDNN's
// convolution at 0.20 to 0.47 (4096 x 576 x 64: 1.49 against 0.66 ms). oneDNN is taken for
// products of m rows from kOnednnMinRows and 16 MFLOP, of a weight up to kOnednnMaxWeightBytes:
// below 16 MFLOP, the convolution's fixed cost made it lose (64 x 144 x 32: 12 against 10 us);
// below 256 rows it lost at some weights (1x1024x7x7 -> 1024 1x1, 49 rows: 0.66x) and won at
// others; and the convolution copies the weight into its own layout on every call, which for
// weights larger than this machine's last-level cache (32 MiB) cost more than its faster GEMM
// saved (forwards at 256 rows, BLAS / oneDNN: 36 MiB 0.77 to 1.04, 49 MiB 0.72; up to 27.6 MiB
// 1.47 to 1.83; with the bound, 1.18 to 1.29x as fast at four such layers:
// benchmarks/results/deform_conv2d_cpu_ab_onednn_weight_bound_2026-12-07.txt). The weight
// gradient from kOnednnWeightGradRows. Intel CPUs keep BLAS.
// Test hook: CUSTOMOPS_TEST_DEFORM_CPU_GEMM=onednn or =blas, read per call.
constexpr int64_t kOnednnMinRows = 256;
constexpr int64_t kOnednnMaxWeightBytes = int64_t{32} << 20;

// Whether the products of `rows` rows of columns with the layer's weight (out_channels x
// per_group values, each call's convolution copying all of it) run as oneDNN's.
template <typename T>
bool onednn_gemm(int64_t rows, int64_t weight_elems) {
  if (!std::is_same_v<T, float> || !at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn()) return false;
  const int forced = env_override("CUSTOMOPS_TEST_DEFORM_CPU_GEMM", "onednn", "blas");
  if (forced != 0) return forced > 0;
#if CUSTOMOPS_DC_AVX2
  static const bool intel = __builtin_cpu_is("intel");
  return !intel && rows >= kOnednnMinRows && 2 * rows * weight_elems >= (int64_t{16} << 20) &&
         weight_elems * static_cast<int64_t>(sizeof(T)) <= kOnednnMaxWeightBytes;
#else
  return false;
#endif
}

// oneDNN's weight gradient sums over the rows, and over fewer than this many it lost at some
// sizes, erratically (2 threads, rows x k x n: 256 x 25088 x 256 39.2 against BLAS's 19.1 ms; 49 x
// 4608 x 512 6.4 against 1.2 ms in one run, 1.1 against 1.4 in another); from 1024 it won at
// every size tried (1.5 to 2.2x; docs/deform_conv2d.md).
constexpr int64_t kOnednnWeightGradRows = 1024;

// rows (m, k), row-major, as the (1, k, m, 1) channels-last image that a 1x1 convolution reads.
at::Tensor rows_as_image(const at::Tensor& rows) {
  return rows.view({1, rows.size(0), 1, rows.size(1)}).permute({0, 3, 1, 2});
}

// Rows (m, groups * n): each group's (m, k) slice of rows (m, groups * k) times w's (n, k) rows
// of that group transposed; w (groups * n, k).
at::Tensor rows_times_weight(const at::Tensor& rows, const at::Tensor& w, int64_t groups) {
  const at::Tensor y = at::conv2d(
      rows_as_image(rows), w.view({w.size(0), w.size(1), 1, 1}), c10::optional<at::Tensor>(), at::IntArrayRef{1},
      at::IntArrayRef{0}, at::IntArrayRef{1}, groups);
  return y.permute({0, 2, 3, 1}).reshape({rows.size(0), w.size(0)});
}

// Rows (m, groups * k): per group, go's (m, n) slice times w's (n, k) rows of that group; w
// (groups * n, k). The convolution's input gradient, which reads w as it is (the forward's
// convolution would need w transposed: torch's copy of a 4608 x 512 one took 1.4 ms, more than
// the product of 49 rows).
at::Tensor rows_times_weight_t(const at::Tensor& go, const at::Tensor& w, int64_t groups) {
  const int64_t m = go.size(0), k = w.size(1) * groups;
  const at::Tensor input = at::empty({1, k, m, 1}, go.options().memory_format(at::MemoryFormat::ChannelsLast));
  const at::Tensor y = std::get<0>(at::convolution_backward(
      rows_as_image(go), input, w.view({w.size(0), w.size(1), 1, 1}), c10::nullopt, {1, 1}, {0, 0}, {1, 1}, false,
      {0, 0}, groups, {true, false, false}));
  return y.permute({0, 2, 3, 1}).reshape({m, k});
}

// (groups * n, k): per group, go's (m, n) slice transposed times rows' (m, k) slice; go (m,
// groups * n), rows (m, groups * k).
at::Tensor weight_grad_of_rows(const at::Tensor& go, const at::Tensor& rows, int64_t groups) {
  const int64_t n = go.size(1), k = rows.size(1) / groups;
  const at::Tensor w = at::empty({n, k, 1, 1}, rows.options());  // its sizes only
  return std::get<1>(at::convolution_backward(
                         rows_as_image(go), rows_as_image(rows), w, c10::nullopt, {1, 1}, {0, 0}, {1, 1}, false, {0, 0},
                         groups, {false, true, false}))
      .view({n, k});
}

inline std::vector<std::vector<Run>> runs_by_offset_group(const DeformConv2dGeometry& g) {
  const ColumnLayout L(g);
  std::vector<std::vector<Run>> runs;
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    runs.push_back(make_runs(L, og * g.in_per_offset_group(), (og + 1) * g.in_per_offset_group()));
  }
  return runs;
}

// 32-byte vectors (GCC/Clang vector extensions): ymm registers in the AVX2 instantiation,
// pairs of xmm in the baseline one. Written out because the reductions below do not
// vectorize by themselves (that would reorder a sum), and so that the loops do not depend on
// what the auto-vectorizer makes of them.
template <typename T>
struct Simd {
  static constexpr int64_t kLanes = 32 / sizeof(T);
  typedef T V __attribute__((vector_size(32)));
  static C10_ALWAYS_INLINE V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  static C10_ALWAYS_INLINE void store(T* p, V v) {
    std::memcpy(p, &v, sizeof(V));
  }
  static C10_ALWAYS_INLINE V splat(T x) {
    V v;
    for (int64_t l = 0; l < kLanes; ++l) v[l] = x;
    return v;
  }
  static C10_ALWAYS_INLINE T sum(V v) {
    T s = 0;
    for (int64_t l = 0; l < kLanes; ++l) s += v[l];
    return s;
  }
};

// dst[i] = wa a[i] + wb b[i] + wc c[i] + wd d[i]: one tap's bilinear sample over n channels.
template <typename T>
C10_ALWAYS_INLINE void sample4(
    T* __restrict__ dst, const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c,
    const T* __restrict__ d, T wa, T wb, T wc, T wd, int64_t n) {
  using S = Simd<T>;
  const typename S::V va = S::splat(wa), vb = S::splat(wb), vc = S::splat(wc), vd = S::splat(wd);
  int64_t i = 0;
  for (; i + S::kLanes <= n; i += S::kLanes) {
    S::store(dst + i, va * S::load(a + i) + vb * S::load(b + i) + vc * S::load(c + i) + vd * S::load(d + i));
  }
  for (; i < n; ++i) dst[i] = wa * a[i] + wb * b[i] + wc * c[i] + wd * d[i];
}

// acc[i] += w[i] (wa a[i] + wb b[i] + wc c[i] + wd d[i]): one depthwise tap over n channels.
template <typename T>
C10_ALWAYS_INLINE void weighted_sample4(
    T* __restrict__ acc, const T* __restrict__ w, const T* __restrict__ a, const T* __restrict__ b,
    const T* __restrict__ c, const T* __restrict__ d, T wa, T wb, T wc, T wd, int64_t n) {
  using S = Simd<T>;
  const typename S::V va = S::splat(wa), vb = S::splat(wb), vc = S::splat(wc), vd = S::splat(wd);
  int64_t i = 0;
  for (; i + S::kLanes <= n; i += S::kLanes) {
    const typename S::V v = va * S::load(a + i) + vb * S::load(b + i) + vc * S::load(c + i) + vd * S::load(d + i);
    S::store(acc + i, S::load(acc + i) + S::load(w + i) * v);
  }
  for (; i < n; ++i) acc[i] += w[i] * (wa * a[i] + wb * b[i] + wc * c[i] + wd * d[i]);
}

// dst[i] += w src[i].
template <typename T>
C10_ALWAYS_INLINE void axpy(T* __restrict__ dst, const T* __restrict__ src, T w, int64_t n) {
  using S = Simd<T>;
  const typename S::V vw = S::splat(w);
  int64_t i = 0;
  for (; i + S::kLanes <= n; i += S::kLanes) S::store(dst + i, S::load(dst + i) + vw * S::load(src + i));
  for (; i < n; ++i) dst[i] += w * src[i];
}

// dst[i] += w g[i] v[i].
template <typename T>
C10_ALWAYS_INLINE void axpy_product(
    T* __restrict__ dst, const T* __restrict__ g, const T* __restrict__ v, T w, int64_t n) {
  using S = Simd<T>;
  const typename S::V vw = S::splat(w);
  int64_t i = 0;
  for (; i + S::kLanes <= n; i += S::kLanes)
    S::store(dst + i, S::load(dst + i) + vw * (S::load(g + i) * S::load(v + i)));
  for (; i < n; ++i) dst[i] += w * (g[i] * v[i]);
}

// acc[k] += sum_i g[i] * p_k[i] for the four pixels p_0..p_3, in vector partial sums; with
// kScaled, g[i] * w[i] in place of g[i].
template <typename T, bool kScaled = false>
C10_ALWAYS_INLINE void dot4(
    const T* __restrict__ g, const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c,
    const T* __restrict__ d, int64_t n, T acc[4], const T* __restrict__ w = nullptr) {
  using S = Simd<T>;
  typename S::V s0 = S::splat(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + S::kLanes <= n; i += S::kLanes) {
    typename S::V gv = S::load(g + i);
    if constexpr (kScaled) gv *= S::load(w + i);
    s0 += gv * S::load(a + i);
    s1 += gv * S::load(b + i);
    s2 += gv * S::load(c + i);
    s3 += gv * S::load(d + i);
  }
  T t0 = S::sum(s0), t1 = S::sum(s1), t2 = S::sum(s2), t3 = S::sum(s3);
  for (; i < n; ++i) {
    const T gi = kScaled ? g[i] * w[i] : g[i];
    t0 += gi * a[i];
    t1 += gi * b[i];
    t2 += gi * c[i];
    t3 += gi * d[i];
  }
  acc[0] += t0;
  acc[1] += t1;
  acc[2] += t2;
  acc[3] += t3;
}

// columns[r] for the output pixels p0 + r, r in [r0, r1).
template <typename T>
C10_ALWAYS_INLINE void im2col_body(
    const Image<T>& im, const std::vector<std::vector<Run>>& runs, int64_t p0, int64_t r0, int64_t r1, T* col) {
  const DeformConv2dGeometry& g = im.g;
  const ColumnLayout L(g);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t p = p0 + r, oy = p / g.out_w, ox = p - oy * g.out_w;
    T* row = col + r * L.row;
    for (int64_t og = 0; og < g.offset_groups; ++og) {
      for (int64_t i = 0, k = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j, ++k) {
          T m;
          const BilinearTap<T> t = im.tap(oy, ox, p, i, j, og * g.taps() + k, &m);
          const T* s[4] = {im.pixel(t.idx[0]), im.pixel(t.idx[1]), im.pixel(t.idx[2]), im.pixel(t.idx[3])};
          const T w[4] = {m * t.w[0], m * t.w[1], m * t.w[2], m * t.w[3]};
          for (const Run& run : runs[og]) {
            T* dst = row + run.base + k * L.tap_stride;
            if (!t.inside) {
              std::fill(dst, dst + run.n, T(0));
            } else {
              const int64_t c = run.c;
              sample4(dst, s[0] + c, s[1] + c, s[2] + c, s[3] + c, w[0], w[1], w[2], w[3], run.n);
            }
          }
        }
      }
    }
  }
}

// Depthwise (groups = in_channels = out_channels): out (out_pixels, in_channels) rows
// p in [r0, r1) of sum over taps k of wt[k, c] * mask * bilinear(x[., c], tap k), with wt
// (kh * kw, in_channels). No columns: im2col's runs would be one channel long, and each
// group's GEMM a dot product of kh * kw values.
template <typename T>
C10_ALWAYS_INLINE void depthwise_body(const Image<T>& im, const T* wt, int64_t r0, int64_t r1, T* out) {
  const DeformConv2dGeometry& g = im.g;
  const int64_t C = g.in_channels, cog = g.in_per_offset_group();
  for (int64_t p = r0; p < r1; ++p) {
    const int64_t oy = p / g.out_w, ox = p - oy * g.out_w;
    T* acc = out + p * C;
    std::fill(acc, acc + C, T(0));
    for (int64_t og = 0, c = 0; og < g.offset_groups; ++og, c += cog) {
      for (int64_t i = 0, k = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j, ++k) {
          T m;
          const BilinearTap<T> t = im.tap(oy, ox, p, i, j, og * g.taps() + k, &m);
          if (!t.inside) continue;
          weighted_sample4(
              acc + c, wt + k * C + c, im.pixel(t.idx[0]) + c, im.pixel(t.idx[1]) + c, im.pixel(t.idx[2]) + c,
              im.pixel(t.idx[3]) + c, m * t.w[0], m * t.w[1], m * t.w[2], m * t.w[3], cog);
        }
      }
    }
  }
}

// grad_x (height, width, in_channels) += col2im(grad columns), for channels [c0, c1).
template <typename T>
C10_ALWAYS_INLINE void col2im_body(
    const Image<T>& im, int64_t p0, int64_t rows, const T* gcol, int64_t c0, int64_t c1, T* gx) {
  const DeformConv2dGeometry& g = im.g;
  const ColumnLayout L(g);
  const int64_t cog = g.in_per_offset_group();
  const int64_t C = g.in_channels;
  for (int64_t og = c0 / cog; og * cog < c1; ++og) {
    const std::vector<Run> runs = make_runs(L, std::max(c0, og * cog), std::min(c1, (og + 1) * cog));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = p0 + r, oy = p / g.out_w, ox = p - oy * g.out_w;
      const T* row = gcol + r * L.row;
      for (int64_t i = 0, k = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j, ++k) {
          T m;
          const BilinearTap<T> t = im.tap(oy, ox, p, i, j, og * g.taps() + k, &m);
          if (!t.inside) continue;
          for (int q = 0; q < 4; ++q) {
            if (t.idx[q] < 0) continue;
            T* dst = gx + t.idx[q] * C;
            const T w = m * t.w[q];
            for (const Run& run : runs) axpy(dst + run.c, row + run.base + k * L.tap_stride, w, run.n);
          }
        }
      }
    }
  }
}

// grad_offset and grad_mask (offset's and mask's layouts, image b) for pixels p0 + [r0, r1).
template <typename T>
C10_ALWAYS_INLINE void coord_grad_body(
    const Image<T>& im, const std::vector<std::vector<Run>>& runs, int64_t p0, int64_t r0, int64_t r1, const T* gcol,
    T* goff, T* gmask) {
  const DeformConv2dGeometry& g = im.g;
  const ColumnLayout L(g);
  const int64_t P = g.out_pixels();
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t p = p0 + r, oy = p / g.out_w, ox = p - oy * g.out_w;
    const T* row = gcol + r * L.row;
    for (int64_t og = 0; og < g.offset_groups; ++og) {
      for (int64_t i = 0, k = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j, ++k) {
          const int64_t ok = og * g.taps() + k;
          T m;
          const BilinearTap<T> t = im.tap(oy, ox, p, i, j, ok, &m);
          T gy = 0, gx = 0, gm = 0;
          if (t.inside) {
            const T* s[4] = {im.pixel(t.idx[0]), im.pixel(t.idx[1]), im.pixel(t.idx[2]), im.pixel(t.idx[3])};
            T d[4] = {0, 0, 0, 0};
            for (const Run& run : runs[og]) {
              const int64_t c = run.c;
              dot4(row + run.base + k * L.tap_stride, s[0] + c, s[1] + c, s[2] + c, s[3] + c, run.n, d);
            }
            bilinear_tap_grads(t, d, m, &gy, &gx, &gm);
          }
          if (goff) {
            goff[(2 * ok) * P + p] = gy;
            goff[(2 * ok + 1) * P + p] = gx;
          }
          if (gmask) gmask[ok * P + p] = gm;
        }
      }
    }
  }
}

// The depthwise backward, without columns: a grad column of tap k would be go * wt[k], go the
// pixel's grad_out (C) and wt (taps, C) the weight. For output pixels p0 + [0, rows) and
// channels [c0, c1): grad_x (height, width, C) += the bilinear scatter of those grad columns, and
// gw (taps, C) += go * the bilinear sample of tap k, where gx or gw is given. Per channel, the
// same order of additions for any split of the channels.
template <typename T>
C10_ALWAYS_INLINE void depthwise_backward_body(
    const Image<T>& im, int64_t p0, int64_t rows, const T* go, const T* wt, int64_t c0, int64_t c1, T* gx, T* gw) {
  const DeformConv2dGeometry& g = im.g;
  const int64_t C = g.in_channels, cog = g.in_per_offset_group();
  for (int64_t og = c0 / cog; og * cog < c1; ++og) {
    const int64_t lo = std::max(c0, og * cog), n = std::min(c1, (og + 1) * cog) - lo;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = p0 + r, oy = p / g.out_w, ox = p - oy * g.out_w;
      const T* gr = go + r * C + lo;
      for (int64_t i = 0, k = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j, ++k) {
          T m;
          const BilinearTap<T> t = im.tap(oy, ox, p, i, j, og * g.taps() + k, &m);
          if (!t.inside) continue;
          if (gw) {
            weighted_sample4(
                gw + k * C + lo, gr, im.pixel(t.idx[0]) + lo, im.pixel(t.idx[1]) + lo, im.pixel(t.idx[2]) + lo,
                im.pixel(t.idx[3]) + lo, m * t.w[0], m * t.w[1], m * t.w[2], m * t.w[3], n);
          }
          if (!gx) continue;
          for (int q = 0; q < 4; ++q) {
            if (t.idx[q] >= 0) axpy_product(gx + t.idx[q] * C + lo, gr, wt + k * C + lo, m * t.w[q], n);
          }
        }
      }
    }
  }
}

// grad_offset and grad_mask of the depthwise backward (coord_grad's, with the grad columns
// go * wt[k] formed as they are read), for output pixels p0 + [r0, r1).
template <typename T>
C10_ALWAYS_INLINE void depthwise_coord_grad_body(
    const Image<T>& im, int64_t p0, int64_t r0, int64_t r1, const T* go, const T* wt, T* goff, T* gmask) {
  const DeformConv2dGeometry& g = im.g;
  const int64_t C = g.in_channels, cog = g.in_per_offset_group(), P = g.out_pixels();
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t p = p0 + r, oy = p / g.out_w, ox = p - oy * g.out_w;
    for (int64_t og = 0, c = 0; og < g.offset_groups; ++og, c += cog) {
      for (int64_t i = 0, k = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j, ++k) {
          const int64_t ok = og * g.taps() + k;
          T m;
          const BilinearTap<T> t = im.tap(oy, ox, p, i, j, ok, &m);
          T gy = 0, gxx = 0, gm = 0;
          if (t.inside) {
            T d[4] = {0, 0, 0, 0};
            dot4<T, true>(
                go + r * C + c, im.pixel(t.idx[0]) + c, im.pixel(t.idx[1]) + c, im.pixel(t.idx[2]) + c,
                im.pixel(t.idx[3]) + c, cog, d, wt + k * C + c);
            bilinear_tap_grads(t, d, m, &gy, &gxx, &gm);
          }
          if (goff) {
            goff[(2 * ok) * P + p] = gy;
            goff[(2 * ok + 1) * P + p] = gxx;
          }
          if (gmask) gmask[ok * P + p] = gm;
        }
      }
    }
  }
}

using Runs = std::vector<std::vector<Run>>;

template <typename T>
void im2col_base(const Image<T>& im, const Runs& runs, int64_t p0, int64_t r0, int64_t r1, T* col) {
  im2col_body(im, runs, p0, r0, r1, col);
}
template <typename T>
void col2im_base(const Image<T>& im, int64_t p0, int64_t rows, const T* gcol, int64_t c0, int64_t c1, T* gx) {
  col2im_body(im, p0, rows, gcol, c0, c1, gx);
}
template <typename T>
void depthwise_base(const Image<T>& im, const T* wt, int64_t r0, int64_t r1, T* out) {
  depthwise_body(im, wt, r0, r1, out);
}
template <typename T>
void depthwise_backward_base(
    const Image<T>& im, int64_t p0, int64_t rows, const T* go, const T* wt, int64_t c0, int64_t c1, T* gx, T* gw) {
  depthwise_backward_body(im, p0, rows, go, wt, c0, c1, gx, gw);
}
template <typename T>
void depthwise_coord_grad_base(
    const Image<T>& im, int64_t p0, int64_t r0, int64_t r1, const T* go, const T* wt, T* goff, T* gmask) {
  depthwise_coord_grad_body(im, p0, r0, r1, go, wt, goff, gmask);
}
template <typename T>
void coord_grad_base(
    const Image<T>& im, const Runs& runs, int64_t p0, int64_t r0, int64_t r1, const T* gcol, T* goff, T* gmask) {
  coord_grad_body(im, runs, p0, r0, r1, gcol, goff, gmask);
}

#if CUSTOMOPS_DC_AVX2
template <typename T>
CUSTOMOPS_DC_TARGET_AVX2 void im2col_avx2(
    const Image<T>& im, const Runs& runs, int64_t p0, int64_t r0, int64_t r1, T* col) {
  im2col_body(im, runs, p0, r0, r1, col);
}
template <typename T>
CUSTOMOPS_DC_TARGET_AVX2 void depthwise_avx2(const Image<T>& im, const T* wt, int64_t r0, int64_t r1, T* out) {
  depthwise_body(im, wt, r0, r1, out);
}
template <typename T>
CUSTOMOPS_DC_TARGET_AVX2 void col2im_avx2(
    const Image<T>& im, int64_t p0, int64_t rows, const T* gcol, int64_t c0, int64_t c1, T* gx) {
  col2im_body(im, p0, rows, gcol, c0, c1, gx);
}
template <typename T>
CUSTOMOPS_DC_TARGET_AVX2 void depthwise_backward_avx2(
    const Image<T>& im, int64_t p0, int64_t rows, const T* go, const T* wt, int64_t c0, int64_t c1, T* gx, T* gw) {
  depthwise_backward_body(im, p0, rows, go, wt, c0, c1, gx, gw);
}
template <typename T>
CUSTOMOPS_DC_TARGET_AVX2 void depthwise_coord_grad_avx2(
    const Image<T>& im, int64_t p0, int64_t r0, int64_t r1, const T* go, const T* wt, T* goff, T* gmask) {
  depthwise_coord_grad_body(im, p0, r0, r1, go, wt, goff, gmask);
}
template <typename T>
CUSTOMOPS_DC_TARGET_AVX2 void coord_grad_avx2(
    const Image<T>& im, const Runs& runs, int64_t p0, int64_t r0, int64_t r1, const T* gcol, T* goff, T* gmask) {
  coord_grad_body(im, runs, p0, r0, r1, gcol, goff, gmask);
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

template <typename T>
void im2col(const Image<T>& im, const Runs& runs, int64_t p0, int64_t rows, T* col) {
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, ColumnLayout(im.g).row));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
#if CUSTOMOPS_DC_AVX2
    if (cpu_has_avx2()) return im2col_avx2(im, runs, p0, r0, r1, col);
#endif
    im2col_base(im, runs, p0, r0, r1, col);
  });
}

template <typename T>
void depthwise(const Image<T>& im, const T* wt, T* out) {
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, ColumnLayout(im.g).row));
  at::parallel_for(0, im.g.out_pixels(), grain, [&](int64_t r0, int64_t r1) {
#if CUSTOMOPS_DC_AVX2
    if (cpu_has_avx2()) return depthwise_avx2(im, wt, r0, r1, out);
#endif
    depthwise_base(im, wt, r0, r1, out);
  });
}

// Parallel over blocks of a cache line's worth of channels: threads that owned channels of one
// line each wrote it at every sampling point, and the line moved between their cores at every
// write (2 threads, grad_input of 1x16x128x128 -> 16: 7.7 -> 5.2 ms; docs/deform_conv2d.md).
template <typename T>
void col2im(const Image<T>& im, int64_t p0, int64_t rows, const T* gcol, T* gx) {
  const int64_t C = im.g.in_channels, line = 64 / sizeof(T), blocks = (C + line - 1) / line;
  const int64_t per_block = std::max<int64_t>(1, rows * im.g.taps() * std::min(C, line));
  const int64_t grain = std::max<int64_t>(1, 8192 / per_block);
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t c0 = b0 * line, c1 = std::min(C, b1 * line);
#if CUSTOMOPS_DC_AVX2
    if (cpu_has_avx2()) return col2im_avx2(im, p0, rows, gcol, c0, c1, gx);
#endif
    col2im_base(im, p0, rows, gcol, c0, c1, gx);
  });
}

// Over blocks of a cache line's channels, as col2im.
template <typename T>
void depthwise_backward(const Image<T>& im, int64_t p0, int64_t rows, const T* go, const T* wt, T* gx, T* gw) {
  const int64_t C = im.g.in_channels, line = 64 / sizeof(T), blocks = (C + line - 1) / line;
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, rows * im.g.taps() * std::min(C, line)));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t c0 = b0 * line, c1 = std::min(C, b1 * line);
#if CUSTOMOPS_DC_AVX2
    if (cpu_has_avx2()) return depthwise_backward_avx2(im, p0, rows, go, wt, c0, c1, gx, gw);
#endif
    depthwise_backward_base(im, p0, rows, go, wt, c0, c1, gx, gw);
  });
}

template <typename T>
void depthwise_coord_grad(const Image<T>& im, int64_t p0, int64_t rows, const T* go, const T* wt, T* goff, T* gmask) {
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, ColumnLayout(im.g).row));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
#if CUSTOMOPS_DC_AVX2
    if (cpu_has_avx2()) return depthwise_coord_grad_avx2(im, p0, r0, r1, go, wt, goff, gmask);
#endif
    depthwise_coord_grad_base(im, p0, r0, r1, go, wt, goff, gmask);
  });
}

template <typename T>
void coord_grad(const Image<T>& im, const Runs& runs, int64_t p0, int64_t rows, const T* gcol, T* goff, T* gmask) {
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, ColumnLayout(im.g).row));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
#if CUSTOMOPS_DC_AVX2
    if (cpu_has_avx2()) return coord_grad_avx2(im, runs, p0, r0, r1, gcol, goff, gmask);
#endif
    coord_grad_base(im, runs, p0, r0, r1, gcol, goff, gmask);
  });
}

// dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols: the NCHW <-> channels-last
// changes of layout, in tiles over both threads, with an 8x8 register transpose for float
// where the CPU has AVX2. torch's copy_ of a permuted tensor ran at a fraction of the copy
// bandwidth (2 threads, 1x256x32x32: 230 us to channels-last, where 1 MB moves in about 65 us),
// most of a depthwise forward from an NCHW input (docs/deform_conv2d.md).
constexpr int64_t kTransposeTile = 32;

template <typename T>
C10_ALWAYS_INLINE void transpose_tile_base(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t r, int64_t c) {
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t i = 0; i < r; ++i) dst[j * ld_dst + i] = src[i * ld_src + j];
  }
}

#if CUSTOMOPS_DC_AVX2
CUSTOMOPS_DC_TARGET_AVX2 void transpose_tile_avx2(
    const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t r, int64_t c) {
  int64_t i = 0;
  for (; i + 8 <= r; i += 8) {
    int64_t j = 0;
    for (; j + 8 <= c; j += 8) {
      const float* s = src + i * ld_src + j;
      __m256 a[8], t[8];
      for (int k = 0; k < 8; ++k) a[k] = _mm256_loadu_ps(s + k * ld_src);
      for (int k = 0; k < 4; ++k) {
        t[2 * k] = _mm256_unpacklo_ps(a[2 * k], a[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(a[2 * k], a[2 * k + 1]);
      }
      for (int k = 0; k < 2; ++k) {
        a[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        a[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
        a[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        a[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
      }
      float* d = dst + j * ld_dst + i;
      for (int k = 0; k < 4; ++k) {
        _mm256_storeu_ps(d + k * ld_dst, _mm256_permute2f128_ps(a[k], a[k + 4], 0x20));
        _mm256_storeu_ps(d + (k + 4) * ld_dst, _mm256_permute2f128_ps(a[k], a[k + 4], 0x31));
      }
    }
    transpose_tile_base(src + i * ld_src + j, ld_src, dst + j * ld_dst + i, ld_dst, 8, c - j);
  }
  transpose_tile_base(src + i * ld_src, ld_src, dst + i, ld_dst, r - i, c);
}
#endif

template <typename T>
void transpose(const T* src, int64_t rows, int64_t cols, int64_t ld_src, T* dst, int64_t ld_dst) {
  const int64_t tr = (rows + kTransposeTile - 1) / kTransposeTile, tc = (cols + kTransposeTile - 1) / kTransposeTile;
  const int64_t grain = std::max<int64_t>(1, 32768 / (kTransposeTile * kTransposeTile));
  at::parallel_for(0, tr * tc, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / tc * kTransposeTile, j = t % tc * kTransposeTile;
      const int64_t r = std::min(kTransposeTile, rows - i), c = std::min(kTransposeTile, cols - j);
      const T* s = src + i * ld_src + j;
      T* d = dst + j * ld_dst + i;
#if CUSTOMOPS_DC_AVX2
      if constexpr (std::is_same_v<T, float>) {
        if (cpu_has_avx2()) {
          transpose_tile_avx2(s, ld_src, d, ld_dst, r, c);
          continue;
        }
      }
#endif
      transpose_tile_base(s, ld_src, d, ld_dst, r, c);
    }
  });
}

// dst = src, both (batch, M, N), where src's M and dst's N are their unit strides: one
// transpose per matrix; else (other layouts or dtypes) torch's copy_.
template <typename T>
void copy_transposed(const at::Tensor& dst, const at::Tensor& src) {
  const auto ct = c10::CppTypeToScalarType<T>::value;
  if (src.scalar_type() != ct || dst.scalar_type() != ct || src.stride(1) != 1 || dst.stride(2) != 1 ||
      src.size(1) < 2 || src.size(2) < 2) {
    dst.copy_(src);
    return;
  }
  for (int64_t b = 0; b < src.size(0); ++b) {
    transpose(
        src.const_data_ptr<T>() + b * src.stride(0), src.size(2), src.size(1), src.stride(2),
        dst.data_ptr<T>() + b * dst.stride(0), dst.stride(1));
  }
}

// dst (batch, C, H, W), channels_last in T, = src (any layout and dtype).
template <typename T>
void copy_to_channels_last(const at::Tensor& dst, const at::Tensor& src) {
  const at::Tensor s = src.to(c10::CppTypeToScalarType<T>::value);
  if (!s.is_contiguous()) return dst.copy_(s), void();
  copy_transposed<T>(dst.permute({0, 2, 3, 1}).flatten(1, 2), s.flatten(2).transpose(1, 2));
}

// t (batch, C, H, W) in T, NCHW-contiguous (t itself where it is).
template <typename T>
at::Tensor to_nchw(const at::Tensor& t) {
  const at::Tensor s = t.to(c10::CppTypeToScalarType<T>::value);
  if (s.is_contiguous() || !s.is_contiguous(at::MemoryFormat::ChannelsLast)) return s.contiguous();
  at::Tensor out = at::empty(s.sizes(), s.options().memory_format(at::MemoryFormat::Contiguous));
  copy_transposed<T>(out.flatten(2), s.flatten(2));
  return out;
}

// The images b0 .. b0 + nb - 1 that a buffer of images holds. next(first, count): false where
// it holds first .. first + count - 1; else it moves to the images from first, count of them
// or per_copy, within the batch, and returns true.
struct ImageRange {
  int64_t b0 = 0, nb = 0;
  bool next(int64_t first, int64_t count, int64_t per_copy, int64_t batch) {
    if (first >= b0 && first + count <= b0 + nb) return false;
    b0 = first;
    nb = std::min(std::max(count, per_copy), batch - first);
    return true;
  }
};

// What the forward and the backward both read, converted to the compute type T. The images
// are read channels-last: a channels_last input of type T in place, a batch of one copy's size
// copied whole here (through stage's buffer, 1x48x75x75 forwards read 0.87 to 0.91 of this,
// not understood), any other by stage, a few images at a time into one reused buffer.
template <typename T>
struct Operands {
  // w2: (groups, out_channels / groups, kh * kw * in_channels / groups), in the GEMMs' order
  at::Tensor input, x, off, msk, zero, w2;
  at::TensorOptions opts;  // T, contiguous, on the CPU
  DeformConv2dGeometry g;
  ImageRange held;  // the images that x holds (all of them where it is the input)
  int64_t per_copy = 1;

  Operands(
      const DeformConv2dGeometry& geo, const at::Tensor& input_, const at::Tensor& offset, const at::Tensor& weight,
      const c10::optional<at::Tensor>& mask, bool need_weight, bool weight_order)
      : input(input_), g(geo), per_copy(images_per_copy(geo, sizeof(T))) {
    const auto ct = c10::CppTypeToScalarType<T>::value;
    opts = input.options().dtype(ct).memory_format(at::MemoryFormat::Contiguous);
    if (input.scalar_type() == ct && input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
      x = input;
      held.nb = g.batch;
    } else if (per_copy >= g.batch) {
      x = at::empty(input.sizes(), opts.memory_format(at::MemoryFormat::ChannelsLast));
      copy_to_channels_last<T>(x, input);
      held.nb = g.batch;
    }
    off = offset.to(ct).contiguous();
    if (mask.has_value()) msk = mask->to(ct).contiguous();
    zero = at::zeros({g.in_channels}, opts);
    if (need_weight) {
      const at::Tensor w = weight.to(ct);
      w2 = (weight_order ? w : w.permute({0, 2, 3, 1}))
               .contiguous()
               .view({g.groups, g.out_per_group(), g.taps() * g.in_per_group()});
    }
  }

  // Images first .. first + count - 1 channels-last in x (and up to per_copy from first), for
  // image(b).
  void stage(int64_t first, int64_t count) {
    if (!held.next(first, count, per_copy, g.batch)) return;
    if (!x.defined() || x.size(0) < held.nb) {
      x = at::empty({held.nb, g.in_channels, g.height, g.width}, opts.memory_format(at::MemoryFormat::ChannelsLast));
    }
    copy_to_channels_last<T>(x.narrow(0, 0, held.nb), input.narrow(0, first, held.nb));
  }

  Image<T> image(int64_t b) const {
    TORCH_INTERNAL_ASSERT(b >= held.b0 && b < held.b0 + held.nb, "deform_conv2d: image ", b, " is not staged");
    const int64_t P = g.out_pixels();
    return Image<T>{
        x.const_data_ptr<T>() + (b - held.b0) * g.height * g.width * g.in_channels,
        off.const_data_ptr<T>() + b * g.offset_groups * g.taps() * 2 * P,
        msk.defined() ? msk.const_data_ptr<T>() + b * g.offset_groups * g.taps() * P : nullptr,
        zero.const_data_ptr<T>(), g};
  }
};

// col2im and the offset and mask gradients of whole images b0 .. b0 + nb - 1 (grad columns row
// bl * out_pixels + p), an image per task, where there are at least two images per thread: one
// parallel region per chunk where col2im over channels and coord_grad over pixels took two per
// image, and every thread computed every sampling point of col2im (2 threads, the main job's
// layer 256x48x12x12 -> 48, forward + backward 1.2x as fast; docs/deform_conv2d.md). An
// image is one thread's, in col2im's order of additions per channel, so the result is the same
// either way, for any number of threads. False (nothing done) where the images are too few.
template <typename T>
bool grads_by_image(
    const Operands<T>& ops, const Runs& runs, int64_t b0, int64_t nb, const T* gcol, T* gx, T* goff, T* gmask) {
  if (nb < 2 * at::get_num_threads()) return false;
  const DeformConv2dGeometry& g = ops.g;
  const int64_t P = g.out_pixels(), row = ColumnLayout(g).row;
  at::parallel_for(0, nb, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t bl = i0; bl < i1; ++bl) {
      const int64_t b = b0 + bl;
      const Image<T> im = ops.image(b);
      const T* gc = gcol + bl * P * row;
      T* gxb = gx ? gx + bl * g.height * g.width * g.in_channels : nullptr;
      T* goffb = goff ? goff + b * g.offset_groups * g.taps() * 2 * P : nullptr;
      T* gmaskb = gmask ? gmask + b * g.offset_groups * g.taps() * P : nullptr;
#if CUSTOMOPS_DC_AVX2
      if (cpu_has_avx2()) {
        if (gxb) col2im_avx2(im, 0, P, gc, 0, g.in_channels, gxb);
        if (goffb || gmaskb) coord_grad_avx2(im, runs, 0, 0, P, gc, goffb, gmaskb);
        continue;
      }
#endif
      if (gxb) col2im_base(im, 0, P, gc, 0, g.in_channels, gxb);
      if (goffb || gmaskb) coord_grad_base(im, runs, 0, 0, P, gc, goffb, gmaskb);
    }
  });
  return true;
}

// The columns of whole images b0 .. b0 + nb - 1 (row bl * out_pixels + p), in one parallel
// region over all their rows.
template <typename T>
void im2col_images(const Operands<T>& ops, const Runs& runs, int64_t b0, int64_t nb, T* col) {
  const int64_t P = ops.g.out_pixels(), row = ColumnLayout(ops.g).row;
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, row));
  at::parallel_for(0, nb * P, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t bl = r0 / P; bl * P < r1; ++bl) {
      const Image<T> im = ops.image(b0 + bl);
      const int64_t lo = std::max(r0, bl * P) - bl * P, hi = std::min(r1, (bl + 1) * P) - bl * P;
      T* dst = col + bl * P * row;
#if CUSTOMOPS_DC_AVX2
      if (cpu_has_avx2()) {
        im2col_avx2(im, runs, 0, lo, hi, dst);
        continue;
      }
#endif
      im2col_base(im, runs, 0, lo, hi, dst);
    }
  });
}

template <typename T>
at::Tensor forward_impl(
    const DeformConv2dGeometry& g, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& mask, at::Tensor& out) {
  const auto ct = c10::CppTypeToScalarType<T>::value;
  const ColumnLayout L(g);
  const bool weight_order = gemm_in_weight_order(g, L);
  Operands<T> ops(g, input, offset, weight, mask, !L.depthwise, weight_order);
  at::Tensor out_t = out.scalar_type() == ct ? out : at::empty_like(out, out.options().dtype(ct));
  const at::Tensor out3 = out_t.flatten(2);  // (batch, out_channels, pixels), a view in either format
  if (L.depthwise) {
    const at::Tensor wt = weight.to(ct).reshape({g.in_channels, g.taps()}).t().contiguous();
    at::Tensor rows = at::empty({g.out_pixels(), g.in_channels}, ops.opts);
    for (int64_t b = 0; b < g.batch; ++b) {
      ops.stage(b, 1);
      depthwise(ops.image(b), wt.const_data_ptr<T>(), rows.data_ptr<T>());
      copy_transposed<T>(out3.narrow(0, b, 1), rows.t().unsqueeze(0));
    }
  } else {
    const int64_t P = g.out_pixels();
    const int64_t images = images_per_chunk(g, L, sizeof(T), g.groups == 1 && out_t.is_contiguous());
    const int64_t chunk = std::max(column_chunk_pixels(g, L, sizeof(T)), images * P);
    at::Tensor col = at::empty({chunk, L.row}, ops.opts);
    const at::Tensor colw = weight_order ? at::empty_like(col) : col;  // the GEMMs' columns
    // The GEMMs' operand for a chunk of n rows whose columns im2col has written.
    const auto gemm_cols = [&](int64_t n) {
      if (weight_order) reorder_columns(col.narrow(0, 0, n), colw.narrow(0, 0, n), g, true);
      return colw.narrow(0, 0, n);
    };
    const Runs runs = runs_by_offset_group(g);
    // oneDNN's GEMM of n rows of columns into dst, (images, out_channels, n) of out3; false
    // (nothing done) where BLAS's is to run (onednn_gemm).
    const auto onednn_into_out = [&](const at::Tensor& cols, const at::Tensor& dst) {
      if (!onednn_gemm<T>(cols.size(0), g.out_channels * L.per_group)) return false;
      const at::Tensor y = rows_times_weight(cols, ops.w2.view({g.out_channels, L.per_group}), g.groups);
      copy_transposed<T>(dst, y.view({dst.size(0), dst.size(2), g.out_channels}).transpose(1, 2));
      return true;
    };
    if (images > 0) {
      // Images below kMinGemmPixels: one GEMM per group over all the chunk's rows, into a
      // rows-major (pixels, out_channels / groups) buffer copied into the output (2 threads,
      // 16x256x7x7 -> 256 forward 10.5 -> 7.7 ms). Larger ones (one group, NCHW): a GEMM batched
      // over the images straight into the output, MKL's batch GEMM giving each thread whole
      // images, in place of a GEMM per image on both threads (16x32x14x25 -> 64 1x1 forward
      // 1.42x as fast, 8x64x28x28 -> 64 1.01x; docs/deform_conv2d.md).
      at::Tensor rows = P >= kMinGemmPixels ? at::Tensor() : at::empty({images * P, g.out_per_group()}, col.options());
      for (int64_t b0 = 0; b0 < g.batch; b0 += images) {
        const int64_t nb = std::min(images, g.batch - b0);
        ops.stage(b0, nb);
        im2col_images(ops, runs, b0, nb, col.data_ptr<T>());
        const at::Tensor cols = gemm_cols(nb * P);
        if (onednn_into_out(cols, out3.narrow(0, b0, nb))) continue;
        if (P >= kMinGemmPixels) {
          at::Tensor dst = out3.narrow(0, b0, nb);
          at::bmm_out(
              dst, ops.w2[0].expand({nb, g.out_channels, L.per_group}),
              cols.view({nb, P, L.per_group}).transpose(1, 2));
          continue;
        }
        at::Tensor dst = rows.narrow(0, 0, nb * P);
        for (int64_t gc = 0; gc < g.groups; ++gc) {
          at::mm_out(dst, cols.narrow(1, gc * L.per_group, L.per_group), ops.w2[gc].t());
          copy_transposed<T>(
              out3.narrow(0, b0, nb).narrow(1, gc * g.out_per_group(), g.out_per_group()),
              dst.view({nb, P, g.out_per_group()}).transpose(1, 2));
        }
      }
    } else {
      for (int64_t b = 0; b < g.batch; ++b) {
        ops.stage(b, 1);
        const Image<T> im = ops.image(b);
        for (int64_t p0 = 0; p0 < g.out_pixels(); p0 += chunk) {
          const int64_t n = std::min(chunk, g.out_pixels() - p0);
          im2col(im, runs, p0, n, col.data_ptr<T>());
          const at::Tensor cols = gemm_cols(n);
          if (onednn_into_out(cols, out3.narrow(0, b, 1).narrow(2, p0, n))) continue;
          for (int64_t gc = 0; gc < g.groups; ++gc) {
            at::Tensor dst = out3[b].narrow(0, gc * g.out_per_group(), g.out_per_group()).narrow(1, p0, n);
            at::mm_out(dst, ops.w2[gc], cols.narrow(1, gc * L.per_group, L.per_group).t());
          }
        }
      }
    }
  }
  if (bias.has_value()) out_t.add_(bias->to(ct).view({1, g.out_channels, 1, 1}));
  if (!out_t.is_same(out)) out.copy_(out_t);
  return out;
}

at::Tensor deform_conv2d_cpu(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const c10::optional<at::Tensor>& mask) {
  const DeformConv2dGeometry g = check_deform_conv2d_args(input, offset, weight, bias, stride, padding, dilation, mask);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Tensor out = at::empty(
      {g.batch, g.out_channels, g.out_h, g.out_w}, input.options().memory_format(deform_conv2d_output_format(input)));
  if (out.numel() == 0) return out;
  if (input.scalar_type() == at::kDouble) return forward_impl<double>(g, input, offset, weight, bias, mask, out);
  return forward_impl<float>(g, input, offset, weight, bias, mask, out);
}

using BackwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// grad_input accumulated channels-last (col2im's layout) in T. whole: grad_input is that
// accumulator, (batch, H, W, C), zeroed, for the whole batch. Else grad_input is the NCHW result
// in the input's dtype, accumulated a few images at a time (images_per_copy, or a chunk's images):
// at(first, count) zeroes the accumulator for the images from first, after moving the previous
// ones into grad_input, where they are not its current images; flush moves the last ones.
template <typename T>
struct GradInput {
  at::Tensor out, acc;
  bool whole;
  ImageRange held;
  int64_t per_copy, image;
  DeformConv2dGeometry g;

  GradInput(
      const at::Tensor& grad_input, bool whole_, const DeformConv2dGeometry& geo, at::TensorOptions opts, int64_t per)
      : whole(whole_), per_copy(per), image(geo.height * geo.width * geo.in_channels), g(geo) {
    if (!grad_input.defined()) return;
    if (whole) {
      acc = grad_input;
      held.nb = g.batch;
    } else {
      out = grad_input;
      acc = at::empty({per_copy, g.height, g.width, g.in_channels}, opts);
    }
  }

  T* at(int64_t first, int64_t count) {
    if (!acc.defined()) return nullptr;
    const ImageRange last = held;
    if (held.next(first, count, per_copy, g.batch)) {
      flush(last);
      if (acc.size(0) < held.nb) acc = at::empty({held.nb, g.height, g.width, g.in_channels}, acc.options());
      acc.narrow(0, 0, held.nb).zero_();
    }
    return acc.data_ptr<T>() + (first - held.b0) * image;
  }

  void flush(const ImageRange& r) {
    if (!whole && out.defined() && r.nb > 0)
      copy_transposed<T>(out.narrow(0, r.b0, r.nb).flatten(2), acc.narrow(0, 0, r.nb).flatten(1, 2).transpose(1, 2));
  }
  void flush() {
    flush(held);
    held = ImageRange{};
  }
};

template <typename T>
void backward_impl(
    const DeformConv2dGeometry& g, const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset,
    const at::Tensor& weight, const c10::optional<at::Tensor>& mask, std::array<bool, 5> want, at::Tensor& grad_input,
    bool whole_grad_input, at::Tensor& goff_t, at::Tensor& gw_t, at::Tensor& gmask_t) {
  const bool need_gcol = want[0] || want[1] || want[4];
  const ColumnLayout L(g);
  const bool weight_order = gemm_in_weight_order(g, L);
  Operands<T> ops(g, input, offset, weight, mask, need_gcol, weight_order);
  const at::Tensor go = to_nchw<T>(grad_out).view({g.batch, g.out_channels, g.out_pixels()});
  const int64_t P = g.out_pixels();
  // Several small images per chunk as in the forward, with grad_out's chunk copied to
  // (out_channels, pixels) for the GEMMs (16x256x7x7 -> 256: 17.3 -> 15.9 ms); larger images of
  // one group too, where each thread gets two or more, so that grads_by_image takes an image per
  // task (forward + backward, 2 threads: 1.05 to 1.78x as fast at 13 of 15 such layers in every
  // pass, 0.92 to 0.96 at 4x384x25x32 -> 384 1x1 in 3 of 4; with 2 images a chunk, not taken,
  // 0.94 to 1.02; docs/deform_conv2d.md).
  int64_t images = images_per_chunk(g, L, sizeof(T), g.groups == 1);
  if (P >= kMinGemmPixels && images < 2 * at::get_num_threads()) images = 0;
  const int64_t chunk = std::max(column_chunk_pixels(g, L, sizeof(T)), images * P);
  at::Tensor col = at::empty({chunk, L.row}, ops.opts);
  const at::Tensor colw = weight_order ? at::empty_like(col) : col;  // the GEMMs' columns
  const Runs runs = runs_by_offset_group(g);
  // oneDNN's GEMMs (onednn_gemm; the weight gradient from kOnednnWeightGradRows rows) take
  // grad_out's chunk as rows (pixels, out_channels), go_t; BLAS's as go_rows (out_channels,
  // pixels).
  const auto use_onednn = [&](int64_t n) { return onednn_gemm<T>(n, g.out_channels * L.per_group); };
  const auto go_as_rows = [&](int64_t b0, int64_t nb, int64_t p0, int64_t n) {
    at::Tensor t = at::empty({nb * n, g.out_channels}, ops.opts);
    copy_transposed<T>(t.view({nb, n, g.out_channels}), go.narrow(0, b0, nb).narrow(2, p0, n).transpose(1, 2));
    return t;
  };
  // grad_weight (not zero-filled): the first chunk's GEMMs write it, the others add to it.
  const auto accumulate_gw = [&](int64_t n, const at::Tensor& go_rows, const at::Tensor& go_t, bool first) {
    if (weight_order) reorder_columns(col.narrow(0, 0, n), colw.narrow(0, 0, n), g, true);
    const at::Tensor cols = colw.narrow(0, 0, n);
    if (go_t.defined() && n >= kOnednnWeightGradRows) {
      const at::Tensor part = weight_grad_of_rows(go_t, cols, g.groups).view(gw_t.sizes());
      first ? gw_t.copy_(part) : gw_t.add_(part);
      return;
    }
    for (int64_t gc = 0; gc < g.groups; ++gc) {
      const at::Tensor go_g = go_rows.narrow(0, gc * g.out_per_group(), g.out_per_group());
      const at::Tensor cols_g = cols.narrow(1, gc * L.per_group, L.per_group);
      at::Tensor dst = gw_t[gc];
      if (first) {
        at::mm_out(dst, go_g, cols_g);
      } else {
        dst.addmm_(go_g, cols_g);
      }
    }
  };
  // The grad columns (columns' order, in col) of n rows: grad_out's rows x the weight.
  const auto grad_columns = [&](int64_t n, const at::Tensor& go_rows, const at::Tensor& go_t) {
    if (go_t.defined()) {
      colw.narrow(0, 0, n).copy_(rows_times_weight_t(go_t, ops.w2.view({g.out_channels, L.per_group}), g.groups));
    } else {
      for (int64_t gc = 0; gc < g.groups; ++gc) {
        at::Tensor dst = colw.narrow(0, 0, n).narrow(1, gc * L.per_group, L.per_group);
        at::mm_out(dst, go_rows.narrow(0, gc * g.out_per_group(), g.out_per_group()).t(), ops.w2[gc]);
      }
    }
    if (weight_order) reorder_columns(colw.narrow(0, 0, n), col.narrow(0, 0, n), g, false);
  };
  GradInput<T> gxc(want[0] ? grad_input : at::Tensor(), whole_grad_input, g, ops.opts, ops.per_copy);
  if (images > 0) {
    at::Tensor go_rows = at::empty({g.out_channels, images * P}, col.options());  // the chunk's grad_out
    for (int64_t b0 = 0; b0 < g.batch; b0 += images) {
      const int64_t nb = std::min(images, g.batch - b0);
      ops.stage(b0, nb);
      at::Tensor gor = go_rows.narrow(1, 0, nb * P);
      const at::Tensor go_t = use_onednn(nb * P) ? go_as_rows(b0, nb, 0, P) : at::Tensor();
      if (!go_t.defined() || (want[2] && nb * P < kOnednnWeightGradRows)) {
        gor.view({g.out_channels, nb, P}).copy_(go.narrow(0, b0, nb).transpose(0, 1));
      }
      if (want[2]) {
        im2col_images(ops, runs, b0, nb, col.data_ptr<T>());
        accumulate_gw(nb * P, gor, go_t, b0 == 0);
      }
      if (!need_gcol) continue;
      grad_columns(nb * P, gor, go_t);
      T* gx = gxc.at(b0, nb);
      if (!grads_by_image(
              ops, runs, b0, nb, col.const_data_ptr<T>(), gx, want[1] ? goff_t.data_ptr<T>() : nullptr,
              want[4] ? gmask_t.data_ptr<T>() : nullptr)) {
        for (int64_t b = b0; b < b0 + nb; ++b) {
          const Image<T> im = ops.image(b);
          const T* gcol = col.const_data_ptr<T>() + (b - b0) * P * L.row;
          if (gx) col2im(im, 0, P, gcol, gx + (b - b0) * g.height * g.width * g.in_channels);
          if (want[1] || want[4]) {
            coord_grad(
                im, runs, 0, P, gcol, want[1] ? goff_t.data_ptr<T>() + b * g.offset_groups * g.taps() * 2 * P : nullptr,
                want[4] ? gmask_t.data_ptr<T>() + b * g.offset_groups * g.taps() * P : nullptr);
          }
        }
      }
    }
    gxc.flush();
    return;
  }
  // Depthwise: the weight and grad_weight as (taps, C), each chunk's part of grad_weight summed
  // before it is added (a chunk's rows, not the whole batch's, add in sequence per channel).
  at::Tensor wt, gw_tc, gw_part;
  if (L.depthwise && need_gcol) wt = ops.w2.view({g.in_channels, g.taps()}).t().contiguous();
  if (L.depthwise && want[2]) {
    gw_tc = at::empty({g.taps(), g.in_channels}, ops.opts);
    gw_part = at::empty_like(gw_tc);
  }
  for (int64_t b = 0; b < g.batch; ++b) {
    ops.stage(b, 1);
    const Image<T> im = ops.image(b);
    T* gx = gxc.at(b, 1);
    T* goff = want[1] ? goff_t.data_ptr<T>() + b * g.offset_groups * g.taps() * 2 * P : nullptr;
    T* gmask = want[4] ? gmask_t.data_ptr<T>() + b * g.offset_groups * g.taps() * P : nullptr;
    for (int64_t p0 = 0; p0 < P; p0 += chunk) {
      const int64_t n = std::min(chunk, P - p0);
      const bool first = b == 0 && p0 == 0;
      if (L.depthwise) {
        // grad_out's chunk as (n, C), channels contiguous (read in place at NCHW's channel
        // stride, 1x256x32x32's backward took 20.5 ms instead of 14.5).
        at::Tensor go_nc = at::empty({1, n, g.in_channels}, ops.opts);
        copy_transposed<T>(go_nc, go.narrow(0, b, 1).narrow(2, p0, n).transpose(1, 2));
        const T* gop = go_nc.const_data_ptr<T>();
        const T* wtp = need_gcol ? wt.const_data_ptr<T>() : nullptr;
        if (want[2]) gw_part.zero_();
        if (gx || want[2]) depthwise_backward(im, p0, n, gop, wtp, gx, want[2] ? gw_part.data_ptr<T>() : nullptr);
        if (goff || gmask) depthwise_coord_grad(im, p0, n, gop, wtp, goff, gmask);
        if (want[2]) first ? gw_tc.copy_(gw_part) : gw_tc.add_(gw_part);
        continue;
      }
      const at::Tensor go_t = use_onednn(n) ? go_as_rows(b, 1, p0, n) : at::Tensor();
      if (want[2]) {
        im2col(im, runs, p0, n, col.data_ptr<T>());
        accumulate_gw(n, go[b].narrow(1, p0, n), go_t, first);
      }
      if (!need_gcol) continue;
      grad_columns(n, go[b].narrow(1, p0, n), go_t);
      if (gx) col2im(im, p0, n, col.const_data_ptr<T>(), gx);
      if (goff || gmask) coord_grad(im, runs, p0, n, col.const_data_ptr<T>(), goff, gmask);
    }
  }
  if (gw_tc.defined()) gw_t.view({g.in_channels, g.taps()}).copy_(gw_tc.t());
  gxc.flush();
}

BackwardOutputs deform_conv2d_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& mask, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    std::array<bool, 5> output_mask) {
  const DeformConv2dGeometry g =
      check_deform_conv2d_backward_args(grad_out, input, offset, weight, mask, stride, padding, dilation);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::array<bool, 5> want = output_mask;
  want[4] = want[4] && g.has_mask;
  const auto ct = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto opts = input.options().dtype(ct);
  const bool empty = g.batch == 0 || g.out_channels == 0;
  // grad_input: where the batch fits one copy (images_per_copy), a channels-last accumulator in
  // the compute type, converted at the end (GradInput); else the NCHW result in the input's
  // dtype, which backward_impl fills a few images at a time. Compute-type buffers: grad_weight as
  // the GEMMs' (groups, out_channels / groups, kh * kw * in_channels / groups).
  const bool whole = empty || images_per_copy(g, c10::elementSize(ct)) >= g.batch;
  const auto nchw = input.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor grad_input = !want[0] ? at::Tensor()
                          : whole  ? at::zeros({g.batch, g.height, g.width, g.in_channels}, opts)
                                   : at::empty(input.sizes(), nchw);
  at::Tensor goff_t = want[1] ? at::zeros(offset.sizes(), opts) : at::Tensor();
  at::Tensor gmask_t = want[4] ? at::zeros(mask->sizes(), opts) : at::Tensor();
  // grad_weight: written whole by backward_impl's first chunk where there is one.
  const std::vector<int64_t> gw_shape{g.groups, g.out_per_group(), g.taps() * g.in_per_group()};
  at::Tensor gw_t = want[2] ? (empty ? at::zeros(gw_shape, opts) : at::empty(gw_shape, opts)) : at::Tensor();
  const bool any = want[0] || want[1] || want[2] || want[4];
  if (any && !empty) {
    if (ct == at::kDouble) {
      backward_impl<double>(g, grad_out, input, offset, weight, mask, want, grad_input, whole, goff_t, gw_t, gmask_t);
    } else {
      backward_impl<float>(g, grad_out, input, offset, weight, mask, want, grad_input, whole, goff_t, gw_t, gmask_t);
    }
  }
  const auto dt = input.scalar_type();
  const auto none = [&] { return input.new_empty({0}); };  // one fresh tensor per output, never shared
  if (!want[0]) {
    grad_input = none();
  } else if (whole) {
    const at::Tensor nhwc = grad_input.permute({0, 3, 1, 2});  // (batch, C, H, W), channels_last
    grad_input = (ct == at::kDouble ? to_nchw<double>(nhwc) : to_nchw<float>(nhwc)).to(dt);
  }
  at::Tensor grad_offset = want[1] ? goff_t.to(dt) : none();
  at::Tensor grad_weight = none();
  if (want[2] && gemm_in_weight_order(g, ColumnLayout(g))) {
    grad_weight = gw_t.view({g.out_channels, g.in_per_group(), g.kh, g.kw}).to(dt);
  } else if (want[2]) {
    grad_weight = gw_t.view({g.out_channels, g.kh, g.kw, g.in_per_group()}).permute({0, 3, 1, 2}).contiguous().to(dt);
  }
  at::Tensor grad_bias = none();
  if (output_mask[3]) grad_bias = grad_out.to(ct).sum(at::IntArrayRef{0, 2, 3}).to(dt);
  at::Tensor grad_mask = want[4] ? gmask_t.to(dt) : none();
  return {grad_input, grad_offset, grad_weight, grad_bias, grad_mask};
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("deform_conv2d", &deform_conv2d_cpu);
  m.impl("deform_conv2d_backward", &deform_conv2d_backward_cpu);
}

}  // namespace customops
