// The CUDA forward kernels of fused_linear_sigmoid and how the dispatcher
// (fused_linear_sigmoid_cuda.cu) picks one. Each kernel file states what it
// supports; `*_supported` never throws, `*_forward` assumes it returned true.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace customops {
namespace fls_cuda {

// The forward kernels. kGeneric (eager's own ATen calls: cuBLAS addmm, then sigmoid in
// place) runs everywhere; the others are faster where they apply.
enum class Kernel {
  kGeneric,
  kSmallM,             // M <= 8: weight-streaming tensor-core kernel, bias + sigmoid fused
  kSm90Pingpong128,    // CUTLASS sm90a, Pingpong 128x128x64 (TF32: x32), bias + sigmoid in the epilogue
  kSm90Pingpong128Epi64,  // the same with a 64x64 epilogue tile (16-bit only), for K <= 512
  kSm90Coop128x256,    // CUTLASS sm90a, Cooperative 128x256x64
};

const char* kernel_name(Kernel k);
std::optional<Kernel> kernel_from_name(const std::string& name);
std::string kernel_names();  // every name kernel_from_name accepts, comma-separated (for messages)

// x2d: (M, K); weight: (N, K); bias: (N,) contiguous or absent; out2d: (M, N) contiguous.
bool small_m_supported(const at::Tensor& x2d, const at::Tensor& weight);
void small_m_forward(
    const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d);

// True when the CUTLASS sm90a kernels were compiled into this library.
bool sm90_compiled();
// Whether CUTLASS kernel k runs these arguments: bf16/fp16, or float32 where torch allows TF32
// (Pingpong only).
bool sm90_supported(Kernel k, const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
void sm90_forward(
    Kernel k, const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& out2d);

}  // namespace fls_cuda
}  // namespace customops
