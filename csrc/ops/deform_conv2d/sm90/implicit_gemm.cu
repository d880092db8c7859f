// deform_conv2d's forward as an implicit GEMM on Hopper (sm_90a): the bilinear samples are
// blended straight into the GEMM's shared-memory A tile, so the columns never reach global
// memory. Formula: ../deform_conv2d.h.
//
// A block computes 128 output pixels (rows of the GEMM, over the whole batch) x BN output
// channels, over K = kh * kw * in_channels in steps of 64 channels of one tap:
//   - a producer warpgroup computes each row's sampling point once per (tap, offset group) into
//     a shared table, then blends the four corners of 64 channels per row (16-byte loads from
//     the channels-last input, packed 16-bit FMAs) into the stage's A tile, in the 128-byte
//     swizzled layout wgmma reads; one thread brings the stage's B tile (the weight, swizzled
//     once per call by deform_conv2d_sm90_weight_kernel) by a bulk copy;
//   - two consumer warpgroups (64 rows each) multiply the stage with wgmma, accumulating in
//     float32, and free it; an mbarrier pair per stage orders the two sides;
//   - the consumers add the bias and write the NCHW output through shared memory, so that
//     each warp stores 32 adjacent pixels of one channel.
// The blend is the column kernel's (same rounding), so the two paths agree to the GEMM's
// summation order.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include <utility>

#include "../../common/cuda_utils.cuh"
#include "../deform_conv2d_sm90.h"

