"""Small-M kernel against the generic path (cuBLAS + bias/sigmoid pass), eager and mm alone, at
K = N = 4096, bf16, M from 1 to 64 (the data behind the small-M threshold in
fused_linear_sigmoid_cuda.cu). Medians of 3 interleaved rounds, L2 flushed."""
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import customops


def forced(kernel, fn):
    def call():
        os.environ["CUSTOMOPS_FLS_CUDA_KERNEL"] = kernel
        try:
            return fn()
        finally:
            del os.environ["CUSTOMOPS_FLS_CUDA_KERNEL"]
    return call


for n, k in [(4096, 4096), (1024, 4096), (16384, 4096)]:
    for m in [1, 4, 8, 16, 24, 32, 48, 64]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        op = lambda: customops.fused_linear_sigmoid(x, w, b)  # noqa: E731
        impls = {"mm": lambda: torch.mm(x, w.t()), "eager": lambda: torch.sigmoid(F.linear(x, w, b)),
                 "generic": forced("generic", op), "small_m": forced("small_m", op)}
        times = {name: [] for name in impls}
        for _ in range(3):
            for name, fn in impls.items():
                times[name].append(do_bench(fn, warmup=10, rep=30, return_mode="median") * 1e3)
        nbytes = 2 * (m * k + n * k + n + m * n)
        print(f"N={n} K={k} M={m}: " + ", ".join(
            f"{name} {sorted(t)[1]:.1f} µs ({nbytes / sorted(t)[1] / 1e6:.2f} TB/s)" for name, t in times.items()),
            flush=True)
