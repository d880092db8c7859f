// sigmoid_focal_loss: the argument checks and the per-element formulas, shared by
// the CPU and CUDA kernels so that both backends compute the same function.
//
// The loss of Lin et al., "Focal Loss for Dense Object Detection" (2017), with
// torchvision.ops.sigmoid_focal_loss's semantics and defaults. For a logit x and a
// target t in [0, 1] (soft targets allowed):
//   p = sigmoid(x), q = 1 - p = sigmoid(-x)
//   ce  = BCE-with-logits(x, t) = max(x, 0) - x t + log1p(exp(-|x|))
//   m   = 1 - p_t = p (1 - t) + q t            (p_t = p t + (1 - p)(1 - t))
//   a_t = alpha t + (1 - alpha)(1 - t) if alpha >= 0, else 1
//   loss = a_t * ce * m^gamma
// p and q both come from exp(-|x|), never as 1 - the other, so m keeps its precision
// for confident predictions and nothing overflows for any finite x.
//
// Gradients (derived by hand, checked against a float64 autograd reference in
// tests/test_sigmoid_focal_loss.py), with dce/dx = p - t = p (1 - t) - q t,
// dm/dx = p q (1 - 2t), dce/dt = -x, dm/dt = q - p, da_t/dt = 2 alpha - 1 (0 unweighted):
//   dL/dx = a_t m^g [ (p - t) + g ce (p q / m) (1 - 2t) ]
//   dL/dt = (da_t/dt) ce m^g + a_t m^g [ -x + g (ce / m) (q - p) ]
// written with m^g factored out so that no m^(g - 1) is ever formed: p q / m lies in
// [0, 1] (m >= min(p, q) >= p q) and ce / m is at most about max(|x|, 1). Where m is
// exactly 0 (a saturated, correct, hard-target prediction) the ratios are taken as 0,
// which is the limit of the true derivative for every gamma > 0 (and irrelevant for
// gamma = 0, where they are multiplied by 0). torchvision's autograd differs there for
// 0 < gamma < 1: it forms m^(g - 1) = inf and returns NaN; we return the limit.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/string_view.h>

#include <array>
#include <cmath>
#include <string>

#include "../common/checks.h"

