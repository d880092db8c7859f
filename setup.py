"""Builds customops' op library (customops/_C.abi3.so) with torch.utils.cpp_extension.

With a CUDA build of torch and a CUDA toolkit (CUDA_HOME, or nvcc on PATH), both the CPU
and the CUDA kernels are compiled; with a CPU-only torch, the CPU kernels alone.

Environment:
  CUSTOMOPS_WITH_CUDA=0|1   force the CUDA kernels off or on (default: auto).
  TORCH_CUDA_ARCH_LIST      CUDA architectures (default: the visible GPUs', else "9.0"); "9.0"
                            is built as "9.0a", the Hopper target that wgmma and TMA need.
  CUSTOMOPS_CUTLASS_DIR     CUTLASS checkout (include/ and tools/util/include/); default: the
                            headers of the nvidia-cutlass pip package. Without CUTLASS the
                            Hopper GEMM kernels (csrc/ops/*/sm90/) are left out.
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


def _cutlass_includes() -> list:
    # A build dependency only (never vendored): the nvidia-cutlass package ships the headers.
    root = os.environ.get("CUSTOMOPS_CUTLASS_DIR")
    if root is None:
        import importlib.util

        spec = importlib.util.find_spec("cutlass_library")  # located, not imported: it needs none of its deps here
        if spec is None or not spec.submodule_search_locations:
            return []
        root = os.path.join(list(spec.submodule_search_locations)[0], "source")
    dirs = [os.path.join(root, "include"), os.path.join(root, "tools", "util", "include")]
    return dirs if os.path.isfile(os.path.join(dirs[0], "cutlass", "cutlass.h")) else []


def _cuda_arch_list() -> list:
    import torch

    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        archs = archs.replace(";", " ").split()
    elif torch.cuda.is_available():
        archs = sorted({"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    else:
        archs = ["9.0"]
    # sm_90a cubins run on every compute capability 9.0 GPU and admit wgmma/TMA.
    return ["9.0a" if a == "9.0" else a for a in archs]


def _write_build_info(with_cuda: bool, archs=None, cutlass=False) -> None:
    # What went into the library, for `python -m customops.doctor` (not tracked by git).
    import json

    import torch

    info = {
        "built_against_torch": torch.__version__,
        "cuda_kernels": with_cuda,
        "cuda_arch_list": " ".join(archs) if with_cuda else None,
        "cutlass_sm90_kernels": cutlass,
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
    archs = _cuda_arch_list()
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    nvcc_flags = ["-O3", "-DCUSTOMOPS_WITH_CUDA", "--expt-relaxed-constexpr"]
    include_dirs = _cuda_library_includes()
    cutlass = _cutlass_includes()
    with_sm90 = bool(cutlass) and "9.0a" in archs
    if with_sm90:
        cuda_sources += sorted(glob.glob("csrc/ops/*/sm90/*.cu"))
        include_dirs += cutlass
        nvcc_flags += ["-DCUSTOMOPS_WITH_CUTLASS", "--expt-extended-lambda", "-DNDEBUG"]
    print(
        f"customops: building CPU and CUDA kernels for TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}; "
        + ("CUTLASS sm90a GEMM kernels included" if with_sm90 else
           "no CUTLASS sm90a kernels (" + ("pip install nvidia-cutlass" if not cutlass else "no 9.0 in the arch list") + ")"),
        file=sys.stderr,
    )
    _write_build_info(True, archs, with_sm90)
    kwargs["extra_compile_args"]["nvcc"] = nvcc_flags
    kwargs["extra_compile_args"]["cxx"] = cxx_flags + ["-DCUSTOMOPS_WITH_CUDA"]
    return cpp_extension.CUDAExtension(sources=cpu_sources + cuda_sources, include_dirs=include_dirs, **kwargs)


setup(
    packages=find_packages(include=["customops", "customops.*"]),
    package_data={"customops": ["_build_info.json"]},
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
