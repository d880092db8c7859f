// fused_linear_sigmoid and its backward, CPU kernels: GEMM through ATen, then
// bias + sigmoid in place over the output.
#include <torch/library.h>

#include "../sigmoid/sigmoid.h"
#include "fused_linear_sigmoid.h"

namespace customops {
namespace {

// ATen's own CPU kernels for the elementwise step: they are vectorized for the CPU
// found at run time (AVX2/AVX-512 through ATen's dispatch), which this library, built
// once with generic flags, cannot be; on 2 cores a scalar pass here made the op 20%
// slower than eager at 1024x1024x1024 (benchmarks/NOTES.md).
void bias_sigmoid_cpu_(at::Tensor& out, const c10::optional<at::Tensor>& bias) {
  if (bias.has_value()) out.add_(*bias);
  out.sigmoid_();
}

at::Tensor fused_linear_sigmoid_cpu(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_fused_linear_sigmoid_args(x, weight, bias);
  return fused_linear_sigmoid_forward_impl(x, weight, bias, bias_sigmoid_cpu_);
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

TORCH_LIBRARY_IMPL(customops, CPU, m) {
  m.impl("fused_linear_sigmoid", &fused_linear_sigmoid_cpu);
  m.impl("fused_linear_sigmoid_backward", &fused_linear_sigmoid_backward_cpu);
}

}  // namespace customops
