// fused_linear_sigmoid and its backward, CUDA kernels: the GEMM through cuBLAS
// (at::mm on the current stream), then bias + sigmoid fused in one pass over
// the output. The roofline kernels come with the CUDA-performance work.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "../sigmoid/sigmoid.h"
#include "fused_linear_sigmoid.h"

namespace customops {
namespace {

// out[r, c] = sigmoid(out[r, c] + bias[c]) over a contiguous (rows, cols)
// matrix, VEC consecutive elements per access. cols % VEC == 0, so a vector
// never straddles two rows.
template <typename scalar_t, int VEC>
__global__ void bias_sigmoid_kernel(scalar_t* out, const scalar_t* __restrict__ bias, int64_t numel, int64_t cols) {
  using opmath_t = at::opmath_type<scalar_t>;
  using vec_t = cuda::AlignedVec<scalar_t, VEC>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel / VEC; i += stride) {
    const int64_t col = (i * VEC) % cols;
    vec_t o = reinterpret_cast<vec_t*>(out)[i];
    const vec_t b = *reinterpret_cast<const vec_t*>(bias + col);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.v[j] = static_cast<scalar_t>(sigmoid(static_cast<opmath_t>(o.v[j]) + static_cast<opmath_t>(b.v[j])));
    }
    reinterpret_cast<vec_t*>(out)[i] = o;
  }
}

void bias_sigmoid_cuda_(at::Tensor& out, const c10::optional<at::Tensor>& bias) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, out.scalar_type(), "customops::fused_linear_sigmoid", [&] {
        scalar_t* o = out.data_ptr<scalar_t>();
        const int64_t numel = out.numel();
        if (!bias.has_value()) {
          cuda::launch_elementwise<scalar_t, 1>("sigmoid_kernel", o, {o}, numel, SigmoidFn{});
          return;
        }
        const scalar_t* b = bias->const_data_ptr<scalar_t>();
        const int64_t cols = out.size(1);
        const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
        constexpr int kVec = cuda::vec_size<scalar_t>();
        const int threads = cuda::block_size("bias_sigmoid_kernel");
        if (cols % kVec == 0 && cuda::is_aligned(o, 16) && cuda::is_aligned(b, 16)) {
          bias_sigmoid_kernel<scalar_t, kVec>
              <<<cuda::grid_for(numel / kVec), threads, 0, stream>>>(o, b, numel, cols);
        } else {
          bias_sigmoid_kernel<scalar_t, 1><<<cuda::grid_for(numel), threads, 0, stream>>>(o, b, numel, cols);
        }
        CUSTOMOPS_CUDA_LAUNCH_CHECK("bias_sigmoid_kernel");
      });
}

at::Tensor fused_linear_sigmoid_cuda(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_fused_linear_sigmoid_args(x, weight, bias);
  const c10::cuda::CUDAGuard device_guard(x.device());
  return fused_linear_sigmoid_forward_impl(x, weight, bias, bias_sigmoid_cuda_);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_sigmoid_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask) {
  check_fused_linear_sigmoid_backward_args(grad_out, x, weight, y);
  const c10::cuda::CUDAGuard device_guard(x.device());
  return fused_linear_sigmoid_backward_impl(grad_out, x, weight, y, output_mask, sigmoid_backward_cuda);
}

}  // namespace

TORCH_LIBRARY_IMPL(customops, CUDA, m) {
  m.impl("fused_linear_sigmoid", &fused_linear_sigmoid_cuda);
  m.impl("fused_linear_sigmoid_backward", &fused_linear_sigmoid_backward_cuda);
}

}  // namespace customops