namespace customops {
namespace deform_conv2d_sm90 {
namespace {

constexpr int kBM = 128;              // output pixels per block
constexpr int kBK = 64;               // channels per K step (one 128-byte swizzle row of 16-bit values)
constexpr int kConsumerThreads = 256;  // two warpgroups of 64 rows
constexpr int kATileBytes = kBM * kBK * 2;
constexpr int kStageRowPad = 8;  // the epilogue's staging rows, padded against bank conflicts
constexpr int kSmemBudget = 208 * 1024;

template <typename T>
struct Types;
template <>
struct Types<c10::Half> {
  using T2 = __half2;
  static __device__ __forceinline__ T2 splat(float w) {
    return __float2half2_rn(w);
  }
};
template <>
struct Types<c10::BFloat16> {
  using T2 = __nv_bfloat162;
  static __device__ __forceinline__ T2 splat(float w) {
    return __float2bfloat162_rn(w);
  }
};

template <typename T, int BN>
struct MmaOp;
#define CUSTOMOPS_DCN_MMA(TYPE, N, NAME)                                                         \
  template <>                                                                                    \
  struct MmaOp<TYPE, N> {                                                                        \
    using type = cute::SM90::GMMA::NAME<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>; \
  };
CUSTOMOPS_DCN_MMA(c10::Half, 64, MMA_64x64x16_F32F16F16_SS)
CUSTOMOPS_DCN_MMA(c10::Half, 128, MMA_64x128x16_F32F16F16_SS)
CUSTOMOPS_DCN_MMA(c10::Half, 256, MMA_64x256x16_F32F16F16_SS)
CUSTOMOPS_DCN_MMA(c10::BFloat16, 64, MMA_64x64x16_F32BF16BF16_SS)
CUSTOMOPS_DCN_MMA(c10::BFloat16, 128, MMA_64x128x16_F32BF16BF16_SS)
CUSTOMOPS_DCN_MMA(c10::BFloat16, 256, MMA_64x256x16_F32BF16BF16_SS)
#undef CUSTOMOPS_DCN_MMA

template <typename Op, size_t... I>
__device__ __forceinline__ void mma(uint64_t a, uint64_t b, float* d, std::index_sequence<I...>) {
  Op::fma(a, b, d[I]...);
}

// wgmma's shared-memory descriptor of a K-major tile of 128-byte rows, 128-byte swizzle, at a
// 1024-byte aligned address (+ 32 bytes per 16 values of K).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>(addr >> 4);
  d.bitfield.leading_byte_offset_ = 1;         // unused with swizzling
  d.bitfield.stride_byte_offset_ = 1024 >> 4;  // 8 rows of 128 bytes
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<uint8_t>(cute::SM90::GMMA::LayoutType::B128);
  return d.desc_;
}

// Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte swizzled tile.
__device__ __forceinline__ uint32_t swizzled(int r, int c) {
  return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}

// A row's sampling point for one (tap, offset group): the image's first value, the four
// corners' pixel indices in the image (-1: outside, not read) and their weights (mask folded in)
// rounded to T, two copies each.
struct alignas(16) Sample {
  int32_t idx[4];
  uint32_t w[4];
  const void* img;
  int64_t pad;
};

struct Params {
  DeformConv2dGeometry g;
  const void* x;     // input, channels-last contiguous
  const void* off;   // offset, contiguous
  const void* msk;   // mask, contiguous, or nullptr
  const void* wsw;   // (n tiles, k tiles, BN, 64), each BN x 64 tile swizzled
  const void* bias;  // or nullptr
  void* out;         // NCHW contiguous
  int64_t M;         // batch * out pixels
  int k_tiles, c_blocks, og_blocks;
};

// PW producer warpgroups, each thread loading the corners of U rows at once. ptxas allocates
// one register count for the whole kernel (65536 / threads), so setmaxnreg would not give
// either side more: the consumers' accumulators (BN / 2) bound BN for PW = 2.
// U = 0: the corners go to shared memory by cp.async (no registers held while they load), a
// half tile ahead of the blend, which reads them back.
template <typename T, int BN, int PW, int U>
struct Config {
  static constexpr bool kAsync = U == 0;
  static_assert(!kAsync || PW == 1, "cp.async corners: one producer warpgroup");
  static constexpr int kProducerThreads = 128 * PW;
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  static constexpr int kRowsPerPass = kProducerThreads / 8;
  static constexpr int kPasses = kBM / kRowsPerPass;
  static constexpr int kUnroll = kAsync ? 1 : U;
  static_assert(kPasses % kUnroll == 0, "whole groups of rows");
  static constexpr int kSlotBytes = 4 * (kBM / 2) * 128;  // the 4 corners of half a tile
  static constexpr int kCornerBytes = kAsync ? 2 * kSlotBytes : 0;
  static constexpr int kBTileBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  static constexpr int kStages =
      (kSmemBudget - kCornerBytes) / kStageBytes < 8 ? (kSmemBudget - kCornerBytes) / kStageBytes : 8;
  static constexpr int kTableBytes = 2 * kBM * static_cast<int>(sizeof(Sample));
  static constexpr int kEpilogueBytes = BN * (kBM + kStageRowPad) * 2;
  static_assert(kEpilogueBytes <= kStages * kStageBytes, "the epilogue reuses the stages");
  // 1024 bytes of slack for aligning the tiles, the tables, two mbarriers per stage.
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kCornerBytes + kTableBytes + 2 * kStages * 8;
};

template <typename T>
__device__ __forceinline__ typename Types<T>::T2 as_t2(uint32_t u) {
  typename Types<T>::T2 v;
  memcpy(&v, &u, 4);
  return v;
}
template <typename T>
__device__ __forceinline__ uint32_t as_u32(typename Types<T>::T2 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
template <typename T>
__device__ __forceinline__ uint32_t fma2(uint32_t w, uint32_t x, uint32_t acc) {
  return as_u32<T>(__hfma2(as_t2<T>(w), as_t2<T>(x), as_t2<T>(acc)));
}

// 16 bytes from global memory, 0 where !pred (nothing read). Volatile, so that the compiler
// issues every corner load of a group before the blends that use them, in program order (with
// __ldg it interleaved loads and blends, leaving few loads in flight).
__device__ __forceinline__ uint4 load_corner(const void* src, bool pred) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(src), "r"(static_cast<int>(pred))
      : "memory");
  return v;
}

template <typename T, int BN, int PW, int U>
__global__ void __launch_bounds__(Config<T, BN, PW, U>::kThreads, 1)
    deform_conv2d_sm90_implicit_gemm_kernel(const Params p) {
  using Cfg = Config<T, BN, PW, U>;
  constexpr int kProducerThreads = Cfg::kProducerThreads, kUnroll = Cfg::kUnroll;
  constexpr int S = Cfg::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = cute::cast_smem_ptr_to_uint(smem_raw);
  unsigned char* smem = smem_raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t base = cute::cast_smem_ptr_to_uint(smem);
  const uint32_t slots = base + S * Cfg::kStageBytes;  // kAsync: the corners of two half tiles
  Sample* table = reinterpret_cast<Sample*>(smem + S * Cfg::kStageBytes + Cfg::kCornerBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * Cfg::kStageBytes + Cfg::kCornerBytes + Cfg::kTableBytes);
  uint64_t* empty = full + S;
  const DeformConv2dGeometry& g = p.g;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kBM;
  const int n0 = blockIdx.y * BN;
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], kProducerThreads);
      cutlass::arch::ClusterBarrier::init(&empty[s], kConsumerThreads / 128);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (tid < kProducerThreads) {
    const T* x = static_cast<const T*>(p.x);
    const int64_t P = g.out_pixels(), taps = g.taps(), C = g.in_channels, plane = g.height * g.width;
    const T* wsw = static_cast<const T*>(p.wsw) + static_cast<int64_t>(blockIdx.y) * p.k_tiles * BN * kBK;
    // The row whose sampling points this thread computes (threads below kBM).
    const int64_t m = m0 + tid;
    const bool row_ok = tid < kBM && m < p.M;
    const int64_t b = row_ok ? m / P : 0, pix = row_ok ? m % P : 0;
    const int64_t oy = pix / g.out_w, ox = pix % g.out_w;
    const T* off = static_cast<const T*>(p.off) + b * g.offset_groups * taps * 2 * P + pix;
    const T* msk = p.msk ? static_cast<const T*>(p.msk) + b * g.offset_groups * taps * P + pix : nullptr;
    const T* img = x + b * plane * C;
    // The next table's offsets and mask, loaded one table ahead (their latency is the whole
    // table's blending, not a stall of every producer thread at the table's barrier).
    const auto load_point = [&](int64_t ok, float* dy, float* dx, float* mk) {
      *dy = row_ok ? static_cast<float>(off[2 * ok * P]) : 0.f;
      *dx = row_ok ? static_cast<float>(off[(2 * ok + 1) * P]) : 0.f;
      *mk = row_ok && msk ? static_cast<float>(msk[ok * P]) : 1.f;
    };
    float dy, dx, mk;
    load_point(0, &dy, &dx, &mk);
    // The rows and the 16-byte chunk this thread blends: rows tid / 8 + kRowsPerPass u, chunk tid % 8.
    const int vec = tid & 7, row0 = tid >> 3;
    int tb = 0;
    // The sampling points of k tile kt's (tap, offset group), into the table's other half.
    const auto make_table = [&](int kt) {
      const int tap = kt / p.c_blocks, og = kt % p.c_blocks / p.og_blocks;
      tb ^= 1;
      if (tid < kBM) {
        Sample e;
        e.img = img;
        e.pad = 0;
        const int64_t i = tap / g.kw, j = tap % g.kw;
        const float y = static_cast<float>(oy * g.stride_h - g.pad_h + i * g.dil_h) + dy;
        const float xx = static_cast<float>(ox * g.stride_w - g.pad_w + j * g.dil_w) + dx;
        const BilinearTap<float> t = bilinear_tap<float>(y, xx, g.height, g.width);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          e.idx[q] = row_ok ? static_cast<int32_t>(t.idx[q]) : -1;
          e.w[q] = row_ok ? as_u32<T>(Types<T>::splat(t.w[q] * mk)) : 0u;
        }
        table[tb * kBM + tid] = e;
        const bool last_og = og + 1 == g.offset_groups;
        const int64_t next_og = last_og ? 0 : og + 1, next_tap = last_og ? tap + 1 : tap;
        if (next_tap < taps) load_point(next_og * taps + next_tap, &dy, &dx, &mk);
      }
      asm volatile("bar.sync 1, %0;" ::"n"(kProducerThreads));
    };
    const auto new_table = [&](int kt) { return kt % p.c_blocks % p.og_blocks == 0; };
    const auto acquire = [&](int kt) {
      const int s = kt % S;
      cutlass::arch::ClusterBarrier::wait(&empty[s], ((kt / S) & 1) ^ 1);
      if (tid == 0) {
        cutlass::arch::ClusterTransactionBarrier::expect_transaction(&full[s], Cfg::kBTileBytes);
        cute::SM90_BULK_COPY_G2S::copy(
            wsw + static_cast<int64_t>(kt) * BN * kBK, &full[s], smem + s * Cfg::kStageBytes + kATileBytes,
            Cfg::kBTileBytes);
      }
    };
    if constexpr (Cfg::kAsync) {
      // Half h of k tile kt: rows h * 64 + row0 + 16 u, u < 4; its corners in slot h.
      const auto issue = [&](int kt, int h, uint32_t (&w)[4][4]) {
        const T* base_c = nullptr;
        const int64_t c0 = static_cast<int64_t>(kt % p.c_blocks) * kBK + vec * 8;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int r = row0 + 16 * u;
          const Sample& e = table[tb * kBM + h * 64 + r];
          const uint4 wv = *reinterpret_cast<const uint4*>(e.w);
          w[u][0] = wv.x;
          w[u][1] = wv.y;
          w[u][2] = wv.z;
          w[u][3] = wv.w;
          base_c = static_cast<const T*>(e.img) + c0;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int32_t idx = e.idx[q];
            const T* src = idx >= 0 ? base_c + static_cast<int64_t>(idx) * C : base_c;
            const uint32_t dst = slots + h * Cfg::kSlotBytes + q * (kBM / 2) * 128 + r * 128 + vec * 16;
            // src-size 0 (a corner outside the image): 16 zero bytes, nothing read.
            asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(idx >= 0 ? 16 : 0)
                         : "memory");
          }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
      };
      const auto blend = [&](int h, const uint32_t (&w)[4][4], uint32_t a_tile) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int r = row0 + 16 * u;
          uint32_t acc[4] = {0, 0, 0, 0};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            uint4 c;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w)
                         : "r"(slots + h * Cfg::kSlotBytes + q * (kBM / 2) * 128 + r * 128 + vec * 16)
                         : "memory");
            acc[0] = fma2<T>(w[u][q], c.x, acc[0]);
            acc[1] = fma2<T>(w[u][q], c.y, acc[1]);
            acc[2] = fma2<T>(w[u][q], c.z, acc[2]);
            acc[3] = fma2<T>(w[u][q], c.w, acc[3]);
          }
          const uint32_t dst = a_tile + swizzled(h * 64 + r, vec);
          asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(acc[0]), "r"(acc[1]), "r"(acc[2]),
                       "r"(acc[3])
                       : "memory");
        }
      };
      uint32_t w0[4][4], w1[4][4];
      make_table(0);
      issue(0, 0, w0);
      for (int kt = 0; kt < p.k_tiles; ++kt) {
        const int s = kt % S;
        const uint32_t a_tile = base + s * Cfg::kStageBytes;
        issue(kt, 1, w1);
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        acquire(kt);
        blend(0, w0, a_tile);
        if (kt + 1 < p.k_tiles) {
          if (new_table(kt + 1)) make_table(kt + 1);
          issue(kt + 1, 0, w0);
          asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
          asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        blend(1, w1, a_tile);
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::ClusterBarrier::arrive(&full[s]);
      }
      return;
    }
    for (int kt = 0; kt < p.k_tiles; ++kt) {
      const int s = kt % S, cb = kt % p.c_blocks;
      if (new_table(kt)) make_table(kt);
      acquire(kt);
      const uint32_t a_tile = base + s * Cfg::kStageBytes;
      const int64_t c0 = static_cast<int64_t>(cb) * kBK + vec * 8;
#pragma unroll 1
      for (int u0 = 0; u0 < Cfg::kPasses; u0 += kUnroll) {
        uint4 v[kUnroll][4];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const Sample& e = table[tb * kBM + row0 + Cfg::kRowsPerPass * (u0 + u)];
          const T* src = static_cast<const T*>(e.img) + c0;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int32_t idx = e.idx[q];
            v[u][q] = load_corner(src + static_cast<int64_t>(idx) * C, idx >= 0);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int row = row0 + Cfg::kRowsPerPass * (u0 + u);
          const uint4 w = *reinterpret_cast<const uint4*>(table[tb * kBM + row].w);
          const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
          uint32_t acc[4] = {0, 0, 0, 0};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            acc[0] = fma2<T>(ws[q], v[u][q].x, acc[0]);
            acc[1] = fma2<T>(ws[q], v[u][q].y, acc[1]);
            acc[2] = fma2<T>(ws[q], v[u][q].z, acc[2]);
            acc[3] = fma2<T>(ws[q], v[u][q].w, acc[3]);
          }
          const uint32_t dst = a_tile + swizzled(row, vec);
          asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(acc[0]), "r"(acc[1]), "r"(acc[2]),
                       "r"(acc[3])
                       : "memory");
        }
      }
      // The tile was written through the generic proxy; wgmma reads it through the async one.
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::ClusterBarrier::arrive(&full[s]);
    }
    return;
  }

  // Consumers.
  const int ct = tid - kProducerThreads, wg = ct >> 7;
  using Op = typename MmaOp<T, BN>::type;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  for (int kt = 0; kt < p.k_tiles; ++kt) {
    const int s = kt % S;
    cutlass::arch::ClusterBarrier::wait(&full[s], (kt / S) & 1);
    const uint32_t a_tile = base + s * Cfg::kStageBytes + wg * (kATileBytes / 2);
    const uint32_t b_tile = base + s * Cfg::kStageBytes + kATileBytes;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int k = 0; k < kBK / 16; ++k) {
      mma<Op>(smem_desc(a_tile + k * 32), smem_desc(b_tile + k * 32), acc, std::make_index_sequence<BN / 2>());
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    if (kt > 0 && (ct & 127) == 0) cutlass::arch::ClusterBarrier::arrive(&empty[(kt - 1) % S]);
  }
  cute::warpgroup_wait<0>();
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);

  // Epilogue: every stage has been read (the last wgmma waited on by both warpgroups), so the
  // stages hold the (BN, 128) tile, channels outermost.
  asm volatile("bar.sync 2, %0;" ::"n"(kConsumerThreads));
  T* stage = reinterpret_cast<T*>(smem);
  constexpr int ld = kBM + kStageRowPad;
  const T* bias = static_cast<const T*>(p.bias);
  const int warp = (ct >> 5) & 3, lane = ct & 31;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = j * 8 + (lane & 3) * 2 + e;
      const float bn = bias != nullptr && n0 + n < g.out_channels ? static_cast<float>(bias[n0 + n]) : 0.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wg * 64 + warp * 16 + (lane >> 2) + 8 * r;
        stage[n * ld + row] = static_cast<T>(acc[j * 4 + r * 2 + e] + bn);
      }
    }
  }
  asm volatile("bar.sync 2, %0;" ::"n"(kConsumerThreads));
  const int row = ct & (kBM - 1);
  const int64_t m = m0 + row;
  if (m >= p.M) return;
  const int64_t P = g.out_pixels(), b = m / P, pix = m % P;
  T* out = static_cast<T*>(p.out) + (b * g.out_channels + n0) * P + pix;
  const int n_end = g.out_channels - n0 < BN ? g.out_channels - n0 : BN;
  for (int n = ct >> 7; n < n_end; n += kConsumerThreads / kBM) out[n * P] = stage[n * ld + row];
}

