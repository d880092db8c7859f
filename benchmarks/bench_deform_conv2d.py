"""customops.deform_conv2d against torchvision.ops.deform_conv2d and the dense conv2d of the same
shape (same groups), forward and forward + backward (gradients for input, offset, mask, weight
and bias). The default grid (``--shapes grid``) is 3x3, stride 1, padding 1, mask given
(DCNv2); ``--shapes models`` takes layers of published networks instead (kernel sizes 1,
3 and 7, strides, dilations, DCNv1, batch 1 and serving batches), ``--shapes grouped`` the
grouped DCN stages of ResNeXt detectors, ``--shapes offset-groups`` layers of narrow offset
groups (2 to 16 channels each), ``--shapes all`` the grid, models and grouped layers, and
``--shapes sweep`` ``--count`` layers drawn at random (``--seed``) from the ranges of published networks' deformable
layers, heads and depthwise blocks included, to find where ours would lose at shapes no table
lists (the results' last lines give the ratios' spread and every row under 1).

CPU (default without a GPU): float32, ``torch.set_num_threads(--threads)``, medians of
torch.utils.benchmark's blocked_autorange. CUDA: medians with the L2 flushed (benchmarks/common.py),
and the extra peak memory of forward + backward. Each row also gives the work it has to do:
the dense convolution's GEMM FLOPs, the bilinear gathers (4 reads and 4 multiply-adds per
sampled value, B * C_in * kh * kw * H_out * W_out values) and the bytes that must move at
least once (inputs, offsets, mask, weight and output), and the floor they give at the device's
ceilings, measured at the start of the run (a large matrix product per dtype, a large copy):
no implementation runs much faster, and ours / floor is how far ours is from it.

    python benchmarks/bench_deform_conv2d.py --out benchmarks/results          # CPU shapes
    python benchmarks/bench_deform_conv2d.py --device cuda --out benchmarks/results
    python benchmarks/bench_deform_conv2d.py --shapes models --out benchmarks/results
    python benchmarks/bench_deform_conv2d.py --shapes sweep --count 40 --out benchmarks/results
"""

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
from typing import NamedTuple, Union

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import customops  # noqa: E402

# float32 with TF32 allowed for matmuls (torch.backends.cuda.matmul.allow_tf32), which
# torchvision's GEMM and ours then use, and for cuDNN's conv2d (torch.backends.cudnn.allow_tf32,
# which is on by default); plain float32 rows run IEEE float32 in all three.
TF32 = "float32, TF32"


class Shape(NamedTuple):
    B: int
    C: int
    H: int
    W: int
    C_out: int
    groups: int
    og: int  # offset groups
    dtype: Union[torch.dtype, str]
    channels_last: bool
    k: int = 3
    stride: int = 1
    pad: int = 1
    dil: int = 1
    mask: bool = True  # False: DCNv1
    note: str = ""

    def out_hw(self):
        def side(n):
            return (n + 2 * self.pad - self.dil * (self.k - 1) - 1) // self.stride + 1

        return side(self.H), side(self.W)

    def name(self):
        s = f"{self.B}x{self.C}x{self.H}x{self.W} -> {self.C_out}"
        if (self.k, self.stride, self.pad, self.dil) != (3, 1, 1, 1):
            s += f", {self.k}x{self.k} s{self.stride} p{self.pad}" + (f" d{self.dil}" if self.dil > 1 else "")
        s += f", groups {self.groups}" if self.groups > 1 else ""
        s += f", offset_groups {self.og}" if self.og > 1 else ""
        s += ", channels_last" if self.channels_last else ""
        s += "" if self.mask else ", no mask"
        return s + (f" ({self.note})" if self.note else "")


