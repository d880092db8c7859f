"""The C++ server (export/cpp): built with torch's CMake package, it runs TorchScript and
AOTInductor exports of a model that uses customops' ops, matches Python, has no libpython
dependency, and fails cleanly on bad files. The find_package(customops) example links and runs."""

import os
import shutil
import subprocess

import pytest
import torch

import customops
from customops.export import export_torchscript
from customops.export.cpp import DEFAULT_BUILD, run_serve

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake (export/cpp/build.sh)")


@pytest.fixture(scope="module")
def exported(uses_all_ops_pt2, tmp_path_factory):
    model, pt2 = uses_all_ops_pt2
    return model, {"pt": export_torchscript(model, None, str(tmp_path_factory.mktemp("cpp") / "m.pt")), "pt2": pt2}


@pytest.mark.parametrize("fmt", ["pt", "pt2"])
@pytest.mark.parametrize("batch", [1, 37])
def test_serve_matches_python(serve, exported, fmt, batch, tmp_path):
    model, paths = exported
    x = torch.randn(batch, 12)
    out, median_ms, p99_ms = run_serve(serve, paths[fmt], x, str(tmp_path), runs=5)
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-5, atol=1e-6)
    assert 0 < median_ms <= p99_ms


@pytest.mark.parametrize("fmt", ["pt", "pt2"])
def test_serve_takes_any_strides(serve, exported, fmt, tmp_path):
    # torch.save keeps a view's strides; an AOTInductor package checks them against its example.
    model, paths = exported
    for x in (torch.randn(12, 5).t(), torch.randn(1, 12).expand(5, 12)):
        assert not x.is_contiguous()
        out, _, _ = run_serve(serve, paths[fmt], x, str(tmp_path), runs=2)
        torch.testing.assert_close(out, model(x).detach(), rtol=1e-5, atol=1e-6)


def test_no_libpython_dependency(serve):
    for path in (serve, os.path.join(os.path.dirname(serve), "..", "lib", "libcustomops.so"), customops.library_path()):
        needed = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
        assert "libpython" not in needed, path
    # Every dependency of the installed binary resolves through its rpath.
    needed = subprocess.run(["ldd", serve], capture_output=True, text=True, check=True).stdout
    assert "not found" not in needed, needed


def test_find_package_example_links_and_runs(serve):
    out = subprocess.run([os.path.join(DEFAULT_BUILD, "example", "customops_example")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "matches ATen" in out.stdout


def test_bad_files_fail_cleanly(serve, exported, tmp_path):
    _, paths = exported
    good_input = tmp_path / "x.pt"
    torch.save(torch.randn(2, 12), good_input)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a model")
    cases = [
        ([str(tmp_path / "missing.pt"), str(good_input)], "cannot be opened"),
        ([str(garbage), str(good_input)], "cannot load model"),
        ([str(tmp_path / "garbage.pt2"), str(good_input)], "cannot be opened"),
        ([paths["pt"], str(garbage)], "is not a tensor saved with torch.save"),
        ([paths["pt"], str(tmp_path / "missing_input.pt")], "cannot be opened"),
        ([paths["pt"], str(tmp_path)], "cannot be read"),  # a directory as input
    ]
    wrong_shape = tmp_path / "wrong_shape.pt"
    torch.save(torch.randn(3, 2, 12), wrong_shape)
    cases.append(([paths["pt2"], str(wrong_shape)], "error"))  # checked, not read out of bounds
    if not torch.cuda.is_available():
        cases.append(([paths["pt"], str(good_input), "--device", "cuda"], "no usable CUDA device"))
    for args, message in cases:
        options = args[2:]
        out = subprocess.run([serve, *args[:2], str(tmp_path / "y.pt"), *options], capture_output=True, text=True)
        assert out.returncode == 1, (args, out.returncode, out.stderr)  # an error exit, not a signal
        assert message in out.stderr, (args, out.stderr)
    # An output that cannot be written is an error, not a success.
    out = subprocess.run([serve, paths["pt"], str(good_input), str(tmp_path / "no" / "such" / "dir.pt")],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "cannot be written" in out.stderr, out.stderr
    for bad_usage in ([paths["pt"]], [paths["pt"], str(good_input), "y.pt", "--runs", "5abc"]):
        out = subprocess.run([serve, *bad_usage], capture_output=True, text=True)
        assert out.returncode == 2 and "usage:" in out.stderr, out.stderr


def test_model_with_several_outputs_is_refused(serve, tmp_path):
    class TwoOutputs(torch.nn.Module):
        def forward(self, x):
            return x, customops.sigmoid(x)

    path = export_torchscript(TwoOutputs(), None, str(tmp_path / "two.pt"))
    x = tmp_path / "x.pt"
    torch.save(torch.randn(2, 3), x)
    out = subprocess.run([serve, path, str(x), str(tmp_path / "y.pt")], capture_output=True, text=True)
    assert out.returncode == 1 and "one tensor output" in out.stderr, out.stderr


@pytest.mark.parametrize("fmt", ["pt", "pt2"])
def test_program_without_the_op_library_names_the_op_and_the_fix(serve, exported, fmt, tmp_path):
    _, paths = exported
    without_ops = os.path.join(DEFAULT_BUILD, "serve", "customops_serve_without_ops")
    x = tmp_path / "x.pt"
    torch.save(torch.randn(2, 12), x)
    out = subprocess.run([without_ops, paths[fmt], str(x), str(tmp_path / "y.pt")], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert "customops::fused_linear_sigmoid" in out.stderr
    assert "op library is not loaded" in out.stderr and "customops::customops" in out.stderr
