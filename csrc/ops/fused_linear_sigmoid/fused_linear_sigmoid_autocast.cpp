// fused_linear_sigmoid under torch.autocast: the same policy as F.linear (ATen's
// lower_precision_fp list on CUDA and CPU; ../common/autocast_utils.h), so that autograd saves
// the 16-bit tensors for backward.
#include <torch/library.h>

#include "../common/autocast_utils.h"
#include "../common/library.h"

namespace customops {
namespace {

constexpr char kFusedLinearSigmoid[] = "customops::fused_linear_sigmoid";
using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&);

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(AutocastCUDA, m) {
  m.impl(
      "fused_linear_sigmoid", &autocast::LowerPrecisionFp<kFusedLinearSigmoid, Signature, c10::DeviceType::CUDA>::call);
}

CUSTOMOPS_LIBRARY_IMPL(AutocastCPU, m) {
  m.impl(
      "fused_linear_sigmoid", &autocast::LowerPrecisionFp<kFusedLinearSigmoid, Signature, c10::DeviceType::CPU>::call);
}

}  // namespace customops