// No warp specialization: two warpgroups of 64 rows each blend their own rows of the stage's A
// tile (4 * kU corner loads in flight per thread, with up to 255 registers: 256 threads), then
// issue its wgmma asynchronously and go on blending the next stage while the tensor cores run.
// A stage's B tile is brought one k tile ahead by a bulk copy once both warpgroups' wgmma on
// that stage's previous use have completed (empty, two arrivals).
template <typename T, int BN, int kU, int kS>
__global__ void __launch_bounds__(kConsumerThreads, 1) deform_conv2d_sm90_implicit_gemm_coop_kernel(const Params p) {
  using Cfg = Config<T, BN, 1, 4>;
  constexpr int S = kS;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = cute::cast_smem_ptr_to_uint(smem_raw);
  unsigned char* smem = smem_raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t base = cute::cast_smem_ptr_to_uint(smem);
  Sample* table = reinterpret_cast<Sample*>(smem + S * Cfg::kStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * Cfg::kStageBytes + Cfg::kTableBytes);
  uint64_t* empty = full + S;
  const DeformConv2dGeometry& g = p.g;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kBM;
  const int n0 = blockIdx.y * BN;
  const int tid = threadIdx.x, wg = tid >> 7, wt = tid & 127;
  const T* wsw = static_cast<const T*>(p.wsw) + static_cast<int64_t>(blockIdx.y) * p.k_tiles * BN * kBK;
  const auto copy_b = [&](int kt) {
    const int s = kt % S;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], Cfg::kBTileBytes);
    cute::SM90_BULK_COPY_G2S::copy(
        wsw + static_cast<int64_t>(kt) * BN * kBK, &full[s], smem + s * Cfg::kStageBytes + kATileBytes,
        Cfg::kBTileBytes);
  };
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 1);
      cutlass::arch::ClusterBarrier::init(&empty[s], 2);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (tid == 0) copy_b(0);

  const T* x = static_cast<const T*>(p.x);
  const int64_t P = g.out_pixels(), taps = g.taps(), C = g.in_channels, plane = g.height * g.width;
  const int64_t m = m0 + (tid & (kBM - 1));
  const bool row_ok = tid < kBM && m < p.M;
  const int64_t b = row_ok ? m / P : 0, pix = row_ok ? m % P : 0;
  const int64_t oy = pix / g.out_w, ox = pix % g.out_w;
  const T* off = static_cast<const T*>(p.off) + b * g.offset_groups * taps * 2 * P + pix;
  const T* msk = p.msk ? static_cast<const T*>(p.msk) + b * g.offset_groups * taps * P + pix : nullptr;
  const T* img = x + b * plane * C;
  const auto load_point = [&](int64_t ok, float* dy, float* dx, float* mk) {
    *dy = row_ok ? static_cast<float>(off[2 * ok * P]) : 0.f;
    *dx = row_ok ? static_cast<float>(off[(2 * ok + 1) * P]) : 0.f;
    *mk = row_ok && msk ? static_cast<float>(msk[ok * P]) : 1.f;
  };
  float dy, dx, mk;
  load_point(0, &dy, &dx, &mk);
  // This thread blends rows wg * 64 + wt / 8 + 16 u (u < 4) of each stage, chunk wt % 8.
  const int vec = wt & 7, row0 = wg * 64 + (wt >> 3);
  using Op = typename MmaOp<T, BN>::type;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  int tb = 0;
  for (int kt = 0; kt < p.k_tiles; ++kt) {
    const int s = kt % S, tap = kt / p.c_blocks, cb = kt % p.c_blocks;
    if (cb % p.og_blocks == 0) {
      const int og = cb / p.og_blocks;
      tb ^= 1;
      if (tid < kBM) {
        Sample e;
        e.img = img;
        e.pad = 0;
        const int64_t i = tap / g.kw, j = tap % g.kw;
        const float y = static_cast<float>(oy * g.stride_h - g.pad_h + i * g.dil_h) + dy;
        const float xx = static_cast<float>(ox * g.stride_w - g.pad_w + j * g.dil_w) + dx;
        const BilinearTap<float> t = bilinear_tap<float>(y, xx, g.height, g.width);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          e.idx[q] = row_ok ? static_cast<int32_t>(t.idx[q]) : -1;
          e.w[q] = row_ok ? as_u32<T>(Types<T>::splat(t.w[q] * mk)) : 0u;
        }
        table[tb * kBM + tid] = e;
        const bool last_og = og + 1 == g.offset_groups;
        const int64_t next_og = last_og ? 0 : og + 1, next_tap = last_og ? tap + 1 : tap;
        if (next_tap < taps) load_point(next_og * taps + next_tap, &dy, &dx, &mk);
      }
      asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads));
    }
    const uint32_t a_tile = base + s * Cfg::kStageBytes;
    const int64_t c0 = static_cast<int64_t>(cb) * kBK + vec * 8;
