"""Health report: does customops work on this machine, on every path?

    python -m customops.doctor [--device cpu|cuda|all] [--aoti] [--json PATH]

Prints torch's and CUDA's versions, the GPU and its compute capability, the op library's path
and the kernels compiled into it, then a matrix of ops × paths (eager, autograd, torch.compile,
torch.export, TorchScript, ONNX, AOTInductor), each cell ``pass``, ``FAIL`` (with the reason
below the table) or ``n/a`` (with why). Each cell is a quick run on small inputs, checked
against the op's reference (PyTorch's composite of the same math). Exits 1 if any cell fails.
AOTInductor compiles a package per op (about a minute each on a small CPU), so it runs only
with ``--aoti``.
"""

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import warnings
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

import customops

PATHS = ["eager", "autograd", "compile", "export", "torchscript", "onnx", "aoti"]


@dataclasses.dataclass
class OpCase:
    name: str
    make_inputs: Callable[[str, torch.dtype], Tuple[torch.Tensor, ...]]
    reference: Callable[..., torch.Tensor]


def _g(device, dtype, *shape):
    gen = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


CASES = [
    OpCase(
        "fused_linear_sigmoid",
        lambda d, t: (_g(d, t, 5, 8), _g(d, t, 3, 8), _g(d, t, 3)),
        lambda x, w, b: torch.sigmoid(F.linear(x, w, b)),
    ),
    OpCase("add", lambda d, t: (_g(d, t, 4, 6), _g(d, t, 4, 7)[:, :6]), lambda a, b: a + b),
    OpCase("sigmoid", lambda d, t: (_g(d, t, 4, 6),), torch.sigmoid),
]


class _Call(torch.nn.Module):
    def __init__(self, op_name: str):
        super().__init__()
        self.op = getattr(torch.ops.customops, op_name)

    def forward(self, *args):
        return self.op(*args)


def _script_function(op_name: str, n_args: int):
    # TorchScript needs a fixed signature: one scripted function per op and arity.
    params = ", ".join(f"a{i}" for i in range(n_args))
    src = f"def forward({params}):\n    return torch.ops.customops.{op_name}({params})\n"
    return torch.jit.CompilationUnit(src).forward


class _NotApplicable(Exception):
    """A path that does not apply here; the report shows why."""


def _close(out, ref):
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def _eager(case, device):
    args = case.make_inputs(device, torch.float32)
    _close(getattr(torch.ops.customops, case.name)(*args), case.reference(*args))


def _autograd(case, device):
    args = [a.requires_grad_() for a in case.make_inputs(device, torch.float64)]
    op = getattr(torch.ops.customops, case.name)
    torch.autograd.gradcheck(op, args)
    torch.autograd.gradgradcheck(op, args)


def _compile(case, device):
    torch._dynamo.reset()
    args = case.make_inputs(device, torch.float32)
    fn = torch.compile(_Call(case.name), fullgraph=True, dynamic=True)
    _close(fn(*args), case.reference(*args))


def _export(case, device):
    args = case.make_inputs(device, torch.float32)
    ep = torch.export.export(_Call(case.name), tuple(a.contiguous() for a in args))
    _close(ep.module()(*args), case.reference(*args))


def _torchscript(case, device):
    args = case.make_inputs(device, torch.float32)
    _close(_script_function(case.name, len(args))(*args), case.reference(*args))


def _onnx(case, device):
    if device != "cpu":
        raise _NotApplicable("checked once, on the CPU (ONNX Runtime's CPU provider)")
    try:
        import onnxruntime as ort

        from customops.export import ONNX_TRANSLATION_TABLE
    except ImportError as e:
        raise _NotApplicable(f"needs the export extra ({e.name} is not installed)")
    args = tuple(a.contiguous() for a in case.make_inputs(device, torch.float32))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = os.path.join(tmp, "op.onnx")
        torch.onnx.export(
            _Call(case.name), args, path, dynamo=True, custom_translation_table=ONNX_TRANSLATION_TABLE,
            input_names=[f"in{i}" for i in range(len(args))], verbose=False,
        )
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (out,) = sess.run(None, {f"in{i}": a.numpy() for i, a in enumerate(args)})
    _close(torch.from_numpy(out), case.reference(*args))


