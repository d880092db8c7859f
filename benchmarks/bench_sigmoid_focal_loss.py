"""Benchmark: customops.sigmoid_focal_loss against torchvision's composite (eager) and
torch.compile of the composite, forward and forward + backward, time and peak memory.

    python benchmarks/bench_sigmoid_focal_loss.py [--out benchmarks/results] [--device cuda|cpu] [--quick]

The target (H200): float32 logits (65536, 80), reduction "sum", forward + backward
at least 3x faster and peak memory at least 3x lower than the eager composite; the table
says whether this run meets it. Also reduction "none" and bfloat16.

Method (as bench_fused_linear_sigmoid.py): every implementation is first checked against a
float64 reference (loss and grad_inputs, relative error); CUDA times are medians of
CUDA-event timings with the L2 flushed before each run (triton.testing.do_bench, imported
from benchmarks/common.py); peak memory is torch.cuda.max_memory_allocated() during
one call minus the memory allocated before it (inputs, targets and grad_out excluded; the
returned loss and gradient included). Bytes are the minimum any implementation must move
(forward: read logits and targets, plus write the loss for "none"; backward: read logits,
targets and, for "none", grad_out, write grad_inputs), so GB/s is effective bandwidth.
Targets do not require grad (the usual training case). `--device cpu` is a smoke run:
wall-clock medians, no memory figures. Writes
sigmoid_focal_loss_<GPU>_torch<version>_<date>.md and .json to --out.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

import customops
from customops.testing.op_specs import sigmoid_focal_loss_reference

CASES = [  # (rows, classes, dtype, reduction); the first is the target case
    (65536, 80, "float32", "sum"),
    (65536, 80, "float32", "none"),
    (65536, 80, "float32", "mean"),
    (65536, 80, "bfloat16", "sum"),
    (65536, 80, "bfloat16", "none"),
    (8192, 80, "float32", "sum"),
]
QUICK_CASES = [(2048, 80, "float32", "sum"), (2048, 80, "float32", "none"), (2048, 80, "bfloat16", "sum")]
TARGET = dict(rows=65536, classes=80, dtype="float32", reduction="sum", speedup=3.0, memory=3.0)


# torchvision.ops.sigmoid_focal_loss's body: what a user writes without the fused op.
torchvision_sigmoid_focal_loss = sigmoid_focal_loss_reference


def make_timer(device):
    if device == "cuda":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from common import do_bench  # CUDA events, L2 flushed, median (µs)

        return do_bench

    def cpu_bench(fn, reps=15):
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    return cpu_bench


def peak_memory_bytes(fn, device):
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def bench_case(rows, classes, dtype_name, reduction, device, timer, compile_composite):
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    x = (torch.randn(rows, classes, device=device) * 3).to(dtype).requires_grad_()
    t = (torch.rand(rows, classes, device=device) < 0.02).to(dtype)  # detection-like: few positives
    grad_out = (
        torch.ones((), device=device, dtype=dtype)
        if reduction != "none"
        else torch.randn(rows, classes, device=device, dtype=dtype)
    )
    n, elt = x.numel(), x.element_size()
    fwd_bytes = (2 + (reduction == "none")) * n * elt
    bwd_bytes = (3 + (reduction == "none")) * n * elt

    impls = {
        "customops": lambda a, b: customops.sigmoid_focal_loss(a, b, 0.25, 2.0, reduction),
        "eager composite": lambda a, b: torchvision_sigmoid_focal_loss(a, b, 0.25, 2.0, reduction),
    }
    if compile_composite:
        torch._dynamo.reset()
        compiled = torch.compile(torchvision_sigmoid_focal_loss, dynamic=False)
        impls["compiled composite"] = lambda a, b: compiled(a, b, 0.25, 2.0, reduction)

    xd = x.detach().double().requires_grad_()
    ref = torchvision_sigmoid_focal_loss(xd, t.double(), 0.25, 2.0, reduction)
    (ref_grad,) = torch.autograd.grad(ref, (xd,), grad_out.double())

    row = dict(
        rows=rows,
        classes=classes,
        dtype=dtype_name,
        reduction=reduction,
        numel=n,
        fwd_bytes=fwd_bytes,
        fwd_bwd_bytes=fwd_bytes + bwd_bytes,
    )
    for name, fn in impls.items():

        def forward():
            with torch.no_grad():
                return fn(x, t)

        def forward_backward():
            loss = fn(x, t)
            return loss, torch.autograd.grad(loss, (x,), grad_out)[0]

        loss, grad = forward_backward()  # also compiles, outside the timings
        err = max(rel_err(loss, ref), rel_err(grad, ref_grad))
        if not err <= (1e-2 if dtype != torch.float32 else 1e-4):
            raise AssertionError(f"{name} {rows}x{classes} {dtype_name} {reduction}: relative error {err:.3g}")
        del loss, grad
        row[name] = dict(
            err=err,
            fwd_us=timer(forward),
            fwd_bwd_us=timer(forward_backward),
            fwd_peak_bytes=peak_memory_bytes(forward, device),
            fwd_bwd_peak_bytes=peak_memory_bytes(forward_backward, device),
        )
        r = row[name]
        r["fwd_gbs"] = fwd_bytes / r["fwd_us"] / 1e3
        r["fwd_bwd_gbs"] = (fwd_bytes + bwd_bytes) / r["fwd_bwd_us"] / 1e3
    return row


def fmt_mib(b):
    return "n/a" if b is None else f"{b / 2**20:.1f}"


def fmt_table(rows, names):
    lines = [
        "| shape | dtype | reduction | impl | fwd (µs) | fwd GB/s | fwd+bwd (µs) | fwd+bwd GB/s | fwd+bwd peak (MiB) "
        "| fwd peak (MiB) | composite / ours, time | composite / ours, memory | rel err |",
        "|" + "---|" * 13,
    ]
    for row in rows:
        ours = row["customops"]
        for name in names:
            if name not in row:
                continue
            r = row[name]
            eager = row["eager composite"]
            if name == "customops":
                speed = f"{eager['fwd_bwd_us'] / ours['fwd_bwd_us']:.2f}×"
                mem = (
                    "n/a"
                    if ours["fwd_bwd_peak_bytes"] in (None, 0)
                    else f"{eager['fwd_bwd_peak_bytes'] / ours['fwd_bwd_peak_bytes']:.2f}×"
                )
            else:
                speed = mem = ""
            lines.append(
                f"| {row['rows']}×{row['classes']} | {row['dtype']} | {row['reduction']} | {name} | {r['fwd_us']:.1f} "
                f"| {r['fwd_gbs']:.1f} | {r['fwd_bwd_us']:.1f} | {r['fwd_bwd_gbs']:.1f} "
                f"| {fmt_mib(r['fwd_bwd_peak_bytes'])} "
                f"| {fmt_mib(r['fwd_peak_bytes'])} | {speed} | {mem} | {r['err']:.1e} |"
            )
    return "\n".join(lines)


def target_verdict(rows):
    for row in rows:
        if (row["rows"], row["classes"], row["dtype"], row["reduction"]) == (
            TARGET["rows"],
            TARGET["classes"],
            TARGET["dtype"],
            TARGET["reduction"],
        ):
            ours, eager = row["customops"], row["eager composite"]
            speedup = eager["fwd_bwd_us"] / ours["fwd_bwd_us"]
            if ours["fwd_bwd_peak_bytes"] is None:
                return f"target case timed at {speedup:.2f}× (memory not measured on this device)", None
            memory = eager["fwd_bwd_peak_bytes"] / max(ours["fwd_bwd_peak_bytes"], 1)
            ok = speedup >= TARGET["speedup"] and memory >= TARGET["memory"]
            return (
                f"{'MET' if ok else 'NOT MET'}: float32 (65536, 80) sum, forward + backward "
                f"{speedup:.2f}× faster (target ≥ 3×), peak memory {memory:.2f}× lower (target ≥ 3×)"
            ), ok
    return "target case not in this run", None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile of the composite")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: run with --device cpu --quick for a smoke run", file=sys.stderr)
        return 2

    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    )
    date = datetime.date.today().isoformat()
    timer = make_timer(args.device)
    cases = QUICK_CASES if args.quick else CASES
    names = ["customops", "eager composite"] + ([] if args.no_compile else ["compiled composite"])
    rows = []
    for rows_, classes, dtype_name, reduction in cases:
        rows.append(bench_case(rows_, classes, dtype_name, reduction, args.device, timer, not args.no_compile))
        print(fmt_table(rows[-1:], names).split("\n", 2)[2], flush=True)
    verdict, met = target_verdict(rows)

    os.makedirs(args.out, exist_ok=True)
    tag = device_name.replace(" ", "_").replace("(", "").replace(")", "") if args.device == "cuda" else "cpu"
    stem = os.path.join(args.out, f"sigmoid_focal_loss_{tag}_torch{torch.__version__.split('+')[0]}_{date}")
    command = "python benchmarks/bench_sigmoid_focal_loss.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = (
        f"# sigmoid_focal_loss on {device_name}\n\n"
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, customops {customops.__version__}, {date}, "
        f"Python {platform.python_version()}. Command: `{command}`\n\n"
        "Forward + backward = the loss and torch.autograd.grad w.r.t. the logits (targets do not require grad). "
        + (
            "Times: medians, µs, CUDA events, L2 flushed (triton.testing.do_bench). Peak memory: "
            "torch.cuda.max_memory_allocated() during one call minus what was allocated before it. "
            if args.device == "cuda"
            else "Times: wall-clock medians, µs (a smoke run; no memory figures). "
        )
        + "GB/s: the minimum bytes (see the script's docstring) over the time. alpha = 0.25, gamma = 2.\n\n"
        f"**Target**: {verdict}\n\n" + fmt_table(rows, names) + "\n"
    )
    with open(stem + ".md", "w") as f:
        f.write(md)
    with open(stem + ".json", "w") as f:
        json.dump(
            dict(
                device=device_name,
                torch=torch.__version__,
                cuda=torch.version.cuda,
                date=date,
                command=command,
                target=TARGET,
                target_met=met,
                rows=rows,
            ),
            f,
            indent=1,
        )
    print(md)
    print(f"wrote {stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
