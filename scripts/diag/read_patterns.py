"""Times the weight-read patterns of read_patterns.cu (no arithmetic) against cuBLAS's M = 1 GEMV
and a contiguous read, under the benchmark's timing (benchmarks/common.py: CUDA events, 256 MB
zeroed before each call): does a small-M kernel's access pattern, rather than its arithmetic,
keep it at ~18 µs where a plain read of the 32 MiB weight takes 13.6 (benchmarks/NOTES.md,
"Seventh session")?

    python scripts/diag/read_patterns.py [--lib PATH] [--n 4096] [--k 4096]

Builds read_patterns.cu with nvcc into build/diag_read_patterns/ unless --lib names a built
library (plain CUDA and ctypes: a build made on one machine runs under any torch there).
"""
import argparse
import ctypes
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from common import do_bench  # noqa: E402


def build(out_dir):
    from torch.utils import cpp_extension

    os.makedirs(out_dir, exist_ok=True)
    lib = os.path.join(out_dir, "libread_patterns.so")
    src = os.path.join(ROOT, "scripts", "diag", "read_patterns.cu")
    subprocess.run([os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"), "-O3", "-std=c++17",
                    "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC", src, "-o", lib], check=True)
    return lib


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    args = p.parse_args()
    lib = ctypes.CDLL(args.lib or build(os.path.join(ROOT, "build", "diag_read_patterns")))
    vp, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.read_contiguous.argtypes = [vp, i64, i32, vp, vp]
    lib.read_rows16.argtypes = [vp, i64, i32, i32, i32, i32, i32, vp, vp]
    lib.read_row_streams.argtypes = [vp, i64, i32, i32, i32, i32, i32, vp, vp]
    n, k = args.n, args.k
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    sink = torch.zeros(1, device="cuda")
    nbytes = w.numel() * 2

    def stream():
        return torch.cuda.current_stream().cuda_stream

    def checked(rc):
        if rc:
            raise RuntimeError(f"launch returned {rc}")

    impls = {"mm alone, M = 1 (cuBLAS)": lambda: torch.mm(x, w.t())}
    for u in (1, 2, 4, 8, 16):
        impls[f"contiguous U={u}"] = lambda u=u: checked(lib.read_contiguous(w.data_ptr(), nbytes, u, sink.data_ptr(), stream()))
    for u in (2, 4, 8, 16):
        for warps in (1, 4, 8):
            for split in (1, 2, 4):
                impls[f"rows16 U={u} warps={warps} split={split}"] = (
                    lambda u=u, warps=warps, split=split: checked(
                        lib.read_rows16(w.data_ptr(), w.stride(0), n, k, u, warps, split, sink.data_ptr(), stream())))
    for u, warps, rows in ((4, 4, 4), (8, 4, 4), (16, 4, 4), (4, 8, 8), (8, 8, 8), (16, 8, 8), (8, 8, 16), (16, 8, 16), (8, 8, 32)):
        impls[f"row streams U={u} warps={warps} rows={rows}"] = (
            lambda u=u, warps=warps, rows=rows: checked(
                lib.read_row_streams(w.data_ptr(), w.stride(0), n, k, u, warps, rows, sink.data_ptr(), stream())))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; weight {n}x{k} bf16 ({nbytes / 2**20:.0f} MiB); "
          "µs, median of 3 passes of do_bench")
    results = []
    for name, fn in impls.items():
        fn()
        torch.cuda.synchronize()
        t = sorted(do_bench(fn) for _ in range(3))[1]
        results.append((t, name))
        print(f"  {t:7.1f} µs {nbytes / t / 1e6:5.2f} TB/s  {name}", flush=True)
    print("\nfastest ten:")
    for t, name in sorted(results)[:10]:
        print(f"  {t:7.1f} µs {nbytes / t / 1e6:5.2f} TB/s  {name}")


if __name__ == "__main__":
    main()
