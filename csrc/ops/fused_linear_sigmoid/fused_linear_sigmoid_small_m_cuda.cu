// fused_linear_sigmoid for small batches (M <= 8 rows of x), bf16/fp16, sm_90.
//
// With few rows the weight (N x K) is almost all of the bytes, so the kernel is
// a stream over the weight at memory bandwidth. GEMM tilings pad M to their tile
// (64 or 128) and launch too few blocks to fill the GPU; here instead:
// - swap-AB: rows of the weight are the MMA's A operand and rows of x its B
//   operand (8 per mma.sync n-tile), so M pads only to 8;
// - one warp per block owns 16 weight rows over all of K: no split-K, so no
//   partial sums, workspace or second pass; the epilogue (bias, sigmoid, store)
//   runs straight from the accumulators;
// - each lane streams its pieces of the weight (and of x, which stays in L2)
//   through a deep private cp.async ring in shared memory, many stages in flight,
//   which is what keeps enough bytes in flight to approach memory bandwidth;
//   a lane reads back only what it copied itself, so the ring needs no barrier;
// - four lanes cover 64 contiguous bytes of a weight row per copy instruction
//   (whole 32-byte sectors), and the MMA's k-slots are permuted to match (the
//   dot product is order-free).
#include <ATen/Dispatch.h>

#include <array>
#include <atomic>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "fused_linear_sigmoid_cuda.h"

namespace customops {
namespace fls_cuda {
namespace {

constexpr int kKStep = 64;  // k per MMA group: 4 lanes x 16 elements
constexpr int kU = 2;       // k-steps per pipeline stage
constexpr int kStep = kKStep * kU;

struct Args {
  const void* x;
  const void* w;
  const void* bias;  // nullptr: no bias
  void* out;
  int64_t ldx, ldw, ldo;  // row strides, elements
  int M, N, K;
};

// 16-byte asynchronous copy global -> shared, zero-filled when !valid (then src is not read).
// .cg: cached in L2 only.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <typename scalar_t>
__device__ __forceinline__ void mma_16816(
    float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#endif
}

// Chunks of one stage, per lane, 16 bytes each: the weight's
// [(2u + row) * 2 + v] (rows g and g + 8), then x's [4U + (u * MT + j) * 2 + v]
// (row 8j + g of x). Lane (g, q) holds elements [k + u * kKStep + 32v + 8q, +8).
// Stages are laid out [chunk][lane] so a warp's accesses are consecutive words.
template <int MT>
constexpr int kChunks = 4 * kU + 2 * kU * MT;

// Deep enough for ~11 stages of weight in flight per warp, while the ring (72 KiB) still lets
// two or three blocks share an SM. MT (n-tiles of 8 rows of x) is 1: at M > 8 cuBLAS and
// the second pass are faster (docs/design.md), so no other tile count is built.
template <int MT>
constexpr int kStages = 12;

template <typename scalar_t, int MT>
__global__ void __launch_bounds__(32) small_m_kernel(const Args p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kC = kChunks<MT>;
  constexpr int kS = kStages<MT>;
  constexpr int elt = sizeof(scalar_t);
  extern __shared__ __align__(16) uint4 ring[];  // [kS][kC][32]
  const int lane = threadIdx.x;
  const int g = lane / 4, q = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16;
  // Rows past N (M) read row N - 1 (M - 1), valid memory, and are never stored
  // (are zero-filled).
  const char* w_rows[2] = {
      static_cast<const char*>(p.w) + std::min<int64_t>(n0 + g, p.N - 1) * p.ldw * elt,
      static_cast<const char*>(p.w) + std::min<int64_t>(n0 + g + 8, p.N - 1) * p.ldw * elt};
  const char* x_rows[MT];
  bool x_valid[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    x_valid[j] = 8 * j + g < p.M;
    x_rows[j] = static_cast<const char*>(p.x) + static_cast<int64_t>(std::min(8 * j + g, p.M - 1)) * p.ldx * elt;
  }
  const int n_iter = (p.K + kStep - 1) / kStep;

  const auto issue = [&](int it) {
    uint4* st = ring + (it % kS) * kC * 32 + lane;
    const int64_t k = static_cast<int64_t>(it) * kStep;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int64_t kk = k + u * kKStep + 32 * v + 8 * q;
        const bool ok = kk < p.K;  // K % 8 == 0: a 16-byte piece is wholly in or out
        const int64_t off = ok ? kk * elt : 0;
#pragma unroll
        for (int row = 0; row < 2; ++row) cp_async_16(st + ((2 * u + row) * 2 + v) * 32, w_rows[row] + off, ok);
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          cp_async_16(st + (4 * kU + (u * MT + j) * 2 + v) * 32, x_rows[j] + off, ok && x_valid[j]);
        }
      }
    }
  };

  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < n_iter) issue(s);
    cp_async_commit();
  }
  for (int it = 0; it < n_iter; ++it) {
    cp_async_wait<kS - 2>();  // this lane's copies for stage `it` have landed
    const uint4* st = ring + (it % kS) * kC * 32 + lane;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint4 a0 = st[((2 * u + 0) * 2 + 0) * 32];  // row g, first 8 elements
      const uint4 a1 = st[((2 * u + 0) * 2 + 1) * 32];  // row g, last 8
      const uint4 b0 = st[((2 * u + 1) * 2 + 0) * 32];  // row g + 8
      const uint4 b1 = st[((2 * u + 1) * 2 + 1) * 32];
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const uint4 x0 = st[(4 * kU + (u * MT + j) * 2 + 0) * 32];
        const uint4 x1 = st[(4 * kU + (u * MT + j) * 2 + 1) * 32];
        // k-step t takes 32-bit words 2t and 2t+1 of the lane's 16 elements, in
        // both operands: slots (2q, 2q+1) <- word 2t, slots (2q+8, 2q+9) <- word 2t+1.
        mma_16816<scalar_t>(acc[j], a0.x, b0.x, a0.y, b0.y, x0.x, x0.y);
        mma_16816<scalar_t>(acc[j], a0.z, b0.z, a0.w, b0.w, x0.z, x0.w);
        mma_16816<scalar_t>(acc[j], a1.x, b1.x, a1.y, b1.y, x1.x, x1.y);
        mma_16816<scalar_t>(acc[j], a1.z, b1.z, a1.w, b1.w, x1.z, x1.w);
      }
    }
    // Refill the slot read in the previous iteration (its values are consumed).
    if (it + kS - 1 < n_iter) issue(it + kS - 1);
    cp_async_commit();
  }
  cp_async_wait<0>();

  // Accumulator (c0, c1) is (weight row g, x rows 2q, 2q + 1) of the n-tile,
  // (c2, c3) the same for weight row g + 8.
  const scalar_t* bias = static_cast<const scalar_t*>(p.bias);
  scalar_t* out = static_cast<scalar_t*>(p.out);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t n = n0 + g + 8 * half;
    if (n >= p.N) continue;
    const float b = bias != nullptr ? static_cast<float>(bias[n]) : 0.f;
