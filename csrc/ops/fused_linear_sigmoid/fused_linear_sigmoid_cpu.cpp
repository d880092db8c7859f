// fused_linear_sigmoid and its backward, CPU kernels: GEMM (with the bias) through
// ATen, then the sigmoid in place over the output (linear_sigmoid_aten).
#include <torch/library.h>

#include "../sigmoid/sigmoid.h"
#include "fused_linear_sigmoid.h"
#include "../common/library.h"

namespace customops {
namespace {

at::Tensor fused_linear_sigmoid_cpu(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_fused_linear_sigmoid_args(x, weight, bias);
  return fused_linear_sigmoid_forward_impl(x, weight, bias, linear_sigmoid_aten);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_sigmoid_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask) {
  check_fused_linear_sigmoid_backward_args(grad_out, x, weight, y);
  return fused_linear_sigmoid_backward_impl(
      grad_out, x, weight, y, output_mask, [](const at::Tensor& g, const at::Tensor& y2d, bool) {
        return std::make_pair(sigmoid_backward_cpu(g, y2d), at::Tensor());
      });
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("fused_linear_sigmoid", &fused_linear_sigmoid_cpu);
  m.impl("fused_linear_sigmoid_backward", &fused_linear_sigmoid_backward_cpu);
}

}  // namespace customops
