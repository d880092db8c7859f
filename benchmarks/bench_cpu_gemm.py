"""The CPU GEMMs of deform_conv2d's columns by BLAS (``at::mm``: MKL in torch's x86 wheels) and
by oneDNN (a 1x1 convolution over a channels-last view of the rows, as
``onednn_gemm`` in csrc/ops/deform_conv2d/deform_conv2d_cpu.cpp runs them): the forward's
``rows (m, k) x weight (n, k)^T``, the grad columns' ``grad_out (m, n) x weight (n, k)`` (the
convolution's input gradient) and the weight gradient's ``grad_out (m, n)^T x rows (m, k)``, at
sizes from under 1 MFLOP to the columns of published networks' layers, and weight-heavy ones of
few rows. Medians of
torch.utils.benchmark, the two backends alternating over ``--rounds`` passes.

    python benchmarks/bench_cpu_gemm.py [--threads 2] [--rounds 3] [--out benchmarks/results]
"""

import argparse
import datetime
import os
import platform
import statistics

import torch
from torch.utils.benchmark import Timer

# (m rows, k = in_channels * kh * kw, n = out_channels): a few tiny products, then the columns
# of the CPU benchmark's layers (a chunk of output pixels each).
SHAPES = [(16, 64, 16), (64, 144, 32), (196, 576, 64), (256, 1152, 128), (784, 576, 64),
          (1024, 1152, 128), (4096, 576, 64), (3640, 2304, 256), (784, 4608, 512), (2048, 2048, 2048),
          (49, 4608, 512), (256, 25088, 256), (512, 12544, 256), (1024, 12544, 256)]  # fmt: skip


def as_image(rows):
    m, k = rows.shape
    return rows.view(1, m, 1, k).permute(0, 3, 1, 2)


def cases(m, k, n):
    a, w, go = torch.randn(m, k), torch.randn(n, k), torch.randn(m, n)
    w4 = w.view(n, k, 1, 1)
    conv_bw = torch.ops.aten.convolution_backward
    rows = torch.empty(1, k, m, 1, memory_format=torch.channels_last)  # the input gradient's sizes
    return {
        ("forward", "blas"): lambda: torch.mm(a, w.t()),
        ("forward", "onednn"): lambda: torch.nn.functional.conv2d(as_image(a), w4),
        ("grad columns", "blas"): lambda: torch.mm(go, w),
        ("grad columns", "onednn"): lambda: conv_bw(
            as_image(go), rows, w4, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, False, False]
        ),
        ("weight grad", "blas"): lambda: torch.mm(go.t(), a),
        ("weight grad", "onednn"): lambda: conv_bw(
            as_image(go), as_image(a), w4, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, False]
        ),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kinds = ("forward", "grad columns", "weight grad")
    cols = " | ".join(f"{kind} BLAS (us) | {kind} oneDNN (us) | BLAS / oneDNN" for kind in kinds)
    lines = [f"| m x k x n | MFLOP | {cols} |", "|---|---|" + "---|---|---|" * len(kinds)]
    for m, k, n in SHAPES:
        fns = cases(m, k, n)
        times = {key: [] for key in fns}
        for r in range(args.rounds):
            for key in fns if r % 2 == 0 else reversed(fns):
                timer = Timer("fn()", globals={"fn": fns[key]}, num_threads=args.threads)
                times[key].append(timer.blocked_autorange(min_run_time=0.2).median * 1e6)
        t = {key: statistics.median(v) for key, v in times.items()}
        cells = [
            f"{t[kind, 'blas']:.0f} | {t[kind, 'onednn']:.0f} | {t[kind, 'blas'] / t[kind, 'onednn']:.2f}"
            for kind in kinds
        ]
        lines.append(f"| {m} x {k} x {n} | {2 * m * k * n / 1e6:.1f} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    header = (
        f"# deform_conv2d's CPU GEMMs: BLAS against oneDNN\n\n{cpu}, {os.cpu_count()} CPUs, {args.threads} threads, "
        f"torch {torch.__version__} (BLAS: {'MKL' if torch.backends.mkl.is_available() else 'not MKL'}), "
        f"{datetime.date.today()}. Command: `python benchmarks/bench_cpu_gemm.py --threads {args.threads} "
        f"--rounds {args.rounds}`.\n\n"
    )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"cpu_gemm_{datetime.date.today()}.md")
        with open(path, "w") as f:
            f.write(header + "\n".join(lines) + "\n")
        print("wrote", path)


if __name__ == "__main__":
    main()