#pragma unroll
    for (int j = 0; j < MT; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int m = 8 * j + 2 * q + c;
        if (m < p.M) out[m * p.ldo + n] = static_cast<scalar_t>(sigmoid(acc[j][2 * half + c] + b));
      }
    }
  }
#endif
}

bool aligned_rows(const at::Tensor& t) {
  return t.stride(1) == 1 && t.stride(0) % 8 == 0 && cuda::is_aligned(t.data_ptr(), 16);
}

template <typename scalar_t, int MT>
void launch(const at::Tensor& x2d, const at::Tensor& w, const std::optional<at::Tensor>& bias, at::Tensor& out) {
  constexpr size_t smem = static_cast<size_t>(kStages<MT>) * kChunks<MT> * 32 * sizeof(uint4);
  auto* kernel = &small_m_kernel<scalar_t, MT>;
  // Above 48 KiB of dynamic shared memory needs an opt-in, once per device.
  static std::array<std::atomic<bool>, 64> opted_in{};
  const int dev = x2d.get_device();
  if (dev >= static_cast<int>(opted_in.size()) || !opted_in[dev].load()) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    if (dev < static_cast<int>(opted_in.size())) opted_in[dev] = true;
  }
  Args args{};
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
  const int64_t blocks = (w.size(0) + 15) / 16;
  // The block is one warp; the test hook in block_size() makes it invalid.
  const int threads = cuda::block_size("fused_linear_sigmoid_small_m_kernel") == cuda::kThreads ? 32 : 4096;
  kernel<<<static_cast<unsigned>(blocks), threads, smem, at::cuda::getCurrentCUDAStream()>>>(args);
  CUSTOMOPS_CUDA_LAUNCH_CHECK("fused_linear_sigmoid_small_m_kernel");
}

}  // namespace

bool small_m_supported(const at::Tensor& x2d, const at::Tensor& weight) {
  const auto dtype = x2d.scalar_type();
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  const int64_t M = x2d.size(0), K = weight.size(1), N = weight.size(0);
  if (M < 1 || M > 8 || K < 8 || K % 8 != 0 || N < 1) return false;
  // int32 sizes inside the kernel; the output index is 64-bit.
  if (K > (int64_t{1} << 30) || N > (int64_t{1} << 30)) return false;
  if (at::cuda::getDeviceProperties(x2d.get_device())->major != 9) return false;
  // x is at most 8 rows and may be copied; the weight is streamed in place.
  return aligned_rows(weight);
}

void small_m_forward(
    const at::Tensor& x2d_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d) {
  const at::Tensor x2d = aligned_rows(x2d_in) ? x2d_in : x2d_in.contiguous();
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x2d.scalar_type(), "customops::fused_linear_sigmoid small_m", [&] {
    launch<scalar_t, 1>(x2d, weight, bias, out2d);
  });
}

}  // namespace fls_cuda
}  // namespace customops
