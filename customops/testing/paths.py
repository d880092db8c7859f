"""How each path of :data:`~customops.testing.spec.PATHS` is checked for an op spec, shared by
tests/test_conformance.py and ``python -m customops.doctor``.

Each ``check_<path>(spec, device, ...)`` returns quietly when the op passes, raises
``AssertionError`` (or the error the path raised) when it does not, and raises
:class:`NotApplicable` when the path cannot run here (no GPU, no onnxruntime, ...).
``quick=True`` checks the first sample in one dtype only (the doctor's setting).
"""

import os
import subprocess
import sys
import tempfile
import warnings
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from ..export._common import _quiet_export
from .spec import PATHS, OpSpec, SampleInput


class NotApplicable(Exception):
    """The path cannot run on this machine (the message says why); not a failure."""


# --- comparing with the reference ------------------------------------------------------------


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _float64(sample: SampleInput) -> SampleInput:
    return sample.map_tensors(lambda t: t.detach().double() if t.is_floating_point() else t.detach())


def reference_output(spec: OpSpec, sample: SampleInput):
    """The reference's output for ``sample``, computed in float64."""
    s = _float64(sample)
    return spec.reference(*s.args, **s.kwargs)


def assert_matches_reference(spec: OpSpec, sample: SampleInput, out, dtype: torch.dtype, what: str = "") -> None:
    """``out`` (the op's output on ``sample``) equals the reference's, within ``spec``'s
    tolerance for ``dtype``, with the same shapes, and ``dtype`` itself."""
    refs = _as_tuple(reference_output(spec, sample))
    outs = _as_tuple(out)
    where = f"{spec.name}{f' ({what})' if what else ''}, sample {sample.name!r}, {dtype}"
    assert len(outs) == len(refs), f"{where}: {len(outs)} outputs, the reference has {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape, f"{where}, output {i}: shape {list(o.shape)}, reference {list(r.shape)}"
        assert o.dtype == dtype, f"{where}, output {i}: dtype {o.dtype}, expected {dtype}"
        torch.testing.assert_close(
            o.detach().cpu().double(),
            r.detach().cpu().double(),
            **spec.tolerance(dtype),
            msg=lambda m, i=i: f"{where}, output {i}: {m}",
        )


def _samples(
    spec: OpSpec,
    device: str,
    dtype: torch.dtype,
    requires_grad: bool = False,
    quick: bool = False,
    force_grad: bool = False,
) -> list:
    # An op that declares autograd unsupported (its derivative raises) is checked on the other
    # paths without gradients; only the autograd path itself asks for them, to show the failure.
    requires_grad = requires_grad and (force_grad or "autograd" not in spec.unsupported)
    samples = spec.samples(device, dtype, requires_grad)
    return samples[:1] if quick else samples


def _call(spec: OpSpec, sample: SampleInput):
    return spec.op(*sample.args, **sample.kwargs)


def _need_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise NotApplicable("needs a CUDA GPU")


# --- eager, autograd, opcheck ----------------------------------------------------------------


def check_eager(spec: OpSpec, device: str, quick: bool = False) -> None:
    """Every sample in every supported dtype against the reference. Outputs are fresh tensors
    on the inputs' device, in the spec's memory format; inputs are left unchanged."""
    _need_device(device)
    for dtype in spec.dtypes_on(device)[: 1 if quick else None]:
        for sample in _samples(spec, device, dtype, quick=quick):
            before = [t.clone() for t in sample.tensors()]
            out = _call(spec, sample)
            assert_matches_reference(spec, sample, out, dtype, "eager")
            storages = {t.untyped_storage().data_ptr() for t in sample.tensors() if t.numel()}
            fmt = spec.output_format(sample)
            for o in _as_tuple(out):
                assert o.device.type == device and o.is_contiguous(memory_format=fmt), (
                    spec.name,
                    sample.name,
                    o.device,
                    o.stride(),
                    fmt,
                )
                assert not o.numel() or o.untyped_storage().data_ptr() not in storages, (
                    f"{spec.name}, sample {sample.name!r}: the output shares an input's storage"
                )
            for t, b in zip(sample.tensors(), before):
                assert torch.equal(t, b), f"{spec.name}, sample {sample.name!r}: an input was modified"


