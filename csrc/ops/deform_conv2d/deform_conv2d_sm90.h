// deform_conv2d's Hopper forward (sm90/implicit_gemm.cu): compiled where the build has sm_90a
// and CUTLASS (CUSTOMOPS_WITH_CUTLASS).
#pragma once
#include <ATen/ATen.h>

#include "deform_conv2d.h"

namespace customops {
namespace deform_conv2d_sm90 {

// Whether the implicit GEMM can run these arguments on input's GPU: compute capability 9.x,
// float16 or bfloat16, one group, in_channels and in_channels / offset_groups multiples of 64.
bool supported(const DeformConv2dGeometry& g, const at::Tensor& input);

// out (NCHW contiguous) = deform_conv2d(...), from xs, the input channels-last contiguous.
void forward(
    const DeformConv2dGeometry& g, const at::Tensor& xs, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& mask, at::Tensor& out);

}  // namespace deform_conv2d_sm90
}  // namespace customops
