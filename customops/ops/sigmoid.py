"""customops::sigmoid and customops::sigmoid_backward.

Schema: csrc/registration.cpp; kernels (CPU, CUDA, autograd): csrc/ops/sigmoid/.
"""

import torch
from torch import Tensor

from ._fake import check_same_device, check_same_shape

__all__ = ["sigmoid", "sigmoid_backward"]


def sigmoid(x: Tensor) -> Tensor:
    """The logistic function ``1 / (1 + exp(-x))``, elementwise.

    Args:
        x: tensor of any shape (any strides, numel 0 included), float32, float16, bfloat16 or
            float64, on CPU or CUDA.

    Returns:
        A new contiguous tensor of ``x``'s shape, dtype and device. 16-bit inputs are computed
        in float32. Saturates to exactly 0 and 1 for large ``|x|`` (no NaN).

    Raises:
        RuntimeError: ``x`` has a non-floating dtype.

    Autograd: ``grad_x = grad * y * (1 - y)`` from the saved output ``y`` (the standard identity
    sigmoid'(x) = sigmoid(x) (1 - sigmoid(x))), computed by ``customops::sigmoid_backward``;
    twice differentiable.
    """
    return torch.ops.customops.sigmoid(x)


def sigmoid_backward(grad_out: Tensor, y: Tensor) -> Tensor:
    """``grad_out * y * (1 - y)``: the gradient of sigmoid through its output ``y``.

    ``grad_out`` and ``y`` have one shape, dtype and device (floating dtypes as for
    :func:`sigmoid`); returns a new contiguous tensor. Raises RuntimeError otherwise.
    """
    return torch.ops.customops.sigmoid_backward(grad_out, y)


@torch.library.register_fake("customops::sigmoid")
def _sigmoid_fake(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("customops::sigmoid_backward")
def _sigmoid_backward_fake(grad_out, y):
    check_same_device(y, "y", grad_out, "grad_out")
    check_same_shape(y, "y", grad_out, "grad_out")
    return torch.empty_like(y, memory_format=torch.contiguous_format)
