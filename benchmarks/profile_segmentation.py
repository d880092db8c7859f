"""Where the main job's segmentation network (examples/train_segmentation.py) spends its CUDA
time: the network as trained for 3 epochs, on the 256 held-out canvases, with our
ModulatedDeformConv2d layers and with torchvision's deform_conv2d in their place (the same
weights). Per network: wall time per call (the main job's latency_ms), CUDA-event time, and the
kernels by GPU time (torch.profiler, 10 calls).

    python benchmarks/profile_segmentation.py [--top 20]
"""

import copy
import os
import sys

import torch

from profile_deform_conv2d import (  # benchmarks/ is sys.path[0] when run as a script
    gpu_args,
    gpu_profile,
    print_kernels,
)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import train_segmentation as seg  # noqa: E402
from train_digits import latency_ms  # noqa: E402


def report(name, net, x, top):
    def step():
        with torch.no_grad():
            net(x)

    print(f"== {name}: {latency_ms(net, x, runs=20, warmup=3):.3f} ms per call (wall, synchronised)")
    events, time_, count = gpu_profile(step)
    print(
        f"   events {events:.0f} us per call; kernels {sum(time_.values()):.0f} us, {sum(count.values()):.0f} per call"
    )
    print_kernels(time_, count, top)


def main():
    args = gpu_args(__doc__, top=20)
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
