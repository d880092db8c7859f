"""Builds customops' op library (customops/_C.abi3.so) with torch.utils.cpp_extension.

With a CUDA build of torch and a CUDA toolkit (CUDA_HOME, or nvcc on PATH), both the CPU
and the CUDA kernels are compiled; with a CPU-only torch, the CPU kernels alone.

Environment:
  CUSTOMOPS_WITH_CUDA=0|1   force the CUDA kernels off or on (default: auto).
  TORCH_CUDA_ARCH_LIST      CUDA architectures (default: the visible GPUs', else "9.0").
  MAX_JOBS                  parallel compile jobs (ninja).

The library holds only TORCH_LIBRARY registrations: it is loaded with torch.ops.load_library
(never imported as a Python module), so it has no libpython dependency and C++ LibTorch
programs can load it too.
"""

import glob
import os
import sys

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _want_cuda() -> bool:
    import torch

    forced = os.environ.get("CUSTOMOPS_WITH_CUDA")
    if forced is not None:
        return forced == "1"
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _cuda_library_includes() -> list:
    # pip's CUDA torch keeps cuBLAS/cuSPARSE headers (needed by ATen's CUDA headers)
    # in site-packages/nvidia/cu13/include rather than in the toolkit.
    try:
        import nvidia
    except ImportError:
        return []
    dirs = []
    for base in nvidia.__path__:
        dirs += [d for d in glob.glob(os.path.join(base, "cu*", "include")) if os.path.isdir(d)]
        dirs += [d for d in glob.glob(os.path.join(base, "cublas", "include")) if os.path.isdir(d)]
    return sorted(set(dirs))


def _write_build_info(with_cuda: bool) -> None:
    # What went into the library, for `python -m customops.doctor` (not tracked by git).
    import json

    import torch

    info = {
        "built_against_torch": torch.__version__,
        "cuda_kernels": with_cuda,
        "cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST", "(the visible GPUs')") if with_cuda else None,
    }
    with open(os.path.join(ROOT, "customops", "_build_info.json"), "w") as f:
        json.dump(info, f, indent=1)


def _extension():
    with_cuda = _want_cuda()
    # Autograd and autocast kernels are device-independent C++ and build with the CPU kernels.
    cpu_sources = ["csrc/registration.cpp"] + sorted(
        glob.glob("csrc/ops/*/*_cpu.cpp") + glob.glob("csrc/ops/*/*_autograd.cpp") + glob.glob("csrc/ops/*/*_autocast.cpp")
    )
    cuda_sources = sorted(glob.glob("csrc/ops/*/*_cuda.cu"))
    cxx_flags = ["-O3", "-fdiagnostics-color=always"]
    # py_limited_api keeps torch_python (and so libpython) off the link line.
    kwargs = dict(
        name="customops._C",
        extra_compile_args={"cxx": cxx_flags},
        py_limited_api=True,
    )
    if not with_cuda:
        _write_build_info(False)
        print("customops: building the CPU kernels only", file=sys.stderr)
        return cpp_extension.CppExtension(sources=cpu_sources, **kwargs)
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        import torch

        if not torch.cuda.is_available():
            os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    print(
        f"customops: building CPU and CUDA kernels for TORCH_CUDA_ARCH_LIST="
        f"{os.environ.get('TORCH_CUDA_ARCH_LIST', '(visible GPUs)')}",
        file=sys.stderr,
    )
    _write_build_info(True)
    kwargs["extra_compile_args"]["nvcc"] = ["-O3", "-DCUSTOMOPS_WITH_CUDA", "--expt-relaxed-constexpr"]
    kwargs["extra_compile_args"]["cxx"] = cxx_flags + ["-DCUSTOMOPS_WITH_CUDA"]
    return cpp_extension.CUDAExtension(
        sources=cpu_sources + cuda_sources, include_dirs=_cuda_library_includes(), **kwargs
    )


setup(
    packages=find_packages(include=["customops", "customops.*"]),
    package_data={"customops": ["_build_info.json"]},
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
