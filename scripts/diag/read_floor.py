"""How fast can one kernel read B bytes that are not in L2, under the benchmark's timing?

Issue 4's small-M targets (1×4096×4096 at 3.5 TB/s, 32×4096×4096 at 3.3 TB/s) are set against
the copy bandwidth of a 2 GiB copy; the weight there is 32 MiB. This times a plain streaming read
(Triton: each program sums BLOCK-element slices, with many loads in flight, and writes one
float) and torch's own reduction and copy, for buffer sizes from 8 MiB to 2 GiB, with the two
flushes of scripts/diag/flush_method.py: triton.testing.do_bench's (zero 256 MB before each call)
and a read of 256 MB before each call (no dirty lines left in L2).

    python scripts/diag/read_floor.py

Prints µs and TB/s (bytes read, plus bytes written for the copy) per size and method.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _read_kernel(src, partial, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(partial + pid, tl.sum(acc))


def triton_read(src, partial, block=4096, iters=4):
    n = src.numel()
    grid = (triton.cdiv(n, block * iters),)
    _read_kernel[grid](src, partial, n, BLOCK=block, ITERS=iters, num_warps=8)


def time_us(fn, flush):
    """Median of CUDA-event timings, one flush before each call."""
    for _ in range(5):
        flush()
        fn()
    times = []
    for _ in range(50):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main():
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    flushes = {"zero 256 MB": cache.zero_, "read 256 MB": lambda: cache.sum(dtype=torch.int32)}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"{'MiB':>6} {'flush':<12} {'triton read':>18} {'torch sum':>18} {'torch copy (r+w)':>20}")
    for mib in (8, 16, 32, 64, 128, 512, 2048):
        src = torch.randn(mib * 2**20 // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        partial = torch.empty(triton.cdiv(src.numel(), 4096 * 4), device="cuda", dtype=torch.float32)
        triton_read(src, partial)
        assert torch.allclose(partial.sum(), src.float().sum(), rtol=1e-3, atol=1.0), "triton read sums wrong"
        nbytes = src.numel() * 2
        for fname, flush in flushes.items():
            r = time_us(lambda: triton_read(src, partial), flush)
            s = time_us(lambda: src.sum(), flush)
            c = time_us(lambda: dst.copy_(src), flush)
            print(f"{mib:>6} {fname:<12} {r:8.1f} µs {nbytes / r / 1e6:5.2f} TB/s {s:8.1f} µs {nbytes / s / 1e6:5.2f} TB/s"
                  f" {c:8.1f} µs {2 * nbytes / c / 1e6:5.2f} TB/s", flush=True)
        del src, dst, partial


if __name__ == "__main__":
    main()
