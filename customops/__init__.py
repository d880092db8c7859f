"""customops: PyTorch custom operators for deployment.

``import customops`` loads the compiled op library (``torch.ops.customops.*``), registers the
fake kernels and autograd formulas, and exposes the public wrappers below. See the README for
the table of ops.
"""

import torch  # noqa: F401  (the op library needs libtorch loaded first)

from . import nn  # noqa: E402
from ._library import compiled_backends, library_path, load_library  # noqa: E402
from .ops import add, fused_linear_sigmoid, sigmoid, sigmoid_backward, sigmoid_focal_loss  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "add",
    "compiled_backends",
    "fused_linear_sigmoid",
    "library_path",
    "load_library",
    "nn",
    "sigmoid",
    "sigmoid_backward",
    "sigmoid_focal_loss",
]
