// Does sm_90 have packed (two-lane) MUFU instructions? Compile and disassemble (no GPU needed):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -o /tmp/packed_mufu.cubin scripts/diag/packed_mufu.cu
//   cuobjdump --dump-sass /tmp/packed_mufu.cubin | grep MUFU
// With nvcc 13.0 each packed PTX instruction below becomes two scalar MUFU ops (MUFU.TANH.BF16,
// MUFU.EX2.F16, ...), so a packed sigmoid saves no MUFU work (benchmarks/NOTES.md, "Seventh session").
#include <cstdint>
__global__ void k(uint32_t* p) {
  uint32_t a = p[threadIdx.x], b, c, d, e;
  asm("tanh.approx.bf16x2 %0, %1;" : "=r"(b) : "r"(a));
  asm("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(c) : "r"(a));
  asm("ex2.approx.f16x2 %0, %1;" : "=r"(d) : "r"(a));
  asm("tanh.approx.f16x2 %0, %1;" : "=r"(e) : "r"(a));
  p[threadIdx.x] = b ^ c ^ d ^ e;
}
