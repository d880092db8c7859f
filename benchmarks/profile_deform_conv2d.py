"""Where deform_conv2d's time goes on CUDA: GPU time per kernel (torch.profiler) at the grid's
8x256x64x64 layer (float16 and bfloat16, NCHW and channels_last, 4 offset groups, depthwise),
and host work per batch-1 call (1x512x32x32 -> 256, 1x1 and 3x3, float16): wall time per call
(200 calls, synchronised once) against F.conv2d's, and the ATen calls by self CPU time.

    python benchmarks/profile_deform_conv2d.py [--top 14]

Per-call microseconds; "events" is the CUDA-event time per call, "kernels" the sum of the
kernels' times: where events exceed kernels, the host bounds the call.
"""

import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile

import customops

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def inputs(B, C, H, W, C_out, k=3, groups=1, og=1, dtype=F16, channels_last=False, grad=False):
    g = torch.Generator().manual_seed(0)

    def t(*s, scale=1.0, uniform=False):
        x = torch.rand(s, generator=g) if uniform else torch.randn(s, generator=g) * scale
        return x.to("cuda", dtype).requires_grad_(grad)

    x = t(B, C, H, W)
    if channels_last:
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_(grad)
    return dict(
        input=x,
        offset=t(B, 2 * og * k * k, H, W, scale=2.0),
        weight=t(C_out, C // groups, k, k, scale=0.1),
        bias=t(C_out),
        padding=k // 2,
        mask=t(B, og * k * k, H, W, uniform=True),
    )


def step_fn(kw, backward):
    call = lambda: customops.deform_conv2d(**kw)  # noqa: E731
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


def kernels(name, kw, backward, top, n=10):
    step = step_fn(kw, backward)
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
            time_[ev.name[:90]] += ev.device_time / n
            count[ev.name[:90]] += 1 / n
    print(f"== {name}: events {start.elapsed_time(end) * 1e3 / n:.0f} us/call, kernels {sum(time_.values()):.0f}")
    for key, us in time_.most_common(top):
        print(f"   {us:8.1f} us  x{count[key]:.1f}  {key}")


def host(name, kw, backward, top, n=200):
    step = step_fn(kw, backward)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - t0) / n * 1e6
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    averages = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    events = sum(e.count for e in averages) / 20
    line = f"== host {name}: {per_call:.1f} us/call wall, {events:.0f} profiled events/call"
    if not backward:
        conv = lambda: torch.nn.functional.conv2d(kw["input"], kw["weight"], kw["bias"], 1, kw["padding"])  # noqa: E731
        with torch.no_grad():
            for _ in range(20):
                conv()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                conv()
            torch.cuda.synchronize()
        line += f"; F.conv2d {(time.perf_counter() - t0) / n * 1e6:.1f} us/call"
    print(line)
    for e in averages[:top]:
        print(f"   self {e.self_cpu_time_total / 20:7.1f} us  x{e.count / 20:4.1f}  {e.key[:70]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=14, help="rows per table")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    layer = (8, 256, 64, 64, 256)
    for name, extra, backward in [
        ("float16 forward", {}, False),
        ("float16 channels_last forward", dict(channels_last=True), False),
        ("bfloat16 forward", dict(dtype=BF16), False),
        ("float16 4 offset groups forward", dict(og=4), False),
        ("float16 forward + backward", {}, True),
        ("float16 channels_last forward + backward", dict(channels_last=True), True),
        ("depthwise float16 forward + backward", dict(groups=256), True),
        ("depthwise float32 forward + backward", dict(groups=256, dtype=F32), True),
    ]:
        kernels(f"8x256x64x64 {name}", inputs(*layer, grad=backward, **extra), backward, args.top)
    for k in (1, 3):
        for backward in (False, True):
            what = "forward + backward" if backward else "forward"
            host(
                f"1x512x32x32 {k}x{k} float16 {what}",
                inputs(1, 512, 32, 32, 256, k=k, grad=backward),
                backward,
                args.top,
            )


if __name__ == "__main__":
    main()
