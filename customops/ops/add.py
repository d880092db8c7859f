"""customops::add: the template for adding an op (docs/adding_an_op.md).

Everything an op needs on the Python side sits in its module: the public wrapper with its
docstring and the fake kernel (shapes for torch.compile / torch.export). The schema is in
csrc/registration.cpp; the kernels, including the autograd kernel (add_autograd.cpp), in
csrc/ops/add/.
"""

import torch
from torch import Tensor

from ._fake import check_same_device, check_same_shape

__all__ = ["add"]


def add(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise sum ``a + b``.

    Args:
        a: tensor of any shape (any strides, numel 0 included), float32, float16, bfloat16 or
            float64, on CPU or CUDA.
        b: tensor of the same shape, dtype and device as ``a`` (no broadcasting).

    Returns:
        A new contiguous tensor of ``a``'s shape, dtype and device. 16-bit inputs are added in
        float32 and rounded once.

    Raises:
        RuntimeError: a non-floating dtype, or ``b``'s dtype, device or shape differ from ``a``'s;
            the message names the argument and what was expected.
    """
    return torch.ops.customops.add(a, b)


@torch.library.register_fake("customops::add")
def _add_fake(a, b):
    check_same_device(b, "b", a, "a")
    check_same_shape(b, "b", a, "a")
    return torch.empty_like(a, memory_format=torch.contiguous_format)