def check_autograd(spec: OpSpec, device: str, quick: bool = False) -> None:
    """gradcheck (and gradgradcheck, unless the spec says the backward is not differentiable)
    on every sample, in float64, against finite differences."""
    _need_device(device)
    if torch.float64 not in spec.dtypes_on(device):
        raise NotApplicable("gradcheck needs float64")
    samples = _samples(spec, device, torch.float64, requires_grad=True, quick=quick, force_grad=True)
    for sample in samples:
        inputs = [t for t in sample.tensors() if t.requires_grad]
        assert inputs, f"{spec.name}, sample {sample.name!r}: no input requires grad"
        others = sample.tensors()

        def fn(*diff, sample=sample, others=others):
            it = iter(diff)
            s = sample.with_tensors([next(it) if t.requires_grad else t for t in others])
            return _call(spec, s)

        # Large samples: fast mode (random projections), full Jacobians for small ones.
        fast = sum(t.numel() for t in inputs) > 256
        assert torch.autograd.gradcheck(fn, inputs, fast_mode=fast, nondet_tol=spec.gradcheck_nondet_tol), (
            spec.name,
            sample.name,
        )
        if spec.supports_gradgrad:
            assert torch.autograd.gradgradcheck(fn, inputs, fast_mode=fast), (spec.name, sample.name)
        elif sample is samples[0]:
            # The declaration holds: differentiating the gradient raises (or is wrong).
            works = _raised(torch.autograd.gradgradcheck, fn, inputs, fast_mode=fast) is None
            assert not works, f"{spec.name} declares supports_gradgrad=False, but gradgradcheck passes"


def check_opcheck(spec: OpSpec, device: str, quick: bool = False) -> None:
    """torch.library.opcheck (schema, autograd registration, fake kernel against the real one,
    AOT dispatch with dynamic shapes) on every sample in float32, with and without
    requires_grad, and on the first sample in the other dtypes."""
    _need_device(device)
    cases = [(torch.float32, rg, None) for rg in (False, True)]
    cases += [(dt, False, 1) for dt in spec.dtypes_on(device) if dt != torch.float32]
    for dtype, requires_grad, limit in cases[: 1 if quick else None]:
        if dtype not in spec.dtypes_on(device):
            continue
        for sample in _samples(spec, device, dtype, requires_grad, quick=quick)[:limit]:
            try:
                torch.library.opcheck(spec.op, sample.args, sample.kwargs)
            except Exception as e:
                raise AssertionError(
                    f"{spec.name}, sample {sample.name!r}, {dtype}, requires_grad={requires_grad}: {e}"
                ) from e


# --- torch.compile, torch.export -------------------------------------------------------------


def _recompile_limit(n: int):
    # Enough recompiles for every sample (ranks and strides differ), and an error instead of
    # a silent fallback to eager should the limit be hit.
    options = {"recompile_limit": n, "fail_on_recompile_limit_hit": True}
    return torch._dynamo.config.patch(**{k: v for k, v in options.items() if hasattr(torch._dynamo.config, k)})


