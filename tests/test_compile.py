"""torch.compile: fullgraph, no graph breaks, one graph over batch sizes 2..40, forward and backward."""

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import customops
from customops.nn import FusedLinearSigmoid


def make_model(device):
    torch.manual_seed(0)
    return nn.Sequential(FusedLinearSigmoid(12, 16), FusedLinearSigmoid(16, 8, bias=False), nn.Linear(8, 3)).to(device)


def uses_all_ops(x, w, b):
    y = customops.fused_linear_sigmoid(x, w, b)
    return customops.add(customops.sigmoid(y), y)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_one_graph_for_batch_sizes_2_to_40_without_recompiles(device):
    model = make_model(device)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for batch in range(2, 41):
        x = torch.randn(batch, 12, device=device)
        torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


def test_no_graph_breaks(device):
    w, b = torch.randn(5, 6, device=device), torch.randn(5, device=device)
    explanation = torch._dynamo.explain(uses_all_ops)(torch.randn(4, 6, device=device), w, b)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1
    assert "customops.fused_linear_sigmoid" in str(explanation.graphs[0].graph)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inductor_matches_eager_forward_and_backward(device, dtype):
    x = torch.randn(9, 6, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(5, 6, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(5, device=device, dtype=dtype, requires_grad=True)
    compiled = torch.compile(uses_all_ops, fullgraph=True, dynamic=True)
    out = compiled(x, w, b)
    grads = torch.autograd.grad(out.sum(), (x, w, b))
    ref = uses_all_ops(x, w, b)
    ref_grads = torch.autograd.grad(ref.sum(), (x, w, b))
    torch.testing.assert_close(out, ref)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg)


def test_compiled_training_step_matches_eager(device):
    model = make_model(device)
    ref_model = make_model(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    x, target = torch.randn(17, 12, device=device), torch.randint(0, 3, (17,), device=device)
    for m in (compiled, ref_model):
        nn.functional.cross_entropy(m(x), target).backward()
    for p, rp in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, rp.grad)


def test_export_keeps_the_custom_op(device):
    model = make_model(device)
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(model, (torch.randn(4, 12, device=device),), dynamic_shapes=({0: batch},))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "customops.fused_linear_sigmoid.default" in targets
    x = torch.randn(37, 12, device=device)
    torch.testing.assert_close(ep.module()(x), model(x))
