"""customops::fused_linear_sigmoid and its backward.

Schema: csrc/registration.cpp; kernels (CPU, CUDA, autograd, autocast): csrc/ops/fused_linear_sigmoid/.
"""

from typing import Optional

import torch
from torch import Tensor

from ._fake import check_same_device, check_same_shape

__all__ = ["fused_linear_sigmoid"]


def fused_linear_sigmoid(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``sigmoid(x @ weight.T + bias)`` in one op: a linear layer followed by the logistic function.

    Follows :func:`torch.nn.functional.linear`'s conventions.

    Args:
        x: input of shape ``(*, in_features)``, at least 1-D, any strides.
        weight: ``(out_features, in_features)``, any strides.
        bias: ``(out_features,)`` or ``None``.
        All floating tensors of one dtype (float32, float16, bfloat16; float64 for gradcheck) on
        one device (CPU or CUDA). 16-bit inputs accumulate in float32. float32 on CUDA uses
        TF32 tensor cores only where torch allows it for matmuls
        (``torch.backends.cuda.matmul.fp32_precision = "tf32"``, ``allow_tf32`` or
        ``torch.set_float32_matmul_precision("high")``), as ``torch.mm`` does.

    Returns:
        A new contiguous tensor of shape ``(*, out_features)`` with ``x``'s dtype and device,
        values in [0, 1].

    Raises:
        RuntimeError: a non-floating dtype; mixed dtypes or devices; ``x`` 0-dimensional;
            ``weight`` not 2-D; ``x.shape[-1] != weight.shape[1]``; ``bias`` not of shape
            ``(out_features,)``. The message names the argument and what was expected.

    Autograd: with ``z = x @ W.T + b`` and ``y = sigmoid(z)``, the standard chain rule with
    sigmoid'(z) = y (1 - y) gives ``grad_z = grad * y * (1 - y)``, ``grad_x = grad_z @ W``,
    ``grad_W = grad_z.T @ x``, ``grad_b = grad_z.sum(rows)``. Only ``y`` is saved (no
    pre-activation); computed by ``customops::fused_linear_sigmoid_backward``, itself
    differentiable (double backward works). Registered in C++
    (csrc/ops/fused_linear_sigmoid/fused_linear_sigmoid_autograd.cpp), so C++ programs get
    gradients too. Forward-mode AD is not supported (it raises).

    Autocast: under ``torch.autocast`` it casts its floating inputs (not float64) to the
    autocast dtype, as ``F.linear`` does.
    """
    return torch.ops.customops.fused_linear_sigmoid(x, weight, bias)


def _check_shapes(x, weight, bias):
    torch._check(
        x.dim() >= 1, lambda: "customops: expected x to have shape (*, in_features), but got a 0-dimensional tensor"
    )
    torch._check(
        weight.dim() == 2,
        lambda: f"customops: expected weight to be 2-D (out_features, in_features), but got shape {list(weight.shape)}",
    )
    torch._check(
        x.shape[-1] == weight.shape[1],
        lambda: (
            f"customops: expected x.shape[-1] (in_features) to equal weight.shape[1] = {weight.shape[1]}, "
            f"but got x of shape {list(x.shape)}"
        ),
    )
    if bias is not None:
        torch._check(
            bias.dim() == 1 and bias.shape[0] == weight.shape[0],
            lambda: (
                f"customops: expected bias to have shape (out_features,) = ({weight.shape[0]},), "
                f"but got shape {list(bias.shape)}"
            ),
        )


@torch.library.register_fake("customops::fused_linear_sigmoid")
def _fused_linear_sigmoid_fake(x, weight, bias=None):
    check_same_device(weight, "weight", x, "x")
    if bias is not None:
        check_same_device(bias, "bias", x, "x")
    _check_shapes(x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("customops::fused_linear_sigmoid_backward")
def _fused_linear_sigmoid_backward_fake(grad_out, x, weight, y, output_mask):
    check_same_device(weight, "weight", x, "x")
    check_same_device(y, "y", grad_out, "grad_out")
    check_same_device(y, "y", x, "x")
    _check_shapes(x, weight, None)
    check_same_shape(y, "y", grad_out, "grad_out")
    y_shape = (*x.shape[:-1], weight.shape[0])
    torch._check(
        y.dim() == len(y_shape) and all(a == b for a, b in zip(y.shape, y_shape)),
        lambda: (
            f"customops: expected y to have shape {list(y_shape)} (x.shape[:-1] + (out_features,)), "
            f"but got {list(y.shape)}"
        ),
    )
    grad_x = x.new_empty(x.shape) if output_mask[0] else x.new_empty(0)
    grad_weight = x.new_empty(weight.shape) if output_mask[1] else x.new_empty(0)
    grad_bias = x.new_empty(weight.shape[0]) if output_mask[2] else x.new_empty(0)
    return grad_x, grad_weight, grad_bias
