// sigmoid_focal_loss and its backward, CPU kernels. Formulas: sigmoid_focal_loss.h.
//   forward "none": one elementwise pass; "sum"/"mean": per-chunk partial sums in double
//     over fixed 16384-element chunks, added in chunk order (the same result for any
//     number of threads), no per-element output.
//   backward: one pass that reads x, t (and grad_out unless it is one value) and writes
//     the requested gradients; nothing is saved from the forward but its inputs.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <limits>
#include <tuple>
#include <vector>

#include "../common/cpu_utils.h"
#include "sigmoid_focal_loss.h"
#include "../common/library.h"

namespace customops {
namespace {

constexpr int64_t kReduceChunk = 16384;

at::Tensor sigmoid_focal_loss_cpu(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma, c10::string_view reduction) {
  const FocalReduction red = check_sigmoid_focal_loss_args(inputs, targets, alpha, gamma, reduction);
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  const int64_t n = x.numel();
  if (red == FocalReduction::None) {
    at::Tensor out = at::empty(inputs.sizes(), inputs.options().memory_format(at::MemoryFormat::Contiguous));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "customops::sigmoid_focal_loss", [&] {
      using opmath_t = at::opmath_type<scalar_t>;
      cpu::parallel_elementwise<scalar_t, 2>(
          out.data_ptr<scalar_t>(), {x.const_data_ptr<scalar_t>(), t.const_data_ptr<scalar_t>()}, n,
          FocalLossFn<opmath_t>{focal_loss_params<opmath_t>(alpha, gamma)});
    });
    return out;
  }
  at::Tensor out = at::empty({}, inputs.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "customops::sigmoid_focal_loss", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const auto prm = focal_loss_params<opmath_t>(alpha, gamma);
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* tp = t.const_data_ptr<scalar_t>();
    const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
    std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t stop = std::min(n, (c + 1) * kReduceChunk);
        double s = 0;
        for (int64_t i = c * kReduceChunk; i < stop; ++i) {
          s += static_cast<double>(focal_loss(static_cast<opmath_t>(xp[i]), static_cast<opmath_t>(tp[i]), prm));
        }
        partial[static_cast<size_t>(c)] = s;
      }
    });
    double total = 0;
    for (const double s : partial) total += s;
    // The mean of no elements is NaN, as torch.mean gives (0 / 0).
    const double value = red == FocalReduction::Mean
                             ? (n > 0 ? total / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN())
                             : total;
    out.data_ptr<scalar_t>()[0] = static_cast<scalar_t>(static_cast<opmath_t>(value));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction, std::array<bool, 2> output_mask) {
  const FocalReduction red = check_sigmoid_focal_loss_backward_args(grad_out, inputs, targets, alpha, gamma, reduction);
  const FocalBackwardSetup b = focal_backward_setup(grad_out, inputs, targets, red, output_mask);
  if (b.done) return {b.grad_inputs, b.grad_targets};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, b.x.scalar_type(), "customops::sigmoid_focal_loss_backward", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        const auto prm = focal_loss_params<opmath_t>(alpha, gamma);
        const opmath_t scale = static_cast<opmath_t>(b.scale);
        const scalar_t* gop = b.go.tensor.const_data_ptr<scalar_t>();
        const bool go_scalar = b.go.scalar;
        const opmath_t g0 = go_scalar ? static_cast<opmath_t>(gop[0]) * scale : opmath_t(0);
        const scalar_t* xp = b.x.const_data_ptr<scalar_t>();
        const scalar_t* tp = b.t.const_data_ptr<scalar_t>();
        scalar_t* gx = output_mask[0] ? b.grad_inputs.data_ptr<scalar_t>() : nullptr;
        scalar_t* gt = output_mask[1] ? b.grad_targets.data_ptr<scalar_t>() : nullptr;
        at::parallel_for(0, b.n, cpu::kGrainSize / 8, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const opmath_t xi = static_cast<opmath_t>(xp[i]);
            const opmath_t ti = static_cast<opmath_t>(tp[i]);
            const opmath_t g = go_scalar ? g0 : static_cast<opmath_t>(gop[i]) * scale;
            const FocalTerms<opmath_t> r = focal_terms(xi, ti, prm);
            if (gx) gx[i] = static_cast<scalar_t>(g * focal_grad_inputs(r, ti, prm));
            if (gt) gt[i] = static_cast<scalar_t>(g * focal_grad_targets(r, xi, prm));
          }
        });
      });
  return {b.grad_inputs, b.grad_targets};
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("sigmoid_focal_loss", &sigmoid_focal_loss_cpu);
  m.impl("sigmoid_focal_loss_backward", &sigmoid_focal_loss_backward_cpu);
}

}  // namespace customops
