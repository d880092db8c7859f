"""Triton Inference Server model repositories for an exported model.

:func:`write_triton_repositories` writes, under ``<out_dir>/triton/``:

* ``pytorch/``: a repository for Triton's PyTorch backend, ``<name>`` (``platform:
  "pytorch_libtorch"``, ``1/model.pt``) and ``<name>_aoti`` (``platform: "torch_aoti"``,
  ``1/model.pt2``), for the Triton container, where the op library comes in through
  ``LD_PRELOAD`` (the backend has no model-config key for a custom op library);
* ``python/``: a repository for Triton's Python backend, ``<name>``, whose ``model.py`` runs
  the TorchScript file through customops' own loader (:func:`customops.export.load_torchscript`),
  for any Triton whose Python environment has torch and customops (``python -m customops.serve``
  serves the same model through PyTriton);
* ``README.md``: the command lines, with this installation's op library.

Each ``config.pbtxt`` comes from a :class:`ModelConfig` (``to_pbtxt``), in the protobuf text
format of Triton's ``inference.ModelConfig``. Inputs are ``INPUT__<i>`` and outputs
``OUTPUT__<i>`` in every model (the PyTorch backend's ordinal names), so one client call fits
all of them.
"""

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ._common import _batch_hint

# Rows per request and per batch that Triton's dynamic batcher forms, by default.
DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_QUEUE_DELAY_US = 1000
REPOSITORY_DIR = "triton"
# The Python backend's config parameter that holds the example inputs' sizes ("3,48,48" per
# input, without the batch where the config batches, joined by '|'): sizes the model is known to
# take, where a dynamic dim (-1) may not take 1 (a strided network's height).
EXAMPLE_DIMS_PARAMETER = "customops_example_dims"
PYTHON_MODEL_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_python_model.py")

_TRITON_DTYPES = {
    torch.float32: "TYPE_FP32",
    torch.float16: "TYPE_FP16",
    torch.bfloat16: "TYPE_BF16",
    torch.float64: "TYPE_FP64",
    torch.int64: "TYPE_INT64",
    torch.int32: "TYPE_INT32",
    torch.int16: "TYPE_INT16",
    torch.int8: "TYPE_INT8",
    torch.uint8: "TYPE_UINT8",
    torch.bool: "TYPE_BOOL",
}


def triton_dtype(dtype: torch.dtype) -> str:
    """Triton's ``DataType`` name for a torch dtype (``torch.float32`` -> ``"TYPE_FP32"``).
    Raises ValueError for dtypes Triton has no type for (complex ones)."""
    if dtype not in _TRITON_DTYPES:
        raise ValueError(f"customops: expected a dtype that Triton has, one of {list(_TRITON_DTYPES)}, got {dtype}")
    return _TRITON_DTYPES[dtype]


def torch_dtype(triton_type: str) -> torch.dtype:
    """The inverse of :func:`triton_dtype`; accepts ``"TYPE_FP32"`` and ``"FP32"``."""
    name = triton_type if triton_type.startswith("TYPE_") else "TYPE_" + triton_type
    for dtype, t in _TRITON_DTYPES.items():
        if t == name:
            return dtype
    raise ValueError(f"customops: unknown Triton data type {triton_type!r}")


