// deform_conv2d and its backward, CUDA kernels. Formula: deform_conv2d.h.
//
// The kernels read the input channels-last (a copy per chunk of images, by a tiled transpose
// kernel; none for a channels_last input), so that the four neighbours of a sampling point are
// four runs of contiguous channels, read in 16-byte vectors; the column kernel computes each
// sampling point once per block, into shared memory, and fills its columns in whole lines.
// The work goes in chunks of whole images (or runs of one image's pixels) whose buffers
// (columns and GEMM output; in the backward also the channels-last images and grad_input
// accumulator) stay within a budget (chunk_budget, at most kChunkMaxBytes): the extra memory
// of a call is bounded whatever the batch and image size.
//   forward: deform_conv2d_im2col_kernel fills the columns, (pixels, groups, kh * kw,
//     in_channels / groups) in the input's dtype, then cuBLAS multiplies them with the
//     weight: one GEMM over the chunk's rows (batched over the groups: grouped_gemm) into a
//     rows-major (pixels, C_out) buffer that the transpose kernel moves into the NCHW output
//     with the bias; else (see forward_impl) at::bmm over the images or groups straight into
//     the NCHW output, prefilled with the bias as the GEMMs' C operand. float32 follows torch's matmul
//     precision (TF32 where allowed); 16-bit GEMMs accumulate in float32. A channels_last
//     output (deform_conv2d_output_format) with one group is the rows-major result itself.
//     Depthwise (one
//     input and one output channel per group): deform_conv2d_depthwise_tile_kernel computes the
//     output directly, with no columns (deform_conv2d_depthwise_kernel is its fallback).
//     Few output channels per group: deform_conv2d_direct_kernel, an implicit GEMM on CUDA
//     cores, computes the output with no columns, where direct_forward takes it. Grouped IEEE
//     float32 layers of few pixels: the columns GEMM by our split-K kernel (split_k_forward).
//     One image of one group whose GEMM takes the weight in its own order, IEEE float32:
//     weight x columns into the NCHW output, as torchvision multiplies (nn_gemm).
//   backward: per chunk, the columns again and grad_weight += grad_out x columns (GEMM);
//     grad columns = grad_out^T x weight (GEMM) into the same buffer; then
//     deform_conv2d_col2im_kernel, a block per tile of output pixels and 32 channels, adds
//     them into a channels-last float32 (float64) grad_input accumulator with vector atomics,
//     and reduces the dot products of grad_offset and grad_mask over the channels of each
//     sampling point by warp shuffles (partial sums added atomically). Depthwise: the same
//     kernel reads grad_out and the weight instead of grad columns and sums grad_weight
//     itself, with no columns and no GEMM. Atomics make the last bits order-dependent.
// Sampling is computed in opmath (float for 16-bit inputs, double for float64).
// Every launch is on the current stream, after the checks and a device guard, with 64-bit
// indices, and is followed by CUSTOMOPS_CUDA_LAUNCH_CHECK; empty work launches nothing.
#include <ATen/OpMathType.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/addmm_cuda_dispatch.h>
#include <ATen/ops/baddbmm_cuda_dispatch.h>
#include <ATen/ops/bmm_cuda_dispatch.h>
#include <ATen/ops/mm_cuda_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/sum_cuda_dispatch.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "../common/library.h"
#include "deform_conv2d.h"

namespace customops {
namespace {

// Bytes per chunk of the column buffer plus the chunk's channels-last copy of the input and
// its grad_input accumulator. A chunk gets kChunkBudget, and up to kChunkMaxBytes while its
// GEMM's output is short of kGemmFillWaves waves of 128 x 128 tiles on the GPU's SMs: on the
// H200 the chunk GEMMs' TFLOP/s (IEEE float32, TF32 and float16) stopped rising between 4M and
// 8M output values, and with 48 MB chunks alone IEEE float32 forwards ran up to 1.2x slower
// than torchvision's 32-image chunks (docs/deform_conv2d.md).
constexpr int64_t kChunkBudget = 48ll << 20;
constexpr int64_t kChunkMaxBytes = 96ll << 20;
constexpr int64_t kGemmFillWaves = 4;
// The depthwise backward's chunks (no GEMM, so no gain from larger ones once a chunk fills
// the GPU): on the H200 at 8x256x64x64 float16 a 16 MB budget took 34 MB of extra memory and
// the same time as 48 MB (66 MB extra).
constexpr int64_t kDepthwiseChunkBudget = 16ll << 20;

C10_HOST_DEVICE inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The sampling point of output pixel (oy, ox) = p, offset group og and tap (i, j) (ok =
// og * kh * kw + k) of one image, in opmath A: deform_conv2d_tap_at with T -> A conversions.
template <typename T, typename A>
__device__ __forceinline__ BilinearTap<A> sample_at(
    const DeformConv2dGeometry& g, const T* off, const T* msk, int64_t oy, int64_t ox, int64_t p, int64_t i, int64_t j,
    int64_t ok, A* m) {
  const int64_t P = g.out_pixels();
  const A y = static_cast<A>(oy * g.stride_h - g.pad_h + i * g.dil_h) + static_cast<A>(off[(2 * ok) * P + p]);
  const A x = static_cast<A>(ox * g.stride_w - g.pad_w + j * g.dil_w) + static_cast<A>(off[(2 * ok + 1) * P + p]);
  *m = msk ? static_cast<A>(msk[ok * P + p]) : A(1);
  return bilinear_tap<A>(y, x, g.height, g.width);
}

// One chunk: images b0 .. b0 + nb - 1, pixels p0 .. p0 + n - 1 of each (n = out_pixels when
// nb > 1). Row r of the chunk's columns is image b0 + r / n, pixel p0 + r % n.
struct Chunk {
  int64_t b0, nb, p0, n;
  C10_HOST_DEVICE int64_t rows() const {
    return nb * n;
  }
};

// Division by a divisor fixed per launch as a multiply and a shift. The column kernel's integer
// divisions (some 64-bit) were most of its instructions: its float16 64-byte interleaved
// variant went from 1136 to 752 SASS instructions, and the forward at 8x256x64x64 float16 from
// 239 to 212 us on the H200 (docs/deform_conv2d.md).
using Divider = at::cuda::detail::IntDivider<uint32_t>;

// Channels per load or store: V channels per work item move in loads of at most 16 bytes.
template <typename T, int V>
constexpr int sub_vec() {
  return V < 16 / static_cast<int>(sizeof(T)) ? V : 16 / static_cast<int>(sizeof(T));
}

// a[j] = src[j], j < V, in opmath, in loads of sub_vec<T, V> values.
template <typename T, typename A, int V>
__device__ __forceinline__ void load_vec(const T* src, A (&a)[V]) {
  constexpr int S = sub_vec<T, V>();
#pragma unroll
  for (int u = 0; u < V; u += S) {
    const auto val = *reinterpret_cast<const cuda::AlignedVec<T, S>*>(src + u);
#pragma unroll
    for (int j = 0; j < S; ++j) a[u + j] = static_cast<A>(val.v[j]);
  }
}

// One 16-byte store of 16 / sizeof(T) values (dst 16-byte aligned), written in PTX: a plain
// store of a vector built from separately computed values compiles to 4- or 2-byte stores.
template <typename T>
__device__ __forceinline__ void store_16_bytes(T* dst, const T (&v)[16 / sizeof(T)]) {
  uint32_t w[4];
  memcpy(w, v, sizeof(w));
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

template <typename T, typename A, int V>
__device__ __forceinline__ void store_vec(T* dst, const A (&a)[V]) {
  constexpr int S = sub_vec<T, V>();
#pragma unroll
  for (int u = 0; u < V; u += S) {
    T val[S];
#pragma unroll
    for (int j = 0; j < S; ++j) val[j] = static_cast<T>(a[u + j]);
    if constexpr (S * sizeof(T) == 16) {
      store_16_bytes(dst + u, val);
    } else {
      cuda::AlignedVec<T, S> vec;
#pragma unroll
      for (int j = 0; j < S; ++j) vec.v[j] = val[j];
      *reinterpret_cast<cuda::AlignedVec<T, S>*>(dst + u) = vec;
    }
  }
}

// s[j] = bilinear(channel c + j) at tap, from a channels-last image (pixel stride C).
template <typename T, typename A, int V>
__device__ __forceinline__ void gather(const T* img, int64_t C, const BilinearTap<A>& tap, A (&s)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) s[j] = 0;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if (tap.idx[q] >= 0) {
      A val[V];
      load_vec<T, A, V>(img + tap.idx[q] * C, val);
#pragma unroll
      for (int j = 0; j < V; ++j) s[j] += tap.w[q] * val[j];
    }
  }
}

// s[j] = sum over corners q of w[q] * base[src[q] + j], j < V (src[q] < 0: no corner), in opmath:
// a sampling point staged in shared memory, blended from a channels-last image.
template <typename T, typename A, int V>
__device__ __forceinline__ void blend_corners(const T* base, const int64_t (&src)[4], const A (&w)[4], A (&s)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) s[j] = 0;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if (src[q] >= 0) {
      A val[V];
      load_vec<T, A, V>(base + src[q], val);
#pragma unroll
      for (int j = 0; j < V; ++j) s[j] += w[q] * val[j];
    }
  }
}

// The column kernel's blend in packed 16-bit arithmetic (kPackedBlend): the corners' weights
// (float32, the mask folded in) are rounded to T once and the four products summed in T2 by
// fused multiply-adds, two channels per instruction, with no conversions to and from float32.
// float16 only: bfloat16's 8-bit significand, rounded at each of the four FMAs, put an element of
// the conformance suite's grad_weight (2x4x5x6 -> 3, 3x3) 10% from float64 (H200); bfloat16 blends in
// float32 and rounds once.
template <typename T>
struct Packed {
  using T2 = void;
};
template <>
struct Packed<c10::Half> {
  using T2 = __half2;
  static __device__ __forceinline__ T2 splat(float w) {
    return __float2half2_rn(w);
  }
  static __device__ __forceinline__ T2 fma(T2 a, T2 b, T2 c) {
    return __hfma2(a, b, c);
  }
};
template <typename T, int V>
constexpr bool kPackedBlend = !std::is_void<typename Packed<T>::T2>::value && V % 2 == 0;

// dst[j] += v[j], j < V: 16-byte vector atomics where the GPU has them (sm_90 and later).
template <typename A, int V>
__device__ __forceinline__ void atomic_add_vec(A* dst, const A (&v)[V]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kFloat4 = std::is_same<A, float>::value && V % 4 == 0;
  constexpr bool kFloat2 = std::is_same<A, float>::value && V % 2 == 0;
#else
  constexpr bool kFloat4 = false, kFloat2 = false;
#endif
  if constexpr (kFloat4) {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      atomicAdd(reinterpret_cast<float4*>(dst + j), make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]));
    }
  } else if constexpr (kFloat2) {
#pragma unroll
    for (int j = 0; j < V; j += 2) atomicAdd(reinterpret_cast<float2*>(dst + j), make_float2(v[j], v[j + 1]));
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) atomicAdd(dst + j, v[j]);
  }
}

// The columns as units: U channels of one (row, group, tap, u), u < in_per_group / U, where U
// = gcd(in_per_group, in_per_offset_group), so that a unit has one sampling point and its
// columns are U contiguous values at unit * U. A block takes nu consecutive units: first a
// thread per unit computes its sampling point (corner offsets and weights, the mask folded in)
// into shared memory, then the block fills the units' columns S channels (16 bytes) per item,
// adjacent threads on adjacent 16 bytes of a unit, so that every load and store instruction
// touches whole lines of a unit's corners and columns, whatever the offset groups' width, and
// a sampling point is computed once, not once per item (H200, 8x256x64x64 float16: 34 -> 28
// us per chunk of columns, and 73 -> 40 us with 4 offset groups, against the previous kernel
// that computed the point per 64-byte item; docs/deform_conv2d.md). Units of one or two items
// go to the taps kernel instead (unit_taps). With one channel per group (groups_fastest) the
// units go groups fastest instead (unit q: row, tap, group), so that a warp reads adjacent
// channels.
struct UnitLayout {
  DeformConv2dGeometry g;
  Chunk ch;
  Divider subvecs;  // items per unit: U / S
  Divider taps, groups, n, out_w, kw, og_channels;
  // The units u < in_per_group / U of a (row, group, tap) as lane_sets x lanes, and rows side
  // by side in blocks: unit q is (row block, group, tap, lane set, row, lane), so that a warp's
  // offset and mask loads are of a few adjacent pixels' few offset groups, not of one pixel's
  // many, whose planes lie taps * P apart (staged units of one offset group a tap: one row a
  // block, one set: (row, group, tap, u)).
  Divider lanes, block_rows, lane_sets;
  // The taps kernel: a thread takes taps_per_thread consecutive taps of its (row, group, u),
  // the tap slices taking the taps' place in q (launch_im2col).
  Divider slices;
  int taps_per_thread;
  int64_t U, units;  // the chunk's threads, row blocks rounded up: below 2^31 (launch_im2col)
  int nu;            // units per block
  bool groups_fastest;
};

template <typename T, int S>
using UnitWeight = std::conditional_t<kPackedBlend<T, S>, typename Packed<T>::T2, at::opmath_type<T>>;

template <typename T, int S>
constexpr int64_t unit_smem_bytes() {
  return 4 * sizeof(int64_t) + 4 * sizeof(UnitWeight<T, S>) + sizeof(int64_t);
}

// A sampling point's corners as element offsets of their first channels in a channels-last
// image (pixel stride C, the point's channels at c0 of pixels from pixel0; -1: none) and their
// weights with the mask m folded in (splat to pairs for the packed blend).
template <typename T, int S>
__device__ __forceinline__ void unit_corners(
    const BilinearTap<at::opmath_type<T>>& tap, at::opmath_type<T> m, int64_t pixel0, int64_t C, int64_t c0,
    int64_t (&src)[4], UnitWeight<T, S> (&w)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    src[c] = tap.idx[c] < 0 ? -1 : (pixel0 + tap.idx[c]) * C + c0;
    if constexpr (kPackedBlend<T, S>) {
      w[c] = Packed<T>::splat(tap.w[c] * m);
    } else {
      w[c] = tap.w[c] * m;
    }
  }
}

// The sampling point of unit q: the element offsets in xs of its four corners' first channels
// (-1: none) and their weights with the mask folded in; returns the offset of the unit's columns
// (-1: a row past the chunk's, in its last row block).
template <typename T, int S>
__device__ __forceinline__ int64_t
unit_point(const UnitLayout& L, uint32_t q, const T* off, const T* msk, int64_t (&src)[4], UnitWeight<T, S> (&w)[4]) {
  using A = at::opmath_type<T>;
  const DeformConv2dGeometry& g = L.g;
  const int64_t taps = g.taps(), P = g.out_pixels();
  uint32_t r, gi, k, u = 0;
  if (L.groups_fastest) {
    const auto a = L.groups.divmod(q), b = L.taps.divmod(a.div);
    gi = a.mod;
    k = b.mod;
    r = b.div;
  } else {
    const auto a = L.lanes.divmod(q), d = L.block_rows.divmod(a.div), e = L.lane_sets.divmod(d.div),
               b = L.taps.divmod(e.div), c = L.groups.divmod(b.div);
    u = e.mod * L.lanes.divisor + a.mod;
    k = b.mod;
    gi = c.mod;
    r = c.div * L.block_rows.divisor + d.mod;
    if (r >= L.ch.rows()) return -1;
  }
  const uint32_t c0 = gi * static_cast<uint32_t>(g.in_per_group()) + u * static_cast<uint32_t>(L.U);
  const auto rb = L.n.divmod(r);
  const uint32_t p = static_cast<uint32_t>(L.ch.p0) + rb.mod;
  const auto yx = L.out_w.divmod(p), ij = L.kw.divmod(k);
  const int64_t bl = rb.div, b = L.ch.b0 + bl;
  A m;
  const BilinearTap<A> tap = sample_at<T, A>(
      g, off + b * g.offset_groups * taps * 2 * P, msk ? msk + b * g.offset_groups * taps * P : nullptr, yx.div, yx.mod,
      p, ij.div, ij.mod, L.og_channels.div(c0) * taps + k, &m);
  unit_corners<T, S>(tap, m, bl * g.height * g.width, g.in_channels, c0, src, w);
  const int64_t unit = (static_cast<int64_t>(r) * g.groups + gi) * taps + k;
  return L.groups_fastest ? unit : (unit * L.lanes.divisor * L.lane_sets.divisor + u) * L.U;
}

// dst[j] = sum over corners c of w[c] * xs[src[c] + j], j < S: float16 in packed FMAs
// (kPackedBlend), the other types in opmath.
template <typename T, int S>
__device__ __forceinline__ void blend_store(
    const T* __restrict__ xs, const int64_t (&src)[4], const UnitWeight<T, S> (&w)[4], T* __restrict__ dst) {
  if constexpr (kPackedBlend<T, S>) {
    using T2 = typename Packed<T>::T2;
    T2 s[S / 2];
#pragma unroll
    for (int j = 0; j < S / 2; ++j) s[j] = Packed<T>::splat(0.f);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (src[c] < 0) continue;
      // Loaded as 32-bit words: a vector of T2 compiles to 32-bit loads.
      const auto val = *reinterpret_cast<const cuda::AlignedVec<uint32_t, S / 2>*>(xs + src[c]);
#pragma unroll
      for (int j = 0; j < S / 2; ++j) {
        T2 x;
        memcpy(&x, &val.v[j], sizeof(x));
        s[j] = Packed<T>::fma(w[c], x, s[j]);
      }
    }
    cuda::AlignedVec<uint32_t, S / 2> val;
#pragma unroll
    for (int j = 0; j < S / 2; ++j) memcpy(&val.v[j], &s[j], sizeof(val.v[j]));
    *reinterpret_cast<cuda::AlignedVec<uint32_t, S / 2>*>(dst) = val;
  } else {
    using A = at::opmath_type<T>;
    A s[S];
#pragma unroll
    for (int j = 0; j < S; ++j) s[j] = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (src[c] < 0) continue;
      A val[S];
      load_vec<T, A, S>(xs + src[c], val);
#pragma unroll
      for (int j = 0; j < S; ++j) s[j] += w[c] * val[j];
    }
    store_vec<T, A, S>(dst, s);
  }
}

// Taps loaded ahead per batch of a unit's taps: the loads of several sampling points in flight
// per thread, not one.
constexpr int kTapBatch = 4;
// Waves of resident threads that launch_im2col leaves the taps kernel at least.
constexpr int64_t kTapWaves = 4;

