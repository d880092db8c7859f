// Cooperative: two consumer warpgroups share one 256x128 tile (cuBLAS's shape for large GEMMs).
#include "gemm_bias_sigmoid.cuh"

namespace customops::fls_cuda::sm90::coop_256x128_bf16 {
using Tile = cute::Shape<cute::_256, cute::_128, cute::_64>;
using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
}  // namespace customops::fls_cuda::sm90::coop_256x128_bf16

CUSTOMOPS_FLS_SM90_KERNEL(coop_256x128_bf16, cutlass::bfloat16_t, coop_256x128_bf16::Tile, coop_256x128_bf16::Cluster,
                          cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                          cutlass::epilogue::TmaWarpSpecializedCooperative)
