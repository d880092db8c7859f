"""The compiled op library: where it is, what it holds, what it links."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

import customops
from customops.testing import OP_SPECS


def test_library_path_exists():
    path = customops.library_path()
    assert os.path.isfile(path) and os.path.basename(path) == "libcustomops.so"


@pytest.mark.skipif(shutil.which("ldd") is None or shutil.which("nm") is None, reason="needs ldd and nm (binutils)")
def test_library_has_no_libpython_dependency():
    path = customops.library_path()
    needed = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in needed
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", path], capture_output=True, text=True, check=True
    ).stdout
    python_symbols = [line for line in undefined.splitlines() if line.split()[-1].startswith(("Py", "_Py"))]
    assert python_symbols == []
    assert "libtorch" in needed or "libc10" in needed  # ldd did read it


def test_kernels_for_every_backend_this_torch_has():
    backends = customops.compiled_backends()
    assert "CPU" in backends
    # CI sets CUSTOMOPS_EXPECT_CUDA_KERNELS=1 with a CUDA torch: the CUDA kernels must have compiled.
    if os.environ.get("CUSTOMOPS_EXPECT_CUDA_KERNELS") == "1" or torch.cuda.is_available():
        assert "CUDA" in backends
    if torch.version.cuda is None:  # a CPU-only torch builds the CPU kernels alone
        assert backends == ["CPU"]
    for op in [spec.name for spec in OP_SPECS]:
        for key in backends:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"customops::{op}", key), (op, key)


def test_import_without_torch_first_and_load_twice():
    code = (
        "import customops, torch\n"
        "p = customops.load_library(); customops.load_library(); torch.ops.load_library(p)\n"
        "x = torch.randn(3, 4)\n"
        "assert torch.allclose(torch.ops.customops.sigmoid(x), x.sigmoid())\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_cpp_api_defines_a_function_per_op():
    # customops/include/customops/ops.h declares them; a declaration without a definition in
    # csrc/api.cpp would link until a C++ program called it.
    path = customops.library_path()
    defined = subprocess.run(["nm", "-DC", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    names = {line.split(" T ", 1)[1].split("(")[0] for line in defined.splitlines() if " T customops::" in line}
    missing = [s.name for s in OP_SPECS if f"customops::{s.name}" not in names]
    assert not missing, f"the C++ API (csrc/api.cpp) defines no function for {missing}"
