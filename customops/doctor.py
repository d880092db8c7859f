"""Health report: does customops work on this machine, on every path?

    python -m customops.doctor [--device cpu|cuda|all] [--aoti] [--json PATH]

Prints torch's and CUDA's versions, the GPU and its compute capability, the op library's path
and the kernels compiled into it, then a matrix of ops × paths (eager, autograd, torch.compile,
torch.export, TorchScript, ONNX, AOTInductor), each cell ``pass``, ``FAIL`` (with the reason
below the table) or ``n/a`` (with why). Each cell is a quick run on small inputs, checked
against the op's reference (PyTorch's composite of the same math). Exits 1 if any cell fails.
The ops, their sample inputs and references come from customops.testing.OP_SPECS, as the
tests' do. AOTInductor compiles one package for every op (about a minute on a small CPU), so
it runs only with ``--aoti``.
"""

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
from typing import Dict, List

import torch

import customops
from customops._library import missing_arch_message
from customops.testing import OP_SPECS
from customops.testing import paths as _paths

# The report's columns: paths of customops.testing.PATHS that need no C++ build. Each op and
# its sample inputs come from its spec (customops/testing/op_specs.py), the one list of ops
# that the tests use too.
PATHS = ["eager", "autograd", "compile", "export", "torchscript", "onnx", "aoti"]


def _aoti_package(device: str, tmp: str, aoti: bool):
    """The AOTInductor package for ``device``, one for every op, built on first use."""
    built = {}

    def get():
        if not aoti:
            raise _paths.NotApplicable("slow: run with --aoti")
        if "package" not in built:
            specs = [s for s in OP_SPECS if "aoti" not in s.unsupported]
            path = os.path.join(tmp, f"ops_{device}.pt2")
            try:
                built["package"] = (_paths.build_aoti_package(specs, device, path), path)
            except Exception as e:
                built["package"] = e
        if isinstance(built["package"], Exception):
            raise built["package"]
        return built["package"]

    return get


def run_matrix(devices: List[str], aoti: bool = False, specs=None) -> Dict[str, Dict[str, str]]:
    """{"<op> (<device>)": {path: "pass" | "FAIL: ..." | "n/a: ..."}} for every op and device.
    Each cell checks the op's first sample (``quick``); ``specs`` defaults to every op."""
    matrix = {}
    with tempfile.TemporaryDirectory() as tmp:
        for device in devices:
            package = _aoti_package(device, tmp, aoti)
            for spec in OP_SPECS if specs is None else specs:
                row = {}
                for path in PATHS:
                    if path in spec.unsupported:
                        row[path] = f"n/a: {spec.unsupported[path]}"
                        continue
                    try:
                        _paths.run_path(spec, path, device, quick=True, aoti_package=package)
                        row[path] = "pass"
                    except _paths.NotApplicable as e:
                        row[path] = f"n/a: {e}"
                    except Exception as e:  # a failing path is the report's content, not a crash
                        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                        row[path] = f"FAIL: {type(e).__name__}: {first[:300]}"
                matrix[f"{spec.name} ({device})"] = row
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
    built = customops.build_info()  # as the loaded library reports itself
    info["library built against torch"] = built.get("torch")
    if built.get("cuda_kernels"):
        info["CUDA architectures compiled"] = " ".join(built.get("cuda_archs", []))
        info["CUTLASS sm90a kernels"] = "yes" if built.get("cutlass_sm90_kernels") else "no"
    for name, where in (("C++ server", customops.server_path), ("CMake prefix path", customops.cmake_prefix_path)):
        try:
            info[name] = where()
        except FileNotFoundError as e:
            info[name] = f"missing ({e})"
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info[f"GPU {i}"] = f"{p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB"
            missing = missing_arch_message((p.major, p.minor), p.name, built.get("cuda_archs", []))
            if built.get("cuda_kernels") and missing:
                info[f"GPU {i}"] += " -- NO CODE FOR IT IN THIS BUILD: " + missing
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
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda", "all"],
        default="all",
        help="devices to check (all: the CPU, and CUDA where a GPU is visible)",
    )
    parser.add_argument(
        "--aoti", action="store_true", help="also build and load an AOTInductor package (one for every op)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    args = parser.parse_args(argv)
    # torch.onnx's exporter logs a warning per torchvision op it cannot register when
    # torchvision is absent: noise above the report that concerns none of our ops.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
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
