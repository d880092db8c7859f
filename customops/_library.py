"""Finding and loading the compiled op library."""

import glob
import os

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def library_path() -> str:
    """Path of the compiled op library (``customops/_C*.so``).

    C++ LibTorch programs load or link this file to get ``customops::*`` ops; it
    has no libpython dependency.

    Raises:
        FileNotFoundError: the library was not built (``pip install --no-build-isolation -e .``).
    """
    candidates = sorted(
        p for pattern in ("_C*.so", "_C*.pyd", "_C*.dylib") for p in glob.glob(os.path.join(_PACKAGE_DIR, pattern))
    )
    if not candidates:
        raise FileNotFoundError(
            f"customops: the compiled op library (_C*.so) is missing from {_PACKAGE_DIR}; "
            "build it with `pip install --no-build-isolation -e .` against the torch you run with"
        )
    return candidates[0]


def load_library() -> str:
    """Loads the op library into this process once; later calls do nothing."""
    path = library_path()
    if path not in torch.ops.loaded_libraries:
        torch.ops.load_library(path)
    return path


def compiled_backends() -> list:
    """Dispatch keys the library has kernels for, e.g. ``["CPU", "CUDA"]``."""
    return [
        key
        for key in ("CPU", "CUDA")
        if torch._C._dispatch_has_kernel_for_dispatch_key("customops::fused_linear_sigmoid", key)
    ]
