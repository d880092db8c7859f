// Every customops schema, in one place. Kernels live in csrc/ops/<op>/ and
// register themselves per dispatch key with TORCH_LIBRARY_IMPL; fake kernels
// and autograd formulas are registered from Python (customops/ops/<op>.py).
//
// Schemas carry no mutation or alias annotations: every op returns fresh
// tensors, so torch.compile never needs to functionalize them.
#include <torch/library.h>

TORCH_LIBRARY(customops, m) {
  // set_python_module names the Python module holding the fake kernel and
  // autograd formula of the ops defined after it; torch imports that module
  // itself when it needs them (e.g. for a graph loaded from disk).

  // Elementwise: the registry's smallest worked examples (see docs/adding_an_op.md).
  m.set_python_module("customops.ops.add");
  m.def("add(Tensor a, Tensor b) -> Tensor");

  m.set_python_module("customops.ops.sigmoid");
  m.def("sigmoid(Tensor x) -> Tensor");
  // d/dx of sigmoid from its output y: grad_out * y * (1 - y).
  m.def("sigmoid_backward(Tensor grad_out, Tensor y) -> Tensor");

  m.set_python_module("customops.ops.fused_linear_sigmoid");
  // y = sigmoid(x @ weight.T + bias), torch.nn.functional.linear's conventions.
  m.def("fused_linear_sigmoid(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  // Gradients from the saved output y (no pre-activation is kept). An output
  // whose output_mask entry is false is returned as an empty tensor.
  m.def(
      "fused_linear_sigmoid_backward(Tensor grad_out, Tensor x, Tensor weight, "
      "Tensor y, bool[3] output_mask) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");

  m.set_python_module("customops.ops.sigmoid_focal_loss");
  // Lin et al.'s focal loss with torchvision.ops.sigmoid_focal_loss's semantics; inputs
  // and targets of one shape; reduction "none" (inputs' shape) or "mean"/"sum" (0-dim).
  m.def(
      "sigmoid_focal_loss(Tensor inputs, Tensor targets, float alpha=0.25, float gamma=2.0, "
      "str reduction=\"none\") -> Tensor");
  // Gradients recomputed from inputs and targets (nothing else is saved); grad_out has
  // inputs' shape for "none" and is 0-dim for "mean"/"sum". An output whose output_mask
  // entry is false is returned as an empty tensor.
  m.def(
      "sigmoid_focal_loss_backward(Tensor grad_out, Tensor inputs, Tensor targets, float alpha, "
      "float gamma, str reduction, bool[2] output_mask) -> (Tensor grad_inputs, Tensor grad_targets)");
}
