// deform_conv2d and its backward, CUDA kernels: a straightforward first version, the same
// structure as the CPU kernels with an NCHW column buffer. Formula: deform_conv2d.h.
//   forward, per image and chunk of output pixels: deform_conv2d_im2col_kernel (one thread
//     per column element) writes (in_channels * kh * kw, pixels) columns, then one at::mm
//     per group (cuBLAS, on the current stream; float32 follows torch's matmul precision).
//   backward: grad_weight += grad_out x columns^T (GEMM, columns recomputed); grad columns
//     = weight^T x grad_out (GEMM); deform_conv2d_col2im_kernel scatters them into
//     grad_input with atomics (not deterministic in the last bits); and
//     deform_conv2d_coord_kernel (one thread per pixel, offset group and tap) reduces over
//     the offset group's channels for grad_offset and grad_mask.
// 16-bit inputs are converted to float32 and computed in float32, float64 in float64.
// Every launch is on the current stream, after the checks and a device guard, with 64-bit
// indices, and is followed by CUSTOMOPS_CUDA_LAUNCH_CHECK; empty work launches nothing.
#include <torch/library.h>

#include <array>
#include <tuple>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "../common/library.h"
#include "deform_conv2d.h"

namespace customops {
namespace {

// Column buffer bytes per chunk.
constexpr int64_t kColumnBudget = 256ll << 20;

// col[(c * taps + k) * n + r] = mask * bilinear(x[c], tap k of pixel p0 + r).
template <typename T>
__global__ void deform_conv2d_im2col_kernel(
    const T* __restrict__ x, const T* __restrict__ off, const T* __restrict__ msk, DeformConv2dGeometry g, int64_t p0,
    int64_t n, T* __restrict__ col) {
  const int64_t total = g.in_channels * g.taps() * n;
  const int64_t plane = g.height * g.width;
  const int64_t cog = g.in_per_offset_group();
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx % n, t = idx / n;
    const int64_t k = t % g.taps(), c = t / g.taps();
    T m;
    const BilinearTap<T> tap = deform_conv2d_tap(g, off, msk, p0 + r, c / cog, k, &m);
    const T* src = x + c * plane;
    T v = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (tap.idx[q] >= 0) v += tap.w[q] * src[tap.idx[q]];
    }
    col[idx] = m * v;
  }
}

// gx[c] += the transpose of im2col applied to the grad columns.
template <typename T>
__global__ void deform_conv2d_col2im_kernel(
    const T* __restrict__ gcol, const T* __restrict__ off, const T* __restrict__ msk, DeformConv2dGeometry g,
    int64_t p0, int64_t n, T* __restrict__ gx) {
  const int64_t total = g.in_channels * g.taps() * n;
  const int64_t plane = g.height * g.width;
  const int64_t cog = g.in_per_offset_group();
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx % n, t = idx / n;
    const int64_t k = t % g.taps(), c = t / g.taps();
    T m;
    const BilinearTap<T> tap = deform_conv2d_tap(g, off, msk, p0 + r, c / cog, k, &m);
    if (!tap.inside) continue;
    const T v = m * gcol[idx];
    T* dst = gx + c * plane;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (tap.idx[q] >= 0) atomicAdd(dst + tap.idx[q], tap.w[q] * v);
    }
  }
}

// grad_offset and grad_mask of pixel p0 + r, offset group og and tap k: one thread each.
template <typename T>
__global__ void deform_conv2d_coord_kernel(
    const T* __restrict__ gcol, const T* __restrict__ x, const T* __restrict__ off, const T* __restrict__ msk,
    DeformConv2dGeometry g, int64_t p0, int64_t n, T* __restrict__ goff, T* __restrict__ gmask) {
  const int64_t total = g.offset_groups * g.taps() * n;
  const int64_t plane = g.height * g.width;
  const int64_t cog = g.in_per_offset_group();
  const int64_t P = g.out_pixels();
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx % n, t = idx / n;
    const int64_t k = t % g.taps(), og = t / g.taps();
    const int64_t p = p0 + r;
    T m;
    const BilinearTap<T> tap = deform_conv2d_tap(g, off, msk, p, og, k, &m);
    T gy = 0, gxv = 0, gm = 0;
    if (tap.inside) {
      T d[4] = {0, 0, 0, 0};
      for (int64_t c = og * cog; c < (og + 1) * cog; ++c) {
        const T gc = gcol[(c * g.taps() + k) * n + r];
        const T* src = x + c * plane;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (tap.idx[q] >= 0) d[q] += gc * src[tap.idx[q]];
        }
      }
      bilinear_tap_grads(tap, d, m, &gy, &gxv, &gm);
    }
    const int64_t ok = og * g.taps() + k;
    if (goff) {
      goff[(2 * ok) * P + p] = gy;
      goff[(2 * ok + 1) * P + p] = gxv;
    }
    if (gmask) gmask[ok * P + p] = gm;
  }
}

