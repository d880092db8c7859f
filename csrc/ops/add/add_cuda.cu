// add, CUDA kernel: same checks and output contract as add_cpu.cpp, computed by
// the shared vectorized elementwise loop on the current stream.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "../common/library.h"

namespace customops {
namespace {

struct AddOp {
  template <typename T>
  __device__ T operator()(T x, T y) const {
    return x + y;
  }
};

at::Tensor add_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_elementwise_pair(a, "a", b, "b");
  const c10::cuda::CUDAGuard device_guard(a.device());
  const at::Tensor a_c = a.contiguous();
  const at::Tensor b_c = b.contiguous();
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "customops::add", [&] {
    cuda::launch_elementwise<scalar_t, 2>(
        "add_kernel", out.data_ptr<scalar_t>(), {a_c.const_data_ptr<scalar_t>(), b_c.const_data_ptr<scalar_t>()},
        out.numel(), AddOp{});
  });
  return out;
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("add", &add_cuda);
}

}  // namespace customops