def check_compile(spec: OpSpec, device: str, quick: bool = False) -> None:
    """torch.compile(fullgraph=True, dynamic=True) (Inductor) on every float32 sample, the
    output against the reference; on the first sample, also the gradients against eager's
    (Inductor compiles C++ kernels for a backward made of ATen ops: seconds per layout here)."""
    _need_device(device)
    torch._dynamo.reset()
    fn = torch.compile(lambda *args, **kwargs: spec.op(*args, **kwargs), fullgraph=True, dynamic=True)
    with _recompile_limit(64):
        for i, sample in enumerate(_samples(spec, device, torch.float32, requires_grad=True, quick=quick)):
            if i > 0:
                sample = sample.map_tensors(lambda t: t.detach())
            out = fn(*sample.args, **sample.kwargs)
            assert_matches_reference(spec, sample, out, torch.float32, "torch.compile")
            inputs = [t for t in sample.tensors() if t.requires_grad]
            outs = [o for o in _as_tuple(out) if o.requires_grad and o.numel()]
            if not inputs or not outs:
                continue
            eager_outs = [o for o in _as_tuple(_call(spec, sample)) if o.requires_grad and o.numel()]
            cotangents = [torch.randn_like(o) for o in outs]
            grads = torch.autograd.grad(outs, inputs, cotangents, allow_unused=True)
            eager_grads = torch.autograd.grad(eager_outs, inputs, cotangents, allow_unused=True)
            for g, eg in zip(grads, eager_grads):
                assert (g is None) == (eg is None), (spec.name, sample.name)
                if g is not None:
                    torch.testing.assert_close(g, eg, msg=lambda m: f"{spec.name}, sample {sample.name!r}, grads: {m}")
    torch._dynamo.reset()


class OpModule(nn.Module):
    """``forward(*tensors)`` calls the op with one sample's non-tensor arguments fixed (for
    torch.export and ONNX, which take tensors)."""

    def __init__(self, spec: OpSpec, sample: SampleInput):
        super().__init__()
        self.spec, self.sample = spec, sample

    def forward(self, *tensors):
        s = self.sample.with_tensors(tensors)
        return self.spec.op(*s.args, **s.kwargs)


def check_export(spec: OpSpec, device: str, quick: bool = False) -> None:
    """torch.export.export on every float32 sample, every dim dynamic (Dim.AUTO); the program
    keeps the op as one node and its output matches the reference."""
    _need_device(device)
    for sample in _samples(spec, device, torch.float32, quick=quick):
        tensors = tuple(sample.tensors())
        dynamic = tuple({d: torch.export.Dim.AUTO for d in range(t.dim())} for t in tensors)
        with _quiet_export():
            program = torch.export.export(OpModule(spec, sample), tensors, dynamic_shapes={"tensors": dynamic})
        targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
        assert spec.op.default in targets, f"{spec.name}, sample {sample.name!r}: not in the exported graph: {targets}"
        assert_matches_reference(spec, sample, program.module()(*tensors), torch.float32, "torch.export")


# --- TorchScript ------------------------------------------------------------------------------


def script_op(spec: OpSpec) -> torch.jit.ScriptFunction:
    """``torch.jit.script`` of a function that calls the op, its signature written from the op's
    schema (``def op(x: Tensor, weight: Tensor, bias: Optional[Tensor]): ...``)."""
    schema = spec.op.default._schema
    params = ", ".join(f"{a.name}: {a.type}" for a in schema.arguments)
    call = ", ".join(f"{a.name}={a.name}" if a.kwarg_only else a.name for a in schema.arguments)
    source = f"def op({params}):\n    return torch.ops.customops.{spec.name}({call})\n"
    return torch.jit.CompilationUnit(source).op


def normalize(spec: OpSpec, sample: SampleInput) -> SampleInput:
    """The same call with every argument of the op's schema, in schema order, defaults filled
    in: positional, except keyword-only arguments."""
    given = list(sample.args)
    args, kwargs = [], {}
    for i, a in enumerate(spec.op.default._schema.arguments):
        if i < len(given):
            value = given[i]
        elif a.name in sample.kwargs:
            value = sample.kwargs[a.name]
        elif a.has_default_value():
            value = a.default_value
        else:
            raise TypeError(f"{spec.name}, sample {sample.name!r}: no value for argument {a.name!r}")
        if a.kwarg_only:
            kwargs[a.name] = value
        else:
            args.append(value)
    return SampleInput(tuple(args), kwargs, sample.name)


def check_torchscript(spec: OpSpec, device: str, quick: bool = False) -> None:
    """The op called from TorchScript (scripted from its schema) on every float32 sample."""
    _need_device(device)
    scripted = script_op(spec)
    for sample in _samples(spec, device, torch.float32, quick=quick):
        s = normalize(spec, sample)
        assert_matches_reference(spec, sample, scripted(*s.args, **s.kwargs), torch.float32, "TorchScript")


