// CUTLASS sm90 configurations of fused_linear_sigmoid (bf16) that the library does not build,
// for scripts/diag/sm90_variants.py: tile, cluster, epilogue tile and activation varied around
// the library's Pingpong 128x128 kernel. Built once per VARIANT (one translation unit each, so the
// builds run in parallel) and linked into one shared library with a C entry point per variant,
// called through ctypes with raw pointers: no torch ABI, so it runs under any torch version.
// CUTLASS's Sigmoid as 0.5 * tanh(z / 2) + 0.5 (tanh.approx), as the library used it before its
// own EVT: the LinComb variants that keep CUTLASS's Sigmoid (all of 0-22 and 26 but 6 and 20,
// bias only, and 18, 19, 21, 22, which bring their own).
#define CUTLASS_USE_TANH_FOR_SIGMOID 1
#include "../../csrc/ops/fused_linear_sigmoid/sm90/gemm_bias_sigmoid.cuh"

// CUTLASS's fusion operations and activations, for the LinComb variants (the library uses its own EVT).
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/thread/activation.h>

namespace {
using namespace cute;
using BF = cutlass::bfloat16_t;
using PP = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CO = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EPP = cutlass::epilogue::TmaWarpSpecialized;
using ECO = cutlass::epilogue::TmaWarpSpecializedCooperative;
using EAuto = cutlass::epilogue::collective::EpilogueTileAuto;
template <typename T>
using Identity = cutlass::epilogue::thread::Identity<T>;
namespace sm90 = customops::fls_cuda::sm90;

// The library's Gemm with CUTLASS's LinCombPerColBiasEltAct epilogue (alpha * acc + beta * C +
// bias, then Act), which the library's kernels used until the eighth session.
template <typename Tile, typename Cluster, typename MainloopSchedule, typename EpilogueSchedule,
          typename EpilogueTile = EAuto, template <typename> class Act = cutlass::epilogue::thread::Sigmoid>
using LinComb = sm90::Gemm<BF, Tile, Cluster, MainloopSchedule, EpilogueSchedule, EpilogueTile,
                           cutlass::epilogue::fusion::LinCombPerColBiasEltAct<Act, BF, float, BF, BF, float>>;

// sigmoid(z) = 0.5 * tanh(z / 2) + 0.5 with one tanh.approx.f16x2 per pair of elements, where
// CUTLASS's tanh-based sigmoid spends one tanh.approx.f32 per element: the epilogue's MUFU work
// halves. z / 2 is rounded to fp16 first (2^-11 relative, finer than the bf16 output; beyond
// 65504 it becomes inf, whose tanh is the right limit).
template <typename T>
struct SigmoidTanhF16x2 : cutlass::epilogue::thread::Sigmoid<T> {};
template <int N>
struct SigmoidTanhF16x2<cutlass::Array<float, N>> {
  static_assert(N % 2 == 0);
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& z) const {
    cutlass::Array<float, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; i += 2) {
      uint32_t h;
      asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(z[i + 1] * 0.5f), "f"(z[i] * 0.5f));
      asm("tanh.approx.f16x2 %0, %0;" : "+r"(h));
      unsigned short lo, hi;
      asm("mov.b32 {%0, %1}, %2;" : "=h"(lo), "=h"(hi) : "r"(h));
      float t0, t1;
      asm("cvt.f32.f16 %0, %1;" : "=f"(t0) : "h"(lo));
      asm("cvt.f32.f16 %0, %1;" : "=f"(t1) : "h"(hi));
      y[i] = fmaf(t0, 0.5f, 0.5f);
      y[i + 1] = fmaf(t1, 0.5f, 0.5f);
    }
    return y;
  }
};

