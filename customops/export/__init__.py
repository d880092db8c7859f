"""Deployment: write a model that uses customops' ops as TorchScript (``.pt``), an AOTInductor
package (``.pt2``) or ONNX (``.onnx``), and load the first two back.

Every export gets a dynamic batch dimension (dim 0 of each input, 1..``max_batch``); other
dimensions are made dynamic with ``dynamic_dims=`` (each 1..``max_dim``). Files are written
under a temporary name next to the target and renamed into place once complete, so a failed
export leaves no partial file. Command line::

    python -m customops.export --help

The ONNX translation table that the exporter uses is :data:`ONNX_TRANSLATION_TABLE`
(``customops/export/onnx_translation.py``); pass it to ``torch.onnx.export`` yourself as
``custom_translation_table=`` when you call the exporter directly.
"""

import contextlib
import logging
import os
import re
import shutil
import tempfile
import warnings
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

import customops

FORMATS = ("pt", "pt2", "onnx")
DEFAULT_MAX_BATCH = 1 << 16
# Upper bound of each dynamic dimension other than the batch (a sequence length, say); the
# exporters' max_dim= raises it.
DEFAULT_MAX_DIM = 1 << 16
# The key of an AOTInductor package's metadata under which export_aoti records its inputs:
# one "dtype:dim,dim,..." entry per input, joined by '|', where a dim is a fixed size ("12")
# or a dynamic range ("1-65536"); e.g. "float32:1-65536,12". customops_serve parses it too.
INPUTS_METADATA_KEY = "customops_inputs"


def _as_tuple(example_inputs) -> Tuple[torch.Tensor, ...]:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dynamic_spec(example_inputs: Sequence[torch.Tensor], dynamic_dims: Sequence[int], max_batch: int, max_dim: int):
    """Returns (inputs, dynamic_shapes, ranges) for torch.export.

    inputs: the examples, row-major, with size 2 at each dynamic dim where they have 1 (a size
    of 1 would be specialized). dynamic_shapes: dim 0 of every input is the shared ``batch``
    Dim (1..max_batch); every other dim d in ``dynamic_dims`` is its own Dim (1..max_dim) in each
    input of more than d dims. ranges: per input, ``{dim: (min, max)}``. Raises ValueError for
    a bad ``dynamic_dims`` or examples without the dims asked for."""
    if isinstance(dynamic_dims, int):
        dynamic_dims = (dynamic_dims,)
    if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in dynamic_dims):
        raise ValueError(f"customops: expected dynamic_dims to be dimension indices >= 0, got {list(dynamic_dims)}")
    dims = sorted(set(dynamic_dims))
    if 0 in dims and max_batch < 2:
        raise ValueError(f"customops: expected max_batch >= 2, got {max_batch}")
    if any(d > 0 for d in dims) and max_dim < 2:
        raise ValueError(f"customops: expected max_dim >= 2, got {max_dim}")
    shapes = [list(t.shape) for t in example_inputs]
    if 0 in dims and any(t.dim() == 0 or t.shape[0] == 0 for t in example_inputs):
        raise ValueError(
            f"customops: expected example inputs with a batch dimension of size >= 1 (dim 0), got shapes {shapes}"
        )
    for d in dims:
        if d > 0 and not any(t.dim() > d for t in example_inputs):
            raise ValueError(f"customops: dynamic dim {d} asked for, but no example input has it; shapes {shapes}")
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    inputs, dynamic_shapes, ranges = [], [], []
    for i, t in enumerate(example_inputs):
        own = [d for d in dims if d < t.dim()]
        if any(t.shape[d] == 0 for d in own):
            raise ValueError(f"customops: example input {i} of shape {list(t.shape)} has size 0 at a dynamic dim {own}")
        spec = {d: batch if d == 0 else torch.export.Dim(f"input{i}_dim{d}", min=1, max=max_dim) for d in own}
        inputs.append(t.expand(*(2 if d in own and s == 1 else -1 for d, s in enumerate(t.shape))).contiguous())
        dynamic_shapes.append(spec or None)
        ranges.append({d: (1, max_batch if d == 0 else max_dim) for d in own})
    return tuple(inputs), tuple(dynamic_shapes), ranges


def _batch_hint(inputs) -> str:
    hint = f"The example inputs' shapes are {[list(t.shape) for t in inputs]}"
    if any(t.dim() == 1 for t in inputs):
        hint += (
            "; a 1-D input has no batch dimension: give it one, e.g. shape (batch, 64) for a model of "
            "64 input features (--input-shape 8,64), not (64,)"
        )
    return hint + "."


