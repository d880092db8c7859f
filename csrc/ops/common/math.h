// Scalar formulas shared by the CPU and CUDA kernels, so both backends compute
// the same function. T is the opmath type (float for 16-bit inputs).
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>

namespace customops {

// The logistic function; exp(-x) overflows to inf for x < -88 (float), which
// gives the correct limit 0, and underflows to 0 for large x, giving 1.
template <typename T>
C10_HOST_DEVICE inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// sigmoid'(z) expressed through the output y = sigmoid(z): y * (1 - y).
template <typename T>
C10_HOST_DEVICE inline T sigmoid_backward(T grad_out, T y) {
  return grad_out * y * (T(1) - y);
}

// The same formulas as function objects, for the elementwise loops of both backends.
struct SigmoidFn {
  template <typename T>
  C10_HOST_DEVICE T operator()(T x) const {
    return sigmoid(x);
  }
};

struct SigmoidBackwardFn {
  template <typename T>
  C10_HOST_DEVICE T operator()(T grad_out, T y) const {
    return sigmoid_backward(grad_out, y);
  }
};

}  // namespace customops