// sigmoid with kPoly of every 8 elements computed on the FMA pipe, the rest through CUTLASS's
// tanh.approx (MUFU, 16 lanes per SM). At K = 512 the epilogue is bound by MUFU work that the
// other warp group's main loop does not hide (benchmarks/NOTES.md, "Seventh session"); moving
// part of it to the FMA pipe (128 lanes per SM) shares it between the two, as FlashAttention-4
// does for exp2. The FMA form: a degree-7 polynomial in a = min(|z|, 8), fitted on [0, 8]
// (scripts/diag/sigmoid_poly.py: max abs error 3.4e-4, against 2.4e-4 for the tanh.approx form,
// p(8) pinned to 1), mirrored as 1 - p for z < 0, with p capped at 1 so that outputs stay in
// [0, 1]. min.NaN keeps a NaN input NaN (fminf would return 8).
__device__ __forceinline__ float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float sigmoid_poly(float z) {
  const float a = min_nan(fabsf(z), 8.f);
  float p = -3.07319056e-06f;
  p = fmaf(p, a, 0.00010726921f);
  p = fmaf(p, a, -0.00149513385f);
  p = fmaf(p, a, 0.0102947699f);
  p = fmaf(p, a, -0.0323949866f);
  p = fmaf(p, a, 0.00352868275f);
  p = fmaf(p, a, 0.251358181f);
  p = fmaf(p, a, 0.499670357f);
  p = min_nan(p, 1.f);
  return z < 0.f ? 1.f - p : p;
}
template <int kPoly, typename T>
struct SigmoidSplit : cutlass::epilogue::thread::Sigmoid<T> {};
template <int kPoly, int N>
struct SigmoidSplit<kPoly, cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& z) const {
    cutlass::Array<float, N> y;
    cutlass::epilogue::thread::Sigmoid<float> tanh_form;  // CUTLASS_USE_TANH_FOR_SIGMOID
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = i % 8 < kPoly ? sigmoid_poly(z[i]) : tanh_form(z[i]);
    return y;
  }
};
template <typename T>
using SigmoidSplit3 = SigmoidSplit<3, T>;
template <typename T>
using SigmoidSplit4 = SigmoidSplit<4, T>;


