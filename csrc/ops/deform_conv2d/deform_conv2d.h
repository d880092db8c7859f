// deform_conv2d: the argument checks, the geometry and the bilinear sampling shared by
// the CPU and CUDA kernels, so that both backends compute the same function.
//
// The deformable convolution of Dai et al., "Deformable Convolutional Networks" (2017),
// modulated as in Zhu et al., "Deformable ConvNets v2" (2019), with
// torchvision.ops.deform_conv2d's semantics. For output pixel (oy, ox), offset group g
// (the channels c with c / (in_channels / offset_groups) = g) and kernel tap (i, j):
//   y = oy * stride_h - pad_h + i * dilation_h + offset[b, 2 * (g * kh * kw + i * kw + j), oy, ox]
//   x = ox * stride_w - pad_w + j * dilation_w + offset[b, 2 * (g * kh * kw + i * kw + j) + 1, oy, ox]
//   sample(c) = mask[b, g * kh * kw + i * kw + j, oy, ox] * bilinear(input[b, c], y, x)
//   out[b, o, oy, ox] = bias[o] + sum over the channels c of o's group and taps (i, j) of
//                       weight[o, c mod (in_channels / groups), i, j] * sample(c)
// bilinear() reads the four pixels around (y, x), each taken as 0 outside the image, with
// the weights (1 - ly)(1 - lx), (1 - ly) lx, ly (1 - lx), ly lx (ly = y - floor(y),
// lx = x - floor(x)); a point with y <= -1, y >= height, x <= -1 or x >= width samples 0.
// Its derivatives in y and x are those of this formula, right-hand at integer positions
// (the weights of the neighbours below and to the right are the ones that move), the border
// lines y = -1 and x = -1 included, as torchvision's: zero offsets with padding put taps
// exactly there, and their offsets get the gradient that moves them into the image. So a point
// on those lines reads its in-image neighbours with weight 0 (an inf or NaN there, or in its
// mask, gives NaN; torchvision's forward returns 0 for the pixel).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/safe_numerics.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "../common/checks.h"

namespace customops {

// A test hook's setting, read per call: 1 where the variable `name` is `on`, -1 where it is
// `off`, 0 where it is unset or anything else.
inline int env_override(const char* name, const char* on, const char* off) {
  const char* v = std::getenv(name);
  if (v == nullptr) return 0;
  if (std::strcmp(v, on) == 0) return 1;
  return std::strcmp(v, off) == 0 ? -1 : 0;
}

// Sizes of one call, after the checks.
struct DeformConv2dGeometry {
  int64_t batch, in_channels, height, width;
  int64_t out_channels, kh, kw;
  int64_t groups, offset_groups;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int64_t out_h, out_w;
  bool has_mask;