template <typename T>
void launch_im2col(
    const T* x, const T* off, const T* msk, const DeformConv2dGeometry& g, int64_t p0, int64_t n, T* col) {
  const int64_t total = g.in_channels * g.taps() * n;
  if (total == 0) return;
  deform_conv2d_im2col_kernel<T>
      <<<cuda::grid_for(total), cuda::block_size("deform_conv2d_im2col_kernel"), 0, at::cuda::getCurrentCUDAStream()>>>(
          x, off, msk, g, p0, n, col);
  CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_im2col_kernel");
}

// What the forward and the backward read, in the compute type T, NCHW contiguous.
struct CudaOperands {
  at::Tensor x, off, msk, w;  // w: (groups, out_channels / groups, in_channels / groups * kh * kw)

  CudaOperands(
      const DeformConv2dGeometry& g, at::ScalarType ct, const at::Tensor& input, const at::Tensor& offset,
      const at::Tensor& weight, const c10::optional<at::Tensor>& mask) {
    x = input.to(ct).contiguous();
    off = offset.to(ct).contiguous();
    if (mask.has_value()) msk = mask->to(ct).contiguous();
    w = weight.to(ct).contiguous().view({g.groups, g.out_per_group(), g.in_per_group() * g.taps()});
  }
};

template <typename T>
struct ImagePtrs {
  const T *x, *off, *msk;
};

template <typename T>
ImagePtrs<T> image_ptrs(const CudaOperands& o, const DeformConv2dGeometry& g, int64_t b) {
  const int64_t P = g.out_pixels();
  return {
      o.x.const_data_ptr<T>() + b * g.in_channels * g.height * g.width,
      o.off.const_data_ptr<T>() + b * g.offset_groups * g.taps() * 2 * P,
      o.msk.defined() ? o.msk.const_data_ptr<T>() + b * g.offset_groups * g.taps() * P : nullptr};
}

template <typename T>
void forward_impl(
    const DeformConv2dGeometry& g, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& mask, at::Tensor& out) {
  const auto ct = c10::CppTypeToScalarType<T>::value;
  const CudaOperands o(g, ct, input, offset, weight, mask);
  at::Tensor out_t = out.scalar_type() == ct ? out : at::empty(out.sizes(), out.options().dtype(ct));
  const at::Tensor out3 = out_t.view({g.batch, g.out_channels, g.out_pixels()});
  const int64_t K = g.in_channels * g.taps(), Kg = K / g.groups;
  const int64_t chunk = deform_conv2d_chunk_pixels(g, sizeof(T), kColumnBudget);
  const at::Tensor col = at::empty({K * chunk}, o.x.options());
  for (int64_t b = 0; b < g.batch; ++b) {
    const ImagePtrs<T> im = image_ptrs<T>(o, g, b);
    for (int64_t p0 = 0; p0 < g.out_pixels(); p0 += chunk) {
      const int64_t n = std::min(chunk, g.out_pixels() - p0);
      const at::Tensor cols = col.narrow(0, 0, K * n).view({K, n});
      launch_im2col<T>(im.x, im.off, im.msk, g, p0, n, cols.data_ptr<T>());
      for (int64_t gc = 0; gc < g.groups; ++gc) {
        at::Tensor dst = out3[b].narrow(0, gc * g.out_per_group(), g.out_per_group()).narrow(1, p0, n);
        at::mm_out(dst, o.w[gc], cols.narrow(0, gc * Kg, Kg));
      }
    }
  }
  if (bias.has_value()) out_t.add_(bias->to(ct).view({1, g.out_channels, 1, 1}));
  if (!out_t.is_same(out)) out.copy_(out_t);
}