@dataclasses.dataclass(frozen=True)
class TensorConfig:
    """One ``input`` or ``output`` entry: ``dims`` without the batch dimension when the model's
    ``max_batch_size`` > 0; -1 marks a dynamic size."""

    name: str
    data_type: str
    dims: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class DynamicBatching:
    """Triton's dynamic batcher: waits up to ``max_queue_delay_microseconds`` for more requests
    to join a batch of at most the model's ``max_batch_size`` rows."""

    max_queue_delay_microseconds: int = DEFAULT_MAX_QUEUE_DELAY_US
    preferred_batch_size: Tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The part of Triton's ``inference.ModelConfig`` that customops writes."""

    name: str
    inputs: Tuple[TensorConfig, ...]
    outputs: Tuple[TensorConfig, ...]
    max_batch_size: int
    platform: Optional[str] = None
    backend: Optional[str] = None
    default_model_filename: Optional[str] = None
    dynamic_batching: Optional[DynamicBatching] = None
    instance_kind: str = "KIND_CPU"  # or KIND_GPU
    instance_count: int = 1
    parameters: Tuple[Tuple[str, str], ...] = ()

    def to_pbtxt(self, comment: str = "") -> str:
        """The protobuf text format of this config, ``comment`` first as ``#`` lines."""
        lines = [f"# {line}".rstrip() for line in comment.splitlines()]
        lines.append(f"name: {_quote(self.name)}")
        if self.platform:
            lines.append(f"platform: {_quote(self.platform)}")
        if self.backend:
            lines.append(f"backend: {_quote(self.backend)}")
        if self.default_model_filename:
            lines.append(f"default_model_filename: {_quote(self.default_model_filename)}")
        lines.append(f"max_batch_size: {self.max_batch_size}")
        for key, tensors in (("input", self.inputs), ("output", self.outputs)):
            for t in tensors:
                dims = ", ".join(str(d) for d in t.dims)
                lines.append(f"{key} {{ name: {_quote(t.name)} data_type: {t.data_type} dims: [ {dims} ] }}")
        if self.dynamic_batching is not None:
            b = self.dynamic_batching
            preferred = "".join(f" preferred_batch_size: {s}" for s in b.preferred_batch_size)
            lines.append(
                f"dynamic_batching {{ max_queue_delay_microseconds: {b.max_queue_delay_microseconds}{preferred} }}"
            )
        lines.append(f"instance_group {{ kind: {self.instance_kind} count: {self.instance_count} }}")
        for key, value in self.parameters:
            lines.append(f"parameters {{ key: {_quote(key)} value: {{ string_value: {_quote(value)} }} }}")
        return "\n".join(lines) + "\n"


def _quote(s: str) -> str:
    # JSON's escapes (\" \\ \n \uXXXX for control characters) are valid in protobuf's text format
    # for the ASCII names used here.
    if not s.isascii():
        raise ValueError(f"customops: expected an ASCII name for a Triton config, got {s!r}")
    return json.dumps(s)


