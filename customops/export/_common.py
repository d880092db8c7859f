"""What the exporters share: the dynamic-shape spec, staged (atomic) writes, and quiet
wrappers around torch's exporters."""

import contextlib
import itertools
import logging
import os
import re
import shutil
import tempfile
import warnings
from typing import Iterator, Sequence, Tuple

import torch
from torch import nn

FORMATS = ("pt", "pt2", "onnx")
# The batch's upper bound: 65535, not 65536, because torch's CUDA paths branch there (cuDNN's
# inference BatchNorm takes at most 65535 rows), so a wider range fails to export a CUDA model.
DEFAULT_MAX_BATCH = 65535
# Upper bound of each dynamic dimension other than the batch (a sequence length, say); the
# exporters' max_dim= raises it.
DEFAULT_MAX_DIM = 1 << 16
# The key of an AOTInductor package's metadata under which export_aoti records its inputs:
# one "dtype:dim,dim,..." entry per input, joined by '|', where a dim is a fixed size ("12")
# or a dynamic range ("1-65535"); e.g. "float32:1-65535,12". customops_serve parses it too.
INPUTS_METADATA_KEY = "customops_inputs"
# The sizes of the exported program's inputs as torch.export traced them: per input, "dim,dim,..."
# joined by '|', a dim a fixed size or a symbolic size ("s0", "s1 - 2"). Dims of one symbol are
# tied (the batch of every input, a suggested fix's equal dims): load_aoti checks that the given
# sizes agree, which the compiled code assumes (it sizes its loops from one input's dims).
INPUT_DIMS_METADATA_KEY = "customops_input_dims"


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


# The first line of the error that torch.jit's interpreter raises for an exception inside a
# TorchScript model: two tracebacks follow, the original exception's own line last.
_SCRIPT_ERROR_HEAD = "The following operation failed in the TorchScript interpreter."


def one_line_error(e: BaseException, with_type: bool = False) -> str:
    """``e``'s message as one line for a command line or an error response: for an exception
    inside a TorchScript model, the original exception's (its type always named: "RuntimeError:
    customops: expected ..."); else the first line that says something (torch's messages may start
    with one that ends in a colon, or with an empty one), after ``e``'s type with ``with_type``."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if lines and lines[0] == _SCRIPT_ERROR_HEAD:
        for i in range(len(lines) - 1, 0, -1):
            if re.match(r"[A-Za-z_][\w.]*(Error|Exception): ", lines[i]):
                return " ".join(lines[i:])
    prefix = f"{type(e).__name__}: " if with_type else ""
    for i, line in enumerate(lines):
        if not line.endswith(":") or i + 1 == len(lines):
            return prefix + " ".join(lines[: i + 1])
    return type(e).__name__


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """The model in eval mode for the block, each module's training flag restored after it (an
    export mid-training leaves BatchNorm and Dropout as they were)."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in flags:
            m.training = training


def _export_program(model: nn.Module, inputs, dynamic_shapes, ranges):
    """torch.export.export of ``model`` in eval mode. Returns (program, ranges): ``ranges`` as
    torch.export accepted them. torch's suggested fixes (a dim equal to another, a narrower range)
    are applied. A dynamic dim whose guards need a larger minimum than torch suggests (a layer
    whose output would be one pixel, which torch.export specialises) gets the smallest minimum that
    torch.export accepts (_MinimumSearch). A dim the model fixes (or that needs a minimum above its
    example's size) becomes a ValueError naming it, with torch's explanation."""
    spec, search, accepted = dynamic_shapes, _MinimumSearch(inputs), None
    for _ in range(128):
        try:
            with _quiet_export(), _eval_mode(model):
                program = torch.export.export(model, inputs, dynamic_shapes=spec)
        except Exception as e:  # torch._dynamo.exc.UserError; its type moves between torch versions
            msg = str(e)
            violated = re.search(r"Constraints violated \(([^)]*)\)", msg)
            if violated is None:
                raise
            names = [n.strip() for n in violated.group(1).split(",")]
            refined = _apply_suggested_fixes(msg, spec)
            if refined is not None and not _specialized(refined, spec):
                spec = refined
                continue
            raised = None if refined is not None else search.rejected(spec, names)
            if raised is None:
                where = "; ".join(_describe_dim(n) for n in names)
                detail = "\n".join(line for line in msg.splitlines()[:12] if line.strip())
                raise ValueError(
                    f"customops: the model fixes {where}, or ties it to another input's size. "
                    + _batch_hint(inputs)
                    + f"\n(torch.export: {detail})"
                ) from e
            if accepted is not None and _minima(raised) == _minima(accepted[1]):
                return accepted[0], _spec_ranges(accepted[1], ranges)
            spec = raised
            continue
        accepted = program, spec
        lower = search.accepted(spec)
        if lower is None:
            return program, _spec_ranges(spec, ranges)
        spec = lower
    raise ValueError(f"customops: torch.export kept refusing the dynamic dims {ranges}")