# --- artifacts: one flat input, one flat output -------------------------------------------------


class PackedOps(nn.Module):
    """Calls several ops, each on one sample, from a single flat tensor, and returns one flat
    tensor: what the C++ binary customops_serve runs (one tensor in, one out), and how one
    AOTInductor package (about a minute to compile on a small CPU) covers every op.

    ``forward(flat)`` cuts each op's tensor arguments out of ``flat`` (``pack()`` builds it from
    the samples), calls the ops, and concatenates their outputs, flattened; ``unpack(out)``
    splits that back into ``{op name: outputs}``. ``script()`` is the same as TorchScript."""

    def __init__(self, calls: Sequence[Tuple[OpSpec, SampleInput]]):
        super().__init__()
        self.calls = [(spec, normalize(spec, sample)) for spec, sample in calls]
        self.out_shapes = [[o.shape for o in _as_tuple(_call(spec, s))] for spec, s in self.calls]

    def pack(self) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1).float() for _, s in self.calls for t in s.tensors()])

    def forward(self, flat):
        outs, offset = [], 0
        for spec, sample in self.calls:
            tensors = []
            for t in sample.tensors():
                tensors.append(flat[offset : offset + t.numel()].view(t.shape).to(t.dtype))
                offset += t.numel()
            s = sample.with_tensors(tensors)
            outs += [o.reshape(-1) for o in _as_tuple(spec.op(*s.args, **s.kwargs))]
        return torch.cat(outs)

    def script(self) -> torch.jit.ScriptFunction:
        """``forward`` written out as TorchScript source and scripted (``torch.jit.trace``
        cannot record some argument types, e.g. ``bool[]``); ``.save(path)`` writes a module."""

        def literal(value):
            if isinstance(value, (list, tuple)) and not value:
                return "torch.jit.annotate(List[int], [])"
            return repr(list(value) if isinstance(value, tuple) else value)

        lines, offset = ["def forward(flat: Tensor) -> Tensor:", "    outs: List[Tensor] = []"], 0
        for i, (spec, sample) in enumerate(self.calls):
            args = []
            for key, value in [(None, a) for a in sample.args] + list(sample.kwargs.items()):
                if isinstance(value, torch.Tensor):
                    n = value.numel()
                    code = f"flat[{offset}:{offset + n}].view({literal(tuple(value.shape))}).to({value.dtype})"
                    offset += n
                else:
                    code = literal(value)
                args.append(code if key is None else f"{key}={code}")
            lines.append(f"    out{i} = torch.ops.customops.{spec.name}({', '.join(args)})")
            if len(self.out_shapes[i]) == 1:
                lines.append(f"    outs.append(out{i}.reshape(-1))")
            else:
                lines += [f"    outs.append(out{i}[{j}].reshape(-1))" for j in range(len(self.out_shapes[i]))]
        lines.append("    return torch.cat(outs)")
        return torch.jit.CompilationUnit("\n".join(lines) + "\n").forward

    def unpack(self, out: torch.Tensor) -> Dict[str, tuple]:
        result, offset = {}, 0
        for (spec, _), shapes in zip(self.calls, self.out_shapes):
            parts = []
            for shape in shapes:
                n = shape.numel()
                parts.append(out[offset : offset + n].view(shape))
                offset += n
            result[spec.name] = tuple(parts)
        return result

    def check(self, out: torch.Tensor, what: str, only: Optional[str] = None) -> None:
        """Every op's part of ``out`` against its reference (``only``: just that op's)."""
        parts = self.unpack(out.cpu())
        if only is not None and only not in parts:
            raise AssertionError(f"{only} is not in this artifact (it holds {list(parts)})")
        for spec, sample in self.calls:
            if only is None or spec.name == only:
                got = parts[spec.name]
                assert_matches_reference(spec, sample, got if len(got) > 1 else got[0], torch.float32, what)


def first_sample(spec: OpSpec, device: str) -> SampleInput:
    return spec.samples(device, torch.float32)[0]


