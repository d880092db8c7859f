"""Six small-M launches at M = 1, then six at M = 32 (K = N = 4096, bf16), for ncu."""
import torch

import customops

for m in (1, 32):
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(6):
        customops.fused_linear_sigmoid(x, w)
torch.cuda.synchronize()
