// fused_linear_sigmoid and its backward, CUDA: the forward's dispatcher and the
// generic kernels.
//
// Forward, by shape (fused_linear_sigmoid_cuda.h lists the kernels; choose_kernel
// has the measured thresholds):
// - M <= 8 rows, bf16/fp16, Hopper: the small-M kernel, which streams the weight
//   once with bias + sigmoid fused (fused_linear_sigmoid_small_m_cuda.cu);
// - M >= 512, bf16/fp16, 16-byte-aligned rows, Hopper, library built with
//   CUTLASS: a CUTLASS sm90a GEMM with bias + sigmoid in its epilogue (sm90/);
// - M >= 512, float32 with TF32 allowed by torch: the CUTLASS Pingpong kernel on TF32;
// - otherwise (IEEE float32, float64, other GPUs, unaligned rows, mid-size M): eager's
//   own calls, cuBLAS addmm with the bias in its epilogue, then ATen's sigmoid in place.
// customops::_fused_linear_sigmoid_cuda_kernel names the kernel the dispatch picks and
// customops::_fused_linear_sigmoid_with_kernel runs a named one (tests and benchmarks).
//
// Backward: the two GEMMs go through cuBLAS; sigmoid'(z) and the bias gradient
// (a column sum) come from one pass over grad_out and y.
#include <ATen/Dispatch.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include "../common/cuda_utils.cuh"
#include "../common/math.h"
#include "../sigmoid/sigmoid.h"
#include "fused_linear_sigmoid.h"
#include "fused_linear_sigmoid_cuda.h"
#include "../common/library.h"

namespace customops {
namespace fls_cuda {

#ifdef CUSTOMOPS_WITH_CUTLASS
namespace sm90 {
#define CUSTOMOPS_DECLARE_SM90(NAME) \
  void run_##NAME(                   \
      const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d);
CUSTOMOPS_DECLARE_SM90(pingpong_128x128_bf16)
CUSTOMOPS_DECLARE_SM90(pingpong_128x128_fp16)
CUSTOMOPS_DECLARE_SM90(pingpong_128x128_epi64_bf16)
CUSTOMOPS_DECLARE_SM90(pingpong_128x128_epi64_fp16)
CUSTOMOPS_DECLARE_SM90(coop_128x256_bf16)
CUSTOMOPS_DECLARE_SM90(coop_128x256_fp16)
CUSTOMOPS_DECLARE_SM90(pingpong_128x128_tf32)
#undef CUSTOMOPS_DECLARE_SM90
}  // namespace sm90
#endif

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kGeneric: return "generic";
    case Kernel::kSmallM: return "small_m";
    case Kernel::kSm90Pingpong128: return "sm90_pingpong_128x128";
    case Kernel::kSm90Pingpong128Epi64: return "sm90_pingpong_128x128_epi64";
    case Kernel::kSm90Coop128x256: return "sm90_coop_128x256";
  }
  return "unknown";
}

constexpr Kernel kAllKernels[] = {
    Kernel::kGeneric, Kernel::kSmallM, Kernel::kSm90Pingpong128, Kernel::kSm90Pingpong128Epi64,
    Kernel::kSm90Coop128x256};

std::optional<Kernel> kernel_from_name(const std::string& name) {
  for (Kernel k : kAllKernels) {
    if (name == kernel_name(k)) return k;
  }
  return std::nullopt;
}

std::string kernel_names() {
  std::string names;
  for (Kernel k : kAllKernels) names += std::string(names.empty() ? "" : ", ") + kernel_name(k);
  return names;
}

bool sm90_compiled() {
#ifdef CUSTOMOPS_WITH_CUTLASS
  return true;
#else
  return false;
#endif
}

