"""CUDA runtime behaviour beyond one op call, which the specs' paths cover for every op
(test_conformance: cuda_stream, cuda_graph, cuda_launch): a whole network's forward and
backward captured in one CUDA graph, and tensors past 2^31 elements. Needs a CUDA GPU (skips,
with the reason, on CPU-only machines)."""

import pytest
import torch
import torch.nn.functional as F

import customops
from conftest import HAS_CUDA

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


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
    ref_model = torch.nn.Sequential(
        torch.nn.Linear(40, 32), torch.nn.Sigmoid(), torch.nn.Linear(32, 8), torch.nn.Sigmoid()
    )
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
