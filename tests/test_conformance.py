"""Every op of customops.testing.OP_SPECS on every path of customops.testing.PATHS, generated
from the specs: test_path[<op>-<path>-<device>]. A path an op declares unsupported is skipped
with the spec's reason, and test_unsupported_path_really_fails keeps that declaration honest.
Adding an op: docs/adding_an_op.md."""

import dataclasses

import pytest
import torch

import customops
from conftest import HAS_CUDA
from customops.testing import OP_SPECS, PATHS
from customops.testing import paths as P


def _params():
    for spec in OP_SPECS:
        for path, devices in PATHS.items():
            for device in devices:
                marks = [pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")] if device == "cuda" else []
                yield pytest.param(spec, path, device, id=f"{spec.name}-{path}-{device}", marks=marks)


@pytest.fixture(scope="session")
def aoti_packages(tmp_path_factory):
    """One AOTInductor package per device holding every op (compiling one takes about a
    minute on a small CPU), built on first use; a build failure fails each op's aoti tests."""
    built = {}

    def get(device):
        if device not in built:
            specs = [s for s in OP_SPECS if not {"aoti", "aoti_cpp"} <= set(s.unsupported)]
            path = str(tmp_path_factory.mktemp("aoti") / f"ops_{device}.pt2")
            try:
                built[device] = (P.build_aoti_package(specs, device, path), path)
            except Exception as e:
                built[device] = RuntimeError(
                    f"building the AOTInductor package of {[s.name for s in specs]} failed: {e}"
                )
        if isinstance(built[device], Exception):
            raise built[device]
        return built[device]

    return get


def _run(spec, path, device, request):
    P.run_path(
        spec,
        path,
        device,
        aoti_package=lambda: request.getfixturevalue("aoti_packages")(device),
        serve=lambda: request.getfixturevalue("serve"),
    )


@pytest.mark.parametrize("spec,path,device", list(_params()))
def test_path(spec, path, device, request):
    if path in spec.unsupported:
        pytest.skip(f"{spec.name} does not support {path}: {spec.unsupported[path]}")
    try:
        _run(spec, path, device, request)
    except P.NotApplicable as e:
        pytest.skip(str(e))


def _assert_fails(spec, path, request, tmp_path):
    # The op alone in its artifacts: the shared AOTInductor package leaves out an op that
    # declares both aoti paths unsupported. The path runs on the CPU where it can.
    device = "cpu" if "cpu" in PATHS[path] else "cuda"
    if device == "cuda" and not HAS_CUDA:
        pytest.skip(f"{path} runs on CUDA only: needs a CUDA GPU")
    # A spec that is wrong on its own (reference, samples) would make every path fail: check it first.
    P.check_eager(spec, device, quick=True)
    serve = request.getfixturevalue("serve")  # a missing server is this test's failure, not the path's
    enrolled = dataclasses.replace(spec, unsupported={})
    package = {}

    def own_package():
        if not package:
            path = str(tmp_path / "op.pt2")
            package["built"] = (P.build_aoti_package([enrolled], device, path), path)
        return package["built"]

    try:
        P.run_path(enrolled, path, device, aoti_package=own_package, serve=lambda: serve)
    except P.NotApplicable as e:
        pytest.skip(str(e))
    except Exception:
        return
    pytest.fail(
        f"{spec.name} declares {path} unsupported ({spec.unsupported[path]!r}), but it works: "
        "remove the entry from its spec's unsupported"
    )


@pytest.mark.parametrize("spec,path", [pytest.param(s, p, id=f"{s.name}-{p}") for s in OP_SPECS for p in s.unsupported])
def test_unsupported_path_really_fails(spec, path, request, tmp_path):
    _assert_fails(spec, path, request, tmp_path)


def test_a_stale_declaration_is_caught(request, tmp_path):
    sigmoid = next(s for s in OP_SPECS if s.name == "sigmoid")
    pretend = dataclasses.replace(sigmoid, unsupported={"torchscript": "pretend"})
    with pytest.raises(pytest.fail.Exception, match="remove the entry"):
        _assert_fails(pretend, "torchscript", request, tmp_path)


def test_every_op_has_a_spec():
    ops = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("customops::")}
    # Names starting with "_" are the library's own hooks (its build report, the dispatch's
    # choice of CUDA kernel), not ops a model calls: no spec.
    ops = {op for op in ops if not op.startswith("_")}
    assert ops == {s.name for s in OP_SPECS}, "every op in csrc/registration.cpp needs an OpSpec (docs/adding_an_op.md)"


@pytest.mark.parametrize("spec", OP_SPECS, ids=lambda s: s.name)
def test_every_spec_has_its_kernels(spec):
    name = f"customops::{spec.name}"
    keys = ["CPU", "Autograd"] + (["CUDA"] if "CUDA" in customops.compiled_backends() else [])
    missing = [k for k in keys if not torch._C._dispatch_has_kernel_for_dispatch_key(name, k)]
    assert not missing, f"{name} has no {missing} kernel (csrc/ops/<op>/, CUSTOMOPS_LIBRARY_IMPL)"
    assert torch._library.simple_registry.singleton.find(name).fake_impl.kernel is not None, (
        f"{name} has no fake kernel (torch.library.register_fake in customops/ops/<op>.py)"
    )


@pytest.mark.parametrize("spec", OP_SPECS, ids=lambda s: s.name)
def test_every_spec_has_error_inputs(spec):
    assert spec.errors("cpu"), f"{spec.name}: its spec has no error_inputs"


@pytest.mark.parametrize("spec", OP_SPECS, ids=lambda s: s.name)
def test_cuda_kernels_name_real_samples(spec):
    names = {s.name for s in spec.samples("cpu", torch.float32)}
    missing = {k: n for k, n in spec.cuda_kernels.items() if n not in names}
    assert not missing, f"{spec.name}: cuda_kernels names samples it does not have: {missing}"


def test_a_false_gradgrad_declaration_is_caught():
    sigmoid = next(s for s in OP_SPECS if s.name == "sigmoid")
    with pytest.raises(AssertionError, match="supports_gradgrad=False"):
        P.check_autograd(dataclasses.replace(sigmoid, supports_gradgrad=False), "cpu", quick=True)


def test_a_wrong_reference_fails():
    sigmoid = next(s for s in OP_SPECS if s.name == "sigmoid")
    with pytest.raises(AssertionError, match="sigmoid .eager., sample '2d'"):
        P.check_eager(dataclasses.replace(sigmoid, reference=lambda x: x), "cpu")
