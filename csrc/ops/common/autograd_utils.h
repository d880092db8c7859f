// Shared by the ops' autograd kernels (csrc/ops/<op>/<op>_autograd.cpp) and the C++ API (csrc/api.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

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

}  // namespace customops
