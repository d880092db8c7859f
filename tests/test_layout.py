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
    path = os.path.join(ROOT, *parts)
    assert os.path.isfile(path), f"{os.path.join(*parts)} is missing"
    with open(path) as f:
        return f.read()


def _code(*parts):
    """The file without its comments (C++ // and /* */, Python # lines): names in comments do
    not count."""
    text = _read(*parts)
    if parts[-1].endswith(".py"):
        return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def _modules():
    """{op name: the module named by the set_python_module before its schema}."""
    owner, found = None, {}
    source = _code("csrc", "registration.cpp")
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
    fake = _code("customops", "ops", f"{module}.py")
    assert re.search(rf'register_fake\(\s*"customops::{spec.name}"', fake), (
        f"customops/ops/{module}.py has no fake kernel"
    )
    for suffix in ("cpu.cpp", "cuda.cu", "autograd.cpp"):
        kernels = _code("csrc", "ops", module, f"{module}_{suffix}")
        assert re.search(rf'm\.impl\(\s*"{spec.name}"', kernels), (
            f"csrc/ops/{module}/{module}_{suffix} does not register {spec.name}"
        )
    header = _code("customops", "include", "customops", "ops.h")
    assert re.search(rf"\b{spec.name}\(", header), f"customops/include/customops/ops.h has no {spec.name}()"


def test_no_kernel_folder_without_an_op():
    ops = os.path.join(ROOT, "csrc", "ops")
    folders = {d for d in os.listdir(ops) if os.path.isdir(os.path.join(ops, d)) and d != "common"}
    assert folders <= set(_modules().values()), (
        f"csrc/ops folders that own no schema: {folders - set(_modules().values())}"
    )


# Kernels whose failed launch the specs' cuda_launch path cannot reach on every GPU, and where
# their launch errors are tested instead.
LAUNCHES_TESTED_ELSEWHERE = {
    "fused_linear_sigmoid_small_m_kernel": "tests/test_cuda_kernels.py (sm_90 only)",
    "deform_conv2d_depthwise_kernel": "tests/test_deform_conv2d.py (the tiled kernel's fallback, forced)",
    "deform_conv2d_direct_kernel": "tests/test_deform_conv2d.py (forced; by default on larger grouped layers)",
    "deform_conv2d_split_k_gemm_kernel": "tests/test_deform_conv2d.py (forced; by default on wide grouped layers)",
    "deform_conv2d_split_k_sum_kernel": "tests/test_deform_conv2d.py (forced; by default on wide grouped layers)",
}


def test_every_cuda_kernel_is_in_a_spec():
    # The names the launch checks report (CUSTOMOPS_CUDA_LAUNCH_CHECK, launch_elementwise).
    launched = set()
    for folder, _, names in os.walk(os.path.join(ROOT, "csrc", "ops")):
        for name in names:
            if name.endswith((".cu", ".cuh")):
                rel = os.path.relpath(os.path.join(folder, name), ROOT).split(os.sep)
                launched |= set(re.findall(r'"([a-z][a-z0-9_]*_kernel)"', _code(*rel)))
    in_specs = {k for s in OP_SPECS for k in s.cuda_kernels}
    assert launched - in_specs - set(LAUNCHES_TESTED_ELSEWHERE) == set(), "add these kernels to their op's cuda_kernels"
    assert in_specs <= launched, f"specs name kernels that no launch check reports: {in_specs - launched}"
