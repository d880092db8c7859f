// sigmoid_backward is also the first step of fused_linear_sigmoid's backward,
// so its kernels are callable from C++.
#pragma once

#include <ATen/core/Tensor.h>

namespace customops {

at::Tensor sigmoid_backward_cpu(const at::Tensor& grad_out, const at::Tensor& y);
#ifdef CUSTOMOPS_WITH_CUDA
at::Tensor sigmoid_backward_cuda(const at::Tensor& grad_out, const at::Tensor& y);
#endif

}  // namespace customops