// The columns of thread q's unit of kItems items, for its slice of taps: its row, group and u
// decoded once, then the offsets and masks of kTapBatch taps loaded before their corners.
template <typename T, int S, int kItems>
__device__ __forceinline__ void unit_taps(
    const UnitLayout& L, uint32_t q, const T* __restrict__ xs, const T* __restrict__ off, const T* __restrict__ msk,
    T* __restrict__ col) {
  using A = at::opmath_type<T>;
  using W = UnitWeight<T, S>;
  const DeformConv2dGeometry& g = L.g;
  const int64_t taps = g.taps(), P = g.out_pixels();
  const auto a = L.lanes.divmod(q), d = L.block_rows.divmod(a.div), e = L.lane_sets.divmod(d.div),
             sl = L.slices.divmod(e.div), c = L.groups.divmod(sl.div);
  const uint32_t r = c.div * L.block_rows.divisor + d.mod;
  if (r >= L.ch.rows()) return;
  const uint32_t u = e.mod * L.lanes.divisor + a.mod, gi = c.mod;
  const int64_t c0 = gi * g.in_per_group() + u * L.U;
  const auto rb = L.n.divmod(r);
  const int64_t p = L.ch.p0 + rb.mod, b = L.ch.b0 + rb.div;
  const auto yx = L.out_w.divmod(static_cast<uint32_t>(p));
  const int64_t ok0 = (b * g.offset_groups + L.og_channels.div(static_cast<uint32_t>(c0))) * taps;
  const T* ob = off + 2 * ok0 * P + p;
  const T* mb = msk ? msk + ok0 * P + p : nullptr;
  const T* img = xs + rb.div * g.height * g.width * g.in_channels + c0;
  T* dst = col + (static_cast<int64_t>(r) * g.groups + gi) * taps * g.in_per_group() + c0 - gi * g.in_per_group();
  // Integer until the offset is added, as sample_at: one rounding to A, so that the same
  // point is sampled at any padding and dilation.
  const int64_t y_base = yx.div * g.stride_h - g.pad_h, x_base = yx.mod * g.stride_w - g.pad_w;
  const int k_end = static_cast<int>(std::min<int64_t>(taps, (sl.mod + 1) * L.taps_per_thread));
  int k = static_cast<int>(sl.mod) * L.taps_per_thread;
  int i = k / static_cast<int>(g.kw), j = k - i * static_cast<int>(g.kw);
  for (; k < k_end; k += kTapBatch) {
    A y[kTapBatch], x[kTapBatch], m[kTapBatch];
#pragma unroll
    for (int t = 0; t < kTapBatch; ++t) {
      if (k + t >= k_end) break;
      y[t] = static_cast<A>(ob[2 * (k + t) * P]);
      x[t] = static_cast<A>(ob[(2 * (k + t) + 1) * P]);
      m[t] = mb ? static_cast<A>(mb[(k + t) * P]) : A(1);
    }
#pragma unroll
    for (int t = 0; t < kTapBatch; ++t) {
      if (k + t >= k_end) break;
      const BilinearTap<A> tap = bilinear_tap<A>(
          static_cast<A>(y_base + i * g.dil_h) + y[t], static_cast<A>(x_base + j * g.dil_w) + x[t], g.height, g.width);
      int64_t src[4];
      W w[4];
      unit_corners<T, S>(tap, m[t], 0, g.in_channels, 0, src, w);
#pragma unroll
      for (int it = 0; it < kItems; ++it) {
        int64_t at[4];
#pragma unroll
        for (int cn = 0; cn < 4; ++cn) at[cn] = src[cn] < 0 ? -1 : src[cn] + it * S;
        blend_store<T, S>(img, at, w, dst + (k + t) * g.in_per_group() + it * S);
      }
      if (++j == g.kw) {
        j = 0;
        ++i;
      }
    }
  }
}

// Columns of the chunk where a unit is kItems (1 or 2) items: a thread per unit and slice of
// taps (unit_taps), in a kernel of its own, whose registers (64 to 80 on sm_90) leave the
// staged kernel's (about 40) alone.
template <typename T, int S, int kItems>
__global__ void deform_conv2d_im2col_taps_kernel(
    const T* __restrict__ xs, const T* __restrict__ off, const T* __restrict__ msk, UnitLayout L, T* __restrict__ col) {
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < L.units;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    unit_taps<T, S, kItems>(L, static_cast<uint32_t>(q), xs, off, msk, col);
  }
}

// Columns of the chunk: col = mask * bilinear(x, the unit's tap), S channels per item (see
// UnitLayout). xs: the chunk's images, channels-last (NHWC) contiguous.
template <typename T, int S>
__global__ void deform_conv2d_im2col_kernel(
    const T* __restrict__ xs, const T* __restrict__ off, const T* __restrict__ msk, UnitLayout L, T* __restrict__ col) {
  using W = UnitWeight<T, S>;
  if (L.subvecs.divisor == 1) {  // one channel per group: nothing to share, no staging
    for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < L.units;
         q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      int64_t src[4];
      W w[4];
      const int64_t at = unit_point<T, S>(L, static_cast<uint32_t>(q), off, msk, src, w);
      if (at >= 0) blend_store<T, S>(xs, src, w, col + at);
    }
    return;
  }
  extern __shared__ __align__(16) unsigned char unit_smem[];
  int64_t (*src)[4] = reinterpret_cast<int64_t (*)[4]>(unit_smem);
  W(*wts)[4] = reinterpret_cast<W(*)[4]>(unit_smem + L.nu * 4 * sizeof(int64_t));
  int64_t* dst = reinterpret_cast<int64_t*>(unit_smem + L.nu * 4 * (sizeof(int64_t) + sizeof(W)));
  const int64_t blocks = ceil_div(L.units, L.nu);
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int64_t u0 = blk * L.nu;
    const int nu = static_cast<int>(std::min<int64_t>(L.nu, L.units - u0));
    for (int e = threadIdx.x; e < nu; e += blockDim.x) {
      dst[e] = unit_point<T, S>(L, static_cast<uint32_t>(u0 + e), off, msk, src[e], wts[e]);
    }
    __syncthreads();
    const int items = nu * static_cast<int>(L.subvecs.divisor);
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
      const auto us = L.subvecs.divmod(static_cast<uint32_t>(it));
      const int e = static_cast<int>(us.div), sv = static_cast<int>(us.mod) * S;
      if (dst[e] < 0) continue;
      int64_t at[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) at[c] = src[e][c] < 0 ? -1 : src[e][c] + sv;
      blend_store<T, S>(xs, at, wts[e], col + dst[e] + sv);
    }
    __syncthreads();
  }
}

// The backward's partition: a block takes a tile of th x tw output pixels of one image of
// the chunk, all taps, and kSlice channels, kSlice / V threads per (pixel, tap), so that the
// samples of a block's pixels share cache lines. Its grad_input terms are vector atomics
// straight into gx: a shared-memory accumulator per tile is slower on the H200, where a float
// atomicAdd on shared memory is a compare-and-swap loop (docs/deform_conv2d.md).
constexpr int kSlice = 32;
// Threads per block: more (pixel, tap) tasks in flight per tile than 256 (measured faster).
// No launch bound: it changed the kernels' register allocation, and the backward ran 3 to 10%
// slower in the run after it was added. A kernel whose registers do not allow this many threads
// (float64, or another architecture's compilation) runs with as many as it allows.
constexpr int kCol2imThreads = 1024;
// Channels per col2im thread, at most (the kSlice channels of a (pixel, tap) take kSlice / V
// threads).
constexpr int kCol2imMaxV = 4;

struct TileLayout {
  DeformConv2dGeometry g;
  Chunk ch;
  int th, tw, tiles_x, tiles;  // tiles per image of the chunk
  Divider taps, tw_div, kw;
  int64_t oy0;                 // the chunk's first output row
  int width;  // adjacent threads of one (pixel, tap) that share an offset group: a power of two
};

// From the chunk's grad columns (kDepthwise: from grad_out, channels-last, and the weight,
// wt (kh * kw, C)): gx (the chunk's images, channels-last, opmath; nullptr for none) += the
// transpose of the sampling; grad_offset and grad_mask, reduced over the channels of one
// (pixel, tap, offset group) by warp shuffles and added atomically into goff and gmask (the
// shapes of offset and mask, contiguous, opmath); kDepthwise: grad_weight into gw (C, kh * kw).
// kFixedK (depthwise, grad_weight requested): each (pixel, tap) slot keeps one tap for all its
// pixels, so that grad_weight sums in registers and reaches shared memory once per thread, not
// once per task: a float atomicAdd on shared memory is a compare-and-swap loop, and the slots of
// one tap contended for it (launch_col2im says where it is taken; it needs slots >= taps).
template <typename T, int V, bool kDepthwise, bool kFixedK>
__global__ void deform_conv2d_col2im_kernel(
    const T* __restrict__ gcol, const T* __restrict__ wt, const T* __restrict__ xs, const T* __restrict__ off,
    const T* __restrict__ msk, TileLayout L, at::opmath_type<T>* __restrict__ gx, at::opmath_type<T>* __restrict__ goff,
    at::opmath_type<T>* __restrict__ gmask, at::opmath_type<T>* __restrict__ gw) {
  using A = at::opmath_type<T>;
  extern __shared__ unsigned char smem_bytes[];
  A* gws = reinterpret_cast<A*>(smem_bytes);  // kDepthwise: grad_weight of the block, (taps, kSlice)
  const DeformConv2dGeometry& g = L.g;
  const int64_t C = g.in_channels, H = g.height, W = g.width, P = g.out_pixels();
  const int taps = static_cast<int>(g.taps());
  constexpr int kLanes = kSlice / V;
  const int lane = threadIdx.x % kLanes, slot = threadIdx.x / kLanes, slots = blockDim.x / kLanes;
  const int tile = blockIdx.x % L.tiles;
  const int64_t bl = blockIdx.x / L.tiles, b = L.ch.b0 + bl;
  const int64_t ty0 = L.oy0 + (tile / L.tiles_x) * L.th, tx0 = (tile % L.tiles_x) * L.tw;
  const int cl = lane * V;  // the thread's first channel in the slice
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kSlice + cl;
  const bool has_c = c < C;
  const int gw_size = kDepthwise && gw ? taps * kSlice : 0;
  for (int e = threadIdx.x; e < gw_size; e += blockDim.x) gws[e] = A(0);
  if (gw_size > 0) __syncthreads();
  const bool coords = goff != nullptr || gmask != nullptr;
  const T* img = xs + bl * H * W * C + c;
  A* gxi = gx ? gx + bl * H * W * C + c : nullptr;
  const T* ob = off + b * g.offset_groups * taps * 2 * P;
  const T* mb = msk ? msk + b * g.offset_groups * taps * P : nullptr;
  const int64_t og = c / g.in_per_offset_group(), gi = c / g.in_per_group(), cc = c - gi * g.in_per_group();
  const int pixels = L.th * L.tw, tasks = pixels * taps;
  // kFixedK: slot s takes tap s % taps of pixels s / taps + i * step; else task base + slot.
  const int step = kFixedK ? slots / taps : slots, total = kFixedK ? pixels : tasks;
  if constexpr (kFixedK) {
    if (step == 0) __trap();  // the launcher rules it out; else the loop below would not end
  }
  A gwr[V];
#pragma unroll
  for (int j = 0; j < V; ++j) gwr[j] = 0;
  // The loop runs while any task of the block is left, so every lane reaches the shuffles.
  for (int base = 0; base < total; base += step) {
    int k, pix;
    bool in_range;
    if constexpr (kFixedK) {
      k = slot % taps;
      pix = base + slot / taps;
      in_range = slot < step * taps && pix < pixels;
    } else {
      const int t = base + slot;
      const auto kp = L.taps.divmod(static_cast<uint32_t>(t));
      k = static_cast<int>(kp.mod);
      pix = static_cast<int>(kp.div);
      in_range = t < tasks;
    }
    const auto yx = L.tw_div.divmod(static_cast<uint32_t>(pix));
    const int64_t oy = ty0 + yx.div, ox = tx0 + yx.mod, p = oy * g.out_w + ox;
    const bool valid = in_range && has_c && oy < g.out_h && ox < g.out_w && p >= L.ch.p0 && p < L.ch.p0 + L.ch.n;
    A gy = 0, gxv = 0, gm = 0;
    if (valid) {
      const auto ij = L.kw.divmod(static_cast<uint32_t>(k));
      A m;
      const BilinearTap<A> tap = sample_at<T, A>(g, ob, mb, oy, ox, p, ij.div, ij.mod, og * taps + k, &m);
      if (tap.inside) {
        A gv[V], go[V];
        if constexpr (kDepthwise) {
          A w[V];
          load_vec<T, A, V>(gcol + (bl * P + p) * C + c, go);
          load_vec<T, A, V>(wt + static_cast<int64_t>(k) * C + c, w);
#pragma unroll
          for (int j = 0; j < V; ++j) gv[j] = go[j] * w[j];
        } else {
          const int64_t r = bl * L.ch.n + (p - L.ch.p0);
          load_vec<T, A, V>(gcol + ((r * g.groups + gi) * taps + k) * g.in_per_group() + cc, gv);
        }
        if (gx) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (tap.idx[q] < 0) continue;
            A add[V];
#pragma unroll
            for (int j = 0; j < V; ++j) add[j] = tap.w[q] * m * gv[j];
            atomic_add_vec<A, V>(gxi + tap.idx[q] * C, add);
          }
        }
        if (coords || gw_size > 0) {
          A d[4] = {0, 0, 0, 0}, s[V];
#pragma unroll
          for (int j = 0; j < V; ++j) s[j] = 0;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (tap.idx[q] < 0) continue;
            A val[V];
            load_vec<T, A, V>(img + tap.idx[q] * C, val);
#pragma unroll
            for (int j = 0; j < V; ++j) {
              d[q] += gv[j] * val[j];
              s[j] += tap.w[q] * val[j];
            }
          }
          if (coords) bilinear_tap_grads(tap, d, m, &gy, &gxv, &gm);
          if constexpr (kDepthwise) {
            if constexpr (kFixedK) {
#pragma unroll
              for (int j = 0; j < V; ++j) gwr[j] += go[j] * m * s[j];
            } else if (gw_size > 0) {
#pragma unroll
              for (int j = 0; j < V; ++j) atomicAdd(gws + k * kSlice + cl + j, go[j] * m * s[j]);
            }
          }
        }
      }
    }
    if (!coords) continue;
    for (int sh = L.width / 2; sh > 0; sh /= 2) {
      gy += __shfl_xor_sync(0xffffffffu, gy, sh);
      gxv += __shfl_xor_sync(0xffffffffu, gxv, sh);
      gm += __shfl_xor_sync(0xffffffffu, gm, sh);
    }
    if (valid && lane % L.width == 0 && (gy != A(0) || gxv != A(0) || gm != A(0))) {
      const int64_t ok = og * taps + k;
      if (goff) {
        A* gob = goff + b * g.offset_groups * taps * 2 * P;
        atomicAdd(gob + (2 * ok) * P + p, gy);
        atomicAdd(gob + (2 * ok + 1) * P + p, gxv);
      }
      if (gmask) atomicAdd(gmask + b * g.offset_groups * taps * P + ok * P + p, gm);
    }
  }
  if (gw_size == 0) return;
  if (kFixedK && has_c && slot < step * taps) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (gwr[j] != A(0)) atomicAdd(gws + (slot % taps) * kSlice + cl + j, gwr[j]);
    }
  }
  __syncthreads();
  for (int k = slot; has_c && k < taps; k += slots) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A v = gws[k * kSlice + cl + j];
      if (v != A(0)) atomicAdd(gw + (c + j) * taps + k, v);
    }
  }
}

// Depthwise (groups = in_channels = out_channels): out[b, c, p] = bias[c] + sum over taps k
// of weight[c, k] * mask * bilinear(x[b, c], tap k), with no columns. V channels of one
// offset group per thread, channels fastest (xs channels-last, wt (kh * kw, C)). The fallback of
// the tiled kernel below, which beat it at every depthwise layer timed (1.05 to 3.1x, H200:
// benchmarks/results/deform_conv2d_ab_depthwise_tiles_NVIDIA_H200_2026-12-04.md).
template <typename T, int V>
__global__ void deform_conv2d_depthwise_kernel(
    const T* __restrict__ xs, const T* __restrict__ off, const T* __restrict__ msk, const T* __restrict__ wt,
    const T* __restrict__ bias, DeformConv2dGeometry g, bool nhwc, T* __restrict__ out) {
  using A = at::opmath_type<T>;
  const int64_t C = g.in_channels, taps = g.taps(), P = g.out_pixels(), plane = g.height * g.width;
  const int64_t vecs = C / V, total = g.batch * P * vecs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = (idx % vecs) * V;
    const int64_t t = idx / vecs;
    const int64_t p = t % P, b = t / P;
    const int64_t og = c / g.in_per_offset_group();
    const int64_t oy = p / g.out_w, ox = p - oy * g.out_w;
    const T* ob = off + b * g.offset_groups * taps * 2 * P;
    const T* mb = msk ? msk + b * g.offset_groups * taps * P : nullptr;
    const T* img = xs + b * plane * C + c;
    A acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0;
    for (int64_t k = 0; k < taps; ++k) {
      const int64_t i = k / g.kw;
      A m;
      const BilinearTap<A> tap = sample_at<T, A>(g, ob, mb, oy, ox, p, i, k - i * g.kw, og * taps + k, &m);
      A s[V];
      gather<T, A, V>(img, C, tap, s);
      A w[V];
      load_vec<T, A, V>(wt + k * C + c, w);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += w[j] * (m * s[j]);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A bv = bias ? static_cast<A>(bias[c + j]) : A(0);
      out[nhwc ? (b * P + p) * C + c + j : (b * C + c + j) * P + p] = static_cast<T>(acc[j] + bv);
    }
  }
}

// Depthwise, tiled. A block takes tp consecutive output pixels of the launch's images (flattened
// image * P + pixel) and a slice of lanes * V channels: lanes threads per pixel on adjacent V
// channels, so that a warp's corner loads are whole lines. The sampling points of a stage of taps
// (offset groups of the slice included) are computed once per block into shared memory, not once
// per thread; an NCHW output tile goes through shared memory so that its stores run along the
// pixels (a channels_last one is stored from registers). Same arithmetic, in the same order, as
// the direct kernel.
// Sampling points per stage (taps are staged in batches of at most this many points per block).
constexpr int kDepthwisePointsPerStage = 512;

template <typename A>
struct DepthwisePoint {
  int64_t src[4];  // element offsets in xs of the corners' channel 0 (-1: none)
  A w[4], m;
};

struct DepthwiseTileLayout {
  DeformConv2dGeometry g;
  int64_t b0;           // the launch's first image
  uint32_t pixels;      // output pixels of the launch's images (below 2^31)
  int lanes, tp, kb;    // threads per pixel, pixels per block, taps per stage
  Divider P, out_w, kw;
  bool nhwc;            // a channels_last output
};

