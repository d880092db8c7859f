// Cooperative 128x256: the wide tile halves the reloads of x for wide outputs.
#include "gemm_bias_sigmoid.cuh"

namespace customops::fls_cuda::sm90::coop_128x256_fp16 {
using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
}  // namespace customops::fls_cuda::sm90::coop_128x256_fp16

CUSTOMOPS_FLS_SM90_KERNEL(
    coop_128x256_fp16, cutlass::half_t, coop_128x256_fp16::Tile, coop_128x256_fp16::Cluster,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative)
