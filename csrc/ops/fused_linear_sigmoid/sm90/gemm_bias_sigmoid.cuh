// fused_linear_sigmoid on Hopper through CUTLASS 3.x (sm90a): TMA + wgmma
// warp-specialized GEMM kernels whose epilogue adds the bias and applies the
// sigmoid before the single store of the output, so the output never makes a
// second trip through memory.
//
// The epilogue is one EVT node, sigmoid(acc + bias[n]), rather than CUTLASS's
// LinCombPerColBiasEltAct, whose alpha * acc + beta * C + bias costs two FFMA per
// element that this op never needs. At K = 512 the Pingpong epilogue is on the
// critical path and every instruction per element counts (ncu at 32768x512x2048:
// 109.9-110.2 us against 115.3-116.6; docs/design.md).
//
// For bf16/fp16 the sigmoid is 0.5 * tanh(z / 2) + 0.5 with the hardware
// tanh.approx: one MUFU op per element instead of an exp and an IEEE divide, fewer
// instructions in an epilogue whose instruction count sets its time at K = 512 (above).
// Its absolute error, about 5e-4 (tanh.approx's), is below bf16's spacing near 0.5
// (3.9e-3) and about fp16's (4.9e-4); for small outputs (z below about -8) 0.5 * t + 0.5
// cancels and the relative error grows, where expf would keep it. The float32 (TF32
// tensor-core) kernels need float accuracy and use exp and a reciprocal instead
// (BiasSigmoidExpRcp).
//
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAContext.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <optional>
#include <type_traits>
#include <utility>

namespace customops {
namespace fls_cuda {
namespace sm90 {

// The EVT's compute functions: out = sigmoid(acc + bias), on fragments of float.
// 16-bit outputs: 0.5 * tanh(acc / 2 + bias / 2) + 0.5, so that halving z folds into one FFMA
// (bias / 2 is shared by the rows of a column where the compiler sees it: 2.3 FP ops and one
// MUFU per element in the SASS, against 4 and one for LinCombPerColBiasEltAct with CUTLASS's
// tanh sigmoid). tanh.approx of +-inf is +-1 and of NaN is NaN, so the limits and NaN carry.
template <typename T>
struct BiasSigmoidTanh {
  CUTLASS_DEVICE T operator()(T const& acc, T const& bias) const {
    T y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < T::kElements; ++i) {
      float t;
      asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(fmaf(acc[i], 0.5f, bias[i] * 0.5f)));
      y[i] = fmaf(t, 0.5f, 0.5f);
    }
    return y;
  }
};
// float (TF32) outputs: 1 / (1 + exp(-z)), exp as ex2.approx (its relative error grows with |z|,
// to ~6e-6 at |z| = 80, far below TF32's input rounding), the quotient as a multiply by
// rcp.approx (1 / inf = 0 gives the right limit for z -> -inf).
template <typename T>
struct BiasSigmoidExpRcp {
  CUTLASS_DEVICE T operator()(T const& acc, T const& bias) const {
    T y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < T::kElements; ++i) y[i] = __fdividef(1.f, 1.f + __expf(-(acc[i] + bias[i])));
    return y;
  }
};
template <typename Element>
struct DefaultBiasSigmoid {
  template <typename T>
  using type = std::conditional_t<std::is_same_v<Element, float>, BiasSigmoidExpRcp<T>, BiasSigmoidTanh<T>>;
};

// D = Fn(acc, bias[n]) in float, stored as Element; no C operand, no alpha or beta. Arguments:
// {acc: {}, bias: {pointer, value when null, stride}, Fn: {}}.
template <typename Element, typename TileShape>
using BiasSigmoidEVT = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<
        DefaultBiasSigmoid<Element>::template type, Element, float, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90AccFetch,
    cutlass::epilogue::fusion::Sm90RowBroadcast<
        0, TileShape, Element, float, cute::Stride<cute::_0, cute::_1, int64_t>, 16 / sizeof(Element)>>;

