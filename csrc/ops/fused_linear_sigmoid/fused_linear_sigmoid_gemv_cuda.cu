// fused_linear_sigmoid for very small batches (M <= 16 rows of x), bf16/fp16: a GEMV
// on the CUDA cores, one warp per weight row (or R adjacent rows).
//
// With M this small the weight (N x K) is nearly all of the bytes and the FLOPs are
// few, so the kernel is a read of the weight. What reaches the read's speed is many
// independent streams each reading contiguous memory: a warp reads its row 512 bytes
// per load instruction (32 lanes x 16 bytes) with kLoads loads in flight per lane,
// and N / R warps stream at once. scripts/diag/read_patterns.py measured this access
// pattern alone at 14.3 us for a 4096 x 4096 bf16 weight, against 18.8 for cuBLAS's
// M = 1 GEMV and 13.2 for a flat contiguous read (H200; benchmarks/NOTES.md, "Eighth
// session"); the tensor-core small-M kernel (fused_linear_sigmoid_small_m_cuda.cu)
// keeps fewer, deeper streams (16 rows per warp) and measured 18.6-19.3.
// - x (at most 16 rows) is read through L1 by every warp of an SM; R > 1 rows per warp
//   divides those reads by R where M makes them the larger share.
// - The dot products are summed in float, per lane, then across the warp by shuffles;
//   bias and sigmoid follow, and lane m stores output row m.
#include <ATen/Dispatch.h>
#include <cuda_fp16.h>

#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "fused_linear_sigmoid_cuda.h"

namespace customops {
namespace fls_cuda {
namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kLoads = 8;  // 16-byte weight loads in flight per lane (read_patterns.py: U = 8)

struct GemvArgs {
  const void* x;
  const void* w;
  const void* bias;  // nullptr: no bias
  void* out;
  int64_t ldx, ldw, ldo;  // row strides, elements
  int M, N, K;
};

// The weight is read once: bypass L1 so that x stays there.
__device__ __forceinline__ uint4 load_weight(const char* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
#else
  return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}

template <typename scalar_t>
__device__ __forceinline__ void to_float8(const uint4& v, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
      f[2 * i] = __uint_as_float(words[i] << 16);  // a bf16 is the high half of a float
      f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    } else {
      __half2 h;
      memcpy(&h, &words[i], sizeof(h));
      const float2 pair = __half22float2(h);
      f[2 * i] = pair.x;
      f[2 * i + 1] = pair.y;
    }
  }
}

// MT: the largest M this instance serves (M <= MT); R: weight rows per warp.
template <typename scalar_t, int MT, int R>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvArgs p) {
  constexpr int U = kLoads / R;         // k-chunks in flight per row
  constexpr int elt = sizeof(scalar_t);
  constexpr int kChunk = 32 * 8;        // elements per warp-wide load
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R;
  if (n0 >= p.N) return;
  // Rows past N read row N - 1 (valid memory) and are never stored.
  const char* w_rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    w_rows[r] = static_cast<const char*>(p.w) + std::min<int64_t>(n0 + r, p.N - 1) * p.ldw * elt;
  }
  const char* x0 = static_cast<const char*>(p.x);
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;
  }

  for (int64_t k0 = static_cast<int64_t>(lane) * 8; k0 < p.K; k0 += static_cast<int64_t>(U) * kChunk) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk = k0 + u * kChunk;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = kk < p.K ? load_weight(w_rows[r] + kk * elt) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk = k0 + u * kChunk;
      if (kk >= p.K) break;  // K % 8 == 0: a lane's 8 elements are wholly in or out
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) to_float8<scalar_t>(wv[u][r], wf[r]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= p.M) break;
        float xf[8];
        to_float8<scalar_t>(__ldg(reinterpret_cast<const uint4*>(x0 + (m * p.ldx + kk) * elt)), xf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][m] = fmaf(wf[r][i], xf[i], acc[r][m]);
        }
      }
    }
  }

  const scalar_t* bias = static_cast<const scalar_t*>(p.bias);
  scalar_t* out = static_cast<scalar_t*>(p.out);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t n = n0 + r;
    const float b = bias != nullptr && n < p.N ? static_cast<float>(bias[n]) : 0.f;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float s = acc[r][m];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
      if (lane == m && m < p.M && n < p.N) out[m * p.ldo + n] = static_cast<scalar_t>(sigmoid(s + b));
    }
  }
}

bool aligned_rows(const at::Tensor& t) {
  return t.stride(1) == 1 && t.stride(0) % 8 == 0 && cuda::is_aligned(t.data_ptr(), 16);
}

template <typename scalar_t, int MT, int R>
void launch(const at::Tensor& x2d, const at::Tensor& w, const std::optional<at::Tensor>& bias, at::Tensor& out) {
  GemvArgs args{};
  args.x = x2d.const_data_ptr();
  args.w = w.const_data_ptr();
  args.bias = bias.has_value() ? bias->const_data_ptr() : nullptr;
  args.out = out.data_ptr();
  args.ldx = x2d.stride(0);
  args.ldw = w.stride(0);
  args.ldo = out.stride(0);
  args.M = static_cast<int>(x2d.size(0));
  args.N = static_cast<int>(w.size(0));
  args.K = static_cast<int>(w.size(1));
  const int64_t blocks = (w.size(0) + kWarps * R - 1) / (kWarps * R);
  // The test hook in block_size() makes the launch invalid.
  const int threads = cuda::block_size("fused_linear_sigmoid_gemv_kernel") == cuda::kThreads ? kWarps * 32 : 4096;
  gemv_kernel<scalar_t, MT, R><<<static_cast<unsigned>(blocks), threads, 0, at::cuda::getCurrentCUDAStream()>>>(args);
  CUSTOMOPS_CUDA_LAUNCH_CHECK("fused_linear_sigmoid_gemv_kernel");
}

}  // namespace

bool gemv_supported(const at::Tensor& x2d, const at::Tensor& weight) {
  const auto dtype = x2d.scalar_type();
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  const int64_t M = x2d.size(0), K = weight.size(1), N = weight.size(0);
  if (M < 1 || M > 16 || K < 8 || K % 8 != 0 || N < 1) return false;
  // int32 sizes inside the kernel; offsets are 64-bit.
  if (K > (int64_t{1} << 30) || N > (int64_t{1} << 30)) return false;
  // x is at most 16 rows and may be copied; the weight is read in place.
  return aligned_rows(weight);
}

void gemv_forward(
    const at::Tensor& x2d_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d) {
  const at::Tensor x2d = aligned_rows(x2d_in) ? x2d_in : x2d_in.contiguous();
  const int64_t M = x2d.size(0);
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x2d.scalar_type(), "customops::fused_linear_sigmoid gemv", [&] {
    if (M == 1) {
      launch<scalar_t, 1, 1>(x2d, weight, bias, out2d);
    } else if (M <= 2) {
      launch<scalar_t, 2, 1>(x2d, weight, bias, out2d);
    } else if (M <= 4) {
      launch<scalar_t, 4, 2>(x2d, weight, bias, out2d);
    } else if (M <= 8) {
      launch<scalar_t, 8, 2>(x2d, weight, bias, out2d);
    } else {
      launch<scalar_t, 16, 4>(x2d, weight, bias, out2d);
    }
  });
}

}  // namespace fls_cuda
}  // namespace customops
