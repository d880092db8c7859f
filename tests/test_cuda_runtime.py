"""CUDA runtime behaviour of every op: the current stream, CUDA graph capture and replay,
torch.compile(mode="reduce-overhead"), failed launches as RuntimeErrors, and tensors past
2^31 elements. Needs a CUDA GPU (skips, with the reason, on CPU-only machines)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import customops

from conftest import HAS_CUDA, TOL

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def all_ops(x, w, b):
    y = customops.fused_linear_sigmoid(x, w, b)
    return customops.add(customops.sigmoid(y), y)


def reference(x, w, b):
    y = torch.sigmoid(F.linear(x.double(), w.double(), b.double()))
    return torch.sigmoid(y) + y


def _params(dtype=torch.float32, requires_grad=False):
    w = (torch.randn(48, 40, device="cuda") / 6).to(dtype).requires_grad_(requires_grad)
    b = torch.randn(48, device="cuda").to(dtype).requires_grad_(requires_grad)
    return w, b


# --- streams -------------------------------------------------------------------------------


def test_ops_run_on_the_current_stream():
    # The new input is written on the side stream behind a long sleep. An op that launched on
    # another stream than the current one would read the old input and give the old result.
    w, b = _params()
    x = torch.zeros(1000, 40, device="cuda")
    new_x = torch.randn(1000, 40, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # about 25 ms at 2 GHz
        x.copy_(new_x)
        out = all_ops(x, w, b)
        grad_out = torch.ones_like(out)
        y = customops.fused_linear_sigmoid(x, w, b)
        grads = torch.ops.customops.fused_linear_sigmoid_backward(grad_out, x, w, y, [True, True, True])
        sig_grad = torch.ops.customops.sigmoid_backward(grad_out, y)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out.double(), reference(new_x, w, b), **TOL[torch.float32])
    ref_y = torch.sigmoid(F.linear(new_x, w, b))
    dz = ref_y * (1 - ref_y)
    torch.testing.assert_close(grads[0], dz @ w, **TOL[torch.float32])
    torch.testing.assert_close(grads[1], dz.T @ new_x, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(grads[2], dz.sum(0), atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(sig_grad, dz)


def test_autograd_on_a_side_stream():
    w, b = _params(requires_grad=True)
    x = torch.randn(64, 40, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = all_ops(x, w, b)
        grads = torch.autograd.grad(out.sum(), (x, w, b))
    torch.cuda.current_stream().wait_stream(side)
    ref = reference(x, w, b)
    ref_grads = torch.autograd.grad(ref.sum(), (x, w, b))
    torch.testing.assert_close(out.double(), ref, **TOL[torch.float32])
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, atol=1e-4, rtol=1e-4)


# --- CUDA graphs ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replay_with_new_inputs(dtype):
    w, b = _params(dtype)
    static_x = torch.randn(77, 40, device="cuda", dtype=dtype)
    side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph's docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            all_ops(static_x, w, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = all_ops(static_x, w, b)
        static_sig_grad = torch.ops.customops.sigmoid_backward(static_out, static_out)
    for step in range(3):
        new_x = torch.randn(77, 40, device="cuda", dtype=dtype) * (step + 1)
        static_x.copy_(new_x)
        graph.replay()
        ref = reference(new_x, w, b)
        torch.testing.assert_close(static_out.double(), ref, **TOL[dtype])
        out = static_out.double()  # the kernel's input: its rounding is not the kernel's error
        torch.testing.assert_close(static_sig_grad.double(), out * out * (1 - out), **TOL[dtype])


def test_cuda_graph_captures_forward_and_backward():
    # Whole-network capture as in the CUDA graphs section of the CUDA semantics notes.
    torch.manual_seed(0)
    model = torch.nn.Sequential(customops.nn.FusedLinearSigmoid(40, 32), customops.nn.FusedLinearSigmoid(32, 8)).cuda()
    static_x = torch.randn(50, 40, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(static_x).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = model(static_x).sum()
        static_loss.backward()
    ref_model = torch.nn.Sequential(torch.nn.Linear(40, 32), torch.nn.Sigmoid(), torch.nn.Linear(32, 8), torch.nn.Sigmoid())
    ref_model = ref_model.cuda().double()
    with torch.no_grad():
        for i, j in ((0, 0), (1, 2)):
            ref_model[j].weight.copy_(model[i].weight)
            ref_model[j].bias.copy_(model[i].bias)
    for _ in range(3):
        new_x = torch.randn(50, 40, device="cuda")
        static_x.copy_(new_x)
        graph.replay()
        ref_model.zero_grad(set_to_none=True)
        ref_loss = ref_model(new_x.double()).sum()
        ref_loss.backward()
        torch.testing.assert_close(static_loss.double(), ref_loss, atol=1e-3, rtol=1e-5)
        for p, rp in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p.grad.double(), rp.grad, atol=1e-4, rtol=1e-4)


def test_compile_reduce_overhead_over_several_steps():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    w, b = _params()
    compiled = torch.compile(all_ops, mode="reduce-overhead", fullgraph=True)
    for step in range(5):
        x = torch.randn(64, 40, device="cuda") * (step + 1)
        out = compiled(x, w, b)
        torch.testing.assert_close(out.double(), reference(x, w, b), **TOL[torch.float32])
        out = out.clone()  # the graph's output buffer is reused by the next replay
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    torch._dynamo.reset()


# --- failed launches -----------------------------------------------------------------------

LAUNCH_FAILURES = {
    "add_kernel": "customops.add(x, x)",
    "sigmoid_kernel": "customops.sigmoid(x)",
    "sigmoid_backward_kernel": "torch.ops.customops.sigmoid_backward(x, x)",
    "sigmoid_backward_colsum_kernel": (
        "xr, br = x.clone().requires_grad_(), b.clone().requires_grad_(); "
        "torch.autograd.grad(customops.fused_linear_sigmoid(xr, w, br).sum(), (xr, br))"
    ),
}
if HAS_CUDA and torch.cuda.get_device_capability() == (9, 0):
    LAUNCH_FAILURES["fused_linear_sigmoid_small_m_kernel"] = (
        "customops.fused_linear_sigmoid(x[:4].bfloat16(), w.bfloat16(), b.bfloat16())"
    )


@pytest.mark.parametrize("kernel", sorted(LAUNCH_FAILURES))
def test_failed_launch_is_a_runtime_error_naming_the_kernel(kernel):
    after, after_ref = ("customops.sigmoid(x)", "torch.sigmoid(x)") if kernel == "add_kernel" else ("customops.add(x, x)", "x + x")
    # CUSTOMOPS_TEST_FAIL_LAUNCH gives the named kernel an invalid block size (cuda_utils.cuh).
    script = textwrap.dedent(
        f"""
        import torch, customops
        x = torch.randn(64, 64, device="cuda")
        w, b = torch.randn(64, 64, device="cuda"), torch.randn(64, device="cuda")
        try:
            {LAUNCH_FAILURES[kernel]}
            torch.cuda.synchronize()
        except RuntimeError as e:
            print("RAISED:", e)
        else:
            print("NO ERROR")
        # The error is not sticky: the other kernels keep working.
        print("AFTER:", torch.allclose({after}, {after_ref}))
        """
    )
    env = dict(os.environ, CUSTOMOPS_TEST_FAIL_LAUNCH=kernel, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # CUDA names the bad block size "invalid argument" or "invalid configuration argument".
    assert f"RAISED: customops: CUDA kernel {kernel} failed to launch: invalid" in proc.stdout, proc.stdout
    assert "AFTER: True" in proc.stdout, proc.stdout


# --- tensors past 2^31 elements ------------------------------------------------------------

BIG = 2**31 + 2**10 + 3  # past the int32 range, with an odd tail for the vectorized loop
needs_big_gpu = pytest.mark.skipif(
    not HAS_CUDA or torch.cuda.get_device_properties(0).total_memory < 60 * 2**30,
    reason="needs a GPU with 60 GiB for tensors past 2^31 elements",
)


def _max_abs_diff(a, b, chunk=2**28):
    a, b = a.reshape(-1), b.reshape(-1)
    return max(
        (a[i : i + chunk].float() - b[i : i + chunk].float()).abs().max().item() for i in range(0, a.numel(), chunk)
    )


@pytest.fixture
def free_cuda_memory():
    yield
    torch.cuda.empty_cache()


@needs_big_gpu
def test_elementwise_past_2_pow_31_elements(free_cuda_memory):
    a = torch.randn(BIG, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(BIG, device="cuda", dtype=torch.bfloat16)
    out = customops.add(a, b)
    assert out.numel() == BIG
    # ATen's bf16 add also computes in float and rounds once: the results are equal.
    assert torch.equal(out[-4096:], a[-4096:] + b[-4096:])
    assert _max_abs_diff(out, torch.add(a, b)) == 0
    del out, b
    out = customops.sigmoid(a)
    assert _max_abs_diff(out[-4096:], torch.sigmoid(a[-4096:].double())) <= 4e-3
    assert _max_abs_diff(out, torch.sigmoid(a)) <= 4e-3  # one bf16 ulp near 0.5
    grad = torch.ops.customops.sigmoid_backward(out, out)
    y = out[-4096:].double()
    assert _max_abs_diff(grad[-4096:], y * y * (1 - y)) <= 4e-3


@needs_big_gpu
def test_fused_linear_sigmoid_with_output_past_2_pow_31_elements(free_cuda_memory):
    out_features, in_features = 1024, 8
    rows = BIG // out_features + 1
    x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) / 2
    b = torch.randn(out_features, device="cuda", dtype=torch.bfloat16)
    y = customops.fused_linear_sigmoid(x, w, b)
    assert y.numel() > 2**31
    tail = slice(rows - 8, rows)
    ref_tail = torch.sigmoid(F.linear(x[tail].double(), w.double(), b.double()))
    assert _max_abs_diff(y[tail], ref_tail) <= 1.6e-2
    assert _max_abs_diff(y, torch.sigmoid(F.linear(x, w, b))) <= 1.6e-2
    grad_out = torch.ones_like(y)
    grad_x, grad_w, grad_b = torch.ops.customops.fused_linear_sigmoid_backward(grad_out, x, w, y, [True, True, True])
    dz_tail = y[tail].double() * (1 - y[tail].double())
    assert _max_abs_diff(grad_x[tail], dz_tail @ w.double()) <= 3e-2
    # grad_w and grad_b sum over 2^21 rows with cancellation: compare by norm (an indexing
    # fault would give an O(1) relative error).
    dz = y.float() * (1 - y.float())
    for got, ref in ((grad_b, dz.sum(0)), (grad_w, dz.T @ x.float())):
        assert (got.float() - ref).norm() / ref.norm() <= 1e-2