class _MinimumSearch:
    """The smallest minimum of each dynamic dim that torch.export accepts, where a guard that
    torch suggests no fix for (``H - 2 != 1``: an output of one pixel would be specialised) rules
    values out. Such a dim's minimum doubles (2, 3, 5, 9, ...; a network of total stride 2^k
    exports from 2^k + 1), capped at its example's size, until torch.export accepts it; then one
    less is tried, then the rest bisected, down to the smallest accepted. This assumes that a
    minimum above an accepted one is accepted too, which holds where output sizes grow with the
    input's (convolutions, pooling)."""

    def __init__(self, inputs):
        self.inputs = inputs
        self.bounds = {}  # dim name -> [largest rejected minimum, smallest accepted minimum or None]
        self.probed = set()  # dims whose first accepted minimum less one has been tried

    def rejected(self, spec, names):
        """The next spec to try after torch.export refused ``spec`` for the dims ``names``, or None
        where a violated dim has no minimum left to try within its example's size."""
        moved = {}
        for i, d, dim in _dims(spec):
            name = getattr(dim, "__name__", None)
            if name == "batch" or name in moved or not isinstance(getattr(dim, "min", None), int):
                continue
            if name in names:
                bound = self.bounds.setdefault(name, [dim.min, None])
                bound[0] = max(bound[0], dim.min)
                if bound[1] is None:
                    nxt = min(max(bound[0] + 1, 2 * bound[0] - 1), self.inputs[i].shape[d])
                    if nxt <= bound[0]:
                        return None
                    moved[name] = nxt
                    continue
            elif name in self.bounds:
                self.bounds[name][1] = dim.min
            if name in self.bounds:
                moved[name] = self._next(name)
        new = _with_minima(spec, moved)
        return new if _minima(new) != _minima(spec) else None  # None: nothing left to move

    def accepted(self, spec):
        """The next spec to try after torch.export accepted ``spec``, or None where every searched
        dim's minimum is the smallest accepted."""
        moved = {}
        for _, _, dim in _dims(spec):
            name = getattr(dim, "__name__", None)
            if name in self.bounds:
                self.bounds[name][1] = dim.min
                moved[name] = self._next(name)
        return _with_minima(spec, moved) if _minima(_with_minima(spec, moved)) != _minima(spec) else None

    def _next(self, name):
        # One below the first accepted minimum first: behind strides the doubling lands on the
        # answer (2^k + 1), which one more export confirms, where bisecting would take k.
        lo, hi = self.bounds[name]
        if hi - lo <= 1:
            return hi
        if name not in self.probed:
            self.probed.add(name)
            return hi - 1
        return (lo + hi) // 2


def _with_minima(spec, minima):
    """``spec`` with the named dims' minima replaced."""
    new = {}
    for _, _, dim in _dims(spec):
        name = getattr(dim, "__name__", None)
        if name in minima and name not in new:
            new[name] = torch.export.Dim(name, min=minima[name], max=dim.max)
    return tuple(
        None if s is None else {d: new.get(getattr(dim, "__name__", None), dim) for d, dim in s.items()} for s in spec
    )


def _minima(spec):
    return [(i, d, getattr(dim, "min", None)) for i, d, dim in _dims(spec)]


def _apply_suggested_fixes(msg: str, spec):
    """``spec`` with the fixes that torch.export's message suggests, or None where it suggests none
    or torch cannot apply them."""
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    head, found, tail = msg.partition("Suggested fixes:")
    if not found:
        return None
    # torch's parser reads every line after the heading; the message goes on after a blank one
    fixes = "\n".join(itertools.takewhile(str.strip, tail.strip("\n").splitlines()))
    try:
        return refine_dynamic_shapes_from_suggested_fixes(head + found + "\n" + fixes, spec)
    except Exception:  # noqa: BLE001 - a fix torch cannot apply: the caller reports the violation
        return None


def _dims(spec):
    """(input index, dim index, Dim) of every dynamic dim in a dynamic_shapes tuple."""
    for i, s in enumerate(spec):
        for d, dim in (s or {}).items():
            yield i, d, dim


def _specialized(refined, spec) -> bool:
    """Whether torch's suggested fixes made a dynamic dim static (an int)."""
    return any(isinstance((refined[i] or {}).get(d), int) for i, d, _ in _dims(spec))


def _spec_ranges(spec, ranges):
    """``ranges`` with each dim's (min, max) as in the dynamic_shapes that torch.export accepted."""
    out = [dict(r) for r in ranges]
    for i, d, dim in _dims(spec):
        lo, hi = getattr(dim, "min", None), getattr(dim, "max", None)
        if d in out[i] and isinstance(lo, int) and isinstance(hi, int):
            out[i][d] = (max(lo, out[i][d][0]), min(hi, out[i][d][1]))
    return out


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


def _check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"customops: model file {path!r} does not exist")
