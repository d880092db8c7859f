# Kernel variants of the sm90 implicit GEMM (csrc/ops/deform_conv2d/sm90/) against torchvision, on the H200:
# V=1,2,5 python benchmarks/experiments/implicit_gemm_variants.py  (CUTLASS headers in /tmp/site; a stub
# customops_build_info.h in .scratch/gen). Variants: implicit_gemm_variants.cu.
import glob
import os
import sys

import torch
from torch.utils.cpp_extension import load

here = os.path.dirname(os.path.abspath(__file__))
cut = glob.glob("/tmp/site/cutlass_library/source/include")[0]
load(
    "igx",
    [os.path.join(here, "implicit_gemm_variants.cu")],
    is_python_module=False,
    build_directory=os.makedirs("/tmp/igxb", exist_ok=True) or "/tmp/igxb",
    extra_include_paths=[
        cut,
        os.path.join(here, "..", "..", ".scratch", "gen"),
        os.path.join(here, "..", "..", "csrc"),
    ],
    extra_cuda_cflags=[
        "-O3",
        "-std=c++20",
        "-DCUSTOMOPS_WITH_CUDA",
        "-DNDEBUG",
        "--expt-relaxed-constexpr",
        "-gencode=arch=compute_90a,code=sm_90a",
    ],
    verbose=False,
)
import torchvision.ops as tvops
from triton.testing import do_bench

VARIANTS = [int(v) for v in os.environ.get("V", "1,2,5,8,11,13").split(",")]
SHAPES = [  # B, C, H, W, Cout, k, stride, pad, og
    (8, 256, 64, 64, 256, 3, 1, 1, 1),
    (8, 256, 64, 64, 256, 3, 1, 1, 4),
    (8, 512, 50, 84, 512, 3, 2, 1, 1),
    (8, 512, 32, 32, 256, 3, 1, 1, 1),
    (8, 512, 32, 32, 256, 7, 1, 3, 1),
    (1, 256, 50, 84, 256, 3, 1, 1, 1),
    (4, 128, 75, 75, 128, 3, 1, 1, 1),
    (2, 64, 256, 256, 64, 3, 1, 1, 1),
    (32, 256, 28, 28, 256, 3, 1, 1, 1),
]
only = sys.argv[1:] and sys.argv[1] == "ncu"
for B, C, H, W, Co, k, st, pd, og in SHAPES[:1] if only else SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    Ho = (H + 2 * pd - (k - 1) - 1) // st + 1
    Wo = (W + 2 * pd - (k - 1) - 1) // st + 1
    x = torch.randn(B, C, H, W, device="cuda", generator=g).half()
    off = (torch.randn(B, 2 * og * k * k, Ho, Wo, device="cuda", generator=g) * 2).half()
    msk = torch.rand(B, og * k * k, Ho, Wo, device="cuda", generator=g).half()
    w = (torch.randn(Co, C, k, k, device="cuda", generator=g) / (C * k * k) ** 0.5).half()
    b = torch.randn(Co, device="cuda", generator=g).half()
    xs = x.contiguous(memory_format=torch.channels_last)
    ref = tvops.deform_conv2d(
        x.float(), off.float(), w.float(), b.float(), (st, st), (pd, pd), (1, 1), msk.float()
    ).double()
    line = f"{B}x{C}x{H}x{W}->{Co} k{k} s{st} og{og}:"
    for v in VARIANTS:
        f = lambda: torch.ops.igx.run(xs, off, w, b, msk, [st, st], [pd, pd], [1, 1], v)
        out = f()
        torch.cuda.synchronize()
        rel = ((out.double() - ref).norm() / ref.norm()).item()
        t = 0 if only else do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3
        line += f"  v{v} {t:7.1f}us ({rel:.0e})"
    if not only:
        t = (
            do_bench(
                lambda: tvops.deform_conv2d(x, off, w, b, (st, st), (pd, pd), (1, 1), msk),
                warmup=10,
                rep=50,
                return_mode="median",
            )
            * 1e3
        )
        line += f"  tv {t:7.1f}"
    print(line, flush=True)
