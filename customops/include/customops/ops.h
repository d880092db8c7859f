// customops' C++ API: one function per op, each a call through the PyTorch dispatcher (so
// autograd, autocast and the CPU/CUDA kernels apply as they do from Python).
//
//   find_package(customops 0.1 REQUIRED)     # CMAKE_PREFIX_PATH: customops.cmake_prefix_path()
//   target_link_libraries(app PRIVATE customops::customops)
//
// Shapes, dtypes and errors are those of the Python functions of the same names (README).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace customops {

// sigmoid(x @ weight.T + bias): x (*, in_features), weight (out_features, in_features),
// bias (out_features,) or none; returns (*, out_features).
at::Tensor fused_linear_sigmoid(
    const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias = std::nullopt);
// Gradients of fused_linear_sigmoid from its output y; an output whose output_mask entry is
// false is an empty tensor.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_sigmoid_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask = {true, true, true});

// a + b, equal shapes and dtypes.
at::Tensor add(const at::Tensor& a, const at::Tensor& b);

// 1 / (1 + exp(-x)), and its gradient from the output y: grad_out * y * (1 - y).
at::Tensor sigmoid(const at::Tensor& x);
at::Tensor sigmoid_backward(const at::Tensor& grad_out, const at::Tensor& y);

// Lin et al.'s focal loss, torchvision.ops.sigmoid_focal_loss's semantics; reduction "none",
// "mean" or "sum".
at::Tensor sigmoid_focal_loss(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha = 0.25, double gamma = 2.0,
    std::string_view reduction = "none");
std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_backward(
    const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    std::string_view reduction, std::array<bool, 2> output_mask = {true, true});

// Deformable convolution (Dai et al. 2017), modulated by mask (Zhu et al. 2019), with
// torchvision.ops.deform_conv2d's semantics: input (B, C_in, H, W), offset
// (B, 2 * offset_groups * kh * kw, H_out, W_out), weight (C_out, C_in / groups, kh, kw), bias
// (C_out,) or none, mask (B, offset_groups * kh * kw, H_out, W_out) or none; returns
// (B, C_out, H_out, W_out) in the input's suggested memory format, as conv2d's: channels_last for a
// channels_last input, else contiguous.
at::Tensor deform_conv2d(
    const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias = std::nullopt, std::array<int64_t, 2> stride = {1, 1},
    std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1},
    const std::optional<at::Tensor>& mask = std::nullopt);
// Gradients of deform_conv2d: (grad_input, grad_offset, grad_weight, grad_bias, grad_mask); an
// output whose output_mask entry is false, and grad_mask without a mask, is an empty tensor.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const std::optional<at::Tensor>& mask, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
    std::array<int64_t, 2> dilation, std::array<bool, 5> output_mask = {true, true, true, true, true});

// What the loaded op library was built with and where it was loaded from, as JSON:
// {"customops": version, "torch": version, "cuda_kernels": bool, "cuda_archs": [...],
//  "cutlass_sm90_kernels": bool, "library": path}.
std::string build_info();

}  // namespace customops