#pragma unroll
    for (int u0 = 0; u0 < 4; u0 += kU) {
      uint4 v[kU][4];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const Sample& e = table[tb * kBM + row0 + 16 * (u0 + u)];
        const T* src = static_cast<const T*>(e.img) + c0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int32_t idx = e.idx[q];
          v[u][q] = load_corner(src + static_cast<int64_t>(idx) * C, idx >= 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int row = row0 + 16 * (u0 + u);
        const uint4 w = *reinterpret_cast<const uint4*>(table[tb * kBM + row].w);
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
        uint32_t a[4] = {0, 0, 0, 0};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          a[0] = fma2<T>(ws[q], v[u][q].x, a[0]);
          a[1] = fma2<T>(ws[q], v[u][q].y, a[1]);
          a[2] = fma2<T>(ws[q], v[u][q].z, a[2]);
          a[3] = fma2<T>(ws[q], v[u][q].w, a[3]);
        }
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(a_tile + swizzled(row, vec)), "r"(a[0]),
                     "r"(a[1]), "r"(a[2]), "r"(a[3])
                     : "memory");
      }
    }
    // After the blend (which overlaps the previous wgmma): wgmma of k tile kt + 1 - S done (at
    // most S - 2 groups pending), so stage (kt + 1) % S is free for the next B tile, and in the
    // next iteration this warpgroup's rows of its stage.
    cute::warpgroup_wait<S - 2>();
    if (kt + 1 < p.k_tiles && kt + 1 >= S) {
      const int s1 = (kt + 1) % S;
      if (wt == 0) cutlass::arch::ClusterBarrier::arrive(&empty[s1]);
      if (tid == 0) {
        cutlass::arch::ClusterBarrier::wait(&empty[s1], ((kt + 1) / S - 1) & 1);
        copy_b(kt + 1);
      }
    } else if (kt + 1 < p.k_tiles && tid == 0) {
      copy_b(kt + 1);
    }
    cutlass::arch::fence_view_async_shared();
    asm volatile("bar.sync %0, 128;" ::"r"(2 + wg));
    cutlass::arch::ClusterBarrier::wait(&full[s], (kt / S) & 1);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
    const uint32_t a_wg = a_tile + wg * (kATileBytes / 2), b_tile = a_tile + kATileBytes;
