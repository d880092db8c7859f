"""Serving an exported model with Triton Inference Server, through PyTriton (``customops[serve]``).

``python -m customops.serve exported/ --port 8000`` loads the model that ``customops.export``
wrote to ``exported/`` (its inputs and outputs from ``exported/triton/python/<name>/config.pbtxt``),
binds it to a tritonserver that PyTriton starts (HTTP, gRPC and metrics on loopback unless
``--host`` says otherwise) with Triton's dynamic batcher, and serves until SIGINT or SIGTERM,
when Triton finishes the requests it accepted and exits. The model runs in this process; each
batch that Triton forms is one forward call (:class:`BatchStats` counts them).
"""

import collections
import dataclasses
import os
import sysconfig
import threading
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from customops.export._common import _dtype_name, one_line_error
from customops.export.triton import EXAMPLE_DIMS_PARAMETER, REPOSITORY_DIR, torch_dtype


def use_this_interpreters_libpython(env=os.environ) -> None:
    """Puts this interpreter's library folder (``sysconfig``'s ``LIBDIR``) first on
    ``LD_LIBRARY_PATH`` in ``env``, for the tritonserver that PyTriton starts. Its Python
    backend stub links ``libpython3.X.so``; without this the dynamic loader may give it another
    build of the same Python version (a system one), whose ``threading`` then fails in the stub
    with "'_thread.RLock' object has no attribute '_recursion_count'" and the model never loads.
    PyTriton copies ``os.environ`` for the server, so setting it here before starting is enough."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir:
        return
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != libdir]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([libdir] + paths)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    dims: Tuple[int, ...]  # without the batch dimension; -1: any size


@dataclasses.dataclass
class ServedModel:
    """An exported model as served: ``run`` takes and returns torch tensors on any device."""

    name: str
    path: str
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]
    run: Callable
    device: torch.device
    max_batch_size: int  # the exported config's
    example_shapes: List[Tuple[int, ...]]  # of the start-up run: one row where the config batches


class ServeError(Exception):
    """A model that cannot be served; the message is one line for the command line."""


class ModelError(Exception):
    """The model raised for a batch of requests: each request's error response names the
    model's exception in one line (a TorchScript model's own exception, not the interpreter's
    tracebacks)."""


def read_model_config(path: str):
    """Parses a ``config.pbtxt`` into Triton's ``inference.ModelConfig`` protobuf message (from
    tritonclient); raises ServeError for a missing or malformed file."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        with open(path) as f:
            return text_format.Parse(f.read(), model_config_pb2.ModelConfig())
    except OSError as e:
        raise ServeError(f"cannot read the model config {path}: {e.strerror}") from e
    except text_format.ParseError as e:
        raise ServeError(f"malformed model config {path}: {e}") from e


def load_served_model(exported: str, name: str = "model", fmt: str = "auto", device: str = "cpu") -> ServedModel:
    """Loads ``exported/<name>.pt`` (TorchScript, on ``device``) or ``<name>.pt2`` (an
    AOTInductor package, on the device it was compiled for) with customops' loaders, its inputs
    and outputs from the Python-backend config that the exporter wrote, and runs it once on a
    batch of one row (a model whose ops this library lacks fails here, not at the first
    request). ``fmt``: ``pt``, ``pt2`` or ``auto`` (``pt`` where it exists). Raises ServeError."""
    from customops.export import load_aoti, load_torchscript

    if not os.path.isdir(exported):
        raise ServeError(f"{exported} is not a folder of exported files (python -m customops.export --out {exported})")
    repository = os.path.join(exported, REPOSITORY_DIR, "python")
    config_path = os.path.join(repository, name, "config.pbtxt")
    if not os.path.isfile(config_path):
        others = sorted(d for d in os.listdir(repository) if d != name) if os.path.isdir(repository) else []
        if others:
            raise ServeError(f"{exported} has no model named {name!r}; it has {', '.join(others)} (--name)")
        raise ServeError(
            f"{config_path} is missing: the inputs and outputs come from there, which python -m customops.export "
            "writes when TorchScript (pt) is among its --formats and --no-triton is not given"
        )
    config = read_model_config(config_path)
    if fmt == "auto":
        found = [f for f in ("pt", "pt2") if os.path.isfile(os.path.join(exported, f"{name}.{f}"))]
        if not found:
            raise ServeError(f"neither {name}.pt nor {name}.pt2 is in {exported}")
        fmt = found[0]
    path = os.path.join(exported, f"{name}.{fmt}")
    if not os.path.isfile(path):
        raise ServeError(f"the model file {path} is missing")
    try:
        if fmt == "pt":
            run = load_torchscript(path, map_location=device)
        else:
            run = load_aoti(path)
    except (RuntimeError, ImportError) as e:
        raise ServeError(one_line_error(e)) from e
    inputs = [TensorSpec(t.name, _dtype(t.data_type), tuple(t.dims)) for t in config.input]
    outputs = [TensorSpec(t.name, _dtype(t.data_type), tuple(t.dims)) for t in config.output]
    for t in inputs + outputs:
        if t.dtype == torch.bfloat16:
            raise ServeError(f"{t.name} is bfloat16, which numpy (and so PyTriton) lacks; serve the model in float32")
    shapes = _example_shapes(config, inputs)
    served = ServedModel(name, path, inputs, outputs, run, torch.device(device), config.max_batch_size, shapes)
    try:
        example = [torch.zeros(shape, dtype=t.dtype) for t, shape in zip(inputs, shapes)]
        _call(served, example)
    except Exception as e:  # noqa: BLE001 - any failure of the model's first run ends the start
        raise ServeError(f"{path} fails on a batch of one row: {one_line_error(e, with_type=True)}") from e
    return served


