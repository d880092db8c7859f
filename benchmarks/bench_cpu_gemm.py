"""The CPU GEMMs of deform_conv2d's columns by BLAS (``at::mm``: MKL in torch's x86 wheels) and
by oneDNN (a 1x1 convolution over a channels-last view of the rows, as
``onednn_gemm`` in csrc/ops/deform_conv2d/deform_conv2d_cpu.cpp runs them): the forward's
``rows (m, k) x weight (n, k)^T`` and the weight gradient's ``grad_out (m, n)^T x rows (m, k)``,
at sizes from under 1 MFLOP to the columns of published networks' layers. Medians of
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
          (1024, 1152, 128), (4096, 576, 64), (3640, 2304, 256), (784, 4608, 512), (2048, 2048, 2048)]  # fmt: skip


def as_image(rows):
    m, k = rows.shape
    return rows.view(1, m, 1, k).permute(0, 3, 1, 2)


def cases(m, k, n):
    a, w, go = torch.randn(m, k), torch.randn(n, k), torch.randn(m, n)
    w4 = w.view(n, k, 1, 1)
    conv_bw = torch.ops.aten.convolution_backward
    return {
        ("forward", "blas"): lambda: torch.mm(a, w.t()),
        ("forward", "onednn"): lambda: torch.nn.functional.conv2d(as_image(a), w4),
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
    lines = [
        "| m x k x n | MFLOP | forward BLAS (us) | forward oneDNN (us) | BLAS / oneDNN | "
        "weight grad BLAS (us) | weight grad oneDNN (us) | BLAS / oneDNN |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, k, n in SHAPES:
        fns = cases(m, k, n)
        times = {key: [] for key in fns}
        for r in range(args.rounds):
            for key in fns if r % 2 == 0 else reversed(fns):
                timer = Timer("fn()", globals={"fn": fns[key]}, num_threads=args.threads)
                times[key].append(timer.blocked_autorange(min_run_time=0.2).median * 1e6)
        t = {key: statistics.median(v) for key, v in times.items()}
        f, g = (
            (t[("forward", "blas")], t[("forward", "onednn")]),
            (t[("weight grad", "blas")], t[("weight grad", "onednn")]),
        )
        lines.append(
            f"| {m} x {k} x {n} | {2 * m * k * n / 1e6:.1f} | {f[0]:.0f} | {f[1]:.0f} | {f[0] / f[1]:.2f} "
            f"| {g[0]:.0f} | {g[1]:.0f} | {g[0] / g[1]:.2f} |"
        )
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