#pragma unroll
    for (int k = 0; k < kBK / 16; ++k) {
      mma<Op>(smem_desc(a_wg + k * 32), smem_desc(b_tile + k * 32), acc, std::make_index_sequence<BN / 2>());
    }
    cute::warpgroup_commit_batch();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  }
  cute::warpgroup_wait<0>();
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads));
  T* stage = reinterpret_cast<T*>(smem);
  constexpr int ld = kBM + kStageRowPad;
  const T* bias = static_cast<const T*>(p.bias);
  const int warp = (tid >> 5) & 3, lane = tid & 31;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = j * 8 + (lane & 3) * 2 + e;
      const float bn = bias != nullptr && n0 + n < g.out_channels ? static_cast<float>(bias[n0 + n]) : 0.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wg * 64 + warp * 16 + (lane >> 2) + 8 * r;
        stage[n * ld + row] = static_cast<T>(acc[j * 4 + r * 2 + e] + bn);
      }
    }
  }
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads));
  const int row = tid & (kBM - 1);
  const int64_t mo = m0 + row;
  if (mo >= p.M) return;
  T* out = static_cast<T*>(p.out) + ((mo / P) * g.out_channels + n0) * P + mo % P;
  const int n_end = g.out_channels - n0 < BN ? g.out_channels - n0 : BN;
  for (int n = tid >> 7; n < n_end; n += kConsumerThreads / kBM) out[n * P] = stage[n * ld + row];
}

