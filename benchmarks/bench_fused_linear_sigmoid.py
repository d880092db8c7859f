"""Benchmark harness: customops.fused_linear_sigmoid against eager PyTorch, torch.compile (default
and max-autotune-no-cudagraphs), cuBLAS mm alone and the measured roofline, in one run.

    python benchmarks/bench_fused_linear_sigmoid.py [--dtypes bfloat16 float16 float32 tf32]
        [--autotune-dtypes bfloat16] [--variants small_m sm90_pingpong_128x128 ...] [--out benchmarks/results]
        [--quick] [--no-cpu]

"tf32" is float32 with torch.backends.cuda.matmul.allow_tf32 = True (float32 otherwise runs IEEE).
--variants also times each named CUDA kernel run by name (customops::_fused_linear_sigmoid_with_kernel), on the
shapes it can run (how the dispatch in fused_linear_sigmoid_cuda.cu was tuned).

Method (docs/design.md says why): FLOPs (2·M·N·K) and bytes (x, W, b read once, y written
once) counted first; every implementation checked against a float64 reference
(‖out − ref‖/‖ref‖); times are medians of CUDA-event timings with the L2 flushed before each
run (triton.testing.do_bench); the two ceilings (bf16 matmul rate, device-to-device copy
bandwidth) are measured in the same run. Writes a markdown table, a JSON file and a PNG plot
(achieved TFLOP/s and TB/s against M at K = N = 4096, with the roofline) named after the GPU
and date.
"""

import argparse
import datetime
import json
import os
import platform
import sys

import torch
import torch.nn.functional as F

import customops
from common import bench_round_robin, copy_tbs, do_bench, forced, graphed, matmul_tflops, rel_err

TABLE_SHAPES = [
    (16384, 4096, 4096),
    (8192, 1024, 4096),
    (32768, 512, 2048),
    (4096, 4096, 4096),
    (32, 4096, 4096),
    (1, 4096, 4096),
]
SWEEP_M = [2**i for i in range(15)]  # 1 .. 16384 at K = N = 4096


def measure_ceilings():
    """Measured bf16 dense matmul rate (TFLOP/s) and copy bandwidth (TB/s, read + write)."""
    return matmul_tflops(do_bench, torch.bfloat16), copy_tbs(do_bench)


def eager_fn(x, w, b):
    return torch.sigmoid(F.linear(x, w, b))


