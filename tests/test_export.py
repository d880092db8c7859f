"""Deployment from Python: TorchScript, AOTInductor and ONNX exports with a dynamic batch
dimension (and other dynamic dims), loaded back (ONNX in a stock onnxruntime) and compared with
eager; failed exports leave no files; AOTInductor inputs are checked against the package's
record of them."""

import importlib.util
import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import customops
import customops.export
from customops.export import (
    export_aoti,
    export_model,
    export_onnx,
    export_torchscript,
    load_aoti,
    load_torchscript,
)
from customops.export.aoti import aoti_python_loading_works
from customops.nn import FusedLinearSigmoid

# The main job's model factory, named by file as a user's would be.
DIGITS = (
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train_digits.py")
    + ":make_model"
)

TESTS = os.path.dirname(os.path.abspath(__file__))


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_aoti_python_loading = pytest.mark.skipif(
    not aoti_python_loading_works(),
    reason=f"torch {torch.__version__}'s aoti_load_package is known to crash (seen on torch 2.11); "
    "packages are checked through the C++ loader there",
)


class ThreeOpModel(nn.Module):
    """A small model of three ops as a user would ship it: the export API's subject here (each
    op on every export path: the specs' paths in test_conformance)."""

    def __init__(self):
        super().__init__()
        self.hidden = FusedLinearSigmoid(12, 16)
        self.hidden2 = FusedLinearSigmoid(16, 16, bias=False)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        h = self.hidden(x)
        h = customops.add(self.hidden2(h), customops.sigmoid(h))
        return self.out(h)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return ThreeOpModel().eval()


BATCHES = (1, 37)


def test_torchscript_roundtrip(model, tmp_path):
    path = export_torchscript(model, None, str(tmp_path / "m.pt"))
    loaded = load_torchscript(path)
    for b in BATCHES:
        x = torch.randn(b, 12)
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


