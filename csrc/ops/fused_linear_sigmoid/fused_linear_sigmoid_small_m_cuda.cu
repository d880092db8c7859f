// fused_linear_sigmoid for small batches (M <= 64 rows of x), bf16/fp16, sm_90.
//
// With few rows the weight (N x K) is almost all of the bytes, so the kernel is
// a stream over the weight at memory bandwidth. GEMM tilings pad M to their tile
// (64 or 128) and launch too few blocks to fill the GPU; here instead:
// - swap-AB: rows of the weight are the MMA's A operand (16 per warp) and rows
//   of x its B operand (8 per mma.sync n-tile), so M pads only to 8;
// - each lane loads 32 contiguous bytes of a weight row per 64-wide k-step and
//   the MMA's k-slots are permuted to match (the dot product is order-free), so
//   weight loads are 16-byte and coalesced with no shared-memory staging;
// - K is split across a thread-block cluster of up to 8 blocks, whose partial
//   sums are reduced through distributed shared memory by the same kernel, which
//   then adds the bias and applies the sigmoid: one launch, no workspace.
#include <ATen/Dispatch.h>
#include <cooperative_groups.h>

#include <array>
#include <atomic>

#include "../common/checks.h"
#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "fused_linear_sigmoid_cuda.h"

namespace customops {
namespace fls_cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerBlock = 16 * kWarps;  // weight rows (output features) per block
constexpr int kKStep = 64;                  // k per warp step: 4 lanes x 16 elements
constexpr int kXPad = 8;                    // elements of padding per x row in shared memory
constexpr int kRedStride = kRowsPerBlock + 4;
constexpr int kMaxSplits = 8;               // portable cluster size
constexpr size_t kSmemBudget = 96 * 1024;   // keeps two blocks per SM

struct Args {
  const void* x;
  const void* w;
  const void* bias;  // nullptr: no bias
  void* out;
  int64_t ldx, ldw, ldo;  // row strides, elements
  int M, N, K;
  int k_per_split;  // multiple of kKStep * U
  int k_chunk;      // x columns staged in shared memory at a time; multiple of kKStep * U
};

__device__ __forceinline__ uint4 load_stream(const void* p) {
  // The weight is read once: bypass L1.
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
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

// U k-steps of one warp's 16 weight rows: [u][h] is row g (h = 0) or g + 8 (h = 1),
// [u][h][v] the v-th 16-byte half of the lane's 32 bytes.
template <int U>
struct WeightRegs {
  uint4 v[U][2][2];
};

// Lane (g, q) loads elements [k + u * kKStep + 16q, +16) of its two rows.
template <int U>
__device__ __forceinline__ void load_weight(
    WeightRegs<U>& r, const char* w0, const char* w1, int64_t k, int64_t k_end, int q, int elt) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int64_t kk = k + u * kKStep + 16 * q + 8 * v;
      const bool ok = kk < k_end;  // K % 8 == 0: a 16-byte vector is wholly in or out
      r.v[u][0][v] = ok ? load_stream(w0 + kk * elt) : make_uint4(0, 0, 0, 0);
      r.v[u][1][v] = ok ? load_stream(w1 + kk * elt) : make_uint4(0, 0, 0, 0);
    }
  }
}