def _leaves(out) -> List[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    raise ValueError(
        "customops: a Triton model repository needs a model that returns a tensor or a tuple of tensors, "
        f"got {type(out)}"
    )


def _grown(t: torch.Tensor, dims: Sequence[int], step) -> torch.Tensor:
    """``t`` with ``step(size)`` more rows at each of ``dims`` (to see which output sizes follow them)."""
    for d in dims:
        if d < t.dim():
            extra = step(t.shape[d])
            t = torch.cat([t, t.narrow(d, 0, 1).expand(*t.shape[:d], extra, *t.shape[d + 1 :])], dim=d)
    return t


# The growths tried: one row, the largest power of two that divides the size (a network of total
# stride 4 takes multiples of 4: 48 -> 64 keeps one), and the size again (behind unpadded strided
# layers, 32 and 33 rows both come out as 7 and 36 as 8: one more row can leave an output size
# as it was).
_GROWTHS = (lambda size: 1, lambda size: size & -size, lambda size: size)


def io_configs(
    model: nn.Module, example_inputs: Sequence[torch.Tensor], dynamic_dims: Sequence[int], batched: bool
) -> Tuple[Tuple[TensorConfig, ...], Tuple[TensorConfig, ...]]:
    """Triton inputs and outputs of ``model``: inputs from the examples (dynamic dims -1), outputs
    from eager runs at the examples' sizes and at larger ones at each dynamic dim (one row more,
    the largest power of two dividing the size more, twice the size; those the model refuses
    are skipped): a size that changes in any is -1. With ``batched``, dims leave out dim 0, which
    every output must share with the inputs (ValueError otherwise)."""
    dims = sorted(set(dynamic_dims))
    grown, error = [], None
    with torch.no_grad():
        first = _leaves(model(*example_inputs))
        for step in _GROWTHS:
            try:
                grown.append(_leaves(model(*(_grown(t, dims, step) for t in example_inputs))))
            except RuntimeError as e:
                error = e
    if not grown:
        raise ValueError(
            f"customops: the model fails with one more row, with the largest power of two that divides the size "
            f"more and at twice the size, at its dynamic dims {dims}, so a Triton config cannot make them dynamic "
            f"({str(error).strip().splitlines()[0]}). " + _batch_hint(example_inputs)
        ) from error
    inputs = tuple(
        TensorConfig(f"INPUT__{i}", triton_dtype(t.dtype), tuple(-1 if d in dims else s for d, s in enumerate(t.shape)))
        for i, t in enumerate(example_inputs)
    )
    outputs = []
    for i, a in enumerate(first):
        shape = tuple(-1 if any(g[i].shape[d] != size for g in grown) else size for d, size in enumerate(a.shape))
        if batched and (a.dim() == 0 or a.shape[0] != example_inputs[0].shape[0] or shape[0] != -1):
            raise ValueError(
                f"customops: output {i} of shape {list(a.shape)} does not have the batch as dim 0 (the inputs' "
                f"{[list(t.shape) for t in example_inputs]}), so Triton cannot batch it; export without the batch "
                "dimension in dynamic_dims for a model config with max_batch_size 0"
            )
        outputs.append(TensorConfig(f"OUTPUT__{i}", triton_dtype(a.dtype), shape))
    if batched:
        inputs = tuple(dataclasses.replace(t, dims=t.dims[1:]) for t in inputs)
        outputs = [dataclasses.replace(t, dims=t.dims[1:]) for t in outputs]
    return inputs, tuple(outputs)


def preload_command(repository: str, library: str) -> str:
    """The tritonserver command line that serves ``repository`` with the op library preloaded."""
    return f"LD_PRELOAD={library} tritonserver --model-repository={repository}"


def _readme(name: str, out_dir: str, library: str, formats: Sequence[str], max_batch_size: int) -> str:
    root = os.path.join(os.path.abspath(out_dir), REPOSITORY_DIR)
    lib_dir, lib_file = os.path.split(library)
    models = [m for m, fmt in ((name, "pt"), (f"{name}_aoti", "pt2")) if fmt in formats]
    return f"""# Triton model repositories for `{name}`

Written by `customops.export`. Inputs are `INPUT__0`, ... and outputs `OUTPUT__0`, ... in every
model; with `max_batch_size` {max_batch_size} the first dimension of each is the batch.

## `pytorch/`: Triton's PyTorch backend (the Triton container, GPU servers)

Models: {", ".join(f"`{m}`" for m in models) or "none (export TorchScript or AOTInductor to get them)"}.
The backend loads a custom op library only through `LD_PRELOAD`, and the library must be
built against the same torch as the backend's libtorch (the container's release notes give
its version). On this machine:

    {preload_command(os.path.join(root, "pytorch"), library)}

In the Triton container (`nvcr.io/nvidia/tritonserver:<yy.mm>-py3`), with the op library's
folder mounted and the backend's libtorch on the library path for the preload:

    docker run --gpus all --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 \\
      -v {os.path.join(root, "pytorch")}:/models -v {lib_dir}:/opt/customops \\
      -e LD_LIBRARY_PATH=/opt/tritonserver/backends/pytorch \\
      -e LD_PRELOAD=/opt/customops/{lib_file} \\
      nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models

`{name}_aoti` runs on the device it was exported for; Triton's `torch_aoti` platform is beta
(release 26.03 and later; its ordinal `INPUT__0` names from 26.05), and it does not batch
requests yet, so that model has `max_batch_size: 0`: each request brings its own batch.

## `python/`: Triton's Python backend (anywhere)

Model `{name}` runs `model.pt` through customops' own loader in the Python backend, whose
Python needs torch and customops installed. `python -m customops.serve {out_dir}` serves the
same model through PyTriton's tritonserver on any machine with `customops[serve]`.
"""


def write_triton_repositories(
    out_dir: str,
    name: str,
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    files: Dict[str, str],
    dynamic_dims: Sequence[int] = (0,),
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_queue_delay_us: int = DEFAULT_MAX_QUEUE_DELAY_US,
) -> str:
    """Writes ``out_dir/triton/`` (module docstring) for the exported ``files`` (``{format:
    path}``, of :func:`customops.export.export_model`); returns its path. Model files are hard
    links to the exported ones where the file system allows, copies otherwise. An existing
    ``triton/`` folder is replaced whole, once the new one is complete. ``max_batch_size``: the
    largest batch (rows) of a request and of a batch that Triton forms; 0 turns batching off.
    Raises ValueError when the model's outputs do not keep the batch as dim 0."""
    from customops import library_path

    batched = max_batch_size > 0 and 0 in dynamic_dims
    if max_batch_size < 0:
        raise ValueError(f"customops: expected max_batch_size >= 0, got {max_batch_size}")
    inputs, outputs = io_configs(model, example_inputs, dynamic_dims, batched)
    full_inputs, full_outputs = io_configs(model, example_inputs, dynamic_dims, batched=False)
    device = next((t.device.type for t in example_inputs), "cpu")
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    batching = DynamicBatching(max_queue_delay_us) if batched else None
    max_batch = max_batch_size if batched else 0
    library = library_path()
    example_dims = "|".join(",".join(str(d) for d in t.shape[1 if batched else 0 :]) for t in example_inputs)
    final = os.path.join(out_dir, REPOSITORY_DIR)
    preload = preload_command(os.path.join(os.path.abspath(final), "pytorch"), library)
    repos = {"pytorch": [], "python": []}
    if "pt" in files:
        repos["pytorch"].append(
            (
                ModelConfig(
                    name,
                    inputs,
                    outputs,
                    max_batch,
                    platform="pytorch_libtorch",
                    dynamic_batching=batching,
                    instance_kind=kind,
                    parameters=(("INFERENCE_MODE", "true"),),
                ),
                {"model.pt": files["pt"]},
                "Triton PyTorch backend, TorchScript. Preload the op library:\n" + preload,
            )
        )
        repos["python"].append(
            (
                ModelConfig(
                    name,
                    inputs,
                    outputs,
                    max_batch,
                    backend="python",
                    dynamic_batching=batching,
                    instance_kind=kind,
                    parameters=(("customops_model_file", "model.pt"), (EXAMPLE_DIMS_PARAMETER, example_dims)),
                ),
                {"model.pt": files["pt"], "model.py": PYTHON_MODEL_SOURCE},
                "Triton Python backend: model.py runs model.pt through customops.export.load_torchscript\n"
                "(the backend's Python needs torch and customops).",
            )
        )
    if "pt2" in files:
        repos["pytorch"].append(
            (
                ModelConfig(f"{name}_aoti", full_inputs, full_outputs, 0, platform="torch_aoti", instance_kind=kind),
                {"model.pt2": files["pt2"]},
                "Triton PyTorch backend, AOTInductor package (torch_aoti: no batching yet, so max_batch_size 0).\n"
                "Preload the op library: " + preload,
            )
        )
    stage = tempfile.mkdtemp(prefix=f".{REPOSITORY_DIR}.", suffix=".tmp", dir=out_dir)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(stage, 0o777 & ~umask)  # mkdtemp's 0700 would hide the repository from a server of another user
    try:
        for repo, models in repos.items():
            os.makedirs(os.path.join(stage, repo))
            for config, model_files, comment in models:
                version = os.path.join(stage, repo, config.name, "1")
                os.makedirs(version)
                with open(os.path.join(stage, repo, config.name, "config.pbtxt"), "w") as f:
                    f.write(config.to_pbtxt(comment))
                for target, source in model_files.items():
                    _link_or_copy(source, os.path.join(version, target))
        with open(os.path.join(stage, "README.md"), "w") as f:
            f.write(_readme(name, out_dir, library, list(files), max_batch))
        old = None
        if os.path.exists(final):
            old = tempfile.mkdtemp(prefix=f".{REPOSITORY_DIR}.old.", dir=out_dir)
            os.replace(final, os.path.join(old, REPOSITORY_DIR))
        os.replace(stage, final)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return final


def _link_or_copy(source: str, target: str) -> None:
    """Hard-links this export's own files where the file system allows, copies the rest: a link
    to customops' model.py would make an edit of the repository's copy an edit of the package."""
    if source != PYTHON_MODEL_SOURCE:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copyfile(source, target)
