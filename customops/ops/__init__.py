"""The ops' Python side: public wrappers and fake kernels, one module per op (the autograd
formulas are C++ kernels next to the others, csrc/ops/<op>/<op>_autograd.cpp).

Importing this package loads the op library first; csrc/registration.cpp names this module
(set_python_module) so torch imports it whenever it needs an op's fake kernel.
"""

from .._library import load_library

load_library()

from .add import add  # noqa: E402
from .fused_linear_sigmoid import fused_linear_sigmoid  # noqa: E402
from .sigmoid import sigmoid, sigmoid_backward  # noqa: E402
from .sigmoid_focal_loss import sigmoid_focal_loss  # noqa: E402

__all__ = ["add", "fused_linear_sigmoid", "sigmoid", "sigmoid_backward", "sigmoid_focal_loss"]
