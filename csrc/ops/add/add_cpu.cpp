// add, CPU kernel. The template for a new op: check the arguments with the
// shared checks, make inputs contiguous, allocate a fresh contiguous output,
// dispatch on dtype, register for one dispatch key at the bottom.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "../common/checks.h"
#include "../common/cpu_utils.h"
#include "../common/library.h"

namespace customops {
namespace {

at::Tensor add_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_elementwise_pair(a, "a", b, "b");
  const at::Tensor a_c = a.contiguous();
  const at::Tensor b_c = b.contiguous();
  // Fresh contiguous output, never a view of an input.
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "customops::add", [&] {
    cpu::parallel_elementwise<scalar_t, 2>(
        out.data_ptr<scalar_t>(), {a_c.const_data_ptr<scalar_t>(), b_c.const_data_ptr<scalar_t>()}, out.numel(),
        [](auto x, auto y) { return x + y; });
  });
  return out;
}

}  // namespace

CUSTOMOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("add", &add_cpu);
}

}  // namespace customops
