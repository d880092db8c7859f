"""The C++ side of the package: the server customops_serve (shipped in the package) runs
TorchScript and AOTInductor exports of a model that uses customops' ops, matches Python, has no
libpython dependency, and fails cleanly on bad files; a user's CMake project finds the package
with find_package(customops 0.1 REQUIRED) from customops.cmake_prefix_path() alone, links
customops::customops and calls the C++ API."""

import os
import shutil
import subprocess

import pytest
import torch

import customops
from customops.export import export_aoti, export_torchscript
from customops.export.cpp import run_serve

TESTS_CPP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp")


@pytest.fixture(scope="module")
def cpp_programs(tmp_path_factory):
    """tests/cpp built as a user's project: configured with CMAKE_PREFIX_PATH set to
    customops.cmake_prefix_path() and nothing else."""
    if shutil.which("cmake") is None:
        pytest.skip("needs cmake, for a user's CMake project")
    build = tmp_path_factory.mktemp("cpp_build")
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_PREFIX_PATH", "Torch_DIR")}
    for cmd in (
        [
            "cmake",
            "-S",
            TESTS_CPP,
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={customops.cmake_prefix_path()}",
        ],
        ["cmake", "--build", str(build), "-j", os.environ.get("MAX_JOBS", "2")],
    ):
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return {
        "example": str(build / "example" / "customops_example"),
        "without_ops": str(build / "customops_serve_without_ops"),
    }


@pytest.fixture(scope="module")
def exported(three_op_model_pt2, tmp_path_factory):
    model, pt2 = three_op_model_pt2
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


def test_serve_reads_size_1_dims_of_any_stride(serve, one_channel_conv_pt2, tmp_path):
    # torch calls these batches contiguous; the compiled code read their channel stride.
    from conftest import grayscale_batches

    model, path = one_channel_conv_pt2
    for x in grayscale_batches():
        out, _, _ = run_serve(serve, path, x, str(tmp_path), runs=2)
        torch.testing.assert_close(out, model(x).detach(), rtol=1e-5, atol=1e-5)


def test_no_libpython_dependency(serve):
    for path in (serve, customops.library_path()):
        needed = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
        assert "libpython" not in needed, path
    # Every dependency of the installed binary resolves through its rpath.
    needed = subprocess.run(["ldd", serve], capture_output=True, text=True, check=True).stdout
    assert "not found" not in needed, needed


def test_server_links_the_package_s_library(serve):
    # The same file Python loads, so a process never holds two copies.
    needed = subprocess.run(["ldd", serve], capture_output=True, text=True, check=True).stdout
    line = next(line for line in needed.splitlines() if "libcustomops.so" in line)
    assert os.path.samefile(line.split("=>")[1].split()[0], customops.library_path())


def test_find_package_example_links_and_runs(cpp_programs):
    out = subprocess.run([cpp_programs["example"]], capture_output=True, text=True)
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
    out = subprocess.run(
        [serve, paths["pt"], str(good_input), str(tmp_path / "no" / "such" / "dir.pt")], capture_output=True, text=True
    )
    assert out.returncode == 1 and "cannot be written" in out.stderr, out.stderr
    for bad_usage in ([paths["pt"]], [paths["pt"], str(good_input), "y.pt", "--runs", "5abc"]):
        out = subprocess.run([serve, *bad_usage], capture_output=True, text=True)
        assert out.returncode == 2 and "usage:" in out.stderr, out.stderr


class _Square(torch.nn.Module):
    # torch.export ties H and W (x + x.transpose): the compiled code reads W as H.
    def forward(self, x):
        return customops.sigmoid(x + x.transpose(2, 3))


class _WiderByTwo(torch.nn.Module):
    # Ties W to H + 2 (recorded as "s1 + 2"): the compiled code derives W from H.
    def forward(self, x):
        return customops.sigmoid(x[:, :, :, 2:] + x[:, :, :, :-2].transpose(2, 3))


class _EvenSides(torch.nn.Module):
    # A stride-2 layer's output upsampled and added to the input: H and W are recorded as "2*s1",
    # "2*s2", with no dim of s1's own; the compiled code would crop an odd side.
    def __init__(self):
        super().__init__()
        self.down = customops.nn.ModulatedDeformConv2d(3, 3, 3, stride=2, padding=1)

    def forward(self, x):
        return x + torch.nn.functional.interpolate(self.down(x), scale_factor=2.0)


@pytest.mark.parametrize(
    "model, example, good, bad, message",
    [
        (_Square(), (2, 3, 8, 8), (2, 3, 5, 5), (2, 3, 8, 9), "its dim 3 is 9, where the package ties it to dim 2"),
        (_WiderByTwo(), (2, 3, 6, 8), (1, 3, 3, 5), (2, 3, 6, 6), "its dim 3 is 6, where the package ties it to dim 2"),
        (
            _EvenSides().eval(),
            (2, 3, 8, 12),
            (1, 3, 6, 10),
            (1, 3, 7, 8),
            "its dim 2 is 7, where the package takes sizes of the form 2*",
        ),
    ],
)
def test_package_refuses_an_input_whose_tied_sizes_disagree(serve, model, example, good, bad, message, tmp_path):
    path = export_aoti(model, torch.randn(example), str(tmp_path / "m.pt2"), dynamic_dims=(0, 2, 3))
    for shape, expected in ((good, None), (bad, message)):
        x, y = tmp_path / "x.pt", tmp_path / "y.pt"
        torch.save(torch.randn(shape), x)
        out = subprocess.run(
            [serve, path, str(x), str(y), "--runs", "1", "--warmup", "0"], capture_output=True, text=True
        )
        if expected is None:
            assert out.returncode == 0, out.stderr
            inp = torch.load(x)
            torch.testing.assert_close(torch.load(y), model(inp).detach(), rtol=1e-5, atol=1e-5)
        else:
            assert out.returncode == 1 and expected in out.stderr, (out.returncode, out.stderr)


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
def test_program_without_the_op_library_names_the_op_and_the_fix(cpp_programs, exported, fmt, tmp_path):
    _, paths = exported
    without_ops = cpp_programs["without_ops"]
    x = tmp_path / "x.pt"
    torch.save(torch.randn(2, 12), x)
    out = subprocess.run([without_ops, paths[fmt], str(x), str(tmp_path / "y.pt")], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert "customops::fused_linear_sigmoid" in out.stderr
    assert "op library is not loaded" in out.stderr and "customops::customops" in out.stderr
