"""How the way the weight is made cold moves the small-M timings (issue 4's 3.5 TB/s target).

At M = 1 and 32, K = N = 4096, bf16, times w.sum() (a read of the weight alone), mm alone,
eager and customops under three ways of keeping the weight out of the L2 cache:
- zero: triton.testing.do_bench's way (the benchmark's): 256 MB of zeros written before each
  call, which leaves the L2 full of dirty lines to write back while the timed kernel reads;
- read: the same, but the flush reads 256 MB instead of writing it;
- rotate: no flush; each call takes the next of 8 copies of the weight (256 MiB, five times the
  L2), so the weight is cold and nothing is dirty.
Medians of 60 calls, CUDA events around each call."""
import torch
import torch.nn.functional as F

import customops

K = N = 4096
copies = 8
ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5 for _ in range(copies)]
b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
buf = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
flushes = {"zero": buf.zero_, "read": lambda: buf.sum(dtype=torch.int32), "rotate": lambda: None}


def median_us(fn, flush, n=60):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(10):
        fn(i)
    for i in range(n):
        flush()
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, ends))[n // 2] * 1e3


for m in (1, 32):
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    impls = {"w.sum": lambda i: ws[i % copies].sum(), "mm": lambda i: torch.mm(x, ws[i % copies].t()),
             "eager": lambda i: torch.sigmoid(F.linear(x, ws[i % copies], b)),
             "customops": lambda i: customops.fused_linear_sigmoid(x, ws[i % copies], b)}
    nbytes = 2 * (m * K + N * K + N + m * N)
    for name, flush in flushes.items():
        row = {impl: median_us(fn, flush) for impl, fn in impls.items()}
        print(f"M={m} flush={name}: " + ", ".join(f"{k} {v:.1f} µs ({nbytes / v / 1e6:.2f} TB/s)" for k, v in row.items()),
              flush=True)