def build_aoti_package(specs: Sequence[OpSpec], device: str, path: str) -> PackedOps:
    """One AOTInductor package at ``path`` calling every op in ``specs`` on its first sample."""
    _need_device(device)
    model = PackedOps([(s, first_sample(s, device)) for s in specs])
    with _quiet_export():
        program = torch.export.export(model, (model.pack(),))
        torch._inductor.aoti_compile_and_package(program, package_path=path)
    return model


def check_aoti(spec: OpSpec, package: Callable[[], Tuple[PackedOps, str]]) -> None:
    """The op's part of a package from :func:`build_aoti_package` (``package()`` builds or
    returns it: ``(model, path)``), loaded and run from Python."""
    from customops.export.aoti import aoti_python_loading_works, load_aoti

    if not aoti_python_loading_works():
        raise NotApplicable(
            f"torch {torch.__version__}'s Python AOTInductor loader (aoti_load_package) segfaults "
            "(seen on torch 2.11); the package is checked from the C++ binary instead (aoti_cpp)"
        )
    model, path = package()
    model.check(load_aoti(path)(model.pack()), "AOTInductor, Python", only=spec.name)


def check_aoti_cpp(spec: OpSpec, package: Callable[[], Tuple[PackedOps, str]], serve: str, device: str) -> None:
    """The op's part of the package, run by the C++ binary customops_serve (``serve``: its path)."""
    from customops.export.cpp import run_serve

    model, path = package()
    with tempfile.TemporaryDirectory() as tmp:
        out, _, _ = run_serve(serve, path, model.pack(), tmp, runs=1, device=device)
    model.check(out, "AOTInductor, C++ customops_serve", only=spec.name)


def check_torchscript_cpp(spec: OpSpec, device: str, serve: str) -> None:
    """The op on its first sample in a TorchScript file (:meth:`PackedOps.script`), run by the
    C++ binary customops_serve (``serve``: its path)."""
    from customops.export.cpp import run_serve

    _need_device(device)
    model = PackedOps([(spec, first_sample(spec, device))])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{spec.name}.pt")
        model.script().save(path)
        out, _, _ = run_serve(serve, path, model.pack(), tmp, runs=1, device=device)
    model.check(out, "TorchScript, C++ customops_serve")


# --- ONNX -------------------------------------------------------------------------------------


def _configurations(spec: OpSpec, device: str) -> list:
    """The first sample of each distinct set of non-tensor arguments: an artifact's graph
    depends on those (a translation may branch on them), not on the tensors' sizes."""
    seen, firsts = set(), []
    for sample in spec.samples(device, torch.float32):
        key = repr(
            (
                [a for a in sample.args if not isinstance(a, torch.Tensor)],
                {k: v for k, v in sample.kwargs.items() if not isinstance(v, torch.Tensor)},
            )
        )
        if key not in seen:
            seen.add(key)
            firsts.append(sample)
    return firsts


def check_onnx(spec: OpSpec, device: str = "cpu", quick: bool = False) -> None:
    """The op through ``torch.onnx.export(dynamo=True)`` with customops' translation table, run
    in onnxruntime (CPU): only standard-domain ONNX ops, a model that passes the ONNX checker,
    and outputs that match the reference, for each distinct set of non-tensor arguments."""
    if device != "cpu":
        raise NotApplicable("checked once, on the CPU (ONNX Runtime's CPU provider)")
    try:
        import onnx
        import onnxruntime as ort

        from customops.export import ONNX_TRANSLATION_TABLE
        from customops.export.onnx_translation import ONNX_OPSET
    except ImportError as e:
        raise NotApplicable(
            f"needs onnx, onnxscript and onnxruntime ({e.name} is not installed): "
            "pip install 'customops[export]' onnxruntime"
        ) from e
    for sample in _configurations(spec, "cpu")[: 1 if quick else None]:
        tensors = tuple(t.contiguous() for t in sample.tensors())
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path = os.path.join(tmp, f"{spec.name}.onnx")
            torch.onnx.export(
                OpModule(spec, sample),
                tensors,
                path,
                dynamo=True,
                custom_translation_table=ONNX_TRANSLATION_TABLE,
                opset_version=ONNX_OPSET,
                input_names=[f"in{i}" for i in range(len(tensors))],
                verbose=False,
            )
            proto = onnx.load(path)
            onnx.checker.check_model(proto, full_check=True)
            domains = {n.domain for n in proto.graph.node} | {f.domain for f in proto.functions}
            assert domains <= {"", "ai.onnx"}, f"{spec.name}: non-standard ONNX domains {domains}"
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            outs = session.run(None, {f"in{i}": t.numpy() for i, t in enumerate(tensors)})
        got = tuple(torch.from_numpy(o) for o in outs)
        assert_matches_reference(spec, sample, got if len(got) > 1 else got[0], torch.float32, "ONNX Runtime")


