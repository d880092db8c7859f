"""customops: PyTorch custom operators for deployment.

``import customops`` loads the compiled op library (``torch.ops.customops.*``, with its C++
autograd formulas), registers the fake kernels, and exposes the public wrappers below. It
raises ImportError when the library was built against another torch, or when another copy of
it is already loaded. See the README for the table of ops.
"""

import logging

import torch  # noqa: F401  (the op library needs libtorch loaded first)


class _NoCudaRuntimeNotice(logging.Filter):
    # torch.utils.cpp_extension logs this on import with a CUDA torch on a machine without a
    # GPU; torch.compile and AOTInductor, which customops' export and tests run, import it.
    def filter(self, record):
        return not str(record.msg).startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_NoCudaRuntimeNotice())

from . import nn  # noqa: E402
from ._library import build_info, cmake_prefix_path, compiled_backends, library_path, load_library, server_path  # noqa: E402
from ._version import __version__  # noqa: E402
from .ops import *  # noqa: E402,F401,F403  (every op's public wrapper: customops/ops/<op>.py's __all__)
from .ops import __all__ as _op_names  # noqa: E402

__all__ = [
    "__version__",
    "build_info",
    "cmake_prefix_path",
    "compiled_backends",
    "library_path",
    "load_library",
    "nn",
    "server_path",
]
__all__ += _op_names