bool sm90_supported(Kernel k, const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (!sm90_compiled()) return false;
  if (k != Kernel::kSm90Pingpong128 && k != Kernel::kSm90Pingpong128Epi64 && k != Kernel::kSm90Coop128x256) {
    return false;
  }
  const auto dtype = x2d.scalar_type();
  // float32 runs on TF32 tensor cores, so only where torch would use TF32 for this matmul.
  // Pingpong is the one configuration built for it (the faster of two measured, docs/design.md).
  const bool tf32 = dtype == at::kFloat && k == Kernel::kSm90Pingpong128 && cuda::matmul_allows_tf32();
  if (dtype != at::kBFloat16 && dtype != at::kHalf && !tf32) return false;
  const auto* props = at::cuda::getDeviceProperties(x2d.get_device());
  if (props->major != 9 || props->minor != 0) return false;
  const int64_t M = x2d.size(0), K = x2d.size(1), N = weight.size(0);
  // TMA: 16-byte-aligned base addresses and row strides; int32 problem sizes.
  const auto rows_ok = [](const at::Tensor& t) {  // stride(0) >= size(1): no expanded (stride 0) rows
    return t.stride(1) == 1 && t.stride(0) % 8 == 0 && t.stride(0) >= t.size(1) &&
           cuda::is_aligned(t.const_data_ptr(), 16);
  };
  if (K % 8 != 0 || N % 8 != 0 || K == 0) return false;
  if (M >= (int64_t{1} << 31) || N >= (int64_t{1} << 31) || K >= (int64_t{1} << 31)) return false;
  if (bias.has_value() && !cuda::is_aligned(bias->const_data_ptr(), 16)) return false;
  return rows_ok(x2d) && rows_ok(weight);
}

void sm90_forward(
    Kernel k, const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& out2d) {
#ifdef CUSTOMOPS_WITH_CUTLASS
  const bool bf16 = x2d.scalar_type() == at::kBFloat16;
  if (x2d.scalar_type() == at::kFloat) {
    TORCH_CHECK(k == Kernel::kSm90Pingpong128, "customops: internal error: ", kernel_name(k), " has no TF32 build");
    return sm90::run_pingpong_128x128_tf32(x2d, weight, bias, out2d);
  }
  switch (k) {
    case Kernel::kSm90Pingpong128:
      return bf16 ? sm90::run_pingpong_128x128_bf16(x2d, weight, bias, out2d)
                  : sm90::run_pingpong_128x128_fp16(x2d, weight, bias, out2d);
    case Kernel::kSm90Pingpong128Epi64:
      return bf16 ? sm90::run_pingpong_128x128_epi64_bf16(x2d, weight, bias, out2d)
                  : sm90::run_pingpong_128x128_epi64_fp16(x2d, weight, bias, out2d);
    case Kernel::kSm90Coop128x256:
      return bf16 ? sm90::run_coop_128x256_bf16(x2d, weight, bias, out2d)
                  : sm90::run_coop_128x256_fp16(x2d, weight, bias, out2d);
    default: break;
  }
#endif
  TORCH_CHECK(false, "customops: internal error: ", kernel_name(k), " is not a CUTLASS kernel of this build");
}

}  // namespace fls_cuda