# --- user errors ------------------------------------------------------------------------------


def _raised(fn, *args, **kwargs) -> Optional[BaseException]:
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (which exception, and its message, is what is checked)
        return e
    return None


def check_errors(spec: OpSpec, device: str, quick: bool = False) -> None:
    """Every error input raises a RuntimeError that names the argument (``expected <arg> ``)
    and holds the details, from the kernel; under torch.compile (fullgraph, aot_eager) too,
    whether the fake kernel refuses it while tracing or the kernel when the graph runs; and on
    meta tensors the fake kernel refuses those it must (``ErrorInput.fake_refuses``) the same way,
    and may compute an output for the others (dtype and value checks live in the kernels)."""
    _need_device(device)
    errors = spec.errors(device)
    assert errors or quick, f"{spec.name} has no error inputs: add error_inputs to its spec"
    for case in errors[: 1 if quick else None]:
        s, named = case.sample, f"customops: expected {case.arg} "
        where = f"{spec.name}, error input {named!r} {list(case.details)}"
        assert case.details, f"{where}: give the details the message must hold (what was expected, what was given)"
        eager = _raised(_call, spec, s)
        assert isinstance(eager, RuntimeError), f"{where}: eager raised {eager!r}, not a RuntimeError"
        message = str(eager).splitlines()[0]
        assert message.startswith(named), f"{where}: the message {message!r} does not start with {named!r}"
        for part in case.details:
            assert part in message, f"{where}: {part!r} is not in the message {message!r}"
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a, **k: spec.op(*a, **k), backend="aot_eager", fullgraph=True)
        traced = _raised(compiled, *s.args, **s.kwargs)
        torch._dynamo.reset()
        assert isinstance(traced, RuntimeError) and all(p in str(traced) for p in (named, *case.details)), (
            f"{where}: under torch.compile it raised {traced!r}, without the argument and details"
        )
        if any(t.device.type != device for t in s.tensors()):
            continue  # a mixed-device call has no meta equivalent
        meta = _raised(_call, spec, s.map_tensors(lambda t: t.to("meta")))
        if case.fake_refuses:
            assert isinstance(meta, RuntimeError) and all(p in str(meta) for p in (named, *case.details)), (
                f"{where}: the fake kernel {'returned' if meta is None else f'raised {meta!r}'}; it must refuse "
                "the call with the kernel's argument and details (torch._check in customops/ops/<op>.py)"
            )
        else:
            assert meta is None or (isinstance(meta, RuntimeError) and named in str(meta)), (
                f"{where}: the fake kernel raised {meta!r}, which does not name the argument"
            )


# --- CUDA runtime ------------------------------------------------------------------------------


def _differentiable(spec: OpSpec) -> bool:
    return "autograd" not in spec.unsupported


def _reference_grads(spec: OpSpec, sample: SampleInput, cotangents):
    """Gradients of the reference, in float64, w.r.t. the inputs that require grad."""
    s = _float64(sample).map_tensors(lambda t: t.requires_grad_(t.is_floating_point()))
    wanted = [t for t, orig in zip(s.tensors(), sample.tensors()) if orig.requires_grad]
    with torch.enable_grad():
        outs = _as_tuple(spec.reference(*s.args, **s.kwargs))
        pairs = [(o, c) for o, c in zip(outs, cotangents) if c is not None]
        return torch.autograd.grad([o for o, _ in pairs], wanted, [c.double() for _, c in pairs], allow_unused=True)


