// fused_linear_sigmoid under torch.autocast: the same policy as F.linear
// (ATen's lower_precision_fp list on CUDA and CPU). Floating inputs other than
// float64 are cast to the autocast dtype of the device (float16 or bfloat16, as
// the user chose), then the call is redispatched with autocast excluded, so
// autograd records the casts and saves the 16-bit tensors for backward.
//
// Registered in C++ (not with torch.library.register_autocast, which casts to one
// fixed dtype) so that it also applies in TorchScript and C++ programs.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include "../common/library.h"

namespace customops {
namespace {

at::Tensor fused_linear_sigmoid_redispatch(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("customops::fused_linear_sigmoid", "")
                             .typed<decltype(fused_linear_sigmoid_redispatch)>();
  return op.call(x, weight, bias);
}

template <c10::DeviceType device_type>
using LowerPrecisionFp = at::autocast::WrapFunction<
    at::autocast::CastPolicy::lower_precision_fp, device_type, decltype(fused_linear_sigmoid_redispatch),
    decltype(fused_linear_sigmoid_redispatch), &fused_linear_sigmoid_redispatch>;

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(AutocastCUDA, m) {
  m.impl("fused_linear_sigmoid", &LowerPrecisionFp<c10::DeviceType::CUDA>::type::call);
}

CUSTOMOPS_LIBRARY_IMPL(AutocastCPU, m) {
  m.impl("fused_linear_sigmoid", &LowerPrecisionFp<c10::DeviceType::CPU>::type::call);
}

}  // namespace customops
