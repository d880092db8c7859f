// fused_linear_sigmoid: the checks and the backend-independent structure of the
// forward and backward, shared by the CPU and CUDA kernels. Each backend
// supplies only its elementwise step (bias + sigmoid, sigmoid_backward); the
// GEMMs go through ATen (MKL/oneDNN on CPU, cuBLAS on the current stream).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include <array>
#include <tuple>
#include <vector>

#include "../common/checks.h"

namespace customops {

inline void check_fused_linear_sigmoid_args(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_floating(x, "x");
  check_floating(weight, "weight");
  check_same_device(weight, "weight", x, "x");
  check_same_dtype(weight, "weight", x, "x");
  TORCH_CHECK(x.dim() >= 1, "customops: expected x to have shape (*, in_features), but got a 0-dimensional tensor");
  TORCH_CHECK(
      weight.dim() == 2, "customops: expected weight to be 2-D (out_features, in_features), but got shape ",
      shape_str(weight.sizes()));
  TORCH_CHECK(
      x.size(-1) == weight.size(1),
      "customops: expected x.shape[-1] (in_features) to equal weight.shape[1] = ", int_str(weight.size(1)),
      ", but got x of shape ", shape_str(x.sizes()));
  if (bias.has_value()) {
    check_floating(*bias, "bias");
    check_same_device(*bias, "bias", x, "x");
    check_same_dtype(*bias, "bias", x, "x");
    TORCH_CHECK(
        bias->dim() == 1 && bias->size(0) == weight.size(0),
        "customops: expected bias to have shape (out_features,) = (", int_str(weight.size(0)), ",), but got shape ",
        shape_str(bias->sizes()));
  }
}

// (*, in_features) -> (*, out_features)
inline std::vector<int64_t> fused_linear_sigmoid_output_shape(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  return shape;
}

inline void check_fused_linear_sigmoid_backward_args(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y) {
  check_fused_linear_sigmoid_args(x, weight, c10::nullopt);
  check_elementwise_pair(grad_out, "grad_out", y, "y");
  check_same_device(y, "y", x, "x");
  check_same_dtype(y, "y", x, "x");
  const auto y_shape = fused_linear_sigmoid_output_shape(x, weight);
  TORCH_CHECK(
      y.sizes() == at::IntArrayRef(y_shape), "customops: expected y to have shape ", shape_str(y_shape),
      " (x.shape[:-1] + (out_features,)), but got ", shape_str(y.sizes()));
}

// Rows of the (rows, features) matrix that t is viewed as: the product of all but
// its last dimension, computed rather than inferred with -1 so that a last
// dimension of 0 (in_features or out_features 0) works.
inline int64_t leading_rows(const at::Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return rows;
}

// The forward and backward below expect arguments that passed the checks
// above; backends run the checks first, then set their device guard.
//
// Both run their ATen calls below autograd: a backend kernel never records a
// graph, however it is reached (from the autograd kernel, or called at its
// dispatch key directly) and even when an input requires grad. Every returned
// tensor is its own allocation, never a view, so in-place ops on it work as on
// any fresh tensor.
//
// linear_sigmoid(x2d, weight, bias, out2d): out2d <- sigmoid(x2d @ weight^T + bias)
// for x2d (M, in_features) with any strides, out2d contiguous (M, out_features)
// and not empty, bias contiguous or absent.
template <typename LinearSigmoidFn>
at::Tensor fused_linear_sigmoid_forward_impl(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    LinearSigmoidFn linear_sigmoid) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t rows = leading_rows(x);
  const int64_t in_features = weight.size(1);
  const int64_t out_features = weight.size(0);
  at::Tensor out =
      at::empty(fused_linear_sigmoid_output_shape(x, weight), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() > 0) {
    // 2-D x needs no view (each is a dispatcher call, a noticeable part of a small call's host
    // time); reshape copies only where the strides demand it.
    at::Tensor out2d = x.dim() == 2 ? out : out.view({rows, out_features});
    linear_sigmoid(
        x.dim() == 2 ? x : x.reshape({rows, in_features}), weight,
        bias.has_value() ? c10::optional<at::Tensor>(bias->contiguous()) : c10::nullopt, out2d);
  }
  return out;
}

// out2d = sigmoid(x2d @ weight^T + bias) through the same ATen calls as eager F.linear +
// torch.sigmoid: addmm adds the bias in the GEMM's accumulation (one rounding for 16-bit
// types, as eager), then ATen's sigmoid in place. The CPU forward and the CUDA generic path:
// ATen's CPU kernels are vectorized for the CPU found at run time (AVX2/AVX-512), which this
// library, compiled once with generic flags, cannot be; on CUDA, cuBLASLt's bias epilogue
// makes this eager's speed, where a GEMM plus our own bias + sigmoid pass was up to 12% slower
// at mid-size M (docs/design.md).
inline void linear_sigmoid_aten(
    const at::Tensor& x2d, const at::Tensor& weight, const c10::optional<at::Tensor>& bias, at::Tensor& out2d) {
  if (bias.has_value()) {
    at::addmm_out(out2d, *bias, x2d, weight.t());
  } else {
    at::mm_out(out2d, x2d, weight.t());
  }
  out2d.sigmoid_();
}

// The backward from the saved output y alone (formula: the docstring of
// customops/ops/fused_linear_sigmoid.py). Masked-off outputs are empty tensors.
//
// sigmoid_backward_fn(grad_out2d, y2d, want_bias_grad) -> (grad_z, grad_b): a
// backend may compute grad_b in the same pass; an undefined grad_b means "sum
// grad_z here".
template <typename SigmoidBackwardFn>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_sigmoid_backward_impl(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask, SigmoidBackwardFn sigmoid_backward_fn) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t rows = leading_rows(x);
  const int64_t in_features = weight.size(1);
  const int64_t out_features = weight.size(0);
  const auto [grad_z, fused_grad_bias] =
      sigmoid_backward_fn(grad_out.reshape({rows, out_features}), y.reshape({rows, out_features}), output_mask[2]);
  at::Tensor grad_x = x.new_empty({0});
  at::Tensor grad_weight = x.new_empty({0});
  at::Tensor grad_bias = x.new_empty({0});
  if (output_mask[0]) {
    grad_x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    if (grad_x.numel() > 0) {
      at::Tensor grad_x2d = grad_x.view({rows, in_features});
      at::mm_out(grad_x2d, grad_z, weight);
    }
  }
  if (output_mask[1]) grad_weight = at::mm(grad_z.t(), x.reshape({rows, in_features}));
  if (output_mask[2]) grad_bias = fused_grad_bias.defined() ? fused_grad_bias : grad_z.sum(0);
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace customops