namespace {

using fls_cuda::Kernel;

bool can_run(Kernel k, const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return k == Kernel::kGeneric || (k == Kernel::kSmallM && fls_cuda::small_m_supported(x2d, weight)) ||
         fls_cuda::sm90_supported(k, x2d, weight, bias);
}

// Whether data-parallel CUTLASS kernel k (one output tile per CTA at a time, persistent) beats
// eager's calls at this shape, by a model with three constants measured on the H200
// (docs/design.md, "Wave model"): the kernel takes ceil(tiles / SMs) waves of one tile each
// (2 * tile_m * tile_n * K flops at kTileFlops per SM), while eager's GEMM (cuBLAS, which splits
// K where the tiles are too few) is charged the ideal 2 * M * N * K / (SMs * kTileFlops),
// plus the second pass that the fusion saves (a launch gap and a read and write of the output).
// Where the waves waste more SM time than that pass costs, for instance a few output tiles over
// a long K (routers, gates, small heads), the kernel would lose and is not picked. The model
// is charitable to cuBLAS, so it errs towards eager's calls, never towards a slower kernel.
bool wave_model_wins(Kernel k, int64_t M, int64_t K, int64_t N, at::ScalarType dtype, int64_t sms) {
  constexpr double kTileFlops16 = 5.0e12;  // 16-bit wgmma flop/s per SM, from one-wave runs
  constexpr double kBytesPerSecond = 3.0e12;  // HBM under the benchmarks' L2 flush
  constexpr double kPassOverheadSeconds = 3.0e-6;  // eager minus mm alone at small outputs
  const double flops_per_sm = dtype == at::kFloat ? kTileFlops16 / 2 : kTileFlops16;  // TF32: half rate
  const int64_t tile_m = 128, tile_n = k == Kernel::kSm90Coop128x256 ? 256 : 128;
  const int64_t tiles = ((M + tile_m - 1) / tile_m) * ((N + tile_n - 1) / tile_n);
  const double waves = static_cast<double>((tiles + sms - 1) / sms);
  const double kernel_s = waves * 2.0 * tile_m * tile_n * K / flops_per_sm;
  const double ideal_s = 2.0 * M * N * K / (sms * flops_per_sm);
  const double pass_s = kPassOverheadSeconds + 2.0 * M * N * c10::elementSize(dtype) / kBytesPerSecond;
  return kernel_s - ideal_s <= pass_s;
}

// The kernel that runs these arguments, by shape and dtype.
Kernel choose_kernel(const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  // Thresholds measured on an H200 (docs/design.md): the small-M kernel beats cuBLAS + a
  // second pass at M <= 8 rows up to N = 8192; from about 512 rows the CUTLASS epilogue
  // fusion wins. There, Pingpong (whose epilogue overlaps the other warpgroup's MMAs), with
  // the wider epilogue tile at K <= 512 (16-bit only), and Cooperative 128x256 for outputs of
  // at most 4096x4096 at large M and K (16-bit only; Pingpong was faster at 16384x4096x4096,
  // at 4096^3 the runs disagree), at least one 256-wide tile across; each only where the wave
  // model says it wins, else the next. In between, and where none wins, the generic path
  // (eager's own calls).
  const int64_t M = x2d.size(0), K = x2d.size(1), N = weight.size(0);
  if (M <= 8 && N <= 8192 && fls_cuda::small_m_supported(x2d, weight)) return Kernel::kSmallM;
  if (M < 512) return Kernel::kGeneric;
  const int64_t sms = at::cuda::getDeviceProperties(x2d.get_device())->multiProcessorCount;
  // sm90_supported decides what each kernel can run (dtype, TF32 setting, alignment).
  const auto wins = [&](Kernel k) {
    return fls_cuda::sm90_supported(k, x2d, weight, bias) && wave_model_wins(k, M, K, N, x2d.scalar_type(), sms);
  };
  if (K <= 512 && wins(Kernel::kSm90Pingpong128Epi64)) return Kernel::kSm90Pingpong128Epi64;
  const bool coop_shape = M >= 2048 && K >= 2048 && N >= 256 && M * N <= (int64_t{1} << 24);
  if (coop_shape && wins(Kernel::kSm90Coop128x256)) return Kernel::kSm90Coop128x256;
  return wins(Kernel::kSm90Pingpong128) ? Kernel::kSm90Pingpong128 : Kernel::kGeneric;
}

void run_kernel(
    Kernel k, const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& out2d) {
  switch (k) {
    case Kernel::kSmallM: fls_cuda::small_m_forward(x2d, weight, bias, out2d); break;
    case Kernel::kGeneric: linear_sigmoid_aten(x2d, weight, bias, out2d); break;
    default: fls_cuda::sm90_forward(k, x2d, weight, bias, out2d);
  }
}

void linear_sigmoid_cuda(
    const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d) {
  run_kernel(choose_kernel(x2d, weight, bias), x2d, weight, bias, out2d);
}

at::Tensor fused_linear_sigmoid_cuda(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_fused_linear_sigmoid_args(x, weight, bias);
  const c10::cuda::CUDAGuard device_guard(x.device());
  return fused_linear_sigmoid_forward_impl(x, weight, bias, linear_sigmoid_cuda);
}

std::string fused_linear_sigmoid_cuda_kernel(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_fused_linear_sigmoid_args(x, weight, bias);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const std::optional<at::Tensor> b = bias.has_value() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt;
  // The dispatch sees what the forward hands its kernels: x's rows, a contiguous bias.
  return fls_cuda::kernel_name(choose_kernel(x.reshape({leading_rows(x), weight.size(1)}), weight, b));
}

at::Tensor fused_linear_sigmoid_with_kernel_cuda(
    const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias, c10::string_view kernel) {
  check_fused_linear_sigmoid_args(x, weight, bias);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const std::string name(kernel.data(), kernel.size());
  const auto k = fls_cuda::kernel_from_name(name);
  TORCH_CHECK(
      k.has_value(), "customops: expected kernel to be one of ", fls_cuda::kernel_names(), ", but got '", name, "'");
  // Checked on the arguments the forward hands its kernels (x's rows, a contiguous bias).
  return fused_linear_sigmoid_forward_impl(
      x, weight, bias,
      [&](const at::Tensor& x2d, const at::Tensor& w, const std::optional<at::Tensor>& bc, at::Tensor& out2d) {
        TORCH_CHECK(
            can_run(*k, x2d, w, bc), "customops: kernel ", name, " cannot run x of shape ", shape_str(x.sizes()),
            " and dtype ", dtype_name(x.scalar_type()), " on this GPU and build");
        run_kernel(*k, x2d, w, bc, out2d);
      });
}

// grad_z (formula: customops/ops/fused_linear_sigmoid.py) over a contiguous (rows, cols)
// matrix, and the column sums of grad_z in float32: block (bx, by) covers columns
// [kColsPerBlock * bx, +kColsPerBlock) and rows by, by + gridDim.y, ... in
// steps of kRowLanes; partial[by, col] gets its sum (summed over by afterwards,
// so the result does not depend on timing).
constexpr int kRowLanes = 8;
constexpr int kUnroll = 4;

template <typename scalar_t, int VEC>
__global__ void sigmoid_backward_colsum_kernel(
    const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ y, scalar_t* __restrict__ grad_z,
    float* __restrict__ partial, int64_t rows, int64_t cols) {
  using vec_t = cuda::AlignedVec<scalar_t, VEC>;
  constexpr int kColThreads = cuda::kThreads / kRowLanes;
  __shared__ float sums[kRowLanes][kColThreads * VEC];
  const int tx = threadIdx.x % kColThreads, ty = threadIdx.x / kColThreads;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kColThreads + tx) * VEC;
  float acc[VEC] = {};
  if (col < cols) {
    const int64_t step = static_cast<int64_t>(gridDim.y) * kRowLanes;
    // kUnroll rows' loads are issued before any is used: enough bytes in flight per SM to
    // reach memory bandwidth (one row at a time reached ~80%).
    for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowLanes + ty; r0 < rows; r0 += kUnroll * step) {
      vec_t g[kUnroll], yv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * step;
        if (r < rows) {
          g[u] = *reinterpret_cast<const vec_t*>(grad_out + r * cols + col);
          yv[u] = *reinterpret_cast<const vec_t*>(y + r * cols + col);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * step;
        if (r >= rows) break;
        vec_t gz;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          gz.v[j] =
              static_cast<scalar_t>(sigmoid_backward(static_cast<float>(g[u].v[j]), static_cast<float>(yv[u].v[j])));
          acc[j] += static_cast<float>(gz.v[j]);  // the bias gradient sums the stored (rounded) grad_z, as eager does
        }
        *reinterpret_cast<vec_t*>(grad_z + r * cols + col) = gz;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) sums[ty][tx * VEC + j] = acc[j];
  __syncthreads();
  for (int c = threadIdx.x; c < kColThreads * VEC; c += blockDim.x) {
    const int64_t out_col = static_cast<int64_t>(blockIdx.x) * kColThreads * VEC + c;
    if (out_col >= cols) continue;
    float s = 0.f;
#pragma unroll
    for (int l = 0; l < kRowLanes; ++l) s += sums[l][c];
    partial[static_cast<int64_t>(blockIdx.y) * cols + out_col] = s;
  }
}

