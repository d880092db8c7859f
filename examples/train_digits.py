"""The main job: train an MLP of FusedLinearSigmoid layers on scikit-learn's handwritten digits
(1,797 8x8 images, 10 classes, shipped inside scikit-learn: no download), export it as
TorchScript, an AOTInductor package and ONNX, and check that every form (eager, torch.compile,
the loaded exports, the C++ server customops_serve, ONNX Runtime) gives the same
predictions on the held-out set. Then its second stage, examples/train_segmentation.py: a
segmentation network with modulated deformable convolutions, on canvases of those digits.

    python examples/train_digits.py [--epochs 30] [--seg-epochs 8 | --no-segmentation]
        [--device cpu|cuda] [--no-progress] [--export-dir DIR]
"""

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from typing import Optional

import torch
from torch import nn

from customops.nn import FusedLinearSigmoid


def load_digits_split(seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0  # pixel intensities 0..16 -> [0, 1]
    y = torch.tensor(data.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(
        torch.arange(len(y)).numpy(), test_size=0.2, random_state=seed, stratify=y.numpy()
    )
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]


def make_model() -> nn.Module:
    return nn.Sequential(FusedLinearSigmoid(64, 128), FusedLinearSigmoid(128, 64), nn.Linear(64, 10))


def train(model, x, y, epochs: int, batch_size: int = 64, lr: float = 1e-2, show_progress: bool = True,
          optimizer=None, schedule=None):  # fmt: skip
    """Minibatch cross-entropy training with a progress bar; ``optimizer(params, lr)`` (default
    Adam) and ``schedule(opt, lr, total_steps)`` (default none, else stepped per batch)."""
    from tqdm import tqdm

    opt = (optimizer or (lambda params, lr: torch.optim.Adam(params, lr=lr)))(model.parameters(), lr)
    sched = schedule(opt, lr, epochs * ((len(y) + batch_size - 1) // batch_size)) if schedule else None
    gen = torch.Generator().manual_seed(0)
    model.train()
    bar = tqdm(range(epochs), desc="training", unit="epoch", disable=not show_progress, file=sys.stdout)
    for _ in bar:
        perm = torch.randperm(len(y), generator=gen).to(x.device)
        total = 0.0
        for i in range(0, len(y), batch_size):
            batch = perm[i : i + batch_size]
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            total += loss.item() * len(batch)
        bar.set_postfix(loss=f"{total / len(y):.4f}")
    model.eval()
    return model


def latency_ms(fn, x, runs: int = 50, warmup: int = 5) -> float:
    """Median wall time of fn(x) in milliseconds, device work (and, for ONNX Runtime, the copies
    to and from the host) included."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    with torch.no_grad():
        for _ in range(warmup):
            fn(x)
        times = []
        for _ in range(runs):
            sync()
            t0 = time.perf_counter()
            fn(x)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def model_forms(model, example, export_dir, name: str = "digits", triton: bool = True):
    """The forms of the trained model that a user ships, exported to export_dir as name.{pt,pt2,onnx}
    (and, with triton, Triton model repositories in export_dir/triton) and loaded back: form ->
    callable. Also returns {format: path} and the forms skipped, with why."""
    from customops.export import export_model, load_aoti, load_torchscript
    from customops.export.aoti import aoti_python_loading_works

    # torch.compile's advice to allow TF32 on a GPU: the comparison below wants IEEE float32.
    warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores for float32 matrix multiplication")
    # torch.compile's own pytree code (torch 2.11 to 2.14); customops.export filters it likewise.
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    forms = {"eager": model, "torch.compile": torch.compile(model, fullgraph=True, dynamic=True)}
    skipped = {}
    formats = ["pt", "pt2"]
    try:
        import onnxruntime
        import onnxscript  # noqa: F401

        formats.append("onnx")
    except ImportError as e:
        skipped["ONNX Runtime (.onnx)"] = f"onnx export needs onnxscript and onnxruntime ({e})"
    paths = export_model(model, example, export_dir, name, formats, triton=triton)
    forms["TorchScript (.pt, loaded)"] = load_torchscript(paths["pt"], map_location=str(example.device))
    if aoti_python_loading_works():
        forms["AOTInductor (.pt2, Python)"] = load_aoti(paths["pt2"])
    else:
        skipped["AOTInductor (.pt2, Python)"] = (
            f"torch {torch.__version__}'s aoti_load_package is known to crash; check the package with the C++ loader"
        )
    if "onnx" in paths:
        session = onnxruntime.InferenceSession(paths["onnx"], providers=["CPUExecutionProvider"])
        input_name = session.get_inputs()[0].name

        def run_onnx(x):
            return torch.from_numpy(session.run(None, {input_name: x.cpu().numpy()})[0]).to(x.device)

        forms["ONNX Runtime (.onnx, CPU)"] = run_onnx
    return forms, paths, skipped


def table_row(name, logits, y, reference, ms):
    """(path, accuracy, max abs diff vs eager, same predictions, latency ms)."""
    return (
        name,
        (logits.argmax(1) == y).float().mean().item(),
        (logits - reference).abs().max().item(),
        bool(torch.equal(logits.argmax(1), reference.argmax(1))),
        ms,
    )


def serve_outputs(paths, x, work_dir, skipped, runs: int = 50, warmup: Optional[int] = None):
    """Runs x through the C++ server customops_serve (shipped in the package) for the TorchScript
    and AOTInductor exports: [(form, output, median ms of runs)]."""
    from customops import server_path
    from customops.export.cpp import run_serve

    try:
        binary = server_path()
    except FileNotFoundError as e:
        skipped["C++ customops_serve"] = str(e)
        return []
    outputs = []
    for fmt in ("pt", "pt2"):
        out, median_ms, _ = run_serve(binary, paths[fmt], x, work_dir, runs, warmup=warmup)
        outputs.append((f"C++ customops_serve (.{fmt})", out.to(x.device), median_ms))
    return outputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--export-dir", help="where to write digits.{pt,pt2,onnx} and segmentation.* (default: a temporary folder)"
    )
    parser.add_argument("--seg-epochs", type=int, help="the segmentation stage's epochs (default its own, 8)")
    parser.add_argument("--no-segmentation", action="store_true", help="skip the segmentation stage")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device(args.device)
    x_train, y_train, x_test, y_test = (t.to(device) for t in load_digits_split())
    print(f"digits: {len(y_train)} train / {len(y_test)} test images, device {device}, torch {torch.__version__}")
    model = train(make_model().to(device), x_train, y_train, args.epochs, show_progress=not args.no_progress)

    with tempfile.TemporaryDirectory(prefix="customops-digits-") as tmp:
        status = _evaluate(model, x_test, y_test, args.export_dir or tmp, keep=bool(args.export_dir))
    if args.no_segmentation:
        return status
    from train_segmentation import main as segmentation_main  # beside this file

    seg_argv = ["--device", args.device]
    seg_argv += ["--epochs", str(args.seg_epochs)] if args.seg_epochs is not None else []
    seg_argv += ["--no-progress"] if args.no_progress else []
    seg_argv += ["--export-dir", args.export_dir] if args.export_dir else []
    print()
    return segmentation_main(seg_argv) or status


def _evaluate(model, x_test, y_test, export_dir, keep: bool) -> int:
    forms, paths, skipped = model_forms(model, x_test, export_dir)
    print(
        "exported: "
        + ", ".join(f"{fmt} {path}" for fmt, path in paths.items())
        + ("" if keep else " (a temporary folder, removed at exit: --export-dir DIR keeps them)")
    )
    with torch.no_grad():
        reference = model(x_test)
        rows = []
        for name, fn in forms.items():
            rows.append(table_row(name, fn(x_test), y_test, reference, latency_ms(fn, x_test)))
        for name, logits, ms in serve_outputs(paths, x_test, export_dir, skipped):
            rows.append(table_row(name, logits, y_test, reference, ms))

    print(
        "\n| path | test accuracy | max abs diff vs eager | same predictions "
        f"| latency per batch of {len(y_test)} (ms) |"
    )
    print("|---|---|---|---|---|")
    for name, acc, diff, same, ms in rows:
        print(f"| {name} | {acc:.4f} | {diff:.2e} | {'yes' if same else 'NO'} | {ms:.3f} |")

    for name, why in skipped.items():
        print(f"| {name} | skipped: {why} | | | |")
    ok = all(same and diff < 1e-4 for _, _, diff, same, _ in rows)
    if not ok:
        print("error: the forms of the model disagree", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