// Element: bf16, fp16, or float (read as TF32 by the tensor cores: only where the user allows TF32).
// EpilogueTile: CUTLASS's automatic choice unless a kernel names one (pingpong_128x128_epi64_*.cu).
template <
    typename Element, typename TileShape, typename ClusterShape, typename MainloopSchedule, typename EpilogueSchedule,
    typename EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto>
struct Gemm {
  using Fusion = BiasSigmoidEVT<Element, TileShape>;
  static constexpr int kAlign = 16 / sizeof(Element);  // TMA: 16-byte rows
  using LayoutA = cutlass::layout::RowMajor;     // x: (M, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // weight (N, K) read as B = weight^T: (K, N)
  using LayoutD = cutlass::layout::RowMajor;     // out: (M, N)

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpilogueTile, float, float, void,
      LayoutD, kAlign, Element, LayoutD, kAlign, EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, Mainloop, Epilogue, cutlass::gemm::PersistentScheduler>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Runs one configuration on the current stream. Arguments passed sm90_supported().
template <typename G, typename Element>
void run(
    const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d,
    const char* name) {
  using Adapter = typename G::Adapter;
  using Kernel = typename Adapter::GemmKernel;
  const int M = static_cast<int>(x2d.size(0)), N = static_cast<int>(weight.size(0)), K = static_cast<int>(x2d.size(1));
  // Packed strides, then the row strides (in elements) of the actual tensors.
  typename Kernel::StrideA stride_a =
      cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(M, K, 1));
  cute::get<0>(stride_a) = x2d.stride(0);
  typename Kernel::StrideB stride_b =
      cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(N, K, 1));
  cute::get<0>(stride_b) = weight.stride(0);
  const typename Kernel::StrideC stride_c =
      cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(M, N, 1));
  typename Kernel::StrideD stride_d =
      cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(M, N, 1));
  cute::get<0>(stride_d) = out2d.stride(0);

  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = x2d.get_device();
  hw_info.sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto* bias_ptr = bias.has_value() ? static_cast<const Element*>(bias->const_data_ptr()) : nullptr;
  // The EVT's arguments {acc, bias broadcast {pointer, value when null, stride}, compute}: without
  // a bias the broadcast reads its null value (0) instead of memory.
  const typename Adapter::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {static_cast<const Element*>(x2d.const_data_ptr()), stride_a,
       static_cast<const Element*>(weight.const_data_ptr()), stride_b},
      {{{}, {bias_ptr, Element(0), {}}, {}}, nullptr, stride_c, static_cast<Element*>(out2d.data_ptr()), stride_d},
      hw_info};

  Adapter gemm;
  TORCH_CHECK(
      gemm.can_implement(args) == cutlass::Status::kSuccess, "customops: CUTLASS kernel ", name,
      " cannot run these arguments (an internal dispatch error; please report it)");
  const size_t workspace_bytes = Adapter::get_workspace_size(args);
  at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, x2d.options().dtype(at::kByte));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cutlass::Status status = gemm.run(args, workspace.data_ptr(), stream);
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(
      status == cutlass::Status::kSuccess && err == cudaSuccess, "customops: CUDA kernel ", name,
      " failed to launch: ", cutlass::cutlassGetStatusString(status), " / ", cudaGetErrorString(err));
}

}  // namespace sm90
}  // namespace fls_cuda
}  // namespace customops

// One configuration and dtype per translation unit (sm90/*.cu), so that the build compiles
// them in parallel: defines fls_cuda::sm90::run_NAME(x2d, weight, bias, out2d). The arguments
// after ELEMENT are Gemm's: tile, cluster, mainloop and epilogue schedules[, epilogue tile].
#define CUSTOMOPS_FLS_SM90_KERNEL(NAME, ELEMENT, ...)                                                              \
  namespace customops {                                                                                            \
  namespace fls_cuda {                                                                                             \
  namespace sm90 {                                                                                                 \
  void run_##NAME(                                                                                                 \
      const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d) { \
    run<Gemm<ELEMENT, __VA_ARGS__>, ELEMENT>(x2d, weight, bias, out2d, "fused_linear_sigmoid_sm90_" #NAME);        \
  }                                                                                                                \
  }                                                                                                                \
  }                                                                                                                \
  }
