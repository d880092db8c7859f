// Pingpong: two consumer warpgroups alternate tiles, so one's epilogue overlaps the other's MMAs.
#include "gemm_bias_sigmoid.cuh"

namespace customops::fls_cuda::sm90::pingpong_128x128_bf16 {
using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
}  // namespace customops::fls_cuda::sm90::pingpong_128x128_bf16

CUSTOMOPS_FLS_SM90_KERNEL(
    pingpong_128x128_bf16, cutlass::bfloat16_t, pingpong_128x128_bf16::Tile, pingpong_128x128_bf16::Cluster,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized)
