"""Finding, checking and loading the compiled op library, and the C++ side of the package."""

import json
import os
import warnings
from typing import Optional, Sequence, Tuple

import torch

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REBUILD = (
    "Rebuild customops against the torch you run: `pip install --no-build-isolation --force-reinstall "
    "--no-deps <customops source or sdist>` (from a checkout: `bash scripts/setup.sh`)"
)


def library_path() -> str:
    """Path of the compiled op library, ``customops/lib/libcustomops.so``.

    C++ LibTorch programs link this file (CMake: ``find_package(customops)``, see
    :func:`cmake_prefix_path`) or load it to get ``customops::*`` ops; it has no libpython
    dependency. Linking this file, not a copy, keeps one library per process.

    Raises:
        FileNotFoundError: the library was not built (``pip install --no-build-isolation -e .``).
    """
    path = os.path.join(_PACKAGE_DIR, "lib", "libcustomops.so")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"customops: the compiled op library is missing ({path}); build it with "
            "`pip install --no-build-isolation -e .` against the torch you run with"
        )
    return path


def cmake_prefix_path() -> str:
    """The folder to put on ``CMAKE_PREFIX_PATH`` for ``find_package(customops 0.1 REQUIRED)``,
    as ``torch.utils.cmake_prefix_path`` is for torch. The package finds the torch installed
    beside customops itself."""
    return os.path.join(_PACKAGE_DIR, "share", "cmake")


def server_path() -> str:
    """Path of the C++ server ``customops_serve`` that the package ships (README,
    "Deployment"). Raises FileNotFoundError when this build has none."""
    path = os.path.join(_PACKAGE_DIR, "bin", "customops_serve")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"customops: the C++ server is missing ({path}); rebuild customops")
    return path


def _recorded_build_info() -> dict:
    path = os.path.join(os.path.dirname(library_path()), "build_info.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _loaded_build_info() -> Optional[dict]:
    """The build info of the customops library loaded in this process, or None."""
    try:
        return json.loads(torch.ops.customops._build_info())
    except (AttributeError, RuntimeError):
        return None


def build_info() -> dict:
    """What the loaded op library was built with, as it reports itself: ``customops`` and
    ``torch`` versions, ``cuda_kernels``, ``cuda_archs`` (e.g. ``["7.5", ..., "9.0a", "12.0+PTX"]``),
    ``cutlass_sm90_kernels``, and the ``library`` file it was loaded from."""
    load_library()
    return _loaded_build_info()


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def load_library() -> str:
    """Loads the op library into this process once; later calls do nothing. Returns its path.

    Raises:
        ImportError: the library was built against another torch than the one running, or
            cannot be loaded, or another copy of it (another path) was loaded first: the
            message names both files, or both torch versions, and how to fix it.
    """
    path = library_path()
    loaded = _loaded_build_info()
    if loaded is None:
        built = _recorded_build_info().get("torch")
        if built is not None and built != torch.__version__:
            raise ImportError(
                f"customops: this build of customops ({path}) was compiled against torch {built}, but "
                f"torch {torch.__version__} is installed; the op library only works with the torch it was "
                f"built against. {_REBUILD}, or install torch=={built}."
            )
        try:
            torch.ops.load_library(path)
        except OSError as e:
            raise ImportError(f"customops: cannot load the op library {path}: {e}. {_REBUILD}.") from e
        loaded = _loaded_build_info()
        torch.cuda._lazy_call(_check_cuda_archs)  # when CUDA initializes, not at import
    owner = loaded.get("library", "") if loaded else ""
    if not _same_file(owner, path):
        raise ImportError(
            f"customops: another copy of the op library, {owner or '(unknown)'}, is already loaded in this "
            f"process, so this package's {path} cannot be. Load one copy per process: link C++ programs "
            "against customops.library_path() (CMake: find_package(customops)) instead of a copy."
        )
    return path


def compiled_backends() -> list:
    """Dispatch keys the library has kernels for, e.g. ``["CPU", "CUDA"]``."""
    load_library()
    return [
        key
        for key in ("CPU", "CUDA")
        if torch._C._dispatch_has_kernel_for_dispatch_key("customops::fused_linear_sigmoid", key)
    ]


def arch_runs(capability: Tuple[int, int], archs: Sequence[str]) -> bool:
    """Whether a GPU of ``capability`` (major, minor) runs code built for ``archs``
    (TORCH_CUDA_ARCH_LIST entries): a cubin runs on its major version at the same or a higher
    minor, an arch-specific one (``9.0a``) on its own version only, PTX (``+PTX``) on any
    later GPU."""
    for arch in archs:
        base, _, ptx = arch.partition("+")
        specific = base[-1].isalpha()
        version = tuple(int(v) for v in base.rstrip("abcdefghijklmnopqrstuvwxyz").split("."))
        if version == tuple(capability) or (
            not specific and version[0] == capability[0] and version[1] <= capability[1]
        ):
            return True
        if ptx and not specific and version <= tuple(capability):
            return True
    return False


def missing_arch_message(capability: Tuple[int, int], name: str, archs: Sequence[str]) -> Optional[str]:
    """The warning for a GPU that this build has no code for, or None when it has."""
    if arch_runs(capability, archs):
        return None
    wanted = "%d.%d" % tuple(capability)
    return (
        f"customops: this build has no CUDA code for {name} "
        f"(compute capability {wanted}, sm_{wanted.replace('.', '')}); "
        f"it was built for {' '.join(archs)}, so its CUDA kernels fail on it with 'no kernel image is available'. "
        f'Rebuild for it: TORCH_CUDA_ARCH_LIST="{wanted}" pip install --no-build-isolation --force-reinstall '
        "--no-deps <customops source> (or leave TORCH_CUDA_ARCH_LIST unset for every architecture your torch supports)."
    )


_warned_archs = set()


def _check_cuda_archs() -> None:
    info = _loaded_build_info() or {}
    if not info.get("cuda_kernels"):
        return
    for i in range(torch.cuda.device_count()):
        capability = torch.cuda.get_device_capability(i)
        message = missing_arch_message(capability, torch.cuda.get_device_name(i), info.get("cuda_archs", []))
        if message and capability not in _warned_archs:
            _warned_archs.add(capability)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