template <typename T, int V>
__global__ void deform_conv2d_depthwise_tile_kernel(
    const T* __restrict__ xs, const T* __restrict__ off, const T* __restrict__ msk, const T* __restrict__ wt,
    const T* __restrict__ bias, DepthwiseTileLayout L, T* __restrict__ out) {
  using A = at::opmath_type<T>;
  extern __shared__ __align__(16) unsigned char dw_smem[];
  auto* pts = reinterpret_cast<DepthwisePoint<A>*>(dw_smem);
  const DeformConv2dGeometry& g = L.g;
  const int64_t C = g.in_channels, taps = g.taps(), P = g.out_pixels(), plane = g.height * g.width;
  const int64_t Cog = g.in_per_offset_group();
  const int cs = L.lanes * V;  // channels of the slice
  const int lane = threadIdx.x % L.lanes, slot = threadIdx.x / L.lanes;
  const uint32_t t0 = blockIdx.x * static_cast<uint32_t>(L.tp);
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * cs, c = c0 + lane * V;
  const bool has_c = c < C;
  const int64_t og_lo = c0 / Cog;
  const int nog =
      static_cast<int>(std::min<int64_t>(g.offset_groups, (std::min<int64_t>(C, c0 + cs) - 1) / Cog + 1) - og_lo);
  const int ogi = has_c ? static_cast<int>(c / Cog - og_lo) : 0;
  A acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0;
  for (int k0 = 0; k0 < taps; k0 += L.kb) {
    const int kn = static_cast<int>(std::min<int64_t>(L.kb, taps - k0));
    const int points = L.tp * kn * nog;
    if (k0 > 0) __syncthreads();  // the previous stage's points are read
    // Pixels fastest: adjacent threads read adjacent offsets.
    for (int e = threadIdx.x; e < points; e += blockDim.x) {
      const int i = e % L.tp, kk = (e / L.tp) % kn, oi = e / (L.tp * kn);
      const uint32_t t = t0 + i;
      DepthwisePoint<A> pt;
      if (t < L.pixels) {
        const auto bp = L.P.divmod(t);
        const int64_t b = L.b0 + bp.div, p = bp.mod, k = k0 + kk, og = og_lo + oi;
        const auto yx = L.out_w.divmod(bp.mod), ij = L.kw.divmod(static_cast<uint32_t>(k));
        const BilinearTap<A> tap = sample_at<T, A>(
            g, off + b * g.offset_groups * taps * 2 * P, msk ? msk + b * g.offset_groups * taps * P : nullptr, yx.div,
            yx.mod, p, ij.div, ij.mod, og * taps + k, &pt.m);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          pt.src[q] = tap.idx[q] < 0 ? -1 : (b * plane + tap.idx[q]) * C;
          pt.w[q] = tap.w[q];
        }
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          pt.src[q] = -1;
          pt.w[q] = 0;
        }
        pt.m = 0;
      }
      pts[(oi * kn + kk) * L.tp + i] = pt;
    }
    __syncthreads();
    if (!has_c) continue;
    for (int kk = 0; kk < kn; ++kk) {
      A wv[V];
      load_vec<T, A, V>(wt + (k0 + kk) * C + c, wv);
      const DepthwisePoint<A>& pt = pts[(ogi * kn + kk) * L.tp + slot];
      A s[V];
      blend_corners<T, A, V>(xs + c, pt.src, pt.w, s);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += wv[j] * (pt.m * s[j]);
    }
  }
  if (L.nhwc) {
    const uint32_t t = t0 + slot;
    if (!has_c || t >= L.pixels) return;
    A v[V];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = acc[j] + (bias ? static_cast<A>(bias[c + j]) : A(0));
    store_vec<T, A, V>(out + (static_cast<int64_t>(L.b0) * P + t) * C + c, v);
    return;
  }
  // The output tile, (tp, cs + pad) values of T, over the points: rows of an odd number of
  // 32-bit words, so that the stores' reads along the pixels fall in different banks.
  __syncthreads();
  const int ld = cs + (sizeof(T) >= 4 ? 1 : 4 / static_cast<int>(sizeof(T)));
  T* tile = reinterpret_cast<T*>(dw_smem);
  if (has_c) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A bv = bias ? static_cast<A>(bias[c + j]) : A(0);
      tile[slot * ld + lane * V + j] = static_cast<T>(acc[j] + bv);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < cs * L.tp; e += blockDim.x) {
    const int i = e % L.tp, cl = e / L.tp;
    const uint32_t t = t0 + i;
    if (t >= L.pixels || c0 + cl >= C) continue;
    const auto bp = L.P.divmod(t);
    out[((L.b0 + bp.div) * C + c0 + cl) * P + bp.mod] = tile[i * ld + cl];
  }
}

// Narrow groups: the forward as an implicit GEMM on CUDA cores, with no columns, no GEMM call
// and no transposes. A block takes kDirectPixels output pixels of the launch's images (flattened
// image * P + pixel) and 8 * RN output channels: of one group, or all those of L.gb adjacent groups
// whose input channels fit one stage (direct_tiling). Per stage, a tap and a slice of at most kc
// channels of one offset group: the pixels' sampling points (shared memory, computed once per tap
// and offset group), their blended samples in opmath (kc x kDirectPixels, adjacent threads on
// adjacent 16-byte runs of one pixel's channels), and the weight's slice beside them; then each
// thread adds the products of 4 pixels and RN output channels of one group in registers. Where a
// group's output channels are few, the columns' round trip through memory and cuBLAS's narrow
// tiles cost more than the arithmetic (direct_forward says where).
constexpr int kDirectPixels = 128;
constexpr int kDirectSlots = 8;  // warps: output-channel slots of RN channels each
constexpr int kDirectThreads = 32 * kDirectSlots;

template <typename A>
constexpr int direct_slice() {  // channels per stage: 16.5 KB of samples in float32 and float64
  return sizeof(A) == 8 ? 16 : 32;
}

template <typename A>
struct DirectPoint {
  int64_t src[4];  // element offsets in xs of the corners' channel 0 (-1: none)
  A w[4];          // the corners' weights, the mask folded in
};

struct DirectLayout {
  DeformConv2dGeometry g;
  int64_t b0;       // the launch's first image
  int64_t x0;       // the first image in xs
  uint32_t pixels;  // output pixels of the launch's images (below 2^31)
  int gb;           // groups per block (several: one stage of all their channels per tap)
  int tiles_n;      // blocks per gb groups along their output channels: grid.y = groups / gb * tiles_n
  Divider P, out_w, kw;
  bool nhwc;  // a channels_last output
};

template <typename T, int RN, int V, int kMinBlocks>
__global__ void __launch_bounds__(kDirectThreads, kMinBlocks) deform_conv2d_direct_kernel(
    const T* __restrict__ xs, const T* __restrict__ off, const T* __restrict__ msk, const T* __restrict__ w,
    const T* __restrict__ bias, DirectLayout L, T* __restrict__ out) {
  using A = at::opmath_type<T>;
  constexpr int KC = direct_slice<A>(), TP = kDirectPixels, TN = kDirectSlots * RN;
  __shared__ DirectPoint<A> pts[TP];
  __shared__ A smp[KC][TP + 1];  // samples, channel-major: rows of an odd number of words
  __shared__ __align__(16) A wsm[KC][TN];
  const DeformConv2dGeometry& g = L.g;
  const int64_t C = g.in_channels, Cg = g.in_per_group(), Cog = g.in_per_offset_group(), Ng = g.out_per_group();
  const int64_t taps = g.taps(), P = g.out_pixels(), plane = g.height * g.width;
  const int64_t gi = static_cast<int64_t>(blockIdx.y / L.tiles_n) * L.gb;  // the block's first group
  const int64_t n0 = static_cast<int64_t>(blockIdx.y % L.tiles_n) * TN;
  const uint32_t t0 = blockIdx.x * static_cast<uint32_t>(TP);
  const int px = threadIdx.x % 32, slot = threadIdx.x / 32;
  const T* wg = w + gi * taps * Cg * Ng;  // the groups' weights, (gb, taps, Cg, Ng)
  // The stage's channels this thread's outputs read: those of its group (RN divides Ng where gb > 1).
  const int gl = L.gb > 1 ? slot * RN / static_cast<int>(Ng) : 0;
  A acc[4][RN];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int j = 0; j < RN; ++j) acc[q][j] = 0;
  }
  int64_t point_og = -1;
  for (int64_t k = 0; k < taps; ++k) {
    point_og = -1;
    for (int64_t c0 = 0; c0 < Cg * L.gb;) {
      const int64_t cin = gi * Cg + c0, og = cin / Cog;
      const int kc = static_cast<int>(std::min<int64_t>({KC, Cg * L.gb - c0, (og + 1) * Cog - cin}));
      __syncthreads();  // the previous stage's shared memory is read
      if (og != point_og) {
        point_og = og;
        if (threadIdx.x < TP) {
          const uint32_t t = t0 + threadIdx.x;
          DirectPoint<A> pt;
          if (t < L.pixels) {
            const auto bp = L.P.divmod(t);
            const int64_t b = L.b0 + bp.div;
            const auto yx = L.out_w.divmod(bp.mod), ij = L.kw.divmod(static_cast<uint32_t>(k));
            A m;
            const BilinearTap<A> tap = sample_at<T, A>(
                g, off + b * g.offset_groups * taps * 2 * P, msk ? msk + b * g.offset_groups * taps * P : nullptr,
                yx.div, yx.mod, bp.mod, ij.div, ij.mod, og * taps + k, &m);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              pt.src[q] = tap.idx[q] < 0 ? -1 : ((b - L.x0) * plane + tap.idx[q]) * C;
              pt.w[q] = tap.w[q] * m;
            }
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              pt.src[q] = -1;
              pt.w[q] = 0;
            }
          }
          pts[threadIdx.x] = pt;
        }
        __syncthreads();
      }
      const int vecs = kc / V;
      for (int e = threadIdx.x; e < TP * vecs; e += kDirectThreads) {
        const int i = e / vecs, cv = (e - i * vecs) * V;
        const DirectPoint<A>& pt = pts[i];
        A s[V];
        blend_corners<T, A, V>(xs + cin + cv, pt.src, pt.w, s);
#pragma unroll
        for (int j = 0; j < V; ++j) smp[cv + j][i] = s[j];
      }
      if (L.gb == 1) {
        for (int e = threadIdx.x; e < TN * kc; e += kDirectThreads) {  // output channels fastest
          const int c = e / TN, n = e - c * TN;
          wsm[c][n] = n0 + n < Ng ? static_cast<A>(wg[(k * Cg + c0 + c) * Ng + n0 + n]) : A(0);
        }
      } else {  // (c0 = 0, kc = gb * Cg) each group's block of the diagonal: the rest is not read
        const int cg = static_cast<int>(Cg), ng = static_cast<int>(Ng);
        for (int e = threadIdx.x; e < kc * ng; e += kDirectThreads) {
          const int c = e / ng, m = e - c * ng, h = c / cg;
          wsm[c][h * ng + m] = static_cast<A>(wg[((h * taps + k) * Cg + c - h * cg) * Ng + m]);
        }
      }
      __syncthreads();
      const int c_lo = L.gb > 1 ? gl * static_cast<int>(Cg) : 0;
      const int c_n = L.gb > 1 ? static_cast<int>(Cg) : kc;
#pragma unroll 4
      for (int c = c_lo; c < c_lo + c_n; ++c) {
        A a[4], b[RN];
#pragma unroll
        for (int q = 0; q < 4; ++q) a[q] = smp[c][px + 32 * q];
#pragma unroll
        for (int j = 0; j < RN; ++j) b[j] = wsm[c][slot * RN + j];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
#pragma unroll
          for (int j = 0; j < RN; ++j) acc[q][j] += a[q] * b[j];
        }
      }
      c0 += kc;
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t t = t0 + px + 32 * q;
    if (t >= L.pixels) continue;
    const auto bp = L.P.divmod(t);
    const int64_t b = L.b0 + bp.div, p = bp.mod;
#pragma unroll
    for (int j = 0; j < RN; ++j) {
      const int64_t n = n0 + slot * RN + j;
      if (n >= Ng * L.gb) break;
      const int64_t co = gi * Ng + n;
      const A v = acc[q][j] + (bias ? static_cast<A>(bias[co]) : A(0));
      out[L.nhwc ? (b * P + p) * g.out_channels + co : (b * g.out_channels + co) * P + p] = static_cast<T>(v);
    }
  }
}

// Launches kernel (named name in errors and in the failed-launch test hook) over total work
// items on the current stream; none for no work.
#define DEFORM_CONV2D_LAUNCH(name, kernel, total, ...)                                                             \
  do {                                                                                                             \
    if ((total) > 0) {                                                                                             \
      kernel<<<cuda::grid_for(total), cuda::block_size(name), 0, at::cuda::getCurrentCUDAStream()>>>(__VA_ARGS__); \
      CUSTOMOPS_CUDA_LAUNCH_CHECK(name);                                                                           \
    }                                                                                                              \
  } while (0)

// dst[b][c][r] = src[b][r][c] (+ bias[c]), converted to To: NCHW <-> NHWC copies through
// shared-memory tiles, so that both sides are read and written in whole rows (torch's copy into
// a channels-last tensor walks one side with a stride). A block per tile: grid x the more
// numerous of the row and column tiles (up to 2^31), y the others, z the batch (grid-strided);
// tile indices in 32 bits, element offsets in 64.
// kVec: 64 x 64 tiles moved in 16-byte vectors, loads along the source's rows and stores along
// the destination's, where the strides, pointers and sizes allow (transpose_into); else 32 x 32
// tiles of single values.
constexpr int kTile = 32, kVecTile = 64;

struct TransposeShape {
  int64_t batch, rows, cols;
  int64_t src_ld, src_batch;  // src[b][r][c] at b * src_batch + r * src_ld + c
  int64_t dst_ld, dst_batch;  // dst[b][c][r] at b * dst_batch + c * dst_ld + r
  bool rows_in_x;             // grid x walks the row tiles (else the column tiles); transpose_into sets it
};

template <typename Ti, typename To, bool kVec>
__global__ void deform_conv2d_transpose_kernel(
    const Ti* __restrict__ src, To* __restrict__ dst, const To* __restrict__ bias, TransposeShape s) {
  using S = at::opmath_type<Ti>;
  constexpr int kT = kVec ? kVecTile : kTile;
  const int64_t r0 = static_cast<int64_t>(s.rows_in_x ? blockIdx.x : blockIdx.y) * kT;
  const int64_t c0 = static_cast<int64_t>(s.rows_in_x ? blockIdx.y : blockIdx.x) * kT;
  const int nr = static_cast<int>(std::min<int64_t>(kT, s.rows - r0));
  const int nc = static_cast<int>(std::min<int64_t>(kT, s.cols - c0));
  if constexpr (kVec) {
    // Ei values per load, Eo per store. A store reads Eo rows of one column of the tile: the
    // tile's vectors are XOR-swizzled by the row's store group (row / Eo), so that the lanes of a
    // warp, on Eo-row groups of one column, read different banks.
    constexpr int Ei = 16 / sizeof(Ti), Eo = 16 / sizeof(To), kVi = kT / Ei, kVo = kT / Eo;
    __shared__ Ti tile[kT][kT];
    const auto at = [](int row, int col) { return ((col / Ei) ^ ((row / Eo) % kVi)) * Ei + col % Ei; };
    for (int64_t b = blockIdx.z; b < s.batch; b += gridDim.z) {
      const Ti* sb = src + b * s.src_batch + r0 * s.src_ld + c0;
      To* db = dst + b * s.dst_batch + c0 * s.dst_ld + r0;
      for (int e = threadIdx.x; e < kT * kVi; e += blockDim.x) {
        const int i = e / kVi, u = e % kVi;
        if (i < nr && u * Ei < nc) {
          using V = cuda::AlignedVec<Ti, Ei>;
          *reinterpret_cast<V*>(&tile[i][at(i, u * Ei)]) = *reinterpret_cast<const V*>(sb + i * s.src_ld + u * Ei);
        }
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kT * kVo; e += blockDim.x) {
        const int i = e / kVo, v = e % kVo;  // lanes along a destination row: whole lines
        if (i < nc && v * Eo < nr) {
          const S bv = bias ? static_cast<S>(bias[c0 + i]) : S(0);
          To val[Eo];
#pragma unroll
          for (int q = 0; q < Eo; ++q)
            val[q] = static_cast<To>(static_cast<S>(tile[v * Eo + q][at(v * Eo + q, i)]) + bv);
          store_16_bytes(db + i * s.dst_ld + v * Eo, val);
        }
      }
      __syncthreads();
    }
  } else {
    __shared__ S tile[kT][kT + 1];
    const int tx = threadIdx.x % kT;
    for (int64_t b = blockIdx.z; b < s.batch; b += gridDim.z) {
      const Ti* sb = src + b * s.src_batch + r0 * s.src_ld + c0;
      To* db = dst + b * s.dst_batch + c0 * s.dst_ld + r0;
      for (int i = threadIdx.x / kT; i < nr; i += blockDim.x / kT) {
        if (tx < nc) tile[i][tx] = static_cast<S>(sb[i * s.src_ld + tx]);
      }
      __syncthreads();
      for (int i = threadIdx.x / kT; i < nc; i += blockDim.x / kT) {
        const S bv = bias ? static_cast<S>(bias[c0 + i]) : S(0);
        if (tx < nr) db[i * s.dst_ld + tx] = static_cast<To>(tile[tx][i] + bv);
      }
      __syncthreads();
    }
  }
}

// The same copy for small matrices (both sides under kTile, e.g. a grouped layer's columns of
// few channels per group) and 16-bit thin ones (transpose_into), an element per thread along the
// destination's rows.
template <typename Ti, typename To>
__global__ void deform_conv2d_small_transpose_kernel(
    const Ti* __restrict__ src, To* __restrict__ dst, const To* __restrict__ bias, TransposeShape s, Divider rows,
    Divider cols, uint32_t total) {
  using S = at::opmath_type<Ti>;
  for (uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
    const auto a = rows.divmod(idx), b = cols.divmod(a.div);
    const int64_t r = a.mod, c = b.mod, n = b.div;
    const S v = static_cast<S>(src[n * s.src_batch + r * s.src_ld + c]) + (bias ? static_cast<S>(bias[c]) : S(0));
    dst[n * s.dst_batch + c * s.dst_ld + r] = static_cast<To>(v);
  }
}

// Elements of a thin transpose's tile, at most: the whole thin side by this many / its length.
constexpr int kThinTileElems = 4096;

