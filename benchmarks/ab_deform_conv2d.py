"""A/B of two builds of customops.deform_conv2d on CUDA: forward and forward + backward medians
(L2 flushed, benchmarks/common.py) and extra peak memory, at the benchmark's grid and model
layers plus shapes whose output rows are not 16-byte aligned (7x7, 14x14 and 75x75 outputs),
groups and the stride-2 block with TF32.

Build the baseline in a copy of the tree (``git worktree add /tmp/old <commit>``, then
``python setup.py build_ext --inplace`` there), build this tree, then alternate processes so
that both builds see the same machine state, and read the table. The GPU machine's copy of the
tree has no .git: there, copy the tree (setup.py, pyproject.toml, csrc, customops, cpp,
benchmarks) to /tmp/old and put the baseline's kernel file in it, saved here beforehand with
``git show <commit>:csrc/ops/deform_conv2d/deform_conv2d_cuda.cu`` into an untracked file.

    (cd /tmp/old && PYTHONPATH=/tmp/old python $PWD/benchmarks/ab_deform_conv2d.py run old) >> ab.txt
    PYTHONPATH=$PWD python benchmarks/ab_deform_conv2d.py run new >> ab.txt
    python benchmarks/ab_deform_conv2d.py report ab.txt      # medians over rounds, old / new

Paths that an environment variable selects, read per call, need one build and one process:
``interleave ROUNDS [--depthwise | --narrow | --grouped | --grouped-backward | --one-group |
--offset-groups | --grouped-weight-heavy]
LABEL=VAR=VALUE[,VAR=VALUE] ...`` times, shape by shape, the default (label ``old``) and each
labelled setting in turn, ROUNDS times, in an order that rotates, so that every variant sees the
same machine state. ``--depthwise`` times depthwise layers of several networks' sizes instead of the
grid; ``--narrow`` the forwards of layers with few output channels per group (fwd+bwd columns read
nan), ``--grouped`` those of grouped layers (ResNeXt detectors' DCN stages among them),
``--grouped-backward`` grouped layers forward and backward (``run --grouped``'s shapes),
``--one-group`` the default shapes of one group (whose backward runs the columns' GEMMs over a
chunk's rows), ``--offset-groups`` layers of narrow offset groups, forward and backward,
``--grouped-weight-heavy`` IEEE float32 grouped layers of few pixels and long reductions
(``gemm_per_group``), forward and backward, ``--split-k`` IEEE float32 forwards of layers of few
pixels and more (``split_k_forward``), ``--weight-heavy`` forwards of ``run --weight-heavy``'s
layers (``weight_order``, ``nn_gemm``). The label ``torchvision`` (no variables) times
torchvision's op in the same rotation. ``report
FILE A B`` compares any two labels.

    python benchmarks/ab_deform_conv2d.py interleave 2 --narrow \
        columns=CUSTOMOPS_TEST_DEFORM_FORWARD=columns direct=CUSTOMOPS_TEST_DEFORM_FORWARD=direct > narrow.txt
    python benchmarks/ab_deform_conv2d.py report narrow.txt columns direct

(the default, label ``old``, is timed too).

    python benchmarks/ab_deform_conv2d.py interleave 3 \
        --depthwise direct=CUSTOMOPS_TEST_DEPTHWISE_DIRECT=1 > ab.txt
    python benchmarks/ab_deform_conv2d.py report ab.txt direct old

``run LABEL [SUBSTRING | --depthwise | --grouped | --weight-heavy | --channels-last]`` prints one
tab-separated line per shape (label, shape, dtype, fwd µs, fwd+bwd µs, fwd MB, fwd+bwd MB);
SUBSTRING keeps the shapes whose name or dtype contains it, ``--depthwise`` times the depthwise
layers instead, ``--grouped`` grouped layers, forward and backward, ``--weight-heavy`` layers of few
output pixels and a large weight, and ``--channels-last`` the shapes of batch > 1 (the depthwise
layers' in float16) with a channels_last input.
"""

