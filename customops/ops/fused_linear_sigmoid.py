"""customops::fused_linear_sigmoid and its backward.

Schema: csrc/registration.cpp; kernels: csrc/ops/fused_linear_sigmoid/.
"""

from typing import List, Optional

import torch
from torch import Tensor

from . import _checks


def fused_linear_sigmoid(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``sigmoid(x @ weight.T + bias)`` in one op: a linear layer followed by the logistic function.

    Follows :func:`torch.nn.functional.linear`'s conventions.

    Args:
        x: input of shape ``(*, in_features)``, at least 1-D, any strides.
        weight: ``(out_features, in_features)``, any strides.
        bias: ``(out_features,)`` or ``None``.
        All floating tensors of one dtype (float32, float16, bfloat16; float64 for gradcheck) on
        one device (CPU or CUDA). 16-bit inputs accumulate in float32.

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
    differentiable (double backward works).
    """
    return torch.ops.customops.fused_linear_sigmoid(x, weight, bias)


def _check_args(x, weight, bias):
    _checks.check_floating(x, "x")
    _checks.check_floating(weight, "weight")
    _checks.check_same_device(weight, "weight", x, "x")
    _checks.check_same_dtype(weight, "weight", x, "x")
    torch._check(
        x.dim() >= 1,
        lambda: "customops: expected x to have shape (*, in_features), but got a 0-dimensional tensor",
    )
    torch._check(
        weight.dim() == 2,
        lambda: "customops: expected weight to be 2-D (out_features, in_features), but got shape "
        f"{_checks._shape(weight)}",
    )
    torch._check(
        x.shape[-1] == weight.shape[1],
        lambda: f"customops: expected x.shape[-1] (in_features) to equal weight.shape[1] = {weight.shape[1]}, "
        f"but got x of shape {_checks._shape(x)}",
    )
    if bias is not None:
        _checks.check_floating(bias, "bias")
        _checks.check_same_device(bias, "bias", x, "x")
        _checks.check_same_dtype(bias, "bias", x, "x")
        torch._check(
            bias.dim() == 1 and bias.shape[0] == weight.shape[0],
            lambda: f"customops: expected bias to have shape (out_features,) = ({weight.shape[0]},), but got shape "
            f"{_checks._shape(bias)}",
        )


@torch.library.register_fake("customops::fused_linear_sigmoid")
def _fused_linear_sigmoid_fake(x, weight, bias=None):
    _check_args(x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("customops::fused_linear_sigmoid_backward")
def _fused_linear_sigmoid_backward_fake(grad_out, x, weight, y, output_mask):
    _check_args(x, weight, None)
    _checks.check_elementwise_pair(grad_out, "grad_out", y, "y")
    _checks.check_same_device(y, "y", x, "x")
    _checks.check_same_dtype(y, "y", x, "x")
    y_shape = (*x.shape[:-1], weight.shape[0])
    torch._check(
        tuple(y.shape) == y_shape,
        lambda: f"customops: expected y to have shape {list(y_shape)} (x.shape[:-1] + (out_features,)), "
        f"but got {_checks._shape(y)}",
    )
    grad_x = x.new_empty(x.shape) if output_mask[0] else x.new_empty(0)
    grad_weight = x.new_empty(weight.shape) if output_mask[1] else x.new_empty(0)
    grad_bias = x.new_empty(weight.shape[0]) if output_mask[2] else x.new_empty(0)
    return grad_x, grad_weight, grad_bias


def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight, output)
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    x, weight, y = ctx.saved_tensors
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    grad_x, grad_weight, grad_bias = torch.ops.customops.fused_linear_sigmoid_backward(grad, x, weight, y, mask)
    return (grad_x if mask[0] else None, grad_weight if mask[1] else None, grad_bias if mask[2] else None)


def _backward_setup_context(ctx, inputs, output):
    grad_out, x, weight, y, output_mask = inputs
    ctx.save_for_backward(grad_out, x, weight, y)
    ctx.output_mask = list(output_mask)


def _double_backward(ctx, gg_x, gg_weight, gg_bias):
    # The backward computes, with s = y (1 - y) and grad_z = grad_out * s:
    #   grad_x = grad_z @ W,  grad_W = grad_z.T @ x,  grad_b = grad_z.sum(0).
    # Its vector-Jacobian product, with gg_z the cotangent reaching grad_z:
    #   gg_z = gg_x @ W.T + x @ gg_W.T + gg_b,   d_W = grad_z.T @ gg_x,   d_x = grad_z @ gg_W,
    #   d_grad_out = gg_z * s,   d_y = gg_z * grad_out * (1 - 2y).
    grad_out, x, weight, y = ctx.saved_tensors
    mask: List[bool] = ctx.output_mask
    out_features, in_features = weight.shape
    x2 = x.reshape(-1, in_features)
    g2 = grad_out.reshape(-1, out_features)
    y2 = y.reshape(-1, out_features)
    s = y2 * (1 - y2)
    grad_z = g2 * s
    gg_z = torch.zeros_like(grad_z)
    d_x = d_weight = None
    if mask[0] and gg_x is not None:
        gg_x2 = gg_x.reshape(-1, in_features)
        gg_z = gg_z + gg_x2 @ weight.T
        d_weight = grad_z.T @ gg_x2
    if mask[1] and gg_weight is not None:
        gg_z = gg_z + x2 @ gg_weight.T
        d_x = (grad_z @ gg_weight).reshape(x.shape)
    if mask[2] and gg_bias is not None:
        gg_z = gg_z + gg_bias
    d_grad_out = (gg_z * s).reshape(grad_out.shape)
    d_y = (gg_z * g2 * (1 - 2 * y2)).reshape(y.shape)
    if d_x is None and ctx.needs_input_grad[1]:
        d_x = torch.zeros_like(x)
    if d_weight is None and ctx.needs_input_grad[2]:
        d_weight = torch.zeros_like(weight)
    return d_grad_out, d_x, d_weight, d_y, None


torch.library.register_autograd("customops::fused_linear_sigmoid", _backward, setup_context=_setup_context)
torch.library.register_autograd(
    "customops::fused_linear_sigmoid_backward", _double_backward, setup_context=_backward_setup_context
)
