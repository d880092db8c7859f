"""Every op sits where docs/adding_an_op.md puts it, so that its schema, kernels, wrapper, fake
kernel, spec and C++ API are found in one place each: the schema in csrc/registration.cpp after
set_python_module("customops.ops.<module>"); the CPU, CUDA and autograd kernels in
csrc/ops/<module>/<module>_{cpu.cpp,cuda.cu,autograd.cpp}; the fake kernel in
customops/ops/<module>.py; a function in the C++ API (customops/include/customops/ops.h). The
spec is checked by test_conformance (test_every_op_has_a_spec). Reads the source tree."""

import os
import re

import pytest

from customops.testing import OP_SPECS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(ROOT, "csrc", "registration.cpp")),
    reason="reads the source tree (csrc/), which an installed wheel's tests do not have",
)


def _read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def _modules():
    """{op name: the module named by the set_python_module before its schema}."""
    owner, found = None, {}
    source = _read("csrc", "registration.cpp")
    for match in re.finditer(r'set_python_module\("customops\.ops\.(\w+)"\)|m\.def\(\s*"(\w+)\(', source):
        if match.group(1):
            owner = match.group(1)
        else:
            found[match.group(2)] = owner
    return found


@pytest.mark.parametrize("spec", OP_SPECS, ids=lambda s: s.name)
def test_op_sits_in_its_modules_folder(spec):
    module = _modules().get(spec.name)
    assert module, f'no schema m.def("{spec.name}(...") after a set_python_module in csrc/registration.cpp'
    fake = _read("customops", "ops", f"{module}.py")
    assert f'register_fake("customops::{spec.name}")' in fake, f"customops/ops/{module}.py has no fake kernel"
    for suffix in ("cpu.cpp", "cuda.cu", "autograd.cpp"):
        kernels = _read("csrc", "ops", module, f"{module}_{suffix}")
        assert f'm.impl("{spec.name}"' in kernels, f"csrc/ops/{module}/{module}_{suffix} does not register {spec.name}"
    header = _read("customops", "include", "customops", "ops.h")
    assert re.search(rf"\b{spec.name}\(", header), f"customops/include/customops/ops.h has no {spec.name}()"


def test_no_kernel_folder_without_an_op():
    folders = {d for d in os.listdir(os.path.join(ROOT, "csrc", "ops")) if d != "common"}
    assert folders <= set(_modules().values()), (
        f"csrc/ops folders that own no schema: {folders - set(_modules().values())}"
    )
