"""AOTInductor packages: export_aoti, which records the inputs in the package's metadata, and
load_aoti, which checks inputs against it."""

import os
from typing import List, Sequence, Tuple

import torch
from torch import nn

import customops

from ._common import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_DIM,
    INPUT_DIMS_METADATA_KEY,
    INPUTS_METADATA_KEY,
    _as_tuple,
    _check_file,
    _dtype_name,
    _dynamic_spec,
    _export_program,
    _quiet_export,
    _quiet_torchscript,
    _staged,
)


def _inputs_metadata(inputs: Sequence[torch.Tensor], ranges) -> str:
    """The :data:`INPUTS_METADATA_KEY` entry for ``inputs`` with dynamic ``ranges``."""
    return "|".join(
        _dtype_name(t.dtype)
        + ":"
        + ",".join(f"{r[d][0]}-{r[d][1]}" if d in r else str(s) for d, s in enumerate(t.shape))
        for t, r in zip(inputs, ranges)
    )


def _input_dims_metadata(program) -> str:
    """The :data:`INPUT_DIMS_METADATA_KEY` entry of ``program``'s tensor inputs."""
    user_inputs = set(program.graph_signature.user_inputs)
    entries = []
    for node in program.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" and node.name in user_inputs else None
        if isinstance(val, torch.Tensor):
            entries.append(
                ",".join(str(d.node.expr) if isinstance(d, torch.SymInt) else str(int(d)) for d in val.shape)
            )
    return "|".join(entries)


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
    program, ranges = _export_program(model, inputs, dynamic_shapes, ranges)
    configs = {
        # torch.export records a lower bound of 2 for a dim exported as 1..n (it treats 0 and 1
        # specially); AOTInductor's own input checks (AOTI_RUNTIME_CHECK_INPUTS=1, for whoever
        # sets it) would then refuse a size of 1, which the compiled code handles.
        "aot_inductor.check_lowerbound": False,
        "aot_inductor.metadata": {
            INPUTS_METADATA_KEY: _inputs_metadata(inputs, ranges),
            INPUT_DIMS_METADATA_KEY: _input_dims_metadata(program),
        },
    }
    # Inductor's first import defines torch.utils.mkldnn's TorchScript methods, which warn.
    with _staged(path) as tmp, _quiet_torchscript(), _quiet_export():
        torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=configs)
    return os.fspath(path)


def aoti_python_loading_works() -> bool:
    """Whether this torch's Python AOTInductor loader can be trusted. Seen 2026-11-29 on the
    H200 machine: torch 2.11's aoti_load_package segfaults even for a plain nn.Linear package,
    while torch 2.13 and 2.14 load packages on the CPU. Where it cannot, check packages with
    the C++ loader (customops_serve)."""
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


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


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """t with exactly the strides of a row-major tensor of its shape: torch calls a tensor
    contiguous whatever the strides of its size-1 dims (an (N, 1, H, W) batch in channels_last,
    say), and AOTInductor's code reads them (0.99 off on a two-conv network)."""
    stride, expected = 1, []
    for size in reversed(t.shape):
        expected.append(stride)
        stride *= max(size, 1)
    return t if t.stride() == tuple(reversed(expected)) else t.clone(memory_format=torch.contiguous_format)


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


def _parse_input_dims(text: str):
    """:data:`INPUT_DIMS_METADATA_KEY`'s value as, per input, a sympy expression per dim."""
    import sympy

    return [[sympy.sympify(d) for d in entry.split(",")] if entry else [] for entry in text.split("|")]


