"""Export a model that uses customops' ops to TorchScript, AOTInductor and ONNX.

    python -m customops.export examples/train_digits.py:make_model --input-shape 8,64 \\
        [--dynamic 0,1] [--state-dict weights.pt] [--formats pt pt2 onnx] [--out exported] [--name model] \\
        [--triton-max-batch 256 | --no-triton]

MODEL is ``package.module:callable`` or ``path/to/file.py:callable``; the callable returns the
nn.Module (its weights then come from --state-dict, a torch.save'd state_dict). --input-shape
gives one example input; --dynamic
lists its dimensions exported as dynamic: by default 0, the batch (1..65535); any other
dimension listed gets 1..65536. Beside the files, OUT/triton/ holds Triton Inference Server
model repositories (pytorch/ for the PyTorch backend with LD_PRELOAD, python/ for the Python
backend; OUT/triton/README.md gives the command lines).
"""

import argparse
import importlib
import importlib.util
import os
import sys

import torch

from . import DEFAULT_MAX_BATCH, DEFAULT_MAX_DIM, FORMATS, export_model
from .triton import DEFAULT_MAX_BATCH_SIZE


def _load_model(parser, spec: str):
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        parser.error(f"MODEL must look like package.module:callable or file.py:callable, got {spec!r}")
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise ImportError(f"no file {module_name!r}")
            loader = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        factory = getattr(module, attr)
    except (ImportError, AttributeError) as e:
        parser.error(f"cannot find {spec!r}: {e}")
    return factory()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m customops.export", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="package.module:callable or file.py:callable returning the nn.Module")
    parser.add_argument("--input-shape", required=True, help="example input shape, e.g. 8,64")
    parser.add_argument(
        "--dynamic",
        default="0",
        help=f"comma-separated dimensions of the input exported as dynamic, e.g. 0,1 (default 0: the batch, "
        f"1..{DEFAULT_MAX_BATCH}; others 1..{DEFAULT_MAX_DIM})",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--state-dict", help="torch.save'd state_dict to load into the model")
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    parser.add_argument("--out", default="exported")
    parser.add_argument("--name", default="model")
    parser.add_argument(
        "--triton-max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH_SIZE,
        help=f"max_batch_size of the Triton model configs: the most rows of a request and of a batch that Triton "
        f"forms (default {DEFAULT_MAX_BATCH_SIZE}; 0: no batching)",
    )
    parser.add_argument("--no-triton", action="store_true", help="do not write the Triton model repositories")
    args = parser.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    if args.triton_max_batch < 0:
        parser.error(f"--triton-max-batch must be >= 0, got {args.triton_max_batch}")
    try:
        shape = tuple(int(s) for s in args.input_shape.split(","))
    except ValueError:
        parser.error(f"--input-shape must be comma-separated integers such as 8,64, got {args.input_shape!r}")
    if not shape or min(shape) < 1:
        parser.error(f"--input-shape needs at least one dimension, each >= 1, got {args.input_shape!r}")
    try:
        dynamic = tuple(int(s) for s in args.dynamic.split(",")) if args.dynamic.strip() else ()
    except ValueError:
        parser.error(f"--dynamic must be comma-separated dimension indices such as 0,1, got {args.dynamic!r}")
    if any(d < 0 or d >= len(shape) for d in dynamic):
        parser.error(
            f"--dynamic {args.dynamic}: the input has dimensions 0..{len(shape) - 1} (--input-shape {args.input_shape})"
        )
    if "onnx" in args.formats:
        import importlib.util

        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        if missing:
            parser.error(
                f"ONNX export needs {' and '.join(missing)}: pip install 'customops[export]' "
                "(or onnx onnxscript), or leave ONNX out with --formats pt pt2"
            )
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is available")
    model = _load_model(parser, args.model)
    if args.state_dict:
        try:
            state = torch.load(args.state_dict, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch.load raises several types for a missing or bad file
            parser.error(f"--state-dict {args.state_dict!r}: cannot load it with torch.load: {e}")
        try:
            model.load_state_dict(state)
        except (RuntimeError, TypeError, AttributeError) as e:
            parser.error(f"--state-dict {args.state_dict!r} does not fit the model: {e}")
    model = model.to(device=args.device, dtype=dtype).eval()
    example = torch.randn(shape, device=args.device, dtype=dtype)
    try:
        paths = export_model(
            model,
            example,
            args.out,
            args.name,
            args.formats,
            dynamic_dims=dynamic,
            triton=not args.no_triton,
            triton_max_batch_size=args.triton_max_batch,
        )
    except (ValueError, RuntimeError) as e:
        print(f"customops.export: error: {e}", file=sys.stderr)
        return 1
    for fmt, path in paths.items():
        print(f"{fmt}: {path}")
    if "onnx" in paths and dtype == torch.bfloat16:
        print(
            "customops.export: note: onnxruntime's CPU provider has no bfloat16 Conv or Gemm kernels; "
            "for onnxruntime, export in float32 (--dtype float32)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
