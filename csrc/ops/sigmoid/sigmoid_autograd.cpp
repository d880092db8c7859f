// sigmoid and sigmoid_backward, autograd kernels (C++ for the reason given in
// add/add_autograd.cpp).
//   sigmoid:          grad_x = sigmoid_backward(grad, y), from the saved output y.
//   sigmoid_backward: out = g * y * (1 - y), so d/dg = y (1 - y) and d/dy = g (1 - 2y).
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "../common/autograd_utils.h"
#include "../common/library.h"

namespace customops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor sigmoid_op(const at::Tensor& x) {
  static const auto op = find_op<at::Tensor(const at::Tensor&)>("sigmoid");
  return op.call(x);
}

at::Tensor sigmoid_backward_op(const at::Tensor& grad_out, const at::Tensor& y) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("sigmoid_backward");
  return op.call(grad_out, y);
}

class SigmoidBackwardFunction : public torch::autograd::Function<SigmoidBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& y) {
    ctx->save_for_backward({grad_out, y});
    at::AutoDispatchBelowADInplaceOrView guard;
    return sigmoid_backward_op(grad_out, y);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& grad_out = saved[0];
    const at::Tensor& y = saved[1];
    const at::Tensor& gg = grads[0];
    at::Tensor d_grad_out, d_y;
    if (ctx->needs_input_grad(0)) d_grad_out = sigmoid_backward_op(gg, y);
    if (ctx->needs_input_grad(1)) d_y = gg * grad_out * (1 - 2 * y);
    return {d_grad_out, d_y};
  }
};

class SigmoidFunction : public torch::autograd::Function<SigmoidFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor y;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      y = sigmoid_op(x);
    }
    ctx->save_for_backward({y});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {sigmoid_backward_op(grads[0], saved[0])};
  }
};

at::Tensor sigmoid_autograd(const at::Tensor& x) {
  if (!any_records_autograd(x)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return sigmoid_op(x);
  }
  return SigmoidFunction::apply(x);
}

at::Tensor sigmoid_backward_autograd(const at::Tensor& grad_out, const at::Tensor& y) {
  if (!any_records_autograd(grad_out, y)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return sigmoid_backward_op(grad_out, y);
  }
  return SigmoidBackwardFunction::apply(grad_out, y);
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(Autograd, m) {
  m.impl("sigmoid", &sigmoid_autograd);
  m.impl("sigmoid_backward", &sigmoid_backward_autograd);
}

}  // namespace customops
