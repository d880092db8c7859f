// fused_linear_sigmoid and its backward, autograd kernels (C++ for the reason given in
// add/add_autograd.cpp).
//
// customops::fused_linear_sigmoid_backward computes the gradients from the saved output y
// (the formula: customops/ops/fused_linear_sigmoid.py's docstring). That op is
// differentiable in turn (double backward): with s = y (1 - y) and gg_z the cotangent
// reaching grad_z,
//   gg_z = gg_x @ W.T + x @ gg_W.T + gg_b,  d_W = grad_z.T @ gg_x,  d_x = grad_z @ gg_W,
//   d_grad_out = gg_z * s,  d_y = gg_z * grad_out * (1 - 2y).
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <tuple>

#include "../common/autograd_utils.h"
#include "fused_linear_sigmoid.h"
#include "../common/library.h"

namespace customops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using BackwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

at::Tensor forward_op(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&)>(
      "fused_linear_sigmoid");
  return op.call(x, weight, bias);
}

BackwardOutputs backward_op(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask) {
  static const auto op = find_op<BackwardOutputs(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, std::array<bool, 3>)>(
      "fused_linear_sigmoid_backward");
  return op.call(grad_out, x, weight, y, output_mask);
}

class FusedLinearSigmoidBackwardFunction : public torch::autograd::Function<FusedLinearSigmoidBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
      const at::Tensor& y, std::array<bool, 3> output_mask) {
    ctx->save_for_backward({grad_out, x, weight, y});
    ctx->saved_data["output_mask"] = std::vector<bool>(output_mask.begin(), output_mask.end());
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [grad_x, grad_weight, grad_bias] = backward_op(grad_out, x, weight, y, output_mask);
    return {grad_x, grad_weight, grad_bias};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &grad_out = saved[0], &x = saved[1], &weight = saved[2], &y = saved[3];
    const auto mask = ctx->saved_data["output_mask"].toBoolList();
    const at::Tensor &gg_x = grads[0], &gg_weight = grads[1], &gg_bias = grads[2];
    const int64_t rows = leading_rows(x);
    const int64_t out_features = weight.size(0), in_features = weight.size(1);
    const at::Tensor x2 = x.reshape({rows, in_features});
    const at::Tensor g2 = grad_out.reshape({rows, out_features});
    const at::Tensor y2 = y.reshape({rows, out_features});
    const at::Tensor s = y2 * (1 - y2);
    const at::Tensor grad_z = g2 * s;
    at::Tensor gg_z = at::zeros_like(grad_z);
    at::Tensor d_x, d_weight;
    if (mask[0] && gg_x.defined()) {
      const at::Tensor gg_x2 = gg_x.reshape({rows, in_features});
      gg_z = gg_z + gg_x2.mm(weight.t());
      d_weight = grad_z.t().mm(gg_x2);
    }
    if (mask[1] && gg_weight.defined()) {
      gg_z = gg_z + x2.mm(gg_weight.t());
      d_x = grad_z.mm(gg_weight).reshape(x.sizes());
    }
    if (mask[2] && gg_bias.defined()) gg_z = gg_z + gg_bias;
    const at::Tensor d_grad_out = (gg_z * s).reshape(grad_out.sizes());
    const at::Tensor d_y = (gg_z * g2 * (1 - 2 * y2)).reshape(y.sizes());
    if (!d_x.defined() && ctx->needs_input_grad(1)) d_x = at::zeros_like(x);
    if (!d_weight.defined() && ctx->needs_input_grad(2)) d_weight = at::zeros_like(weight);
    return {d_grad_out, d_x, d_weight, d_y, at::Tensor()};
  }
};

class FusedLinearSigmoidFunction : public torch::autograd::Function<FusedLinearSigmoidFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
    at::Tensor y;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      y = forward_op(x, weight, bias);
    }
    ctx->save_for_backward({x, weight, y});
    ctx->saved_data["has_bias"] = bias.has_value();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::array<bool, 3> mask = {
        ctx->needs_input_grad(0), ctx->needs_input_grad(1),
        ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)};
    auto [grad_x, grad_weight, grad_bias] = backward_op(grads[0], saved[0], saved[1], saved[2], mask);
    return {mask[0] ? grad_x : at::Tensor(), mask[1] ? grad_weight : at::Tensor(), mask[2] ? grad_bias : at::Tensor()};
  }
};

at::Tensor fused_linear_sigmoid_autograd(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  if (!any_records_autograd(x, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return forward_op(x, weight, bias);
  }
  return FusedLinearSigmoidFunction::apply(x, weight, bias);
}

BackwardOutputs fused_linear_sigmoid_backward_autograd(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask) {
  if (!any_records_autograd(grad_out, x, weight, y)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return backward_op(grad_out, x, weight, y, output_mask);
  }
  const auto grads = FusedLinearSigmoidBackwardFunction::apply(grad_out, x, weight, y, output_mask);
  return {grads[0], grads[1], grads[2]};
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(Autograd, m) {
  m.impl("fused_linear_sigmoid", &fused_linear_sigmoid_autograd);
  m.impl("fused_linear_sigmoid_backward", &fused_linear_sigmoid_backward_autograd);
}

}  // namespace customops
