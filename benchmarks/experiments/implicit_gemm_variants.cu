#include "../../csrc/ops/deform_conv2d/sm90/implicit_gemm.cu"
#include <torch/library.h>
namespace customops::deform_conv2d_sm90 {
at::Tensor igx_run(
    const at::Tensor& xs, const at::Tensor& off, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& mask, std::vector<int64_t> stride, std::vector<int64_t> pad,
    std::vector<int64_t> dil, int64_t variant) {
  const DeformConv2dGeometry g = check_deform_conv2d_args(xs, off, w, bias, stride, pad, dil, mask);
  at::Tensor out =
      at::empty({g.batch, g.out_channels, g.out_h, g.out_w}, xs.options().memory_format(at::MemoryFormat::Contiguous));
  using T = c10::Half;
  switch (variant) {
    case 0: launch<T, 256, 1, 4>(g, xs, off, w, bias, mask, out); break;
    case 1: launch<T, 256, 1, 8>(g, xs, off, w, bias, mask, out); break;
    case 2: launch<T, 128, 2, 4>(g, xs, off, w, bias, mask, out); break;
    case 3: launch<T, 128, 1, 8>(g, xs, off, w, bias, mask, out); break;
    case 4: launch<T, 128, 2, 2>(g, xs, off, w, bias, mask, out); break;
    case 5: launch<T, 256, 1, 0>(g, xs, off, w, bias, mask, out); break;
    case 6: launch<T, 128, 1, 0>(g, xs, off, w, bias, mask, out); break;
    case 7: launch<T, 64, 1, 0>(g, xs, off, w, bias, mask, out); break;
    case 8: launch<T, 256, 0, 4>(g, xs, off, w, bias, mask, out); break;
    case 9: launch<T, 256, 0, 2>(g, xs, off, w, bias, mask, out); break;
    case 10: launch<T, 128, 0, 4>(g, xs, off, w, bias, mask, out); break;
    case 11: launch<T, 256, -2, 4>(g, xs, off, w, bias, mask, out); break;
    case 12: launch<T, 256, -3, 4>(g, xs, off, w, bias, mask, out); break;
    case 13: launch<T, 128, -2, 4>(g, xs, off, w, bias, mask, out); break;
    case 14: launch<T, 128, -3, 4>(g, xs, off, w, bias, mask, out); break;
  }
  return out;
}
}  // namespace customops::deform_conv2d_sm90
TORCH_LIBRARY(igx, m) {
  m.def("run", &customops::deform_conv2d_sm90::igx_run);
}