  C10_HOST_DEVICE int64_t taps() const {
    return kh * kw;
  }
  C10_HOST_DEVICE int64_t in_per_group() const {
    return in_channels / groups;
  }
  C10_HOST_DEVICE int64_t out_per_group() const {
    return out_channels / groups;
  }
  C10_HOST_DEVICE int64_t in_per_offset_group() const {
    return in_channels / offset_groups;
  }
  C10_HOST_DEVICE int64_t out_pixels() const {
    return out_h * out_w;
  }
};

// Python's floor division, for sizes that may come out negative.
inline int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

constexpr int64_t kMaxDeformConv2dParam = 2147483647;  // customops/ops/deform_conv2d.py too

inline void check_deform_conv2d_pair(at::IntArrayRef v, const char* name, int64_t min, const char* what) {
  TORCH_CHECK(v.size() == 2, "customops: expected ", name, " to be an int or a pair of ints, but got ", shape_str(v));
  TORCH_CHECK(v[0] >= min && v[1] >= min, "customops: expected ", name, " to be ", what, ", but got ", shape_str(v));
  // Bounded so that the output size's arithmetic cannot overflow int64.
  TORCH_CHECK(
      v[0] <= kMaxDeformConv2dParam && v[1] <= kMaxDeformConv2dParam, "customops: expected ", name, " to be at most ",
      int_str(kMaxDeformConv2dParam), ", but got ", shape_str(v));
}

inline void check_deform_conv2d_tensor(const at::Tensor& t, const char* name, const at::Tensor& input) {
  check_floating(t, name);
  check_same_device(t, name, input, "input");
  check_same_dtype(t, name, input, "input");
}

// The checks of deform_conv2d's arguments, in the order the fake kernel
// (customops/ops/deform_conv2d.py) runs its shape checks; returns the geometry.
inline DeformConv2dGeometry check_deform_conv2d_args(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const c10::optional<at::Tensor>& mask) {
  check_floating(input, "input");
  check_deform_conv2d_tensor(offset, "offset", input);
  check_deform_conv2d_tensor(weight, "weight", input);
  if (bias.has_value()) check_deform_conv2d_tensor(*bias, "bias", input);
  if (mask.has_value()) check_deform_conv2d_tensor(*mask, "mask", input);
  check_deform_conv2d_pair(stride, "stride", 1, ">= 1");
  check_deform_conv2d_pair(padding, "padding", 0, ">= 0");
  check_deform_conv2d_pair(dilation, "dilation", 1, ">= 1");
  TORCH_CHECK(
      input.dim() == 4, "customops: expected input to be 4-D (batch, in_channels, height, width), but got shape ",
      shape_str(input.sizes()));
  TORCH_CHECK(
      weight.dim() == 4,
      "customops: expected weight to be 4-D (out_channels, in_channels / groups, kh, kw), but got shape ",
      shape_str(weight.sizes()));
  TORCH_CHECK(
      offset.dim() == 4,
      "customops: expected offset to be 4-D (batch, 2 * offset_groups * kh * kw, out_height, out_width), but got "
      "shape ",
      shape_str(offset.sizes()));
  DeformConv2dGeometry g;
  g.batch = input.size(0);
  g.in_channels = input.size(1);
  g.height = input.size(2);
  g.width = input.size(3);
  g.out_channels = weight.size(0);
  g.kh = weight.size(2);
  g.kw = weight.size(3);
  g.stride_h = stride[0];
  g.stride_w = stride[1];
  g.pad_h = padding[0];
  g.pad_w = padding[1];
  g.dil_h = dilation[0];
  g.dil_w = dilation[1];
  g.has_mask = mask.has_value();
  TORCH_CHECK(
      weight.size(1) > 0 && g.kh > 0 && g.kw > 0,
      "customops: expected weight to have in_channels / groups, kh and kw of at least 1, but got shape ",
      shape_str(weight.sizes()));
  TORCH_CHECK(
      g.in_channels > 0 && g.in_channels % weight.size(1) == 0,
      "customops: expected input.shape[1] (in_channels) to be a positive multiple of weight.shape[1] "
      "(in_channels / groups) = ",
      int_str(weight.size(1)), ", but got input of shape ", shape_str(input.sizes()));
  g.groups = g.in_channels / weight.size(1);
  TORCH_CHECK(
      g.out_channels % g.groups == 0,
      "customops: expected weight.shape[0] (out_channels) to be divisible by groups = ", int_str(g.groups),
      " (in_channels / weight.shape[1]), but got weight of shape ", shape_str(weight.sizes()));
  g.out_h = floor_div(g.height + 2 * g.pad_h - g.dil_h * (g.kh - 1) - 1, g.stride_h) + 1;
  g.out_w = floor_div(g.width + 2 * g.pad_w - g.dil_w * (g.kw - 1) - 1, g.stride_w) + 1;
  TORCH_CHECK(
      g.out_h > 0 && g.out_w > 0, "customops: expected input to be at least as large as the dilated kernel ",
      shape_str({g.dil_h * (g.kh - 1) + 1, g.dil_w * (g.kw - 1) + 1}), " after padding ", shape_str(padding),
      ", but got input of shape ", shape_str(input.sizes()), " (output size ", shape_str({g.out_h, g.out_w}), ")");
  // Expanded (stride-0) arguments can describe an output of more than 2^63 elements.
  const std::array<int64_t, 4> out_sizes = {g.batch, g.out_channels, g.out_h, g.out_w};
  uint64_t out_numel = 0;
  const bool out_overflows = c10::safe_multiplies_u64(out_sizes, &out_numel);
  TORCH_CHECK(
      !out_overflows && out_numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
      "customops: expected input and weight to give an output of fewer than 2^63 elements, but got ",
      "(batch, out_channels, out_height, out_width) = ", shape_str(out_sizes), " from input of shape ",
      shape_str(input.sizes()), " and weight of shape ", shape_str(weight.sizes()));
  const int64_t taps2 = 2 * g.taps();
  TORCH_CHECK(
      offset.size(1) > 0 && offset.size(1) % taps2 == 0,
      "customops: expected offset to have 2 * offset_groups * kh * kw channels, a positive multiple of ",
      int_str(taps2), " (kh = ", int_str(g.kh), ", kw = ", int_str(g.kw), "), but got offset of shape ",
      shape_str(offset.sizes()));
  g.offset_groups = offset.size(1) / taps2;
  TORCH_CHECK(
      g.in_channels % g.offset_groups == 0,
      "customops: expected input.shape[1] (in_channels) to be divisible by offset_groups = ", int_str(g.offset_groups),
      " (offset.shape[1] / (2 * kh * kw)), but got input of shape ", shape_str(input.sizes()));
  const std::array<int64_t, 4> offset_shape = {g.batch, offset.size(1), g.out_h, g.out_w};
  TORCH_CHECK(
      offset.sizes() == at::IntArrayRef(offset_shape), "customops: expected offset to have shape ",
      shape_str(offset_shape), " (batch, 2 * offset_groups * kh * kw, out_height, out_width), but got ",
      shape_str(offset.sizes()));
  if (mask.has_value()) {
    const std::array<int64_t, 4> mask_shape = {g.batch, g.offset_groups * g.taps(), g.out_h, g.out_w};
    TORCH_CHECK(
        mask->sizes() == at::IntArrayRef(mask_shape), "customops: expected mask to have shape ", shape_str(mask_shape),
        " (batch, offset_groups * kh * kw, out_height, out_width; offset_groups = ", int_str(g.offset_groups),
        "), but got ", shape_str(mask->sizes()));
  }
  if (bias.has_value()) {
    TORCH_CHECK(
        bias->dim() == 1 && bias->size(0) == g.out_channels,
        "customops: expected bias to have shape (out_channels,) = (", int_str(g.out_channels), ",), but got shape ",
        shape_str(bias->sizes()));
  }
  return g;
}

// The output's memory format, as conv2d's: the input's suggested one (channels_last for
// channels_last-like strides, a channels_last tensor or a slice of one: a channels_last network
// gets channels_last activations back), else contiguous. Tensor::suggest_memory_format's test
// (is_channels_last_strides_2d), with the batch taken as 1 so that the fake kernel
// (customops/ops/deform_conv2d.py, the same loop) decides a data-dependent batch without a guard;
// an empty batch of channels_last strides gives channels_last, where conv2d gives contiguous.
inline at::MemoryFormat deform_conv2d_output_format(const at::Tensor& input) {
  const auto sizes = input.sizes(), strides = input.strides();
  if (strides[1] == 0) return at::MemoryFormat::Contiguous;
  int64_t lo = 0;
  for (const int d : {1, 3, 2, 0}) {
    const int64_t size = d == 0 ? 1 : sizes[d];
    if (size == 0 || strides[d] < lo || (d == 0 && lo == strides[1])) return at::MemoryFormat::Contiguous;
    lo = strides[d] * size;
  }
  return at::MemoryFormat::ChannelsLast;
}

inline DeformConv2dGeometry check_deform_conv2d_backward_args(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& mask, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  const DeformConv2dGeometry g =
      check_deform_conv2d_args(input, offset, weight, c10::nullopt, stride, padding, dilation, mask);
  check_deform_conv2d_tensor(grad_out, "grad_out", input);
  const std::array<int64_t, 4> out_shape = {g.batch, g.out_channels, g.out_h, g.out_w};
  TORCH_CHECK(
      grad_out.sizes() == at::IntArrayRef(out_shape), "customops: expected grad_out to have the output's shape ",
      shape_str(out_shape), ", but got ", shape_str(grad_out.sizes()));
  return g;
}

// The four pixels bilinear() reads around one sampling point, as offsets into one
// channel's (height, width) plane (-1 for a pixel outside the image, which is never read:
// an inf or NaN elsewhere in the image must not leak in as 0 * inf), with their weights
// (0 outside), and ly, lx.
template <typename T>
struct BilinearTap {
  int64_t idx[4];
  T w[4];
  T ly, lx;
  bool inside;  // -1 <= y < height and -1 <= x < width (on y = -1 or x = -1 a pixel of weight 0 is read)
};

template <typename T>
C10_HOST_DEVICE inline BilinearTap<T> bilinear_tap(T y, T x, int64_t height, int64_t width) {
  BilinearTap<T> t;
  // Written so that NaN lands outside; checked before the floor, so no huge value overflows int64.
  t.inside = y >= T(-1) && y < static_cast<T>(height) && x >= T(-1) && x < static_cast<T>(width);
  if (!t.inside) {
    for (int k = 0; k < 4; ++k) {
      t.idx[k] = -1;
      t.w[k] = T(0);
    }
    t.ly = t.lx = T(0);
    return t;
  }
  const T fy = std::floor(y), fx = std::floor(x);
  const int64_t y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
  t.ly = y - fy;
  t.lx = x - fx;
  const T hy = T(1) - t.ly, hx = T(1) - t.lx;
  const bool top = y0 >= 0, bottom = y0 + 1 < height, left = x0 >= 0, right = x0 + 1 < width;
  const bool ok[4] = {top && left, top && right, bottom && left, bottom && right};
  const int64_t at_[4] = {y0 * width + x0, y0 * width + x0 + 1, (y0 + 1) * width + x0, (y0 + 1) * width + x0 + 1};
  const T w[4] = {hy * hx, hy * t.lx, t.ly * hx, t.ly * t.lx};
  for (int k = 0; k < 4; ++k) {
    t.idx[k] = ok[k] ? at_[k] : -1;
    t.w[k] = ok[k] ? w[k] : T(0);
  }
  return t;
}

// The sampling point of output pixel p = oy * out_w + ox, offset group og and tap
// k = i * kw + j (ok = og * kh * kw + k) of one image, whose offsets (offset_groups, kh * kw,
// 2, out_pixels) and mask (offset_groups, kh * kw, out_pixels; nullptr for none) start at off
// and msk; *m gets the mask. Callers that loop over pixels and taps pass the indices they
// have, so that no integer division is left in the inner loops.
template <typename T>
C10_HOST_DEVICE inline BilinearTap<T> deform_conv2d_tap_at(
    const DeformConv2dGeometry& g, const T* off, const T* msk, int64_t oy, int64_t ox, int64_t p, int64_t i, int64_t j,
    int64_t ok, T* m) {
  const int64_t P = g.out_pixels();
  const T y = static_cast<T>(oy * g.stride_h - g.pad_h + i * g.dil_h) + off[(2 * ok) * P + p];
  const T x = static_cast<T>(ox * g.stride_w - g.pad_w + j * g.dil_w) + off[(2 * ok + 1) * P + p];
  *m = msk ? msk[ok * P + p] : T(1);
  return bilinear_tap(y, x, g.height, g.width);
}

template <typename T>
C10_HOST_DEVICE inline BilinearTap<T> deform_conv2d_tap(
    const DeformConv2dGeometry& g, const T* off, const T* msk, int64_t p, int64_t og, int64_t k, T* m) {
  const int64_t oy = p / g.out_w, i = k / g.kw;
  return deform_conv2d_tap_at(g, off, msk, oy, p - oy * g.out_w, p, i, k - i * g.kw, og * g.taps() + k, m);
}

// d(sample)/dy, d(sample)/dx and d(sample)/dmask of one tap from the dot products
// d[k] = sum over channels of grad_column * pixel k (pixels outside the image: 0).
template <typename T>
C10_HOST_DEVICE inline void bilinear_tap_grads(
    const BilinearTap<T>& t, const T d[4], T m, T* grad_y, T* grad_x, T* grad_m) {
  const T hy = T(1) - t.ly, hx = T(1) - t.lx;
  *grad_y = m * (hx * (d[2] - d[0]) + t.lx * (d[3] - d[1]));
  *grad_x = m * (hy * (d[1] - d[0]) + t.ly * (d[3] - d[2]));
  *grad_m = hy * hx * d[0] + hy * t.lx * d[1] + t.ly * hx * d[2] + t.ly * t.lx * d[3];
}

}  // namespace customops
