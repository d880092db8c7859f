// Calls customops' C++ API (customops/ops.h) and checks the result against ATen's
// sigmoid(linear(x, W, b)). Exits 0 when they agree.
#include <customops/ops.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  const auto x = torch::randn({4, 8});
  const auto w = torch::randn({3, 8});
  const auto b = torch::randn({3});
  const auto y = customops::fused_linear_sigmoid(x, w, b);
  const auto ref = torch::sigmoid(torch::linear(x, w, b));
  const bool ok = torch::allclose(y, ref, 1e-5, 1e-6);
  std::printf("customops::fused_linear_sigmoid from C++: %s\n", ok ? "matches ATen" : "MISMATCH");
  return ok ? 0 : 1;
}