#if VARIANT == 0  // the library's kernel until the eighth session: Pingpong 128x128x64, cluster 2x1, LinComb epilogue
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP>;
#elif VARIANT == 1  // no cluster
using G = LinComb<Shape<_128, _128, _64>, Shape<_1, _1, _1>, PP, EPP>;
#elif VARIANT == 2  // epilogue tile 64x64 (auto: 64x32)
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>>;
#elif VARIANT == 3  // epilogue tile 64x128
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _128>>;
#elif VARIANT == 4  // Pingpong 64x256 (one m64n256 wgmma per k-step)
using G = LinComb<Shape<_64, _256, _64>, Shape<_2, _1, _1>, PP, EPP>;
#elif VARIANT == 5  // k-tile 128: half the pipeline round trips at K = 512
using G = LinComb<Shape<_128, _128, _128>, Shape<_2, _1, _1>, PP, EPP>;
#elif VARIANT == 6  // bias only, no sigmoid: what the activation costs
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, EAuto, Identity>;
#elif VARIANT == 7  // Cooperative 256x128, cluster 2x1, epilogue tile 128x64
using G = LinComb<Shape<_256, _128, _64>, Shape<_2, _1, _1>, CO, ECO, Shape<_128, _64>>;
#elif VARIANT == 8  // Pingpong 64x256, epilogue tile 64x64
using G = LinComb<Shape<_64, _256, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>>;
#elif VARIANT == 9  // cluster 1x2 (x multicast instead of the weight)
using G = LinComb<Shape<_128, _128, _64>, Shape<_1, _2, _1>, PP, EPP>;
#elif VARIANT == 10  // epilogue tile 64x128, cluster 1x2
using G = LinComb<Shape<_128, _128, _64>, Shape<_1, _2, _1>, PP, EPP, Shape<_64, _128>>;
#elif VARIANT == 11  // Cooperative 256x128, cluster 1x2 (cuBLAS's choice here), epilogue tile 128x128
// (a Pingpong epilogue tile must be 64 rows: CUTLASS rejects 128x64)
using G = LinComb<Shape<_256, _128, _64>, Shape<_1, _2, _1>, CO, ECO, Shape<_128, _128>>;
#elif VARIANT == 12  // Pingpong 64x256, epilogue tile 64x128
using G = LinComb<Shape<_64, _256, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _128>>;
#elif VARIANT == 13  // Pingpong 64x256, epilogue tile 64x256
using G = LinComb<Shape<_64, _256, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _256>>;
#elif VARIANT == 14  // the library's Cooperative 128x256 (cluster 1x2) with epilogue tile 128x64 (auto: 128x32)
using G = LinComb<Shape<_128, _256, _64>, Shape<_1, _2, _1>, CO, ECO, Shape<_128, _64>>;
#elif VARIANT == 15  // the same with epilogue tile 128x128
using G = LinComb<Shape<_128, _256, _64>, Shape<_1, _2, _1>, CO, ECO, Shape<_128, _128>>;
#elif VARIANT == 16  // epilogue tile 64x64, cluster 2x2 (both operands multicast)
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _2, _1>, PP, EPP, Shape<_64, _64>>;
#elif VARIANT == 17  // epilogue tile 64x64, cluster 1x2
using G = LinComb<Shape<_128, _128, _64>, Shape<_1, _2, _1>, PP, EPP, Shape<_64, _64>>;
#elif VARIANT == 18  // epilogue tile 64x64, sigmoid from a packed tanh.approx.f16x2 (half the MUFU ops)
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>, SigmoidTanhF16x2>;
#elif VARIANT == 19  // the library's kernel with the packed sigmoid
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, EAuto, SigmoidTanhF16x2>;
#elif VARIANT == 20  // epilogue tile 64x64, bias only (no sigmoid): v2's activation cost
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>, Identity>;
#elif VARIANT == 21  // epilogue tile 64x64, 3 of every 8 sigmoids on the FMA pipe
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>, SigmoidSplit3>;
#elif VARIANT == 22  // epilogue tile 64x64, half the sigmoids on the FMA pipe
using G = LinComb<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>, SigmoidSplit4>;
#elif VARIANT == 23  // v2 with the library's EVT, sigmoid(acc + bias) with no alpha or beta: the library's epi64 kernel
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>>;
#elif VARIANT == 24  // v0 with the library's EVT: the library's Pingpong 128x128 kernel
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP>;
#elif VARIANT == 25  // v26 with the library's EVT: the library's Cooperative 128x256 kernel
using G = sm90::Gemm<BF, Shape<_128, _256, _64>, Shape<_1, _2, _1>, CO, ECO>;
#elif VARIANT == 26  // Cooperative 128x256 c1x2 with the LinComb epilogue, for v25
using G = LinComb<Shape<_128, _256, _64>, Shape<_1, _2, _1>, CO, ECO>;
#else
#error "unknown VARIANT"
#endif
}  // namespace

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

// Returns 0 on success, 1 when the kernel cannot run the arguments, 2 on a launch error.
// raster: 0 heuristic, 1 along M, 2 along N (CUTLASS's RasterOrderOptions); swizzle: 1, 2, 4 or 8.
extern "C" int CAT(customops_sm90_variant_, VARIANT)(const void* x, int64_t ldx, const void* w, int64_t ldw,
                                                    const void* bias, void* out, int64_t ldo, int M, int N, int K,
                                                    int raster, int swizzle, void* stream) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  auto args = sm90::make_arguments<G, BF>(static_cast<const BF*>(x), ldx, static_cast<const BF*>(w), ldw,
                                          static_cast<const BF*>(bias), static_cast<BF*>(out), ldo, M, N, K, device,
                                          sms);
  args.scheduler.raster_order = static_cast<decltype(args.scheduler.raster_order)>(raster);
  args.scheduler.max_swizzle_size = swizzle;
  typename G::Adapter gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
  static void* workspace = nullptr;
  static size_t capacity = 0;
  const size_t need = G::Adapter::get_workspace_size(args);
  if (need > capacity) {
    cudaFree(workspace);
    if (cudaMalloc(&workspace, need) != cudaSuccess) return 2;
    capacity = need;
  }
  const cutlass::Status status = gemm.run(args, workspace, static_cast<cudaStream_t>(stream));
  return status == cutlass::Status::kSuccess && cudaGetLastError() == cudaSuccess ? 0 : 2;
}
