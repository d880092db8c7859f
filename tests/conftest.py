import pytest
import torch

import customops  # noqa: F401  (loads the op library)
from customops.testing import DEFAULT_TOL

HAS_CUDA = torch.cuda.is_available()

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# Per-dtype tolerances against a float64 reference (customops/testing/spec.py says why).
TOL = DEFAULT_TOL
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


@pytest.fixture(scope="session")
def serve():
    """The C++ server customops_serve that the package ships (built with the op library)."""
    return customops.server_path()


@pytest.fixture(scope="session")
def three_op_model_pt2(tmp_path_factory):
    """(model, path): tests/test_export.py's ThreeOpModel as an AOTInductor package with a
    dynamic batch. Compiling one takes about a minute on a small CPU: test_export and
    test_cpp_serving share it."""
    from customops.export import export_aoti
    from test_export import ThreeOpModel

    torch.manual_seed(0)
    model = ThreeOpModel().eval()
    return model, export_aoti(model, torch.randn(8, 12), str(tmp_path_factory.mktemp("aoti") / "three_op_model.pt2"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_close_ref(out, ref, dtype):
    torch.testing.assert_close(out.double(), ref.double(), **TOL[dtype])
