// fused_linear_sigmoid for small batches (M <= 64 rows of x), bf16/fp16, sm_90.
//
// With few rows the weight (N x K) is almost all of the bytes, so the kernel is
// a stream over the weight at memory bandwidth, and what decides its speed is how
// many bytes are in flight (Little's law: ~4.5 TB/s x ~1 us of latency, i.e.
// several MB across the GPU). GEMM tilings pad M to their tile and launch too
// few blocks; earlier versions of this kernel that loaded through registers or a
// per-lane cp.async ring reached only half the DRAM bandwidth (benchmarks/NOTES.md).
// This one:
// - swap-AB: rows of the weight are the MMA's A operand (16 per m-tile) and rows
//   of x its B operand (8 per n-tile), so M pads only to 8;
// - a block owns 16 * WM weight rows over all of K (no split-K across blocks:
//   no workspace, no second pass) and streams them, with the matching columns of
//   x, through a ring of shared-memory stages filled by bulk asynchronous copies
//   (cp.async.bulk, the TMA engine's 1-D form) that signal an mbarrier: one
//   producer warp keeps ~100-200 KB per SM in flight without holding registers;
// - four consumer warps split each stage's k-steps, feed mma.sync from
//   ldmatrix (smem rows padded by 16 bytes so the 8 rows of a matrix fall in
//   distinct banks), and sum their partial accumulators once at the end, in a
//   fixed order; bias + sigmoid are applied before the only store.
#include <ATen/Dispatch.h>

#include <array>
#include <atomic>
#include <cstdlib>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "fused_linear_sigmoid_cuda.h"

namespace customops {
namespace fls_cuda {
namespace {

constexpr int kKC = 512;                // k elements per stage (1 KiB of a 16-bit row)
constexpr int kRowBytes = kKC * 2 + 16;  // padded shared-memory row
constexpr int kConsumerWarps = 4;
constexpr int kBlockThreads = (kConsumerWarps + 1) * 32;  // + one producer warp
constexpr int kRingBudget = 100 * 1024;  // bytes: two blocks per SM

// WM m-tiles of weight rows and MT n-tiles of x rows per block.
template <int WM, int MT>
struct Cfg {
  static constexpr int kWRows = 16 * WM;
  static constexpr int kXRows = 8 * MT;
  static constexpr int kStageBytes = (kWRows + kXRows) * kRowBytes;
  // At least two stages: ~100 KB rings (two blocks per SM) where a stage is small, else
  // ~200 KB (one block per SM).
  static constexpr int kStages = kRingBudget / kStageBytes >= 2 ? kRingBudget / kStageBytes
                                                                : 2 * kRingBudget / kStageBytes >= 2 ? 2 * kRingBudget / kStageBytes : 2;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kSmemBytes = kRingBytes + 2 * kStages * 8;  // + full and empty barriers
  static_assert(kConsumerWarps * 32 * WM * MT * 4 * 4 <= kRingBytes, "the reduction scratch reuses the ring");
};

struct Args {
  const void* x;
  const void* w;
  const void* bias;  // nullptr: no bias
  void* out;
  int64_t ldx, ldw, ldo;  // row strides, elements
  int M, N, K;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Returns once the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (a multiple of 16) from global to shared memory, both 16-byte aligned; completion
// is counted on the mbarrier's transaction count.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
// Barrier over the consumer warps only (the producer warp may have exited).
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
}

template <typename scalar_t>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
#endif

template <typename scalar_t, int WM, int MT>
__global__ void __launch_bounds__(kBlockThreads) small_m_kernel(const Args p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using C = Cfg<WM, MT>;
  constexpr int elt = sizeof(scalar_t);
  extern __shared__ __align__(128) unsigned char smem[];  // [stage][row][kRowBytes], then barriers
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kRingBytes);
  uint64_t* empty = full + C::kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * C::kWRows;
  const int w_rows = static_cast<int>(std::min<int64_t>(C::kWRows, p.N - n0));  // weight rows this block reads
  const int n_iter = (p.K + kKC - 1) / kKC;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(&full[s], 1);                // the producer's arrive, plus the copies' bytes
      mbar_init(&empty[s], kConsumerWarps);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumerWarps) {  // producer
    const int rows = w_rows + p.M;
    for (int it = 0; it < n_iter; ++it) {
      const int s = it % C::kStages;
      mbar_wait(&empty[s], ((it / C::kStages) & 1) ^ 1);  // the first pass finds every slot free
      const int64_t k0 = static_cast<int64_t>(it) * kKC;
      const uint32_t bytes = static_cast<uint32_t>(std::min<int64_t>(kKC, p.K - k0)) * elt;
      if (lane == 0) mbar_arrive_expect_tx(&full[s], bytes * rows);
      __syncwarp();
      unsigned char* stage = smem + s * C::kStageBytes;
      for (int r = lane; r < rows; r += 32) {
        const bool is_w = r < w_rows;
        const char* src = is_w ? static_cast<const char*>(p.w) + ((n0 + r) * p.ldw + k0) * elt
                               : static_cast<const char*>(p.x) + ((r - w_rows) * p.ldx + k0) * elt;
        const int row = is_w ? r : C::kWRows + r - w_rows;
        bulk_copy_g2s(stage + row * kRowBytes, src, bytes, &full[s]);
      }
    }
    return;
  }