import collections
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def shapes():
    import torch

    from bench_deform_conv2d import CUDA_SHAPES, TF32, Shape, model_shapes

    f16, f32 = torch.float16, torch.float32
    extra = [
        Shape(4, 256, 14, 14, 256, 1, 1, f16, False, note="P=196"),
        Shape(16, 512, 7, 7, 512, 1, 1, f16, False, note="P=49"),
        Shape(16, 512, 7, 7, 512, 1, 1, f32, False, note="P=49"),
        Shape(2, 256, 100, 168, 256, 1, 1, f16, False, note="P=16800"),
        Shape(4, 128, 75, 75, 128, 1, 1, f16, False, note="P=5625"),
        Shape(4, 128, 75, 75, 128, 1, 1, f32, False, note="P=5625"),
        Shape(32, 256, 28, 28, 256, 1, 1, f16, False, note="P=784"),
        Shape(8, 512, 50, 84, 512, 1, 1, TF32, False, 3, 2, 1, note="stride 2"),
        Shape(8, 256, 64, 64, 256, 8, 1, f16, False, note="groups 8"),
        Shape(8, 256, 64, 64, 256, 1, 16, f16, False, note="16 channels per offset group"),
        Shape(8, 256, 64, 64, 256, 1, 16, f32, False, note="16 channels per offset group"),
        Shape(8, 128, 64, 64, 256, 128, 1, f16, False, note="one input channel per group"),
        Shape(4, 96, 56, 56, 96, 3, 3, f16, False, note="32 channels per group"),
        Shape(4, 40, 56, 56, 40, 1, 5, f32, False, note="8 channels per offset group"),
    ]
    return CUDA_SHAPES + model_shapes(f32, (1, 8)) + model_shapes(f16, (1, 8)) + extra


def depthwise_shapes():
    """Depthwise layers of several networks' sizes: ConvNeXt-like 7x7 stages and 3x3 stages,
    at batch 1 and a serving or training batch, one and several offset groups."""
    import torch

    from bench_deform_conv2d import Shape

    out = []
    for dtype in (torch.float16, torch.float32):
        for B in (1, 16):
            for C, H in ((96, 56), (192, 28), (384, 14), (768, 7)):
                out.append(Shape(B, C, H, H, C, C, 1, dtype, False, 7, 1, 3, note="7x7"))
        for B in (1, 8):
            for C, H, og in ((32, 112, 1), (128, 56, 1), (256, 28, 8), (512, 14, 1)):
                out.append(Shape(B, C, H, H, C, C, og, dtype, False, note="3x3"))
        out.append(Shape(8, 256, 64, 64, 256, 256, 1, dtype, False, note="the grid's depthwise row"))
    return out


def narrow_shapes():
    """Forward only: layers of few output channels per group, where the direct forward competes
    with the columns and a GEMM. Widths 8 to 192 per group (256 in float32), in four settings:
    the main job's (many small images), large images, a single image, and 4 groups; every dtype."""
    import torch

    from bench_deform_conv2d import TF32, Shape

    out = []
    for dtype in (torch.float32, TF32, torch.float16, torch.bfloat16):
        # IEEE float32 GEMMs run on CUDA cores too: wider layers as well.
        for n in (8, 16, 32, 48, 64, 96, 128, 192) + ((256,) if dtype in (torch.float32, TF32) else ()):
            out += [
                Shape(256, 48, 12, 12, n, 1, 1, dtype, False, note="small images"),
                Shape(8, 64, 64, 64, n, 1, 1, dtype, False, note="large images"),
                Shape(1, 128, 32, 32, n, 1, 1, dtype, False, note="one image"),
                Shape(8, 256, 32, 32, 4 * n, 4, 1, dtype, False, note="4 groups"),
            ]
    return out


