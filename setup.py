"""Builds customops' op library and C++ server with torch.utils.cpp_extension.

Outputs, inside the package (a wheel carries them; an editable install writes them in place):
  customops/lib/libcustomops.so    the op library (SONAME libcustomops.so, no libpython)
  customops/lib/build_info.json    what went into it: torch version, CUDA architectures, ...
  customops/bin/customops_serve    the C++ server (cpp/customops_serve.cpp)
Committed beside them: customops/include/ (the C++ API) and customops/share/cmake/ (the CMake
package), so a wheel is a complete C++ SDK.

With a CUDA build of torch and a CUDA toolkit (CUDA_HOME, or nvcc on PATH), both the CPU and
the CUDA kernels are compiled; with a CPU-only torch, the CPU kernels alone. Objects persist
in build/<torch version>-<cpu|cuda>/, so a rebuild recompiles only what changed (ninja).

Environment:
  CUSTOMOPS_WITH_CUDA=0|1   force the CUDA kernels off or on (default: auto).
  TORCH_CUDA_ARCH_LIST      CUDA architectures (default: those the installed torch was built
                            for, torch.cuda.get_arch_list(), the newest also as PTX); "9.0" is
                            built as "9.0a", the Hopper target that wgmma and TMA need.
  CUSTOMOPS_CUTLASS_DIR     CUTLASS checkout (include/ and tools/util/include/); default: the
                            headers of the nvidia-cutlass pip package. Without CUTLASS, or
                            without 9.0 among the architectures, the Hopper GEMM kernels
                            (csrc/ops/*/sm90/) are left out.
  MAX_JOBS                  parallel compile jobs (ninja).
"""

import glob
import json
import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup

# One CUDA toolkit for every build of a tree, whoever starts it (setup.sh, pip, setup.py):
# compile commands name it, and ninja recompiles everything when a command changes.
if not os.environ.get("CUDA_HOME") and not os.environ.get("CUDA_PATH"):
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
    elif shutil.which("nvcc"):
        os.environ["CUDA_HOME"] = os.path.dirname(os.path.dirname(os.path.realpath(shutil.which("nvcc"))))

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    sys.exit(
        "customops: the build needs the torch it will run with, and none is importable here. Build "
        "without isolation, against your installed torch:\n"
        "    pip install --no-build-isolation .     (or: pip wheel --no-build-isolation .)\n"
        "(an isolated build would compile against a second, downloaded torch)."
    )

ROOT = os.path.dirname(os.path.abspath(__file__))
# Always the same ninja (the pip package's when installed, else PATH's): ninja versions hash
# commands differently, so switching between two recompiles everything.
try:
    import ninja

    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
except ImportError:
    pass
with open(os.path.join(ROOT, "customops", "_version.py")) as _f:
    VERSION = _f.read().split('"')[1]
# The library is tied to this exact torch build (its C++ ABI): the wheel says so.
TORCH_VERSION = torch.__version__.split("+")[0]


def _want_cuda() -> bool:
    forced = os.environ.get("CUSTOMOPS_WITH_CUDA")
    if forced is not None:
        return forced == "1"
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


