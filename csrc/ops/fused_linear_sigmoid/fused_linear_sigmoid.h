// fused_linear_sigmoid: the checks and the backend-independent structure of the
// forward and backward, shared by the CPU and CUDA kernels. Each backend
// supplies only its elementwise step (bias + sigmoid, sigmoid_backward); the
// GEMMs go through ATen (MKL/oneDNN on CPU, cuBLAS on the current stream).
#pragma once

#include <ATen/ATen.h>

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
  TORCH_CHECK(
      x.dim() >= 1, "customops: expected x to have shape (*, in_features), but got a 0-dimensional tensor");
  TORCH_CHECK(
      weight.dim() == 2, "customops: expected weight to be 2-D (out_features, in_features), but got shape ",
      shape_str(weight.sizes()));
  TORCH_CHECK(
      x.size(-1) == weight.size(1), "customops: expected x.shape[-1] (in_features) to equal weight.shape[1] = ",
      int_str(weight.size(1)), ", but got x of shape ", shape_str(x.sizes()));
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

// The forward and backward below expect arguments that passed the checks
// above; backends run the checks first, then set their device guard.
//
// bias_sigmoid_(out2d, bias): out2d <- sigmoid(out2d + bias) in place, with
// out2d contiguous (M, out_features) and bias contiguous or absent.
template <typename BiasSigmoidFn>
at::Tensor fused_linear_sigmoid_forward_impl(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    BiasSigmoidFn bias_sigmoid_) {
  const int64_t in_features = weight.size(1);
  const int64_t out_features = weight.size(0);
  // reshape copies only where the strides demand it; mm takes any strides.
  const at::Tensor x2d = x.reshape({-1, in_features});
  at::Tensor out = at::empty({x2d.size(0), out_features}, x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() > 0) {
    at::mm_out(out, x2d, weight.t());
    bias_sigmoid_(out, bias.has_value() ? c10::optional<at::Tensor>(bias->contiguous()) : c10::nullopt);
  }
  return out.view(fused_linear_sigmoid_output_shape(x, weight));
}

// grad_z = grad_out * y * (1 - y); grad_x = grad_z @ W; grad_W = grad_z^T @ x;
// grad_b = sum over rows of grad_z. Masked-off outputs are empty tensors.
template <typename SigmoidBackwardFn>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_sigmoid_backward_impl(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask, SigmoidBackwardFn sigmoid_backward_fn) {
  const int64_t in_features = weight.size(1);
  const int64_t out_features = weight.size(0);
  const at::Tensor grad_z =
      sigmoid_backward_fn(grad_out.reshape({-1, out_features}), y.reshape({-1, out_features}));
  at::Tensor grad_x, grad_weight, grad_bias;
  grad_x = output_mask[0] ? at::mm(grad_z, weight).view(x.sizes()) : x.new_empty({0});
  grad_weight = output_mask[1] ? at::mm(grad_z.t(), x.reshape({-1, in_features})) : x.new_empty({0});
  grad_bias = output_mask[2] ? grad_z.sum(0) : x.new_empty({0});
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace customops
