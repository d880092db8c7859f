// CUTLASS sm90 configurations of fused_linear_sigmoid (bf16) that the library does not build,
// for scripts/diag/sm90_variants.py: tile, cluster, epilogue tile and activation varied around
// the library's Pingpong 128x128 kernel. Built once per VARIANT (one translation unit each, so the
// builds run in parallel) and linked into one shared library with a C entry point per variant,
// called through ctypes with raw pointers: no torch ABI, so it runs under any torch version.
#include "../../csrc/ops/fused_linear_sigmoid/sm90/gemm_bias_sigmoid.cuh"

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

#if VARIANT == 0  // the library's kernel: Pingpong 128x128x64, cluster 2x1
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP>;
#elif VARIANT == 1  // no cluster
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_1, _1, _1>, PP, EPP>;
#elif VARIANT == 2  // epilogue tile 64x64 (auto: 64x32)
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>>;
#elif VARIANT == 3  // epilogue tile 64x128
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _128>>;
#elif VARIANT == 4  // Pingpong 64x256 (one m64n256 wgmma per k-step)
using G = sm90::Gemm<BF, Shape<_64, _256, _64>, Shape<_2, _1, _1>, PP, EPP>;
#elif VARIANT == 5  // k-tile 128: half the pipeline round trips at K = 512
using G = sm90::Gemm<BF, Shape<_128, _128, _128>, Shape<_2, _1, _1>, PP, EPP>;
#elif VARIANT == 6  // bias only, no sigmoid: what the activation costs
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, EPP, EAuto, Identity>;
#elif VARIANT == 7  // Cooperative 256x128, cluster 2x1, epilogue tile 128x64
using G = sm90::Gemm<BF, Shape<_256, _128, _64>, Shape<_2, _1, _1>, CO, ECO, Shape<_128, _64>>;
#elif VARIANT == 8  // Pingpong 64x256, epilogue tile 64x64
using G = sm90::Gemm<BF, Shape<_64, _256, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _64>>;
#elif VARIANT == 9  // cluster 1x2 (x multicast instead of the weight)
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_1, _2, _1>, PP, EPP>;
#elif VARIANT == 10  // epilogue tile 64x128, cluster 1x2
using G = sm90::Gemm<BF, Shape<_128, _128, _64>, Shape<_1, _2, _1>, PP, EPP, Shape<_64, _128>>;
#elif VARIANT == 11  // Cooperative 256x128, cluster 1x2 (cuBLAS's choice here), epilogue tile 128x128
// (a Pingpong epilogue tile must be 64 rows: CUTLASS rejects 128x64)
using G = sm90::Gemm<BF, Shape<_256, _128, _64>, Shape<_1, _2, _1>, CO, ECO, Shape<_128, _128>>;
#elif VARIANT == 12  // Pingpong 64x256, epilogue tile 64x128
using G = sm90::Gemm<BF, Shape<_64, _256, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _128>>;
#elif VARIANT == 13  // Pingpong 64x256, epilogue tile 64x256
using G = sm90::Gemm<BF, Shape<_64, _256, _64>, Shape<_2, _1, _1>, PP, EPP, Shape<_64, _256>>;
#elif VARIANT == 14  // the library's Cooperative 128x256 (cluster 1x2) with epilogue tile 128x64 (auto: 128x32)
using G = sm90::Gemm<BF, Shape<_128, _256, _64>, Shape<_1, _2, _1>, CO, ECO, Shape<_128, _64>>;
#elif VARIANT == 15  // the same with epilogue tile 128x128
using G = sm90::Gemm<BF, Shape<_128, _256, _64>, Shape<_1, _2, _1>, CO, ECO, Shape<_128, _128>>;
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