// The same copy for thin matrices (one side under kTile, e.g. the weight's kh * kw taps): a block
// per tile of tr rows by tc columns, the whole of the thin side, through shared memory, so that
// loads run along the source's rows and stores along the destination's, each in runs as long as
// the tile's (an element per thread read the thin side's rows a stride apart: the 384 x 768 x 5 x 5
// float32 weight's reorder took 49 us, 20% of a forward, H100,
// deform_conv2d_sweep_losses_profile_NVIDIA_H100_2026-12-06_seeds4_5.txt). The tile's row stride
// is odd, so that a warp reading down a column hits distinct banks. Tile indices and element
// offsets in 64 bits.
template <typename Ti, typename To>
__global__ void deform_conv2d_thin_transpose_kernel(
    const Ti* __restrict__ src, To* __restrict__ dst, const To* __restrict__ bias, TransposeShape s, int tr, int tc,
    int64_t row_tiles, int64_t col_tiles) {
  using S = at::opmath_type<Ti>;
  constexpr int kPer = kThinTileElems / cuda::kThreads;  // loads a thread (launched with kThreads)
  extern __shared__ __align__(16) unsigned char thin_smem[];
  S* tile = reinterpret_cast<S*>(thin_smem);
  const int ld = tc | 1;
  const int64_t per_batch = row_tiles * col_tiles, tiles = s.batch * per_batch;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t n = t / per_batch, rc = t - n * per_batch, r0 = rc / col_tiles * tr, c0 = rc % col_tiles * tc;
    const int nr = static_cast<int>(std::min<int64_t>(tr, s.rows - r0));
    const int nc = static_cast<int>(std::min<int64_t>(tc, s.cols - c0));
    const Ti* sb = src + n * s.src_batch + r0 * s.src_ld + c0;
    To* db = dst + n * s.dst_batch + c0 * s.dst_ld + r0;
    // (i, j) of element e = i * nc + j, stepped by the block without a division per element; a
    // thread's loads all issued before their stores to the tile.
    const int di = cuda::kThreads / nc, dj = cuda::kThreads % nc, i0 = threadIdx.x / nc, j0 = threadIdx.x % nc;
    S v[kPer];
    int i = i0, j = j0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (i < nr) v[k] = static_cast<S>(sb[i * s.src_ld + j]);
      i += di + (j + dj >= nc);
      j += dj - (j + dj >= nc ? nc : 0);
    }
    i = i0;
    j = j0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (i < nr) tile[i * ld + j] = v[k];
      i += di + (j + dj >= nc);
      j += dj - (j + dj >= nc ? nc : 0);
    }
    __syncthreads();
    // (j, i) of element e = j * nr + i: along the destination's rows.
    const int si = cuda::kThreads % nr, sj = cuda::kThreads / nr;
    i = threadIdx.x % nr;
    j = threadIdx.x / nr;
    for (; j < nc; j += sj + (i + si >= nr), i += si - (i + si >= nr ? nr : 0)) {
      const S val = tile[i * ld + j] + (bias ? static_cast<S>(bias[c0 + j]) : S(0));
      db[j * s.dst_ld + i] = static_cast<To>(val);
    }
    __syncthreads();
  }
}

// See deform_conv2d_transpose_kernel; bias: nullptr for none.
template <typename Ti, typename To>
void transpose_into(const Ti* src, To* dst, TransposeShape s, const To* bias = nullptr) {
  if (s.batch == 0 || s.rows == 0 || s.cols == 0) return;
  const int64_t total = s.batch * s.rows * s.cols;
  // 32-bit grid-stride indices: below 2^31 items, so that an index plus the grid's stride cannot wrap.
  // 16-bit thin matrices too go an element per thread: in tiles, the 384 x 768 x 25 float16
  // weight's reorder took 24 us more, and the grid's float16 and bfloat16 forwards 1-2% longer
  // (the kernel's 16-bit builds hold 72 registers to float32's 40), where float32's gained 22 us
  // of 248 and 0.5% either way at the grid (deform_conv2d_ab_thin_transpose_NVIDIA_H100_2026-12-07.md).
  const bool small =
      std::max(s.rows, s.cols) < kTile || (std::min(sizeof(Ti), sizeof(To)) < 4 && std::min(s.rows, s.cols) < kTile);
  if (small && total <= std::numeric_limits<int32_t>::max()) {
    DEFORM_CONV2D_LAUNCH(
        "deform_conv2d_transpose_kernel", (deform_conv2d_small_transpose_kernel<Ti, To>), total, src, dst, bias, s,
        Divider(static_cast<uint32_t>(s.rows)), Divider(static_cast<uint32_t>(s.cols)), static_cast<uint32_t>(total));
    return;
  }
  if (std::min(s.rows, s.cols) < kTile) {
    const int64_t thin = std::min(s.rows, s.cols);
    const int64_t long_side = std::max<int64_t>(kTile, kThinTileElems / thin / kTile * kTile);
    const int tr = static_cast<int>(s.rows < kTile ? s.rows : std::min(long_side, s.rows));
    const int tc = static_cast<int>(s.cols < kTile ? s.cols : std::min(long_side, s.cols));
    const int64_t row_tiles = ceil_div(s.rows, tr), col_tiles = ceil_div(s.cols, tc);
    const size_t smem = static_cast<size_t>(tr) * (tc | 1) * sizeof(at::opmath_type<Ti>);
    const int64_t blocks = std::min<int64_t>(
        s.batch * row_tiles * col_tiles, at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 16);
    deform_conv2d_thin_transpose_kernel<Ti, To>
        <<<static_cast<unsigned>(blocks), cuda::block_size("deform_conv2d_transpose_kernel"), smem,
           at::cuda::getCurrentCUDAStream()>>>(src, dst, bias, s, tr, tc, row_tiles, col_tiles);
    CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_transpose_kernel");
    return;
  }
  constexpr int64_t Ei = 16 / sizeof(Ti), Eo = 16 / sizeof(To);
  const bool vec = cuda::is_aligned(src, 16) && cuda::is_aligned(dst, 16) && s.cols % Ei == 0 && s.src_ld % Ei == 0 &&
                   s.src_batch % Ei == 0 && s.rows % Eo == 0 && s.dst_ld % Eo == 0 && s.dst_batch % Eo == 0;
  const int64_t tile = vec ? kVecTile : kTile;
  const int64_t row_tiles = ceil_div(s.rows, tile), col_tiles = ceil_div(s.cols, tile);
  s.rows_in_x = row_tiles >= col_tiles;
  const int64_t x = std::max(row_tiles, col_tiles), y = std::min(row_tiles, col_tiles);
  TORCH_CHECK(
      x <= std::numeric_limits<int32_t>::max() && y <= 65535, "customops: deform_conv2d on CUDA supports at most ",
      int_str(65535 * tile), " channels or pixels per image along the shorter side of its transposing copies, but got ",
      int_str(s.rows), " x ", int_str(s.cols));
  const dim3 grid(
      static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(std::min<int64_t>(s.batch, 65535)));
  const int threads = cuda::block_size("deform_conv2d_transpose_kernel");
  const auto stream = at::cuda::getCurrentCUDAStream();
  if (vec) {
    deform_conv2d_transpose_kernel<Ti, To, true><<<grid, threads, 0, stream>>>(src, dst, bias, s);
  } else {
    deform_conv2d_transpose_kernel<Ti, To, false><<<grid, threads, 0, stream>>>(src, dst, bias, s);
  }
  CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_transpose_kernel");
}

// The contiguous (batch, rows, cols) -> (batch, cols, rows) case.
template <typename Ti, typename To>
void transpose_into(const Ti* src, To* dst, int64_t batch, int64_t rows, int64_t cols) {
  transpose_into<Ti, To>(src, dst, TransposeShape{batch, rows, cols, cols, rows * cols, rows, rows * cols});
}

// out (batch, channels, P) = bias[channel], E values per 16-byte store: the bias as the GEMMs'
// C operand. torch's copy of the broadcast bias stores value by value through an index
// calculator (18 us of a 200 us forward at 8x256x64x64 float16 on the H200). kNhwc: out
// channels_last, each store E channels of one pixel (row_vecs unused, channels = C / E).
template <typename T, int E, bool kNhwc>
__global__ void deform_conv2d_bias_kernel(
    const T* __restrict__ bias, Divider row_vecs, Divider channels, uint32_t total, T* __restrict__ out) {
  for (uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
    T val[E];
    if constexpr (kNhwc) {
      const uint32_t c0 = channels.mod(idx) * E;
#pragma unroll
      for (int j = 0; j < E; ++j) val[j] = bias[c0 + j];
    } else {
      const T v = bias[channels.mod(row_vecs.div(idx))];
#pragma unroll
      for (int j = 0; j < E; ++j) val[j] = v;
    }
    store_16_bytes(out + static_cast<int64_t>(idx) * E, val);
  }
}

// Whether an output that the kernels allocated (contiguous or channels_last,
// deform_conv2d_output_format) is to be written channels-last: where it is both, either layout
// writes the same bytes, and the NCHW code runs.
inline bool channels_last_output(const at::Tensor& out) {
  return !out.is_contiguous();
}

// out (NCHW, or channels_last) = bias broadcast over the pixels.
template <typename T>
void fill_bias(at::Tensor& out, const at::Tensor& bias) {
  constexpr int E = 16 / sizeof(T);
  const bool nhwc = channels_last_output(out);
  const int64_t C = out.size(1), P = out.size(2) * out.size(3), total = out.numel() / E;
  if ((nhwc ? C : P) % E != 0 || total > std::numeric_limits<int32_t>::max() ||  // as transpose_into
      !cuda::is_aligned(out.data_ptr(), 16)) {
    out.copy_(bias.view({1, C, 1, 1}).expand_as(out));
    return;
  }
  const at::Tensor b = bias.contiguous();
  if (nhwc) {
    DEFORM_CONV2D_LAUNCH(
        "deform_conv2d_bias_kernel", (deform_conv2d_bias_kernel<T, E, true>), total, b.const_data_ptr<T>(), Divider(1u),
        Divider(static_cast<uint32_t>(C / E)), static_cast<uint32_t>(total), out.data_ptr<T>());
  } else {
    DEFORM_CONV2D_LAUNCH(
        "deform_conv2d_bias_kernel", (deform_conv2d_bias_kernel<T, E, false>), total, b.const_data_ptr<T>(),
        Divider(static_cast<uint32_t>(P / E)), Divider(static_cast<uint32_t>(C)), static_cast<uint32_t>(total),
        out.data_ptr<T>());
  }
}

// Channels per work item: the largest power of two up to max_bytes that divides channels
// (the channels per group and per offset group, so that an item never straddles either),
// with 16-byte-aligned data. More channels per item spread a sampling point's index
// arithmetic over more loads (the direct depthwise forward: up to 64 bytes); col2im, bound by its
// atomics, runs faster with more, smaller items (kCol2imMaxV channels, at most 16 bytes).
template <typename T>
int vector_width(int64_t channels, bool aligned, int max_bytes = 64) {
  int v = aligned ? max_bytes / static_cast<int>(sizeof(T)) : 1;
  while (v > 1 && channels % v != 0) v /= 2;
  return v;
}

// Calls f(std::integral_constant<int, V>()) with V = v, v a power of two up to kMax that
// vector_width<T> can return (only those V are instantiated).
template <typename T, int kMax = 64 / static_cast<int>(sizeof(T)), typename F>
void with_vector_width(int v, const F& f) {
  if constexpr (kMax >= 32) {
    if (v == 32) return f(std::integral_constant<int, 32>());
  }
  if constexpr (kMax >= 16) {
    if (v == 16) return f(std::integral_constant<int, 16>());
  }
  if constexpr (kMax >= 8) {
    if (v == 8) return f(std::integral_constant<int, 8>());
  }
  if constexpr (kMax >= 4) {
    if (v == 4) return f(std::integral_constant<int, 4>());
  }
  if constexpr (kMax >= 2) {
    if (v == 2) return f(std::integral_constant<int, 2>());
  }
  return f(std::integral_constant<int, 1>());
}

// The budget of a chunk (see kChunkBudget): enough rows for the GEMM to fill the GPU, within
// kChunkBudget .. kChunkMaxBytes.
int64_t chunk_budget(const DeformConv2dGeometry& g, int64_t col_bytes_per_pixel, int64_t image_extra_bytes) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t rows = ceil_div(kGemmFillWaves * sms * 128 * 128, g.out_channels);
  const int64_t bytes = rows * col_bytes_per_pixel + ceil_div(rows, g.out_pixels()) * image_extra_bytes;
  return std::clamp(bytes, kChunkBudget, kChunkMaxBytes);
}

// The chunks of a call: whole images while one image's share fits the budget and there is a
// single group (the GEMM then batches over images) or the caller batches the groups over
// whole images (any_groups), else runs of one image's pixels; chunks of equal size but the
// last. A chunk's columns stay below 2^31 values, for the kernels' 32-bit item indices.
std::vector<Chunk> plan_chunks(
    const DeformConv2dGeometry& g, int64_t col_bytes_per_pixel, int64_t image_extra_bytes, bool any_groups = false) {
  const int64_t P = g.out_pixels(), K = g.in_channels * g.taps();
  TORCH_CHECK(
      K <= std::numeric_limits<int32_t>::max(),
      "customops: expected in_channels * kh * kw to be below 2^31 on CUDA, but got ", int_str(K));
  TORCH_CHECK(
      P <= std::numeric_limits<int32_t>::max(),
      "customops: expected out_height * out_width to be below 2^31 on CUDA, but got ", int_str(P));
  const int64_t max_rows = std::numeric_limits<int32_t>::max() / K;
  const int64_t budget = chunk_budget(g, col_bytes_per_pixel, image_extra_bytes);
  const int64_t image_bytes = P * col_bytes_per_pixel + image_extra_bytes;
  std::vector<Chunk> chunks;
  if ((g.groups == 1 || any_groups) && image_bytes <= budget && P <= max_rows) {
    const int64_t most = std::max<int64_t>(1, std::min(budget / image_bytes, max_rows / P));
    const int64_t nb = ceil_div(g.batch, ceil_div(g.batch, most));
    for (int64_t b0 = 0; b0 < g.batch; b0 += nb) chunks.push_back({b0, std::min(nb, g.batch - b0), 0, P});
    return chunks;
  }
  const int64_t col_budget = std::max<int64_t>(budget - image_extra_bytes, budget / 2);
  const int64_t pieces = std::max({int64_t(1), ceil_div(P * col_bytes_per_pixel, col_budget), ceil_div(P, max_rows)});
  // Runs of a multiple of 16 pixels keep each run's output 16-byte aligned for cuBLAS.
  const int64_t n0 = ceil_div(P, pieces), n16 = std::min(P, ceil_div(n0, 16) * 16);
  const int64_t n = n16 <= max_rows ? n16 : n0;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t p0 = 0; p0 < P; p0 += n) chunks.push_back({b, 1, p0, std::min(n, P - p0)});
  }
  return chunks;
}

// x (N, C, H, W) channels-last contiguous: x itself if it is, a transposing copy if it is
// NCHW contiguous, torch's copy for other strides.
template <typename T>
at::Tensor channels_last_copy(const at::Tensor& x) {
  if (x.is_contiguous(at::MemoryFormat::ChannelsLast) || !x.is_contiguous()) {
    return x.contiguous(at::MemoryFormat::ChannelsLast);
  }
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::ChannelsLast));
  transpose_into<T, T>(x.const_data_ptr<T>(), y.data_ptr<T>(), x.size(0), x.size(1), x.size(2) * x.size(3));
  return y;
}

// The weight as (out_channels, kh, kw, in_channels / groups) contiguous, by the transpose
// kernel (torch's permuted copy took 33 us of a 101 us forward at 256 x 512 x 7 x 7 float16 on
// the H200).
inline at::Tensor taps_major_weight(const DeformConv2dGeometry& g, const at::Tensor& weight) {
  if (!weight.is_contiguous() || g.taps() == 1 || g.in_per_group() == 1) {
    return weight.permute({0, 2, 3, 1}).contiguous();  // no copy where kh * kw or in_channels / groups is 1
  }
  at::Tensor w = at::empty({g.out_channels, g.kh, g.kw, g.in_per_group()}, weight.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, weight.scalar_type(), "deform_conv2d_weight", [&] {
    transpose_into<scalar_t, scalar_t>(
        weight.const_data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), g.out_channels, g.in_per_group(), g.taps());
  });
  return w;
}

// Whether the columns' GEMMs take the weight in its own order, (C_out, C_in / groups, kh, kw),
// each chunk's columns reordered to match (reorder_columns), instead of the weight reordered to
// the columns' taps-major order: where the batch's columns are at most half the weight (rows x
// groups x 2 <= C_out; the reorder costs a launch and a buffer, so not at parity), as the CPU's
// gemm_in_weight_order. Reordering a 1024 x 1024 x 3 x 3 float32 weight for the 35 output pixels
// of one 10 x 14 image had made the forward slower than torchvision's (101 against 79 us, H100,
// benchmarks/results/deform_conv2d_NVIDIA_H100_80GB_HBM3_2026-12-06_sweep_seed1.md). A/B, H100
// (deform_conv2d_ab_grouped_backward_weight_order_NVIDIA_H100_2026-12-06.md), forwards 1.06 to
// 1.74x as fast where the weight was 2.6 to 29 times the columns; at 1.5 times (2x768x8x8, 4
// groups) 0.82x in IEEE float32, 1.08x in TF32 and float16.
inline bool weight_order(const DeformConv2dGeometry& g) {
  return g.taps() > 1 && g.in_per_group() > 1 && 2 * g.batch * g.out_pixels() * g.groups <= g.out_channels;
}

// The first `rows` rows of columns, (rows, groups, kh * kw, C_in / groups), into the weight's
// order, (rows, groups, C_in / groups, kh * kw), or back.
template <typename T>
void reorder_columns(
    const at::Tensor& src, at::Tensor& dst, const DeformConv2dGeometry& g, int64_t rows, bool to_weight_order) {
  const int64_t taps = g.taps(), C = g.in_per_group();
  transpose_into<T, T>(
      src.const_data_ptr<T>(), dst.data_ptr<T>(), rows * g.groups, to_weight_order ? taps : C,
      to_weight_order ? C : taps);
}

// What the kernels read besides the input: offset and mask NCHW contiguous, and the weight
// as (groups, out_channels / groups, kh * kw * in_channels / groups), the columns' order (its
// own order, in_channels / groups * kh * kw, where the GEMMs take it so: weight_order), or for
// the direct forward as (groups, kh, kw, in_channels / groups, out_channels / groups), so that a
// stage's slice is read along the output channels into shared memory without bank conflicts.
struct CudaOperands {
  at::Tensor input, off, msk, w;
  bool input_channels_last;
  bool in_weight_order;  // w in the weight's own order: the GEMMs take reordered columns

  CudaOperands(
      const DeformConv2dGeometry& g, const at::Tensor& input_, const at::Tensor& offset, const at::Tensor& weight,
      const c10::optional<at::Tensor>& mask, bool direct = false, bool weight_own_order = false)
      : input(input_),
        off(offset.contiguous()),
        msk(mask.has_value() ? mask->contiguous() : at::Tensor()),
        w(direct ? weight.reshape({g.groups, g.out_per_group(), g.in_per_group(), g.kh, g.kw})
                       .permute({0, 3, 4, 2, 1})
                       .contiguous()
                 : (weight_own_order ? weight.contiguous() : taps_major_weight(g, weight))
                       .view({g.groups, g.out_per_group(), g.taps() * g.in_per_group()})),
        input_channels_last(input_.is_contiguous(at::MemoryFormat::ChannelsLast)),
        in_weight_order(weight_own_order) {}

  template <typename T>
  const T* mask_ptr() const {
    return msk.defined() ? msk.const_data_ptr<T>() : nullptr;
  }

  // The images of a chunk, channels-last contiguous (a view of a channels_last input).
  template <typename T>
  at::Tensor images(const Chunk& ch) const {
    return channels_last_copy<T>(input.narrow(0, ch.b0, ch.nb));
  }
  int64_t image_copy_bytes(const DeformConv2dGeometry& g) const {
    return input_channels_last ? 0 : g.in_channels * g.height * g.width * input.element_size();
  }
};

