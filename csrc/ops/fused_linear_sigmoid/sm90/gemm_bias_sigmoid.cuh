// fused_linear_sigmoid on Hopper through CUTLASS 3.x (sm90a): TMA + wgmma
// warp-specialized GEMM kernels whose epilogue adds the bias and applies the
// sigmoid before the single store of the output, so the output never makes a
// second trip through memory.
//
// For bf16/fp16 the sigmoid is CUTLASS's own, computed as 0.5 * tanh(z / 2) + 0.5
// with the hardware tanh.approx (CUTLASS_USE_TANH_FOR_SIGMOID): one MUFU op per
// element instead of an exp and an IEEE divide, which measurably slowed the
// epilogue (issue 4's table). Its error, about 5e-4 absolute, is below bf16/fp16
// resolution. The float32 (TF32 tensor-core) kernels need float accuracy and
// use SigmoidExpRcp below instead.
//
#pragma once

#define CUTLASS_USE_TANH_FOR_SIGMOID 1

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <cmath>
#include <optional>
#include <type_traits>

namespace customops {
namespace fls_cuda {
namespace sm90 {

// sigmoid(z) = 1 / (1 + exp(-z)) in float: exp as ex2.approx (its relative error grows with
// |z|, to ~6e-6 at |z| = 80, far below TF32's input rounding), the quotient as a multiply by
// rcp.approx (1 / inf = 0 gives the right limit for z -> -inf).
template <typename T>
struct SigmoidExpRcp {
  CUTLASS_HOST_DEVICE T operator()(T z) const {
#if defined(__CUDA_ARCH__)
    return __fdividef(1.f, 1.f + __expf(-z));
#else
    return 1.f / (1.f + std::exp(-z));
#endif
  }
};
template <typename T, int N>
struct SigmoidExpRcp<cutlass::Array<T, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& z) const {
    cutlass::Array<T, N> y;
    SigmoidExpRcp<T> f;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = f(z[i]);
    return y;
  }
};

// The sigmoid per element type: float (TF32) needs SigmoidExpRcp's accuracy.
template <typename Element>
struct DefaultSigmoid {
  template <typename T>
  using type = std::conditional_t<std::is_same_v<Element, float>, SigmoidExpRcp<T>,
                                  cutlass::epilogue::thread::Sigmoid<T>>;
};

// Element: bf16, fp16, or float (read as TF32 by the tensor cores: only where the user allows TF32).
// EpilogueTile: CUTLASS's automatic choice unless a kernel names one (pingpong_128x128_epi64_*.cu);
// Act is left at its default by the library's kernels. scripts/diag/sm90_variants.cu varies both.
template <typename Element, typename TileShape, typename ClusterShape, typename MainloopSchedule,
          typename EpilogueSchedule, typename EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto,
          template <typename> class Act = DefaultSigmoid<Element>::template type>
struct Gemm {
  static constexpr int kAlign = 16 / sizeof(Element);  // TMA: 16-byte rows
  using LayoutA = cutlass::layout::RowMajor;     // x: (M, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // weight (N, K) read as B = weight^T: (K, N)
  using LayoutD = cutlass::layout::RowMajor;     // out: (M, N)
  // D = sigmoid(1 * acc + bias[n]); no C operand.
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<Act, Element, float, Element, Element, float>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpilogueTile, float, float, void, LayoutD, kAlign, Element, LayoutD,
      kAlign, EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// The kernel's arguments from raw pointers and row strides (in elements); bias may be null.
// Shared by run() below and the variant timings in scripts/diag.
template <typename G, typename Element>
typename G::Adapter::Arguments make_arguments(const Element* x, int64_t ldx, const Element* w, int64_t ldw,
                                              const Element* bias, Element* out, int64_t ldo, int M, int N, int K,
                                              int device_id, int sm_count) {
  using Kernel = typename G::Adapter::GemmKernel;
  typename Kernel::StrideA stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(M, K, 1));
  cute::get<0>(stride_a) = ldx;
  typename Kernel::StrideB stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(N, K, 1));
  cute::get<0>(stride_b) = ldw;
  const typename Kernel::StrideC stride_c =
      cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(M, N, 1));
  typename Kernel::StrideD stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, cute::make_shape(M, N, 1));
  cute::get<0>(stride_d) = ldo;

  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = device_id;
  hw_info.sm_count = sm_count;
  typename G::Adapter::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1}, {x, stride_a, w, stride_b},
      {{}, nullptr, stride_c, out, stride_d}, hw_info};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  // Without a bias the broadcast reads its null value (0) instead of memory.
  args.epilogue.thread.bias_ptr = bias;
  return args;
}

// Runs one configuration on the current stream. Arguments passed sm90_supported().
template <typename G, typename Element>
void run(const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias, at::Tensor& out2d,
         const char* name) {
  using Adapter = typename G::Adapter;
  const auto args = make_arguments<G, Element>(
      static_cast<const Element*>(x2d.const_data_ptr()), x2d.stride(0),
      static_cast<const Element*>(weight.const_data_ptr()), weight.stride(0),
      bias.has_value() ? static_cast<const Element*>(bias->const_data_ptr()) : nullptr,
      static_cast<Element*>(out2d.data_ptr()), out2d.stride(0), static_cast<int>(x2d.size(0)),
      static_cast<int>(weight.size(0)), static_cast<int>(x2d.size(1)), x2d.get_device(),
      at::cuda::getCurrentDeviceProperties()->multiProcessorCount);

  Adapter gemm;
  TORCH_CHECK(gemm.can_implement(args) == cutlass::Status::kSuccess, "customops: CUTLASS kernel ", name,
              " cannot run these arguments (an internal dispatch error; please report it)");
  const size_t workspace_bytes = Adapter::get_workspace_size(args);
  at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, x2d.options().dtype(at::kByte));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cutlass::Status status = gemm.run(args, workspace.data_ptr(), stream);
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(status == cutlass::Status::kSuccess && err == cudaSuccess, "customops: CUDA kernel ", name,
              " failed to launch: ", cutlass::cutlassGetStatusString(status), " / ", cudaGetErrorString(err));
}

}  // namespace sm90
}  // namespace fls_cuda
}  // namespace customops

// One configuration and dtype per translation unit (sm90/*.cu), so that the build compiles
// them in parallel: defines fls_cuda::sm90::run_NAME(x2d, weight, bias, out2d). The arguments
// after ELEMENT are Gemm's: tile, cluster, mainloop and epilogue schedules[, epilogue tile].
#define CUSTOMOPS_FLS_SM90_KERNEL(NAME, ELEMENT, ...)                                                              \
  namespace customops {                                                                                           \
  namespace fls_cuda {                                                                                            \
  namespace sm90 {                                                                                                \
  void run_##NAME(const at::Tensor& x2d, const at::Tensor& weight, const std::optional<at::Tensor>& bias,         \
                  at::Tensor& out2d) {                                                                            \
    run<Gemm<ELEMENT, __VA_ARGS__>, ELEMENT>(x2d, weight, bias, out2d, "fused_linear_sigmoid_sm90_" #NAME);       \
  }                                                                                                               \
  }                                                                                                               \
  }                                                                                                               \
  }
