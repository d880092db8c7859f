// sigmoid_focal_loss and its backward, autograd kernels (C++ for the reason given in
// add/add_autograd.cpp).
//
// The forward saves only its inputs and targets (no sigmoid, no per-element loss): the
// backward op recomputes what it needs in the same pass that writes the gradients
// (formulas in sigmoid_focal_loss.h). Gradients flow to inputs and to targets (soft
// targets, as torchvision's composite gives them through autograd); the backward op
// computes only the ones asked for (output_mask).
//
// Double backward is not implemented: sigmoid_focal_loss_backward's autograd kernel records
// a node whose backward raises a RuntimeError that says so, so create_graph=True followed
// by a second differentiation fails loudly instead of returning wrong (zero) gradients.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <tuple>

#include "../common/autograd_utils.h"
#include "../common/library.h"

namespace customops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using BackwardOutputs = std::tuple<at::Tensor, at::Tensor>;

at::Tensor forward_op(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma, c10::string_view reduction) {
  static const auto op =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double, double, c10::string_view)>("sigmoid_focal_loss");
  return op.call(inputs, targets, alpha, gamma, reduction);
}

BackwardOutputs backward_op(
    const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction, std::array<bool, 2> output_mask) {
  static const auto op = find_op<BackwardOutputs(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, c10::string_view, std::array<bool, 2>)>(
      "sigmoid_focal_loss_backward");
  return op.call(grad_out, inputs, targets, alpha, gamma, reduction, output_mask);
}

class SigmoidFocalLossBackwardFunction : public torch::autograd::Function<SigmoidFocalLossBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets,
      double alpha, double gamma, c10::string_view reduction, std::array<bool, 2> output_mask) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [grad_inputs, grad_targets] = backward_op(grad_out, inputs, targets, alpha, gamma, reduction, output_mask);
    return {grad_inputs, grad_targets};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(
        false,
        "customops: sigmoid_focal_loss supports first-order gradients only: its backward "
        "(customops::sigmoid_focal_loss_backward) is not differentiable, so double backward "
        "(e.g. torch.autograd.gradgradcheck, or differentiating a gradient taken with create_graph=True) "
        "is not implemented");
    return {};
  }
};

class SigmoidFocalLossFunction : public torch::autograd::Function<SigmoidFocalLossFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx, const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
      c10::string_view reduction) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = forward_op(inputs, targets, alpha, gamma, reduction);
    }
    ctx->save_for_backward({inputs, targets});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["gamma"] = gamma;
    ctx->saved_data["reduction"] = std::string(reduction.data(), reduction.size());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::array<bool, 2> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1)};
    if (!mask[0] && !mask[1]) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const std::string reduction = ctx->saved_data["reduction"].toStringRef();
    auto [grad_inputs, grad_targets] = backward_op(
        grads[0], saved[0], saved[1], ctx->saved_data["alpha"].toDouble(), ctx->saved_data["gamma"].toDouble(),
        reduction, mask);
    return {
        mask[0] ? grad_inputs : at::Tensor(), mask[1] ? grad_targets : at::Tensor(), at::Tensor(), at::Tensor(),
        at::Tensor()};
  }
};

at::Tensor sigmoid_focal_loss_autograd(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma, c10::string_view reduction) {
  if (!any_records_autograd(inputs, targets)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return forward_op(inputs, targets, alpha, gamma, reduction);
  }
  return SigmoidFocalLossFunction::apply(inputs, targets, alpha, gamma, reduction);
}

BackwardOutputs sigmoid_focal_loss_backward_autograd(
    const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction, std::array<bool, 2> output_mask) {
  if (!any_records_autograd(grad_out, inputs, targets)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return backward_op(grad_out, inputs, targets, alpha, gamma, reduction, output_mask);
  }
  const auto grads =
      SigmoidFocalLossBackwardFunction::apply(grad_out, inputs, targets, alpha, gamma, reduction, output_mask);
  return {grads[0], grads[1]};
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(Autograd, m) {
  m.impl("sigmoid_focal_loss", &sigmoid_focal_loss_autograd);
  m.impl("sigmoid_focal_loss_backward", &sigmoid_focal_loss_backward_autograd);
}

}  // namespace customops
