// Autocast kernels with ATen's own policies, registered in C++ (not with
// torch.library.register_autocast, which casts to one fixed dtype) so that they also apply in
// C++ programs and to TorchScript modules run under autocast. An autocast region opened inside
// scripted code does not reach them: TorchScript rewrites such a region for ATen's ops alone.
//
//   constexpr char kName[] = "customops::op";
//   m.impl("op", &autocast::LowerPrecisionFp<kName, Signature, c10::DeviceType::CUDA>::call);
//
// lower_precision_fp (the policy of conv2d and linear): floating inputs other than float64 are
// cast to the device's autocast dtype (float16 or bfloat16, as the user chose), then the call is
// redispatched with autocast excluded, so autograd records the casts.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace customops {
namespace autocast {

template <const char* Name, class Signature>
struct Redispatch;

template <const char* Name, class Ret, class... Args>
struct Redispatch<Name, Ret(Args...)> {
  static Ret call(Args... args) {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(Name, "").typed<Ret(Args...)>();
    return op.call(args...);
  }
};

template <const char* Name, class Signature, c10::DeviceType device_type>
using LowerPrecisionFp = typename at::autocast::WrapFunction<
    at::autocast::CastPolicy::lower_precision_fp, device_type, Signature, Signature,
    &Redispatch<Name, Signature>::call>::type;

}  // namespace autocast
}  // namespace customops
