"""The main job's second stage: train a small segmentation network whose deeper 3x3 convolutions
are modulated deformable convolutions (customops.nn.ModulatedDeformConv2d) on canvases composed
from scikit-learn's digits (no download), report per-class IoU and mIoU on held-out canvases,
check that every exported form gives the same per-pixel predictions, and, where torchvision
imports, time the network against the same network on torchvision's deform_conv2d.

    python examples/train_segmentation.py [--epochs 10] [--device cpu|cuda] [--export-dir DIR]
"""

import argparse
import copy
import os
import sys
import tempfile
import warnings

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_digits  # noqa: E402
from train_digits import latency_ms, load_digits_split, model_forms, serve_outputs  # noqa: E402

from customops.nn import ModulatedDeformConv2d  # noqa: E402

CLASSES = ["background"] + [f"digit {d}" for d in range(10)]


def _overlap(a, b) -> bool:
    """Whether two squares (top, left, side) overlap."""
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def make_canvases(images, labels, count: int, size: int = 48, seed: int = 0):
    """count canvases of size x size, each holding 1 to 3 of images ((N, 8, 8) in [0, 1]), each
    upsampled (bilinear) to a random side of 8 to 24 pixels (1x to 3x) and placed at a random
    position where its box overlaps no other. Labels (count, size, size): 0 for the background,
    1 + the digit where the upsampled digit is brighter than 0.5."""
    rng = np.random.default_rng(seed)
    x = torch.zeros(count, 1, size, size)
    y = torch.zeros(count, size, size, dtype=torch.long)
    for i in range(count):
        boxes = []
        for _ in range(rng.integers(1, 4)):
            side = int(rng.integers(8, 25))
            for _attempt in range(20):
                top, left = (int(v) for v in rng.integers(0, size - side + 1, size=2))
                if not any(_overlap((top, left, side), box) for box in boxes):
                    break
            else:
                continue  # no room left for this one
            boxes.append((top, left, side))
            j = int(rng.integers(len(images)))
            digit = F.interpolate(images[j][None, None], size=(side, side), mode="bilinear", align_corners=False)[0, 0]
            x[i, 0, top : top + side, left : left + side] = digit
            y[i, top : top + side, left : left + side][digit > 0.5] = int(labels[j]) + 1
    return x, y


def load_canvases(train_count: int, test_count: int, size: int = 48):
    """Training canvases from the digits job's training images, held-out ones from its test images."""
    x_train, y_train, x_test, y_test = load_digits_split()
    train = make_canvases(x_train.view(-1, 8, 8), y_train, train_count, size, seed=1)
    test = make_canvases(x_test.view(-1, 8, 8), y_test, test_count, size, seed=2)
    return train + test


def conv(cin: int, cout: int, stride: int = 1, kernel_size: int = 3) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel_size, stride, kernel_size // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
    )


def deform_conv(channels: int) -> nn.Module:
    return nn.Sequential(
        ModulatedDeformConv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
    )


def upsample2x(x):
    """Bilinear upsampling by 2, computed on a channels_last copy: torch's kernels for NCHW
    tensors are the slow ones (its CUDA kernel runs a thread per output pixel that loops over
    the batch and channels: on the H200, 3.4 of this network's 4.1 ms of kernels at a batch of
    256; on 2 CPU threads 11 to 16 ms against 2.1 to 2.3 at 256x48x12x12), and the CPU's results
    are the same, bit for bit. CUDA takes its channels_last kernel only from 16 channels up
    (the rule in torch's UpSampleBilinear2d.cu), so the network upsamples features, not its 11
    logits."""
    return F.interpolate(
        x.contiguous(memory_format=torch.channels_last), scale_factor=2.0, mode="bilinear", align_corners=False
    )


