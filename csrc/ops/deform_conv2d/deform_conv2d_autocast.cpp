// deform_conv2d under torch.autocast: conv2d's policy (ATen's lower_precision_fp list on CUDA
// and CPU). Floating inputs other than float64 are cast to the autocast dtype of the device
// (float16 or bfloat16), then the call is redispatched with autocast excluded, so autograd
// records the casts. A network whose offsets come from an autocast conv2d (16-bit) and whose
// input is float32 then runs, as its dense convolutions do; outside autocast, mixed dtypes
// remain an error. (torchvision's op casts to float32 instead: its 16-bit kernels were slow.)
//
// Registered in C++ so that it also applies in TorchScript and C++ programs.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "../common/library.h"

namespace customops {
namespace {

at::Tensor deform_conv2d_redispatch(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const c10::optional<at::Tensor>& mask) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("customops::deform_conv2d", "")
                             .typed<decltype(deform_conv2d_redispatch)>();
  return op.call(input, offset, weight, bias, stride, padding, dilation, mask);
}

template <c10::DeviceType device_type>
using LowerPrecisionFp = at::autocast::WrapFunction<
    at::autocast::CastPolicy::lower_precision_fp, device_type, decltype(deform_conv2d_redispatch),
    decltype(deform_conv2d_redispatch), &deform_conv2d_redispatch>;

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(AutocastCUDA, m) {
  m.impl("deform_conv2d", &LowerPrecisionFp<c10::DeviceType::CUDA>::type::call);
}

CUSTOMOPS_LIBRARY_IMPL(AutocastCPU, m) {
  m.impl("deform_conv2d", &LowerPrecisionFp<c10::DeviceType::CPU>::type::call);
}

}  // namespace customops
