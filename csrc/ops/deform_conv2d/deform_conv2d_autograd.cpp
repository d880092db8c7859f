// deform_conv2d and its backward, autograd kernels (C++ for the reason given in
// add/add_autograd.cpp).
//
// The forward saves its inputs (input, offset, weight, mask), never the column buffer:
// customops::deform_conv2d_backward recomputes the columns it needs, chunk by chunk, so the
// extra memory of a training step stays bounded. Gradients flow to input, offset, weight,
// bias and mask; the backward op computes only the ones asked for (output_mask).
//
// Double backward is not implemented: deform_conv2d_backward's autograd kernel records a
// node whose backward raises a RuntimeError that says so, so a second differentiation fails
// loudly instead of returning wrong (zero) gradients.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <tuple>
#include <vector>

#include "../common/autograd_utils.h"
#include "../common/library.h"

namespace customops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using BackwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using OptTensor = c10::optional<at::Tensor>;

at::Tensor forward_op(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight, const OptTensor& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const OptTensor& mask) {
  static const auto op = find_op<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, at::IntArrayRef, at::IntArrayRef,
      at::IntArrayRef, const OptTensor&)>("deform_conv2d");
  return op.call(input, offset, weight, bias, stride, padding, dilation, mask);
}

BackwardOutputs backward_op(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const OptTensor& mask, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    std::array<bool, 5> output_mask) {
  static const auto op = find_op<BackwardOutputs(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, at::IntArrayRef,
      at::IntArrayRef, at::IntArrayRef, std::array<bool, 5>)>("deform_conv2d_backward");
  return op.call(grad_out, input, offset, weight, mask, stride, padding, dilation, output_mask);
}

class DeformConv2dBackwardFunction : public torch::autograd::Function<DeformConv2dBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset,
      const at::Tensor& weight, const OptTensor& mask, at::IntArrayRef stride, at::IntArrayRef padding,
      at::IntArrayRef dilation, std::array<bool, 5> output_mask) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [gi, goff, gw, gb, gm] =
        backward_op(grad_out, input, offset, weight, mask, stride, padding, dilation, output_mask);
    return {gi, goff, gw, gb, gm};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(
        false,
        "customops: deform_conv2d supports first-order gradients only: its backward "
        "(customops::deform_conv2d_backward) is not differentiable, so double backward "
        "(e.g. torch.autograd.gradgradcheck, or differentiating a gradient taken with create_graph=True) "
        "is not implemented");
    return {};
  }
};

class DeformConv2dFunction : public torch::autograd::Function<DeformConv2dFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
      const OptTensor& bias, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
      const OptTensor& mask) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = forward_op(input, offset, weight, bias, stride, padding, dilation, mask);
    }
    ctx->save_for_backward({input, offset, weight, mask.has_value() ? *mask : at::Tensor()});
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["dilation"] = dilation.vec();
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["has_mask"] = mask.has_value();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_mask = ctx->saved_data["has_mask"].toBool();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    // needs_input_grad counts the tensors given (input, offset, weight, then bias and mask when
    // present); the returned list has one entry per argument: input, offset, weight, bias,
    // stride, padding, dilation, mask.
    const std::array<bool, 5> want = {
        ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2),
        has_bias && ctx->needs_input_grad(3), has_mask && ctx->needs_input_grad(has_bias ? 4 : 3)};
    variable_list result(8);
    if (!grads[0].defined() || !(want[0] || want[1] || want[2] || want[3] || want[4])) return result;
    const std::vector<int64_t> stride = ctx->saved_data["stride"].toIntVector();
    const std::vector<int64_t> padding = ctx->saved_data["padding"].toIntVector();
    const std::vector<int64_t> dilation = ctx->saved_data["dilation"].toIntVector();
    const OptTensor mask = has_mask ? OptTensor(saved[3]) : c10::nullopt;
    auto [gi, goff, gw, gb, gm] =
        backward_op(grads[0], saved[0], saved[1], saved[2], mask, stride, padding, dilation, want);
    if (want[0]) result[0] = gi;
    if (want[1]) result[1] = goff;
    if (want[2]) result[2] = gw;
    if (want[3]) result[3] = gb;
    if (want[4]) result[7] = gm;
    return result;
  }
};

at::Tensor deform_conv2d_autograd(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight, const OptTensor& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const OptTensor& mask) {
  return DeformConv2dFunction::apply(input, offset, weight, bias, stride, padding, dilation, mask);
}

BackwardOutputs deform_conv2d_backward_autograd(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const OptTensor& mask, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    std::array<bool, 5> output_mask) {
  const auto grads = DeformConv2dBackwardFunction::apply(
      grad_out, input, offset, weight, mask, stride, padding, dilation, output_mask);
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(Autograd, m) {
  m.impl("deform_conv2d", &deform_conv2d_autograd);
  m.impl("deform_conv2d_backward", &deform_conv2d_backward_autograd);
}

}  // namespace customops