def grouped_shapes():
    """Forward only: grouped layers, where the default may take the direct forward. The DCN
    stages of ResNeXt-101 32x4d and 64x4d detectors (the benchmark's ``--shapes grouped``, at
    batch 2 and 1), a few groups of 32 to 64 channels, 1 to 4 channels per group, and grouped
    layers of a single small image (fewer blocks than SMs); every dtype."""
    import torch

    from bench_deform_conv2d import TF32, Shape
    from bench_deform_conv2d import grouped_shapes as detector_stages

    out = []
    for dtype in (torch.float32, TF32, torch.float16, torch.bfloat16):
        out += detector_stages(dtype, (2, 1)) + [
            Shape(4, 96, 56, 56, 96, 3, 3, dtype, False, note="32 channels per group"),
            Shape(8, 256, 64, 64, 256, 8, 1, dtype, False, note="32 channels per group"),
            Shape(2, 128, 128, 128, 128, 2, 1, dtype, False, note="64 channels per group"),
            Shape(8, 128, 64, 64, 256, 128, 1, dtype, False, note="one input channel per group"),
            Shape(8, 128, 64, 64, 512, 128, 1, dtype, False, note="one input channel per group"),
            Shape(8, 256, 64, 64, 256, 64, 1, dtype, False, note="4 channels per group"),
            Shape(1, 256, 32, 32, 64, 4, 1, dtype, False, note="one image"),
            Shape(1, 256, 32, 32, 256, 4, 1, dtype, False, note="one image"),
            Shape(16, 32, 56, 38, 64, 2, 1, dtype, False, 3, 1, 1, 1, False, note="long grad_weight reduction"),
        ]
    return out


def grouped_backward_shapes():
    """Forward and backward of grouped layers: several images per chunk (small and mid-sized
    maps, serving and training batches, channels_last among them) and one image per chunk (the
    ResNeXt detector stages, a single image), in IEEE float32, TF32 and float16."""
    import torch

    from bench_deform_conv2d import TF32, Shape
    from bench_deform_conv2d import grouped_shapes as detector_stages

    out = []
    for dtype in (torch.float32, TF32, torch.float16):
        out += detector_stages(dtype, (2,)) + [
            Shape(8, 192, 7, 7, 96, 2, 2, dtype, False, 3, 1, 3, 3),
            Shape(16, 96, 14, 19, 192, 8, 4, dtype, True),
            Shape(16, 256, 14, 14, 256, 32, 1, dtype, False),
            Shape(32, 64, 28, 28, 64, 4, 1, dtype, False),
            Shape(4, 96, 56, 56, 96, 3, 3, dtype, False),
            Shape(8, 256, 64, 64, 256, 8, 1, dtype, False),
            Shape(8, 256, 64, 64, 256, 8, 1, dtype, True),
            Shape(2, 128, 128, 128, 128, 2, 1, dtype, False),
            Shape(8, 256, 64, 64, 256, 64, 1, dtype, False, note="4 channels per group"),
            Shape(1, 256, 32, 32, 256, 4, 1, dtype, False, note="one image"),
            Shape(16, 32, 56, 38, 64, 2, 1, dtype, False, 3, 1, 1, 1, False, note="long grad_weight reduction"),
        ]
    return out


def weight_heavy_shapes():
    """Forward and backward of layers whose weight outweighs their columns (fewer output pixels
    in the batch than output channels, CUDA's weight_order), and a few on either side of that
    line: small maps of wide layers, batch 1 to 4, in IEEE float32, TF32 and float16."""
    import torch

    from bench_deform_conv2d import TF32, Shape

    out = []
    for dtype in (torch.float32, TF32, torch.float16):
        out += [
            Shape(1, 1024, 10, 14, 1024, 1, 4, dtype, True, 3, 2, 1),
            Shape(2, 1024, 10, 7, 512, 1, 1, dtype, False),
            Shape(1, 512, 7, 7, 512, 1, 1, dtype, False, note="R50-DCNv2 stage 4 at 224 x 224"),
            Shape(4, 512, 7, 7, 512, 1, 1, dtype, False),
            Shape(1, 2048, 7, 7, 512, 1, 1, dtype, False),
            Shape(1, 1024, 14, 14, 1024, 1, 1, dtype, False),
            Shape(1, 1024, 25, 42, 1024, 32, 1, dtype, False, 3, 2, 1),
            Shape(2, 768, 8, 8, 768, 4, 2, dtype, False),
        ]
    return out


