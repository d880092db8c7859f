"""Deployment from Python: TorchScript, AOTInductor and ONNX exports with a dynamic batch
dimension, loaded back (ONNX in a stock onnxruntime) and compared with eager."""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import customops
from customops.export import (
    aoti_python_loading_works,
    export_onnx,
    export_torchscript,
    load_aoti,
    load_torchscript,
)
from customops.nn import FusedLinearSigmoid


class UsesAllOps(nn.Module):
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
    return UsesAllOps().eval()


BATCHES = (1, 37)


def test_torchscript_roundtrip(model, tmp_path):
    path = export_torchscript(model, None, str(tmp_path / "m.pt"))
    loaded = load_torchscript(path)
    for b in BATCHES:
        x = torch.randn(b, 12)
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


@pytest.mark.skipif(
    not aoti_python_loading_works(),
    reason=f"torch {torch.__version__}'s aoti_load_package is known to crash (seen on torch 2.11); "
    "packages are checked through the C++ loader there",
)
def test_aoti_package_dynamic_batch(uses_all_ops_pt2):
    model, path = uses_all_ops_pt2
    runner = load_aoti(path)
    for b in BATCHES:
        x = torch.randn(b, 12)
        torch.testing.assert_close(runner(x), model(x))
    # Any strides, as TorchScript takes them: transposed, sliced, expanded (stride 0).
    for x in (torch.randn(12, 5).t(), torch.randn(10, 12)[::2], torch.randn(1, 12).expand(5, 12)):
        assert not x.is_contiguous()
        torch.testing.assert_close(runner(x), model(x))
    # A wrong shape: the package's own message names only a dimension index; ours adds the inputs.
    with pytest.raises(RuntimeError, match=r"refused inputs of \(shape, dtype\) \[\(\[12\], 'float32'\)\]"):
        runner(torch.randn(12))


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
    from customops.export import export_aoti

    with pytest.raises(ValueError, match=r"fixes dim 0 of an input.*shapes are \[\[12\]\]; a 1-D input has no batch dimension"):
        export_aoti(model, torch.randn(12), str(tmp_path / "m.pt2"))
    assert not (tmp_path / "m.pt2").exists()


def test_command_line_input_shape_without_batch_dimension(tmp_path):
    out = subprocess.run([sys.executable, "-m", "customops.export", "customops.train_digits:make_model", "--input-shape",
                          "64", "--formats", "pt2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "a 1-D input has no batch dimension" in out.stderr and "Traceback" not in out.stderr, out.stderr


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
    assert not (tmp_path / "fixed.onnx").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["customops.train_digits:make_model", "--input-shape", "8x64"], "comma-separated integers"),
        (["customops.train_digits:nope", "--input-shape", "8,64"], "cannot find"),
        (["no_colon", "--input-shape", "8,64"], "package.module:callable"),
        (["customops.train_digits:make_model", "--input-shape", "8,64", "--state-dict", "/nonexistent/w.pt"],
         "cannot load it with torch.load"),
    ],
)
def test_command_line_errors_are_messages_not_tracebacks(args, message):
    out = subprocess.run([sys.executable, "-m", "customops.export", *args], capture_output=True, text=True)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_command_line_refuses_a_state_dict_that_does_not_fit(tmp_path):
    path = str(tmp_path / "w.pt")
    torch.save({"not_a_parameter": torch.zeros(1)}, path)
    out = subprocess.run([sys.executable, "-m", "customops.export", "customops.train_digits:make_model", "--input-shape",
                          "8,64", "--state-dict", path], capture_output=True, text=True)
    assert out.returncode == 2 and "does not fit the model" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_command_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "customops.export", "customops.train_digits:make_model", "--input-shape", "4,64",
         "--formats", "pt", "onnx", "--out", str(tmp_path), "--name", "digits"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert os.path.isfile(tmp_path / "digits.pt") and os.path.isfile(tmp_path / "digits.onnx")