// Returns (grad_z, grad_bias); grad_bias is undefined where this pass cannot
// produce it (the caller then sums grad_z).
std::pair<at::Tensor, at::Tensor> sigmoid_backward_and_bias_grad_cuda(
    const at::Tensor& grad_out2d, const at::Tensor& y2d, bool want_bias_grad) {
  const int64_t rows = y2d.size(0), cols = y2d.size(1);
  const at::Tensor g = grad_out2d.contiguous();
  const at::Tensor yc = y2d.contiguous();
  const int vec = 16 / static_cast<int>(yc.element_size());
  if (!want_bias_grad || yc.scalar_type() == at::kDouble || rows == 0 || cols == 0 || cols % vec != 0 ||
      !cuda::is_aligned(g.const_data_ptr(), 16) || !cuda::is_aligned(yc.const_data_ptr(), 16)) {
    return {sigmoid_backward_cuda(g, yc), at::Tensor()};
  }
  at::Tensor grad_z = at::empty_like(yc, yc.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor grad_bias;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, yc.scalar_type(), "customops::fused_linear_sigmoid_backward", [&] {
        constexpr int kVec = cuda::vec_size<scalar_t>();
        constexpr int kColsPerBlock = cuda::kThreads / kRowLanes * kVec;
        const int64_t col_blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
        const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
        // About eight blocks per SM, each with at least kUnroll rows per thread.
        const int64_t row_groups = std::max<int64_t>(
            1, std::min<int64_t>(
                   {(8 * sms + col_blocks - 1) / col_blocks, (rows + kRowLanes * kUnroll - 1) / (kRowLanes * kUnroll),
                    65535}));
        at::Tensor partial = at::empty({row_groups, cols}, yc.options().dtype(at::kFloat));
        sigmoid_backward_colsum_kernel<scalar_t, kVec>
            <<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_groups)),
               cuda::block_size("sigmoid_backward_colsum_kernel"), 0, at::cuda::getCurrentCUDAStream()>>>(
                g.const_data_ptr<scalar_t>(), yc.const_data_ptr<scalar_t>(), grad_z.data_ptr<scalar_t>(),
                partial.data_ptr<float>(), rows, cols);
        CUSTOMOPS_CUDA_LAUNCH_CHECK("sigmoid_backward_colsum_kernel");
        grad_bias = partial.sum(0).to(yc.scalar_type());
      });
  return {grad_z, grad_bias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_sigmoid_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& y,
    std::array<bool, 3> output_mask) {
  check_fused_linear_sigmoid_backward_args(grad_out, x, weight, y);
  const c10::cuda::CUDAGuard device_guard(x.device());
  return fused_linear_sigmoid_backward_impl(grad_out, x, weight, y, output_mask, sigmoid_backward_and_bias_grad_cuda);
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("fused_linear_sigmoid", &fused_linear_sigmoid_cuda);
  m.impl("fused_linear_sigmoid_backward", &fused_linear_sigmoid_backward_cuda);
  m.impl("_fused_linear_sigmoid_cuda_kernel", &fused_linear_sigmoid_cuda_kernel);
  m.impl("_fused_linear_sigmoid_with_kernel", &fused_linear_sigmoid_with_kernel_cuda);
}

}  // namespace customops
