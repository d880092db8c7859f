// fused_linear_sigmoid and its backward, CPU kernels: GEMM through ATen, then
// bias + sigmoid in one pass over the output.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "../common/cpu_utils.h"
#include "../common/math.h"
#include "../sigmoid/sigmoid.h"
#include "fused_linear_sigmoid.h"

namespace customops {
namespace {

void bias_sigmoid_cpu_(at::Tensor& out, const c10::optional<at::Tensor>& bias) {
  const int64_t rows = out.size(0);
  const int64_t cols = out.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, out.scalar_type(), "customops::fused_linear_sigmoid", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        scalar_t* o = out.data_ptr<scalar_t>();
        const scalar_t* b = bias.has_value() ? bias->const_data_ptr<scalar_t>() : nullptr;
        const int64_t grain_rows = std::max<int64_t>(1, cpu::kGrainSize / std::max<int64_t>(cols, 1));
        at::parallel_for(0, rows, grain_rows, [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            scalar_t* row = o + r * cols;
            for (int64_t j = 0; j < cols; ++j) {
              const opmath_t z = static_cast<opmath_t>(row[j]) + (b ? static_cast<opmath_t>(b[j]) : opmath_t(0));
              row[j] = static_cast<scalar_t>(sigmoid(z));
            }
          }
        });
      });
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
