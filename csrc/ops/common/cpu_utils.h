// Helpers shared by the CPU kernels.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <array>
#include <cstdint>

namespace customops {
namespace cpu {

// Below this many elements a chunk is not worth a thread.
constexpr int64_t kGrainSize = 32768;

// out[i] = op(in[0][i], ..., in[NIn-1][i]) over n contiguous elements, in
// opmath (float for 16-bit types), split across ATen's intra-op threads.
// out may alias an input (in-place).
template <typename scalar_t, size_t NIn, typename Op>
void parallel_elementwise(scalar_t* out, const std::array<const scalar_t*, NIn>& in, int64_t n, const Op& op) {
  using opmath_t = at::opmath_type<scalar_t>;
  at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if constexpr (NIn == 1) {
        out[i] = static_cast<scalar_t>(op(static_cast<opmath_t>(in[0][i])));
      } else {
        out[i] = static_cast<scalar_t>(op(static_cast<opmath_t>(in[0][i]), static_cast<opmath_t>(in[1][i])));
      }
    }
  });
}

}  // namespace cpu
}  // namespace customops