def _aoti(case, device, enabled):
    from customops.export import aoti_python_loading_works

    if not enabled:
        raise _NotApplicable("slow: run with --aoti")
    if not aoti_python_loading_works():
        raise _NotApplicable(f"torch {torch.__version__}'s Python AOTInductor loader crashes; use export/cpp")
    args = tuple(a.contiguous() for a in case.make_inputs(device, torch.float32))
    ep = torch.export.export(_Call(case.name), args)
    with tempfile.TemporaryDirectory() as tmp:
        path = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp, "op.pt2"))
        out = torch._inductor.aoti_load_package(path)(*args)
    _close(out, case.reference(*args))


def run_matrix(devices: List[str], aoti: bool = False) -> Dict[str, Dict[str, str]]:
    """{"<op> (<device>)": {path: "pass" | "FAIL: ..." | "n/a: ..."}} for every op and device."""
    checks = {
        "eager": _eager, "autograd": _autograd, "compile": _compile, "export": _export,
        "torchscript": _torchscript, "onnx": _onnx, "aoti": lambda c, d: _aoti(c, d, aoti),
    }
    matrix = {}
    for device in devices:
        for case in CASES:
            row = {}
            for path in PATHS:
                try:
                    checks[path](case, device)
                    row[path] = "pass"
                except _NotApplicable as e:
                    row[path] = f"n/a: {e}"
                except Exception as e:  # a failing path is the report's content, not a crash
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    row[path] = f"FAIL: {type(e).__name__}: {first[:300]}"
            matrix[f"{case.name} ({device})"] = row
    return matrix


def environment() -> Dict[str, str]:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch CUDA build": str(torch.version.cuda),
        "customops": customops.__version__,
        "op library": customops.library_path(),
        "kernels compiled": ", ".join(customops.compiled_backends()),
    }
    build_info = os.path.join(os.path.dirname(customops.__file__), "_build_info.json")
    if os.path.exists(build_info):
        with open(build_info) as f:
            built = json.load(f)
        info["library built against torch"] = built.get("built_against_torch")
        if built.get("cuda_kernels"):
            info["CUDA architectures compiled"] = built.get("cuda_arch_list")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info[f"GPU {i}"] = f"{p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB"
        info["CUDA archs in torch"] = " ".join(torch.cuda.get_arch_list())
    else:
        info["GPU"] = "none visible"
    return info


def format_report(info: Dict[str, str], matrix: Dict[str, Dict[str, str]]) -> str:
    lines = ["customops doctor", ""] + [f"  {k}: {v}" for k, v in info.items()] + [""]
    lines.append("| op (device) | " + " | ".join(PATHS) + " |")
    lines.append("|---" * (len(PATHS) + 1) + "|")
    notes = []
    for row_name, row in matrix.items():
        cells = []
        for path in PATHS:
            status = row[path]
            if status == "pass":
                cells.append("pass")
            else:
                kind, why = status.split(": ", 1)
                if why not in notes:
                    notes.append(why)
                cells.append(f"{kind} [{notes.index(why) + 1}]")
        lines.append(f"| {row_name} | " + " | ".join(cells) + " |")
    lines += [""] + [f"[{i + 1}] {why}" for i, why in enumerate(notes)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m customops.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                        help="devices to check (all: the CPU, and CUDA where a GPU is visible)")
    parser.add_argument("--aoti", action="store_true", help="also build and load an AOTInductor package per op")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    args = parser.parse_args(argv)
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if args.device == "all" and not torch.cuda.is_available():
        devices = ["cpu"]
    if "cuda" in devices and not torch.cuda.is_available():
        print("customops doctor: --device cuda, but no CUDA GPU is visible", file=sys.stderr)
        return 2
    info = environment()
    matrix = run_matrix(devices, aoti=args.aoti)
    print(format_report(info, matrix))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": info, "matrix": matrix}, f, indent=1)
    failed = any(v.startswith("FAIL") for row in matrix.values() for v in row.values())
    print("\nresult:", "some paths FAIL" if failed else "every applicable path passes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