// The backward's tiles: 8 x 16 output pixels (fewer for a smaller output or chunk), for V
// channels per thread.
TileLayout tile_layout(const DeformConv2dGeometry& g, const Chunk& ch, int v) {
  TileLayout L;
  L.g = g;
  L.ch = ch;
  L.oy0 = ch.p0 / g.out_w;
  const int64_t out_rows = (ch.p0 + ch.n - 1) / g.out_w - L.oy0 + 1;
  L.th = static_cast<int>(std::min<int64_t>(8, out_rows));
  L.tw = static_cast<int>(std::min<int64_t>(16, g.out_w));
  L.tiles_x = static_cast<int>(ceil_div(g.out_w, L.tw));
  L.tiles = L.tiles_x * static_cast<int>(ceil_div(out_rows, L.th));
  L.taps = Divider(static_cast<uint32_t>(g.taps()));
  L.tw_div = Divider(static_cast<uint32_t>(L.tw));
  L.kw = Divider(static_cast<uint32_t>(g.kw));
  const int64_t seg = g.in_per_offset_group() / v;
  L.width = 1;
  while (L.width < kSlice / v && seg % (2 * L.width) == 0) L.width *= 2;
  return L;
}

// Bytes per col2im thread for vector_width: kCol2imMaxV channels, at most 16 bytes.
template <typename T>
constexpr int col2im_max_bytes() {
  return std::min<int>(16, kCol2imMaxV * static_cast<int>(sizeof(T)));
}

// query(kernel) on the current device, asked once per kernel, device and key: a driver call per
// launch would add to the host work that bounds batch-1 backwards.
template <typename F>
int per_kernel_and_device(const void* kernel, int key_, F query) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int>, int> known;
  const std::tuple<const void*, int, int> key{kernel, c10::cuda::current_device(), key_};
  {
    const std::lock_guard<std::mutex> lock(mu);
    const auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  const int value = query();
  const std::lock_guard<std::mutex> lock(mu);
  return known.emplace(key, value).first->second;
}

inline int max_threads_per_block(const void* kernel) {
  return per_kernel_and_device(kernel, 0, [&] {
    cudaFuncAttributes attr;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.maxThreadsPerBlock;
  });
}

// Blocks of `threads` threads (no dynamic shared memory) that one SM holds at once.
inline int resident_blocks_per_sm(const void* kernel, int threads) {
  return per_kernel_and_device(kernel, threads, [&] {
    int n = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
    return n;
  });
}

template <typename T, bool kDepthwise>
void launch_col2im(
    const TileLayout& L, int v, const T* gcol, const T* wt, const T* xs, const CudaOperands& o, at::opmath_type<T>* gx,
    at::opmath_type<T>* goff, at::opmath_type<T>* gmask, at::opmath_type<T>* gw) {
  using A = at::opmath_type<T>;
  const int64_t blocks = static_cast<int64_t>(L.tiles) * L.ch.nb, slices = ceil_div(L.g.in_channels, kSlice);
  TORCH_CHECK(
      slices <= 65535, "customops: expected in_channels to be at most ", int_str(65535 * kSlice), " on CUDA, but got ",
      int_str(L.g.in_channels));
  const int64_t smem = (kDepthwise && gw ? L.g.taps() * kSlice : 0) * sizeof(A);
  with_vector_width<T, kCol2imMaxV>(v, [&](auto vw) {
    constexpr int V = decltype(vw)::value;
    // Threads per block: kCol2imThreads, or as many as the kernel's registers allow.
    const auto block_threads = [&](auto kernel) {
      int threads = kCol2imThreads / cuda::kThreads * cuda::block_size("deform_conv2d_col2im_kernel");
      if (threads == kCol2imThreads) {  // not the failed-launch test's block size
        const int most = max_threads_per_block(reinterpret_cast<const void*>(kernel));
        threads = std::min(threads, most / 32 * 32);  // whole warps: kLanes divides 32
      }
      return threads;
    };
    const auto launch = [&](auto kernel, int threads) {
      if (smem > (48 << 10)) {
        C10_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      }
      kernel<<<
          dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(slices)), threads, smem,
          at::cuda::getCurrentCUDAStream()>>>(
          gcol, wt, xs, o.off.const_data_ptr<T>(), o.mask_ptr<T>(), L, gx, goff, gmask, gw);
    };
    const auto fixed = deform_conv2d_col2im_kernel<T, V, kDepthwise, kDepthwise>;
    const auto per_task = deform_conv2d_col2im_kernel<T, V, kDepthwise, false>;
    // Fixed taps, taken only as measured faster (H200, forward + backward, 3x3 layers of batch 8
    // 1.07 to 1.11x; benchmarks/results/deform_conv2d_ab_depthwise_grad_weight_NVIDIA_H200_2026-12-04.md):
    // at most 1/16 of a block's slots idle (slots % taps: 3x3 leaves 4 of 112) and a block of at
    // least 7/8 of the per-task kernel's threads (the fixed-tap kernels take more registers: at
    // 896 of 1024 threads they won; where a build gave float16's 800, 7x7 lost 12 to 14%).
    const int per_task_threads = block_threads(per_task);
    const int fixed_threads = kDepthwise && gw ? block_threads(fixed) : 0;
    const int64_t fixed_slots = fixed_threads / (kSlice / V), busy = fixed_slots / L.g.taps() * L.g.taps();
    if (busy > 0 && busy * 16 >= fixed_slots * 15 && fixed_threads * 8 >= per_task_threads * 7) {
      launch(fixed, static_cast<int>(fixed_slots) * (kSlice / V));
    } else {
      launch(per_task, per_task_threads);
    }
    CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_col2im_kernel");
  });
}

template <typename T>
int chunk_vector_width(const DeformConv2dGeometry& g, const at::Tensor& xs, int max_bytes) {
  if (g.in_per_group() == 1) return 1;
  return vector_width<T>(
      std::gcd(g.in_per_group(), g.in_per_offset_group()), cuda::is_aligned(xs.const_data_ptr<T>(), 16), max_bytes);
}

template <typename T>
void launch_im2col(
    const CudaOperands& o, const DeformConv2dGeometry& g, const Chunk& ch, const at::Tensor& xs, at::Tensor& col) {
  const int64_t Cg = g.in_per_group(), U = std::gcd(Cg, g.in_per_offset_group());
  // Channels per item: 16 bytes where the unit's channels and the images' pointer allow.
  int s = 16 / static_cast<int>(sizeof(T));
  while (s > 1 && (U % s != 0 || !cuda::is_aligned(xs.const_data_ptr<T>(), s * static_cast<int>(sizeof(T))))) s /= 2;
  UnitLayout L;
  L.g = g;
  L.ch = ch;
  L.U = U;
  L.subvecs = Divider(static_cast<uint32_t>(U / s));
  L.taps = Divider(static_cast<uint32_t>(g.taps()));
  L.groups = Divider(static_cast<uint32_t>(g.groups));
  L.n = Divider(static_cast<uint32_t>(ch.n));
  L.out_w = Divider(static_cast<uint32_t>(g.out_w));
  L.kw = Divider(static_cast<uint32_t>(g.kw));
  L.og_channels = Divider(static_cast<uint32_t>(g.in_per_offset_group()));
  const bool loop_taps = Cg > 1 && U / s <= 2;
  const bool staged = !loop_taps && U / s > 1;
  // Where a (row, group, tap) has several units (several offset groups), a warp takes at most
  // 8 units of a (row, group, tap) and at least 4 rows (a sector of their offsets a plane);
  // staged units of one offset group a tap keep (row, group, tap, u). H100, forwards 1.2 to
  // 1.7x as fast at 2 and 4 channels per offset group, 1.0 to 1.5x at 8 in 16 bits
  // (deform_conv2d_ab_offset_group_units_NVIDIA_H100_2026-12-06.md); staged units with several
  // a tap 1.01 to 1.10x (4 to 16 offset groups of 32 to 64 channels), with one 0.98 to 1.00x
  // (deform_conv2d_ab_staged_rows_NVIDIA_H100_2026-12-06.md). The taps kernel over one tap a
  // thread: 1.2 to 1.5x at 2 and 4 channels; over staging two-item units: 1.04 to 1.38x
  // (deform_conv2d_ab_column_taps_NVIDIA_H100_2026-12-06.md).
  const int64_t per_tap = Cg / U;
  int64_t lanes = per_tap, R = 1, slices = g.taps();
  const auto units_in_blocks_of = [&](int64_t rows) {
    return ceil_div(ch.rows(), rows) * rows * g.groups * slices * per_tap;
  };
  if (loop_taps || (staged && per_tap > 1)) {
    lanes = std::min<int64_t>(per_tap, 8);
    while (per_tap % lanes != 0) --lanes;
    R = std::min<int64_t>(C10_WARP_SIZE / lanes, std::max<int64_t>(ch.rows(), 1));
    // The Dividers take dividends below 2^31, which the padded row blocks could pass.
    if (units_in_blocks_of(R) > std::numeric_limits<int32_t>::max()) R = 1;
  }
  L.lanes = Divider(static_cast<uint32_t>(lanes));
  L.lane_sets = Divider(static_cast<uint32_t>(per_tap / lanes));
  L.block_rows = Divider(static_cast<uint32_t>(R));
  // About 8 items per thread of a 256-thread block, at most a unit per thread (staged: more
  // than one item per unit).
  L.nu = static_cast<int>(std::clamp<int64_t>(2048 / (U / s), 1, cuda::kThreads));
  L.groups_fastest = Cg == 1;
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  with_vector_width<T, 16 / static_cast<int>(sizeof(T))>(s, [&](auto sw) {
    constexpr int S = decltype(sw)::value;
    const auto kernel = !loop_taps   ? deform_conv2d_im2col_kernel<T, S>
                        : U / s == 1 ? deform_conv2d_im2col_taps_kernel<T, S, 1>
                                     : deform_conv2d_im2col_taps_kernel<T, S, 2>;
    int64_t tpt = 1;
    if (loop_taps) {
      // A thread takes as many taps as leave kTapWaves waves of the threads that the GPU holds
      // at once (the kernel's registers allow), in slices of equal size: each unit decoded once
      // and several taps' loads in flight, with a tail of at most a quarter of a wave.
      const int64_t resident =
          sms * resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), cuda::kThreads) * cuda::kThreads;
      tpt = std::clamp<int64_t>(units_in_blocks_of(R) / std::max<int64_t>(resident * kTapWaves, 1), 1, g.taps());
      tpt = ceil_div(g.taps(), ceil_div(g.taps(), tpt));
      // Test hook: taps per thread forced, so that small layers run slices of several taps.
      if (const char* v = std::getenv("CUSTOMOPS_TEST_DEFORM_TAPS_PER_THREAD")) {
        tpt = std::clamp<int64_t>(std::atoi(v), 1, g.taps());
      }
    }
    slices = ceil_div(g.taps(), tpt);
    L.slices = Divider(static_cast<uint32_t>(slices));
    L.taps_per_thread = static_cast<int>(tpt);
    L.units = units_in_blocks_of(R);
    if (L.units == 0) return;
    const int64_t blocks = std::min(ceil_div(L.units, staged ? L.nu : cuda::kThreads), sms * 16);
    kernel<<<
        static_cast<unsigned>(blocks), cuda::block_size("deform_conv2d_im2col_kernel"),
        staged ? L.nu * unit_smem_bytes<T, S>() : 0, at::cuda::getCurrentCUDAStream()>>>(
        xs.const_data_ptr<T>(), o.off.const_data_ptr<T>(), o.mask_ptr<T>(), L, col.data_ptr<T>());
    CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_im2col_kernel");
  });
}

// A chunk's columns for the GEMMs: im2col's into col, and where the weight stays in its own
// order (o.in_weight_order), reordered to it into gcol.
template <typename T>
void gemm_columns(
    const CudaOperands& o, const DeformConv2dGeometry& g, const Chunk& ch, const at::Tensor& xs, at::Tensor& col,
    at::Tensor& gcol) {
  launch_im2col<T>(o, g, ch, xs, col);
  if (o.in_weight_order) reorder_columns<T>(col, gcol, g, ch.rows(), true);
}

// The depthwise weight (C, kh * kw) as (kh * kw, C) contiguous and 16-byte aligned, for the
// kernels' vector loads: with one tap it is a view of the caller's weight, which may start anywhere.
at::Tensor depthwise_taps_weight(const at::Tensor& w) {
  at::Tensor wt = w.t().contiguous();
  return cuda::is_aligned(wt.const_data_ptr(), 16) ? wt : wt.clone();
}

// Test hook: CUSTOMOPS_TEST_DEPTHWISE_DIRECT=1, read per call, sends the depthwise forward to
// the direct kernel, the tiled kernel's fallback, so that tests (and benchmarks/ab_deform_conv2d.py)
// reach it at any shape.
bool depthwise_direct_forced() {
  return env_override("CUSTOMOPS_TEST_DEPTHWISE_DIRECT", "1", "0") > 0;
}

// The tiled depthwise forward (deform_conv2d_depthwise_tile_kernel) over all images, in launches
// of fewer than 2^31 output pixels; false (nothing launched), for the direct kernel to take,
// where its 32-bit tile indices or its grid would not hold the shape. A stage holds at most 512
// points (with 256 threads, under 48 KB even in float64): a slice of fewer than 32 lanes holds
// every channel, so tp * offset groups <= 256 * V / Cog <= 256, and at 32 lanes tp is 8 and a
// slice spans at most 34 offset groups.
template <typename T>
bool launch_depthwise_tiled(
    const DeformConv2dGeometry& g, const CudaOperands& o, const at::Tensor& xs, const at::Tensor& wt,
    const at::Tensor& b, at::Tensor& out) {
  using A = at::opmath_type<T>;
  const int64_t C = g.in_channels, Cog = g.in_per_offset_group(), P = g.out_pixels(), taps = g.taps();
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (P >= kMax / 2 || taps >= kMax) return false;
  const int v = vector_width<T>(Cog, cuda::is_aligned(xs.const_data_ptr<T>(), 16), 16);
  int lanes = 1;  // a lane per vector of channels, up to a warp
  while (lanes < 32 && lanes * v < C) lanes *= 2;
  const int cs = lanes * v, tp = cuda::kThreads / lanes;
  const int64_t slices = ceil_div(C, cs);
  const int ogs = static_cast<int>(std::min<int64_t>(g.offset_groups, cs / Cog + 2));
  const int kb = static_cast<int>(std::clamp<int64_t>(kDepthwisePointsPerStage / (tp * ogs), 1, taps));
  const int ld = cs + (sizeof(T) >= 4 ? 1 : 4 / static_cast<int>(sizeof(T)));
  const int64_t smem = std::max<int64_t>(
      static_cast<int64_t>(tp) * kb * ogs * sizeof(DepthwisePoint<A>), static_cast<int64_t>(tp) * ld * sizeof(T));
  TORCH_INTERNAL_ASSERT(smem <= (48 << 10), "deform_conv2d_depthwise_tile_kernel: ", smem, " bytes of shared memory");
  if (slices > 65535) return false;
  DepthwiseTileLayout L;
  L.g = g;
  L.lanes = lanes;
  L.tp = tp;
  L.kb = kb;
  L.P = Divider(static_cast<uint32_t>(P));
  L.out_w = Divider(static_cast<uint32_t>(g.out_w));
  L.kw = Divider(static_cast<uint32_t>(g.kw));
  L.nhwc = channels_last_output(out);
  const int64_t per_launch = std::max<int64_t>(1, (std::numeric_limits<int32_t>::max() - tp) / P);
  with_vector_width<T, 16 / static_cast<int>(sizeof(T))>(v, [&](auto vw) {
    constexpr int V = decltype(vw)::value;
    const auto kernel = deform_conv2d_depthwise_tile_kernel<T, V>;
    for (int64_t b0 = 0; b0 < g.batch; b0 += per_launch) {
      L.b0 = b0;
      L.pixels = static_cast<uint32_t>(std::min(per_launch, g.batch - b0) * P);
      const dim3 grid(static_cast<unsigned>(ceil_div(L.pixels, tp)), static_cast<unsigned>(slices));
      kernel<<<grid, cuda::block_size("deform_conv2d_depthwise_tile_kernel"), smem, at::cuda::getCurrentCUDAStream()>>>(
          xs.const_data_ptr<T>(), o.off.const_data_ptr<T>(), o.mask_ptr<T>(), wt.const_data_ptr<T>(),
          b.defined() ? b.const_data_ptr<T>() : nullptr, L, out.data_ptr<T>());
      CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_depthwise_tile_kernel");
    }
  });
  return true;
}

// Test hook: CUSTOMOPS_TEST_DEFORM_FORWARD=direct or =columns forces the forward of a layer that
// is not depthwise to deform_conv2d_direct_kernel or to the columns and GEMMs, so that tests and
// benchmarks/ab_deform_conv2d.py reach either at any shape.
int forward_override() {
  return env_override("CUSTOMOPS_TEST_DEFORM_FORWARD", "direct", "columns");
}

// Test hook: CUSTOMOPS_TEST_DEFORM_GROUPED_GEMM=1 or =0 forces grouped_gemm on or off.
int grouped_gemm_override() {
  return env_override("CUSTOMOPS_TEST_DEFORM_GROUPED_GEMM", "1", "0");
}

// Whether the columns forward of a grouped layer (NCHW output) takes chunks of whole images and
// one GEMM per chunk batched over the groups, into a rows-major buffer, then the transpose into
// NCHW with the bias; else a GEMM per image (or run of its pixels) batched over the groups
// straight into the output. Taken for several images (one launch, not one per image), and for
// output rows that are not 16-byte aligned (cuBLAS's slower kernels). Forwards on an H100
// (benchmarks/results/deform_conv2d_ab_grouped_gemm_NVIDIA_H100_2026-12-05.md), per-image time
// over batched: 1.02-2.04x at grouped layers of several images in float32, TF32, float16 and
// bfloat16 and at one image of 25x42 (1.03-1.23x), 0.98-1.02x at 2 groups of 64 channels, but
// 0.93x at ResNeXt 32x4d's c3 stage (2 images of 100x168, 8 channels per group) in float16 and
// bfloat16; one image of aligned rows 0.93-0.96x (the transpose), so it keeps the per-image GEMM.
// float64 (not measured) follows the same rule. A channels_last output does not ask: see
// forward_impl.
bool grouped_gemm(const DeformConv2dGeometry& g, bool aligned_rows) {
  if (const int forced = grouped_gemm_override()) return forced > 0 && g.groups > 1;
  return g.groups > 1 && (g.batch > 1 || !aligned_rows);
}

// What the per-group GEMM rules share: a grouped layer; the test hook's answer where it is set
// (=1 on in any dtype, =0 off); else IEEE float32 (cuBLAS's batched tensor-core kernels are fast
// enough in TF32 and 16 bits) whose batched GEMM's `tiles` 128 x 128 tiles fill at most half of
// the SMs, and the rule's own condition, `enough_work`.
template <typename T>
bool per_group_gemm(const DeformConv2dGeometry& g, const char* hook, int64_t tiles, bool enough_work) {
  if (g.groups == 1) return false;
  if (const int forced = env_override(hook, "1", "0")) return forced > 0;
  return std::is_same_v<T, float> && !cuda::matmul_allows_tf32() && enough_work &&
         2 * tiles <= at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}