WITH_CUDA = _want_cuda()
BUILD_DIR = os.path.join(ROOT, "build", f"torch{torch.__version__}-{'cuda' if WITH_CUDA else 'cpu'}")


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
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        archs = archs.replace(";", " ").split()
    else:
        # What the installed torch runs on (for the CUDA 13 wheels, Turing through Blackwell),
        # the newest also as PTX so that later GPUs JIT-compile it.
        archs = ["%s.%s" % (a[3:-1], a[-1]) for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
        archs = archs or ["9.0"]
        archs[-1] += "+PTX"
    # sm_90a cubins run on every compute capability 9.0 GPU and admit wgmma/TMA.
    return [a.replace("9.0", "9.0a") if a.split("+")[0] == "9.0" else a for a in archs]


def _nvidia_lib_dirs() -> list:
    """pip's CUDA libraries (cudart, cuBLAS, ...) relative to site-packages, as torch's own
    libraries find them."""
    try:
        import nvidia
    except ImportError:
        return []
    site = os.path.dirname(os.path.dirname(torch.__file__))
    return sorted(
        os.path.relpath(d, site) for base in nvidia.__path__ for d in glob.glob(os.path.join(base, "*", "lib"))
    )


def _write_if_changed(path: str, text: str) -> None:
    # An unchanged file keeps its mtime, so ninja does not recompile what includes it.
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _up_to_date(output: str, stamp: str, key: str) -> bool:
    """Whether ``output`` was made from ``key`` (a command plus its inputs' mtimes), as recorded
    in ``stamp`` by the last build that made it."""
    if not (os.path.exists(output) and os.path.exists(stamp)):
        return False
    with open(stamp) as f:
        return f.read() == key


def _extension():
    cpu_sources = ["csrc/registration.cpp", "csrc/api.cpp"] + sorted(
        glob.glob("csrc/ops/*/*_cpu.cpp")
        + glob.glob("csrc/ops/*/*_autograd.cpp")
        + glob.glob("csrc/ops/*/*_autocast.cpp")
    )
    cuda_sources = sorted(glob.glob("csrc/ops/*/*_cuda.cu"))
    cxx_flags = ["-O3", "-fdiagnostics-color=always"]
    # ATen's parallel_for is an inline template that runs its range on one thread unless the
    # caller is compiled with OpenMP: the CPU kernels' parallel loops need -fopenmp. The library
    # then needs libgomp.so.1, which resolves to the copy torch loaded (or ships in torch/lib,
    # first on the library's RUNPATH): one OpenMP thread pool, torch's.
    openmp = ["-fopenmp"] if sys.platform.startswith("linux") else []
    cxx_flags += openmp
    include_dirs = [os.path.join(ROOT, "customops", "include"), os.path.join(BUILD_DIR, "generated")]
    info = {
        "customops": VERSION,
        "torch": torch.__version__,
        "cuda_kernels": WITH_CUDA,
        "cuda_archs": [],
        "cutlass_sm90_kernels": False,
    }
    # py_limited_api keeps torch_python (and so libpython) off the link line.
    kwargs = dict(
        name="customops.lib.libcustomops", py_limited_api=True, extra_link_args=["-Wl,-soname,libcustomops.so"] + openmp
    )
    if not WITH_CUDA:
        info["summary"] = "customops: building the CPU kernels only"
        ext = cpp_extension.CppExtension(
            sources=cpu_sources, include_dirs=include_dirs, extra_compile_args={"cxx": cxx_flags}, **kwargs
        )
    else:
        archs = _cuda_arch_list()
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
        nvcc_flags = ["-O3", "-DCUSTOMOPS_WITH_CUDA", "--expt-relaxed-constexpr"]
        include_dirs += _cuda_library_includes()
        cutlass = _cutlass_includes()
        with_sm90 = bool(cutlass) and any(a.startswith("9.0a") for a in archs)
        if with_sm90:
            cuda_sources += sorted(glob.glob("csrc/ops/*/sm90/*.cu"))
            include_dirs += cutlass
            nvcc_flags += ["-DCUSTOMOPS_WITH_CUTLASS", "--expt-extended-lambda", "-DNDEBUG"]
        info["summary"] = (
            f"customops: building CPU and CUDA kernels for TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}; "
            + (
                "CUTLASS sm90a GEMM kernels included"
                if with_sm90
                else "no CUTLASS sm90a kernels ("
                + ("pip install nvidia-cutlass" if not cutlass else "no 9.0 in the arch list")
                + ")"
            )
        )
        info.update(cuda_archs=archs, cutlass_sm90_kernels=with_sm90)
        ext = cpp_extension.CUDAExtension(
            sources=cpu_sources + cuda_sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx_flags + ["-DCUSTOMOPS_WITH_CUDA"], "nvcc": nvcc_flags},
            **kwargs,
        )
    # The library reports its own build (torch.ops.customops._build_info), so a report never
    # mixes one install's library with another's metadata.
    summary = info.pop("summary")
    _write_if_changed(
        os.path.join(BUILD_DIR, "generated", "customops_build_info.h"),
        '#pragma once\n#define CUSTOMOPS_BUILD_INFO_JSON R"json(' + json.dumps(info, sort_keys=True) + ')json"\n'
        '#define CUSTOMOPS_CUDA_ARCH_LIST "' + " ".join(info["cuda_archs"]) + '"\n',
    )
    return ext, info, summary


EXTENSION, BUILD_INFO, SUMMARY = _extension()


