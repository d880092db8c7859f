"""Where deform_conv2d's time goes on CUDA: GPU time per kernel (torch.profiler) at the grid's
8x256x64x64 layer (float16 and bfloat16, NCHW and channels_last, 4 offset groups, depthwise),
and host work per batch-1 call (1x512x32x32 -> 256, 1x1 and 3x3, float16): wall time per call
(200 calls, synchronised once) against F.conv2d's (forward, or forward + backward), and the
ATen calls by self CPU time.

    python benchmarks/profile_deform_conv2d.py [--top 14] [--float32]

Per-call microseconds; "events" is the CUDA-event time per call, "kernels" the sum of the
kernels' times: where events exceed kernels, the host bounds the call.
"""

import argparse
import collections
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import customops
from bench_deform_conv2d import Shape, make_inputs  # benchmarks/ is sys.path[0] when run as a script

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def inputs(shape, grad=False):
    """The benchmark's inputs for shape, as deform_conv2d's keyword arguments."""
    return dict(make_inputs(shape, "cuda", grad), padding=shape.pad)


def step_fn(kw, backward, op=customops.deform_conv2d):
    call = lambda: op(**kw)  # noqa: E731
    grad = torch.ones_like(call())
    leaves = [v for v in kw.values() if isinstance(v, torch.Tensor) and v.requires_grad]

    def step():
        if backward:
            for v in leaves:
                v.grad = None
            call().backward(grad)
        else:
            with torch.no_grad():
                call()

    return step


def gpu_profile(step, n=10):
    """Over n calls of step (after 3 warm-up calls): CUDA-event microseconds per call, and per
    kernel name its GPU microseconds and launches per call (torch.profiler)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        step()
    end.record()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    time_, count = collections.Counter(), collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            time_[ev.name[:100]] += ev.device_time / n
            count[ev.name[:100]] += 1 / n
    return start.elapsed_time(end) * 1e3 / n, time_, count


def print_kernels(time_, count, top):
    for key, us in time_.most_common(top):
        print(f"   {us:8.1f} us  x{count[key]:.1f}  {key[:90]}")


def kernels(name, kw, backward, top):
    events, time_, count = gpu_profile(step_fn(kw, backward))
    print(f"== {name}: events {events:.0f} us/call, kernels {sum(time_.values()):.0f}")
    print_kernels(time_, count, top)


def wall_us(fn, n):
    """Wall time per call of n calls after 20 warm-up calls, synchronised once at the end."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def host(name, kw, backward, top, n=200):
    step = step_fn(kw, backward)
    per_call = wall_us(step, n)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    averages = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    events = sum(e.count for e in averages) / 20
    conv_kw = {k: kw[k].detach().requires_grad_(backward) for k in ("input", "weight", "bias")}
    conv = step_fn(conv_kw | {"padding": kw["padding"]}, backward, torch.nn.functional.conv2d)
    print(
        f"== host {name}: {per_call:.1f} us/call wall, {events:.0f} profiled events/call; "
        f"F.conv2d {wall_us(conv, n):.1f} us/call"
    )
    for e in averages[:top]:
        print(f"   self {e.self_cpu_time_total / 20:7.1f} us  x{e.count / 20:4.1f}  {e.key[:70]}")


def gpu_args(doc, top):
    """A profile's --top, parsed; exits with a message where no CUDA GPU is visible, else prints
    which GPU and torch run it."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=top, help="rows per table")
    parser.add_argument(
        "--float32", action="store_true", help="the grid's float32 layers instead, IEEE and TF32, GPU time only"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"{parser.prog}: needs a CUDA GPU (torch.cuda.is_available() is False)")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    return args


def float32_kernels(top):
    """The grid's three float32 layers, IEEE and with TF32 allowed, forward and forward + backward."""
    for tf32 in (True, False):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for shape in [
            Shape(8, 256, 64, 64, 256, 1, 1, F32, False),
            Shape(2, 64, 256, 256, 64, 1, 1, F32, False),
            Shape(16, 512, 32, 32, 512, 1, 1, F32, False),
        ]:
            for backward in (False, True):
                what = "forward + backward" if backward else "forward"
                name = f"{shape.name()} float32{', TF32' if tf32 else ''} {what}"
                kernels(name, inputs(shape, grad=backward), backward, top)
    torch.backends.cuda.matmul.allow_tf32 = False


def main():
    args = gpu_args(__doc__, top=14)
    if args.float32:
        return float32_kernels(args.top)
    for name, shape, backward in [
        ("float16 forward", Shape(8, 256, 64, 64, 256, 1, 1, F16, False), False),
        ("float16 channels_last forward", Shape(8, 256, 64, 64, 256, 1, 1, F16, True), False),
        ("bfloat16 forward", Shape(8, 256, 64, 64, 256, 1, 1, BF16, False), False),
        ("float16 4 offset groups forward", Shape(8, 256, 64, 64, 256, 1, 4, F16, False), False),
        ("float16 forward + backward", Shape(8, 256, 64, 64, 256, 1, 1, F16, False), True),
        ("float16 channels_last forward + backward", Shape(8, 256, 64, 64, 256, 1, 1, F16, True), True),
        ("bfloat16 forward + backward", Shape(8, 256, 64, 64, 256, 1, 1, BF16, False), True),
        ("depthwise float16 forward + backward", Shape(8, 256, 64, 64, 256, 256, 1, F16, False), True),
        ("depthwise float32 forward + backward", Shape(8, 256, 64, 64, 256, 256, 1, F32, False), True),
    ]:
        kernels(f"8x256x64x64 {name}", inputs(shape, grad=backward), backward, args.top)
    for k in (1, 3):
        shape = Shape(1, 512, 32, 32, 256, 1, 1, F16, False, k=k, pad=k // 2)
        for backward in (False, True):
            what = "forward + backward" if backward else "forward"
            host(f"1x512x32x32 {k}x{k} float16 {what}", inputs(shape, grad=backward), backward, args.top)


if __name__ == "__main__":
    main()