f32, f16 = torch.float32, torch.float16
CPU_SHAPES = [
    Shape(1, 64, 64, 64, 64, 1, 1, f32, False),
    Shape(2, 128, 32, 32, 128, 1, 1, f32, False),
    Shape(1, 256, 32, 32, 256, 256, 1, f32, False),  # depthwise
]
CUDA_SHAPES = [
    Shape(8, 256, 64, 64, 256, 1, 1, f32, False),
    Shape(8, 256, 64, 64, 256, 1, 1, TF32, False),
    Shape(8, 256, 64, 64, 256, 1, 1, f16, False),
    Shape(8, 256, 64, 64, 256, 1, 1, torch.bfloat16, False),
    Shape(2, 64, 256, 256, 64, 1, 1, f32, False),
    Shape(2, 64, 256, 256, 64, 1, 1, TF32, False),
    Shape(16, 512, 32, 32, 512, 1, 1, f32, False),
    Shape(16, 512, 32, 32, 512, 1, 1, TF32, False),
    Shape(8, 256, 64, 64, 256, 1, 1, f16, True),
    Shape(8, 256, 64, 64, 256, 1, 4, f16, False),
    Shape(8, 256, 64, 64, 256, 256, 1, f32, False),
    Shape(8, 256, 64, 64, 256, 256, 1, f16, False),
]


def model_shapes(dtype, batches):
    """Deformable layers of published networks, at each of ``batches`` (1: one image served):
    ResNet-50 with DCNv2 in stages 3 and 4 (Zhu et al. 2019; Mask R-CNN at 800 x 1333, so
    stride 16 is 50 x 84, and stage 4 opens with a stride-2 3x3); DCNv1 in stage 3 (Dai et al.
    2017, no mask); stage 4 at a classifier's 224 x 224 input (7 x 7: more output channels
    than output pixels, a weight larger than the columns); an ASPP head of deformable 1x1, 3x3
    and 7x7 branches (BiRefNet's ASPPDeformable) at stride 32 of a 1024 x 1024 input; a
    dilated 3x3 (DeepLab-style context); a depthwise 7x7 (a ConvNeXt-style block made deformable); and the main job's
    segmentation layer (48 channels at 12 x 12, a batch of 256)."""
    m = []
    for b in batches:
        m += [
            Shape(b, 256, 50, 84, 256, 1, 1, dtype, False, note="R50-DCNv2 stage 3"),
            Shape(b, 512, 50, 84, 512, 1, 1, dtype, False, 3, 2, 1, note="R50-DCNv2 stage 4, first block"),
            Shape(b, 512, 7, 7, 512, 1, 1, dtype, False, note="R50-DCNv2 stage 4 at 224 x 224"),
            Shape(b, 256, 50, 84, 256, 1, 1, dtype, False, mask=False, note="R50-DCNv1 stage 3"),
            Shape(b, 512, 32, 32, 256, 1, 1, dtype, False, 1, 1, 0, note="ASPP 1x1"),
            Shape(b, 512, 32, 32, 256, 1, 1, dtype, False, 3, 1, 1, note="ASPP 3x3"),
            Shape(b, 512, 32, 32, 256, 1, 1, dtype, False, 7, 1, 3, note="ASPP 7x7"),
            Shape(b, 256, 64, 64, 256, 1, 4, dtype, False, 3, 1, 2, 2, note="dilated 3x3"),
            Shape(b, 128, 56, 56, 128, 128, 1, dtype, False, 7, 1, 3, note="depthwise 7x7"),
        ]
    return m + [Shape(256, 48, 12, 12, 48, 1, 1, dtype, False, note="main job's segmentation layer")]


def grouped_shapes(dtype, batches):
    """Grouped deformable layers of published detectors, at each of ``batches``: the DCN stages
    c3, c4 and c5 of ResNeXt-101 32x4d (32 groups of 8, 16 and 32 channels) and c5 of ResNeXt-101
    64x4d (64 groups of 32), as mmdetection's DCN configs place them, at Mask R-CNN's 800 x
    1344 input (strides 8, 16 and 32: 100 x 168, 50 x 84, 25 x 42)."""
    m = []
    for b in batches:
        m += [
            Shape(b, 256, 100, 168, 256, 32, 1, dtype, False, note="ResNeXt-101 32x4d DCN c3"),
            Shape(b, 512, 50, 84, 512, 32, 1, dtype, False, note="ResNeXt-101 32x4d DCN c4"),
            Shape(b, 1024, 25, 42, 1024, 32, 1, dtype, False, note="ResNeXt-101 32x4d DCN c5"),
            Shape(b, 2048, 25, 42, 2048, 64, 1, dtype, False, note="ResNeXt-101 64x4d DCN c5"),
        ]
    return m