class BuildExt(cpp_extension.BuildExtension):
    """torch's BuildExtension with a persistent build folder, an rpath to torch's libraries
    next to the package, the build's metadata beside the library, and the C++ server."""

    def finalize_options(self):
        super().finalize_options()
        # setuptools' editable install builds in a fresh temporary folder: keep the objects.
        self.build_temp = BUILD_DIR

    def build_extensions(self):
        print(SUMMARY, file=sys.stderr, flush=True)
        if not self.use_ninja:
            print(
                "customops: ninja not found, compiling one file at a time (about twice as slow): pip install ninja",
                file=sys.stderr,
            )
        site = os.path.dirname(os.path.dirname(torch.__file__))
        libs = ["torch/lib"] + _nvidia_lib_dirs()  # relative to site-packages
        rpath = [f"$ORIGIN/../../{d}" for d in libs]
        if self.in_source:  # a library in the source tree finds torch where it was built
            rpath += [os.path.join(site, d) for d in libs]
        for ext in self.extensions:
            ext.extra_link_args = list(ext.extra_link_args) + ["-Wl,-rpath," + ":".join(rpath), "-ldl"]
        super().build_extensions()

    def build_extension(self, ext):
        # The CUTLASS kernels are Hopper-only (sm_90a): compile them for that architecture
        # alone, the other CUDA files for every architecture of the list.
        compile_all = self.compiler.compile

        def compile_split(sources, *args, **kwargs):
            sm90 = [s for s in sources if os.sep + "sm90" + os.sep in s]
            objects = compile_all([s for s in sources if s not in sm90], *args, **kwargs)
            if sm90:
                archs = os.environ["TORCH_CUDA_ARCH_LIST"]
                os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
                try:
                    objects += compile_all(sm90, *args, **kwargs)
                finally:
                    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
            return objects

        # setuptools relinks on every build (an editable build links into a fresh temporary
        # folder): reuse the last link when its objects and arguments are unchanged.
        link = self.compiler.link_shared_object

        def link_cached(objects, output, *args, **kwargs):
            key = repr((sorted(objects), [os.path.getmtime(o) for o in sorted(objects)], args, sorted(kwargs.items())))
            cached, stamp = (
                os.path.join(BUILD_DIR, f"link-{self.mode}.so"),
                os.path.join(BUILD_DIR, f"link-{self.mode}.key"),
            )
            if _up_to_date(cached, stamp, key):
                os.makedirs(os.path.dirname(output), exist_ok=True)
                shutil.copy2(cached, output)
                return
            link(objects, output, *args, **kwargs)
            shutil.copy2(output, cached)
            _write_if_changed(stamp, key)

        self.compiler.compile = compile_split
        self.compiler.link_shared_object = link_cached
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_all
            self.compiler.link_shared_object = link

    def run(self):
        self.in_source = self.inplace or self.editable_mode  # setuptools clears inplace while it builds
        self.mode = "source" if self.in_source else "wheel"  # each keeps its own cached outputs
        if self.in_source:
            os.makedirs(os.path.join(ROOT, "customops", "lib"), exist_ok=True)
        super().run()
        library = self.get_ext_fullpath(EXTENSION.name)
        if self.in_source:
            library = self._get_inplace_equivalent(self.get_finalized_command("build_py"), EXTENSION)[0]
        lib_dir = os.path.dirname(library)
        info = dict(BUILD_INFO)
        if self.in_source:  # where the CMake package finds torch, which is not beside a checkout
            info["torch_cmake_dir"] = os.path.normpath(
                os.path.join(cpp_extension.TORCH_LIB_PATH, "..", "share", "cmake", "Torch")
            )
        _write_if_changed(os.path.join(lib_dir, "build_info.json"), json.dumps(info, indent=1) + "\n")
        self._build_server(library, os.path.join(os.path.dirname(lib_dir), "bin", "customops_serve"))

    def _build_server(self, library: str, binary: str) -> None:
        cuda = BUILD_INFO["cuda_kernels"]
        torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        rpath = ["$ORIGIN/../lib", "$ORIGIN/../../torch/lib"] + ([torch_lib] if self.in_source else [])
        source = os.path.join(ROOT, "cpp", "customops_serve.cpp")
        cmd = [
            os.environ.get("CXX", "c++"),
            "-O2",
            "-std=c++20",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            source,
            "-o",
            binary,
            "-I" + os.path.join(ROOT, "customops", "include"),
        ]
        cmd += ["-I" + d for d in cpp_extension.include_paths()]
        # --no-as-needed: the server calls few of the library's symbols directly, and its op
        # registrations must load with it.
        cmd += [
            "-L" + os.path.dirname(library),
            "-L" + torch_lib,
            "-Wl,--no-as-needed",
            "-lcustomops",
            "-ltorch",
            "-ltorch_cpu",
            "-lc10",
        ] + (["-ltorch_cuda", "-lc10_cuda"] if cuda else [])
        cmd += ["-Wl,--as-needed", "-Wl,-rpath," + ":".join(rpath)]
        # Recompiled only when its source or the command changes.
        stamp = os.path.join(BUILD_DIR, f"customops_serve-{self.mode}.key")
        key = repr((cmd, os.path.getmtime(source)))
        if _up_to_date(binary, stamp, key):
            return
        os.makedirs(os.path.dirname(binary), exist_ok=True)
        print("customops: compiling the C++ server customops_serve (about a minute)", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
        _write_if_changed(stamp, key)


setup(
    version=VERSION,
    # The header and CMake folders are data packages (no Python in them), listed so that
    # setuptools ships them without warning.
    packages=find_packages(include=["customops", "customops.*"])
    + ["customops.include.customops", "customops.share.cmake.customops"],
    # lib/ and bin/ are written by BuildExt (into build/ for a wheel, in place when editable).
    package_data={"customops.include.customops": ["*.h"], "customops.share.cmake.customops": ["*.cmake"]},
    ext_modules=[EXTENSION],
    cmdclass={"build_ext": BuildExt.with_options(no_python_abi_suffix=True)},
    install_requires=[f"torch=={TORCH_VERSION}", "numpy"],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