namespace customops {

enum class FocalReduction { None, Mean, Sum };

inline const char* focal_reduction_name(FocalReduction r) {
  return r == FocalReduction::None ? "none" : r == FocalReduction::Mean ? "mean" : "sum";
}

// The checks of sigmoid_focal_loss's arguments, in the order the fake kernel
// (customops/ops/sigmoid_focal_loss.py) runs them; returns the parsed reduction.
inline FocalReduction check_sigmoid_focal_loss_args(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma, c10::string_view reduction) {
  check_elementwise_pair(inputs, "inputs", targets, "targets");
  const std::string red(reduction.data(), reduction.size());
  TORCH_CHECK(
      red == "none" || red == "mean" || red == "sum",
      "customops: expected reduction to be 'none', 'mean' or 'sum', but got '", red, "'");
  // A NaN alpha would silently turn the weighting off (alpha >= 0 is false) and an infinite one
  // makes every loss NaN: both are user errors, like a non-finite gamma.
  TORCH_CHECK(
      std::isfinite(alpha), "customops: expected alpha to be a finite number (< 0 turns the weighting off), but got ",
      std::to_string(alpha));
  TORCH_CHECK(
      gamma >= 0 && std::isfinite(gamma), "customops: expected gamma to be a finite number >= 0, but got ",
      std::to_string(gamma));
  return red == "none" ? FocalReduction::None : red == "mean" ? FocalReduction::Mean : FocalReduction::Sum;
}

inline FocalReduction check_sigmoid_focal_loss_backward_args(
    const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction) {
  const FocalReduction red = check_sigmoid_focal_loss_args(inputs, targets, alpha, gamma, reduction);
  check_floating(grad_out, "grad_out");
  check_same_device(grad_out, "grad_out", inputs, "inputs");
  check_same_dtype(grad_out, "grad_out", inputs, "inputs");
  if (red == FocalReduction::None) {
    check_same_shape(grad_out, "grad_out", inputs, "inputs");
  } else {
    TORCH_CHECK(
        grad_out.dim() == 0, "customops: expected grad_out to be 0-dimensional (reduction '", focal_reduction_name(red),
        "'), but got shape ", shape_str(grad_out.sizes()));
  }
  return red;
}

// grad_out as the backward kernels read it: one value for every element (the reduced
// losses' 0-dim gradient, or an expanded scalar such as loss.sum()'s gradient, whose
// strides are 0 on every dimension of size > 1), or a contiguous tensor of inputs' shape.
struct FocalGradOut {
  at::Tensor tensor;
  bool scalar;
};

inline FocalGradOut focal_grad_out(const at::Tensor& grad_out, FocalReduction red) {
  if (red != FocalReduction::None) return {grad_out, true};
  bool broadcast_scalar = grad_out.numel() > 0;
  for (int64_t d = 0; d < grad_out.dim(); ++d) {
    if (grad_out.size(d) > 1 && grad_out.stride(d) != 0) broadcast_scalar = false;
  }
  if (broadcast_scalar) return {grad_out, true};
  return {grad_out.contiguous(), false};
}

// What both backends' backward needs after the checks (and the CUDA device guard): the
// output_mask's gradients allocated (the others empty), contiguous inputs, grad_out as a
// scalar or an elementwise tensor, and 1/n for "mean". done: nothing to compute.
struct FocalBackwardSetup {
  at::Tensor grad_inputs, grad_targets, x, t;
  FocalGradOut go;
  int64_t n;
  double scale;
  bool done;
};

inline FocalBackwardSetup focal_backward_setup(
    const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets, FocalReduction red,
    std::array<bool, 2> output_mask) {
  const auto contiguous = inputs.options().memory_format(at::MemoryFormat::Contiguous);
  FocalBackwardSetup b;
  b.grad_inputs = output_mask[0] ? at::empty(inputs.sizes(), contiguous) : inputs.new_empty({0});
  b.grad_targets = output_mask[1] ? at::empty(inputs.sizes(), contiguous) : inputs.new_empty({0});
  b.n = inputs.numel();
  b.scale = red == FocalReduction::Mean && b.n > 0 ? 1.0 / static_cast<double>(b.n) : 1.0;
  b.done = b.n == 0 || !(output_mask[0] || output_mask[1]);
  if (b.done) return b;
  b.x = inputs.contiguous();
  b.t = targets.contiguous();
  b.go = focal_grad_out(grad_out, red);
  return b;
}

// --- per-element formulas; T is the opmath type (float for 16-bit inputs) ---------------

template <typename T>
struct FocalLossParams {
  T alpha;
  T gamma;
  bool weighted;  // alpha >= 0 (torchvision: alpha < 0, e.g. -1, means no weighting)
};

template <typename T>
FocalLossParams<T> focal_loss_params(double alpha, double gamma) {
  return {static_cast<T>(alpha), static_cast<T>(gamma), alpha >= 0};
}

// m^gamma for m in [0, 1]; exact shortcuts for the common exponents (gamma is the same for
// every thread, so the branches do not diverge). pow(0, 0) = 1, as torch.pow gives.
template <typename T>
C10_HOST_DEVICE inline T focal_pow(T m, T gamma) {
  if (gamma == T(2)) return m * m;
  if (gamma == T(1)) return m;
  if (gamma == T(0)) return T(1);
  return std::pow(m, gamma);
}

template <typename T>
struct FocalTerms {
  T p, q, ce, m, mg, at;
};

template <typename T>
C10_HOST_DEVICE inline FocalTerms<T> focal_terms(T x, T t, const FocalLossParams<T>& prm) {
  const T e = std::exp(-std::fabs(x));  // in [0, 1]: never overflows
  const T inv = T(1) / (T(1) + e);
  const bool pos = x >= T(0);
  FocalTerms<T> r;
  r.p = pos ? inv : e * inv;
  r.q = pos ? e * inv : inv;
  r.ce = (x > T(0) ? x : T(0)) - x * t + std::log1p(e);
  r.m = r.p * (T(1) - t) + r.q * t;
  r.mg = focal_pow(r.m, prm.gamma);
  r.at = prm.weighted ? prm.alpha * t + (T(1) - prm.alpha) * (T(1) - t) : T(1);
  return r;
}

template <typename T>
C10_HOST_DEVICE inline T focal_loss(T x, T t, const FocalLossParams<T>& prm) {
  const FocalTerms<T> r = focal_terms(x, t, prm);
  return r.at * r.ce * r.mg;
}

// dL/dx and dL/dt from the terms of (x, t); a kernel that needs both computes the terms once.
template <typename T>
C10_HOST_DEVICE inline T focal_grad_inputs(const FocalTerms<T>& r, T t, const FocalLossParams<T>& prm) {
  const T pq_over_m = r.m > T(0) ? r.p * r.q / r.m : T(0);
  return r.at * r.mg * ((r.p * (T(1) - t) - r.q * t) + prm.gamma * r.ce * pq_over_m * (T(1) - T(2) * t));
}

template <typename T>
C10_HOST_DEVICE inline T focal_grad_targets(const FocalTerms<T>& r, T x, const FocalLossParams<T>& prm) {
  const T ce_over_m = r.m > T(0) ? r.ce / r.m : T(0);
  const T dat = prm.weighted ? T(2) * prm.alpha - T(1) : T(0);
  return dat * r.ce * r.mg + r.at * r.mg * (-x + prm.gamma * ce_over_m * (r.q - r.p));
}

// The loss as a function object, for the elementwise loops of both backends (reduction "none").
template <typename T>
struct FocalLossFn {
  FocalLossParams<T> prm;
  C10_HOST_DEVICE T operator()(T x, T t) const {
    return focal_loss(x, t, prm);
  }
};

}  // namespace customops