def _assert_grads(spec, sample, grads, ref_grads, dtype, what):
    tol = spec.tolerance(dtype)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        if r is None:
            continue
        torch.testing.assert_close(
            g.double().cpu(),
            r.cpu(),
            atol=10 * tol["atol"],
            rtol=10 * tol["rtol"],
            msg=lambda m, i=i: f"{spec.name} ({what}), sample {sample.name!r}, grad {i}: {m}",
        )


def _with_grad(spec: OpSpec, sample: SampleInput) -> SampleInput:
    """The sample with requires_grad on its floating tensors (a fresh leaf each)."""
    if not _differentiable(spec):
        return sample
    return sample.map_tensors(lambda t: t.detach().clone().requires_grad_(t.is_floating_point()))


def _grads(outs, sample, cotangents):
    inputs = [t for t in sample.tensors() if t.requires_grad]
    pairs = [(o, c) for o, c in zip(outs, cotangents) if c is not None and o.requires_grad]
    if not inputs or not pairs:
        return []
    return torch.autograd.grad([o for o, _ in pairs], inputs, [c for _, c in pairs], allow_unused=True)


def check_cuda_stream(spec: OpSpec, device: str, quick: bool = False) -> None:
    """The first sample's inputs are written on a side stream behind a long sleep, then the op
    (and its backward) runs there: a kernel launched on another stream than the current one
    would read the old (zero) inputs."""
    _need_device(device)
    sample = _with_grad(spec, first_sample(spec, "cuda"))
    zeros = sample.map_tensors(lambda t: torch.zeros_like(t).requires_grad_(t.requires_grad))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # about 25 ms at 2 GHz
        with torch.no_grad():
            for z, t in zip(zeros.tensors(), sample.tensors()):
                z.copy_(t)
        outs = _as_tuple(_call(spec, zeros))
        cotangents = [torch.ones_like(o) if o.is_floating_point() and o.numel() else None for o in outs]
        grads = _grads(outs, zeros, cotangents)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert_matches_reference(spec, sample, outs if len(outs) > 1 else outs[0], torch.float32, "side stream")
    if grads:
        _assert_grads(spec, sample, grads, _reference_grads(spec, sample, cotangents), torch.float32, "side stream")


def check_cuda_graph(spec: OpSpec, device: str, quick: bool = False) -> None:
    """The op on the first sample captured in a CUDA graph, replayed three times with new
    values (the sample drawn from other seeds) copied into the static inputs (float32 and
    bfloat16, where supported); then
    ``torch.compile(mode="reduce-overhead")`` (CUDA graphs through Inductor) over three calls
    with new inputs."""
    _need_device(device)
    dtypes = [d for d in (torch.float32, torch.bfloat16) if d in spec.dtypes_on("cuda")][: 1 if quick else None]
    for dtype in dtypes:
        static = spec.samples("cuda", dtype)[0]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm up (cuBLAS workspaces, lazy initialisation) off the graph
                _call(spec, static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = _call(spec, static)
        for k in range(3):
            new = spec.samples("cuda", dtype, seed=k + 1)[0]  # the same call, new values
            for t, n in zip(static.tensors(), new.tensors()):
                t.copy_(n)
            graph.replay()
            torch.cuda.synchronize()
            assert_matches_reference(spec, new, static_out, dtype, f"CUDA graph replay {k}")
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda *a, **kw: spec.op(*a, **kw), mode="reduce-overhead", fullgraph=True)
    try:
        for k in range(3):
            sample = spec.samples("cuda", torch.float32, seed=k)[0]
            out = compiled(*sample.args, **sample.kwargs)
            out = tuple(o.clone() for o in out) if isinstance(out, (tuple, list)) else out.clone()
            assert_matches_reference(spec, sample, out, torch.float32, f"reduce-overhead call {k}")
        assert counters["inductor"]["cudagraph_skips"] == 0, (
            f"{spec.name}: Inductor skipped CUDA graphs: {dict(counters['inductor'])}"
        )
    finally:
        torch._dynamo.reset()


