"""The package as users install it: one op library per process, the torch it was built against,
the C++ SDK inside the package (header, CMake package, server), the CUDA architectures, and
builds that never pull in a second torch."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import customops
from customops import _library

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(customops.__file__)))


def _python(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter that imports this customops (cwd: outside the tree)."""
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=os.path.dirname(REPO),
    )


@pytest.fixture(scope="module")
def library_copy(tmp_path_factory):
    path = tmp_path_factory.mktemp("copy") / "libcustomops.so"
    shutil.copy(customops.library_path(), path)
    return str(path)


def test_a_second_copy_loaded_after_customops_is_harmless(library_copy):
    out = _python(f"""
        import torch, customops
        torch.ops.load_library({library_copy!r})
        assert torch.equal(customops.add(torch.ones(3), torch.ones(3)), torch.full((3,), 2.0))
        print("ops work")
    """)
    assert out.returncode == 0, out.stderr  # not SIGABRT (-6)
    assert "ops work" in out.stdout
    assert library_copy in out.stderr and customops.library_path() in out.stderr and "registers nothing" in out.stderr


def test_import_after_another_copy_is_a_catchable_import_error(library_copy):
    out = _python(f"""
        import torch
        torch.ops.load_library({library_copy!r})
        try:
            import customops
        except ImportError as e:
            print("ImportError:", e)
    """)
    assert out.returncode == 0, out.stderr
    assert "ImportError:" in out.stdout
    assert library_copy in out.stdout and customops.library_path() in out.stdout


def test_loading_the_package_library_again_is_a_no_op():
    out = _python("""
        import torch, customops
        torch.ops.load_library(customops.library_path())
        customops.load_library()
        print(customops.build_info()["library"])
    """)
    assert out.returncode == 0, out.stderr
    assert os.path.samefile(out.stdout.strip(), customops.library_path())


def test_library_built_against_another_torch_names_both_versions(tmp_path):
    # A copy of the package whose library says it was built against another torch.
    package = tmp_path / "customops"
    shutil.copytree(os.path.dirname(customops.__file__), package, ignore=shutil.ignore_patterns("__pycache__"))
    info = package / "lib" / "build_info.json"
    info.write_text(info.read_text().replace(f'"{torch.__version__}"', '"2.99.0+other"'))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", "import customops"], capture_output=True, text=True, env=env, cwd=str(tmp_path)
    )
    assert out.returncode == 1
    message = out.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: "), out.stderr
    assert "2.99.0+other" in message and torch.__version__ in message and "--no-build-isolation" in message


def test_build_info_is_the_loaded_library_s_own():
    info = customops.build_info()
    assert os.path.samefile(info["library"], customops.library_path())
    assert info["torch"] == torch.__version__ and info["customops"] == customops.__version__
    assert info["cuda_kernels"] == ("CUDA" in customops.compiled_backends())
    # Nothing is written into the source tree for the doctor to misread.
    assert not os.path.exists(os.path.join(REPO, "customops", "_build_info.json"))


def test_cmake_version_file_matches_the_package():
    path = os.path.join(customops.cmake_prefix_path(), "customops", "customopsConfigVersion.cmake")
    with open(path) as f:
        assert re.search(r'set\(PACKAGE_VERSION "([^"]+)"\)', f.read()).group(1) == customops.__version__


def test_header_declares_every_op():
    with open(os.path.join(os.path.dirname(customops.__file__), "include", "customops", "ops.h")) as f:
        header = f.read()
    ops = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("customops::")}
    public = {op for op in ops if not op.startswith("_")}
    assert public and {op for op in public if not re.search(rf"\b{op}\(", header)} == set()


@pytest.mark.parametrize(
    "capability, archs, runs",
    [
        ((9, 0), ["9.0a"], True),
        ((8, 0), ["9.0a"], False),  # the default of earlier builds on a machine without a GPU
        ((8, 6), ["8.0"], True),  # a cubin runs on later minors of its major
        ((8, 0), ["8.6"], False),
        ((10, 0), ["9.0a"], False),  # arch-specific code runs on its own version only
        ((12, 1), ["7.5", "12.0+PTX"], True),
        ((12, 0), ["9.0a+PTX"], False),
        ((10, 0), ["7.5", "8.0", "8.6", "9.0a", "10.0", "12.0+PTX"], True),
        ((13, 0), ["7.5", "8.0", "8.6", "9.0a", "10.0", "12.0+PTX"], True),  # PTX for what comes next
    ],
)
def test_arch_runs(capability, archs, runs):
    assert _library.arch_runs(capability, archs) is runs


def test_missing_arch_warning_names_the_gpu_the_build_and_the_fix(monkeypatch):
    monkeypatch.setattr(_library, "_loaded_build_info", lambda: {"cuda_kernels": True, "cuda_archs": ["9.0a"]})
    monkeypatch.setattr(_library, "_warned_archs", set())
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA A100")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _library._check_cuda_archs()
    assert len(caught) == 1  # once per architecture, not per GPU
    message = str(caught[0].message)
    assert "NVIDIA A100" in message and "8.0" in message and "9.0a" in message
    assert 'TORCH_CUDA_ARCH_LIST="8.0"' in message
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(_library, "_warned_archs", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _library._check_cuda_archs()
    assert caught == []


def test_default_cuda_build_covers_torch_s_architectures():
    info = customops.build_info()
    if not info["cuda_kernels"]:
        pytest.skip("a CPU-only build")
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        pytest.skip("TORCH_CUDA_ARCH_LIST chose the architectures")
    for arch in torch.cuda.get_arch_list():
        if arch.startswith("sm_"):
            capability = (int(arch[3:-1]), int(arch[-1]))
            assert _library.arch_runs(capability, info["cuda_archs"]), (arch, info["cuda_archs"])
    assert info["cuda_archs"][-1].endswith("+PTX")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile(os.path.join(REPO, "setup.py")), reason="needs the source tree (setup.py)")
def test_isolated_build_stops_at_once_without_a_second_torch(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.so", "bin", "__pycache__", "*.egg-info"),
    )
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = out.stdout + out.stderr
    assert out.returncode != 0, log
    if "No matching distribution found for setuptools" in log:
        pytest.skip("no package index reachable for the isolated build's setuptools (an offline machine)")
    assert "--no-build-isolation" in log, log
    assert not re.search(r"(Collecting|Downloading|Installing collected packages:.*)\btorch\b", log), log
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())
