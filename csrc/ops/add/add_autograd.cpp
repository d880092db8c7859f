// add, autograd kernel: d(a + b)/da = d(a + b)/db = identity.
//
// Autograd is registered in C++ (as torchvision does) rather than with
// torch.library.register_autograd: a Python autograd kernel runs on every call, grad or
// not, and cost 15-25 us per call on the H200 machine's CPU (docs/design.md), and a
// C++ program would get no gradients at all.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "../common/autograd_utils.h"
#include "../common/library.h"

namespace customops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor add_op(const at::Tensor& a, const at::Tensor& b) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("add");
  return op.call(a, b);
}

class AddFunction : public torch::autograd::Function<AddFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return add_op(a, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], grads[0]};
  }
};

at::Tensor add_autograd(const at::Tensor& a, const at::Tensor& b) {
  if (!any_records_autograd(a, b)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return add_op(a, b);
  }
  return AddFunction::apply(a, b);
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(Autograd, m) {
  m.impl("add", &add_autograd);
}

}  // namespace customops