class SegNet(nn.Module):
    """Encoder-decoder: plain 3x3 convolutions down to 1/4 of the input's side, modulated
    deformable 3x3 convolutions there, then up to 1/2 with a skip connection and a 1x1
    convolution, and (bilinear) up to the full side, where a 1x1 convolution classifies each
    pixel. Input (N, 1, H, W) with H and W multiples of 4; output (N, classes, H, W) logits."""

    def __init__(self, classes: int = len(CLASSES), width: int = 32, deep: int = 48) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv(1, width // 2), conv(width // 2, width, stride=2))  # 1/2
        self.down = conv(width, deep, stride=2)  # 1/4
        self.deform = nn.Sequential(deform_conv(deep), deform_conv(deep))
        self.up = conv(deep + width, width, kernel_size=1)
        self.classify = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        skip = self.stem(x)
        deep = self.deform(self.down(skip))
        # The 1x1 classifier commutes with bilinear upsampling (its weights sum to 1 at every
        # pixel): the same function as classifying at 1/2 and upsampling the logits. With 11
        # logit channels CUDA upsampled through its NCHW kernel: 2.0 of the network's 2.8 ms of
        # kernels at a batch of 256 on the H200 (benchmarks/profile_segmentation.py).
        return self.classify(upsample2x(self.up(torch.cat([upsample2x(deep), skip], 1))))


def train(model, x, y, epochs: int, show_progress: bool = True):
    """AdamW with a one-cycle schedule, through the digits job's training loop."""
    return train_digits.train(
        model, x, y, epochs, batch_size=32, lr=3e-3, show_progress=show_progress,
        optimizer=lambda params, lr: torch.optim.AdamW(params, lr=lr, weight_decay=1e-4),
        schedule=lambda opt, lr, steps: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps),
    )  # fmt: skip


def iou_per_class(pred, y, classes: int = len(CLASSES)):
    """IoU of each class over all pixels (nan for a class in neither)."""
    inter = torch.bincount(y[pred == y], minlength=classes).double()
    union = torch.bincount(pred.flatten(), minlength=classes).double() + torch.bincount(y.flatten(), minlength=classes)
    return (inter / (union - inter)).tolist()


def mean_iou(pred, y) -> float:
    return float(np.nanmean(iou_per_class(pred, y)))


class TorchvisionModulatedDeformConv2d(nn.Module):
    """A ModulatedDeformConv2d's computation on torchvision.ops.deform_conv2d, sharing its parameters."""

    def __init__(self, layer: ModulatedDeformConv2d) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x):
        from torchvision.ops import deform_conv2d

        m = self.layer
        out = m.conv_offset(x)
        n = 2 * m.offset_groups * m.kernel_size[0] * m.kernel_size[1]
        offset, mask = out[:, :n], torch.sigmoid(out[:, n:])
        return deform_conv2d(x, offset, m.weight, m.bias, m.stride, m.padding, m.dilation, mask)


