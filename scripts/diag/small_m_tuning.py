"""Small-M kernel against the generic path (eager's addmm + sigmoid), eager and mm alone, bf16,
K = 4096, M from 1 to 64, plus a read-only reference at the same bytes (w.sum(), ATen's
reduction over the weight): the data behind the small-M thresholds in
fused_linear_sigmoid_cuda.cu. Medians of 3 interleaved rounds, L2 flushed; the small-M kernel
is also checked against float64."""
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import customops


def forced(env, fn):
    def call():
        os.environ.update(env)
        try:
            return fn()
        finally:
            for key in env:
                del os.environ[key]
    return call


shapes = [(4096, 4096), (16384, 4096), (1024, 4096)]
ms = [int(a) for a in sys.argv[1:]] or [1, 2, 4, 8, 16, 24, 32, 48, 64]
for n, k in shapes:
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        op = lambda: customops.fused_linear_sigmoid(x, w, b)  # noqa: E731
        impls = {"read_w": lambda: w.sum(), "mm": lambda: torch.mm(x, w.t()),
                 "eager": lambda: torch.sigmoid(F.linear(x, w, b)),
                 "generic": forced({"CUSTOMOPS_FLS_CUDA_KERNEL": "generic"}, op)}
        impls["small_m"] = forced({"CUSTOMOPS_FLS_CUDA_KERNEL": "small_m"}, op)
        ref = torch.sigmoid(F.linear(x.double(), w.double(), b.double()))
        errs = {name: ((impls[name]().double() - ref).norm() / ref.norm()).item() for name in impls if name.startswith("small")}
        times = {name: [] for name in impls}
        for _ in range(3):
            for name, fn in impls.items():
                times[name].append(do_bench(fn, warmup=10, rep=30, return_mode="median") * 1e3)
        nbytes = 2 * (m * k + n * k + n + m * n)
        print(f"N={n} K={k} M={m}: " + ", ".join(
            f"{name} {sorted(t)[1]:.1f} µs ({nbytes / sorted(t)[1] / 1e6:.2f} TB/s)" for name, t in times.items())
            + "; rel err " + ", ".join(f"{name} {e:.1e}" for name, e in errs.items()), flush=True)