@needs_aoti_python_loading
def test_aoti_package_dynamic_batch(three_op_model_pt2, monkeypatch):
    model, path = three_op_model_pt2
    monkeypatch.delenv("AOTI_RUNTIME_CHECK_INPUTS", raising=False)
    runner = load_aoti(path)
    # The loader checks inputs itself, not through AOTInductor's process-wide switch.
    assert "AOTI_RUNTIME_CHECK_INPUTS" not in os.environ
    assert runner.package.get_metadata()[customops.export.INPUTS_METADATA_KEY] == "float32:1-65535,12"
    for b in BATCHES:
        x = torch.randn(b, 12)
        torch.testing.assert_close(runner(x), model(x))
    # Any strides, as TorchScript takes them: transposed, sliced, expanded (stride 0).
    for x in (torch.randn(12, 5).t(), torch.randn(10, 12)[::2], torch.randn(1, 12).expand(5, 12)):
        assert not x.is_contiguous()
        torch.testing.assert_close(runner(x), model(x))
    # Wrong rank, feature count, dtype, input count: refused (not read out of bounds), naming
    # the input, its shape and dtype, and what the package takes.
    expects = r"it expects dtype float32 and shape \[1-65535, 12\]"
    with pytest.raises(RuntimeError, match=r"refused input 0 of shape \[12\] and dtype float32: " + expects):
        runner(torch.randn(12))
    with pytest.raises(RuntimeError, match=r"refused input 0 of shape \[4, 13\] and dtype float32: " + expects):
        runner(torch.randn(4, 13))
    with pytest.raises(RuntimeError, match=r"refused input 0 of shape \[4, 12\] and dtype float64: " + expects):
        runner(torch.randn(4, 12, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="takes 1 tensor inputs, got 2"):
        runner(torch.randn(4, 12), torch.randn(4, 12))


@needs_aoti_python_loading
def test_aoti_package_reads_size_1_dims_of_any_stride(one_channel_conv_pt2):
    # torch calls these batches contiguous; the compiled code read their channel stride (0.99 off).
    from conftest import grayscale_batches

    model, path = one_channel_conv_pt2
    runner = load_aoti(path)
    for x in grayscale_batches():
        assert x.is_contiguous() and x.stride() != torch.empty(x.shape).stride()
        torch.testing.assert_close(runner(x), model(x), rtol=1e-5, atol=1e-5)


class Tiny(nn.Module):
    def forward(self, x):
        return customops.sigmoid(x)


@pytest.fixture(scope="module")
def torch_made_pt2(tmp_path_factory):
    """A package made with torch's own API (no customops metadata), batch exported as 1..1024."""
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(Tiny(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    path = str(tmp_path_factory.mktemp("torch_made") / "tiny.pt2")
    return torch._inductor.aoti_compile_and_package(program, package_path=path)


@needs_aoti_python_loading
def test_aoti_package_made_by_torch_runs_batch_1(torch_made_pt2, monkeypatch):
    # AOTInductor's own input checks (AOTI_RUNTIME_CHECK_INPUTS=1) refuse batch 1 here: export
    # records the batch's lower bound as 2. load_aoti must not turn them on.
    monkeypatch.delenv("AOTI_RUNTIME_CHECK_INPUTS", raising=False)
    runner = load_aoti(torch_made_pt2)
    for b in (1, 5):
        x = torch.randn(b, 3)
        torch.testing.assert_close(runner(x), torch.sigmoid(x))
    assert "customops_inputs" not in runner.package.get_metadata()  # so run as given, unchecked


class SequenceModel(nn.Module):
    """(batch, time, 6) -> (batch, time, 5): dims 0 and 1 can be dynamic, dim 2 cannot."""

    def __init__(self):
        super().__init__()
        self.proj = FusedLinearSigmoid(6, 5)

    def forward(self, x):
        return customops.sigmoid(self.proj(x))


def make_sequence_model():
    torch.manual_seed(0)
    return SequenceModel().eval()


SEQUENCE_SHAPES = ((1, 1, 6), (2, 7, 6), (5, 40, 6))


@pytest.fixture(scope="module")
def sequence_exports(tmp_path_factory):
    """(model, {format: path}): SequenceModel exported with dynamic dims 0 and 1 from an example
    of time 1 (exported at 2)."""
    model = make_sequence_model()
    formats = ["pt", "pt2"] + (["onnx"] if _has("onnxscript") else [])
    out = tmp_path_factory.mktemp("sequence")
    return model, export_model(model, torch.randn(3, 1, 6), str(out), formats=formats, dynamic_dims=(0, 1))


def test_dynamic_time_dim_torchscript(sequence_exports):
    model, paths = sequence_exports
    loaded = load_torchscript(paths["pt"])
    for shape in SEQUENCE_SHAPES:
        x = torch.randn(shape)
        torch.testing.assert_close(loaded(x), model(x))


@needs_aoti_python_loading
def test_dynamic_time_dim_aoti(sequence_exports):
    model, paths = sequence_exports
    runner = load_aoti(paths["pt2"])
    assert runner.package.get_metadata()[customops.export.INPUTS_METADATA_KEY] == "float32:1-65535,1-65536,6"
    for shape in SEQUENCE_SHAPES:
        x = torch.randn(shape)
        torch.testing.assert_close(runner(x), model(x))
    with pytest.raises(RuntimeError, match=r"shape \[2, 7, 5\] and dtype float32: .*\[1-65535, 1-65536, 6\]"):
        runner(torch.randn(2, 7, 5))


def test_dynamic_time_dim_onnxruntime(sequence_exports):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model, paths = sequence_exports
    dims = onnx.load(paths["onnx"]).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_param and dims[2].dim_value == 6
    session = ort.InferenceSession(paths["onnx"], providers=["CPUExecutionProvider"])
    for shape in SEQUENCE_SHAPES:
        x = torch.randn(shape)
        out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        torch.testing.assert_close(torch.from_numpy(out), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_dynamic_dim_that_the_model_fixes_is_named(tmp_path):
    # Dim 2 is the features, which the weight fixes; torch.export refuses before compiling.
    with pytest.raises(ValueError, match="the model fixes dim 2 of input 0, which dynamic_dims makes dynamic"):
        export_aoti(make_sequence_model(), torch.randn(3, 4, 6), str(tmp_path / "m.pt2"), dynamic_dims=(0, 2))
    with pytest.raises(ValueError, match="no example input has it"):
        export_aoti(make_sequence_model(), torch.randn(3, 4, 6), str(tmp_path / "m.pt2"), dynamic_dims=(0, 3))
    assert os.listdir(tmp_path) == []


def make_strided_network():
    # Total stride 4: torch.export specialises a one-pixel output, so H and W export from 5.
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        customops.nn.ModulatedDeformConv2d(8, 8, 3, stride=2, padding=1),
        nn.Conv2d(8, 4, 3, stride=2, padding=1),
    )


@needs_aoti_python_loading
def test_dynamic_spatial_dims_of_a_strided_network(tmp_path):
    # The minimum is raised until torch.export accepts it, the package records it, and the caller's
    # model is back in training mode afterwards.
    model = make_strided_network().train()
    path = export_aoti(model, torch.randn(2, 3, 16, 20), str(tmp_path / "m.pt2"), dynamic_dims=(0, 2, 3))
    assert model.training and model[1].training
    runner = load_aoti(path)
    assert runner.package.get_metadata()[customops.export.INPUTS_METADATA_KEY] == "float32:1-65535,3,5-65536,5-65536"
    model.eval()
    for shape in ((1, 3, 5, 5), (3, 3, 9, 33)):
        x = torch.randn(shape)
        torch.testing.assert_close(runner(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="refused input 0 of shape"):
        runner(torch.randn(1, 3, 4, 8))


@needs_aoti_python_loading
@pytest.mark.parametrize(
    "layer, example, recorded",
    [
        # H - 2 must not be 1 (torch.export specialises a one-pixel output): H >= 4, as the example.
        (dict(kernel_size=3), (1, 4, 4, 4), "4-65536,4-65536"),
        # H: 1 + (H - 5) // 2 >= 2 needs H >= 7; W: W - 8 >= 2 needs W >= 10, between the doubled
        # minima 9 and 17, above the example's 15.
        (dict(kernel_size=(5, 7), stride=(2, 1), padding=(0, 2), dilation=(1, 2)), (1, 4, 17, 15), "7-65536,10-65536"),
    ],
)
def test_dynamic_spatial_dims_get_the_smallest_minimum_that_exports(layer, example, recorded, tmp_path):
    model = customops.nn.ModulatedDeformConv2d(4, 4, **layer).eval()
    path = export_aoti(model, torch.randn(example), str(tmp_path / "m.pt2"), dynamic_dims=(0, 2, 3))
    runner = load_aoti(path)
    assert runner.package.get_metadata()[customops.export.INPUTS_METADATA_KEY] == "float32:1-65535,4," + recorded
    h, w = (int(r.split("-")[0]) for r in recorded.split(","))
    x = torch.randn(2, 4, h, w)
    torch.testing.assert_close(runner(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="refused input 0"):
        runner(torch.randn(2, 4, h - 1, w))


class _OffsetsAndMaskInputs(nn.Module):
    # DCNv2 fed its offsets and mask logits from outside: the compiled sigmoid sizes its loop from
    # the shared batch and sizes, so inputs that disagree there would be read out of bounds.
    def __init__(self):
        super().__init__()
        self.dc = customops.nn.DeformConv2d(4, 6, 3, padding=1)

    def forward(self, x, offset, mask_logits):
        return self.dc(x, offset, torch.sigmoid(mask_logits))


@needs_aoti_python_loading
@pytest.mark.parametrize("dynamic_dims", [(0,), (0, 2, 3)])
def test_aoti_package_refuses_inputs_whose_tied_dims_disagree(dynamic_dims, tmp_path):
    model = _OffsetsAndMaskInputs().eval()
    shapes = [(2, 4, 8, 8), (2, 18, 8, 8), (2, 9, 8, 8)]
    path = export_aoti(model, [torch.randn(s) for s in shapes], str(tmp_path / "m.pt2"), dynamic_dims=dynamic_dims)
    runner = load_aoti(path)
    dims = runner.package.get_metadata()[customops.export.INPUT_DIMS_METADATA_KEY].split("|")
    assert len({d.split(",")[0] for d in dims}) == 1, dims  # one batch symbol for the three inputs
    B, H = 3, 8 if dynamic_dims == (0,) else 11
    good = [torch.randn(B, c, H, H) for c in (4, 18, 9)]
    torch.testing.assert_close(runner(*good), model(*good), rtol=1e-5, atol=1e-5)
    bad_batch = good[:2] + [torch.randn(1, 9, H, H)]
    with pytest.raises(RuntimeError, match=r"refused input 2 of shape \[1, 9, .*its dim 0 is 1, .* expects 3"):
        runner(*bad_batch)
    if dynamic_dims != (0,):
        with pytest.raises(RuntimeError, match=r"refused input 2 of shape \[3, 9, 4, 4\]: its dim 2 is 4"):
            runner(*good[:2], torch.randn(B, 9, 4, 4))


class _EvenSides(nn.Module):
    # A stride-2 layer's output upsampled and added to the input: the package records H and W as
    # 2*s1 and 2*s2, symbols with no dim of their own; the compiled code would crop an odd side.
    def __init__(self):
        super().__init__()
        self.down = customops.nn.ModulatedDeformConv2d(3, 3, 3, stride=2, padding=1)

    def forward(self, x):
        return x + nn.functional.interpolate(self.down(x), scale_factor=2.0)


@needs_aoti_python_loading
def test_aoti_package_refuses_sizes_that_are_not_multiples_of_its_stride(tmp_path):
    model = _EvenSides().eval()
    path = export_aoti(model, torch.randn(2, 3, 8, 12), str(tmp_path / "m.pt2"), dynamic_dims=(0, 2, 3))
    runner = load_aoti(path)
    x = torch.randn(1, 3, 6, 10)
    torch.testing.assert_close(runner(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(
        RuntimeError, match=r"its dim 2 is 7, where the package takes sizes of the form 2\*s\d+ \(such as 6 or 8\)"
    ):
        runner(torch.randn(1, 3, 7, 8))


def test_dynamic_spatial_dims_onnx_strided_and_offsets_input(tmp_path):
    # A stride-4 network, and DeformConv2d with the offsets as a second input (its H and W tied to
    # the input's by torch's suggested fixes), exported with dynamic H and W, run at other sizes.
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    assert onnx
    torch.manual_seed(0)
    strided = make_strided_network().eval()
    offsets = customops.nn.DeformConv2d(4, 6, 3, padding=1).eval()
    cases = [
        (strided, (torch.randn(2, 3, 16, 20),), [(torch.randn(3, 3, 5, 9),)]),
        (offsets, (torch.randn(2, 4, 10, 12), torch.randn(2, 18, 10, 12)),
         [(torch.randn(1, 4, 13, 30), torch.randn(1, 18, 13, 30))]),
    ]  # fmt: skip
    for i, (model, example, runs) in enumerate(cases):
        path = export_onnx(model, example, str(tmp_path / f"m{i}.onnx"), dynamic_dims=(0, 2, 3))
        session = ort.InferenceSession(path)
        for inputs in runs:
            feed = {arg.name: t.numpy() for arg, t in zip(session.get_inputs(), inputs)}
            out = session.run(None, feed)[0]
            torch.testing.assert_close(torch.from_numpy(out), model(*inputs).detach(), rtol=1e-5, atol=1e-5)


class DataDependent(nn.Module):
    """Scripts (TorchScript keeps the branch) but does not torch.export (a data-dependent branch)."""

    def forward(self, x):
        if x.sum() > 0:
            return customops.sigmoid(x)
        return x


def test_failed_export_model_leaves_no_files(tmp_path):
    # The TorchScript file is written before torch.export fails for the .pt2: it must go too,
    # while a file of an earlier export stays as it was.
    (tmp_path / "model.pt2").write_bytes(b"earlier")
    with pytest.raises(Exception):  # noqa: B017  (torch's exception type varies across versions)
        export_model(DataDependent(), torch.randn(4, 3), str(tmp_path), formats=("pt", "pt2"))
    assert os.listdir(tmp_path) == ["model.pt2"]
    assert (tmp_path / "model.pt2").read_bytes() == b"earlier"


def test_failed_aoti_compile_leaves_no_partial_package(model, tmp_path, monkeypatch):
    def writes_half_then_fails(program, package_path, inductor_configs):
        with open(package_path, "wb") as f:
            f.write(b"half a package")
        raise RuntimeError("compiler crashed")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", writes_half_then_fails)
    with pytest.raises(RuntimeError, match="compiler crashed"):
        export_aoti(model, torch.randn(8, 12), str(tmp_path / "m.pt2"))
    assert os.listdir(tmp_path) == []


def test_failed_torchscript_export_leaves_nothing(tmp_path):
    class Unscriptable(nn.Module):
        def forward(self, *xs):
            return customops.sigmoid(xs[0])

    with pytest.raises(Exception):  # noqa: B017  (torch's exception type varies across versions)
        export_torchscript(Unscriptable(), None, str(tmp_path / "m.pt"))
    assert os.listdir(tmp_path) == []


def test_onnx_external_data_lands_beside_the_model(model, tmp_path, monkeypatch):
    # Models over torch.onnx's size threshold (1.5 GB) keep their weights in NAME.onnx.data,
    # referred to by that name: lower the threshold to get one from a small model.
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from torch.onnx._internal.exporter import _onnx_program

    if not hasattr(_onnx_program, "_LARGE_MODEL_THRESHOLD"):
        pytest.skip("this torch.onnx has no _LARGE_MODEL_THRESHOLD to lower")
    monkeypatch.setattr(_onnx_program, "_LARGE_MODEL_THRESHOLD", 0)
    path = export_onnx(model, torch.randn(8, 12), str(tmp_path / "m.onnx"))
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    locations = {
        entry.value
        for t in onnx.load(path, load_external_data=False).graph.initializer
        for entry in t.external_data
        if entry.key == "location"
    }
    assert locations == {"m.onnx.data"}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = torch.randn(3, 12)
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(out), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_torchscript_export_and_load_are_quiet(model, tmp_path):
    # torch's TorchScript deprecation notices are noise for users of the format.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_torchscript(export_torchscript(model, None, str(tmp_path / "s.pt")))
        load_torchscript(export_torchscript(model, torch.randn(2, 12), str(tmp_path / "t.pt"), trace=True))
    noise = [str(w.message) for w in caught if "torch.jit" in str(w.message)]
    assert not noise, noise


def test_onnx_export_is_quiet(model, tmp_path, caplog):
    # torch.onnx logs a "torchvision is not installed" line per torchvision op on every export.
    pytest.importorskip("onnxscript")
    registration = "torch.onnx._internal.exporter._registration"
    with caplog.at_level(logging.INFO, logger=registration):
        export_onnx(model, torch.randn(8, 12), str(tmp_path / "m.onnx"))
        assert logging.getLogger(registration).level == logging.INFO  # restored after the export
    assert not [r.getMessage() for r in caplog.records if r.name == registration and r.levelno < logging.ERROR]


def test_public_names():
    assert "aoti_python_loading_works" not in customops.export.__all__
    for name in customops.export.__all__:
        if name != "ONNX_TRANSLATION_TABLE" or _has("onnxscript"):
            getattr(customops.export, name)


def test_onnx_standard_ops_dynamic_batch_and_onnxruntime(model, tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    path = export_onnx(model, torch.randn(8, 12), str(tmp_path / "m.onnx"))
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    domains = {node.domain for node in proto.graph.node} | {f.domain for f in proto.functions}
    assert domains <= {"", "ai.onnx"}, domains
    assert {node.op_type for node in proto.graph.node} >= {"Sigmoid", "Add"}
    batch_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.HasField("dim_value")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for b in BATCHES:
        x = torch.randn(b, 12)
        out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        torch.testing.assert_close(torch.from_numpy(out), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_translation_table_covers_every_op_whose_spec_takes_onnx():
    pytest.importorskip("onnxscript")
    from customops.export import ONNX_TRANSLATION_TABLE
    from customops.testing import OP_SPECS

    assert set(ONNX_TRANSLATION_TABLE) == {s.op.default for s in OP_SPECS if "onnx" not in s.unsupported}


def test_missing_and_corrupt_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_torchscript(str(tmp_path / "nope.pt"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_aoti(str(tmp_path / "nope.pt2"))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"this is not a model")
    with pytest.raises(RuntimeError, match="could not load TorchScript model .*corrupt.pt"):
        load_torchscript(str(corrupt))


def test_aoti_export_of_an_input_without_batch_dimension_says_so(model, tmp_path):
    # A 1-D example (64,) makes export mark the features as the batch, which the model fixes.
    with pytest.raises(
        ValueError, match=r"fixes dim 0 of an input.*shapes are \[\[12\]\]; a 1-D input has no batch dimension"
    ):
        export_aoti(model, torch.randn(12), str(tmp_path / "m.pt2"))
    assert os.listdir(tmp_path) == []


def _export_cli(*args, env=None):
    """python -m customops.export ARGS, in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "customops.export", *args], capture_output=True, text=True, timeout=600, env=env
    )


def test_command_line_input_shape_without_batch_dimension(tmp_path):
    out = _export_cli(DIGITS, "--input-shape", "64", "--formats", "pt2", "--out", str(tmp_path))
    assert (
        out.returncode == 1 and "a 1-D input has no batch dimension" in out.stderr and "Traceback" not in out.stderr
    ), out.stderr


def test_onnx_export_refuses_a_model_that_fixes_the_batch(tmp_path):
    pytest.importorskip("onnxscript")

    class AddsFixedBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.randn(8, 12))

        def forward(self, x):
            return customops.add(x, self.offset)

    with pytest.raises((ValueError, Exception), match="batch"):
        export_onnx(AddsFixedBuffer(), torch.randn(8, 12), str(tmp_path / "fixed.onnx"))
    assert os.listdir(tmp_path) == []  # neither the file nor a temporary one


@pytest.mark.parametrize(
    "args,message",
    [
        ([DIGITS, "--input-shape", "8x64"], "comma-separated integers"),
        ([DIGITS.replace("make_model", "nope"), "--input-shape", "8,64"], "cannot find"),
        (["no_colon", "--input-shape", "8,64"], "package.module:callable"),
        ([DIGITS, "--input-shape", "8,64", "--dynamic", "0,x"], "dimension indices"),
        ([DIGITS, "--input-shape", "8,64", "--dynamic", "0,2"], "dimensions 0..1"),
        ([DIGITS, "--input-shape", "8,64", "--state-dict", "/nonexistent/w.pt"], "cannot load it with torch.load"),
    ],
)
def test_command_line_errors_are_messages_not_tracebacks(args, message):
    out = _export_cli(*args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_command_line_refuses_a_state_dict_that_does_not_fit(tmp_path):
    path = str(tmp_path / "w.pt")
    torch.save({"not_a_parameter": torch.zeros(1)}, path)
    out = _export_cli(DIGITS, "--input-shape", "8,64", "--state-dict", path)
    assert out.returncode == 2 and "does not fit the model" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_command_line(tmp_path):
    out = _export_cli(
        DIGITS, "--input-shape", "4,64", "--formats", "pt", "onnx", "--out", str(tmp_path), "--name", "digits"
    )
    assert out.returncode == 0, out.stderr
    assert os.path.isfile(tmp_path / "digits.pt") and os.path.isfile(tmp_path / "digits.onnx")


def test_command_line_dynamic_dims(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    out = _export_cli(
        "test_export:make_sequence_model",
        "--input-shape",
        "3,4,6",
        "--dynamic",
        "0,1",
        "--formats",
        "onnx",
        "--out",
        str(tmp_path),
        env=env,
    )
    assert out.returncode == 0, out.stderr
    dims = onnx.load(str(tmp_path / "model.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_param and dims[2].dim_value == 6


def test_cli_without_onnx_packages_says_what_to_install(tmp_path, monkeypatch, capsys):
    import importlib.util

    from customops.export.__main__ import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit) as exit_info:
        main([DIGITS, "--input-shape", "4,64", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "needs onnxscript" in err and "customops[export]" in err and "--formats pt pt2" in err
    assert not (tmp_path / "out").exists()  # refused before anything was exported


def _model_config(path):
    text_format = pytest.importorskip("google.protobuf.text_format", reason="protobuf is not installed")
    pb = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient is not installed")
    with open(path) as f:
        return text_format.Parse(f.read(), pb.ModelConfig())


def test_export_writes_triton_model_repositories(model, three_op_model_pt2, tmp_path):
    from customops.export.triton import write_triton_repositories

    paths = export_model(model, torch.randn(8, 12), str(tmp_path), formats=("pt",), triton_max_batch_size=32)
    root = tmp_path / "triton"
    assert paths["triton"] == str(root)
    # The PyTorch backend's TorchScript model: the batch left out of dims, dynamic batching.
    config = _model_config(root / "pytorch" / "model" / "config.pbtxt")
    assert config.platform == "pytorch_libtorch" and config.max_batch_size == 32
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT__0", [12])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("OUTPUT__0", [4])]
    assert config.input[0].data_type == config.output[0].data_type == 11  # TYPE_FP32
    assert config.HasField("dynamic_batching") and config.dynamic_batching.max_queue_delay_microseconds == 1000
    assert os.path.samefile(root / "pytorch" / "model" / "1" / "model.pt", paths["pt"]) or (
        (root / "pytorch" / "model" / "1" / "model.pt").read_bytes() == open(paths["pt"], "rb").read()
    )
    # The op library's LD_PRELOAD line, with this installation's library, in the config and the README.
    preload = f"LD_PRELOAD={customops.library_path()} tritonserver --model-repository="
    assert preload in (root / "pytorch" / "model" / "config.pbtxt").read_text()
    assert preload + str(root / "pytorch") in (root / "README.md").read_text()
    # The Python backend's: model.py and the TorchScript file beside it.
    config = _model_config(root / "python" / "model" / "config.pbtxt")
    assert config.backend == "python" and config.max_batch_size == 32 and config.HasField("dynamic_batching")
    assert config.parameters["customops_model_file"].string_value == "model.pt"
    assert "class TritonPythonModel" in (root / "python" / "model" / "1" / "model.py").read_text()
    # A copy, not a link to the installed package's file; the folder readable as a mkdir's.
    from customops.export.triton import PYTHON_MODEL_SOURCE

    assert not os.path.samefile(root / "python" / "model" / "1" / "model.py", PYTHON_MODEL_SOURCE)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(root).st_mode & 0o777 == 0o777 & ~umask
    # The AOTInductor package: torch_aoti does not batch, so full dims and max_batch_size 0.
    _, pt2 = three_op_model_pt2
    write_triton_repositories(str(tmp_path), "model", model, (torch.randn(8, 12),), {"pt": paths["pt"], "pt2": pt2})
    config = _model_config(root / "pytorch" / "model_aoti" / "config.pbtxt")
    assert config.platform == "torch_aoti" and config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in config.input] == [[-1, 12]] and [list(t.dims) for t in config.output] == [[-1, 4]]
    assert (root / "pytorch" / "model_aoti" / "1" / "model.pt2").is_file()
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "triton"]  # no staging folders left


def test_triton_repository_of_a_dynamic_time_dim(tmp_path):
    export_model(make_sequence_model(), torch.randn(3, 4, 6), str(tmp_path), formats=("pt",), dynamic_dims=(0, 1))
    config = _model_config(tmp_path / "triton" / "pytorch" / "model" / "config.pbtxt")
    assert [list(t.dims) for t in config.input] == [[-1, 6]]
    assert config.max_batch_size > 0 and len(config.output) == 1 and list(config.output[0].dims)[0] == -1


def test_triton_config_output_sizes_behind_unpadded_strided_layers():
    # 32 and 33 rows both come out as 7 (32 -> 15 -> 7, 33 -> 16 -> 7), 64 as 15: the output's
    # sizes are dynamic. After an adaptive pooling they are fixed.
    from customops.export.triton import io_configs

    strided = nn.Sequential(
        nn.Conv2d(3, 8, 3, 2), nn.ReLU(), customops.nn.ModulatedDeformConv2d(8, 8, 3, stride=2, offset_groups=2)
    ).eval()
    pooled = nn.Sequential(strided, nn.AdaptiveAvgPool2d(4))
    x = torch.randn(2, 3, 32, 32)
    for model, dims in ((strided, [8, -1, -1]), (pooled, [8, 4, 4])):
        inputs, outputs = io_configs(model, (x,), (0, 2, 3), batched=True)
        assert [list(t.dims) for t in inputs] == [[3, -1, -1]]
        assert [list(t.dims) for t in outputs] == [dims]


def test_triton_repository_refuses_outputs_without_the_batch(tmp_path):
    class Pooled(nn.Module):
        def forward(self, x):
            return customops.sigmoid(x).sum(0)

    with pytest.raises(ValueError, match="does not have the batch as dim 0"):
        export_model(Pooled(), torch.randn(4, 3), str(tmp_path), formats=("pt",))
    assert os.listdir(tmp_path) == []
    paths = export_model(Pooled(), torch.randn(4, 3), str(tmp_path), formats=("pt",), triton_max_batch_size=0)
    config = _model_config(os.path.join(paths["triton"], "pytorch", "model", "config.pbtxt"))
    assert config.max_batch_size == 0 and [list(t.dims) for t in config.input] == [[-1, 3]]


def test_triton_repository_of_an_input_without_batch_dimension_says_so(model, tmp_path):
    with pytest.raises(ValueError, match="a 1-D input has no batch dimension"):
        export_model(model, torch.randn(12), str(tmp_path), formats=("pt",))
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the batch limit is CUDA's)")
def test_cuda_batchnorm_model_exports_with_the_default_batch_range():
    # On CUDA, eval-mode BatchNorm guards batch <= 65535 (cuDNN); the default range must fit it.
    from customops.export._common import _dynamic_spec, _export_program

    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).cuda().eval()
    inputs, shapes, ranges = _dynamic_spec(
        (torch.randn(4, 3, 16, 16, device="cuda"),), (0,), customops.export.DEFAULT_MAX_BATCH, 16
    )
    program, accepted = _export_program(net, inputs, shapes, ranges)
    x = torch.randn(5, 3, 16, 16, device="cuda")
    torch.testing.assert_close(program.module()(x), net(x))
    assert ranges == accepted == [{0: (1, customops.export.DEFAULT_MAX_BATCH)}]
