"""Small-M probe: which access pattern lets a GEMV (y = sigmoid(x W^T + b), x of M <= 64 rows)
read the weight at the streaming-read floor of scripts/diag/read_floor.py?

Triton kernels, as quick stand-ins for CUDA designs (the library's kernels stay CUDA): each
program owns BN weight rows and a K range (split-K S ways), walks it in BK steps with `tl.dot`
against x^T (M padded to 16), num_stages-deep software pipeline. Timed with the benchmark's own
method (benchmarks/common.py: CUDA events, 256 MB zeroed before each call), beside mm alone,
eager, customops (when built) and a plain contiguous read of the weight.

    python scripts/diag/gemv_probe.py [--m 1 8 32] [--n 4096] [--k 4096]
"""
import argparse
import itertools
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))
from common import do_bench, rel_err  # noqa: E402


@triton.jit
def _gemv(x, w, b, out, part, M, N, K, BN: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, S: tl.constexpr,
          STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    k_per = tl.cdiv(K, S * BK) * BK
    k0 = pid_s * k_per
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for k in tl.range(k0, tl.minimum(k0 + k_per, K), BK, num_stages=STAGES):
        rk = k + tl.arange(0, BK)
        wt = tl.load(w + rn[:, None].to(tl.int64) * K + rk[None, :], mask=(rn[:, None] < N), other=0.0)
        xt = tl.load(x + rm[None, :] * K + rk[:, None], mask=(rm[None, :] < M), other=0.0)
        acc = tl.dot(wt, xt, acc)
    if S == 1:
        z = acc + tl.load(b + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
        y = 1.0 / (1.0 + tl.exp(-z))
        tl.store(out + rm[None, :] * N + rn[:, None], y.to(out.dtype.element_ty), mask=(rm[None, :] < M) & (rn[:, None] < N))
    else:
        tl.store(part + pid_s * N * BM + rm[None, :] * N + rn[:, None], acc, mask=(rm[None, :] < M) & (rn[:, None] < N))


@triton.jit
def _gemv_oneshot(x, w, part, M, N, K, BN: tl.constexpr, KS: tl.constexpr, BM: tl.constexpr):
    # One load of the program's whole [BN, KS] weight tile (no loop): every byte requested at once.
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    rk = pid_s * KS + tl.arange(0, KS)
    wt = tl.load(w + rn[:, None].to(tl.int64) * K + rk[None, :], mask=(rn[:, None] < N), other=0.0)
    xt = tl.load(x + rm[None, :] * K + rk[:, None], mask=(rm[None, :] < M), other=0.0)
    acc = tl.dot(wt, xt)
    tl.store(part + pid_s * N * BM + rm[None, :] * N + rn[:, None], acc, mask=(rm[None, :] < M) & (rn[:, None] < N))


@triton.jit
def _finish(part, b, out, M, N, BM: tl.constexpr, S: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    z = tl.load(b + offs % N, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(S):
        z += tl.load(part + s * N * BM + offs, mask=mask, other=0.0)
    tl.store(out + offs, (1.0 / (1.0 + tl.exp(-z))).to(out.dtype.element_ty), mask=mask)


def gemv(x, w, b, out, part, bn, bk, s, stages, warps):
    m, k = x.shape
    n = w.shape[0]
    bm = max(16, triton.next_power_of_2(m))
    _gemv[(triton.cdiv(n, bn), s)](x, w, b, out, part, m, n, k, BN=bn, BK=bk, BM=bm, S=s, STAGES=stages, num_warps=warps)
    if s > 1:
        _finish[(triton.cdiv(m * n, 1024),)](part, b, out, m, n, BM=bm, S=s, BLOCK=1024)
    return out


@triton.jit
def _read(src, partial, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(partial + tl.program_id(0), tl.sum(acc))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="*", default=[1, 8, 32])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--oneshot-only", action="store_true")
    args = p.parse_args()
    try:
        import customops
    except ImportError:
        customops = None
    n, k = args.n, args.k
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; N = {n}, K = {k}, bf16")
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    wflat = w.view(-1)
    partial = torch.empty(triton.cdiv(wflat.numel(), 4096 * 4), device="cuda", dtype=torch.float32)
    t_read = do_bench(lambda: _read[(partial.numel(),)](wflat, partial, wflat.numel(), BLOCK=4096, ITERS=4, num_warps=8))
    print(f"contiguous read of the weight ({w.numel() * 2 / 2**20:.0f} MiB): {t_read:.1f} µs, {w.numel() * 2 / t_read / 1e6:.2f} TB/s")
    configs = [(bn, bk, s, stages, 4) for bn, (bk, stages), s in
               itertools.product([16, 32, 64], [(128, 6), (256, 4), (512, 3)], [1, 2, 4])]
    for m in args.m:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        part = torch.empty(4, max(16, triton.next_power_of_2(m)), n, device="cuda", dtype=torch.float32)
        ref = torch.sigmoid(F.linear(x.double(), w.double(), b.double()))
        nbytes = (m * k + n * k + n + m * n) * 2
        refs = {"mm alone": lambda: torch.mm(x, w.t()), "eager": lambda: torch.sigmoid(F.linear(x, w, b))}
        if customops is not None:
            refs["customops"] = lambda: customops.fused_linear_sigmoid(x, w, b)
        line = ", ".join(f"{name} {do_bench(fn):.1f}" for name, fn in refs.items())
        print(f"\nM = {m}: {line} µs")
        results = []
        for bn, bk, s, stages, warps in (configs if not args.oneshot_only else []):
            if m > 32 and bn > 32:
                continue  # register pressure
            fn = lambda: gemv(x, w, b, out, part, bn, bk, s, stages, warps)  # noqa: E731
            try:
                out.fill_(float("nan"))
                fn()
                err = rel_err(out, ref)
            except Exception as e:  # noqa: BLE001 - a config Triton cannot compile is skipped, and said
                print(f"  BN {bn} BK {bk} S {s} stages {stages}: {type(e).__name__}")
                continue
            assert err <= 1e-2, f"BN {bn} BK {bk} S {s}: rel err {err}"
            results.append((do_bench(fn), bn, bk, s, stages, warps, err))
        for bn, ks, warps in itertools.product([16, 32], [512, 1024, 2048], [4, 8]):
            splits = k // ks
            bm = max(16, triton.next_power_of_2(m))
            part1 = torch.empty(splits, bm, n, device="cuda", dtype=torch.float32)

            def one(bn=bn, ks=ks, warps=warps, splits=splits, bm=bm, part1=part1):
                _gemv_oneshot[(triton.cdiv(n, bn), splits)](x, w, part1, m, n, k, BN=bn, KS=ks, BM=bm, num_warps=warps)

            def both(one=one, splits=splits, bm=bm, part1=part1):
                one()
                _finish[(triton.cdiv(m * n, 1024),)](part1, b, out, m, n, BM=bm, S=splits, BLOCK=1024)
                return out

            try:
                out.fill_(float("nan"))
                err = rel_err(both(), ref)
            except Exception as e:  # noqa: BLE001
                print(f"  one-shot BN {bn} KS {ks} warps {warps}: {type(e).__name__}")
                continue
            assert err <= 1e-2, err
            print(f"  one-shot BN {bn:3d} KS {ks:4d} warps {warps} ({triton.cdiv(n, bn) * splits} programs): "
                  f"partials {do_bench(one):5.1f} µs, with the sum {do_bench(both):5.1f} µs, rel err {err:.1e}")
        for t, bn, bk, s, stages, warps, err in sorted(results)[:3]:
            print(f"  {t:6.1f} µs {nbytes / t / 1e6:5.2f} TB/s  BN {bn:3d} BK {bk:4d} split-K {s} stages {stages} warps {warps}  rel err {err:.1e}")


if __name__ == "__main__":
    main()