at::Tensor deform_conv2d_cuda(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const c10::optional<at::Tensor>& mask) {
  const DeformConv2dGeometry g = check_deform_conv2d_args(input, offset, weight, bias, stride, padding, dilation, mask);
  const c10::cuda::CUDAGuard device_guard(input.device());
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Tensor out = at::empty(
      {g.batch, g.out_channels, g.out_h, g.out_w}, input.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  if (input.scalar_type() == at::kDouble) {
    forward_impl<double>(g, input, offset, weight, bias, mask, out);
  } else {
    forward_impl<float>(g, input, offset, weight, bias, mask, out);
  }
  return out;
}

template <typename T>
void backward_impl(
    const DeformConv2dGeometry& g, const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset,
    const at::Tensor& weight, const c10::optional<at::Tensor>& mask, std::array<bool, 5> want, at::Tensor& gx_t,
    at::Tensor& goff_t, at::Tensor& gw_t, at::Tensor& gmask_t) {
  const auto ct = c10::CppTypeToScalarType<T>::value;
  const CudaOperands o(g, ct, input, offset, weight, mask);
  const at::Tensor go = grad_out.to(ct).contiguous().view({g.batch, g.out_channels, g.out_pixels()});
  const int64_t K = g.in_channels * g.taps(), Kg = K / g.groups, P = g.out_pixels();
  const int64_t chunk = deform_conv2d_chunk_pixels(g, sizeof(T), kColumnBudget);
  const at::Tensor col = at::empty({K * chunk}, o.x.options());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool need_gcol = want[0] || want[1] || want[4];
  for (int64_t b = 0; b < g.batch; ++b) {
    const ImagePtrs<T> im = image_ptrs<T>(o, g, b);
    T* gx = want[0] ? gx_t.data_ptr<T>() + b * g.in_channels * g.height * g.width : nullptr;
    T* goff = want[1] ? goff_t.data_ptr<T>() + b * g.offset_groups * g.taps() * 2 * P : nullptr;
    T* gmask = want[4] ? gmask_t.data_ptr<T>() + b * g.offset_groups * g.taps() * P : nullptr;
    for (int64_t p0 = 0; p0 < P; p0 += chunk) {
      const int64_t n = std::min(chunk, P - p0);
      const at::Tensor cols = col.narrow(0, 0, K * n).view({K, n});
      if (want[2]) {
        launch_im2col<T>(im.x, im.off, im.msk, g, p0, n, cols.data_ptr<T>());
        for (int64_t gc = 0; gc < g.groups; ++gc) {
          const at::Tensor go_g = go[b].narrow(0, gc * g.out_per_group(), g.out_per_group()).narrow(1, p0, n);
          gw_t[gc].addmm_(go_g, cols.narrow(0, gc * Kg, Kg).t());
        }
      }
      if (!need_gcol) continue;
      for (int64_t gc = 0; gc < g.groups; ++gc) {
        const at::Tensor go_g = go[b].narrow(0, gc * g.out_per_group(), g.out_per_group()).narrow(1, p0, n);
        at::Tensor dst = cols.narrow(0, gc * Kg, Kg);
        at::mm_out(dst, o.w[gc].t(), go_g);
      }
      const int64_t total = K * n;
      if (gx && total > 0) {
        deform_conv2d_col2im_kernel<T>
            <<<cuda::grid_for(total), cuda::block_size("deform_conv2d_col2im_kernel"), 0, stream>>>(
                cols.const_data_ptr<T>(), im.off, im.msk, g, p0, n, gx);
        CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_col2im_kernel");
      }
      const int64_t coords = g.offset_groups * g.taps() * n;
      if ((goff || gmask) && coords > 0) {
        deform_conv2d_coord_kernel<T>
            <<<cuda::grid_for(coords), cuda::block_size("deform_conv2d_coord_kernel"), 0, stream>>>(
                cols.const_data_ptr<T>(), im.x, im.off, im.msk, g, p0, n, goff, gmask);
        CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_coord_kernel");
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& mask, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    std::array<bool, 5> output_mask) {
  const DeformConv2dGeometry g =
      check_deform_conv2d_backward_args(grad_out, input, offset, weight, mask, stride, padding, dilation);
  const c10::cuda::CUDAGuard device_guard(input.device());
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::array<bool, 5> want = output_mask;
  want[4] = want[4] && g.has_mask;
  const auto ct = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto opts = input.options().dtype(ct);
  at::Tensor gx_t = want[0] ? at::zeros(input.sizes(), opts) : at::Tensor();
  at::Tensor goff_t = want[1] ? at::zeros(offset.sizes(), opts) : at::Tensor();
  at::Tensor gmask_t = want[4] ? at::zeros(mask->sizes(), opts) : at::Tensor();
  at::Tensor gw_t =
      want[2] ? at::zeros({g.groups, g.out_per_group(), g.in_per_group() * g.taps()}, opts) : at::Tensor();
  if ((want[0] || want[1] || want[2] || want[4]) && g.batch > 0 && g.out_channels > 0) {
    if (ct == at::kDouble) {
      backward_impl<double>(g, grad_out, input, offset, weight, mask, want, gx_t, goff_t, gw_t, gmask_t);
    } else {
      backward_impl<float>(g, grad_out, input, offset, weight, mask, want, gx_t, goff_t, gw_t, gmask_t);
    }
  }
  const auto dt = input.scalar_type();
  const auto none = [&] { return input.new_empty({0}); };  // one fresh tensor per output, never shared
  at::Tensor grad_input = want[0] ? gx_t.to(dt) : none();
  at::Tensor grad_offset = want[1] ? goff_t.to(dt) : none();
  at::Tensor grad_weight = want[2] ? gw_t.view(weight.sizes()).to(dt) : none();
  at::Tensor grad_bias = output_mask[3] ? grad_out.to(ct).sum(at::IntArrayRef{0, 2, 3}).to(dt) : none();
  at::Tensor grad_mask = want[4] ? gmask_t.to(dt) : none();
  return {grad_input, grad_offset, grad_weight, grad_bias, grad_mask};
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("deform_conv2d", &deform_conv2d_cuda);
  m.impl("deform_conv2d_backward", &deform_conv2d_backward_cuda);
}

}  // namespace customops
