"""Host (CPU) time per call of fused_linear_sigmoid against eager's two calls
(``torch.sigmoid(F.linear(x, w, b))``) at launch-bound shapes, where the host's work, not the
kernels', sets the time: per-call CPU time of the calling thread (``time.process_time_ns``, so
other processes on the machine do not count), inputs with and without ``requires_grad``.
On CUDA the kernels run asynchronously and are tiny, so the figure is the launch path alone.

    python benchmarks/bench_host_overhead.py [--device cpu|cuda] [--calls 3000] [--rounds 5]

One thread (``torch.set_num_threads(1)``): at these shapes the GEMM needs no second one, and a
second would only add the thread pool's wake-ups to both sides.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import customops

SHAPES = [(32, 64, 16), (1, 256, 64), (8, 128, 32), (64, 256, 256)]  # (rows, in_features, out_features)


def cpu_us_per_call(fn, calls):
    start = time.process_time_ns()
    for _ in range(calls):
        fn()
    return (time.process_time_ns() - start) / calls / 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best and the median are shown")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, customops {customops.__version__}, float32, one thread")
    print("| rows x in -> out | requires_grad | eager (us/call) | ours (us/call) | ours / eager |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for m, k, n in SHAPES:
        for grad in (False, True):
            x = torch.randn(m, k, device=dev, requires_grad=grad)
            w = torch.randn(n, k, device=dev, requires_grad=grad)
            b = torch.randn(n, device=dev, requires_grad=grad)
            impls = {
                "eager": lambda: torch.sigmoid(F.linear(x, w, b)),
                "ours": lambda: customops.fused_linear_sigmoid(x, w, b),
            }
            times = {key: [] for key in impls}
            for r in range(args.rounds):
                for key in impls if r % 2 == 0 else reversed(impls):  # alternate the order
                    impls[key]()  # warm
                    times[key].append(cpu_us_per_call(impls[key], args.calls))
            if dev.type == "cuda":
                torch.cuda.synchronize()
            eager, ours = (statistics.median(times[key]) for key in ("eager", "ours"))
            worst = max(worst, ours / eager)
            print(
                f"| {m} x {k} -> {n} | {grad} | {eager:.2f} (best {min(times['eager']):.2f}) "
                f"| {ours:.2f} (best {min(times['ours']):.2f}) | {ours / eager:.2f} |"
            )
    print(f"medians over {args.rounds} rounds of {args.calls} calls; worst ours / eager: {worst:.2f}")


if __name__ == "__main__":
    main()