def compare_torchvision(model, x, reference) -> None:
    """Prints the network's latency against the same network on torchvision's deform_conv2d,
    whole and for the deformable layers alone, or why that is skipped."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchvision
            import torchvision.ops  # noqa: F401
    except Exception as e:  # not installed, or built for another torch
        print(f"\ntorchvision comparison: skipped: torchvision is not importable here ({type(e).__name__}: {e})")
        return
    tv_model = copy.deepcopy(model)
    layers = [i for i, m in enumerate(tv_model.deform) if isinstance(m[0], ModulatedDeformConv2d)]
    for i in layers:
        tv_model.deform[i][0] = TorchvisionModulatedDeformConv2d(tv_model.deform[i][0])
    inputs = {}
    hooks = [model.deform[i][0].register_forward_hook(lambda m, a, o: inputs.setdefault(m, a[0])) for i in layers]
    with torch.no_grad():
        model(x)
        tv_logits = tv_model(x)
    for h in hooks:
        h.remove()
    agree = (tv_logits.argmax(1) == reference.argmax(1)).float().mean().item()
    diff = (tv_logits - reference).abs().max().item()
    print(
        f"\ntorchvision comparison (torchvision {torchvision.__version__}, the same weights): "
        f"{100 * agree:.2f}% of pixels agree, max abs logit diff {diff:.2e}"
    )

    def ms(fn, x):
        return latency_ms(fn, x, runs=10, warmup=2)

    ours = [model.deform[i][0] for i in layers]
    theirs = [tv_model.deform[i][0] for i in layers]
    ours_layers, tv_layers = sum(ms(m, inputs[m]) for m in ours), sum(ms(t, inputs[m]) for m, t in zip(ours, theirs))
    ours_net, tv_net = ms(model, x), ms(tv_model, x)
    print(f"| latency per batch of {len(x)} (ms) | customops | torchvision | customops' speed-up | target |")
    print("|---|---|---|---|---|")
    for name, a, b, target in [
        (
            f"the {len(layers)} ModulatedDeformConv2d layers (offsets, mask, deform_conv2d)",
            ours_layers,
            tv_layers,
            "3x",
        ),
        ("the whole network", ours_net, tv_net, "1.25x"),
    ]:
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {target} |")


def _evaluate(model, x_test, y_test, export_dir, keep: bool) -> int:
    with torch.no_grad():
        reference = model(x_test)
    pred = reference.argmax(1)
    print("\n| class | IoU (held-out canvases) |")
    print("|---|---|")
    for name, iou in zip(CLASSES, iou_per_class(pred, y_test)):
        print(f"| {name} | {iou:.4f} |")
    print(f"| mIoU | {mean_iou(pred, y_test):.4f} |")

    forms, paths, skipped = model_forms(model, x_test, export_dir, "segmentation", triton=False)
    print(
        "\nexported: "
        + ", ".join(f"{fmt} {path}" for fmt, path in paths.items())
        + ("" if keep else " (a temporary folder, removed at exit: --export-dir DIR keeps them)")
    )
    with torch.no_grad():
        outputs = [(name, fn(x_test), latency_ms(fn, x_test, runs=5, warmup=1)) for name, fn in forms.items()]
        outputs += serve_outputs(paths, x_test, export_dir, skipped, runs=5, warmup=1)
    print(
        "\n| path | pixel accuracy | mIoU | pixels as eager | max abs logit diff vs eager "
        f"| latency per batch of {len(y_test)} (ms) |"
    )
    print("|---|---|---|---|---|---|")
    # On CUDA, cuDNN's convolutions run in TF32 by default (torch.backends.cudnn.allow_tf32) and
    # ONNX Runtime runs on the CPU in float32: the H200 gave logit differences up to 4.5e-3.
    tol = 1e-3 if reference.device.type == "cpu" else 1e-2
    ok = True
    for name, logits, ms in outputs:
        p = logits.argmax(1)
        agree = (p == pred).float().mean().item()
        diff = (logits - reference).abs().max().item()
        ok = ok and agree >= 0.9999 and diff < tol
        acc = (p == y_test).float().mean().item()
        print(f"| {name} | {acc:.4f} | {mean_iou(p, y_test):.4f} | {100 * agree:.3f}% | {diff:.2e} | {ms:.2f} |")
    for name, why in skipped.items():
        print(f"| {name} | skipped: {why} | | | | |")
    if not ok:
        print("error: the forms of the segmentation network disagree", file=sys.stderr)
    compare_torchvision(model, x_test, reference)
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--train-canvases", type=int, default=2000)
    parser.add_argument("--test-canvases", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--export-dir", help="where to write segmentation.{pt,pt2,onnx} (default: a temporary folder)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device(args.device)
    x_train, y_train, x_test, y_test = (t.to(device) for t in load_canvases(args.train_canvases, args.test_canvases))
    print(
        f"segmentation: {len(y_train)} train / {len(y_test)} held-out {x_train.shape[-1]}x{x_train.shape[-1]} "
        f"canvases of 1-3 digits, {len(CLASSES)} classes, device {device}"
    )
    model = train(SegNet().to(device), x_train, y_train, args.epochs, show_progress=not args.no_progress)
    with tempfile.TemporaryDirectory(prefix="customops-segmentation-") as tmp:
        return _evaluate(model, x_test, y_test, args.export_dir or tmp, keep=bool(args.export_dir))


if __name__ == "__main__":
    sys.exit(main())