def offset_group_shapes(device):
    """Layers of narrow offset groups (2 to 16 channels each), where a sampling point serves
    few channels: the random sweep's 7x7 head of 2-channel groups, 3x3 layers of 64 to 256
    channels in 8 to 128 groups, a grouped layer and channels_last; on CUDA every dtype, on
    the CPU float32 at smaller sizes (torchvision's CPU backward takes seconds)."""
    if device == "cpu":
        return [
            Shape(2, 16, 32, 38, 27, 1, 8, f32, False, 7, 1, 3, note="2 channels per offset group"),
            Shape(2, 64, 32, 32, 64, 1, 32, f32, False, note="2 channels per offset group"),
            Shape(2, 64, 32, 32, 64, 1, 16, f32, False, note="4 channels per offset group"),
            Shape(2, 64, 32, 32, 64, 1, 8, f32, False, note="8 channels per offset group"),
            Shape(1, 128, 32, 32, 128, 1, 32, f32, True, note="4 channels per offset group"),
        ]
    out = []
    for dtype in (f32, TF32, f16, torch.bfloat16):
        out += [
            Shape(8, 16, 32, 38, 27, 1, 8, dtype, False, 7, 1, 3, note="2 channels per offset group"),
            Shape(8, 64, 64, 64, 64, 1, 32, dtype, False, note="2 channels per offset group"),
            Shape(8, 64, 64, 64, 64, 1, 16, dtype, False, note="4 channels per offset group"),
            Shape(8, 64, 64, 64, 64, 1, 8, dtype, False, note="8 channels per offset group"),
            Shape(8, 256, 64, 64, 256, 1, 32, dtype, False, note="8 channels per offset group"),
            Shape(8, 256, 64, 64, 256, 1, 16, dtype, False, note="16 channels per offset group"),
            Shape(2, 128, 128, 128, 128, 1, 32, dtype, True, note="4 channels per offset group"),
            Shape(8, 128, 32, 32, 128, 4, 16, dtype, False, note="8 channels per offset group"),
            Shape(1, 256, 50, 68, 256, 1, 64, dtype, False, note="4 channels per offset group"),
        ]
    return out