def grouped_weight_heavy_shapes():
    """IEEE float32 grouped layers of few output pixels and long reductions per group (CUDA's
    gemm_per_group), on both sides of its rule: batch 1 to 8, 2 to 8 groups, rows-major,
    channels_last and straight-into-NCHW outputs."""
    import torch

    from bench_deform_conv2d import Shape

    f32 = torch.float32
    return [
        Shape(1, 1024, 7, 7, 1024, 2, 4, f32, True, 3, 1, 1, 1, False),
        Shape(1, 1024, 7, 7, 1024, 2, 4, f32, False, 3, 1, 1, 1, False),
        Shape(1, 1024, 10, 14, 1024, 2, 1, f32, False),
        Shape(2, 768, 8, 8, 768, 4, 2, f32, False),
        Shape(1, 2048, 7, 7, 2048, 4, 1, f32, False),
        Shape(1, 1024, 14, 14, 512, 2, 1, f32, True),
        Shape(1, 512, 7, 7, 512, 2, 1, f32, False),
        Shape(4, 512, 7, 7, 512, 2, 1, f32, False),
        Shape(8, 512, 7, 7, 512, 2, 1, f32, False),
        Shape(1, 256, 32, 32, 256, 4, 1, f32, False),
        Shape(8, 192, 7, 7, 96, 2, 2, f32, False, 3, 1, 3, 3),
        Shape(1, 1024, 16, 16, 1024, 2, 1, f32, False),
        Shape(1, 512, 16, 16, 512, 2, 1, f32, False),
        Shape(1, 2048, 8, 8, 2048, 4, 1, f32, False),
        Shape(1, 1024, 12, 12, 1024, 2, 1, f32, False),
        Shape(2, 1024, 7, 7, 1024, 4, 1, f32, False),
        Shape(1, 768, 7, 7, 768, 3, 1, f32, False),
        Shape(1, 1536, 7, 7, 1536, 2, 1, f32, False),
        Shape(1, 384, 7, 7, 384, 2, 1, f32, False),
        Shape(1, 1024, 7, 7, 1024, 8, 1, f32, False),
        Shape(1, 512, 14, 14, 512, 2, 1, f32, True),
        Shape(1, 2048, 7, 7, 2048, 2, 1, f32, False, 1, 1, 0),
    ]