// Block (blockIdx.x, split): weight rows [128 * blockIdx.x, +128) times k range
// [split * k_per_split, +k_per_split); the cluster (1, S, 1) holds the S splits of
// one row block.
template <typename scalar_t, int MT, int U>
__global__ void __launch_bounds__(kThreads, 2) small_m_kernel(const Args p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int MP = 8 * MT;  // x rows padded to the n-tile
  constexpr int elt = sizeof(scalar_t);
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* xs = reinterpret_cast<scalar_t*>(smem);
  float* red = reinterpret_cast<float*>(smem);  // reused after the main loop

  const cg::cluster_group cluster = cg::this_cluster();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int64_t n_block = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.y) * p.k_per_split;
  const int64_t k_end = std::min<int64_t>(p.K, k_begin + p.k_per_split);
  // Rows past N load row N - 1 (valid memory) and are never stored.
  const int64_t r0 = std::min<int64_t>(n_block + 16 * warp + g, p.N - 1);
  const int64_t r1 = std::min<int64_t>(n_block + 16 * warp + g + 8, p.N - 1);
  const char* w0 = static_cast<const char*>(p.w) + r0 * p.ldw * elt;
  const char* w1 = static_cast<const char*>(p.w) + r1 * p.ldw * elt;
  const int x_stride = p.k_chunk + kXPad;

  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int64_t kc = k_begin; kc < k_end; kc += p.k_chunk) {
    const int64_t kc_end = std::min<int64_t>(k_end, kc + p.k_chunk);
    // The first weight loads go out before x is staged, so their latency overlaps it.
    WeightRegs<U> cur;
    load_weight<U>(cur, w0, w1, kc, kc_end, q, elt);
    __syncthreads();  // the previous chunk's readers are done with xs
    const int vecs_per_row = p.k_chunk / 8;
    for (int i = threadIdx.x; i < MP * vecs_per_row; i += kThreads) {
      const int m = i / vecs_per_row, v = i % vecs_per_row;
      const int64_t k = kc + 8 * v;
      uint4 val = make_uint4(0, 0, 0, 0);  // zeros past M and past this block's k range
      if (m < p.M && k < kc_end) {
        val = *reinterpret_cast<const uint4*>(static_cast<const scalar_t*>(p.x) + m * p.ldx + k);
      }
      *reinterpret_cast<uint4*>(xs + m * x_stride + 8 * v) = val;
    }
    __syncthreads();
    for (int64_t kb = kc; kb < kc_end; kb += kKStep * U) {
      const bool more = kb + kKStep * U < kc_end;
      WeightRegs<U> nxt;
      if (more) load_weight<U>(nxt, w0, w1, kb + kKStep * U, kc_end, q, elt);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int col = static_cast<int>(kb - kc) + u * kKStep + 16 * q;
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          const scalar_t* xr = xs + (8 * j + g) * x_stride + col;
          const uint4 x0 = *reinterpret_cast<const uint4*>(xr);
          const uint4 x1 = *reinterpret_cast<const uint4*>(xr + 8);
          const uint4& a0 = cur.v[u][0][0];
          const uint4& b0 = cur.v[u][1][0];
          const uint4& a1 = cur.v[u][0][1];
          const uint4& b1 = cur.v[u][1][1];
          // k-step t takes 32-bit words 2t and 2t+1 of the lane's 16 elements, in
          // both operands: slots (2q, 2q+1) <- word 2t, slots (2q+8, 2q+9) <- word 2t+1.
          mma_16816<scalar_t>(acc[j], a0.x, b0.x, a0.y, b0.y, x0.x, x0.y);
          mma_16816<scalar_t>(acc[j], a0.z, b0.z, a0.w, b0.w, x0.z, x0.w);
          mma_16816<scalar_t>(acc[j], a1.x, b1.x, a1.y, b1.y, x1.x, x1.y);
          mma_16816<scalar_t>(acc[j], a1.z, b1.z, a1.w, b1.w, x1.z, x1.w);
        }
      }
      if (more) cur = nxt;
    }
  }

  // Partial sums to shared memory as red[m][row]: accumulator (c0, c1) is
  // (row g, columns 2q, 2q+1) of the n-tile, (c2, c3) the same for row g + 8.
  __syncthreads();
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    const int m = 8 * j + 2 * q, r = 16 * warp + g;
    red[m * kRedStride + r] = acc[j][0];
    red[(m + 1) * kRedStride + r] = acc[j][1];
    red[m * kRedStride + r + 8] = acc[j][2];
    red[(m + 1) * kRedStride + r + 8] = acc[j][3];
  }
  cluster.sync();
  // Each block of the cluster reduces a slice of the rows across all S partials.
  const int splits = static_cast<int>(cluster.num_blocks());
  const int rows_per_rank = kRowsPerBlock / splits;
  const int r_begin = static_cast<int>(cluster.block_rank()) * rows_per_rank;
  for (int e = threadIdx.x; e < rows_per_rank * MP; e += kThreads) {
    const int r = r_begin + e % rows_per_rank, m = e / rows_per_rank;
    const int64_t n = n_block + r;
    if (m >= p.M || n >= p.N) continue;
    float z = 0.f;
    for (int s = 0; s < splits; ++s) z += cluster.map_shared_rank(red, s)[m * kRedStride + r];
    if (p.bias != nullptr) z += static_cast<float>(static_cast<const scalar_t*>(p.bias)[n]);
    static_cast<scalar_t*>(p.out)[m * p.ldo + n] = static_cast<scalar_t>(sigmoid(z));
  }
  cluster.sync();  // this block's partials stay alive until every block has read them
