"""Small-M timing spread on the GPU (2026-11-29): the first benchmark run showed our op 2-3x slower
than eager at M=16..64 in the sweep but not in the table. Times each variant twice."""
import torch
import torch.nn.functional as F
from triton.testing import do_bench

import customops

ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
op = torch.ops.customops.fused_linear_sigmoid.default
for m in (1, 16, 32, 64, 4096):
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    op(x, w, b)  # cuBLAS handle and workspace are created outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        op(x, w, b)
    variants = {
        "ours": lambda: customops.fused_linear_sigmoid(x, w, b),
        "ours C++ only (redispatch CUDA)": lambda: op.redispatch(ks, x, w, b),
        "ours graph replay": g.replay,
        "eager": lambda: torch.sigmoid(F.linear(x, w, b)),
        "mm": lambda: torch.mm(x, w.t()),
        "mm_out + sigmoid_": lambda: torch.mm(x, w.t()).add_(b).sigmoid_(),
    }
    cells = []
    for name, fn in variants.items():
        t1 = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
        t2 = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
        cells.append(f"{name} {t1:.1f}/{t2:.1f}")
    print(f"M={m}: " + " | ".join(cells), flush=True)
