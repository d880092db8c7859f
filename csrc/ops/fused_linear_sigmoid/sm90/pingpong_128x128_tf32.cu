// float32 on TF32 tensor cores (only where torch allows TF32 for matmuls); k-tile 32 = 128 bytes.
#include "gemm_bias_sigmoid.cuh"

namespace customops::fls_cuda::sm90::pingpong_128x128_tf32 {
using Tile = cute::Shape<cute::_128, cute::_128, cute::_32>;
using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
}  // namespace customops::fls_cuda::sm90::pingpong_128x128_tf32

CUSTOMOPS_FLS_SM90_KERNEL(
    pingpong_128x128_tf32, float, pingpong_128x128_tf32::Tile, pingpong_128x128_tf32::Cluster,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized)