// Whether a grouped layer's columns GEMM runs one GEMM per group instead of one batched over the
// groups: cuBLAS splits the reduction of a single GEMM where its tiles are too few for the SMs, and
// not of a batched one. Taken in IEEE float32 where the batched GEMM's 128 x 128 tiles fill at
// most half of the SMs and a group's reduction is at least 768 per group launched: forwards 1.05
// to 2.34x there (1x1024x7x7 -> 1024 in 2 groups: 158 -> 70 us); 512 to 576 read 0.85 to 1.06,
// and TF32 and 16-bit layers lost everywhere (0.59 to 0.88). H100,
// benchmarks/results/deform_conv2d_ab_gemm_per_group_NVIDIA_H100_2026-12-06.md. Test hook:
// CUSTOMOPS_TEST_DEFORM_GEMM_PER_GROUP=1 or =0 forces it on (any dtype) or off.
template <typename T>
bool gemm_per_group(const DeformConv2dGeometry& g, int64_t rows, int64_t Kg) {
  return per_group_gemm<T>(
      g, "CUSTOMOPS_TEST_DEFORM_GEMM_PER_GROUP", g.groups * ceil_div(rows, 128) * ceil_div(g.out_per_group(), 128),
      Kg >= 768 * g.groups);
}

// Whether the backward's grad_weight GEMM of a grouped layer, (C_out / G, rows) x (rows, Kg) per
// group, runs one GEMM per group instead of one batched over the groups. The batched GEMM does not
// split its reduction over the chunk's rows, so few output tiles each run the whole of it (16x32x56x38
// -> 64 in 2 groups, IEEE float32: 1.2 ms of a 1.5 ms forward + backward); per group, cuBLAS splits
// it, at a launch per group. Taken in IEEE float32 where the batched GEMM's 128 x 128 tiles fill at
// most half of the SMs and a tile's work, rows x its outputs, is at least 2^21 multiply-adds per
// group launched: forwards + backwards 1.02 to 4.3x there (that layer 1510 -> 353 us); 1.2M to
// 1.4M read 0.72 to 0.88, 32 to 64 groups of few channels 0.30 to 0.68; TF32 lost at 11 of 15
// layers, float16 at all 15. H100, benchmarks/results/deform_conv2d_ab_grad_weight_per_group_NVIDIA_H100_2026-12-07.md.
// Test hook: CUSTOMOPS_TEST_DEFORM_GRAD_WEIGHT_PER_GROUP=1 or =0 forces it on (any dtype) or off.
template <typename T>
bool grad_weight_per_group(const DeformConv2dGeometry& g, int64_t rows) {
  const int64_t n = g.out_per_group(), k = g.taps() * g.in_per_group();
  return per_group_gemm<T>(
      g, "CUSTOMOPS_TEST_DEFORM_GRAD_WEIGHT_PER_GROUP", g.groups * ceil_div(n, 128) * ceil_div(k, 128),
      rows * std::min<int64_t>(n, 128) * std::min<int64_t>(k, 128) >= (int64_t{1} << 21) * g.groups);
}

// Output channels per thread of the direct kernel: the fewest blocks along a group's output
// channels (each block blends the samples again), then the least padding of the last one.
int direct_channels_per_thread(int64_t out_per_group) {
  const int64_t tiles = ceil_div(out_per_group, kDirectSlots * 8);
  for (int rn : {2, 4, 6, 8}) {
    if (tiles * kDirectSlots * rn >= out_per_group) return rn;
  }
  return 8;
}

// The direct kernel's tiling of a layer: RN output channels per thread, gb groups per block and
// tiles_n blocks along their output channels.
struct DirectTiling {
  int rn, gb;
  int64_t tiles_n;
};

// Several groups per block where their outputs fill the block's 8 * RN exactly, RN dividing a
// group's outputs (a thread's channels in one group), and their input channels make one stage of
// one offset group: each block then blends all the samples its outputs need, once. Else a group per
// block (groups of under 8 * RN outputs leave slots idle). Forwards, a group per block's time over
// several's (H200, the A/B of direct_forward): ResNeXt-101 32x4d's c3 stage (4 groups of 8 a block)
// 1.98-2.03x in float32, 1.50-1.51x in 16 bits; c4 (2 of 16) 1.18-1.20x in float32 but 0.80-0.82x
// in 16 bits (not taken there by default); 128 groups of one input channel 3.3-5.3x.
DirectTiling direct_tiling(const DeformConv2dGeometry& g, at::ScalarType dtype) {
  const int64_t Cg = g.in_per_group(), Ng = g.out_per_group();
  const int64_t kc = dtype == at::kDouble ? direct_slice<double>() : direct_slice<float>();
  for (int rn : {4, 2}) {
    const int64_t tn = kDirectSlots * rn, gb = tn / Ng;
    if (tn % Ng == 0 && Ng % rn == 0 && gb > 1 && gb * Cg <= kc && g.groups % gb == 0 &&
        g.in_per_offset_group() % (gb * Cg) == 0) {
      return {rn, static_cast<int>(gb), 1};
    }
  }
  const int rn = direct_channels_per_thread(Ng);
  return {rn, 1, ceil_div(Ng, kDirectSlots * rn)};
}

// The direct kernel's blocks over `images` images of the layer, tiled as t.
int64_t direct_blocks(const DeformConv2dGeometry& g, const DirectTiling& t, int64_t images) {
  return ceil_div(images * g.out_pixels(), kDirectPixels) * (g.groups / t.gb) * t.tiles_n;
}

// Whether the direct kernel's grid holds the layer: grid.y = groups / gb * tiles_n, and
// launches of whole images below 2^31 pixels.
bool direct_fits(const DeformConv2dGeometry& g, const DirectTiling& t) {
  return g.groups / t.gb * t.tiles_n <= 65535 && g.out_pixels() < std::numeric_limits<int32_t>::max() / 2 &&
         g.taps() <= std::numeric_limits<int32_t>::max();
}

// Where the direct forward is taken (layers that are not depthwise): grouped layers whose groups'
// output channels are few for the dtype's GEMM (per blended sample, the direct kernel adds that
// many float32 products on CUDA cores, where the columns write and reread it for cuBLAS), with
// its blocks' output slots at least half used (8 or more outputs, or several groups a block; with
// TF32, several groups a block, where all its wins were) and at least 4 blocks per SM (2 or 3 are
// resident at once: fewer leave a partial wave). Forwards
// against the columns through grouped_gemm, columns time over direct time (H200 and H100,
// benchmarks/results/deform_conv2d_ab_direct_groups_per_block_*_2026-12-05.md):
// - IEEE float32, up to 32 outputs per group: ResNeXt-101's DCN stages c3 2.05-2.11x and c4
//   1.35-1.39x (of one image 2.52-2.54x and 1.31-1.34x), c5 0.94-1.03x, 8 groups of 32 1.07-1.14x,
//   groups of 1 to 4 input channels 2.21-2.63x; c5 of one image (288 blocks) 0.89-0.91x and one
//   32x32 image (32 blocks) 0.43-0.53x, where the block count sends them to the columns;
// - TF32, up to 16 in blocks of several groups: c3 1.91-1.96x, c4 1.17-1.26x (of one image
//   0.95-1.04x), groups of 1 to 4 input channels 2.21-2.43x; 32 per group 0.71-1.00x; a group a
//   block, 1.00x at 8 and 16 outputs (4 groups of 64 inputs, 256 blocks);
// - float16 and bfloat16: 2.0-2.2x and 1.3-1.4x at one input channel and 2 or 4 outputs per group,
//   where cuBLAS's GEMMs have K = taps; 0.69-0.72x at 4 channels in and out, 0.30-0.61x at 8 to
//   64 outputs, where they run on tensor cores;
// - one group, IEEE float32: 1.06-1.15x at 8 and 16 outputs, 0.89-1.15x at 32 to 64, 0.28-0.30x
//   for one 32x32 image (deform_conv2d_ab_direct_narrow_batched_NVIDIA_H100_2026-12-05.md): a
//   margin too thin to take.
// float64 stays on the columns (not measured).
bool direct_forward(const DeformConv2dGeometry& g, at::ScalarType dtype) {
  const DirectTiling t = direct_tiling(g, dtype);
  if (const int forced = forward_override()) return forced > 0 && direct_fits(g, t);
  const int64_t n = g.out_per_group();
  bool narrow = false;
  if (dtype == at::kFloat) {
    narrow = cuda::matmul_allows_tf32() ? n <= 16 && t.gb > 1 : n <= 32;
  } else if (dtype == at::kHalf || dtype == at::kBFloat16) {
    narrow = g.in_per_group() == 1 && n <= 4;
  }
  if (g.groups == 1 || !narrow || !direct_fits(g, t) || (t.gb == 1 && n < 8)) return false;
  return direct_blocks(g, t, g.batch) >= 4 * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}

// The direct forward of a chunk's images (direct_fits; xs: their channels-last copy), in launches
// of fewer than 2^31 output pixels.
template <typename T>
void launch_direct(
    const DeformConv2dGeometry& g, const CudaOperands& o, const Chunk& ch, const at::Tensor& xs, const at::Tensor& b,
    at::Tensor& out) {
  static_assert(kDirectThreads == cuda::kThreads, "the failed-launch hook's block size");
  const int64_t P = g.out_pixels();
  const DirectTiling tiling = direct_tiling(g, xs.scalar_type());
  const int rn = tiling.rn;
  DirectLayout L;
  L.g = g;
  L.gb = tiling.gb;
  L.tiles_n = static_cast<int>(tiling.tiles_n);
  L.P = Divider(static_cast<uint32_t>(P));
  L.out_w = Divider(static_cast<uint32_t>(g.out_w));
  L.kw = Divider(static_cast<uint32_t>(g.kw));
  L.nhwc = channels_last_output(out);
  // 16-byte loads where every stage's channels allow (float64: one channel per load).
  constexpr int kVec = sizeof(T) == 8 ? 1 : 16 / static_cast<int>(sizeof(T));
  const bool vec =
      std::gcd(g.in_per_group(), g.in_per_offset_group()) % kVec == 0 && cuda::is_aligned(xs.const_data_ptr<T>(), 16);
  const int64_t per_launch = std::max<int64_t>(1, (std::numeric_limits<int32_t>::max() - kDirectPixels) / P);
  const auto launch_grids = [&](auto kernel) {
    L.x0 = ch.b0;
    for (int64_t b0 = ch.b0; b0 < ch.b0 + ch.nb; b0 += per_launch) {
      L.b0 = b0;
      L.pixels = static_cast<uint32_t>(std::min(per_launch, ch.b0 + ch.nb - b0) * P);
      const dim3 grid(
          static_cast<unsigned>(ceil_div(L.pixels, kDirectPixels)), static_cast<unsigned>(g.groups / L.gb * L.tiles_n));
      kernel<<<grid, cuda::block_size("deform_conv2d_direct_kernel"), 0, at::cuda::getCurrentCUDAStream()>>>(
          xs.const_data_ptr<T>(), o.off.const_data_ptr<T>(), o.mask_ptr<T>(), o.w.const_data_ptr<T>(),
          b.defined() ? b.const_data_ptr<T>() : nullptr, L, out.data_ptr<T>());
      CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_direct_kernel");
    }
  };
  // float32, the dtype the default sends here: a grid that one wave of the kernel holds (102
  // registers, 2 blocks per SM on the H100) takes it; a larger one the build bounded to 3 blocks
  // per SM (80 registers), for fewer waves. Forwards on an H100: the bounded build 1.06-1.31x
  // faster at 20 of 22 layers whose grids passed 264 blocks (0.99-1.00x at the others), 0.86-1.01x
  // at 256 blocks or fewer, which one wave held; Nsight Compute had found 25% occupancy and, at
  // 256x48x12x12 -> 48, 288 blocks for 264 places
  // (benchmarks/results/deform_conv2d_ab_direct_variants_NVIDIA_H100_2026-12-05.md).
  const auto launch = [&](auto rn_c, auto vw) {
    constexpr int RN = decltype(rn_c)::value, V = decltype(vw)::value;
    const auto kernel = deform_conv2d_direct_kernel<T, RN, V, 1>;
    if constexpr (std::is_same<T, float>::value) {
      const int64_t blocks = direct_blocks(g, tiling, ch.nb);
      const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
      const auto bounded = deform_conv2d_direct_kernel<T, RN, V, 3>;
      const int most = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kDirectThreads);
      // (only where the bounded build fits more blocks per SM: not where shared memory is the bound)
      if (blocks > most * sms &&
          resident_blocks_per_sm(reinterpret_cast<const void*>(bounded), kDirectThreads) > most) {
        return launch_grids(bounded);
      }
    }
    launch_grids(kernel);
  };
  const auto with_rn = [&](auto vw) {
    switch (rn) {
      case 2: return launch(std::integral_constant<int, 2>(), vw);
      case 4: return launch(std::integral_constant<int, 4>(), vw);
      case 6: return launch(std::integral_constant<int, 6>(), vw);
      default: return launch(std::integral_constant<int, 8>(), vw);
    }
  };
  if (vec) {
    with_rn(std::integral_constant<int, kVec>());
  } else {
    with_rn(std::integral_constant<int, 1>());
  }
}

// The GEMMs' operands: each one as_strided view of a buffer's elements from `first`, in place of
// a chain of views (narrow, select, view, permute, expand: about 20 ATen calls per batch-1
// forward, torch.profiler).
at::Tensor strided(const at::Tensor& t, int64_t first, at::IntArrayRef sizes, at::IntArrayRef strides) {
  return t.as_strided(sizes, strides, t.storage_offset() + first);
}

// dst (+)= a x b, 2-D or batched, through the CUDA kernels' entry points (at::cuda::, what the
// dispatcher reaches for these tensors: the same cuBLAS calls and precision settings) without
// the dispatcher's per-call work.
void matmul_into(at::Tensor& dst, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (dst.dim() == 2) {
    if (accumulate) {
      at::cuda::addmm_(dst, a, b);
    } else {
      at::cuda::mm_out(dst, a, b);
    }
  } else if (accumulate) {
    at::cuda::baddbmm_(dst, a, b);
  } else {
    at::cuda::bmm_out(dst, a, b);
  }
}

// acc += a x b, 2-D or batched, into an opmath accumulator: in its own type, or from 16-bit
// operands as float32 results (mm.dtype, bmm.dtype), written straight into acc for the first chunk
// (acc is zero then) and added for the others, so no chunk's sum is rounded to 16 bits.
void accumulate_into(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, bool first) {
  if (a.scalar_type() == acc.scalar_type()) return matmul_into(acc, a, b, true);
  const bool two_d = acc.dim() == 2;
  if (first) {
    two_d ? at::cuda::mm_out(acc, a, b, at::kFloat) : at::cuda::bmm_out(acc, a, b, at::kFloat);
  } else {
    acc.add_(two_d ? at::cuda::mm(a, b, at::kFloat) : at::cuda::bmm(a, b, at::kFloat));
  }
}

// A split-K GEMM on CUDA cores for IEEE float32 grouped layers of few output pixels and long
// reductions (split_k_forward): part[split] = columns x weight^T over one slice of the
// reduction, per group, then deform_conv2d_split_k_sum_kernel adds the slices in a fixed order
// with the bias into the output (NCHW or channels_last), so the result does not depend on
// scheduling. A block takes 64 rows x 64 outputs of one group and one slice, in steps of 16
// values of the reduction through double-buffered shared memory (a thread 4 x 4 outputs).
// cuBLAS's IEEE float32 kernels ran such GEMMs on a few SMs (49 x 4608 x 512: 8 TFLOP/s, 29 us).
constexpr int kSplitKTile = 64, kSplitKStep = 16;
// Blocks per SM the slices aim at (4 fit at once by their registers; 2 and 8 were no faster), and
// the most multiply-adds per group split_k_forward takes (the largest grouped layer measured).
constexpr int64_t kSplitKBlocksPerSm = 4, kSplitKMaxWork = int64_t{1} << 27;

struct SplitKShape {
  int64_t rows, lda;       // A (rows, groups x kg) with row stride lda: the chunk's columns
  int64_t kg, cg, groups;  // the reduction and the outputs per group; B (groups x cg, kg)
  int64_t per_split;       // a multiple of kSplitKStep
  int64_t row_tiles;
  int64_t part_ld;         // partials [split][group][cg][part_ld = rows padded to 4], or (kRowsFastest
                           // false) [split][group][rows][part_ld = cg padded to 4]
};

template <bool kVec>
__device__ __forceinline__ void split_k_load(
    float (&v)[4], const float* __restrict__ p, bool row_ok, int64_t k, int64_t k_end) {
  if (kVec) {  // k_end and k multiples of 4: the 4 values are all in or all out
    const float4 q = row_ok && k < k_end ? *reinterpret_cast<const float4*>(p + k) : make_float4(0.f, 0.f, 0.f, 0.f);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = row_ok && k + i < k_end ? p[k + i] : 0.f;
  }
}

// grid: (row tiles x output tiles of a group, splits, groups). kVec: A's and B's rows are
// 16-byte aligned (kg and lda multiples of 4, aligned pointers).
template <bool kVec, bool kRowsFastest>
__global__ void __launch_bounds__(cuda::kThreads) deform_conv2d_split_k_gemm_kernel(
    const float* __restrict__ a, const float* __restrict__ b, SplitKShape s, float* __restrict__ part) {
  constexpr int T = kSplitKTile, S = kSplitKStep, LD = T + 4;  // LD: 16-byte rows of shared memory
  __shared__ __align__(16) float as[2][S][LD];
  __shared__ __align__(16) float bs[2][S][LD];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int64_t grp = blockIdx.z, split = blockIdx.y;
  const int64_t r0 = (blockIdx.x % s.row_tiles) * T, n0 = (blockIdx.x / s.row_tiles) * T;
  const int64_t k_begin = split * s.per_split, k_end = std::min(s.kg, k_begin + s.per_split);
  // Loads: a thread takes 4 consecutive values of the reduction of one row of A and of B.
  const int lr = tid / 4, lk = (tid % 4) * 4;
  const bool a_ok = r0 + lr < s.rows, b_ok = n0 + lr < s.cg;
  const float* pa = a + grp * s.kg + (a_ok ? (r0 + lr) * s.lda : 0);
  const float* pb = b + (grp * s.cg + (b_ok ? n0 + lr : 0)) * s.kg;
  float ra[4], rb[4];
  float acc[4][4] = {};
  split_k_load<kVec>(ra, pa, a_ok, k_begin + lk, k_end);
  split_k_load<kVec>(rb, pb, b_ok, k_begin + lk, k_end);
  int buf = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    as[0][lk + i][lr] = ra[i];
    bs[0][lk + i][lr] = rb[i];
  }
  __syncthreads();
  for (int64_t k0 = k_begin; k0 < k_end; k0 += S) {
    const bool more = k0 + S < k_end;
    if (more) {  // the next step's loads in flight during this step's products
      split_k_load<kVec>(ra, pa, a_ok, k0 + S + lk, k_end);
      split_k_load<kVec>(rb, pb, b_ok, k0 + S + lk, k_end);
    }
#pragma unroll
    for (int kk = 0; kk < S; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&as[buf][kk][ty * 4]);
      const float4 bv = *reinterpret_cast<const float4*>(&bs[buf][kk][tx * 4]);
      const float x[4] = {av.x, av.y, av.z, av.w}, y[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(x[i], y[j], acc[i][j]);
      }
    }
    if (more) {  // the other buffer was last read before the previous step's barrier
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        as[buf ^ 1][lk + i][lr] = ra[i];
        bs[buf ^ 1][lk + i][lr] = rb[i];
      }
    }
    __syncthreads();
    buf ^= 1;
  }
  const int64_t r = r0 + ty * 4, n = n0 + tx * 4;
  const int64_t first = (split * s.groups + grp) * (kRowsFastest ? s.cg : s.rows);
  if (kRowsFastest) {  // a row of 4 pixels per output channel; rows past s.rows but within the pad are zeros
    if (r >= s.part_ld) return;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (n + j < s.cg) {
        *reinterpret_cast<float4*>(part + (first + n + j) * s.part_ld + r) =
            make_float4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
      }
    }
  } else {  // a row of 4 output channels per pixel
    if (n >= s.part_ld) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (r + i < s.rows) {
        *reinterpret_cast<float4*>(part + (first + r + i) * s.part_ld + n) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      }
    }
  }
}

