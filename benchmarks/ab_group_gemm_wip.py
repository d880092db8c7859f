import os, sys
sys.path.insert(0, 'benchmarks')
import torch, torchvision
from bench_deform_conv2d import TF32, Shape, make_inputs
from common import do_bench
import ab_deform_conv2d as ab
f32, f16 = torch.float32, torch.float16
shapes = []
for dt in (f32, TF32, f16):
    shapes += [
        Shape(1, 1024, 7, 7, 1024, 2, 4, dt, True, 3, 1, 1, 1, False),
        Shape(1, 1024, 7, 7, 1024, 2, 4, dt, False, 3, 1, 1, 1, False),
        Shape(1, 1024, 10, 14, 1024, 2, 1, dt, False),
        Shape(2, 768, 8, 8, 768, 4, 2, dt, False),
        Shape(1, 2048, 7, 7, 2048, 4, 1, dt, False),
        Shape(1, 1024, 14, 14, 512, 2, 1, dt, True),
        Shape(1, 512, 7, 7, 512, 2, 1, dt, False),
        Shape(4, 512, 7, 7, 512, 2, 1, dt, False),
        Shape(1, 1024, 25, 42, 1024, 32, 1, dt, False, 3, 2, 1),
        Shape(1, 256, 32, 32, 256, 4, 1, dt, False),
        Shape(8, 192, 7, 7, 96, 2, 2, dt, False, 3, 1, 3, 3),
    ]
variants = {"old": "0", "loop": "1", "rule": None}
labels = list(variants)
for r in range(2):
    order = labels[r % 3:] + labels[:r % 3]
    for s in shapes:
        for lab in order:
            os.environ.pop("AB_GROUP_LOOP", None)
            if variants[lab] is not None: os.environ["AB_GROUP_LOOP"] = variants[lab]
            ab.measure(lab, s, backward=False)
        if r == 0 and s.dtype != torch.bfloat16:
            torch.backends.cuda.matmul.allow_tf32 = s.dtype == TF32
            i = make_inputs(s, "cuda", False)
            geo = ((s.stride,) * 2, (s.pad,) * 2, (s.dil,) * 2)
            fn = lambda: torchvision.ops.deform_conv2d(i["input"], i["offset"], i["weight"], i["bias"], *geo, i["mask"])
            with torch.no_grad():
                fn(); t = do_bench(fn, rep=50)
            print(f"tv\t{s.name()}\t{s.dtype}\t{t:.1f}\tnan\tnan\tnan", flush=True)