#endif
}

bool aligned_rows(const at::Tensor& t) {
  return t.stride(1) == 1 && t.stride(0) % 8 == 0 && cuda::is_aligned(t.data_ptr(), 16);
}

template <typename scalar_t, int MT, int U>
void launch(const at::Tensor& x2d, const at::Tensor& w, const std::optional<at::Tensor>& bias, at::Tensor& out) {
  constexpr int MP = 8 * MT;
  const int M = static_cast<int>(x2d.size(0));
  const int64_t N = w.size(0);
  const int K = static_cast<int>(w.size(1));
  const auto* props = at::cuda::getCurrentDeviceProperties();
  const int64_t row_blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  // Split K until there are about two blocks per SM, keeping at least two k-steps per block.
  int splits = 1;
  while (splits < kMaxSplits && row_blocks * splits < 2 * props->multiProcessorCount &&
         K / (2 * splits) >= 2 * kKStep * U) {
    splits *= 2;
  }
  constexpr int step = kKStep * U;
  const int k_per_split = ((K + splits - 1) / splits + step - 1) / step * step;
  const int max_chunk = static_cast<int>((kSmemBudget / (MP * sizeof(scalar_t)) - kXPad) / step * step);
  const int k_chunk = std::min(k_per_split, max_chunk);
  const size_t smem = std::max(
      static_cast<size_t>(MP) * (k_chunk + kXPad) * sizeof(scalar_t),
      static_cast<size_t>(MP) * kRedStride * sizeof(float));

  auto* kernel = &small_m_kernel<scalar_t, MT, U>;
  // Above 48 KiB of dynamic shared memory needs an opt-in, once per device.
  static std::array<std::atomic<bool>, 64> opted_in{};
  const int dev = x2d.get_device();
  if (dev >= static_cast<int>(opted_in.size()) || !opted_in[dev].load()) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBudget + 16 * 1024)));
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
  args.M = M;
  args.N = static_cast<int>(N);
  args.K = K;
  args.k_per_split = k_per_split;
  args.k_chunk = k_chunk;

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(row_blocks), splits, 1);
  config.blockDim = dim3(cuda::block_size("fused_linear_sigmoid_small_m_kernel"), 1, 1);
  config.dynamicSmemBytes = smem;
  config.stream = at::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = splits;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, args);
  if (err != cudaSuccess) (void)cudaGetLastError();  // clear it: the error is reported here
  TORCH_CHECK(
      err == cudaSuccess, "customops: CUDA kernel fused_linear_sigmoid_small_m_kernel failed to launch: ",
      cudaGetErrorString(err));
  CUSTOMOPS_CUDA_LAUNCH_CHECK("fused_linear_sigmoid_small_m_kernel");
}

}  // namespace

bool small_m_supported(const at::Tensor& x2d, const at::Tensor& weight) {
  const auto dtype = x2d.scalar_type();
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  const int64_t M = x2d.size(0), K = weight.size(1), N = weight.size(0);
  if (M < 1 || M > 64 || K < 8 || K % 8 != 0 || N < 1) return false;
  // int32 sizes inside the kernel; the output index is 64-bit.
  if (K > (int64_t{1} << 30) || N > (int64_t{1} << 30)) return false;
  if (at::cuda::getDeviceProperties(x2d.get_device())->major != 9) return false;
  // x is at most 64 rows and may be copied; the weight is streamed in place.
  return aligned_rows(weight);
}

void small_m_forward(
    const at::Tensor& x2d_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d) {
  const at::Tensor x2d = aligned_rows(x2d_in) ? x2d_in : x2d_in.contiguous();
  const int64_t M = x2d.size(0);
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x2d.scalar_type(), "customops::fused_linear_sigmoid small_m", [&] {
    // Two k-steps per load batch, double-buffered: 64 registers of weight in flight per lane.
    if (M <= 8) {
      launch<scalar_t, 1, 2>(x2d, weight, bias, out2d);
    } else if (M <= 16) {
      launch<scalar_t, 2, 2>(x2d, weight, bias, out2d);
    } else if (M <= 32) {
      launch<scalar_t, 4, 2>(x2d, weight, bias, out2d);
    } else {
      launch<scalar_t, 8, 2>(x2d, weight, bias, out2d);
    }
  });
}

}  // namespace fls_cuda
}  // namespace customops