  // Rows no copy writes (weight rows past N, x rows past M) hold zeros, so every MMA input is
  // defined; their products land only in outputs that are never stored.
  for (int s = 0; s < C::kStages; ++s) {
    unsigned char* stage = smem + s * C::kStageBytes;
    for (int r = 0; r < C::kWRows + C::kXRows; ++r) {
      if ((r >= w_rows && r < C::kWRows) || r >= C::kWRows + p.M) {
        uint4* row = reinterpret_cast<uint4*>(stage + r * kRowBytes);
        for (int i = threadIdx.x; i < kRowBytes / 16; i += kConsumerWarps * 32) row[i] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  consumer_sync();

  float acc[WM][MT][4];
#pragma unroll
  for (int wm = 0; wm < WM; ++wm)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[wm][j][0] = acc[wm][j][1] = acc[wm][j][2] = acc[wm][j][3] = 0.f;

  // ldmatrix row addresses: A (16 x 16 of the weight): lane -> row lane % 16, k half lane / 16;
  // B (8 x 16 of x): lane -> row lane % 8, k half (lane / 8) % 2.
  const uint32_t a_off = (lane % 16) * kRowBytes + (lane / 16) * 16;
  const uint32_t b_off = (C::kWRows + lane % 8) * kRowBytes + ((lane / 8) % 2) * 16;
  for (int it = 0; it < n_iter; ++it) {
    const int s = it % C::kStages;
    mbar_wait(&full[s], (it / C::kStages) & 1);
    const int kc = static_cast<int>(std::min<int64_t>(kKC, p.K - static_cast<int64_t>(it) * kKC));
    const uint32_t stage = smem_addr(smem + s * C::kStageBytes);
#pragma unroll
    for (int i = 0; i < kKC / 16 / kConsumerWarps; ++i) {
      const int t = i * kConsumerWarps + warp;  // k-step of 16
      if (t * 16 >= kc) break;
      // K % 16 == 8 leaves the last step's upper half past K (stale bytes): zero both operands'.
      const bool upper_valid = t * 16 + 8 < kc;
      uint32_t b[MT][2];
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        ldmatrix_x2(b[j], stage + b_off + j * 8 * kRowBytes + t * 32);
        if (!upper_valid) b[j][1] = 0;
      }
#pragma unroll
      for (int wm = 0; wm < WM; ++wm) {
        uint32_t a[4];
        ldmatrix_x4(a, stage + a_off + wm * 16 * kRowBytes + t * 32);
        if (!upper_valid) a[2] = a[3] = 0;
#pragma unroll
        for (int j = 0; j < MT; ++j) mma_16816<scalar_t>(acc[wm][j], a, b[j]);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
  }

  // Sum the consumer warps' partials in a fixed order (scratch over the drained ring:
  // every copy has landed and every warp has finished reading).
  consumer_sync();
  float* red = reinterpret_cast<float*>(smem);  // [warp][WM * MT * 4][32]
  constexpr int kVals = WM * MT * 4;
#pragma unroll
  for (int wm = 0; wm < WM; ++wm)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[(warp * kVals + (wm * MT + j) * 4 + c) * 32 + lane] = acc[wm][j][c];
  consumer_sync();

  // Accumulator c of fragment (wm, j) is weight row 16 wm + g + 8 (c / 2), x row 8 j + 2 q + c % 2.
  const int g = lane / 4, q = lane % 4;
  const scalar_t* bias = static_cast<const scalar_t*>(p.bias);
  scalar_t* out = static_cast<scalar_t*>(p.out);
  for (int f = warp; f < WM * MT; f += kConsumerWarps) {
    const int wm = f / MT, j = f % MT;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t n = n0 + 16 * wm + g + 8 * (c / 2);
      const int m = 8 * j + 2 * q + c % 2;
      if (n >= p.N || m >= p.M) continue;
      float z = 0.f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) z += red[(w * kVals + f * 4 + c) * 32 + lane];
      if (bias != nullptr) z += static_cast<float>(bias[n]);
      out[m * p.ldo + n] = static_cast<scalar_t>(sigmoid(z));
    }
  }
#endif
}

bool aligned_rows(const at::Tensor& t) {
  return t.stride(1) == 1 && t.stride(0) % 8 == 0 && cuda::is_aligned(t.data_ptr(), 16);
}

template <typename scalar_t, int WM, int MT>
void launch(const at::Tensor& x2d, const at::Tensor& w, const std::optional<at::Tensor>& bias, at::Tensor& out) {
  using C = Cfg<WM, MT>;
  auto* kernel = &small_m_kernel<scalar_t, WM, MT>;
  // Above 48 KiB of dynamic shared memory needs an opt-in, once per device.
  static std::array<std::atomic<bool>, 64> opted_in{};
  const int dev = x2d.get_device();
  if (dev >= static_cast<int>(opted_in.size()) || !opted_in[dev].load()) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
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
  const int64_t blocks = (w.size(0) + C::kWRows - 1) / C::kWRows;
  // The test hook in block_size() makes the launch invalid.
  const int threads =
      cuda::block_size("fused_linear_sigmoid_small_m_kernel") == cuda::kThreads ? kBlockThreads : 4096;
  kernel<<<static_cast<unsigned>(blocks), threads, C::kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(args);
  CUSTOMOPS_CUDA_LAUNCH_CHECK("fused_linear_sigmoid_small_m_kernel");
}

// Weight rows per block: 16 where x is at most 16 rows (more blocks, and x's share of each
// stage is small), 32 above, where x's rows would otherwise outnumber the weight's in every
// stage. CUSTOMOPS_FLS_SMALL_M_ROWS=16|32 overrides (tuning: scripts/diag/small_m_tuning.py).
int weight_rows_per_block(int64_t M) {
  const char* env = std::getenv("CUSTOMOPS_FLS_SMALL_M_ROWS");
  const int forced = env != nullptr ? std::atoi(env) : 0;
  if (forced == 16 || forced == 32) return forced;
  return M <= 16 ? 16 : 32;
}

template <typename scalar_t, int WM>
void launch_for_m(const at::Tensor& x2d, const at::Tensor& w, const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const int64_t M = x2d.size(0);
  if (M <= 8) {
    launch<scalar_t, WM, 1>(x2d, w, bias, out);
  } else if (M <= 16) {
    launch<scalar_t, WM, 2>(x2d, w, bias, out);
  } else if (M <= 32) {
    launch<scalar_t, WM, 4>(x2d, w, bias, out);
  } else {
    launch<scalar_t, WM, 8>(x2d, w, bias, out);
  }
}

}  // namespace

bool small_m_supported(const at::Tensor& x2d, const at::Tensor& weight) {
  const auto dtype = x2d.scalar_type();
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  const int64_t M = x2d.size(0), K = weight.size(1), N = weight.size(0);
  // K % 8: bulk copies move whole 16-byte pieces.
  if (M < 1 || M > 64 || K < 8 || K % 8 != 0 || N < 1) return false;
  // int32 sizes inside the kernel; offsets and the output index are 64-bit.
  if (K > (int64_t{1} << 30) || N > (int64_t{1} << 30)) return false;
  if (at::cuda::getDeviceProperties(x2d.get_device())->major != 9) return false;
  // x is at most 64 rows and may be copied; the weight is streamed in place.
  return aligned_rows(weight);
}

void small_m_forward(
    const at::Tensor& x2d_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d) {
  const at::Tensor x2d = aligned_rows(x2d_in) ? x2d_in : x2d_in.contiguous();
  const int rows = weight_rows_per_block(x2d.size(0));
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x2d.scalar_type(), "customops::fused_linear_sigmoid small_m", [&] {
    if (rows == 16) {
      launch_for_m<scalar_t, 1>(x2d, weight, bias, out2d);
    } else {
      launch_for_m<scalar_t, 2>(x2d, weight, bias, out2d);
    }
  });
}

}  // namespace fls_cuda
}  // namespace customops