def split_k_shapes():
    """IEEE float32 forwards of layers of few output pixels (CUDA's split_k_forward) and of more,
    on both sides of its rule: ResNet-50 DCNv2 stages 3 and 4 at 224 x 224 and 512 x 512, batch 1
    to 16, wide and narrow layers, heads of few outputs, grouped layers, reductions of 576 to 19200;
    and four of them with TF32."""
    import torch

    from bench_deform_conv2d import TF32, Shape

    f32 = torch.float32
    return [
        Shape(1, 512, 7, 7, 512, 1, 1, f32, False, note="R50-DCNv2 stage 4 at 224 x 224"),
        Shape(1, 512, 7, 7, 512, 1, 1, f32, True),
        Shape(2, 512, 7, 7, 512, 1, 1, f32, False),
        Shape(4, 512, 7, 7, 512, 1, 1, f32, False),
        Shape(8, 512, 7, 7, 512, 1, 1, f32, False),
        Shape(16, 512, 7, 7, 512, 1, 1, f32, False),
        Shape(1, 512, 16, 16, 512, 1, 1, f32, False, note="R50-DCNv2 stage 4 at 512 x 512"),
        Shape(1, 256, 14, 14, 256, 1, 1, f32, False, note="R50-DCNv2 stage 3 at 224 x 224"),
        Shape(1, 256, 32, 32, 256, 1, 1, f32, False, note="R50-DCNv2 stage 3 at 512 x 512"),
        Shape(1, 128, 28, 28, 128, 1, 1, f32, False),
        Shape(1, 1024, 7, 7, 1024, 1, 1, f32, False),
        Shape(1, 1024, 14, 14, 1024, 1, 1, f32, False),
        Shape(1, 2048, 7, 7, 512, 1, 1, f32, False),
        Shape(1, 2048, 4, 4, 2048, 1, 1, f32, False),
        Shape(1, 512, 3, 3, 512, 1, 1, f32, False),
        Shape(1, 1024, 10, 14, 1024, 1, 4, f32, True, 3, 2, 1),
        Shape(2, 1024, 10, 7, 512, 1, 1, f32, False),
        Shape(1, 768, 32, 50, 384, 1, 1, f32, False, 5, 2, 2),
        Shape(1, 256, 7, 7, 80, 1, 1, f32, False, note="a head of 80 classes"),
        Shape(1, 256, 14, 14, 18, 1, 1, f32, False),
        Shape(1, 64, 7, 7, 64, 1, 1, f32, False),
        Shape(1, 128, 7, 7, 128, 1, 1, f32, False),
        Shape(1, 1024, 7, 7, 1024, 2, 4, f32, True, 3, 1, 1, 1, False),
        Shape(1, 1024, 7, 7, 1024, 2, 1, f32, False),
        Shape(2, 768, 8, 8, 768, 4, 2, f32, False),
        Shape(1, 2048, 7, 7, 2048, 4, 1, f32, False),
        Shape(1, 1024, 25, 42, 1024, 32, 1, f32, False, 3, 2, 1),
        Shape(8, 256, 32, 32, 256, 1, 1, f32, False),
        Shape(1, 512, 7, 7, 512, 2, 1, f32, False),
        Shape(1, 1536, 7, 7, 1536, 2, 1, f32, False),
        Shape(1, 1024, 7, 7, 1024, 8, 1, f32, False),
        Shape(1, 384, 7, 7, 384, 2, 1, f32, False),
        Shape(8, 512, 7, 7, 512, 2, 1, f32, False),
        Shape(1, 256, 20, 20, 256, 1, 1, f32, False),
        Shape(1, 256, 28, 28, 128, 1, 1, f32, False),
        Shape(1, 128, 32, 32, 128, 1, 1, f32, False),
        Shape(1, 512, 10, 10, 256, 1, 1, f32, False),
        Shape(1, 256, 13, 13, 256, 1, 1, f32, True),
    ] + [
        Shape(1, 512, 7, 7, 512, 1, 1, TF32, False),
        Shape(1, 1024, 7, 7, 1024, 1, 1, TF32, False),
        Shape(1, 512, 14, 14, 512, 1, 1, TF32, False),
        Shape(1, 2048, 7, 7, 512, 1, 1, TF32, False),
    ]


def offset_group_shapes():
    from bench_deform_conv2d import offset_group_shapes

    return offset_group_shapes("cuda")


def run(label, only=None):
    pick = shapes
    if only == "--depthwise":
        pick, only = depthwise_shapes, None
    elif only == "--grouped":
        pick, only = grouped_backward_shapes, None
    elif only == "--weight-heavy":
        pick, only = weight_heavy_shapes, None
    elif only == "--channels-last":
        only = None

        def pick():
            import torch

            dw = [s for s in depthwise_shapes() if s.dtype == torch.float16]
            return [s._replace(channels_last=True) for s in shapes() + dw if s.B > 1]

    for s in pick():
        if not only or only in s.name() + str(s.dtype):
            measure(label, s)


