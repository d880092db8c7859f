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


@pytest.fixture(scope="session")
def one_channel_conv_pt2(tmp_path_factory):
    """(model, path): a network of one input channel (a grayscale image: in channels_last its
    (N, 1, H, W) batch counts as contiguous, with another stride at its size-1 dim) as an
    AOTInductor package with dynamic batch, height and width."""
    from customops.export import export_aoti

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), customops.nn.ModulatedDeformConv2d(4, 2, 3)
    ).eval()
    path = str(tmp_path_factory.mktemp("aoti") / "one_channel.pt2")
    return model, export_aoti(model, torch.randn(2, 1, 12, 10), path, dynamic_dims=(0, 2, 3))


def grayscale_batches():
    """(N, 1, H, W) batches whose size-1 dims have strides other than row-major ones."""
    return (
        torch.randn(2, 12, 10, 1).permute(0, 3, 1, 2),  # NHWC as NCHW, as from a numpy batch
        torch.randn(3, 1, 9, 11).to(memory_format=torch.channels_last),
        torch.randn(1, 1, 12, 13).as_strided((1, 1, 12, 13), (7, 5, 13, 1)),
    )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_close_ref(out, ref, dtype):
    torch.testing.assert_close(out.double(), ref.double(), **TOL[dtype])