def sweep_shapes(device, count, seed):
    """``count`` layers drawn with ``random.Random(seed)`` (the same list on every run) from the
    ranges of deformable layers in detection and segmentation networks: kernels 1 to 7 (mostly
    3), strides 1 and 2, dilations 1 to 3 with "same" padding, 16 to 1024 input channels,
    outputs of half to twice the inputs or a head's few (1 to 80), grouped and depthwise layers,
    1 to 8 offset groups, DCNv1 and DCNv2, sides of 7 to 128 pixels, batches of 1 to 32, every
    dtype and channels_last inputs. Layers whose sampled values (B * C_in * kh * kw * H_out *
    W_out) pass what torchvision's kernels take in seconds on the device, and grouped layers whose
    outputs do not divide among the groups, are drawn again."""
    rng = random.Random(seed)
    limit = 8 * 256 * 64 * 64 * 9 if device == "cuda" else 2 * 128 * 32 * 32 * 9
    dtypes = (f32, f32, TF32, f16, f16, torch.bfloat16) if device == "cuda" else (f32,)
    sides = (7, 10, 14, 19, 25, 28, 32, 38, 50, 56, 64, 75, 96, 100, 128)
    shapes = []
    while len(shapes) < count:
        k = rng.choice((3, 3, 3, 3, 1, 5, 7))
        stride = rng.choice((1, 1, 1, 1, 2))
        dil = rng.choice((1, 1, 1, 2, 3)) if k > 1 else 1
        C = rng.choice((16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024))
        kind = rng.random()
        if kind < 0.1:  # depthwise
            groups, C_out = C, C
        elif kind < 0.25:
            groups = rng.choice([g for g in (2, 4, 8, 16, 32) if C % g == 0])
            C_out = rng.choice((C // 2, C, 2 * C))
        else:
            groups = 1
            C_out = rng.choice((C // 2, C, C, 2 * C, rng.choice((1, 2, 4, 9, 18, 27, 80))))
        og = rng.choice([o for o in (1, 1, 1, 2, 4, 8) if C % o == 0])
        H = rng.choice(sides)
        W = rng.choice([s for s in sides if H / 2 <= s <= 2 * H])
        shape = Shape(
            rng.choice((1, 1, 2, 4, 8, 16, 32)),
            C,
            H,
            W,
            C_out,
            groups,
            og,
            rng.choice(dtypes),
            rng.random() < 0.2,
            k,
            stride,
            dil * (k - 1) // 2,
            dil,
            rng.random() < 0.8,
        )
        Ho, Wo = shape.out_hw()
        if Ho > 0 and Wo > 0 and C_out % groups == 0 and shape.B * C * k * k * Ho * Wo <= limit:
            shapes.append(shape)
    return shapes


def spread(rows):
    """The ratios' spread over rows, and the rows where torchvision's op was faster than ours."""
    lines = []
    for mode in ("fwd", "fwd+bwd"):
        key = f"torchvision / customops {mode}"
        ratios = sorted(r[key] for r in rows if key in r)
        if ratios:
            lines.append(
                f"torchvision / customops {mode} over {len(ratios)} rows: min {ratios[0]:.2f}, median "
                f"{statistics.median(ratios):.2f}, max {ratios[-1]:.2f}."
            )
        lines += [
            f"- slower than torchvision ({mode}): {r['shape']}, {r['dtype']}: {r[key]:.2f}"
            for r in rows
            if r.get(key, 1) < 1
        ]
    return "\n".join(lines)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{platform.machine()} {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return platform.machine()


def torchvision_deform_conv2d():
    """torchvision.ops.deform_conv2d, or the reason it cannot be imported here."""
    try:
        from torchvision.ops import deform_conv2d

        return deform_conv2d, None
    except Exception as e:  # noqa: BLE001  (an ImportError, or a RuntimeError from a mismatched torch)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def make_inputs(shape, device, requires_grad):
    B, C, H, W, C_out, groups, og = shape[:7]
    k = shape.k
    dtype, channels_last = shape.dtype, shape.channels_last
    dtype = torch.float32 if dtype == TF32 else dtype
    Ho, Wo = shape.out_hw()
    g = torch.Generator().manual_seed(0)

    def t(*s, scale=1.0, uniform=False):
        x = torch.rand(s, generator=g) if uniform else torch.randn(s, generator=g) * scale
        return x.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    x = t(B, C, H, W)
    if channels_last:
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_(requires_grad)
    return dict(
        input=x,
        offset=t(B, 2 * og * k * k, Ho, Wo, scale=2.0),
        weight=t(C_out, C // groups, k, k, scale=0.1),
        bias=t(C_out),
        mask=t(B, og * k * k, Ho, Wo, uniform=True) if shape.mask else None,
    )


def work(shape):
    """(GEMM FLOPs, gather FLOPs, minimum bytes) of one forward."""
    B, C, H, W, C_out, groups, og = shape[:7]
    k = shape.k
    dtype = shape.dtype
    size = torch.empty((), dtype=torch.float32 if dtype == TF32 else dtype).element_size()
    P = shape.out_hw()[0] * shape.out_hw()[1]
    samples = B * C * k * k * P
    gemm = 2 * B * C_out * P * (C // groups) * k * k
    gather = 8 * samples
    offsets = B * (3 if shape.mask else 2) * og * k * k * P
    bytes_ = size * (B * C * H * W + offsets + C_out * (C // groups) * k * k + C_out + B * C_out * P)
    return gemm, gather, bytes_


def dtype_name(dtype):
    """A row's dtype as the tables name it: "float32" (IEEE), "float32, TF32", "float16", ..."""
    return dtype if dtype == TF32 else str(dtype).replace("torch.", "")


def ceilings(device, measure, dtypes):
    """The device's measured ceilings (docs/deform_conv2d.md, "Benchmarks"): the GEMM rate per
    dtype in TFLOP/s (a large matrix product through torch's libraries: cuBLAS, or on the CPU the
    faster of its BLAS and oneDNN),
    which float32's rate (IEEE) also bounds the bilinear gathers by, and the copy bandwidth in
    TB/s (reads plus writes)."""
    from common import copy_tbs, matmul_tflops

    cuda = device == "cuda"
    n, nbytes = (8192, 2**31) if cuda else (2048, 2**28)
    rates = {}
    for dtype in set(dtypes) | {torch.float32}:
        real = torch.float32 if dtype == TF32 else dtype
        rates[dtype] = matmul_tflops(measure, real, device, n, tf32=dtype == TF32)
    return rates, copy_tbs(measure, device, nbytes)


def floors(shape, rates, tbs):
    """Times (us) under which no implementation can run the forward and the forward + backward:
    the largest of the GEMM's FLOPs at the dtype's measured GEMM rate, the gathers' at float32's
    and the minimum bytes at the copy bandwidth. The backward does the forward's work twice
    (two GEMMs of its size, the gathers again for the columns and for grad_input, and reads and
    writes of the same tensors and their gradients), so forward + backward is three times it."""
    gemm, gather, bytes_ = work(shape)
    fwd = max(gemm / rates[shape.dtype], gather / rates[torch.float32], bytes_ / tbs) / 1e6
    return fwd, 3 * fwd


def timer(device):
    if device == "cuda":
        from common import do_bench

        return lambda fn: do_bench(fn)
    from torch.utils.benchmark import Timer

    # Timer runs its statement with num_threads threads, 1 unless told.
    return lambda fn: (
        Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        .blocked_autorange(min_run_time=0.5)
        .median
        * 1e6
    )


def round_robin(fns, measure, rounds):
    """Median over ``rounds`` passes that each time every function once, in turn, so that a
    machine whose load changes during the run (a shared CPU) affects all of them alike."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(measure(fn))
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def fwd_bwd(call, inputs):
    leaves = [v for v in inputs.values() if v is not None and v.requires_grad]
    out = call()
    grad = torch.ones_like(out)

    def step():
        for v in leaves:
            v.grad = None
        call().backward(grad)

    return step


def bench_shape(shape, device, measure, tv, rounds):
    dtype, groups = shape.dtype, shape.groups
    geometry = ((shape.stride,) * 2, (shape.pad,) * 2, (shape.dil,) * 2)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = dtype == TF32
    row = {}
    for mode in ("fwd", "fwd+bwd"):
        rg = mode == "fwd+bwd"
        i = make_inputs(shape, device, rg)
        calls = {
            "customops": lambda i=i: customops.deform_conv2d(
                i["input"], i["offset"], i["weight"], i["bias"], *geometry, i["mask"]
            ),
            "conv2d": lambda i=i: F.conv2d(i["input"], i["weight"], i["bias"], *geometry, groups),
        }
        if tv is not None:
            calls["torchvision"] = lambda i=i: tv(i["input"], i["offset"], i["weight"], i["bias"], *geometry, i["mask"])
        fns = {name: (fwd_bwd(call, i) if rg else call) for name, call in calls.items()}
        with torch.enable_grad() if rg else torch.no_grad():
            for fn in fns.values():
                fn()  # warm up
            for name, t in round_robin(fns, measure, rounds).items():
                row[f"{name} {mode} (us)"] = t
            if device == "cuda" and rg:
                for name, fn in fns.items():
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    fn()
                    torch.cuda.synchronize()
                    row[f"{name} {mode} extra peak (MB)"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    # Relative error of the output against float64 (customops' float64 kernel, checked against
    # the reference in tests/) on the same inputs, for both implementations.
    with torch.no_grad():
        i = make_inputs(shape, device, False)
        args = (i["input"], i["offset"], i["weight"], i["bias"], *geometry, i["mask"])
        ref = customops.deform_conv2d(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))
        impls = (
            {"customops": customops.deform_conv2d, "torchvision": tv}
            if tv is not None
            else {"customops": customops.deform_conv2d}
        )
        for name, fn in impls.items():
            row[f"{name} rel. err."] = ((fn(*args).double() - ref).norm() / ref.norm()).item()
    return row


def write_markdown(path, title, header, rows, tail=""):
    def cell(key, v):
        if not isinstance(v, float):
            return str(v)
        if key.endswith("(us)"):
            return f"{v:.0f}"
        if key.endswith("rel. err."):
            return f"{v:.1e}"
        return f"{v:.2f}" if key.startswith(("torch", "custom")) else f"{v:.3g}"

    keys = list(rows[0])
    with open(path, "w") as f:
        f.write(f"# {title}\n\n{header}\n\n")
        f.write("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n")
        for row in rows:
            f.write("| " + " | ".join(cell(k, row.get(k, "")) for k in keys) + " |\n")
        if tail:
            f.write(f"\n{tail}\n")


def plot(rows, path, title):
    """Speed-up over torchvision (forward, forward + backward) and the ratio to the dense
    conv2d, per row, as grouped bars on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['shape']}\n{r['dtype']}" for r in rows]
    series = [
        ("torchvision / customops fwd", "torchvision / ours, forward"),
        ("torchvision / customops fwd+bwd", "torchvision / ours, fwd+bwd"),
        ("customops / conv2d fwd", "ours / dense conv2d, forward"),
        ("customops / conv2d fwd+bwd", "ours / dense conv2d, fwd+bwd"),
    ]
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(rows)), 5))
    width = 0.8 / len(series)
    for i, (key, name) in enumerate(series):
        xs = [j + (i - 1.5) * width for j in range(len(rows))]
        ax.bar(xs, [r.get(key, float("nan")) for r in rows], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("ratio of times (log)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(stem, header, rows, device, machine, tail=""):
    with open(stem + ".json", "w") as f:
        json.dump({"header": header, "rows": rows}, f, indent=1)
    title = f"deform_conv2d on {'the CPU' if device == 'cpu' else machine}"
    write_markdown(stem + ".md", title, header, rows, tail)
    if device != "cpu":
        plot(rows, stem + ".png", title)
    print(f"wrote {stem}.md, .json" + ("" if device == "cpu" else " and .png"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--rounds", type=int, default=5, help="passes over the implementations (median)")
    parser.add_argument(
        "--shapes",
        choices=("grid", "models", "grouped", "offset-groups", "all", "sweep"),
        default="grid",
        help="see above",
    )
    parser.add_argument("--count", type=int, default=40, help="layers of --shapes sweep")
    parser.add_argument("--seed", type=int, default=0, help="the draw of --shapes sweep")
    parser.add_argument("--out", help="folder for the .md and .json results (and, for CUDA, a .png plot)")
    parser.add_argument("--from-json", help="rewrite the .md and .png of a saved .json (no timing)")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        stem = args.from_json[: -len(".json")]
        machine = saved["header"].split(",")[0]
        cpu = " cores, " in saved["header"]  # the CPU header names the cores, a GPU's does not
        tail = spread(saved["rows"]) + "\n" if "_sweep" in stem else ""
        write_results(stem, saved["header"], saved["rows"], "cpu" if cpu else "cuda", machine, tail)
        return
    device = args.device
    if device == "cpu":
        torch.set_num_threads(args.threads)
    tv, tv_missing = torchvision_deform_conv2d()
    measure = timer(device)
    grid = CUDA_SHAPES if device == "cuda" else CPU_SHAPES
    # The models' layers: on CUDA in IEEE float32 (torchvision's default, and where the GEMM
    # takes most of the time) and float16, at batches 1 and 8; on the CPU float32 at batch 1
    # (torchvision's CPU backward takes seconds at these sizes).
    # The grouped layers: detectors' batches of 1 and 2 images on CUDA, 1 on the CPU.
    if device == "cuda":
        models = model_shapes(torch.float32, (1, 8)) + model_shapes(torch.float16, (1, 8))
        grouped = grouped_shapes(torch.float32, (1, 2)) + grouped_shapes(torch.float16, (1, 2))
    else:
        models = model_shapes(torch.float32, (1,))
        grouped = grouped_shapes(torch.float32, (1,))
    if args.shapes == "sweep":
        shapes = sweep_shapes(device, args.count, args.seed)
    else:
        shapes = {
            "grid": grid,
            "models": models,
            "grouped": grouped,
            "offset-groups": offset_group_shapes(device),
            "all": grid + models + grouped,
        }[args.shapes]
    machine = torch.cuda.get_device_name() if device == "cuda" else f"{cpu_name()}, {os.cpu_count()} cores"
    if device == "cpu":
        machine += f", {args.threads} threads, load average {os.getloadavg()[0]:.1f} at the start"
    tv_version = getattr(sys.modules.get("torchvision"), "__version__", None)
    header = (
        f"{machine}, torch {torch.__version__}, torchvision {tv_version or 'not importable: ' + str(tv_missing)}, "
        f"{datetime.date.today().isoformat()}. Command: `python {' '.join(sys.argv)}`."
    )
    rates, tbs = ceilings(device, measure, {shape.dtype for shape in shapes})
    header += " Measured ceilings: " + ", ".join(f"{dtype_name(d)} GEMM {r:.3g} TFLOP/s" for d, r in rates.items())
    header += (
        f", copy {tbs:.3g} TB/s; floor: the largest of GEMM FLOPs / GEMM rate, gather FLOPs / float32's, "
        "min. bytes / copy bandwidth (forward + backward: 3 times the forward's)."
    )
    print(header)
    rows = []
    for shape in shapes:
        dtype = shape.dtype
        row = {"shape": shape.name(), "dtype": dtype_name(dtype)}
        # torchvision has no bfloat16 kernels ("deformable_im2col" not implemented for 'BFloat16').
        row.update(bench_shape(shape, device, measure, None if dtype == torch.bfloat16 else tv, args.rounds))
        gemm, gather, bytes_ = work(shape)
        row["GEMM GFLOP"] = gemm / 1e9
        row["gather GFLOP"] = gather / 1e9
        row["min. MB moved"] = bytes_ / 1e6
        row["customops fwd GFLOP/s"] = (gemm + gather) / (row["customops fwd (us)"] * 1e3)
        row["floor fwd (us)"], row["floor fwd+bwd (us)"] = floors(shape, rates, tbs)
        for mode in ("fwd", "fwd+bwd"):
            if f"torchvision {mode} (us)" in row:
                row[f"torchvision / customops {mode}"] = row[f"torchvision {mode} (us)"] / row[f"customops {mode} (us)"]
            row[f"customops / conv2d {mode}"] = row[f"customops {mode} (us)"] / row[f"conv2d {mode} (us)"]
            row[f"customops / floor {mode}"] = row[f"customops {mode} (us)"] / row[f"floor {mode} (us)"]
        print(json.dumps(row))
        rows.append(row)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        tag = "cpu" if device == "cpu" else torch.cuda.get_device_name().replace(" ", "_")
        suffix = "" if args.shapes == "grid" else f"_{args.shapes}"
        suffix += f"_seed{args.seed}" if args.shapes == "sweep" else ""
        stem = os.path.join(args.out, f"deform_conv2d_{tag}_{datetime.date.today().isoformat()}{suffix}")
        tail = spread(rows) + "\n\n" if args.shapes == "sweep" else ""
        if device == "cpu":
            tail += (
                f"Load average at the end: {os.getloadavg()[0]:.1f} (a shared machine: ratios, measured in one "
                "interleaved run, are more telling than absolute times)."
            )
        write_results(stem, header, rows, device, machine, tail)


if __name__ == "__main__":
    main()