def _describe_dim(name: str) -> str:
    if name == "batch":
        return "dim 0 of an input, which export makes the dynamic batch dimension"
    m = re.fullmatch(r"input(\d+)_dim(\d+)", name)
    return f"dim {m.group(2)} of input {m.group(1)}, which dynamic_dims makes dynamic" if m else name


def _export_program(model: nn.Module, inputs, dynamic_shapes):
    """torch.export.export; a dynamic dim that the model fixes becomes a ValueError naming it."""
    try:
        with _quiet_export():
            return torch.export.export(model.eval(), inputs, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch._dynamo.exc.UserError; its type moves between torch versions
        violated = re.search(r"Constraints violated \(([^)]*)\)", str(e))
        if violated is None:
            raise
        where = "; ".join(_describe_dim(n.strip()) for n in violated.group(1).split(","))
        raise ValueError(
            f"customops: the model fixes {where}. "
            + _batch_hint(inputs)
            + f"\n(torch.export: {str(e).splitlines()[0]})"
        ) from e


# --- writing files whole ------------------------------------------------------------------------


def _publish(stage: str, folder: str, last: Sequence[str] = ()) -> None:
    """Moves every file in ``stage`` into ``folder`` (os.replace: each rename is atomic), the
    names in ``last`` after the rest, so a model file never appears before its external data."""
    names = [n for n in os.listdir(stage) if os.path.isfile(os.path.join(stage, n))]
    for n in sorted(names, key=lambda n: (n in last, n)):
        os.replace(os.path.join(stage, n), os.path.join(folder, n))


@contextlib.contextmanager
def _staged(path: str) -> Iterator[str]:
    """Yields a path of ``path``'s file name in a new hidden folder next to it. When the block
    succeeds, everything written there (the file and any files beside it, such as ONNX
    external data, which the file refers to by name) is renamed into ``path``'s folder; either
    way the hidden folder is removed, so a failed write leaves nothing behind."""
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    stage = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        yield os.path.join(stage, name)
        _publish(stage, folder, last=(name,))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


# --- quieting torch --------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_export() -> Iterator[None]:
    """Hides a deprecation notice that torch.export raises from its own pytree code (torch 2.11
    to 2.14: "`isinstance(treespec, LeafSpec)` is deprecated"): nothing a caller can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
        )
        yield


@contextlib.contextmanager
def _quiet_torchscript() -> Iterator[None]:
    """Hides torch's deprecation notices for torch.jit.script/trace/save/load (a FutureWarning
    or DeprecationWarning, by torch version): TorchScript is a supported format here."""
    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning):
            warnings.filterwarnings(
                "ignore", message=r"`torch\.jit\.\w+` (is deprecated|is not supported)", category=category
            )
        yield


@contextlib.contextmanager
def _quiet_onnx_registration() -> Iterator[None]:
    """Silences torch.onnx's per-export warnings that torchvision's ops are skipped because
    torchvision is not installed (not an error for models that do not use them)."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# --- exporters -------------------------------------------------------------------------------


def export_torchscript(model: nn.Module, example_inputs, path: str, trace: bool = False) -> str:
    """Writes ``model`` as TorchScript: ``torch.jit.script`` (``trace=True``: ``torch.jit.trace``
    on ``example_inputs``, which scripting does not need: pass None). Scripted models take any
    input shape. Load it in C++ with ``torch::jit::load`` once the op library is loaded, or in
    Python with :func:`load_torchscript`. Returns ``path``; nothing is written if it fails."""
    model = model.eval()
    with _quiet_torchscript():
        if trace:
            if example_inputs is None:
                raise ValueError("customops: trace=True needs example_inputs")
            module = torch.jit.trace(model, _as_tuple(example_inputs))
        else:
            module = torch.jit.script(model)
        with _staged(path) as tmp:
            module.save(tmp)
    return path


def _inputs_metadata(inputs: Sequence[torch.Tensor], ranges) -> str:
    """The :data:`INPUTS_METADATA_KEY` entry for ``inputs`` with dynamic ``ranges``."""
    return "|".join(
        _dtype_name(t.dtype)
        + ":"
        + ",".join(f"{r[d][0]}-{r[d][1]}" if d in r else str(s) for d, s in enumerate(t.shape))
        for t, r in zip(inputs, ranges)
    )