def interleave(rounds, settings):
    pick, backward = shapes, True
    if settings and settings[0] == "--depthwise":
        pick, settings = depthwise_shapes, settings[1:]
    elif settings and settings[0] == "--narrow":
        pick, settings, backward = narrow_shapes, settings[1:], False
    elif settings and settings[0] == "--grouped":
        pick, settings, backward = grouped_shapes, settings[1:], False
    elif settings and settings[0] == "--offset-groups":
        pick, settings = offset_group_shapes, settings[1:]
    elif settings and settings[0] == "--grouped-backward":
        pick, settings = grouped_backward_shapes, settings[1:]
    elif settings and settings[0] == "--grouped-weight-heavy":
        pick, settings = grouped_weight_heavy_shapes, settings[1:]
    elif settings and settings[0] == "--weight-heavy":
        pick, settings, backward = weight_heavy_shapes, settings[1:], False
    elif settings and settings[0] == "--split-k":
        pick, settings, backward = split_k_shapes, settings[1:], False
    elif settings and settings[0] == "--one-group":
        pick, settings = (lambda: [s for s in shapes() if s.groups == 1]), settings[1:]
    variants = {"old": {}}
    for arg in settings:
        label, _, pairs = arg.partition("=")
        variants[label] = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
    labels = list(variants)
    for r in range(rounds):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]  # no variant always first
        for s in pick():
            for label in order:
                for k in (k for v in variants.values() for k in v):
                    os.environ.pop(k, None)
                os.environ.update(variants[label])
                measure(label, s, backward)


def measure(label, s, backward=True):
    import torch

    import customops
    from bench_deform_conv2d import TF32, fwd_bwd, make_inputs
    from common import do_bench

    geometry = ((s.stride,) * 2, (s.pad,) * 2, (s.dil,) * 2)
    torch.backends.cuda.matmul.allow_tf32 = s.dtype == TF32
    times, mem = [], []
    for rg in (False, True) if backward else (False,):
        i = make_inputs(s, "cuda", rg)

        op = customops.deform_conv2d
        if label == "torchvision":
            import torchvision

            op = torchvision.ops.deform_conv2d

        def call(i=i, op=op):
            return op(i["input"], i["offset"], i["weight"], i["bias"], *geometry, i["mask"])

        fn = fwd_bwd(call, i) if rg else call
        with torch.enable_grad() if rg else torch.no_grad():
            fn()
            times.append(do_bench(fn, rep=50))
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            mem.append((torch.cuda.max_memory_allocated() - base) / 2**20)
    times, mem = times + [float("nan")] * (2 - len(times)), mem + [float("nan")] * (2 - len(mem))
    print(f"{label}\t{s.name()}\t{s.dtype}\t{times[0]:.1f}\t{times[1]:.1f}\t{mem[0]:.0f}\t{mem[1]:.0f}", flush=True)


def report(path, a="old", b="new"):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in open(path):
        p = line.rstrip("\n").split("\t")
        if len(p) == 7:
            runs[(p[1], p[2].replace("torch.", ""))][p[0]].append([float(x) for x in p[3:]])
    print(
        f"| shape | dtype | {a} fwd (us) | {b} fwd (us) | {a} / {b} | {a} fwd+bwd (us) | {b} fwd+bwd (us) | {a} / {b} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (shape, dtype), v in runs.items():
        if a in v and b in v:
            x = [statistics.median(r[k] for r in v[a]) for k in (0, 1)]
            y = [statistics.median(r[k] for r in v[b]) for k in (0, 1)]
            cells = [
                f"{x[0]:.0f}",
                f"{y[0]:.0f}",
                f"{x[0] / y[0]:.2f}",
                f"{x[1]:.0f}",
                f"{y[1]:.0f}",
                f"{x[1] / y[1]:.2f}",
            ]
            print(f"| {shape} | {dtype} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    elif len(sys.argv) >= 3 and sys.argv[1] == "interleave":
        interleave(int(sys.argv[2]), sys.argv[3:])
    elif len(sys.argv) in (3, 5) and sys.argv[1] == "report":
        report(*sys.argv[2:])
    else:
        sys.exit(__doc__)
