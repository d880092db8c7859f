"""Kernel-level times of one forward + backward (bf16), ours against eager, from torch.profiler:
where the time of benchmarks' backward rows goes. Prints each kernel's total CUDA time."""
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import customops

for m, k, n in [(32, 4096, 4096), (8192, 1024, 4096)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).requires_grad_()
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    for name, fn in [("customops", customops.fused_linear_sigmoid), ("eager", lambda x, w, b: torch.sigmoid(F.linear(x, w, b)))]:
        for _ in range(5):
            torch.autograd.grad(fn(x, w, b), (x, w, b), g)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                torch.autograd.grad(fn(x, w, b), (x, w, b), g)
            torch.cuda.synchronize()
        print(f"== {name} {m}x{k}x{n}, 10 iterations")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