def export_aoti(
    model: nn.Module,
    example_inputs,
    path: str,
    max_batch: int = DEFAULT_MAX_BATCH,
    dynamic_dims: Sequence[int] = (0,),
    max_dim: int = DEFAULT_MAX_DIM,
) -> str:
    """Writes an AOTInductor package (``.pt2``): ``torch.export.export`` with dynamic dims as
    in :func:`export_model`, then ``torch._inductor.aoti_compile_and_package``. The package is
    compiled for the device of ``example_inputs`` and takes row-major inputs; it records the
    inputs' dtypes and sizes in its metadata (:data:`INPUTS_METADATA_KEY`), which
    :func:`load_aoti` and customops_serve check inputs against. Load it with
    ``torch::inductor::AOTIModelPackageLoader`` (C++) or :func:`load_aoti`. Returns ``path``;
    nothing is written if it fails. Raises ValueError when the model fixes a dim asked to be
    dynamic (dim 0 of a 1-D example input, for one)."""
    inputs, dynamic_shapes, ranges = _dynamic_spec(_as_tuple(example_inputs), dynamic_dims, max_batch, max_dim)
    program = _export_program(model, inputs, dynamic_shapes)
    configs = {
        # torch.export records a lower bound of 2 for a dim exported as 1..n (it treats 0 and 1
        # specially); AOTInductor's own input checks (AOTI_RUNTIME_CHECK_INPUTS=1, for whoever
        # sets it) would then refuse a size of 1, which the compiled code handles.
        "aot_inductor.check_lowerbound": False,
        "aot_inductor.metadata": {INPUTS_METADATA_KEY: _inputs_metadata(inputs, ranges)},
    }
    # Inductor's first import defines torch.utils.mkldnn's TorchScript methods, which warn.
    with _staged(path) as tmp, _quiet_torchscript(), _quiet_export():
        torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=configs)
    return os.fspath(path)


def export_onnx(
    model: nn.Module,
    example_inputs,
    path: str,
    max_batch: int = DEFAULT_MAX_BATCH,
    dynamic_dims: Sequence[int] = (0,),
    max_dim: int = DEFAULT_MAX_DIM,
) -> str:
    """Writes ONNX through ``torch.onnx.export(dynamo=True)`` with customops' translation table:
    standard-domain ops only, dynamic dims as in :func:`export_model`, runnable in a stock
    onnxruntime. Needs ``onnx`` and ``onnxscript``. Returns ``path`` (large models also write
    external data beside it); nothing is written if it fails. Raises ValueError when the
    exported graph fixes a dim asked to be dynamic."""
    import onnx

    from .onnx_translation import ONNX_TRANSLATION_TABLE

    inputs, dynamic_shapes, ranges = _dynamic_spec(_as_tuple(example_inputs), dynamic_dims, max_batch, max_dim)
    with _quiet_onnx_registration(), _quiet_export():
        program = torch.onnx.export(
            model.eval(),
            inputs,
            dynamo=True,
            custom_translation_table=ONNX_TRANSLATION_TABLE,
            dynamic_shapes=dynamic_shapes,
            optimize=True,
            verbose=False,
        )
    with _staged(path) as tmp:
        program.save(tmp)
        # The exporter may fall back to static sizes where torch.export would refuse (e.g. a
        # model that adds a fixed-size buffer): an ONNX file with fixed sizes is not what was asked.
        graph = onnx.load(tmp, load_external_data=False).graph
        for graph_input, r in zip(graph.input, ranges):
            shape = graph_input.type.tensor_type.shape.dim
            for d in r:
                if d >= len(shape) or not shape[d].dim_param:
                    what = "a dynamic batch dimension (dim 0)" if d == 0 else f"a dynamic dim {d}"
                    raise ValueError(
                        f"customops: the model's input {graph_input.name!r} cannot have {what}; the model "
                        "fixes it (check with torch.export.export and dynamic_shapes). " + _batch_hint(inputs)
                    )
    return path


def export_model(
    model: nn.Module,
    example_inputs,
    out_dir: str,
    name: str = "model",
    formats: Iterable[str] = FORMATS,
    max_batch: int = DEFAULT_MAX_BATCH,
    dynamic_dims: Sequence[int] = (0,),
    max_dim: int = DEFAULT_MAX_DIM,
) -> Dict[str, str]:
    """Writes ``out_dir/name.{pt,pt2,onnx}`` for the formats asked; returns ``{format: path}``.

    ``example_inputs``: a tensor or a tuple of tensors. ``dynamic_dims``: the dims left
    dynamic; dim 0 is the batch, shared by all inputs, 1..``max_batch``; any other dim d is
    dynamic (1..``max_dim``) in every input of more than d dims. Example inputs of size 1 at a
    dynamic dim are exported at size 2. The files appear only when every format has been
    written: if one fails, its error is raised and none of this call's files are left (files of
    an earlier call stay as they were)."""
    if isinstance(formats, str):
        formats = (formats,)
    formats = list(formats)
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"customops: unknown export format {fmt!r}; expected one of {FORMATS}")
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
        _publish(stage, out_dir, last=tuple(files.values()))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {fmt: os.path.join(out_dir, f) for fmt, f in files.items()}


