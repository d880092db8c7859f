"""torch.compile: fullgraph, no graph breaks, one graph over batch sizes 2..40, forward and backward."""

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import customops
from customops.nn import FusedLinearSigmoid
from customops.testing import OP_SPECS


def make_model(device):
    torch.manual_seed(0)
    return nn.Sequential(FusedLinearSigmoid(12, 16), FusedLinearSigmoid(16, 8, bias=False), nn.Linear(8, 3)).to(device)


def several_ops(x, w, b):
    # Several ops in one graph (each op's own compile path: test_conformance).
    y = customops.fused_linear_sigmoid(x, w, b)
    s = customops.sigmoid(y)
    return customops.add(s, y) + customops.sigmoid_focal_loss(y, s, reduction="sum")


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
    explanation = torch._dynamo.explain(several_ops)(torch.randn(4, 6, device=device), w, b)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1
    assert "customops.fused_linear_sigmoid" in str(explanation.graphs[0].graph)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inductor_matches_eager_forward_and_backward(device, dtype):
    x = torch.randn(9, 6, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(5, 6, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(5, device=device, dtype=dtype, requires_grad=True)
    compiled = torch.compile(several_ops, fullgraph=True, dynamic=True)
    out = compiled(x, w, b)
    grads = torch.autograd.grad(out.sum(), (x, w, b))
    ref = several_ops(x, w, b)
    ref_grads = torch.autograd.grad(ref.sum(), (x, w, b))
    torch.testing.assert_close(out, ref)
    # Inductor keeps the graph's own ops (the +, the sum's backward, the gradient accumulation of
    # y's three uses) in float32 where eager rounds each to bfloat16, so a gradient element that
    # cancels can differ by a few bfloat16 ulps; tolerances are relative to each gradient's scale.
    for g, rg in zip(grads, ref_grads):
        if dtype == torch.float32:
            torch.testing.assert_close(g, rg)
        else:
            torch.testing.assert_close(g, rg, rtol=1.6e-2, atol=1.6e-2 * rg.abs().max().item())


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


def test_no_schema_has_mutation_or_alias_annotations():
    # Every registered op (dir(torch.ops.customops) lists only those already looked up).
    names = [n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("customops::")]
    schemas = [
        getattr(getattr(torch.ops.customops, n), o)._schema
        for n in names
        for o in getattr(torch.ops.customops, n).overloads()
    ]
    assert {s.name for s in schemas} >= {f"customops::{spec.name}" for spec in OP_SPECS}
    for schema in schemas:
        assert not schema.is_mutable, str(schema)
        for arg in list(schema.arguments) + list(schema.returns):
            assert arg.alias_info is None, str(schema)


@pytest.mark.parametrize("spec", OP_SPECS, ids=lambda s: s.name)
def test_compiled_graphs_keep_the_op_without_functionalization(spec, device):
    from functorch.compile import aot_function, make_boxed_func

    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    sample = spec.samples(device, torch.float32, requires_grad="autograd" not in spec.unsupported)[0]
    tensors = sample.tensors()

    def call(*ts):
        s = sample.with_tensors(ts)
        return spec.op(*s.args, **s.kwargs)

    out = aot_function(call, fw_compiler=keep, bw_compiler=keep)(*tensors)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.requires_grad and o.numel()]
    if outs:
        sum(o.sum() for o in outs).backward()
    targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert f"customops.{spec.name}.default" in targets, targets
    assert not [t for t in targets if "auto_functionalized" in t], targets


@pytest.mark.parametrize("comprehensive_padding", [False, True])
def test_input_from_a_matmul_inductor_may_pad(device, comprehensive_padding):
    # Odd sizes: Inductor may give the matmul's output padded strides; the op must see the
    # values, whatever layout reaches it.
    def model(a, c, w, b):
        return customops.fused_linear_sigmoid((a @ c).contiguous(), w, b)

    a = torch.randn(33, 17, device=device, requires_grad=True)
    c = torch.randn(17, 31, device=device, requires_grad=True)
    w = torch.randn(13, 31, device=device, requires_grad=True)
    b = torch.randn(13, device=device, requires_grad=True)
    with torch._inductor.config.patch(comprehensive_padding=comprehensive_padding, pad_outputs=comprehensive_padding):
        compiled = torch.compile(model, fullgraph=True)
        out = compiled(a, c, w, b)
        grads = torch.autograd.grad(out.sum(), (a, c, w, b))
    ref = model(a, c, w, b)
    ref_grads = torch.autograd.grad(ref.sum(), (a, c, w, b))
    torch.testing.assert_close(out, ref)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg)