struct SplitKSum {
  int64_t splits, split_stride, rows, out_channels, cg, part_ld, pixels, run;  // run: a chunk's pixels per image
  int64_t first;  // NCHW: the chunk's first image x out_channels x pixels + p0; channels-last: its first row
  int64_t total;  // rows x out_channels
};

// out = bias + the splits' partial products, added in split order. kRowsFastest: NCHW output,
// adjacent threads on adjacent pixels; else channels-last, on adjacent channels.
template <bool kRowsFastest>
__global__ void deform_conv2d_split_k_sum_kernel(
    const float* __restrict__ part, const float* __restrict__ bias, SplitKSum s, float* __restrict__ out) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < s.total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = kRowsFastest ? idx / s.rows : idx % s.out_channels;
    const int64_t r = kRowsFastest ? idx % s.rows : idx / s.out_channels;
    const int64_t src = kRowsFastest ? n * s.part_ld + r : ((n / s.cg) * s.rows + r) * s.part_ld + n % s.cg;
    float v = bias ? bias[n] : 0.f;
    for (int64_t k = 0; k < s.splits; ++k) v += part[k * s.split_stride + src];
    if (kRowsFastest) {
      out[s.first + ((r / s.run) * s.out_channels + n) * s.pixels + r % s.run] = v;
    } else {
      out[(s.first + r) * s.out_channels + n] = v;
    }
  }
}

// Whether a grouped layer's columns GEMMs (rows x Kg x C_out / groups per group, over chunks of
// whole images) run the split-K GEMM, all groups in one launch: IEEE float32 layers where a GEMM
// per group would run (gemm_per_group: cuBLAS's tiles fill at most half of the SMs) and a group's
// GEMM is at most kSplitKMaxWork multiply-adds. Forwards on an H100, per-group cuBLAS / split-K:
// 1.21 to 1.56 at such layers (1x1024x7x7 -> 1024 in 2 groups 78 -> 60 us, in 4 groups of 512
// 134 -> 93). Not taken with one group: cuBLAS / split-K 0.64 to 0.96 at batch-1 NCHW layers of
// 49 to 1024 pixels (1x256x14x14 -> 256 41 -> 50 us), 1.11 to 1.27 at a few channels_last or
// 9-pixel ones; nor with TF32 (0.49 to 0.69)
// (benchmarks/results/deform_conv2d_ab_split_k_NVIDIA_H100_2026-12-07.md). Test hook:
// CUSTOMOPS_TEST_DEFORM_SPLIT_K=1 or =0 forces it on (float32, any matmul precision, any groups) or off.
template <typename T>
bool split_k_forward(const DeformConv2dGeometry& g, int64_t rows) {
  if (!std::is_same_v<T, float>) return false;
  if (const int forced = env_override("CUSTOMOPS_TEST_DEFORM_SPLIT_K", "1", "0")) return forced > 0;
  const int64_t kg = g.in_per_group() * g.taps();
  return g.groups > 1 && rows * kg * g.out_per_group() <= kSplitKMaxWork && gemm_per_group<T>(g, rows, kg);
}

// A chunk's output (and bias) from its columns (gcol, in the order of o.w) by the split-K GEMM:
// slices of the reduction enough for kSplitKBlocksPerSm blocks an SM, at least a step each.
void split_k_gemm(
    const CudaOperands& o, const DeformConv2dGeometry& g, const Chunk& ch, const at::Tensor& gcol,
    const at::Tensor& bias, at::Tensor& out) {
  const bool nhwc = channels_last_output(out);
  const int64_t rows = ch.rows(), K = g.in_channels * g.taps(), kg = K / g.groups, cg = g.out_per_group();
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  SplitKShape s{rows, K, kg, cg, g.groups, 0, ceil_div(rows, kSplitKTile), ceil_div(nhwc ? cg : rows, 4) * 4};
  const int64_t tiles = s.row_tiles * ceil_div(cg, kSplitKTile) * g.groups, steps = ceil_div(kg, kSplitKStep);
  TORCH_CHECK(
      s.row_tiles * ceil_div(cg, kSplitKTile) <= std::numeric_limits<int32_t>::max() && g.groups <= 65535,
      "customops: deform_conv2d's split-K GEMM got ", int_str(rows), " rows and ", int_str(g.groups), " groups");
  const int64_t want =
      std::clamp<int64_t>(ceil_div(kSplitKBlocksPerSm * sms, tiles), 1, std::min<int64_t>(steps, 65535));
  s.per_split = ceil_div(steps, want) * kSplitKStep;
  const int64_t splits = ceil_div(kg, s.per_split), stride = g.groups * (nhwc ? rows : cg) * s.part_ld;
  at::Tensor part = at::empty({splits * stride}, out.options().memory_format(at::MemoryFormat::Contiguous));
  const float* a = gcol.const_data_ptr<float>();
  const float* w = o.w.const_data_ptr<float>();
  const bool vec = kg % 4 == 0 && K % 4 == 0 && cuda::is_aligned(a, 16) && cuda::is_aligned(w, 16);
  const dim3 grid(
      static_cast<unsigned>(s.row_tiles * ceil_div(cg, kSplitKTile)), static_cast<unsigned>(splits),
      static_cast<unsigned>(g.groups));
  const int threads = cuda::block_size("deform_conv2d_split_k_gemm_kernel");
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto launch = [&](auto kernel) {
    kernel<<<grid, threads, 0, stream>>>(a, w, s, part.data_ptr<float>());
    CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_split_k_gemm_kernel");
  };
  if (vec) {
    nhwc ? launch(deform_conv2d_split_k_gemm_kernel<true, false>)
         : launch(deform_conv2d_split_k_gemm_kernel<true, true>);
  } else {
    nhwc ? launch(deform_conv2d_split_k_gemm_kernel<false, false>)
         : launch(deform_conv2d_split_k_gemm_kernel<false, true>);
  }
  const int64_t P = g.out_pixels();
  const SplitKSum sum{
      splits,
      stride,
      rows,
      g.out_channels,
      cg,
      s.part_ld,
      P,
      ch.n,
      nhwc ? ch.b0 * P + ch.p0 : ch.b0 * g.out_channels * P + ch.p0,
      rows * g.out_channels};
  const float* b = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  if (nhwc) {
    DEFORM_CONV2D_LAUNCH(
        "deform_conv2d_split_k_sum_kernel", deform_conv2d_split_k_sum_kernel<false>, sum.total,
        part.const_data_ptr<float>(), b, sum, out.data_ptr<float>());
  } else {
    DEFORM_CONV2D_LAUNCH(
        "deform_conv2d_split_k_sum_kernel", deform_conv2d_split_k_sum_kernel<true>, sum.total,
        part.const_data_ptr<float>(), b, sum, out.data_ptr<float>());
  }
}

// Whether a layer of one group whose GEMM takes the weight in its own order (weight_order) runs
// torchvision's orientation: the columns reordered to (in_channels x taps, pixels) per image and
// weight x columns straight into the NCHW output, where cuBLAS picks other kernels than for
// columns x weight^T. Taken for one image in IEEE float32: forwards 1.01 to 1.16x as fast on an
// H100 (1x512x7x7 -> 512 48 -> 42 us, 1x1024x14x14 -> 1024 152 -> 135; torchvision's 45 and 137);
// TF32 0.90 to 1.01, float16 0.66 to 0.79, and several images (a reorder and a GEMM per image)
// 0.30 to 0.49 in every dtype (benchmarks/results/deform_conv2d_ab_nn_gemm_NVIDIA_H100_2026-12-07.md).
// Test hook: CUSTOMOPS_TEST_DEFORM_NN_GEMM=1 or =0 forces it on (any dtype and batch) or off.
template <typename T>
bool nn_gemm(const DeformConv2dGeometry& g) {
  if (const int forced = env_override("CUSTOMOPS_TEST_DEFORM_NN_GEMM", "1", "0")) return forced > 0;
  return std::is_same_v<T, float> && !cuda::matmul_allows_tf32() && g.batch == 1;
}

template <typename T>
void forward_impl(
    const DeformConv2dGeometry& g, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& mask, bool direct, at::Tensor& out) {
  const CudaOperands o(g, input, offset, weight, mask, direct, !direct && weight_order(g));
  const bool nhwc = channels_last_output(out);
  if (g.in_per_group() == 1 && g.out_per_group() == 1) {
    const at::Tensor xs = o.images<T>({0, g.batch, 0, g.out_pixels()});
    const at::Tensor wt = depthwise_taps_weight(weight.reshape({g.in_channels, g.taps()}));
    const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
    if (!depthwise_direct_forced() && launch_depthwise_tiled<T>(g, o, xs, wt, b, out)) return;
    const int v = vector_width<T>(g.in_per_offset_group(), cuda::is_aligned(xs.const_data_ptr<T>(), 16));
    const int64_t total = g.batch * g.out_pixels() * (g.in_channels / v);
    with_vector_width<T>(v, [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      const auto kernel = deform_conv2d_depthwise_kernel<T, V>;
      DEFORM_CONV2D_LAUNCH(
          "deform_conv2d_depthwise_kernel", kernel, total, xs.const_data_ptr<T>(), o.off.const_data_ptr<T>(),
          o.mask_ptr<T>(), wt.const_data_ptr<T>(), b.defined() ? b.const_data_ptr<T>() : nullptr, g, nhwc,
          out.data_ptr<T>());
    });
    return;
  }
  if (direct) {  // the images' channels-last copies in chunks of kChunkBudget (or of one image)
    const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
    const int64_t image_bytes = o.image_copy_bytes(g);
    const int64_t nb = image_bytes == 0 ? g.batch : std::clamp<int64_t>(kChunkBudget / image_bytes, 1, g.batch);
    for (int64_t b0 = 0; b0 < g.batch; b0 += nb) {
      const Chunk ch{b0, std::min(nb, g.batch - b0), 0, g.out_pixels()};
      launch_direct<T>(g, o, ch, o.images<T>(ch), b, out);
    }
    return;
  }
  const int64_t K = g.in_channels * g.taps(), P = g.out_pixels();
  // The budget counts what grows with the GEMM's rows (columns, rows-major output); the
  // images' channels-last copies come on top, so that they do not shrink the GEMM (IEEE
  // float32 GEMMs ran at 37 to 47 TFLOP/s over 3 images of 1050 pixels, 52 over 4).
  std::vector<Chunk> chunks = plan_chunks(g, K * sizeof(T), 0);
  if constexpr (std::is_same_v<T, float>) {
    const std::vector<Chunk> images = plan_chunks(g, K * sizeof(T), 0, true);  // of whole images, any groups
    const int64_t most = std::max_element(images.begin(), images.end(), [](const Chunk& x, const Chunk& y) {
                           return x.rows() < y.rows();
                         })->rows();
    if (split_k_forward<T>(g, most)) {
      const auto opts = input.options().memory_format(at::MemoryFormat::Contiguous);
      at::Tensor col = at::empty({K * most}, opts), xs;
      at::Tensor gcol = o.in_weight_order ? at::empty({K * most}, opts) : col;
      const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
      for (const Chunk& ch : images) {
        if (ch.p0 == 0) xs = o.images<T>(ch);
        gemm_columns<T>(o, g, ch, xs, col, gcol);
        split_k_gemm(o, g, ch, gcol, b, out);
      }
      return;
    }
  }
  // One group: one GEMM over the chunk's rows, (rows, K) x (K, C_out), into a rows-major
  // (pixels, out_channels) buffer that the transpose kernel moves into the NCHW output, adding
  // the bias. Straight into NCHW (a GEMM per image, batched) the output rows are P values
  // long, and where they are not 16-byte aligned cuBLAS falls back to slower kernels (H200,
  // 512 x 4608 x 1050 per image, float16, 4 images: 144 us batched into NCHW, 33 us
  // rows-major); its batched float32 GEMMs also ran up to 1.6x slower than one GEMM over the
  // images. Straight into NCHW, saving the output's round trip, stay: aligned rows in 16-bit
  // types or in chunks of one image, and grouped layers where grouped_gemm says so (a GEMM per
  // image batched over the groups). Several groups otherwise go the same way, one GEMM batched
  // over the groups. A channels_last output is the rows-major result itself: the GEMMs write
  // straight into it, the bias prefilled as their C operand (with cuBLASLt's bias epilogue,
  // at::addmm_out with a 1-D bias, float32 layers ran up to 1.7x slower on the H200); several
  // groups always batch over the groups into it, which saves the transpose that their GEMMs
  // per image would need.
  if (g.groups == 1 && o.in_weight_order && !nhwc && nn_gemm<T>(g)) {
    // torchvision's orientation: each image's columns reordered to (in_channels x taps, pixels),
    // then weight x columns straight into the output, the bias prefilled as C.
    int64_t most = 0;
    for (const Chunk& ch : chunks) most = std::max(most, ch.rows());
    const auto opts = input.options().memory_format(at::MemoryFormat::Contiguous);
    at::Tensor col = at::empty({K * most}, opts), kcol = at::empty({K * most}, opts), xs;
    if (bias.has_value()) fill_bias<T>(out, *bias);
    const int64_t taps = g.taps(), C = g.in_channels;
    for (const Chunk& ch : chunks) {
      if (ch.p0 == 0) xs = o.images<T>(ch);
      launch_im2col<T>(o, g, ch, xs, col);
      for (int64_t b = 0; b < ch.nb; ++b) {  // (n, taps, C) -> (C, taps, n), a batch over the taps
        transpose_into<T, T>(
            col.const_data_ptr<T>() + b * ch.n * K, kcol.data_ptr<T>() + b * K * ch.n,
            TransposeShape{taps, ch.n, C, taps * C, C, taps * ch.n, ch.n});
      }
      const int64_t first = ch.b0 * g.out_channels * P + ch.p0;
      at::Tensor dst = ch.nb == 1 ? strided(out, first, {g.out_channels, ch.n}, {P, 1})
                                  : strided(out, first, {ch.nb, g.out_channels, ch.n}, {g.out_channels * P, P, 1});
      const at::Tensor w = ch.nb == 1 ? strided(o.w, 0, {g.out_channels, K}, {K, 1})
                                      : strided(o.w, 0, {ch.nb, g.out_channels, K}, {0, K, 1});
      const at::Tensor c =
          ch.nb == 1 ? strided(kcol, 0, {K, ch.n}, {ch.n, 1}) : strided(kcol, 0, {ch.nb, K, ch.n}, {K * ch.n, ch.n, 1});
      matmul_into(dst, w, c, bias.has_value());
    }
    return;
  }
  const bool aligned = P * sizeof(T) % 16 == 0;
  const bool one_image = std::all_of(chunks.begin(), chunks.end(), [](const Chunk& ch) { return ch.nb == 1; });
  const bool batched_groups = g.groups > 1 && (nhwc || grouped_gemm(g, aligned));
  const bool rows_major = nhwc || batched_groups || (g.groups == 1 && !(aligned && (sizeof(T) == 2 || one_image)));
  if (rows_major) chunks = plan_chunks(g, (K + (nhwc ? 0 : g.out_channels)) * sizeof(T), 0, batched_groups);
  int64_t max_rows = 0;
  for (const Chunk& ch : chunks) max_rows = std::max(max_rows, ch.rows());
  const auto opts = input.options().memory_format(at::MemoryFormat::Contiguous);
  // A chunk's columns, as im2col writes them and, where the weight stays in its order, reordered
  // to it for the GEMMs (gcol).
  at::Tensor col = at::empty({K * max_rows}, opts);
  at::Tensor gcol = o.in_weight_order ? at::empty({K * max_rows}, opts) : col;
  at::Tensor xs;
  // A chunk's columns are (rows, groups, Kg) and the weight (groups, C_out / groups, Kg).
  const int64_t Kg = K / g.groups, Cg = g.out_per_group();
  if (rows_major) {
    at::Tensor buf;
    if (!nhwc) buf = at::empty({max_rows, g.out_channels}, opts);
    const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
    // 16-bit, one group, into the output: cuBLASLt's bias epilogue (at::addmm_out with a 1-D
    // bias) where every chunk's output fills a wave of 128 x 128 tiles. There it saved the bias
    // pass and the C operand's read (H100, channels_last forwards 1.05 to 1.17x as fast at batch
    // 8); on smaller outputs, where cuBLAS splits K, it lost (ASPP 7x7 at batch 8, 0.87x).
    const int64_t min_rows = std::min_element(chunks.begin(), chunks.end(), [](const Chunk& x, const Chunk& y) {
                               return x.rows() < y.rows();
                             })->rows();
    const bool bias_epilogue = nhwc && b.defined() && g.groups == 1 && sizeof(T) == 2 &&
                               ceil_div(min_rows, 128) * ceil_div(g.out_channels, 128) >=
                                   at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    if (nhwc && b.defined() && !bias_epilogue) fill_bias<T>(out, b);
    // (K, C_out), or per group (G, Kg, C_out / G)
    const at::Tensor wt = g.groups == 1 ? strided(o.w, 0, {K, g.out_channels}, {1, K})
                                        : strided(o.w, 0, {g.groups, Kg, Cg}, {Cg * Kg, 1, Kg});
    for (const Chunk& ch : chunks) {
      if (ch.p0 == 0) xs = o.images<T>(ch);
      gemm_columns<T>(o, g, ch, xs, col, gcol);
      const int64_t rows = ch.rows();
      // The chunk's rows: of the output itself, or of the buffer.
      at::Tensor& rows_of = nhwc ? out : buf;
      const int64_t first = nhwc ? (ch.b0 * P + ch.p0) * g.out_channels : 0;
      at::Tensor dst = strided(rows_of, first, {rows, g.out_channels}, {g.out_channels, 1});
      if (bias_epilogue) {
        at::cuda::addmm_out(dst, b, strided(gcol, 0, {rows, K}, {K, 1}), wt);
      } else if (g.groups == 1) {
        matmul_into(dst, strided(gcol, 0, {rows, K}, {K, 1}), wt, nhwc && b.defined());
      } else if (gemm_per_group<T>(g, rows, Kg)) {
        for (int64_t gc = 0; gc < g.groups; ++gc) {
          at::Tensor dst_g = strided(rows_of, first + gc * Cg, {rows, Cg}, {g.out_channels, 1});
          matmul_into(dst_g, strided(gcol, gc * Kg, {rows, Kg}, {K, 1}), wt[gc], nhwc && b.defined());
        }
      } else {  // (G, rows, Kg) x (G, Kg, C_out / G) into the groups' columns of the rows
        at::Tensor dst_g = strided(rows_of, first, {g.groups, rows, Cg}, {Cg, g.out_channels, 1});
        matmul_into(dst_g, strided(gcol, 0, {g.groups, rows, Kg}, {Kg, K, 1}), wt, nhwc && b.defined());
      }
      if (nhwc) continue;
      transpose_into<T, T>(
          dst.const_data_ptr<T>(), out.data_ptr<T>() + ch.b0 * g.out_channels * P + ch.p0,
          TransposeShape{ch.nb, ch.n, g.out_channels, g.out_channels, ch.n * g.out_channels, P, g.out_channels * P},
          b.defined() ? b.const_data_ptr<T>() : nullptr);
    }
    return;
  }
  // The bias is the GEMMs' C operand (beta = 1) instead of a pass over the output after them.
  if (bias.has_value()) fill_bias<T>(out, *bias);
  for (const Chunk& ch : chunks) {
    if (ch.p0 == 0) xs = o.images<T>(ch);
    gemm_columns<T>(o, g, ch, xs, col, gcol);
    const int64_t first = ch.b0 * g.out_channels * P + ch.p0;
    if (g.groups == 1) {  // over the chunk's images: (nb, C_out, K) x (nb, K, n)
      at::Tensor dst = strided(out, first, {ch.nb, g.out_channels, ch.n}, {g.out_channels * P, P, 1});
      matmul_into(
          dst, strided(o.w, 0, {ch.nb, g.out_channels, K}, {0, K, 1}),
          strided(gcol, 0, {ch.nb, K, ch.n}, {ch.n * K, 1, K}), bias.has_value());
    } else if (gemm_per_group<T>(g, ch.n, Kg)) {
      for (int64_t gc = 0; gc < g.groups; ++gc) {
        at::Tensor dst = strided(out, first + gc * Cg * P, {Cg, ch.n}, {P, 1});
        matmul_into(dst, o.w[gc], strided(gcol, gc * Kg, {Kg, ch.n}, {1, K}), bias.has_value());
      }
    } else {  // over the groups of one image: (G, C_out / G, Kg) x (G, Kg, n)
      at::Tensor dst = strided(out, first, {g.groups, Cg, ch.n}, {Cg * P, P, 1});
      matmul_into(dst, o.w, strided(gcol, 0, {g.groups, Kg, ch.n}, {Kg, 1, K}), bias.has_value());
    }
  }
}

