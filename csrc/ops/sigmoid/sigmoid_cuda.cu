// sigmoid and sigmoid_backward, CUDA kernels (the shared vectorized loop).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "sigmoid.h"
#include "../common/library.h"

namespace customops {

namespace {

at::Tensor sigmoid_cuda(const at::Tensor& x) {
  check_floating(x, "x");
  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor x_c = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "customops::sigmoid", [&] {
    cuda::launch_elementwise<scalar_t, 1>(
        "sigmoid_kernel", out.data_ptr<scalar_t>(), {x_c.const_data_ptr<scalar_t>()}, out.numel(), SigmoidFn{});
  });
  return out;
}

}  // namespace

at::Tensor sigmoid_backward_cuda(const at::Tensor& grad_out, const at::Tensor& y) {
  check_elementwise_pair(grad_out, "grad_out", y, "y");
  const c10::cuda::CUDAGuard device_guard(y.device());
  const at::Tensor g_c = grad_out.contiguous();
  const at::Tensor y_c = y.contiguous();
  at::Tensor out = at::empty(y.sizes(), y.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "customops::sigmoid_backward", [&] {
    cuda::launch_elementwise<scalar_t, 2>(
        "sigmoid_backward_kernel", out.data_ptr<scalar_t>(),
        {g_c.const_data_ptr<scalar_t>(), y_c.const_data_ptr<scalar_t>()}, out.numel(), SigmoidBackwardFn{});
  });
  return out;
}

CUSTOMOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("sigmoid", &sigmoid_cuda);
  m.impl("sigmoid_backward", &sigmoid_backward_cuda);
}

}  // namespace customops
