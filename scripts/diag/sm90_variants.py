"""CUTLASS sm90 configurations around the library's Pingpong 128x128 kernel (sm90_variants.cu),
timed against the library's own kernels, cuBLAS mm alone and eager at issue 4's large shapes,
bf16: which knob (cluster, epilogue tile, tile shape, k-tile, raster order, swizzle, the
activation itself) moves the K = 512 case. Each variant is checked against float64 on a
poisoned output first (‖out − ref‖/‖ref‖ ≤ 1e-2, the tests' bound for 16-bit, and no NaN left).

    python scripts/diag/sm90_variants.py [--build-only] [--lib PATH] [--shapes M,K,N ...]
    ncu --profile-from-start off ... python scripts/diag/sm90_variants.py --lib PATH --profile 0 2 ...

Builds the variants with nvcc (one process per variant) into build/diag_sm90/ unless --lib
names a prebuilt library; the library and its callers share only raw pointers (ctypes), so a
build made against one torch version runs under another, and with --no-lib-kernels without
customops built.
"""
import argparse
import concurrent.futures
import ctypes
import glob
import importlib.util
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
VARIANTS = {  # id -> what it changes against variant 0 (sm90_variants.cu); 23-25 are the library's kernels
    0: "pingpong 128x128x64, cluster 2x1, LinComb epilogue (the library's kernel until the eighth session)",
    1: "cluster 1x1",
    2: "epilogue tile 64x64",
    3: "epilogue tile 64x128",
    4: "pingpong 64x256",
    5: "k-tile 128",
    6: "bias only (no sigmoid)",
    7: "coop 256x128, epi 128x64",
    8: "pingpong 64x256, epi 64x64",
    9: "cluster 1x2",
    10: "epilogue tile 64x128, cluster 1x2",
    11: "coop 256x128 c1x2, epi 128x128",
    12: "pingpong 64x256, epi 64x128",
    13: "pingpong 64x256, epi 64x256",
    14: "coop 128x256 c1x2, epi 128x64",
    15: "coop 128x256 c1x2, epi 128x128",
    16: "epilogue tile 64x64, cluster 2x2",
    17: "epilogue tile 64x64, cluster 1x2",
    18: "epilogue tile 64x64, packed f16x2 sigmoid",
    19: "packed f16x2 sigmoid",
    20: "epilogue tile 64x64, bias only",
    21: "epilogue tile 64x64, 3/8 sigmoids on FMA",
    22: "epilogue tile 64x64, 4/8 sigmoids on FMA",
    23: "epilogue tile 64x64, the library's EVT (its epi64 kernel)",
    24: "the library's EVT (its pingpong 128x128 kernel)",
    25: "coop 128x256 c1x2, the library's EVT (its coop kernel)",
    26: "coop 128x256 c1x2, LinComb epilogue",
}
BIAS_ONLY = (6, 20)
SCHEDULES = [(1, 1), (2, 1), (2, 2), (2, 4), (2, 8), (1, 4)]  # (raster, swizzle) for variant 0 at the first shape


def build(out_dir, only=None):
    from torch.utils import cpp_extension

    cutlass = os.environ.get("CUSTOMOPS_CUTLASS_DIR")  # as setup.py: else the nvidia-cutlass package's headers
    if cutlass is None:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None:
            sys.exit("the CUTLASS headers are missing: pip install nvidia-cutlass (or set CUSTOMOPS_CUTLASS_DIR)")
        cutlass = os.path.join(os.path.dirname(spec.origin), "source")
    nvidia = importlib.util.find_spec("nvidia")
    extra = [d for base in (nvidia.submodule_search_locations if nvidia else []) for d in glob.glob(os.path.join(base, "cu*", "include"))]
    includes = cpp_extension.include_paths(device_type="cuda") + extra + [
        os.path.join(cutlass, "include"), os.path.join(cutlass, "tools", "util", "include")]
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    # The library's nvcc flags (setup.py and torch.utils.cpp_extension's defaults), so that variant 0
    # is the library's kernel.
    flags = ["-O3", "-std=c++20", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
             "--expt-extended-lambda", "-DNDEBUG", "-DCUSTOMOPS_WITH_CUDA", "-DCUSTOMOPS_WITH_CUTLASS",
             "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-D__CUDA_NO_HALF2_OPERATORS__", "-Xcompiler", "-fPIC"] + [f"-I{d}" for d in includes]
    os.makedirs(out_dir, exist_ok=True)
    src = os.path.join(ROOT, "scripts", "diag", "sm90_variants.cu")

    def one(v):
        obj = os.path.join(out_dir, f"v{v}.o")
        if os.path.exists(obj):
            os.remove(obj)  # a failed build must not leave the previous object to be linked
        r = subprocess.run([nvcc, *flags, f"-DVARIANT={v}", "-c", src, "-o", obj], capture_output=True, text=True)
        return v, r.returncode, r.stderr[-3000:], obj

    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(VARIANTS), os.cpu_count() or 1))) as pool:
        for v, rc, err, obj in pool.map(one, only or VARIANTS):
            print(f"variant {v}: nvcc exit {rc}", flush=True)
            if rc:
                print(err)
    objs = sorted(glob.glob(os.path.join(out_dir, "v*.o")))
    lib = os.path.join(out_dir, "libsm90_variants.so")
    subprocess.run([nvcc, "-shared", "-o", lib, *objs], check=True)
    return lib


