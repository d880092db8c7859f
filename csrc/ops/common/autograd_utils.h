// Shared by the ops' autograd kernels (csrc/ops/<op>/<op>_autograd.cpp) and the C++ API (csrc/api.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>

namespace customops {

// A typed handle to customops::<name>; call sites keep it in a function-local static.
// Calls through it go through the dispatcher: inside an AutoDispatchBelowADInplaceOrView
// guard they reach the backend (or fake) kernel; outside one they record autograd history,
// which is how double backward works.
template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow((std::string("customops::") + name).c_str(), "")
      .typed<Signature>();
}

// Whether an autograd kernel must go through its torch::autograd::Function: grad mode is on and
// an input requires grad, or an input carries a forward-mode tangent (which the Function
// refuses). Otherwise the kernel calls the op below autograd directly, since Function::apply
// builds a graph node and wraps the outputs even when nothing will use them: about half of a
// small call's host time.
inline bool records_autograd(const at::Tensor& t) {
  return t.defined() && ((at::GradMode::is_enabled() && t.requires_grad()) || t._fw_grad(/*level=*/0).defined());
}
inline bool records_autograd(const std::optional<at::Tensor>& t) {
  return t.has_value() && records_autograd(*t);
}
template <typename... Ts>
bool any_records_autograd(const Ts&... ts) {
  return (records_autograd(ts) || ...);
}

}  // namespace customops