def assert_launch_fails(kernel: str, setup: str, call: str, what: str = "") -> None:
    """In a fresh process in which the test hook ``CUSTOMOPS_TEST_FAIL_LAUNCH=<kernel>`` gives
    ``kernel`` an invalid block size, the Python ``call`` (after ``setup``) raises a
    RuntimeError naming the kernel, and another op works afterwards (the error is not sticky)."""
    after, expected = (
        ("customops.sigmoid(x)", "torch.sigmoid(x)") if kernel == "add_kernel" else ("customops.add(x, x)", "x + x")
    )
    script = f"""import torch, customops
{setup}
try:
    {call}
    torch.cuda.synchronize()
except RuntimeError as e:
    print("RAISED:", e)
else:
    print("NO ERROR")
x = torch.randn(64, 64, device="cuda")
print("AFTER:", torch.allclose({after}, {expected}))
"""
    env = dict(os.environ, CUSTOMOPS_TEST_FAIL_LAUNCH=kernel)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{what}{kernel}: {proc.stderr[-3000:]}"
    # CUDA calls the bad block size "invalid argument" or "invalid configuration argument".
    assert f"RAISED: customops: CUDA kernel {kernel} failed to launch: invalid" in proc.stdout, (
        f"{what}no failed launch of {kernel} was reported: {proc.stdout}"
    )
    assert "AFTER: True" in proc.stdout, proc.stdout


def check_cuda_launch(spec: OpSpec, device: str, quick: bool = False) -> None:
    """Each kernel of ``spec.cuda_kernels``, launched by its sample, through
    :func:`assert_launch_fails`."""
    _need_device(device)
    if not spec.cuda_kernels:
        raise NotApplicable(f"{spec.name} launches no CUDA kernel of its own")
    for kernel, sample_name in list(spec.cuda_kernels.items())[: 1 if quick else None]:
        setup = (
            "from customops.testing import OP_SPECS\n"
            f"spec = next(s for s in OP_SPECS if s.name == {spec.name!r})\n"
            f"sample = spec.sample({sample_name!r}, 'cuda')"
        )
        assert_launch_fails(
            kernel, setup, "spec.op(*sample.args, **sample.kwargs)", f"{spec.name}, sample {sample_name!r}: "
        )


# --- one entry point ------------------------------------------------------------------------


def run_path(
    spec: OpSpec,
    path: str,
    device: str,
    quick: bool = False,
    aoti_package: Optional[Callable[[], Tuple[PackedOps, str]]] = None,
    serve: Optional[Callable[[], str]] = None,
) -> None:
    """Checks ``spec`` on ``path`` and ``device``. The AOTInductor paths need ``aoti_package``
    (returns ``(model, path)`` of a package from :func:`build_aoti_package` for ``device``), the
    C++ paths ``serve`` (returns the path of the built customops_serve)."""
    if device not in PATHS[path]:
        raise NotApplicable(f"{path} runs on {', '.join(PATHS[path])} only")
    simple = {
        "eager": check_eager,
        "autograd": check_autograd,
        "opcheck": check_opcheck,
        "compile": check_compile,
        "export": check_export,
        "torchscript": check_torchscript,
        "onnx": check_onnx,
        "errors": check_errors,
        "cuda_stream": check_cuda_stream,
        "cuda_graph": check_cuda_graph,
        "cuda_launch": check_cuda_launch,
    }
    if path in simple:
        simple[path](spec, device, quick=quick)
        return
    _need_device(device)
    if path == "aoti":
        check_aoti(spec, aoti_package)
    elif path == "aoti_cpp":
        check_aoti_cpp(spec, aoti_package, serve(), device)
    elif path == "torchscript_cpp":
        check_torchscript_cpp(spec, device, serve())
    else:
        raise ValueError(f"unknown path {path!r}; expected one of {list(PATHS)}")