def aoti_python_loading_works() -> bool:
    """Whether this torch's Python AOTInductor loader can be trusted. Seen 2026-11-29 on the
    H200 machine: torch 2.11's aoti_load_package segfaults even for a plain nn.Linear package,
    while torch 2.13 and 2.14 load packages on the CPU. Where it cannot, check packages with
    the C++ loader (customops_serve)."""
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


# --- loaders ---------------------------------------------------------------------------------


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
        with _quiet_torchscript():
            return torch.jit.load(path, map_location=map_location)
    except RuntimeError as e:
        raise RuntimeError(f"customops: could not load TorchScript model {path!r}: {e}") from e


def _parse_inputs_metadata(text: str) -> List[Tuple[str, List[Tuple[int, int]]]]:
    """:data:`INPUTS_METADATA_KEY`'s value as ``[(dtype name, [(min, max) per dim])]``."""
    spec = []
    for entry in text.split("|") if text else []:
        dtype, _, dims = entry.partition(":")
        sizes = []
        for dim in dims.split(",") if dims else []:
            low, _, high = dim.partition("-")
            sizes.append((int(low), int(high or low)))
        spec.append((dtype, sizes))
    return spec


def _describe(dtype: str, sizes: Sequence[Tuple[int, int]]) -> str:
    dims = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in sizes)
    return f"dtype {dtype} and shape [{dims}]"


def _check_inputs(path: str, spec, tensors: Sequence[torch.Tensor]) -> None:
    if len(tensors) != len(spec):
        raise RuntimeError(
            f"customops: AOTInductor package {path!r} takes {len(spec)} tensor inputs, got {len(tensors)}"
        )
    for i, (t, (dtype, sizes)) in enumerate(zip(tensors, spec)):
        if (
            _dtype_name(t.dtype) != dtype
            or t.dim() != len(sizes)
            or any(not lo <= s <= hi for s, (lo, hi) in zip(t.shape, sizes))
        ):
            raise RuntimeError(
                f"customops: AOTInductor package {path!r} refused input {i} of shape {list(t.shape)} and dtype "
                f"{_dtype_name(t.dtype)}: it expects {_describe(dtype, sizes)}"
            )


def load_aoti(path: str):
    """Loads an AOTInductor package whose graph uses customops' ops (the op library is loaded
    first); returns a callable that takes the exported model's inputs. For a package from
    :func:`export_aoti` the callable checks each input's dtype, rank and sizes against the
    ones recorded at export and runs it as a contiguous copy where it is not (any strides work,
    as with TorchScript); a package without that record (made with torch's own
    ``aoti_compile_and_package``) gets its inputs as given, unchecked, as torch's loader does.
    The loader's own object is the callable's ``package`` attribute. Raises FileNotFoundError /
    RuntimeError as :func:`load_torchscript`; the callable raises RuntimeError naming the input,
    its shape and dtype and what the package expects, or, for errors the package itself
    raises, all inputs' shapes and dtypes."""
    _check_file(path)
    customops.load_library()
    try:
        package = torch._inductor.aoti_load_package(path)
    except Exception as e:  # the loader raises several types for a bad archive
        raise RuntimeError(f"customops: could not load AOTInductor package {path!r}: {e}") from e
    recorded = package.get_metadata().get(INPUTS_METADATA_KEY)
    # AOTInductor checks nothing unless AOTI_RUNTIME_CHECK_INPUTS=1 is set process-wide, and
    # that check refuses size 1 at dims that torch's own packages export as dynamic: so
    # packages are checked here, against what export_aoti recorded.
    try:
        spec = None if recorded is None else _parse_inputs_metadata(recorded)
    except ValueError as e:
        raise RuntimeError(
            f"customops: AOTInductor package {path!r} has malformed {INPUTS_METADATA_KEY} metadata {recorded!r}"
        ) from e

    def run(*args, **kwargs):
        if spec is not None:
            _check_inputs(path, spec, [a for a in args if isinstance(a, torch.Tensor)])
            # The compiled code indexes inputs as the row-major examples were laid out.
            args = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)
        try:
            return package(*args, **kwargs)
        except RuntimeError as e:
            given = [(list(a.shape), _dtype_name(a.dtype)) for a in args if isinstance(a, torch.Tensor)]
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
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_DIM",
    "FORMATS",
    "INPUTS_METADATA_KEY",
    "ONNX_TRANSLATION_TABLE",
    "export_aoti",
    "export_model",
    "export_onnx",
    "export_torchscript",
    "load_aoti",
    "load_torchscript",
]