// wsw[nt][kt][n][swizzled c] = weight[nt * BN + n, c of tap kt, tap of kt] (0 past out_channels),
// for the bulk copies: a B tile is BN rows of 64 values, 16-byte chunk c of row n at c ^ (n % 8).
template <typename T, int BN>
__global__ void deform_conv2d_sm90_weight_kernel(
    const T* __restrict__ w, T* __restrict__ wsw, int64_t out_channels, int64_t in_channels, int64_t taps,
    int64_t k_tiles, int64_t total) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % 8, chunk = (i / 8) % 8, n_local = (i / 64) % BN, kt = (i / (64 * BN)) % k_tiles,
                  nt = i / (64 * BN * k_tiles);
    const int64_t c_in_tile = (chunk ^ (n_local & 7)) * 8 + e;  // the value stored at slot (chunk, e)
    const int64_t k = kt * kBK + c_in_tile, tap = k / in_channels, c = k % in_channels, n = nt * BN + n_local;
    wsw[i] = n < out_channels ? w[(n * in_channels + c) * taps + tap] : T(0);
  }
}

template <typename T, int BN, int PW, int U>
void launch(
    const DeformConv2dGeometry& g, const at::Tensor& xs, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& mask, at::Tensor& out) {
  using Cfg = Config<T, BN, PW <= 0 ? 1 : PW, PW <= 0 ? 4 : U>;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t taps = g.taps(), k_tiles = taps * g.in_channels / kBK, n_tiles = (g.out_channels + BN - 1) / BN;
  const at::Tensor w = weight.contiguous();
  at::Tensor wsw = at::empty({n_tiles * k_tiles * BN * kBK}, weight.options());
  const int64_t total = wsw.numel();
  deform_conv2d_sm90_weight_kernel<T, BN>
      <<<cuda::grid_for(total), cuda::block_size("deform_conv2d_sm90_weight_kernel"), 0, stream>>>(
          w.const_data_ptr<T>(), wsw.data_ptr<T>(), g.out_channels, g.in_channels, taps, k_tiles, total);
  CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_sm90_weight_kernel");

  const at::Tensor off = offset.contiguous();
  const at::Tensor msk = mask.has_value() ? mask->contiguous() : at::Tensor();
  const at::Tensor bs = bias.has_value() ? bias->contiguous() : at::Tensor();
  Params p;
  p.g = g;
  p.x = xs.const_data_ptr();
  p.off = off.const_data_ptr();
  p.msk = msk.defined() ? msk.const_data_ptr() : nullptr;
  p.wsw = wsw.const_data_ptr();
  p.bias = bs.defined() ? bs.const_data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.M = g.batch * g.out_pixels();
  p.k_tiles = static_cast<int>(k_tiles);
  p.c_blocks = static_cast<int>(g.in_channels / kBK);
  p.og_blocks = static_cast<int>(g.in_per_offset_group() / kBK);
  // PW = 0: the kernel without warp specialization (U corner rows at once).
  // PW < 0: that kernel with -PW stages, the rest of shared memory left to L1.
  constexpr int kS = PW < 0 ? -PW : Cfg::kStages;
  const auto kernel = PW <= 0 ? deform_conv2d_sm90_implicit_gemm_coop_kernel < T, BN, U == 0 ? 4 : U,
             kS >             : deform_conv2d_sm90_implicit_gemm_kernel < T, BN, PW <= 0 ? 1 : PW, U > ;
  const int smem_bytes = PW <= 0 ? 1024 + kS * Cfg::kStageBytes + Cfg::kTableBytes + 2 * kS * 8 : Cfg::kSmemBytes;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  if (PW < 0) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributePreferredSharedMemoryCarveout, (smem_bytes * 100 + 228 * 1024 - 1) / (228 * 1024)));
  }
  const int threads = cuda::block_size("deform_conv2d_sm90_implicit_gemm_kernel") == cuda::kThreads
                          ? (PW <= 0 ? kConsumerThreads : Cfg::kThreads)
                          : 4096;
  const dim3 grid(static_cast<unsigned>((p.M + kBM - 1) / kBM), static_cast<unsigned>(n_tiles));
  kernel<<<grid, threads, smem_bytes, stream>>>(p);
  CUSTOMOPS_CUDA_LAUNCH_CHECK("deform_conv2d_sm90_implicit_gemm_kernel");
}

}  // namespace

