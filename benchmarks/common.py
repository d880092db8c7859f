"""Timing helpers shared by the benchmarks (the method and why: docs/design.md, "Timing
method")."""


def do_bench(fn, rep=100) -> float:
    """Median time in microseconds, CUDA events, L2 flushed before each call."""
    from triton.testing import do_bench as triton_do_bench

    return triton_do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3


def matmul_tflops(measure, dtype, device="cuda", n=8192, tf32=False) -> float:
    """Measured rate of an n x n x n matrix product through torch's libraries, in TFLOP/s: the
    ceiling of a GEMM in that dtype (float32: IEEE, or TF32 where tf32). CUDA: cuBLAS. CPU: the
    faster of the BLAS (at::mm) and oneDNN (the same product as a 1x1 convolution over a
    channels-last view; on AMD CPUs MKL's BLAS runs at about half oneDNN's rate, and
    deform_conv2d's CPU GEMMs take oneDNN's there). measure(fn) returns microseconds."""
    import torch

    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    fns = [lambda: a @ b]
    if device == "cpu" and torch.backends.mkldnn.is_available() and dtype == torch.float32:
        image, weight = a.view(1, n, 1, n).permute(0, 3, 1, 2), b.t().contiguous().view(n, n, 1, 1)
        fns.append(lambda: torch.nn.functional.conv2d(image, weight))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return max(2 * n**3 / (measure(fn) * 1e-6) / 1e12 for fn in fns)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def copy_tbs(measure, device="cuda", nbytes=2**31) -> float:
    """Measured bandwidth of a device-to-device copy of nbytes, reads plus writes, in TB/s."""
    import torch

    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / (measure(lambda: dst.copy_(src)) * 1e-6) / 1e12


def bench_round_robin(impls, rounds=3):
    """Median over `rounds` passes that each time every implementation once, in turn: on a
    power-limited GPU the clock drifts within a run, and timing each implementation in one
    block would favour whichever ran first. Each pass starts len(impls) // rounds
    implementations further on, so that no implementation always runs at the same point of a
    pass (a fixed order read the last-timed implementations a few percent slow:
    docs/design.md, "Timing method")."""
    names = list(impls)
    times = {name: [] for name in names}
    for r in range(rounds):
        start = r * max(1, len(names) // rounds)
        for name in names[start % len(names) :] + names[: start % len(names)]:
            times[name].append(do_bench(impls[name], rep=25))
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def graphed(fn):
    """fn captured once in a CUDA graph (after three warm-up calls on a side stream); returns the
    replay, which times the GPU's work without the host's launch and dispatch overhead."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def rel_err(out, ref):
    """‖out − ref‖ / ‖ref‖ in float64."""
    return ((out.double() - ref).norm() / ref.norm()).item()


def forced(kernel, x, w, b):
    """fused_linear_sigmoid(x, w, b) through one named CUDA kernel (an error where it cannot run)."""
    import torch

    return lambda: torch.ops.customops._fused_linear_sigmoid_with_kernel(x, w, b, kernel)
