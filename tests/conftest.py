import pytest
import torch

import customops  # noqa: F401  (loads the op library)

HAS_CUDA = torch.cuda.is_available()

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# Per-dtype tolerances against a float64 reference (16-bit: one rounding of the output plus
# float32 accumulation; float32: reordered sums).
TOL = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def pytest_report_header(config):
    gpu = torch.cuda.get_device_name(0) if HAS_CUDA else "none"
    return (
        f"torch {torch.__version__} (CUDA build: {torch.version.cuda}), GPU: {gpu}, "
        f"customops kernels: {customops.compiled_backends()}"
    )


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_close_ref(out, ref, dtype):
    torch.testing.assert_close(out.double(), ref.double(), **TOL[dtype])