at::Tensor deform_conv2d_cuda(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const c10::optional<at::Tensor>& mask) {
  const DeformConv2dGeometry g = check_deform_conv2d_args(input, offset, weight, bias, stride, padding, dilation, mask);
  const c10::cuda::CUDAGuard device_guard(input.device());
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Tensor out = at::empty(
      {g.batch, g.out_channels, g.out_h, g.out_w}, input.options().memory_format(deform_conv2d_output_format(input)));
  if (out.numel() == 0) return out;
  const bool depthwise = g.in_per_group() == 1 && g.out_per_group() == 1;
  const bool direct = !depthwise && direct_forward(g, input.scalar_type());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "deform_conv2d_cuda", [&] {
    forward_impl<scalar_t>(g, input, offset, weight, bias, mask, direct, out);
  });
  return out;
}

// Accumulators of the requested gradients, in opmath: offset, mask (their shapes), weight (the
// columns' order) and a chunk's grad_input (gx, channels-last); bias, summed from the chunks'
// grad_out rows where bias_from_rows.
struct BackwardBuffers {
  at::Tensor goff, gw, gmask, gb, gx;
  bool bias_from_rows = false;

  // All of them zero. The temporaries (all but float32's and float64's offset and mask
  // gradients, which are the outputs themselves) share one allocation and one fill: a batch-1
  // backward is bound by its host work, of which each allocation and launch is a part.
  void allocate(
      const DeformConv2dGeometry& g, const at::Tensor& offset, const at::Tensor& mask, std::array<bool, 5> want,
      std::vector<int64_t> gx_sizes = {}) {
    const auto dt = offset.scalar_type(), acc_t = dt == at::kDouble ? at::kDouble : at::kFloat;
    const auto opts = offset.options().dtype(acc_t);
    std::vector<std::pair<at::Tensor*, std::vector<int64_t>>> temps;
    const auto add = [&](at::Tensor& t, std::vector<int64_t> sizes, bool output) {
      if (output) {
        t = at::zeros(sizes, opts);
      } else {
        temps.emplace_back(&t, std::move(sizes));
      }
    };
    if (want[1]) add(goff, offset.sizes().vec(), dt == acc_t);
    if (want[4]) add(gmask, mask.sizes().vec(), dt == acc_t);
    if (want[2]) add(gw, {g.groups, g.out_per_group(), g.taps() * g.in_per_group()}, false);
    if (want[0] && !gx_sizes.empty()) add(gx, std::move(gx_sizes), false);
    if (temps.empty()) return;
    // Parts 64 bytes apart or more (the kernels' vector atomics need 16-byte alignment).
    const auto padded = [](int64_t n) { return ceil_div(n, 16) * 16; };
    int64_t total = 0;
    for (const auto& part : temps) total += padded(c10::multiply_integers(part.second));
    const at::Tensor buf = at::zeros({total}, opts);
    int64_t first = 0;
    for (const auto& [t, sizes] : temps) {
      const int64_t n = c10::multiply_integers(sizes);
      *t = buf.narrow(0, first, n).view(sizes);
      first += padded(n);
    }
  }
};

// grad_input's images of the chunk (NCHW contiguous) from its channels-last accumulator.
template <typename T>
void write_grad_input(const at::Tensor& gx_buf, const Chunk& ch, at::Tensor& grad_input) {
  const int64_t C = grad_input.size(1), HW = grad_input.size(2) * grad_input.size(3);
  transpose_into<at::opmath_type<T>, T>(
      gx_buf.const_data_ptr<at::opmath_type<T>>(), grad_input.narrow(0, ch.b0, ch.nb).data_ptr<T>(), ch.nb, HW, C);
}

// Depthwise: no columns and no GEMM; the backward kernel reads grad_out (channels-last) and
// the weight, and sums grad_weight itself. Chunks of whole images (kDepthwiseChunkBudget)
// bound the copies.
template <typename T>
void depthwise_backward_impl(
    const DeformConv2dGeometry& g, const at::Tensor& grad_out, const CudaOperands& o, std::array<bool, 5> want,
    at::Tensor& grad_input, BackwardBuffers& acc) {
  using A = at::opmath_type<T>;
  const int64_t C = g.in_channels, plane = g.height * g.width;
  const int64_t gx_bytes = want[0] ? C * plane * int64_t(sizeof(A)) : 0;
  const int64_t image_bytes = std::max<int64_t>(1, gx_bytes + o.image_copy_bytes(g) + C * g.out_pixels() * sizeof(T));
  const int64_t nb = std::max<int64_t>(1, std::min(g.batch, kDepthwiseChunkBudget / image_bytes));
  const at::Tensor wt = depthwise_taps_weight(o.w.view({C, g.taps()}));
  acc.allocate(g, o.off, o.msk, want, {nb, g.height, g.width, C});
  const at::Tensor& gx_buf = acc.gx;
  for (int64_t b0 = 0; b0 < g.batch; b0 += nb) {
    const Chunk ch{b0, std::min(nb, g.batch - b0), 0, g.out_pixels()};
    const at::Tensor xs = o.images<T>(ch);
    const at::Tensor go = channels_last_copy<T>(grad_out.narrow(0, ch.b0, ch.nb));
    if (want[0] && b0 > 0) gx_buf.narrow(0, 0, ch.nb).zero_();  // the first chunk's is allocated zero
    const bool aligned = cuda::is_aligned(xs.const_data_ptr<T>(), 16) && cuda::is_aligned(go.const_data_ptr<T>(), 16);
    const int v = vector_width<T>(g.in_per_offset_group(), aligned, col2im_max_bytes<T>());
    launch_col2im<T, true>(
        tile_layout(g, ch, v), v, go.const_data_ptr<T>(), wt.const_data_ptr<T>(), xs.const_data_ptr<T>(), o,
        want[0] ? gx_buf.data_ptr<A>() : nullptr, want[1] ? acc.goff.data_ptr<A>() : nullptr,
        want[4] ? acc.gmask.data_ptr<A>() : nullptr, want[2] ? acc.gw.data_ptr<A>() : nullptr);
    if (want[0]) write_grad_input<T>(gx_buf, ch, grad_input);
  }
}

template <typename T>
void backward_impl(
    const DeformConv2dGeometry& g, const at::Tensor& grad_out, const CudaOperands& o, std::array<bool, 5> want,
    at::Tensor& grad_input, BackwardBuffers& acc) {
  using A = at::opmath_type<T>;
  if (g.in_per_group() == 1 && g.out_per_group() == 1)
    return depthwise_backward_impl<T>(g, grad_out, o, want, grad_input, acc);
  const int64_t K = g.in_channels * g.taps(), P = g.out_pixels();
  const int64_t gx_image_bytes = want[0] ? g.in_channels * g.height * g.width * int64_t(sizeof(A)) : 0;
  // Several groups take chunks of whole images too, as one group does (a GEMM per chunk,
  // batched over the groups), unless CUSTOMOPS_TEST_DEFORM_GROUPED_GEMM=0 asks for a GEMM per
  // image: a chunk per image costs launches and host work per image (8 images of 7x7 in 2
  // groups: 688 us per TF32 forward + backward against torchvision's 539, H100,
  // benchmarks/results/deform_conv2d_NVIDIA_H100_80GB_HBM3_2026-12-06_sweep_seed1.md). A/B, H100
  // (deform_conv2d_ab_grouped_backward_weight_order_NVIDIA_H100_2026-12-06.md), forwards +
  // backwards of grouped layers of several images a chunk 1.03 to 7.3x as fast (16x256x14x14 in
  // 32 groups 969 -> 265 us in float32), the same code where a chunk holds one image.
  // A chunk of several images, or of a channels_last grad_out, copies grad_out's rows, C_out
  // values a pixel: where those outnumber the columns' K (a wide 1x1 layer), the budget bounds
  // the copy instead.
  const bool group_images = g.groups > 1 && grouped_gemm_override() >= 0;
  const int64_t row_values = std::max(K, g.out_channels);
  const std::vector<Chunk> chunks =
      plan_chunks(g, row_values * sizeof(T), gx_image_bytes + o.image_copy_bytes(g), group_images);
  int64_t max_rows = 0, max_images = 1;
  for (const Chunk& ch : chunks) {
    max_rows = std::max(max_rows, ch.rows());
    max_images = std::max(max_images, ch.nb);
  }
  const auto opts = o.off.options();
  // Each chunk's grad_out as (C_out, rows), the GEMMs' operand, copied out of grad_out by the
  // transpose kernel where it is channels_last (a channels_last output's, usually: no NCHW copy
  // of it), a view where it is one NCHW image's rows (16-byte aligned with one group: cuBLAS's
  // faster kernels need aligned rows), else by a copy. The bias's gradient is then summed over
  // these rows, a reduction along the inner dimension (torch's over dimensions 0, 2 and 3 took
  // 19 us at 8x256x64x64 float16 NCHW, 39 channels_last, on the H200).
  const bool go_nhwc = grad_out.is_contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor go3 = go_nhwc ? at::Tensor() : grad_out.contiguous().view({g.batch, g.out_channels, P});
  const at::Tensor go_pixels =
      go_nhwc ? grad_out.permute({0, 2, 3, 1}).reshape({g.batch * P, g.out_channels}) : at::Tensor();
  // The columns (col2im reads them taps-major) and, where the weight stays in its order, the
  // GEMMs' columns in that order (gcol), both ways.
  at::Tensor col = at::empty({K * max_rows}, opts);
  at::Tensor gcol = o.in_weight_order ? at::empty({K * max_rows}, opts) : col;
  at::Tensor go_rows;  // grad_out of the chunk as (C_out, rows), where not a view
  const auto rows_buffer = [&](int64_t rows) {
    if (!go_rows.defined()) go_rows = at::empty({g.out_channels * max_rows}, opts);
    return go_rows.narrow(0, 0, g.out_channels * rows);
  };
  acc.allocate(g, o.off, o.msk, want, {max_images, g.height, g.width, g.in_channels});
  const at::Tensor& gx_buf = acc.gx;  // the chunk's grad_input, channels-last
  at::Tensor xs;
  for (const Chunk& ch : chunks) {
    const bool first = &ch == &chunks.front();
    if (ch.p0 == 0) {
      xs = o.images<T>(ch);
      if (want[0] && !first) gx_buf.narrow(0, 0, ch.nb).zero_();  // the first chunk's is allocated zero
    }
    const int64_t rows = ch.rows();
    at::Tensor gor;
    if (go_nhwc) {
      gor = rows_buffer(rows).view({g.out_channels, rows});
      transpose_into<T, T>(
          go_pixels.narrow(0, ch.b0 * P + ch.p0, rows).const_data_ptr<T>(), gor.data_ptr<T>(), 1, rows, g.out_channels);
    } else {
      const at::Tensor src = go3.narrow(0, ch.b0, ch.nb).narrow(2, ch.p0, ch.n);  // (nb, C_out, n)
      const bool aligned = cuda::is_aligned(src.const_data_ptr<T>(), 16) && P * sizeof(T) % 16 == 0;
      if (ch.nb == 1 && (g.groups > 1 || aligned)) {
        gor = src[0];
      } else {
        gor = rows_buffer(rows).view({g.out_channels, ch.nb, ch.n});
        gor.copy_(src.permute({1, 0, 2}));
        gor = gor.view({g.out_channels, rows});
      }
    }
    if (acc.bias_from_rows) {  // in the output's dtype where one chunk has all the rows
      const at::ScalarType t =
          chunks.size() == 1 ? c10::CppTypeToScalarType<T>::value : c10::CppTypeToScalarType<A>::value;
      at::Tensor s = at::cuda::sum(gor, at::IntArrayRef{1}, false, t);
      acc.gb = first ? s : acc.gb.add_(s);
    }
    // The GEMMs: grad_weight += grad_out x columns; grad columns = grad_out^T x weight, per group.
    const int64_t Kg = K / g.groups, Cg = g.out_per_group();
    if (g.groups == 1) {
      const at::Tensor cols = strided(gcol, 0, {rows, K}, {K, 1});
      if (want[2]) {
        gemm_columns<T>(o, g, ch, xs, col, gcol);
        at::Tensor gw = strided(acc.gw, 0, {g.out_channels, K}, {K, 1});
        accumulate_into(gw, gor, cols, first);
      }
      if (!(want[0] || want[1] || want[4])) continue;
      at::Tensor dst = cols;
      matmul_into(
          dst, strided(gor, 0, {rows, g.out_channels}, {1, gor.stride(0)}),
          strided(o.w, 0, {g.out_channels, K}, {K, 1}), false);
    } else {  // (G, C_out / G, rows) x (G, rows, Kg); (G, rows, C_out / G) x (G, C_out / G, Kg)
      const int64_t ld = gor.stride(0);
      const at::Tensor cols = strided(gcol, 0, {g.groups, rows, Kg}, {Kg, K, 1});
      if (want[2]) {
        gemm_columns<T>(o, g, ch, xs, col, gcol);
        const at::Tensor go_g = strided(gor, 0, {g.groups, Cg, rows}, {Cg * ld, ld, 1});
        if (grad_weight_per_group<T>(g, rows)) {
          for (int64_t gc = 0; gc < g.groups; ++gc) {
            at::Tensor gw_g = acc.gw[gc];
            accumulate_into(gw_g, go_g[gc], cols[gc], first);
          }
        } else {
          accumulate_into(acc.gw, go_g, cols, first);
        }
      }
      if (!(want[0] || want[1] || want[4])) continue;
      at::Tensor dst = cols;
      matmul_into(dst, strided(gor, 0, {g.groups, rows, Cg}, {Cg * ld, 1, ld}), o.w, false);
    }
    if (o.in_weight_order) reorder_columns<T>(gcol, col, g, rows, false);
    const int v = chunk_vector_width<T>(g, xs, col2im_max_bytes<T>());
    launch_col2im<T, false>(
        tile_layout(g, ch, v), v, col.const_data_ptr<T>(), nullptr, xs.const_data_ptr<T>(), o,
        want[0] ? gx_buf.data_ptr<A>() : nullptr, want[1] ? acc.goff.data_ptr<A>() : nullptr,
        want[4] ? acc.gmask.data_ptr<A>() : nullptr, nullptr);
    if (want[0] && ch.p0 + ch.n == P) {
      write_grad_input<T>(gx_buf, ch, grad_input);
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& mask, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    std::array<bool, 5> output_mask) {
  const DeformConv2dGeometry g =
      check_deform_conv2d_backward_args(grad_out, input, offset, weight, mask, stride, padding, dilation);
  const c10::cuda::CUDAGuard device_guard(input.device());
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::array<bool, 5> want = output_mask;
  want[4] = want[4] && g.has_mask;
  const auto dt = input.scalar_type();
  const auto opts = input.options();
  const bool work = (want[0] || want[1] || want[2] || want[4]) && g.batch > 0 && g.out_channels > 0;
  // Every image's grad_input is written from its accumulator; with no work it is zero.
  at::Tensor grad_input;
  if (want[0]) grad_input = work ? at::empty(input.sizes(), opts) : at::zeros(input.sizes(), opts);
  BackwardBuffers acc;
  const bool in_weight_order = weight_order(g);  // the GEMMs' order, and so grad_weight's
  acc.bias_from_rows = output_mask[3] && work && g.groups == 1 && !(g.in_per_group() == 1 && g.out_per_group() == 1);
  if (work) {  // the impls allocate acc with their chunks' grad_input accumulator
    const CudaOperands o(g, input, offset, weight, mask, false, in_weight_order);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "deform_conv2d_backward_cuda", [&] {
      backward_impl<scalar_t>(g, grad_out, o, want, grad_input, acc);
    });
  } else {
    acc.allocate(g, offset, mask.has_value() ? *mask : at::Tensor(), want);
  }
  const auto none = [&] { return input.new_empty({0}); };  // one fresh tensor per output, never shared
  at::Tensor grad_weight;
  if (want[2]) {
    grad_weight = at::empty(weight.sizes(), opts);  // from the GEMMs' order
    grad_weight.copy_(
        in_weight_order ? acc.gw.view(weight.sizes())
                        : acc.gw.view({g.out_channels, g.kh, g.kw, g.in_per_group()}).permute({0, 3, 1, 2}));
  }
  return {
      want[0] ? grad_input : none(), want[1] ? acc.goff.to(dt) : none(), want[2] ? grad_weight : none(),
      output_mask[3] ? (acc.gb.defined() ? acc.gb.to(dt) : at::sum(grad_out, at::IntArrayRef{0, 2, 3}, false, dt))
                     : none(),
      want[4] ? acc.gmask.to(dt) : none()};
}

#undef DEFORM_CONV2D_LAUNCH

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("deform_conv2d", &deform_conv2d_cuda);
  m.impl("deform_conv2d_backward", &deform_conv2d_backward_cuda);
}

}  // namespace customops
