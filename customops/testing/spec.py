"""What an op spec is: :class:`OpSpec`, :class:`SampleInput`, the paths, default tolerances and
:func:`make_tensor` for writing sample generators. The entries themselves are in
``customops/testing/op_specs.py``."""

import dataclasses
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

import torch

FLOATING_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# Every path an op goes through, with the devices it runs on. Test ids read
# test_path[<op>-<path>-<device>].
PATHS: Dict[str, Tuple[str, ...]] = {
    "eager": ("cpu", "cuda"),  # every sample and dtype against the reference
    "autograd": ("cpu", "cuda"),  # gradcheck (and gradgradcheck) in float64
    "opcheck": ("cpu", "cuda"),  # torch.library.opcheck, with and without requires_grad
    "compile": ("cpu", "cuda"),  # torch.compile(fullgraph=True, dynamic=True), forward and backward
    "export": ("cpu", "cuda"),  # torch.export.export (dynamic shapes), then the exported program runs
    "aoti": ("cpu", "cuda"),  # AOTInductor package, loaded and run from Python
    "aoti_cpp": ("cpu", "cuda"),  # the same package run by the C++ binary customops_serve
    "torchscript": ("cpu", "cuda"),  # torch.jit.script from the op's schema, run from Python
    "torchscript_cpp": ("cpu", "cuda"),  # a TorchScript file run by the C++ binary customops_serve
    "onnx": ("cpu",),  # torch.onnx.export with customops' translation table, run in onnxruntime (CPU)
    "errors": ("cpu", "cuda"),  # every error input refused, eagerly and under torch.compile, naming the argument
    "cuda_stream": ("cuda",),  # inputs written on a side stream behind a sleep: the op runs on the current stream
    "cuda_graph": ("cuda",),  # captured in a CUDA graph and replayed with new inputs; reduce-overhead compile
    "cuda_launch": ("cuda",),  # a failed launch of each of the op's kernels is a RuntimeError naming it
}

# Tolerances of an op's output against its float64 reference, per input dtype: 16-bit inputs
# round the output once and accumulate in float32; float32 reorders sums.
DEFAULT_TOL = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}


@dataclasses.dataclass
class SampleInput:
    """One call of the op: ``op(*args, **kwargs)``. ``name`` appears in failure messages."""

    args: tuple
    kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    name: str = ""

    def tensors(self) -> list:
        """The tensor arguments, positional first, then keyword (in order)."""
        return [a for a in (*self.args, *self.kwargs.values()) if isinstance(a, torch.Tensor)]

    def with_tensors(self, new: Sequence[torch.Tensor]) -> "SampleInput":
        """The same call with the tensor arguments replaced, in :meth:`tensors`' order."""
        it = iter(new)
        swap = lambda a: next(it) if isinstance(a, torch.Tensor) else a  # noqa: E731
        args = tuple(swap(a) for a in self.args)
        kwargs = {k: swap(v) for k, v in self.kwargs.items()}
        return SampleInput(args, kwargs, self.name)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "SampleInput":
        return self.with_tensors([fn(t) for t in self.tensors()])