def _example_shapes(config, inputs: List[TensorSpec]) -> List[Tuple[int, ...]]:
    """Shapes of the start-up run, one row where the config batches: the exporter's example sizes
    where the config records them (EXAMPLE_DIMS_PARAMETER), else 1 at each dynamic dim."""
    recorded = (
        config.parameters[EXAMPLE_DIMS_PARAMETER].string_value if EXAMPLE_DIMS_PARAMETER in config.parameters else ""
    )
    entries = recorded.split("|") if recorded else []
    batch = (1,) if config.max_batch_size > 0 else ()
    shapes = []
    for i, t in enumerate(inputs):
        sizes = [int(d) for d in entries[i].split(",") if d] if len(entries) == len(inputs) else []
        if len(sizes) != len(t.dims) or any(d >= 0 and d != s for d, s in zip(t.dims, sizes)):
            sizes = [1 if d < 0 else d for d in t.dims]
        shapes.append(batch + tuple(sizes))
    return shapes


def _dtype(data_type: int) -> torch.dtype:
    from tritonclient.grpc import model_config_pb2

    return torch_dtype(model_config_pb2.DataType.Name(data_type))


def _call(served: ServedModel, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    with torch.inference_mode():
        out = served.run(*(t.to(served.device) for t in tensors))
    return [out] if isinstance(out, torch.Tensor) else list(out)


class BatchStats:
    """What the model saw: per forward call, the requests and rows that Triton batched."""

    def __init__(self):
        self._lock = threading.Lock()
        self.rows = collections.Counter()  # rows per forward call -> calls
        self.requests = collections.Counter()  # requests per forward call -> calls

    def record(self, requests: int, rows: int) -> None:
        with self._lock:
            self.rows[rows] += 1
            self.requests[requests] += 1

    def summary(self) -> Dict[str, object]:
        with self._lock:
            calls = sum(self.rows.values())
            return {
                "forward_calls": calls,
                "requests": sum(k * v for k, v in self.requests.items()),
                "rows": sum(k * v for k, v in self.rows.items()),
                "requests_per_call": dict(sorted(self.requests.items())),
                "rows_per_call": dict(sorted(self.rows.items())),
            }


def infer_function(served: ServedModel, stats: Optional[BatchStats] = None) -> Callable:
    """PyTriton's inference callable for ``served``: takes the list of requests that Triton
    batched, runs them as one forward call (concatenated along dim 0) and splits the outputs.
    Triton checks each request's shape, dtype and batch size against the config first."""

    def infer(requests):
        # np.array copies: the request's buffers are read-only, which torch.from_numpy warns about.
        tensors = [[torch.from_numpy(np.array(r[t.name])) for t in served.inputs] for r in requests]
        rows = [ts[0].shape[0] for ts in tensors]
        batch = [torch.cat(parts) for parts in zip(*tensors)] if len(requests) > 1 else tensors[0]
        try:
            outs = [o.cpu().numpy() for o in _call(served, batch)]
        except Exception as e:  # noqa: BLE001 - the model's error, in one line, for every request of the batch
            raise ModelError(one_line_error(e, with_type=True)) from None
        if stats is not None:
            stats.record(len(requests), sum(rows))
        bounds = np.cumsum([0] + rows)
        return [{t.name: o[lo:hi] for t, o in zip(served.outputs, outs)} for lo, hi in zip(bounds[:-1], bounds[1:])]

    return infer


def bind(triton, served: ServedModel, max_batch: int, max_queue_delay_us: int, stats=None, instances: int = 1):
    """Binds ``served`` to a ``pytriton.triton.Triton`` with the dynamic batcher."""
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    def tensors(specs):
        return [Tensor(name=t.name, dtype=np.dtype(_dtype_name(t.dtype)), shape=t.dims) for t in specs]

    triton.bind(
        model_name=served.name,
        infer_func=[infer_function(served, stats) for _ in range(instances)],
        inputs=tensors(served.inputs),
        outputs=tensors(served.outputs),
        config=ModelConfig(
            max_batch_size=max_batch, batcher=DynamicBatcher(max_queue_delay_microseconds=max_queue_delay_us)
        ),
        strict=True,
    )
