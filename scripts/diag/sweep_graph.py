"""The M sweep's small rows timed two ways: plainly (each call launched from Python, as the
benchmark does) and as CUDA-graph replays (the GPU's work alone, no host time in the way).

In the benchmark's sweep the generic path (eager's own addmm + sigmoid_, bit for bit eager's
output) has timed 3-15 µs slower than eager at one or two M values per run, a different M each
run, while the table row of the same shape timed equal (benchmarks/NOTES.md). If the graph
columns agree where the plain ones differ, the difference is host-side, not the kernels.

    python scripts/diag/sweep_graph.py [--m 1 8 16 32 64 128 256 512]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))
import customops  # noqa: E402
from common import bench_round_robin, graphed  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="*", default=[1, 8, 16, 32, 64, 128, 256, 512])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    k = n = 4096
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; K = N = 4096, bf16, µs, median of "
          f"{args.rounds} round-robin rounds")
    print(f"{'M':>5} {'ours':>7} {'eager':>7} {'mm':>7} | {'ours graph':>10} {'eager graph':>11} {'mm graph':>9}")
    for m in args.m:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        fns = {"ours": lambda: customops.fused_linear_sigmoid(x, w, b),
               "eager": lambda: torch.sigmoid(F.linear(x, w, b)),
               "mm": lambda: torch.mm(x, w.t())}
        impls = dict(fns)
        impls.update({f"{name} graph": graphed(fn) for name, fn in fns.items()})
        t = bench_round_robin(impls, rounds=args.rounds)
        print(f"{m:>5} {t['ours']:7.1f} {t['eager']:7.1f} {t['mm']:7.1f} | {t['ours graph']:10.1f} "
              f"{t['eager graph']:11.1f} {t['mm graph']:9.1f}", flush=True)


if __name__ == "__main__":
    main()
