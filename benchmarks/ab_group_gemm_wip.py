import os, sys
sys.path.insert(0, 'benchmarks')
import torch, torchvision
from bench_deform_conv2d import TF32, Shape, make_inputs
from common import do_bench
import ab_deform_conv2d as ab
dt = torch.float32
shapes = [
    Shape(1, 1024, 7, 7, 1024, 2, 4, dt, True, 3, 1, 1, 1, False),
    Shape(1, 1024, 7, 7, 1024, 2, 4, dt, False, 3, 1, 1, 1, False),
    Shape(1, 1024, 10, 14, 1024, 2, 1, dt, False),
    Shape(2, 768, 8, 8, 768, 4, 2, dt, False),
    Shape(1, 2048, 7, 7, 2048, 4, 1, dt, False),
    Shape(1, 1024, 14, 14, 512, 2, 1, dt, True),
    Shape(1, 512, 7, 7, 512, 2, 1, dt, False),
    Shape(4, 512, 7, 7, 512, 2, 1, dt, False),
    Shape(1, 256, 32, 32, 256, 4, 1, dt, False),
    Shape(8, 192, 7, 7, 96, 2, 2, dt, False, 3, 1, 3, 3),
    # one image, aligned rows, NCHW: the GEMM over the groups into NCHW
    Shape(1, 1024, 16, 16, 1024, 2, 1, dt, False),
    Shape(1, 512, 16, 16, 512, 2, 1, dt, False),
    Shape(1, 2048, 8, 8, 2048, 4, 1, dt, False),
    Shape(1, 1024, 12, 12, 1024, 2, 1, dt, False),
    # around the rule's reduction bound
    Shape(2, 1024, 7, 7, 1024, 4, 1, dt, False),
    Shape(1, 768, 7, 7, 768, 3, 1, dt, False),
    Shape(1, 1536, 7, 7, 1536, 2, 1, dt, False),
    Shape(1, 384, 7, 7, 384, 2, 1, dt, False),
    Shape(8, 512, 7, 7, 512, 2, 1, dt, False),
    Shape(1, 1024, 7, 7, 1024, 8, 1, dt, False),
    Shape(1, 512, 14, 14, 512, 2, 1, dt, True),
    Shape(1, 2048, 7, 7, 2048, 2, 1, dt, False, 1, 1, 0),
]
variants = {"old": "0", "loop": "1", "rule": None}
labels = list(variants)
for r in range(3):
    order = labels[r % 3:] + labels[:r % 3]
    for s in shapes:
        for lab in order:
            os.environ.pop("CUSTOMOPS_TEST_DEFORM_GEMM_PER_GROUP", None)
            if variants[lab] is not None: os.environ["CUSTOMOPS_TEST_DEFORM_GEMM_PER_GROUP"] = variants[lab]
            ab.measure(lab, s, backward=False)
        if r == 0:
            torch.backends.cuda.matmul.allow_tf32 = False
            i = make_inputs(s, "cuda", False)
            geo = ((s.stride,) * 2, (s.pad,) * 2, (s.dil,) * 2)
            fn = lambda: torchvision.ops.deform_conv2d(i["input"], i["offset"], i["weight"], i["bias"], *geo, i["mask"])
            with torch.no_grad():
                fn(); t = do_bench(fn, rep=50)
            print(f"tv\t{s.name()}\t{s.dtype}\t{t:.1f}\tnan\tnan\tnan", flush=True)
