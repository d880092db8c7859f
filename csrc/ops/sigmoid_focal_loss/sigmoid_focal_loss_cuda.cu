// sigmoid_focal_loss and its backward, CUDA kernels. Formulas: sigmoid_focal_loss.h.
//   forward "none": the shared vectorized elementwise loop (cuda_utils.cuh).
//   forward "sum"/"mean": sigmoid_focal_loss_reduce_kernel writes one opmath partial sum
//     per block (grid-stride, 16-byte loads, warp-shuffle block sum), then
//     sigmoid_focal_loss_finalize_kernel (one block) adds the partials in float64 in a
//     fixed order and writes the 0-dim output. No atomics: the result is the same on
//     every run for a given size and alignment. Nothing per element is written.
//   backward: sigmoid_focal_loss_backward_kernel reads x, t and grad_out (one value for
//     "sum"/"mean"/an expanded scalar, else per element) and writes the requested
//     gradients in one pass.
// Every launch is on the current stream, after the argument checks and a device guard,
// with 64-bit offsets, and is followed by CUSTOMOPS_CUDA_LAUNCH_CHECK; empty inputs
// launch nothing.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <array>
#include <limits>
#include <tuple>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "sigmoid_focal_loss.h"
#include "../common/library.h"

namespace customops {
namespace {

constexpr int kMaxWarps = 32;

// Sum of v over the block, valid in thread 0. blockDim.x is a multiple of 32 (<= 1024).
template <typename acc_t>
__device__ __forceinline__ acc_t block_sum(acc_t v, acc_t* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? shared[lane] : acc_t(0);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

template <typename scalar_t, int VEC>
__global__ void sigmoid_focal_loss_reduce_kernel(
    const scalar_t* __restrict__ x, const scalar_t* __restrict__ t, int64_t n,
    FocalLossParams<at::opmath_type<scalar_t>> prm, at::opmath_type<scalar_t>* __restrict__ partials) {
  using opmath_t = at::opmath_type<scalar_t>;
  using vec_t = cuda::AlignedVec<scalar_t, VEC>;
  __shared__ opmath_t shared[kMaxWarps];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_vec = n / VEC;
  opmath_t sum = 0;
  for (int64_t i = tid; i < n_vec; i += stride) {
    const vec_t xv = reinterpret_cast<const vec_t*>(x)[i];
    const vec_t tv = reinterpret_cast<const vec_t*>(t)[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      sum += focal_loss(static_cast<opmath_t>(xv.v[j]), static_cast<opmath_t>(tv.v[j]), prm);
    }
  }
  for (int64_t i = n_vec * VEC + tid; i < n; i += stride) {
    sum += focal_loss(static_cast<opmath_t>(x[i]), static_cast<opmath_t>(t[i]), prm);
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// out[0] = (sum of the partials, in float64) / divisor; one block.
template <typename scalar_t>
__global__ void sigmoid_focal_loss_finalize_kernel(
    const at::opmath_type<scalar_t>* __restrict__ partials, int64_t num_partials, double divisor,
    scalar_t* __restrict__ out) {
  using opmath_t = at::opmath_type<scalar_t>;
  __shared__ double shared[kMaxWarps];
  double s = 0;
  for (int64_t i = threadIdx.x; i < num_partials; i += blockDim.x) s += static_cast<double>(partials[i]);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = static_cast<scalar_t>(static_cast<opmath_t>(s / divisor));
}

template <typename scalar_t, int VEC, bool GX, bool GT>
__global__ void sigmoid_focal_loss_backward_kernel(
    const scalar_t* __restrict__ go, bool go_scalar, at::opmath_type<scalar_t> go_scale, const scalar_t* __restrict__ x,
    const scalar_t* __restrict__ t, scalar_t* __restrict__ gx, scalar_t* __restrict__ gt, int64_t n,
    FocalLossParams<at::opmath_type<scalar_t>> prm) {
  using opmath_t = at::opmath_type<scalar_t>;
  using vec_t = cuda::AlignedVec<scalar_t, VEC>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const opmath_t g0 = go_scalar ? static_cast<opmath_t>(go[0]) * go_scale : opmath_t(0);
  const int64_t n_vec = n / VEC;
  for (int64_t i = tid; i < n_vec; i += stride) {
    const vec_t xv = reinterpret_cast<const vec_t*>(x)[i];
    const vec_t tv = reinterpret_cast<const vec_t*>(t)[i];
    vec_t gv;
    if (!go_scalar) gv = reinterpret_cast<const vec_t*>(go)[i];
    vec_t gxv, gtv;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const opmath_t xi = static_cast<opmath_t>(xv.v[j]);
      const opmath_t ti = static_cast<opmath_t>(tv.v[j]);
      const opmath_t g = go_scalar ? g0 : static_cast<opmath_t>(gv.v[j]) * go_scale;
      const FocalTerms<opmath_t> r = focal_terms(xi, ti, prm);
      if constexpr (GX) gxv.v[j] = static_cast<scalar_t>(g * focal_grad_inputs(r, ti, prm));
      if constexpr (GT) gtv.v[j] = static_cast<scalar_t>(g * focal_grad_targets(r, xi, prm));
    }
    if constexpr (GX) reinterpret_cast<vec_t*>(gx)[i] = gxv;
    if constexpr (GT) reinterpret_cast<vec_t*>(gt)[i] = gtv;
  }
  for (int64_t i = n_vec * VEC + tid; i < n; i += stride) {
    const opmath_t xi = static_cast<opmath_t>(x[i]);
    const opmath_t ti = static_cast<opmath_t>(t[i]);
    const opmath_t g = go_scalar ? g0 : static_cast<opmath_t>(go[i]) * go_scale;
    const FocalTerms<opmath_t> r = focal_terms(xi, ti, prm);
    if constexpr (GX) gx[i] = static_cast<scalar_t>(g * focal_grad_inputs(r, ti, prm));
    if constexpr (GT) gt[i] = static_cast<scalar_t>(g * focal_grad_targets(r, xi, prm));
  }
}

template <typename scalar_t>
void launch_reduce(
    const scalar_t* x, const scalar_t* t, int64_t n, FocalLossParams<at::opmath_type<scalar_t>> prm, FocalReduction red,
    at::Tensor& out) {
  using opmath_t = at::opmath_type<scalar_t>;
  constexpr int kVec = cuda::vec_size<scalar_t>();
  const bool aligned = cuda::is_aligned(x, 16) && cuda::is_aligned(t, 16);
  const int64_t blocks = cuda::grid_for(aligned ? (n + kVec - 1) / kVec : n);
  at::Tensor partials = at::empty({blocks}, out.options().dtype(c10::CppTypeToScalarType<opmath_t>::value));
  opmath_t* pp = partials.data_ptr<opmath_t>();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = cuda::block_size("sigmoid_focal_loss_reduce_kernel");
  if (aligned) {
    sigmoid_focal_loss_reduce_kernel<scalar_t, kVec><<<blocks, threads, 0, stream>>>(x, t, n, prm, pp);
  } else {
    sigmoid_focal_loss_reduce_kernel<scalar_t, 1><<<blocks, threads, 0, stream>>>(x, t, n, prm, pp);
  }
  CUSTOMOPS_CUDA_LAUNCH_CHECK("sigmoid_focal_loss_reduce_kernel");
  const double divisor = red == FocalReduction::Mean ? static_cast<double>(n) : 1.0;
  sigmoid_focal_loss_finalize_kernel<scalar_t>
      <<<1, cuda::block_size("sigmoid_focal_loss_finalize_kernel"), 0, stream>>>(
          pp, blocks, divisor, out.data_ptr<scalar_t>());
  CUSTOMOPS_CUDA_LAUNCH_CHECK("sigmoid_focal_loss_finalize_kernel");
}

at::Tensor sigmoid_focal_loss_cuda(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma, c10::string_view reduction) {
  const FocalReduction red = check_sigmoid_focal_loss_args(inputs, targets, alpha, gamma, reduction);
  const c10::cuda::CUDAGuard device_guard(inputs.device());
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  const int64_t n = x.numel();
  if (red == FocalReduction::None) {
    at::Tensor out = at::empty(inputs.sizes(), inputs.options().memory_format(at::MemoryFormat::Contiguous));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "customops::sigmoid_focal_loss", [&] {
      using opmath_t = at::opmath_type<scalar_t>;
      cuda::launch_elementwise<scalar_t, 2>(
          "sigmoid_focal_loss_kernel", out.data_ptr<scalar_t>(),
          {x.const_data_ptr<scalar_t>(), t.const_data_ptr<scalar_t>()}, n,
          FocalLossFn<opmath_t>{focal_loss_params<opmath_t>(alpha, gamma)});
    });
    return out;
  }
  at::Tensor out = at::empty({}, inputs.options());
  if (n == 0) {
    // The mean of no elements is NaN and their sum 0, as torch.mean / torch.sum give.
    out.fill_(red == FocalReduction::Mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "customops::sigmoid_focal_loss", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    launch_reduce<scalar_t>(
        x.const_data_ptr<scalar_t>(), t.const_data_ptr<scalar_t>(), n, focal_loss_params<opmath_t>(alpha, gamma), red,
        out);
  });
  return out;
}

template <typename scalar_t, bool GX, bool GT>
void launch_backward(
    const scalar_t* go, bool go_scalar, at::opmath_type<scalar_t> go_scale, const scalar_t* x, const scalar_t* t,
    scalar_t* gx, scalar_t* gt, int64_t n, FocalLossParams<at::opmath_type<scalar_t>> prm) {
  constexpr int kVec = cuda::vec_size<scalar_t>();
  bool aligned = cuda::is_aligned(x, 16) && cuda::is_aligned(t, 16);
  if (!go_scalar) aligned = aligned && cuda::is_aligned(go, 16);
  if (GX) aligned = aligned && cuda::is_aligned(gx, 16);
  if (GT) aligned = aligned && cuda::is_aligned(gt, 16);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = cuda::block_size("sigmoid_focal_loss_backward_kernel");
  if (aligned) {
    sigmoid_focal_loss_backward_kernel<scalar_t, kVec, GX, GT>
        <<<cuda::grid_for((n + kVec - 1) / kVec), threads, 0, stream>>>(go, go_scalar, go_scale, x, t, gx, gt, n, prm);
  } else {
    sigmoid_focal_loss_backward_kernel<scalar_t, 1, GX, GT>
        <<<cuda::grid_for(n), threads, 0, stream>>>(go, go_scalar, go_scale, x, t, gx, gt, n, prm);
  }
  CUSTOMOPS_CUDA_LAUNCH_CHECK("sigmoid_focal_loss_backward_kernel");
}

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction, std::array<bool, 2> output_mask) {
  const FocalReduction red = check_sigmoid_focal_loss_backward_args(grad_out, inputs, targets, alpha, gamma, reduction);
  const c10::cuda::CUDAGuard device_guard(inputs.device());
  const FocalBackwardSetup b = focal_backward_setup(grad_out, inputs, targets, red, output_mask);
  if (b.done) return {b.grad_inputs, b.grad_targets};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, b.x.scalar_type(), "customops::sigmoid_focal_loss_backward", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        const auto prm = focal_loss_params<opmath_t>(alpha, gamma);
        const opmath_t scale = static_cast<opmath_t>(b.scale);
        const scalar_t* gop = b.go.tensor.const_data_ptr<scalar_t>();
        const scalar_t* xp = b.x.const_data_ptr<scalar_t>();
        const scalar_t* tp = b.t.const_data_ptr<scalar_t>();
        scalar_t* gx = output_mask[0] ? b.grad_inputs.data_ptr<scalar_t>() : nullptr;
        scalar_t* gt = output_mask[1] ? b.grad_targets.data_ptr<scalar_t>() : nullptr;
        if (output_mask[0] && output_mask[1]) {
          launch_backward<scalar_t, true, true>(gop, b.go.scalar, scale, xp, tp, gx, gt, b.n, prm);
        } else if (output_mask[0]) {
          launch_backward<scalar_t, true, false>(gop, b.go.scalar, scale, xp, tp, gx, gt, b.n, prm);
        } else {
          launch_backward<scalar_t, false, true>(gop, b.go.scalar, scale, xp, tp, gx, gt, b.n, prm);
        }
      });
  return {b.grad_inputs, b.grad_targets};
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("sigmoid_focal_loss", &sigmoid_focal_loss_cuda);
  m.impl("sigmoid_focal_loss_backward", &sigmoid_focal_loss_backward_cuda);
}

}  // namespace customops
