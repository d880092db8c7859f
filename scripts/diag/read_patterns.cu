// Reads of a bf16 weight (N x K, row stride ldw elements) in the access patterns a small-M GEMV
// could use, with no arithmetic beyond a sum that keeps the loads alive: which pattern reaches the
// streaming-read floor (scripts/diag/read_floor.py: 13.6 µs for 32 MiB under the benchmark's
// flush, where every GEMV tried takes ~18 µs; benchmarks/NOTES.md, "Seventh session").
// Plain CUDA, no torch headers: built with nvcc into a shared library and called through ctypes
// by read_patterns.py. Each launcher returns cudaGetLastError() after the launch.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__device__ __forceinline__ float sum8(uint4 v) {
  // bf16 pairs to float through their high halves: cheap, and the compiler cannot drop the load.
  return __uint_as_float(v.x & 0xffff0000u) + __uint_as_float(v.y & 0xffff0000u) +
         __uint_as_float(v.z & 0xffff0000u) + __uint_as_float(v.w & 0xffff0000u);
}

__device__ __forceinline__ uint4 ld16(const char* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 1. Contiguous: block b reads bytes [b * U * 16 * 256, +U * 16 * 256), all U loads per thread
//    issued before the first use (the Triton read's pattern).
template <int U>
__global__ void __launch_bounds__(256) contiguous(const char* w, int64_t bytes, float* sink) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * U * 256 * 16 + threadIdx.x * 16;
  uint4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t off = base + static_cast<int64_t>(u) * 256 * 16;
    v[u] = off < bytes ? ld16(w + off) : make_uint4(0, 0, 0, 0);
  }
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < U; ++u) s += sum8(v[u]);
  if (s == 123.f) sink[0] = s;  // practically never true; keeps the loads
}

// 2. The small-M MMA pattern: a warp owns 16 weight rows; lane (g, q) = (lane / 4, lane % 4)
//    reads 16 bytes of rows g and g + 8 at k-offset 8q, so each load instruction covers 8 rows x
//    64 contiguous bytes; U such k-steps (64 elements each) are in flight per lane. WARPS warps
//    per block split K between them (split-K inside the block); SPLIT blocks per row group split
//    it across blocks.
template <int U, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) rows16(const char* w, int64_t ldw_bytes, int N, int K, int split,
                                                     float* sink) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16;
  const char* r0 = w + (n0 + g < N ? n0 + g : N - 1) * ldw_bytes;
  const char* r1 = w + (n0 + g + 8 < N ? n0 + g + 8 : N - 1) * ldw_bytes;
  const int k_per_block = (K + split - 1) / split;
  const int k_begin = blockIdx.y * k_per_block;
  const int k_end = k_begin + k_per_block < K ? k_begin + k_per_block : K;
  float s = 0.f;
  for (int k = k_begin + warp * U * 32; k < k_end; k += WARPS * U * 32) {
    uint4 a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = k + u * 32 + 8 * q;  // elements; 4 lanes x 8 elements = 32 per k-step
      const bool ok = kk < k_end;
      a[u] = ok ? ld16(r0 + static_cast<int64_t>(kk) * 2) : make_uint4(0, 0, 0, 0);
      b[u] = ok ? ld16(r1 + static_cast<int64_t>(kk) * 2) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) s += sum8(a[u]) + sum8(b[u]);
  }
  if (s == 123.f) sink[0] = s;
}

// 3. Row-contiguous: each warp reads whole rows, 512 contiguous bytes per load instruction,
//    U loads in flight per lane; block b owns ROWS consecutive rows (ROWS / WARPS per warp).
template <int U, int WARPS, int ROWS>
__global__ void __launch_bounds__(WARPS * 32) row_streams(const char* w, int64_t ldw_bytes, int N, int K,
                                                          float* sink) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float s = 0.f;
  for (int r = warp; r < ROWS; r += WARPS) {
    const int64_t n = static_cast<int64_t>(blockIdx.x) * ROWS + r;
    if (n >= N) break;
    const char* row = w + n * ldw_bytes;
    const int64_t row_bytes = static_cast<int64_t>(K) * 2;
    for (int64_t off = lane * 16; off < row_bytes; off += U * 512) {
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t o = off + u * 512;
        v[u] = o < row_bytes ? ld16(row + o) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) s += sum8(v[u]);
    }
  }
  if (s == 123.f) sink[0] = s;
}

}  // namespace

extern "C" {

// pattern 1
int read_contiguous(const void* w, int64_t bytes, int u, void* sink, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const auto p = static_cast<const char*>(w);
  const auto f = static_cast<float*>(sink);
#define CASE(U)                                                                                     \
  case U:                                                                                           \
    contiguous<U><<<static_cast<unsigned>((bytes + U * 256 * 16 - 1) / (U * 256 * 16)), 256, 0, s>>>(p, bytes, f); \
    break;
  switch (u) {
    CASE(1) CASE(2) CASE(4) CASE(8) CASE(16)
    default: return -1;
  }
#undef CASE
  return static_cast<int>(cudaGetLastError());
}

// pattern 2; u in {2, 4, 8, 16}, warps in {1, 4, 8}
int read_rows16(const void* w, int64_t ldw, int N, int K, int u, int warps, int split, void* sink, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const auto p = static_cast<const char*>(w);
  const auto f = static_cast<float*>(sink);
  const dim3 grid(static_cast<unsigned>((N + 15) / 16), static_cast<unsigned>(split));
#define CASE(U, W)                                                             \
  if (u == U && warps == W) {                                                  \
    rows16<U, W><<<grid, W * 32, 0, s>>>(p, ldw * 2, N, K, split, f);          \
    return static_cast<int>(cudaGetLastError());                               \
  }
  CASE(2, 1) CASE(4, 1) CASE(8, 1) CASE(16, 1)
  CASE(2, 4) CASE(4, 4) CASE(8, 4) CASE(16, 4)
  CASE(2, 8) CASE(4, 8) CASE(8, 8) CASE(16, 8)
#undef CASE
  return -1;
}

// pattern 3; (u, warps, rows) in the cases below
int read_row_streams(const void* w, int64_t ldw, int N, int K, int u, int warps, int rows, void* sink, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const auto p = static_cast<const char*>(w);
  const auto f = static_cast<float*>(sink);
#define CASE(U, W, R)                                                                                 \
  if (u == U && warps == W && rows == R) {                                                            \
    row_streams<U, W, R><<<static_cast<unsigned>((N + R - 1) / R), W * 32, 0, s>>>(p, ldw * 2, N, K, f); \
    return static_cast<int>(cudaGetLastError());                                                      \
  }
  CASE(4, 4, 4) CASE(8, 4, 4) CASE(16, 4, 4)
  CASE(4, 8, 8) CASE(8, 8, 8) CASE(16, 8, 8)
  CASE(8, 8, 16) CASE(16, 8, 16) CASE(8, 8, 32)
#undef CASE
  return -1;
}

}  // extern "C"