@dataclasses.dataclass
class ErrorInput:
    """A call the op must refuse with a RuntimeError. Its message starts with ``customops:
    expected <arg> `` (every message names the argument that is wrong) and contains each of
    ``details`` (what was expected and what was given). ``fake_refuses``: the call breaks a
    relation that the output's shape rests on (sizes, a reduction), so the fake kernel refuses
    it too, with the same argument and details; it need not refuse the others (dtypes,
    devices, values), which the kernels check."""

    sample: SampleInput
    arg: str
    details: Tuple[str, ...]
    fake_refuses: bool = False


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """Everything the test suite and the doctor need to know about one op.

    name: the op is ``torch.ops.customops.<name>``.
    sample_inputs: ``(device, dtype, requires_grad) -> iterable of SampleInput``. Cover shapes
        (empty, 0-d, odd sizes), layouts (:func:`make_tensor`) and optional arguments. Small
        shapes: gradcheck runs on every sample. The first sample is the plain one that the
        artifact paths (AOTInductor, TorchScript from C++, ONNX) build into their files.
        With ``requires_grad``, set it on the tensors that are differentiable.
    reference: the op written with PyTorch ops, called with the same arguments, every floating
        tensor in float64; returns what the op returns.
    dtypes / cuda_dtypes: the dtypes the op supports on the CPU / on CUDA (None: ``dtypes``).
    tol: per-dtype ``dict(atol=, rtol=)`` overriding :data:`DEFAULT_TOL`.
    supports_gradgrad: run gradgradcheck too (the backward is differentiable).
    gradcheck_nondet_tol: gradcheck's ``nondet_tol``: how far two backward passes on the same
        inputs may differ (float64 atomics add in a varying order; 0 for deterministic ops).
    error_inputs: ``device -> iterable of ErrorInput``: bad dtypes, shapes, devices (on
        ``"cuda"``, a CPU tensor among CUDA ones) and values.
    cuda_kernels: ``{kernel name: sample name}``: each CUDA kernel of the op (the name its
        launch check reports) and a float32 sample that launches it.
    unsupported: ``{path: reason}`` for every path in :data:`PATHS` the op cannot take; the
        tests report it as skipped with this reason, and fail once the path starts working.
    output_format: ``sample -> torch.memory_format`` of the op's outputs (contiguous unless the
        op keeps an input's layout, as conv2d keeps channels_last).
    """

    name: str
    sample_inputs: Callable[[str, torch.dtype, bool], Iterable[SampleInput]]
    reference: Callable[..., Any]
    dtypes: Tuple[torch.dtype, ...] = FLOATING_DTYPES
    cuda_dtypes: Optional[Tuple[torch.dtype, ...]] = None
    tol: Dict[torch.dtype, Dict[str, float]] = dataclasses.field(default_factory=dict)
    supports_gradgrad: bool = True
    gradcheck_nondet_tol: float = 0.0
    error_inputs: Callable[[str], Iterable[ErrorInput]] = lambda device: ()
    cuda_kernels: Dict[str, str] = dataclasses.field(default_factory=dict)
    unsupported: Dict[str, str] = dataclasses.field(default_factory=dict)
    output_format: Callable[[SampleInput], torch.memory_format] = lambda sample: torch.contiguous_format

    def __post_init__(self):
        unknown = set(self.unsupported) - set(PATHS)
        if unknown:
            raise ValueError(
                f"OpSpec {self.name!r}: unknown paths in unsupported: {sorted(unknown)}; paths: {list(PATHS)}"
            )

    @property
    def op(self) -> torch._ops.OpOverloadPacket:
        return getattr(torch.ops.customops, self.name)

    def dtypes_on(self, device: str) -> Tuple[torch.dtype, ...]:
        return self.cuda_dtypes if device == "cuda" and self.cuda_dtypes is not None else self.dtypes

    def tolerance(self, dtype: torch.dtype) -> Dict[str, float]:
        return self.tol.get(dtype, DEFAULT_TOL[dtype])

    def samples(self, device: str, dtype: torch.dtype, requires_grad: bool = False, seed: int = 0) -> list:
        """The sample inputs, drawn from ``seed`` (the caller's random state is left alone):
        another seed gives the same calls with new values."""
        return _seeded(seed, self.sample_inputs, device, dtype, requires_grad)

    def sample(self, name: str, device: str, dtype: torch.dtype = torch.float32) -> SampleInput:
        """The sample called ``name``."""
        found = [s for s in self.samples(device, dtype) if s.name == name]
        if not found:
            raise KeyError(f"{self.name} has no sample {name!r}")
        return found[0]

    def errors(self, device: str) -> list:
        """The error inputs, drawn from a fixed seed."""
        return _seeded(0, self.error_inputs, device)


def _seeded(seed: int, generate: Callable[..., Iterable], *args) -> list:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return list(generate(*args))


LAYOUTS = ("contiguous", "transposed", "strided", "padded", "offset", "channels_last")


def make_tensor(
    shape: Sequence[int],
    device: str,
    dtype: torch.dtype,
    layout: str = "contiguous",
    requires_grad: bool = False,
    scale: float = 1.0,
    uniform: bool = False,
) -> torch.Tensor:
    """A random tensor of ``shape`` (standard normal times ``scale``; ``uniform``: in [0, 1))
    laid out as

    - ``contiguous``;
    - ``transposed``: every dim reversed (a transpose for 2-D, a permutation beyond);
    - ``strided``: every other row (dim 0 has stride 2x);
    - ``padded``: the last dim sliced out of a wider one (rows not packed, storage offset 3);
    - ``offset``: storage offset 1 (not 16-byte aligned);
    - ``channels_last``: 4-D, ``torch.channels_last``.

    The result is a leaf (``requires_grad`` as asked) with that layout.
    """
    shape = tuple(shape)

    def draw(*s):
        t = torch.rand(s, dtype=torch.float64) if uniform else torch.randn(s, dtype=torch.float64) * scale
        return t.to(device=device, dtype=dtype)

    if layout == "contiguous":
        t = draw(*shape)
    elif layout == "transposed":
        t = draw(*reversed(shape)).permute(*reversed(range(len(shape))))
    elif layout == "strided":
        t = draw(2 * shape[0], *shape[1:])[::2]
    elif layout == "padded":
        t = draw(*shape[:-1], shape[-1] + 7)[..., 3 : 3 + shape[-1]]
    elif layout == "offset":
        numel = 1
        for s in shape:
            numel *= s
        t = draw(numel + 1)[1:].view(shape)
    elif layout == "channels_last":
        t = draw(*shape).to(memory_format=torch.channels_last)
    else:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    return t.detach().requires_grad_(requires_grad)