def _check_tied_dims(path: str, dims, tensors: Sequence[torch.Tensor]) -> None:
    """Each symbol of ``dims`` takes the size of its first dim among ``tensors``, or, where it
    has none of its own, the value that solves the first affine expression of it alone
    (``4*s0``: the size over 4, which must divide it); every dim whose expression the symbols
    determine must then have the size the expression gives."""
    first = {}  # symbol -> (input, dim, size)
    for i, (t, exprs) in enumerate(zip(tensors, dims)):
        for d, (size, e) in enumerate(zip(t.shape, exprs)):
            if e.is_Symbol:
                first.setdefault(e, (i, d, size))
    values = {sym: size for sym, (_, _, size) in first.items()}
    for i, (t, exprs) in enumerate(zip(tensors, dims)):
        for d, (size, e) in enumerate(zip(t.shape, exprs)):
            if e.is_Number:
                continue
            unknown = e.free_symbols - values.keys()
            if len(unknown) == 1:  # a symbol with no dim of its own: a*sym + b = size gives it
                sym = unknown.pop()
                coefficients = _affine_coefficients(e.subs(values), sym)
                if coefficients is None:
                    continue
                a, b = coefficients
                if (size - b) % a != 0:
                    below = size - (size - b) % a
                    raise RuntimeError(
                        f"customops: AOTInductor package {path!r} refused input {i} of shape {list(t.shape)}: its dim "
                        f"{d} is {size}, where the package takes sizes of the form {str(e)} (such as {below} or "
                        f"{below + a}); inputs' shapes {[list(x.shape) for x in tensors]}"
                    )
                values[sym], first[sym] = (size - b) // a, (i, d, size)
                continue
            if unknown:
                continue
            try:
                expected = int(e.subs(values))
            except (TypeError, ValueError):  # a function of torch's that sympy does not evaluate
                continue
            if size != expected:
                j, k, _ = first.get(next(iter(e.free_symbols)), (i, d, None))
                raise RuntimeError(
                    f"customops: AOTInductor package {path!r} refused input {i} of shape {list(t.shape)}: its dim {d} "
                    f"is {size}, where the package ties it to dim {k} of input {j} ({str(e)} at export) and so "
                    f"expects {expected}; inputs' shapes {[list(x.shape) for x in tensors]}"
                )


def _affine_coefficients(e, sym):
    """(a, b) where ``e`` is ``a*sym + b`` with integers a > 0 and b, else None (a floor
    division, say, which is not checked)."""
    import sympy

    try:
        poly = sympy.Poly(e, sym)
    except sympy.PolynomialError:
        return None
    coefficients = poly.all_coeffs()
    if poly.degree() != 1 or not all(c.is_Integer for c in coefficients) or coefficients[0] <= 0:
        return None
    return int(coefficients[0]), int(coefficients[1])


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
    metadata = package.get_metadata()
    recorded, recorded_dims = metadata.get(INPUTS_METADATA_KEY), metadata.get(INPUT_DIMS_METADATA_KEY)
    # AOTInductor checks nothing unless AOTI_RUNTIME_CHECK_INPUTS=1 is set process-wide, and
    # that check refuses size 1 at dims that torch's own packages export as dynamic: so
    # packages are checked here, against what export_aoti recorded.
    try:
        spec = None if recorded is None else _parse_inputs_metadata(recorded)
        dims = None if recorded_dims is None else _parse_input_dims(recorded_dims)
    except (ValueError, TypeError, SyntaxError, AttributeError) as e:  # sympify's errors too
        raise RuntimeError(
            f"customops: AOTInductor package {path!r} has malformed {INPUTS_METADATA_KEY} or "
            f"{INPUT_DIMS_METADATA_KEY} metadata {recorded!r}, {recorded_dims!r}"
        ) from e

    def run(*args, **kwargs):
        if spec is not None:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            _check_inputs(path, spec, tensors)
            if dims is not None and len(dims) == len(tensors):
                _check_tied_dims(path, dims, tensors)
        # The compiled code indexes inputs with the row-major examples' strides.
        args = tuple(_row_major(a) if isinstance(a, torch.Tensor) else a for a in args)
        try:
            return package(*args, **kwargs)
        except RuntimeError as e:
            given = [(list(a.shape), _dtype_name(a.dtype)) for a in args if isinstance(a, torch.Tensor)]
            raise RuntimeError(
                f"customops: AOTInductor package {path!r} refused inputs of (shape, dtype) {given}: {e}"
            ) from e

    run.package = package  # the loader's own object (metadata, call spec)
    return run
