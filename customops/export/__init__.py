"""Deployment: write a model that uses customops' ops as TorchScript (``.pt``), an AOTInductor
package (``.pt2``) or ONNX (``.onnx``), and load the first two back.

Every export gets a dynamic batch dimension (dim 0 of each input). Command line::

    python -m customops.export --help

The ONNX translation table that the exporter uses is :data:`ONNX_TRANSLATION_TABLE`
(``customops/export/onnx_translation.py``); pass it to ``torch.onnx.export`` yourself as
``custom_translation_table=`` when you call the exporter directly.
"""

import os
from typing import Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import nn

import customops

FORMATS = ("pt", "pt2", "onnx")
DEFAULT_MAX_BATCH = 1 << 16


def _as_tuple(example_inputs) -> Tuple[torch.Tensor, ...]:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _batch_spec(example_inputs: Sequence[torch.Tensor], max_batch: int):
    """Example inputs with a batch of at least 2 (a batch of 1 would be specialized) and a
    dynamic_shapes spec marking dim 0 of each input as the shared batch dimension."""
    if max_batch < 2:
        raise ValueError(f"customops: expected max_batch >= 2, got {max_batch}")
    if any(t.dim() == 0 or t.shape[0] == 0 for t in example_inputs):
        raise ValueError(
            "customops: expected example inputs with a batch dimension of size >= 1 (dim 0), got shapes "
            f"{[list(t.shape) for t in example_inputs]}"
        )
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    inputs = tuple(t if t.shape[0] >= 2 else t.expand(2, *t.shape[1:]).contiguous() for t in example_inputs)
    return inputs, tuple({0: batch} for _ in inputs)


def _batch_hint(inputs) -> str:
    hint = f"The example inputs' shapes are {[list(t.shape) for t in inputs]}"
    if any(t.dim() == 1 for t in inputs):
        hint += ("; a 1-D input has no batch dimension: give it one, e.g. shape (batch, 64) for a model of "
                 "64 input features (--input-shape 8,64), not (64,)")
    return hint + "."


def export_torchscript(model: nn.Module, example_inputs, path: str, trace: bool = False) -> str:
    """Writes ``model`` as TorchScript: ``torch.jit.script`` (``trace=True``: ``torch.jit.trace``
    on ``example_inputs``, which scripting does not need: pass None). Load it in C++ with ``torch::jit::load`` once the op library is
    loaded, or in Python with :func:`load_torchscript`. Returns ``path``."""
    model = model.eval()
    if trace:
        if example_inputs is None:
            raise ValueError("customops: trace=True needs example_inputs")
        module = torch.jit.trace(model, _as_tuple(example_inputs))
    else:
        module = torch.jit.script(model)
    module.save(path)
    return path