def bench_shape(m, k, n, dtype, modes, peak_tflops, peak_tbs, variants=(), tf32=False, compiled=None):
    """One row. `compiled` (mode -> compiled function) reuses compilations across rows, as the
    M sweep does: one torch.compile call serving every batch size, as a user would have."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(n, device="cuda", dtype=dtype)
    ref = torch.sigmoid(F.linear(x.double(), w.double(), b.double()))
    impls = {
        "customops": lambda: customops.fused_linear_sigmoid(x, w, b),
        "eager": lambda: eager_fn(x, w, b),
        "mm alone": lambda: torch.mm(x, w.t()),
    }
    for v in variants:
        try:
            forced(v, x, w, b)()
        except RuntimeError:
            continue  # this kernel cannot run this shape or dtype
        impls[f"ours[{v}]"] = forced(v, x, w, b)
    for mode in modes:
        if compiled is not None and mode in compiled:
            fn = compiled[mode]
        else:
            torch._dynamo.reset()
            fn = torch.compile(eager_fn, mode=None if mode == "default" else mode, dynamic=False)
        fn(x, w, b)  # compile (and autotune) outside the timing
        impls[f"compile {mode}"] = (lambda c: lambda: c(x, w, b))(fn)
    elt = x.element_size()
    flops = 2 * m * n * k
    nbytes = (m * k + n * k + n + m * n) * elt
    floor_us = max(flops / (peak_tflops * 1e12), nbytes / (peak_tbs * 1e12)) * 1e6
    dtype_name = "tf32" if tf32 else str(dtype).replace("torch.", "")
    row = dict(M=m, K=k, N=n, dtype=dtype_name, flops=flops, bytes=nbytes, floor_us=floor_us)
    limit = {torch.float32: 5e-4 if tf32 else 1e-5}.get(dtype, 1e-2)
    for name, fn in impls.items():
        if name != "mm alone":
            # Poison: the caching allocator hands this freed NaN block to the output, so
            # elements the kernel fails to write show up as NaN.
            poison = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            del poison
            out = fn()
            err = rel_err(out, ref)
            row[f"err {name}"] = err
            if not err <= limit and not name.startswith("compile"):
                raise AssertionError(f"{name} at {m}x{k}x{n} {dtype_name}: relative error {err:.3g} > {limit}")
    row.update(bench_round_robin(impls))
    torch.backends.cuda.matmul.allow_tf32 = False
    return row


def bench_backward(m, k, n, dtype):
    x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
    w = (torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5).requires_grad_()
    b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn(m, n, device="cuda", dtype=dtype)

    def step(fn):
        return lambda: torch.autograd.grad(fn(x, w, b), (x, w, b), g)

    # graphed(): the step captured once and replayed, the GPU's work alone, without the host's
    # autograd overhead, which here can exceed the GPU time and moved plain timings by up to 40%.
    ours, theirs = step(customops.fused_linear_sigmoid), step(eager_fn)
    times = bench_round_robin(
        {"customops": ours, "eager": theirs, "customops_graph": graphed(ours), "eager_graph": graphed(theirs)}
    )
    return dict(M=m, K=k, N=n, dtype=str(dtype).replace("torch.", ""), **times)


def bench_elementwise(numel=2**28, dtype=torch.bfloat16):
    a = torch.randn(numel, device="cuda", dtype=dtype)
    c = torch.randn(numel, device="cuda", dtype=dtype)
    rows = []
    for name, ours, theirs, nbytes in [
        ("add", lambda: customops.add(a, c), lambda: torch.add(a, c), 3 * numel * a.element_size()),
        ("sigmoid", lambda: customops.sigmoid(a), lambda: torch.sigmoid(a), 2 * numel * a.element_size()),
    ]:
        t = bench_round_robin({"ours": ours, "torch": theirs})
        t_ours, t_torch = t["ours"], t["torch"]
        rows.append(
            dict(
                op=name,
                numel=numel,
                dtype=str(dtype).replace("torch.", ""),
                customops=t_ours,
                torch=t_torch,
                tbs_customops=nbytes / t_ours / 1e6,
                tbs_torch=nbytes / t_torch / 1e6,
            )
        )
    return rows


def bench_cpu(shapes=((32, 64, 16), (8192, 256, 256), (4096, 1024, 64), (1024, 1024, 1024), (64, 4096, 4096))):
    """float32 forward on the CPU (all its threads), ours against eager; medians of timeit runs, µs."""
    import torch.utils.benchmark as tb

    rows = []
    for m, k, n in shapes:
        x, w, b = torch.randn(m, k), torch.randn(n, k) / k**0.5, torch.randn(n)
        times = {}
        for name, stmt in [("customops", "customops.fused_linear_sigmoid(x, w, b)"), ("eager", "eager_fn(x, w, b)")]:
            t = tb.Timer(
                stmt,
                globals=dict(customops=customops, eager_fn=eager_fn, x=x, w=w, b=b),
                num_threads=torch.get_num_threads(),
            )
            times[name] = t.blocked_autorange(min_run_time=1.0).median * 1e6
        rows.append(dict(M=m, K=k, N=n, threads=torch.get_num_threads(), **times))
    return rows


def fmt_table(rows, modes):
    cols = ["customops", "eager"] + [f"compile {m}" for m in modes] + ["mm alone"]
    cols += sorted({key for r in rows for key in r if key.startswith("ours[")})
    lines = [
        "| M×K×N | dtype | "
        + " | ".join(f"{c} (µs)" for c in cols)
        + " | eager / ours | ours / mm | floor (µs) | ours: fraction of floor"
        + " | ours TFLOP/s | ours TB/s | max rel err |",
        "|" + "---|" * (len(cols) + 9),
    ]
    for r in rows:
        ours = r["customops"]
        errs = max(v for key, v in r.items() if key.startswith("err "))
        lines.append(
            f"| {r['M']}×{r['K']}×{r['N']} | {r['dtype']} | "
            + " | ".join(f"{r[c]:.1f}" if c in r else "–" for c in cols)
            + f" | {r['eager'] / ours:.2f}× | {ours / r['mm alone']:.3f} | {r['floor_us']:.1f}"
            + f" | {r['floor_us'] / ours:.2f}"
            f" | {r['flops'] / ours / 1e6:.1f} | {r['bytes'] / ours / 1e6:.2f} | {errs:.1e} |"
        )
    return "\n".join(lines)


def plot(sweep_rows, modes, peak_tflops, peak_tbs, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    ms = [r["M"] for r in sweep_rows]
    for name in ["customops", "eager"] + [f"compile {m}" for m in modes] + ["mm alone"]:
        if name not in sweep_rows[0]:
            continue
        ax1.plot(ms, [r["flops"] / r[name] / 1e6 for r in sweep_rows], marker="o", label=name)
        ax2.plot(ms, [r["bytes"] / r[name] / 1e6 for r in sweep_rows], marker="o", label=name)
    roof = [min(peak_tflops, r["flops"] / r["bytes"] * peak_tbs) for r in sweep_rows]
    ax1.plot(ms, roof, "k--", label=f"roofline ({peak_tflops:.0f} TFLOP/s, {peak_tbs:.2f} TB/s)")
    ax2.axhline(peak_tbs, color="k", linestyle="--", label=f"copy bandwidth {peak_tbs:.2f} TB/s")
    for ax, ylabel in ((ax1, "achieved TFLOP/s"), (ax2, "effective TB/s (x, W, b read once, y written once)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (K = N = 4096)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_yscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main_cpu(args, argv):
    date = datetime.date.today().isoformat()
    rows = bench_cpu()
    cpu = platform.processor() or platform.machine()
    text = (
        f"# fused_linear_sigmoid on the CPU\n\n{cpu}, {os.cpu_count()} cores, {rows[0]['threads']} threads, "
        f"torch {torch.__version__}, {date}. Command: `python benchmarks/bench_fused_linear_sigmoid.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`. float32 forward, medians of "
        "torch.utils.benchmark.Timer.blocked_autorange (at least 1 s each).\n\n"
        "| M×K×N | customops (µs) | eager (µs) | eager / ours |\n|---|---|---|---|\n"
        + "\n".join(
            f"| {r['M']}×{r['K']}×{r['N']} | {r['customops']:.0f} | {r['eager']:.0f} | "
            f"{r['eager'] / r['customops']:.2f}× |"
            for r in rows
        )
        + "\n"
    )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"fused_linear_sigmoid_cpu_{os.cpu_count()}cores_{date}.md")
    with open(path, "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {path}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument(
        "--autotune-dtypes",
        nargs="*",
        default=["bfloat16"],
        help="dtypes whose table shapes also run torch.compile max-autotune-no-cudagraphs",
    )
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help="CUDA kernels to time forced, besides the automatic choice (generic, small_m, sm90_...)",
    )
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU rows")
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU rows (no GPU needed)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (a quicker tuning run)")
    parser.add_argument(
        "--compile-dtypes",
        nargs="*",
        default=["bfloat16"],
        help="dtypes whose table shapes run torch.compile (default mode)",
    )
    parser.add_argument("--quick", action="store_true", help="two table shapes, short sweep (a smoke run)")
    args = parser.parse_args(argv)
    if args.cpu_only:
        return main_cpu(args, argv)
    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU", file=sys.stderr)
        return 2

    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    shapes = TABLE_SHAPES[-2:] if args.quick else TABLE_SHAPES
    sweep = SWEEP_M[::4] if args.quick else SWEEP_M
    peak_tflops, peak_tbs = measure_ceilings()
    print(
        f"{gpu}, torch {torch.__version__}: measured {peak_tflops:.0f} TFLOP/s bf16, {peak_tbs:.2f} TB/s copy",
        flush=True,
    )

    table = []
    for dtype_name in args.dtypes:
        dtype = torch.float32 if dtype_name == "tf32" else getattr(torch, dtype_name)
        modes = (
            []
            if args.no_compile or dtype_name not in args.compile_dtypes
            else (["default"] + (["max-autotune-no-cudagraphs"] if dtype_name in args.autotune_dtypes else []))
        )
        for m, k, n in shapes:
            table.append(bench_shape(m, k, n, dtype, modes, peak_tflops, peak_tbs, args.variants, dtype_name == "tf32"))
            print(fmt_table(table[-1:], modes).splitlines()[-1], flush=True)
    sweep_rows = []
    torch._dynamo.reset()
    sweep_compiled = {} if args.no_compile else {"default": torch.compile(eager_fn)}
    for m in sweep:
        sweep_rows.append(
            bench_shape(
                m,
                4096,
                4096,
                torch.bfloat16,
                [] if args.no_compile else ["default"],
                peak_tflops,
                peak_tbs,
                args.variants,
                compiled=sweep_compiled,
            )
        )
        print(f"sweep M={m}: ours {sweep_rows[-1]['customops']:.1f} µs", flush=True)
    backward = [bench_backward(m, k, n, torch.bfloat16) for m, k, n in shapes]
    elementwise = bench_elementwise()
    cpu_rows = [] if args.no_cpu else bench_cpu()

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"fused_linear_sigmoid_{gpu.replace(' ', '_')}_{date}")
    header = (
        f"# fused_linear_sigmoid on {gpu}\n\n"
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, customops {customops.__version__}, {date}, "
        f"Python {platform.python_version()}. Command: `python benchmarks/bench_fused_linear_sigmoid.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
        f"Measured ceilings in this run: {peak_tflops:.0f} TFLOP/s (bf16 8192³ matmul), {peak_tbs:.2f} TB/s "
        f"(2 GiB device-to-device copy, read + write). Times: medians, µs, CUDA events, L2 flushed "
        "(triton.testing.do_bench), implementations timed in turn (each round from a different start), "
        "median of 3 rounds. Floor = max(FLOPs / rate, bytes / bandwidth).\n"
    )
    all_modes = ["default"]
    parts = [header]
    for dtype_name in args.dtypes:
        modes = (
            []
            if args.no_compile or dtype_name not in args.compile_dtypes
            else (["default"] + (["max-autotune-no-cudagraphs"] if dtype_name in args.autotune_dtypes else []))
        )
        rows = [r for r in table if r["dtype"] == dtype_name]
        parts.append(f"\n## Forward, {dtype_name}\n\n" + fmt_table(rows, modes) + "\n")
    parts.append(
        "\n## Sweep of M at K = N = 4096, bfloat16 (one torch.compile serves every M)\n\n"
        + fmt_table(sweep_rows, all_modes)
        + "\n"
    )
    parts.append(
        "\n## Forward + backward (torch.autograd.grad w.r.t. x, W, b), bfloat16\n\n"
        "Plain: `torch.autograd.grad` called each time (host overhead included). CUDA graph: the same\n"
        "step captured once and replayed (the GPU's work alone).\n\n"
        "| M×K×N | customops (µs) | eager (µs) | eager / ours | customops, CUDA graph (µs) "
        "| eager, CUDA graph (µs) | eager / ours, CUDA graph |\n"
        "|---|---|---|---|---|---|---|\n"
        + "\n".join(
            f"| {r['M']}×{r['K']}×{r['N']} | {r['customops']:.1f} | {r['eager']:.1f} "
            f"| {r['eager'] / r['customops']:.2f}× "
            f"| {r['customops_graph']:.1f} | {r['eager_graph']:.1f} | {r['eager_graph'] / r['customops_graph']:.2f}× |"
            for r in backward
        )
        + "\n"
    )
    parts.append(
        "\n## Elementwise, 2^28 elements\n\n"
        "| op | dtype | customops (µs) | torch (µs) | customops TB/s | torch TB/s | ours / torch bandwidth |\n"
        "|---|---|---|---|---|---|---|\n"
        + "\n".join(
            f"| {r['op']} | {r['dtype']} | {r['customops']:.1f} | {r['torch']:.1f} | {r['tbs_customops']:.2f} "
            f"| {r['tbs_torch']:.2f} | {r['tbs_customops'] / r['tbs_torch']:.2f} |"
            for r in elementwise
        )
        + "\n"
    )
    if cpu_rows:
        parts.append(
            f"\n## CPU forward, float32 ({platform.processor() or platform.machine()}, "
            f"{cpu_rows[0]['threads']} threads)\n\n"
            "| M×K×N | customops (µs) | eager (µs) | eager / ours |\n|---|---|---|---|\n"
            + "\n".join(
                f"| {r['M']}×{r['K']}×{r['N']} | {r['customops']:.0f} | {r['eager']:.0f} "
                f"| {r['eager'] / r['customops']:.2f}× |"
                for r in cpu_rows
            )
            + "\n"
        )
    parts.append(f"\n![sweep]({os.path.basename(stem)}.png)\n")
    with open(stem + ".md", "w") as f:
        f.write("".join(parts))
    with open(stem + ".json", "w") as f:
        json.dump(
            dict(
                gpu=gpu,
                torch=torch.__version__,
                date=date,
                peak_tflops=peak_tflops,
                peak_tbs=peak_tbs,
                table=table,
                sweep=sweep_rows,
                backward=backward,
                elementwise=elementwise,
                cpu=cpu_rows,
            ),
            f,
            indent=1,
        )
    plot(
        sweep_rows,
        all_modes,
        peak_tflops,
        peak_tbs,
        stem + ".png",
        f"fused_linear_sigmoid, bf16, {gpu}, torch {torch.__version__}, {date}",
    )
    print("".join(parts))
    print(f"wrote {stem}.md/.json/.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
