// The C++ API (customops/include/customops/ops.h): each function calls its op through the
// dispatcher, as torch.ops.customops.<op> does from Python.
#include "customops/ops.h"
#include "ops/common/autograd_utils.h"  // find_op

namespace customops {

at::Tensor fused_linear_sigmoid(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  static const auto handle =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>(
          "fused_linear_sigmoid");
  return handle.call(x, weight, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_sigmoid_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask) {
  static const auto handle = find_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, std::array<bool, 3>)>(
      "fused_linear_sigmoid_backward");
  return handle.call(grad_out, x, weight, y, output_mask);
}

at::Tensor add(const at::Tensor& a, const at::Tensor& b) {
  static const auto handle = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("add");
  return handle.call(a, b);
}

at::Tensor sigmoid(const at::Tensor& x) {
  static const auto handle = find_op<at::Tensor(const at::Tensor&)>("sigmoid");
  return handle.call(x);
}

at::Tensor sigmoid_backward(const at::Tensor& grad_out, const at::Tensor& y) {
  static const auto handle = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("sigmoid_backward");
  return handle.call(grad_out, y);
}

at::Tensor sigmoid_focal_loss(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma, std::string_view reduction) {
  static const auto handle =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double, double, c10::string_view)>("sigmoid_focal_loss");
  return handle.call(inputs, targets, alpha, gamma, c10::string_view(reduction.data(), reduction.size()));
}

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_backward(
    const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    std::string_view reduction, std::array<bool, 2> output_mask) {
  static const auto handle = find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, c10::string_view, std::array<bool, 2>)>(
      "sigmoid_focal_loss_backward");
  return handle.call(
      grad_out, inputs, targets, alpha, gamma, c10::string_view(reduction.data(), reduction.size()), output_mask);
}

at::Tensor deform_conv2d(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation,
    const std::optional<at::Tensor>& mask) {
  static const auto handle = find_op<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
      at::IntArrayRef, at::IntArrayRef, const std::optional<at::Tensor>&)>("deform_conv2d");
  return handle.call(input, offset, weight, bias, stride, padding, dilation, mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const std::optional<at::Tensor>& mask, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
    std::array<int64_t, 2> dilation, std::array<bool, 5> output_mask) {
  static const auto handle = find_op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, std::array<bool, 5>)>("deform_conv2d_backward");
  return handle.call(grad_out, input, offset, weight, mask, stride, padding, dilation, output_mask);
}

}  // namespace customops