def kernel_names(fn):
    """The CUDA kernels one call of fn launches (torch.profiler), e.g. which cuBLAS kernel mm picks."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build-only", action="store_true")
    p.add_argument("--lib")
    p.add_argument("--build", type=int, nargs="*", help="build only these variants (and link every object built)")
    p.add_argument("--no-lib-kernels", action="store_true", help="leave out the library's kernels (no customops import)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-schedules", action="store_true", help="leave out the raster/swizzle rows of variant 0")
    p.add_argument("--variants", type=int, nargs="*", help="check and time only these variants (default: every one built)")
    p.add_argument("--profile", type=int, nargs="*",
                   help="after the checks, run mm and these variants once each at the first shape inside "
                        "cudaProfilerStart/Stop, then exit (for ncu --profile-from-start off)")
    p.add_argument("--shapes", nargs="*", default=["32768,512,2048", "8192,1024,4096", "16384,4096,4096", "4096,4096,4096"])
    p.add_argument("--fp16-shapes", nargs="*", default=["16384,4096,4096"], help="the library's kernels alone, float16")
    args = p.parse_args()
    lib_path = args.lib or build(os.path.join(ROOT, "build", "diag_sm90"), args.build)
    if args.build_only:
        return
    from common import bench_round_robin, forced, rel_err

    lib = ctypes.CDLL(lib_path)
    fns = {}
    for v in VARIANTS:
        try:
            f = getattr(lib, f"customops_sm90_variant_{v}")
        except AttributeError:
            continue  # failed to build
        if args.variants is not None and v not in args.variants:
            continue
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        fns[v] = f

    def call(v, x, w, b, out, raster=0, swizzle=1):
        m, k = x.shape
        n = w.shape[0]
        rc = fns[v](x.data_ptr(), x.stride(0), w.data_ptr(), w.stride(0), b.data_ptr(), out.data_ptr(), out.stride(0),
                    m, n, k, raster, swizzle, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"variant {v} returned {rc}")
        return out

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; variants built: {sorted(fns)}", flush=True)
    runs = [(s, torch.bfloat16) for s in args.shapes] + [(s, torch.float16) for s in args.fp16_shapes]
    for shape, dtype in runs:
        m, k, n = map(int, shape.split(","))
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
        b = torch.randn(n, device="cuda", dtype=dtype)
        out = torch.empty(m, n, device="cuda", dtype=dtype)
        variants = fns if dtype == torch.bfloat16 else {}
        z = F.linear(x.double(), w.double(), b.double())
        errs, maxabs = {}, {}
        for v in variants:
            out.fill_(float("nan"))
            call(v, x, w, b, out)
            torch.cuda.synchronize()
            errs[v] = rel_err(out, z if v in BIAS_ONLY else torch.sigmoid(z))
            maxabs[v] = (out.double() - (z if v in BIAS_ONLY else torch.sigmoid(z))).abs().max().item()
            assert errs[v] <= 1e-2 and not out.isnan().any(), f"variant {v} at {shape}: rel err {errs[v]:.3g}"
        del z
        if args.profile is not None:
            todo = [("mm", lambda: torch.mm(x, w.t()))] + [(f"v{v}", lambda v=v: call(v, x, w, b, out)) for v in args.profile]
            for _, fn in todo:  # warm: module load and workspace allocation stay out of the profile
                fn()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            for name, fn in todo:
                torch.cuda.nvtx.range_push(name)
                fn()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
            torch.cuda.cudart().cudaProfilerStop()
            print("profiled, in order:", [name for name, _ in todo])
            return
        impls = {"mm": lambda: torch.mm(x, w.t()), "eager": lambda: torch.sigmoid(F.linear(x, w, b))}
        if not args.no_lib_kernels:
            import customops

            op = lambda: customops.fused_linear_sigmoid(x, w, b)  # noqa: E731
            for kern in ("sm90_pingpong_128x128", "sm90_pingpong_128x128_epi64", "sm90_coop_128x256"):
                impls["lib " + kern[5:]] = forced(kern, op)
        for v in variants:
            impls[f"v{v}"] = (lambda v=v: call(v, x, w, b, out))
        if variants and shape == args.shapes[0] and not args.no_schedules:
            for raster, swizzle in SCHEDULES:
                impls[f"v0 r{raster} s{swizzle}"] = (lambda r=raster, s=swizzle: call(0, x, w, b, out, r, s))
        print(f"\n{m}x{k}x{n}: mm runs {kernel_names(impls['mm'])}", flush=True)
        t = bench_round_robin(impls, rounds=args.rounds)
        flops = 2 * m * n * k
        print(f"\n{m}x{k}x{n} {str(dtype)[6:]} (µs, median of {args.rounds} round-robin rounds; ratio to mm alone)")
        for name, us in t.items():
            v = int(name[1:].split()[0]) if name.startswith("v") else None
            what = VARIANTS[v] if v is not None and " " not in name else ""
            err = f"  rel err {errs[v]:.1e}, max abs {maxabs[v]:.1e}" if v is not None and " " not in name else ""
            print(f"  {name:<24} {us:8.1f}  {us / t['mm']:.3f}  {flops / us / 1e6:6.0f} TFLOP/s  {what}{err}", flush=True)
        del x, w, b, out


if __name__ == "__main__":
    main()
