"""fused_linear_sigmoid against eager (``torch.sigmoid(F.linear(x, w, b))``) over an M x (K, N)
grid, forward, one dtype: the kernel the dispatch picks for each shape
(``customops::_fused_linear_sigmoid_cuda_kernel``) and eager / ours, worst first. Checks the
dispatch rule at shapes no benchmark table lists. Times: benchmarks/common.py's
bench_round_robin (L2 flushed, implementations in turn, median of 3 rounds).

    python benchmarks/bench_dispatch_grid.py [--dtype bfloat16] [--worst 15]
"""

import argparse

import torch
import torch.nn.functional as F

import customops
from common import bench_round_robin

KN = [(256, 256), (512, 2048), (1024, 4096), (4096, 4096), (4096, 1024), (2048, 8192), (768, 3072)]
MS = [1, 2, 4, 8, 9, 12, 16, 24, 32, 48, 64, 96, 128, 256, 511, 512, 1024, 2048, 8192]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--worst", type=int, default=15, help="rows to print, worst ratio first")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for k, n in KN:
        for m in MS:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
            b = torch.randn(n, device="cuda", dtype=dtype)
            t = bench_round_robin(
                {
                    "ours": lambda: customops.fused_linear_sigmoid(x, w, b),
                    "eager": lambda: torch.sigmoid(F.linear(x, w, b)),
                }
            )
            kernel = torch.ops.customops._fused_linear_sigmoid_cuda_kernel(x, w, b)
            rows.append((m, k, n, kernel, t["ours"], t["eager"], t["eager"] / t["ours"]))
    rows.sort(key=lambda r: r[-1])
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; worst {args.worst} (eager / ours):"
    )
    for m, k, n, kernel, ours, eager, ratio in rows[: args.worst]:
        print(f"M={m} K={k} N={n} {kernel} ours {ours:.1f} us eager {eager:.1f} us ratio {ratio:.3f}")
    below = sum(r[-1] < 0.98 for r in rows)
    print(f"shapes: {len(rows)}, below 0.98: {below}, median ratio {rows[len(rows) // 2][-1]:.3f}")


if __name__ == "__main__":
    main()
