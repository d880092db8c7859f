// fused_linear_sigmoid and its backward, CPU kernels.
//
// Forward, float32: the GEMM through ATen (MKL/oneDNN/OpenBLAS) without the bias, then one
// pass of our own that adds the bias and applies the sigmoid. ATen's addmm would first copy
// the bias into every output row and its sigmoid_ is a second TensorIterator pass; at small
// shapes those two are a third of a call's host time, at large ones two extra trips over the
// output (docs/design.md, "CPU forward"). The pass is compiled for AVX-512, AVX2 and baseline
// x86-64, picked at load time (GCC's target_clones): this library is built once with generic
// flags for any x86-64 CPU. Other dtypes: ATen's addmm + sigmoid_ (linear_sigmoid_aten).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../sigmoid/sigmoid.h"
#include "fused_linear_sigmoid.h"
#include "../common/library.h"

namespace customops {
namespace {

// Sixteen floats (GCC/Clang vector extensions): one AVX-512 register, two AVX ones, four SSE
// ones in the baseline clone. Eight-float vectors ran the pass at about 0.6 times ATen's
// sigmoid_ per value on the AVX-512 machine (docs/design.md, "CPU forward").
typedef float Floats16 __attribute__((vector_size(64)));
typedef int32_t Ints16 __attribute__((vector_size(64)));

// sigmoid(z) from e = exp(-|z|) in (0, 1], which cannot overflow: 1 / (1 + e) for z >= 0,
// e / (1 + e) below. exp is Cephes' expf (Cody-Waite reduction, degree-5 polynomial, about
// 1 ulp). Below exp's normal range (|z| > 87.3) e is 0, so sigmoid(z) is 0 for z < -87.3 (true
// value below 1.2e-38) and 1 above 87.3; NaN stays NaN, +-inf give 1 and 0.
// In place (vectors by reference: a 64-byte vector argument would be ABI-dependent).
[[gnu::always_inline]] inline void sigmoid16(Floats16& z) {
  const Floats16 zero = {};
  const Floats16 t = z < zero ? z : -z;  // -|z|; NaN stays NaN
  const Ints16 underflow = t < -87.3f;
  const Floats16 tc = underflow ? zero - 87.3f : t;
  const Ints16 n = __builtin_convertvector(tc * 1.44269504f - 0.5f, Ints16);  // round(tc / ln 2), tc <= 0
  const Floats16 fn = __builtin_convertvector(n, Floats16);
  const Floats16 r = (tc - fn * 0.693359375f) + fn * 2.12194440e-4f;
  Floats16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const Floats16 scale = reinterpret_cast<Floats16>((n + 127) << 23);  // 2^n, n >= -126: a normal float
  const Floats16 e = underflow ? zero : p * scale;
  const Floats16 s = 1.f / (1.f + e);
  const Floats16 positive = z == z ? s : z;
  z = z < zero ? e * s : positive;
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define CUSTOMOPS_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CUSTOMOPS_CPU_CLONES
#endif

// out[i] <- sigmoid(out[i] + bias[i % cols]) over the flat indices [e0, e1) of a contiguous
// (rows, cols) matrix, in vectors that run across rows: a pass row by row paid a padded tail
// per row, all of a row where cols < 8 (512 x 768 x 1: 21 us for 512 values, against 31 us for
// the GEMM). bias_rep is null or the bias repeated to cols + 16 values, so that the lanes from
// column c read bias_rep[c, c + 16) for any cols. The last (e1 - e0) % 16 values go through the
// same vector code (a padded copy), so every value gets the same rounding.
CUSTOMOPS_CPU_CLONES void bias_sigmoid(float* out, const float* bias_rep, int64_t e0, int64_t e1, int64_t cols) {
  int64_t c = e0 % cols;
  int64_t i = e0;
  for (; i + 16 <= e1; i += 16) {
    Floats16 v, b = {};
    std::memcpy(&v, out + i, sizeof(v));
    if (bias_rep != nullptr) std::memcpy(&b, bias_rep + c, sizeof(b));
    v += b;
    sigmoid16(v);
    std::memcpy(out + i, &v, sizeof(v));
    c += 16;
    if (c >= cols) c %= cols;
  }
  if (i < e1) {
    const size_t tail = static_cast<size_t>(e1 - i) * sizeof(float);
    Floats16 v = {}, b = {};
    std::memcpy(&v, out + i, tail);
    if (bias_rep != nullptr) std::memcpy(&b, bias_rep + c, tail);
    v += b;
    sigmoid16(v);
    std::memcpy(out + i, &v, tail);
  }
}

void linear_sigmoid_cpu(
    const at::Tensor& x2d, const at::Tensor& weight, const c10::optional<at::Tensor>& bias, at::Tensor& out2d) {
  if (x2d.scalar_type() != at::kFloat) return linear_sigmoid_aten(x2d, weight, bias, out2d);
  at::mm_out(out2d, x2d, weight.t());
  float* out = out2d.data_ptr<float>();
  const int64_t cols = out2d.size(1);
  std::vector<float> bias_rep;
  if (bias.has_value()) {
    const float* b = bias->const_data_ptr<float>();
    bias_rep.assign(b, b + cols);
    bias_rep.resize(cols + 16);
    for (int64_t j = cols; j < cols + 16; ++j) bias_rep[j] = bias_rep[j - cols];  // no division per value
  }
  const float* rep = bias_rep.empty() ? nullptr : bias_rep.data();
  // Threads only where each gets at least 32K elements (about 10 us): below that, waking the
  // pool costs more than the pass.
  at::parallel_for(
      0, out2d.numel(), int64_t{1} << 15, [&](int64_t e0, int64_t e1) { bias_sigmoid(out, rep, e0, e1, cols); });
}

at::Tensor fused_linear_sigmoid_cpu(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_fused_linear_sigmoid_args(x, weight, bias);
  return fused_linear_sigmoid_forward_impl(x, weight, bias, linear_sigmoid_cpu);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_sigmoid_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask) {
  check_fused_linear_sigmoid_backward_args(grad_out, x, weight, y);
  return fused_linear_sigmoid_backward_impl(
      grad_out, x, weight, y, output_mask, [](const at::Tensor& g, const at::Tensor& y2d, bool) {
        return std::make_pair(sigmoid_backward_cpu(g, y2d), at::Tensor());
      });
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("fused_linear_sigmoid", &fused_linear_sigmoid_cpu);
  m.impl("fused_linear_sigmoid_backward", &fused_linear_sigmoid_backward_cpu);
}

}  // namespace customops
