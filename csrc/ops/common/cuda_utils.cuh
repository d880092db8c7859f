// Helpers shared by the CUDA kernels: launch checking and a vectorized,
// 64-bit-indexed elementwise loop.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

// A failed launch surfaces as a RuntimeError that names the kernel, never an abort.
#define CUSTOMOPS_CUDA_LAUNCH_CHECK(kernel_name)                                             \
  do {                                                                                       \
    const cudaError_t customops_err_ = cudaGetLastError();                                   \
    TORCH_CHECK(                                                                             \
        customops_err_ == cudaSuccess, "customops: CUDA kernel ", kernel_name,              \
        " failed to launch: ", cudaGetErrorString(customops_err_));                         \
  } while (0)

namespace customops {
namespace cuda {

constexpr int kThreads = 256;

// Threads per block for a launch of kernel_name: kThreads, except that the test hook
// CUSTOMOPS_TEST_FAIL_LAUNCH=<kernel name> (read once per process) gives that kernel an
// invalid block size, so tests can check that a failed launch becomes a RuntimeError
// naming the kernel (tests/test_cuda_runtime.py).
inline int block_size(const char* kernel_name) {
  static const char* const fail = std::getenv("CUSTOMOPS_TEST_FAIL_LAUNCH");
  return fail != nullptr && std::strcmp(fail, kernel_name) == 0 ? 4 * 1024 : kThreads;
}

template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVec {
  T v[N];
};

// Bytes per thread per access: 16 gives 128-bit loads and stores.
template <typename scalar_t>
constexpr int vec_size() {
  return std::max<int>(1, 16 / static_cast<int>(sizeof(scalar_t)));
}

// Kernel argument holding the input pointers (an aggregate, so {a, b} builds it).
template <typename T, int N>
struct InputPtrs {
  const T* p[N];
  __host__ __device__ const T* operator[](int i) const { return p[i]; }
};

inline bool is_aligned(const void* p, int bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Enough blocks to fill every SM several times over; the loop is grid-strided.
inline int64_t grid_for(int64_t work_items) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t blocks = (work_items + kThreads - 1) / kThreads;
  return std::max<int64_t>(1, std::min<int64_t>(blocks, sms * 16));
}

// Calls an op with NIn opmath arguments.
template <typename Op, typename T>
__device__ __forceinline__ T apply(const Op& op, const T (&a)[1]) {
  return op(a[0]);
}
template <typename Op, typename T>
__device__ __forceinline__ T apply(const Op& op, const T (&a)[2]) {
  return op(a[0], a[1]);
}

// out[i] = op(in[0][i], ..., in[NIn-1][i]) over n contiguous elements; the
// op computes in opmath (float for 16-bit types). VEC elements per access.
template <typename scalar_t, int NIn, int VEC, typename Op>
__global__ void elementwise_kernel(
    scalar_t* out, InputPtrs<scalar_t, NIn> in, int64_t n, Op op) {
  using opmath_t = at::opmath_type<scalar_t>;
  using vec_t = AlignedVec<scalar_t, VEC>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_vec = n / VEC;
  for (int64_t i = tid; i < n_vec; i += stride) {
    vec_t src[NIn];
#pragma unroll
    for (int k = 0; k < NIn; ++k) src[k] = reinterpret_cast<const vec_t*>(in[k])[i];
    vec_t dst;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      opmath_t args[NIn];
#pragma unroll
      for (int k = 0; k < NIn; ++k) args[k] = static_cast<opmath_t>(src[k].v[j]);
      dst.v[j] = static_cast<scalar_t>(apply(op, args));
    }
    reinterpret_cast<vec_t*>(out)[i] = dst;
  }
  for (int64_t i = n_vec * VEC + tid; i < n; i += stride) {
    opmath_t args[NIn];
#pragma unroll
    for (int k = 0; k < NIn; ++k) args[k] = static_cast<opmath_t>(in[k][i]);
    out[i] = static_cast<scalar_t>(apply(op, args));
  }
}

// Launches elementwise_kernel on the current stream. All tensors must be
// contiguous with n elements; out may alias an input (in-place).
template <typename scalar_t, int NIn, typename Op>
void launch_elementwise(
    const char* kernel_name, scalar_t* out, InputPtrs<scalar_t, NIn> in, int64_t n,
    Op op) {
  if (n == 0) return;
  constexpr int kVec = vec_size<scalar_t>();
  bool aligned = is_aligned(out, 16);
  for (int k = 0; k < NIn; ++k) aligned = aligned && is_aligned(in[k], 16);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = block_size(kernel_name);
  if (aligned) {
    elementwise_kernel<scalar_t, NIn, kVec, Op>
        <<<grid_for((n + kVec - 1) / kVec), threads, 0, stream>>>(out, in, n, op);
  } else {
    elementwise_kernel<scalar_t, NIn, 1, Op><<<grid_for(n), threads, 0, stream>>>(out, in, n, op);
  }
  CUSTOMOPS_CUDA_LAUNCH_CHECK(kernel_name);
}

}  // namespace cuda
}  // namespace customops