def export_aoti(model: nn.Module, example_inputs, path: str, max_batch: int = DEFAULT_MAX_BATCH) -> str:
    """Writes an AOTInductor package (``.pt2``): ``torch.export.export`` with a dynamic batch
    dimension (1..``max_batch``), then ``torch._inductor.aoti_compile_and_package``. The package
    is compiled for the device of ``example_inputs``. Load it with
    ``torch::inductor::AOTIModelPackageLoader`` (C++) or :func:`load_aoti`. Returns the path.
    Raises ValueError when the model fixes dim 0 of an input (a 1-D example input, for one)."""
    inputs, dynamic_shapes = _batch_spec(_as_tuple(example_inputs), max_batch)
    try:
        program = torch.export.export(model.eval(), inputs, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch._dynamo.exc.UserError; its type moves between torch versions
        if "Constraints violated (batch)" not in str(e):
            raise
        raise ValueError(
            "customops: the model fixes dim 0 of an input, which export makes the dynamic batch dimension. "
            + _batch_hint(inputs) + f"\n(torch.export: {str(e).splitlines()[0]})"
        ) from e
    # The batch is exported as 1..max_batch, but torch.export treats 0 and 1 specially and
    # records a lower bound of 2; the packages' runtime input checks (which customops' loaders
    # turn on) would then refuse a batch of 1, which the compiled code handles.
    return torch._inductor.aoti_compile_and_package(
        program, package_path=os.fspath(path), inductor_configs={"aot_inductor.check_lowerbound": False}
    )


def export_onnx(model: nn.Module, example_inputs, path: str, max_batch: int = DEFAULT_MAX_BATCH) -> str:
    """Writes ONNX through ``torch.onnx.export(dynamo=True)`` with customops' translation table:
    standard-domain ops only, a dynamic batch dimension, runnable in a stock onnxruntime.
    Needs ``onnx`` and ``onnxscript``. Returns ``path``."""
    from .onnx_translation import ONNX_TRANSLATION_TABLE

    inputs, dynamic_shapes = _batch_spec(_as_tuple(example_inputs), max_batch)
    program = torch.onnx.export(
        model.eval(),
        inputs,
        dynamo=True,
        custom_translation_table=ONNX_TRANSLATION_TABLE,
        dynamic_shapes=dynamic_shapes,
        optimize=True,
        verbose=False,
    )
    program.save(os.fspath(path))
    # The exporter may fall back to a static batch where torch.export would refuse (e.g. a
    # model that adds a fixed-size buffer): an ONNX file with a fixed batch is not what was asked.
    import onnx

    for graph_input in onnx.load(os.fspath(path), load_external_data=False).graph.input:
        dim0 = graph_input.type.tensor_type.shape.dim[0] if graph_input.type.tensor_type.shape.dim else None
        if dim0 is None or not dim0.dim_param:
            os.remove(os.fspath(path))
            raise ValueError(
                f"customops: the model's input {graph_input.name!r} cannot have a dynamic batch dimension "
                "(dim 0); the model fixes it (check with torch.export.export and dynamic_shapes). "
                + _batch_hint(inputs)
            )
    return path


def export_model(
    model: nn.Module,
    example_inputs,
    out_dir: str,
    name: str = "model",
    formats: Iterable[str] = FORMATS,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> Dict[str, str]:
    """Writes ``out_dir/name.{pt,pt2,onnx}`` for the formats asked; returns ``{format: path}``."""
    if isinstance(formats, str):
        formats = (formats,)
    os.makedirs(out_dir, exist_ok=True)
    writers = {
        "pt": lambda p: export_torchscript(model, None, p),
        "pt2": lambda p: export_aoti(model, example_inputs, p, max_batch),
        "onnx": lambda p: export_onnx(model, example_inputs, p, max_batch),
    }
    paths = {}
    for fmt in formats:
        if fmt not in writers:
            raise ValueError(f"customops: unknown export format {fmt!r}; expected one of {FORMATS}")
        paths[fmt] = writers[fmt](os.path.join(out_dir, f"{name}.{fmt}"))
    return paths


def aoti_python_loading_works() -> bool:
    """Whether this torch's Python AOTInductor loader can be trusted. Seen 2026-11-29 on the
    H200 machine: torch 2.11's aoti_load_package segfaults even for a plain nn.Linear package,
    while torch 2.13 and 2.14 load packages on the CPU. Where it cannot, check packages with
    the C++ loader (export/cpp/customops_serve)."""
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


def _check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"customops: model file {path!r} does not exist")


def load_torchscript(path: str, map_location: Optional[str] = None) -> torch.jit.ScriptModule:
    """Loads a TorchScript file whose graph uses customops' ops (the op library is loaded
    first). Raises FileNotFoundError for a missing file and RuntimeError naming the file for
    one that is not a TorchScript archive."""
    _check_file(path)
    customops.load_library()
    try:
        return torch.jit.load(path, map_location=map_location)
    except RuntimeError as e:
        raise RuntimeError(f"customops: could not load TorchScript model {path!r}: {e}") from e


def load_aoti(path: str):
    """Loads an AOTInductor package whose graph uses customops' ops (the op library is loaded
    first); returns a callable that takes the exported model's inputs, of any strides
    (non-contiguous tensors run as contiguous copies when the package expects row-major
    inputs, as :func:`export_aoti`'s packages do); the loader's own object is its ``package``
    attribute. Raises FileNotFoundError / RuntimeError as :func:`load_torchscript`; the callable
    raises RuntimeError naming the inputs' shapes and dtypes when the package refuses them."""
    _check_file(path)
    customops.load_library()
    # Packages check input shapes and dtypes only when this is set (read once per process);
    # without it a wrong-shaped input reads out of bounds.
    os.environ.setdefault("AOTI_RUNTIME_CHECK_INPUTS", "1")
    try:
        package = torch._inductor.aoti_load_package(path)
    except Exception as e:  # the loader raises several types for a bad archive
        raise RuntimeError(f"customops: could not load AOTInductor package {path!r}: {e}") from e

    def call(*args, **kwargs):
        # A package checks its inputs' strides against the example it was exported with
        # (row-major from this module's exporters), where TorchScript takes any strides: so
        # non-contiguous inputs run as contiguous copies first, and as given if the package
        # refuses those (it was exported with other strides).
        if all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor)):
            return package(*args, **kwargs)
        try:
            return package(*(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
        except RuntimeError:
            return package(*args, **kwargs)

    def run(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except RuntimeError as e:
            # The package's own check names only a dimension index ("unmatched dim value at 1").
            given = [(list(a.shape), str(a.dtype).removeprefix("torch.")) for a in args if isinstance(a, torch.Tensor)]
            raise RuntimeError(
                f"customops: AOTInductor package {path!r} refused inputs of (shape, dtype) {given}: {e}"
            ) from e

    run.package = package  # the loader's own object (metadata, call spec)
    return run


def __getattr__(name):
    # The translation table imports onnxscript: only on demand.
    if name == "ONNX_TRANSLATION_TABLE":
        from .onnx_translation import ONNX_TRANSLATION_TABLE

        return ONNX_TRANSLATION_TABLE
    raise AttributeError(name)


__all__ = [
    "FORMATS",
    "aoti_python_loading_works",
    "ONNX_TRANSLATION_TABLE",
    "export_aoti",
    "export_model",
    "export_onnx",
    "export_torchscript",
    "load_aoti",
    "load_torchscript",
]
