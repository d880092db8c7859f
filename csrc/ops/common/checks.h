// Argument checks shared by every op's CPU and CUDA kernels, so that a user
// error reads the same on every backend. The fake kernels in customops/ops/ check
// only the shape relations their outputs rest on; the specs' error inputs
// (customops/testing/op_specs.py, the conformance path "errors") check both.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace customops {

// Python's spelling (torch.float32), which is what our users read.
inline const char* dtype_name(at::ScalarType dt) {
  switch (dt) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    case at::kComplexHalf: return "torch.complex32";
    case at::kUInt16: return "torch.uint16";
    case at::kUInt32: return "torch.uint32";
    case at::kUInt64: return "torch.uint64";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kFloat8_e4m3fnuz: return "torch.float8_e4m3fnuz";
    case at::kFloat8_e5m2fnuz: return "torch.float8_e5m2fnuz";
    default: return c10::toString(dt);
  }
}

// Messages are built from strings only: numbers go through std::to_string and
// devices through Device::str(), never through an std::ostream. A toolchain that
// links libstdc++ statically into a shared library (the GPU machine's /opt/gcc g++)
// gives that library its own copy of ostream's numeric insertion, whose locale
// facets were never initialised: an integer streamed into c10::str's ostringstream
// segfaults there (the backtrace ends in basic_ostream::_M_insert<long> inside the
// library; strings do not touch the facets). Seen 2026-11-29 and again 2026-12-01
// with a minimal torch.utils.cpp_extension module, whose .so has no libstdc++ in its
// NEEDED entries.
inline std::string int_str(int64_t v) {
  return std::to_string(v);
}

// "[4, 5]", as Python prints list(t.shape).
inline std::string shape_str(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return out + "]";
}

// Floating dtypes every op accepts: float32/16, bfloat16 and float64 (gradcheck).
inline void check_floating(const at::Tensor& t, const char* name) {
  const auto dt = t.scalar_type();
  TORCH_CHECK(
      dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16 || dt == at::kDouble, "customops: expected ", name,
      " to have a floating dtype (float32, float16, bfloat16 or "
      "float64), but got ",
      dtype_name(dt));
}

inline void check_same_dtype(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK(
      t.scalar_type() == ref.scalar_type(), "customops: expected ", name, " to have the dtype of ", ref_name, " (",
      dtype_name(ref.scalar_type()), "), but got ", dtype_name(t.scalar_type()));
}

inline void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK(
      t.device() == ref.device(), "customops: expected ", name, " to be on the device of ", ref_name, " (",
      ref.device().str(), "), but got ", t.device().str());
}

inline void check_same_shape(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK(
      t.sizes() == ref.sizes(), "customops: expected ", name, " to have the shape of ", ref_name, " ",
      shape_str(ref.sizes()), ", but got ", shape_str(t.sizes()));
}

// The checks of a two-input elementwise op (same shape, dtype and device).
inline void check_elementwise_pair(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  check_floating(a, a_name);
  check_floating(b, b_name);
  check_same_device(b, b_name, a, a_name);
  check_same_dtype(b, b_name, a, a_name);
  check_same_shape(b, b_name, a, a_name);
}

}  // namespace customops
