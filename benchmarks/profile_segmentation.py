"""Where the main job's segmentation network (examples/train_segmentation.py) spends its CUDA
time: the network as trained for 3 epochs, on the 256 held-out canvases, with our
ModulatedDeformConv2d layers and with torchvision's deform_conv2d in their place (the same
weights). Per network: wall time per call (the main job's latency_ms), CUDA-event time, and the
kernels by GPU time (torch.profiler, 10 calls).

    python benchmarks/profile_segmentation.py [--top 20]
"""

import argparse
import collections
import copy
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import train_segmentation as seg  # noqa: E402
from train_digits import latency_ms  # noqa: E402


def report(name, net, x, top, n=10):
    print(f"== {name}: {latency_ms(net, x, runs=20, warmup=3):.3f} ms per call (wall, synchronised)")
    with torch.no_grad():
        for _ in range(3):
            net(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            net(x)
        end.record()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                net(x)
            torch.cuda.synchronize()
    time_, count = collections.Counter(), collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            time_[ev.name[:100]] += ev.device_time / n
            count[ev.name[:100]] += 1 / n
    print(
        f"   events {start.elapsed_time(end) * 1e3 / n:.0f} us per call; "
        f"kernels {sum(time_.values()):.0f} us, {sum(count.values()):.0f} per call"
    )
    for key, us in time_.most_common(top):
        print(f"   {us:8.1f} us  x{count[key]:.1f}  {key}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=20, help="kernels per table")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    torch.manual_seed(0)
    x_train, y_train, x, _ = (t.to("cuda") for t in seg.load_canvases(2000, 256))
    model = seg.train(seg.SegNet().to("cuda"), x_train, y_train, 3, show_progress=False).eval()
    theirs = copy.deepcopy(model)
    for i, m in enumerate(theirs.deform):
        if isinstance(m[0], seg.ModulatedDeformConv2d):
            theirs.deform[i][0] = seg.TorchvisionModulatedDeformConv2d(m[0])
    report("customops", model, x, args.top)
    report("torchvision", theirs, x, args.top)


if __name__ == "__main__":
    main()
