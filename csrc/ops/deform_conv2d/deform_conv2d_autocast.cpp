// deform_conv2d under torch.autocast: conv2d's policy (ATen's lower_precision_fp list on CUDA
// and CPU; ../common/autocast_utils.h). A network whose offsets come from an autocast conv2d
// (16-bit) and whose input is float32 then runs, as its dense convolutions do; outside
// autocast, mixed dtypes remain an error. (torchvision's op casts to float32 instead: its
// 16-bit kernels were slow.)
#include <torch/library.h>

#include "../common/autocast_utils.h"
#include "../common/library.h"

namespace customops {
namespace {

constexpr char kDeformConv2d[] = "customops::deform_conv2d";
using Signature = at::Tensor(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, at::IntArrayRef,
    at::IntArrayRef, at::IntArrayRef, const c10::optional<at::Tensor>&);

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(AutocastCUDA, m) {
  m.impl("deform_conv2d", &autocast::LowerPrecisionFp<kDeformConv2d, Signature, c10::DeviceType::CUDA>::call);
}

CUSTOMOPS_LIBRARY_IMPL(AutocastCPU, m) {
  m.impl("deform_conv2d", &autocast::LowerPrecisionFp<kDeformConv2d, Signature, c10::DeviceType::CPU>::call);
}

}  // namespace customops