bool supported(const DeformConv2dGeometry& g, const at::Tensor& input) {
  const auto dtype = input.scalar_type();
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(input.get_device());
  return props->major == 9 && (dtype == at::kHalf || dtype == at::kBFloat16) && g.groups == 1 &&
         g.in_channels % kBK == 0 && g.in_per_offset_group() % kBK == 0 && g.height * g.width < (int64_t(1) << 31) &&
         g.batch * g.out_pixels() <= (int64_t(kBM) * std::numeric_limits<int32_t>::max()) &&
         (g.out_channels + 255) / 256 <= 65535 && g.taps() * g.in_channels / kBK <= std::numeric_limits<int32_t>::max();
}

static int block_channels(int64_t out_channels) {
  return out_channels <= 64 ? 64 : out_channels <= 128 ? 128 : 256;
}

void forward(
    const DeformConv2dGeometry& g, const at::Tensor& xs, const at::Tensor& offset, const at::Tensor& weight,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& mask, at::Tensor& out) {
  TORCH_CHECK(supported(g, xs), "customops: deform_conv2d's sm90 implicit GEMM cannot run these arguments");
  const int bn = block_channels(g.out_channels);
  AT_DISPATCH_SWITCH(xs.scalar_type(), "deform_conv2d_sm90", AT_DISPATCH_CASE(at::kHalf, [&] {
                       if (bn == 64) launch<scalar_t, 64, 1, 8>(g, xs, offset, weight, bias, mask, out);
                       else if (bn == 128) launch<scalar_t, 128, 1, 8>(g, xs, offset, weight, bias, mask, out);
                       else launch<scalar_t, 256, 1, 8>(g, xs, offset, weight, bias, mask, out);
                     }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
                       if (bn == 64) launch<scalar_t, 64, 1, 8>(g, xs, offset, weight, bias, mask, out);
                       else if (bn == 128) launch<scalar_t, 128, 1, 8>(g, xs, offset, weight, bias, mask, out);
                       else launch<scalar_t, 256, 1, 8>(g, xs, offset, weight, bias, mask, out);
                     }));
}

}  // namespace deform_conv2d_sm90
}  // namespace customops
