"""Deployment: write a model that uses customops' ops as TorchScript (``.pt``), an AOTInductor
package (``.pt2``) or ONNX (``.onnx``), and load the first two back.

Every export gets a dynamic batch dimension (dim 0 of each input, 1..``max_batch``); other
dimensions are made dynamic with ``dynamic_dims=`` (each 1..``max_dim``, from the smallest minimum
torch.export accepts where it needs one: 2^k + 1 behind layers of total stride 2^k, 4 for an
unpadded 3x3 layer; an offsets input's sizes
tied to the input's as torch suggests). The model is exported in eval mode and left in the mode it
was in. Files are written
under a temporary name next to the target and renamed into place once complete, so a failed
export leaves no partial file. Command line::

    python -m customops.export --help

The ONNX translation table that the exporter uses is :data:`ONNX_TRANSLATION_TABLE`
(``customops/export/onnx_translation.py``); pass it to ``torch.onnx.export`` yourself as
``custom_translation_table=`` when you call the exporter directly, with
``opset_version=ONNX_OPSET`` (19: the standard ``DeformConv`` needs it).

Beside the files, :func:`export_model` writes Triton Inference Server model repositories
(``triton/``: the PyTorch backend's and the Python backend's; ``customops/export/triton.py``).
"""

import os
import shutil
import tempfile
from typing import Dict, Iterable, Sequence

from torch import nn

from . import triton as _triton
from ._common import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_DIM,
    FORMATS,
    INPUT_DIMS_METADATA_KEY,
    INPUTS_METADATA_KEY,
    _as_tuple,
    _publish,
)
from .aoti import export_aoti, load_aoti
from .onnx import export_onnx
from .torchscript import export_torchscript, load_torchscript


def export_model(
    model: nn.Module,
    example_inputs,
    out_dir: str,
    name: str = "model",
    formats: Iterable[str] = FORMATS,
    max_batch: int = DEFAULT_MAX_BATCH,
    dynamic_dims: Sequence[int] = (0,),
    max_dim: int = DEFAULT_MAX_DIM,
    triton: bool = True,
    triton_max_batch_size: int = _triton.DEFAULT_MAX_BATCH_SIZE,
) -> Dict[str, str]:
    """Writes ``out_dir/name.{pt,pt2,onnx}`` for the formats asked; returns ``{format: path}``,
    and with ``triton`` (when TorchScript or AOTInductor is among the formats) the Triton model
    repositories' folder ``out_dir/triton`` as ``"triton"`` (``customops.export.triton``; requests
    and Triton's batches of at most ``triton_max_batch_size`` rows, 0 for no batching).

    ``example_inputs``: a tensor or a tuple of tensors. ``dynamic_dims``: the dims left
    dynamic; dim 0 is the batch, shared by all inputs, 1..``max_batch``; any other dim d is
    dynamic (1..``max_dim``, or from the minimum torch.export needs) in every input of more
    than d dims. Example inputs of size 1 at a
    dynamic dim are exported at size 2. The files appear only when every format has been
    written: if one fails, its error is raised and none of this call's files are left (files of
    an earlier call stay as they were). Raises ValueError, leaving no file, when ``triton``
    is asked and an output does not keep the batch as dim 0."""
    if isinstance(formats, str):
        formats = (formats,)
    formats = list(formats)
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"customops: unknown export format {fmt!r}; expected one of {FORMATS}")
    triton = triton and any(f in formats for f in ("pt", "pt2"))
    os.makedirs(out_dir, exist_ok=True)
    shape_args = dict(max_batch=max_batch, dynamic_dims=dynamic_dims, max_dim=max_dim)
    writers = {
        "pt": lambda p: export_torchscript(model, None, p),
        "pt2": lambda p: export_aoti(model, example_inputs, p, **shape_args),
        "onnx": lambda p: export_onnx(model, example_inputs, p, **shape_args),
    }
    files = {fmt: f"{name}.{fmt}" for fmt in formats}
    stage = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir)
    try:
        for fmt in formats:
            writers[fmt](os.path.join(stage, files[fmt]))
        if triton:  # the outputs' check, before any file appears
            batched = triton_max_batch_size > 0 and 0 in dynamic_dims
            _triton.io_configs(model, _as_tuple(example_inputs), dynamic_dims, batched)
        _publish(stage, out_dir, last=tuple(files.values()))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    paths = {fmt: os.path.join(out_dir, f) for fmt, f in files.items()}
    if triton:
        paths["triton"] = _triton.write_triton_repositories(
            out_dir, name, model, _as_tuple(example_inputs), paths, dynamic_dims, triton_max_batch_size
        )
    return paths


def __getattr__(name):
    # The translation table imports onnxscript: only on demand.
    if name == "ONNX_TRANSLATION_TABLE":
        from .onnx_translation import ONNX_TRANSLATION_TABLE

        return ONNX_TRANSLATION_TABLE
    raise AttributeError(name)


__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_DIM",
    "FORMATS",
    "INPUT_DIMS_METADATA_KEY",
    "INPUTS_METADATA_KEY",
    "ONNX_TRANSLATION_TABLE",
    "export_aoti",
    "export_model",
    "export_onnx",
    "export_torchscript",
    "load_aoti",
    "load_torchscript",
]
