"""What is particular to customops.sigmoid_focal_loss, beyond its spec's paths in
test_conformance (customops/testing/op_specs.py): torchvision's semantics and defaults over
wider inputs, logits of +-100 and +-1e4, the stable composite, determinism of the reductions,
each requires_grad combination, what is saved for backward, float arguments under
torch.compile and torch.export, the ONNX graph, CUDA against CPU, and sizes past 2^31. The
`device` fixture adds CUDA wherever a GPU is visible."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import customops
from conftest import DTYPES, HAS_CUDA, TOL, assert_close_ref
from customops.testing.op_specs import sigmoid_focal_loss_reference

op = torch.ops.customops.sigmoid_focal_loss
op_bw = torch.ops.customops.sigmoid_focal_loss_backward

REDUCTIONS = ["none", "mean", "sum"]
ALL_DTYPES = DTYPES + [torch.float64]
# (alpha, gamma): the defaults, no weighting (alpha = -1), plain weighted BCE (gamma = 0),
# gamma = 1 and a fractional gamma below and above 1.
ALPHA_GAMMA = [(0.25, 2.0), (-1.0, 2.0), (0.25, 0.0), (0.5, 1.0), (0.75, 0.5), (0.25, 3.5)]


# torchvision's composite, the reference the op must match (one copy, in the op's spec).
torchvision_sigmoid_focal_loss = sigmoid_focal_loss_reference


def stable_composite(inputs, targets, alpha, gamma, reduction):
    """The same loss with 1 - p_t formed as sigmoid(x)(1 - t) + sigmoid(-x) t (no
    cancellation): its float64 autograd stays finite where torchvision's gives NaN (0 < gamma
    < 1 and a saturated correct prediction) as long as sigmoid(-|x|) does not underflow."""
    ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    m = torch.sigmoid(inputs) * (1 - targets) + torch.sigmoid(-inputs) * targets
    loss = ce_loss * m**gamma
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return {"none": loss, "mean": loss.mean(), "sum": loss.sum()}[reduction]


def reference(x, t, alpha, gamma, reduction, grad_out=None, fn=torchvision_sigmoid_focal_loss):
    """(loss, grad_inputs, grad_targets) in float64 through autograd."""
    xd = x.detach().double().requires_grad_()
    td = t.detach().double().requires_grad_()
    loss = fn(xd, td, alpha, gamma, reduction)
    g = torch.ones_like(loss) if grad_out is None else grad_out.double()
    gx, gt = torch.autograd.grad(loss, (xd, td), g)
    return loss.detach(), gx, gt


def make_pair(layout, device, dtype):
    """(logits, targets) of one shape in the named layout; targets half hard 0/1 labels, half
    soft values in [0, 1]."""
    t = dict(device=device, dtype=torch.float32)

    def targets(shape):
        hard = torch.rand(shape, **t) < 0.5
        return torch.where(torch.rand(shape, **t) < 0.5, hard.float(), torch.rand(shape, **t))

    if layout == "contiguous":  # 129 * 37 elements: the vector loop and an odd tail
        x, y = torch.randn(129, 37, **t) * 3, targets((129, 37))
    elif layout == "transposed":
        x, y = torch.randn(37, 50, **t).t() * 3, targets((37, 50)).t()
    elif layout == "sliced":
        x, y = torch.randn(40, 60, **t)[::3, 5:50] * 3, targets((42, 60))[1::3, 2:47]
    elif layout == "channels_last":
        x = (torch.randn(2, 5, 7, 9, **t) * 3).to(memory_format=torch.channels_last)
        y = targets((2, 5, 7, 9)).to(memory_format=torch.channels_last)
    elif layout == "0d":
        x, y = torch.randn((), **t) * 3, targets(())
    elif layout == "empty":
        x, y = torch.randn(0, 5, **t), targets((0, 5))
    elif layout == "odd_offset":  # storage offset 1: not 16-byte aligned
        x, y = torch.randn(4099, **t)[1:] * 3, targets((4099,))[1:]
    else:
        raise ValueError(layout)
    return x.to(dtype), y.to(dtype)


LAYOUTS = ["contiguous", "transposed", "sliced", "channels_last", "0d", "empty", "odd_offset"]


def grads_tol(dtype):
    # Gradients: one rounding of a float32 result, like the loss; float32 itself: a few ulps
    # of terms up to |x| times larger than the result.
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]


# --- values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_forward_and_backward_match_reference(device, dtype, layout, reduction):
    x, t = make_pair(layout, device, dtype)
    x_before, t_before = x.clone(), t.clone()
    x.requires_grad_()
    t.requires_grad_()
    out = customops.sigmoid_focal_loss(x, t, reduction=reduction)
    grad_out = torch.randn(out.shape, device=device, dtype=dtype)
    if reduction == "none" and layout in ("transposed", "sliced"):
        grad_out = make_pair(layout, device, dtype)[0]  # a strided grad_out
    ref, ref_gx, ref_gt = reference(x, t, 0.25, 2.0, reduction, grad_out)
    assert out.dtype == dtype and out.device == x.device
    assert out.shape == (x.shape if reduction == "none" else ())
    assert out.is_contiguous()
    if reduction == "mean" and x.numel() == 0:
        assert torch.isnan(out) and torch.isnan(ref)  # as torch.mean / torchvision give
    else:
        assert_close_ref(out, ref, dtype)
    gx, gt = torch.autograd.grad(out, (x, t), grad_out)
    assert gx.shape == x.shape and gt.shape == t.shape and gx.dtype == dtype
    torch.testing.assert_close(gx.double(), ref_gx, **grads_tol(dtype))
    torch.testing.assert_close(gt.double(), ref_gt, **grads_tol(dtype))
    assert torch.equal(x.detach(), x_before) and torch.equal(t.detach(), t_before)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("alpha,gamma", ALPHA_GAMMA)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_alpha_and_gamma_match_reference(device, dtype, alpha, gamma, reduction):
    x, t = make_pair("contiguous", device, dtype)
    x.requires_grad_()
    t.requires_grad_()
    out = customops.sigmoid_focal_loss(x, t, alpha, gamma, reduction)
    grad_out = torch.randn(out.shape, device=device, dtype=dtype)
    ref, ref_gx, ref_gt = reference(x, t, alpha, gamma, reduction, grad_out)
    assert_close_ref(out, ref, dtype)
    gx, gt = torch.autograd.grad(out, (x, t), grad_out)
    torch.testing.assert_close(gx.double(), ref_gx, **grads_tol(dtype))
    torch.testing.assert_close(gt.double(), ref_gt, **grads_tol(dtype))


def test_defaults_are_torchvisions(device):
    x, t = make_pair("contiguous", device, torch.float64)
    torch.testing.assert_close(customops.sigmoid_focal_loss(x, t), torchvision_sigmoid_focal_loss(x, t))
    torch.testing.assert_close(op(x, t), torchvision_sigmoid_focal_loss(x, t))
    torch.testing.assert_close(op(x, t, reduction="sum"), torchvision_sigmoid_focal_loss(x, t, reduction="sum"))
    # alpha < 0 (any negative value) means no weighting.
    torch.testing.assert_close(op(x, t, -0.5, 2.0), torchvision_sigmoid_focal_loss(x, t, -1, 2))


LARGE = [-1e4, -100.0, -20.0, -5.0, 0.0, 5.0, 20.0, 100.0, 1e4]
LARGE_TARGETS = [0.0, 1.0, 0.3, 0.999]


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 3.5])
@pytest.mark.parametrize("alpha", [0.25, -1.0])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_large_logits_give_finite_loss_and_grads(device, dtype, alpha, gamma):
    x = torch.tensor(LARGE, device=device).repeat_interleave(len(LARGE_TARGETS)).to(dtype)
    t = torch.tensor(LARGE_TARGETS, device=device).repeat(len(LARGE)).to(dtype)
    for reduction in REDUCTIONS:
        xr, tr = x.clone().requires_grad_(), t.clone().requires_grad_()
        out = customops.sigmoid_focal_loss(xr, tr, alpha, gamma, reduction)
        gx, gt = torch.autograd.grad(out, (xr, tr), torch.ones_like(out))
        assert torch.isfinite(out).all() and torch.isfinite(gx).all() and torch.isfinite(gt).all()
        ref, ref_gx, ref_gt = reference(x, t, alpha, gamma, reduction)
        assert torch.isfinite(ref).all()  # torchvision's loss is finite here too
        assert_close_ref(out, ref, dtype)
        # torchvision's gradients are NaN exactly where 0 < gamma < 1 meets a saturated
        # correct prediction (1 - p_t == 0: it forms 0 ** (gamma - 1)); elsewhere we match them.
        nan = torch.isnan(ref_gx) | torch.isnan(ref_gt)
        assert nan.any() == (0 < gamma < 1), nan
        # There: the stable composite's float64 gradients where they are finite (|x| = 100),
        # and the limit of the true derivative, 0, where even float64 saturates (|x| = 1e4).
        _, st_gx, st_gt = reference(x, t, alpha, gamma, reduction, fn=stable_composite)
        want_gx = torch.where(torch.isnan(ref_gx), torch.nan_to_num(st_gx, nan=0.0), ref_gx)
        want_gt = torch.where(torch.isnan(ref_gt), torch.nan_to_num(st_gt, nan=0.0), ref_gt)
        # (float32: dL/dt at |x| = 1e4 is a difference of terms ~|x|, a few of their ulps.)
        torch.testing.assert_close(gx.double(), want_gx, **grads_tol(dtype))
        torch.testing.assert_close(gt.double(), want_gt, **grads_tol(dtype))


def test_stable_composite_agrees_with_torchvision_where_both_are_finite():
    # The check on the check: the second reference is the same function.
    x = torch.tensor(LARGE, dtype=torch.float64).repeat_interleave(4)
    t = torch.tensor(LARGE_TARGETS, dtype=torch.float64).repeat(len(LARGE))
    for gamma in (0.0, 0.5, 2.0):
        a, agx, agt = reference(x, t, 0.25, gamma, "none")
        b, bgx, bgt = reference(x, t, 0.25, gamma, "none", fn=stable_composite)
        torch.testing.assert_close(a, b)
        for u, v in ((agx, bgx), (agt, bgt)):
            both = torch.isfinite(u) & torch.isfinite(v)
            torch.testing.assert_close(u[both], v[both], atol=1e-10, rtol=1e-6)  # 1 - p_t cancels


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_empty_input(device, dtype):
    x = torch.randn(0, 3, device=device, dtype=dtype, requires_grad=True)
    t = torch.rand(0, 3, device=device, dtype=dtype, requires_grad=True)
    none = customops.sigmoid_focal_loss(x, t)
    mean = customops.sigmoid_focal_loss(x, t, reduction="mean")
    total = customops.sigmoid_focal_loss(x, t, reduction="sum")
    assert none.shape == (0, 3)
    assert mean.shape == () and torch.isnan(mean)  # torch.mean of no elements
    assert total.shape == () and total.item() == 0
    # torchvision's composite gives the same.
    assert torch.isnan(torchvision_sigmoid_focal_loss(x, t, reduction="mean"))
    gx, gt = torch.autograd.grad(total + none.sum() + mean.nan_to_num(), (x, t))
    assert gx.shape == (0, 3) and gt.shape == (0, 3)


def test_sum_of_many_elements_and_determinism(device):
    # 3 * 2^20 + 5 elements: many CUDA blocks / CPU chunks; the sum is bitwise reproducible.
    x = torch.randn(3 * 2**20 + 5, device=device) * 4
    t = (torch.rand_like(x) < 0.1).float()
    ref = torchvision_sigmoid_focal_loss(x.double(), t.double(), reduction="sum")
    out = op(x, t, reduction="sum")
    torch.testing.assert_close(out.double(), ref, atol=0, rtol=1e-5)
    assert all(torch.equal(op(x, t, reduction="sum"), out) for _ in range(3))
    mean = op(x, t, reduction="mean")
    torch.testing.assert_close(mean.double(), ref / x.numel(), atol=0, rtol=1e-5)
    # The same on a misaligned view (the scalar loop).
    torch.testing.assert_close(
        op(x[1:], t[1:], reduction="sum").double(),
        ref - torchvision_sigmoid_focal_loss(x[:1].double(), t[:1].double(), reduction="sum"),
        atol=0,
        rtol=1e-5,
    )


# --- autograd -------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("requires_grad", [(True, False), (False, True), (False, False)])
def test_grads_for_every_requires_grad_combination(device, reduction, requires_grad):
    x, t = make_pair("contiguous", device, torch.float64)
    x.requires_grad_(requires_grad[0])
    t.requires_grad_(requires_grad[1])
    out = op(x, t, 0.25, 2.0, reduction)
    if not any(requires_grad):
        assert not out.requires_grad
        return
    out.backward(torch.ones_like(out))
    _, ref_gx, ref_gt = reference(x, t, 0.25, 2.0, reduction)
    for tensor, rg, ref in zip((x, t), requires_grad, (ref_gx, ref_gt)):
        if rg:
            torch.testing.assert_close(tensor.grad, ref)
        else:
            assert tensor.grad is None


def test_double_backward_raises_clearly(device):
    x = torch.randn(3, 4, device=device, dtype=torch.float64, requires_grad=True)
    t = torch.rand(3, 4, device=device, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(op(x, t, reduction="sum"), (x,), create_graph=True)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        gx.sum().backward()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.gradgradcheck(lambda x, t: op(x, t), (x, t))


def test_backward_op_masks_and_scalar_grad_out(device):
    x, t = make_pair("contiguous", device, torch.float32)
    _, ref_gx, ref_gt = reference(x, t, 0.25, 2.0, "sum")
    one = torch.ones((), device=device)
    gx, gt = op_bw(one, x, t, 0.25, 2.0, "sum", [True, False])
    assert gt.numel() == 0
    torch.testing.assert_close(gx.double(), ref_gx, **grads_tol(torch.float32))
    gx, gt = op_bw(one, x, t, 0.25, 2.0, "sum", [False, True])
    assert gx.numel() == 0
    torch.testing.assert_close(gt.double(), ref_gt, **grads_tol(torch.float32))
    gx, gt = op_bw(one, x, t, 0.25, 2.0, "sum", [False, False])
    assert gx.numel() == 0 and gt.numel() == 0
    # "mean": the scalar gradient divided by numel.
    gx, _ = op_bw(one * 3, x, t, 0.25, 2.0, "mean", [True, False])
    torch.testing.assert_close(gx.double(), ref_gx * 3 / x.numel(), **grads_tol(torch.float32))
    # "none" with an expanded scalar (what loss.sum().backward() passes: strides 0), a
    # partly broadcast grad_out, and a full one agree.
    gx_exp, _ = op_bw((one * 2).expand(x.shape), x, t, 0.25, 2.0, "none", [True, False])
    torch.testing.assert_close(gx_exp.double(), ref_gx * 2, **grads_tol(torch.float32))
    row = torch.randn(1, x.shape[1], device=device)
    gx_row, _ = op_bw(row.expand(x.shape), x, t, 0.25, 2.0, "none", [True, False])
    torch.testing.assert_close(gx_row.double(), ref_gx * row.double(), **grads_tol(torch.float32))
    assert not gx_row._is_view() and gx_row.is_contiguous()


def test_saves_only_inputs_and_targets(device):
    x, t = make_pair("contiguous", device, torch.float32)
    x.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s) or s, lambda s: s):
        loss = op(x, t, reduction="sum")
    assert len(saved) == 2
    assert {s.data_ptr() for s in saved} == {x.data_ptr(), t.data_ptr()}
    loss.backward()


def test_library_alone_has_autograd():
    # A C++ program or a bare torch.ops.load_library: the autograd kernels are C++.
    code = (
        "import torch\n"
        f"torch.ops.load_library({customops.library_path()!r})\n"
        "import sys; assert 'customops' not in sys.modules\n"
        "x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)\n"
        "t = torch.rand(3, 5, dtype=torch.float64, requires_grad=True)\n"
        "op = torch.ops.customops.sigmoid_focal_loss\n"
        "assert torch.autograd.gradcheck(lambda x, t: op(x, t, 0.25, 2.0, 'mean'), (x, t))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# --- torch.compile, torch.export, TorchScript, ONNX -----------------------------------------


@pytest.fixture
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def focal_step(x, t):
    # Every reduction and non-default arguments in one graph.
    return (
        customops.sigmoid_focal_loss(x, t, reduction="sum")
        + customops.sigmoid_focal_loss(x, t, 0.5, 1.5, "mean")
        + customops.sigmoid_focal_loss(x, t, -1.0, 0.0).sum()
    )


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_dynamic_forward_and_backward(device, backend, _reset_dynamo):
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(focal_step, backend=counter, fullgraph=True, dynamic=True)
    frames_after_first = None
    for rows in (3, 7, 30):
        x = torch.randn(rows, 11, device=device, requires_grad=True)
        t = torch.rand(rows, 11, device=device, requires_grad=True)
        out = compiled(x, t)
        grads = torch.autograd.grad(out, (x, t))
        ref = focal_step(x, t)
        ref_grads = torch.autograd.grad(ref, (x, t))
        torch.testing.assert_close(out, ref)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r)
        frames_after_first = frames_after_first or counter.frame_count
    # No recompiles for new sizes. (The first compile may call the backend twice: Dynamo
    # traces the wrapper's float defaults as symbolic floats, the op specializes them, and
    # Dynamo restarts the analysis once with them as constants; still one graph.)
    assert counter.frame_count == frames_after_first <= 2


def test_compile_with_alpha_gamma_as_arguments(device, _reset_dynamo):
    # Python floats passed in may be traced as symbolic floats (specialize_float=False).
    compiled = torch.compile(lambda x, t, a, g: op(x, t, a, g, "sum"), fullgraph=True, dynamic=True)
    x, t = torch.randn(8, 5, device=device), torch.rand(8, 5, device=device)
    for a, g in ((0.25, 2.0), (0.6, 0.5)):
        torch.testing.assert_close(compiled(x, t, a, g), op(x, t, a, g, "sum"))


class FocalModule(nn.Module):
    def __init__(self, alpha=0.25, gamma=2.0, reduction="none"):
        super().__init__()
        self.alpha, self.gamma, self.reduction = alpha, gamma, reduction

    def forward(self, x, t):
        return customops.sigmoid_focal_loss(x, t, self.alpha, self.gamma, self.reduction)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_export_dynamic_batch_and_save_load(device, reduction, tmp_path):
    model = FocalModule(0.4, 1.5, reduction)
    batch = torch.export.Dim("batch", min=1, max=4096)
    x, t = torch.randn(4, 7, device=device), torch.rand(4, 7, device=device)
    ep = torch.export.export(model, (x, t), dynamic_shapes=({0: batch}, {0: batch}))
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert [str(n.target) for n in nodes] == ["customops.sigmoid_focal_loss.default"]
    # (Export leaves out arguments equal to the schema's defaults.)
    schema_args = nodes[0].target._schema.arguments
    args = list(nodes[0].args) + [a.default_value for a in schema_args[len(nodes[0].args) :]]
    assert args[2:] == [0.4, 1.5, reduction]
    path = tmp_path / "focal.pt2"
    torch.export.save(ep, str(path))
    loaded = torch.export.load(str(path))
    for rows in (1, 37):
        x, t = torch.randn(rows, 7, device=device), torch.rand(rows, 7, device=device)
        torch.testing.assert_close(ep.module()(x, t), model(x, t))
        torch.testing.assert_close(loaded.module()(x, t), model(x, t))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_onnx_graph_and_dynamic_batch_in_onnxruntime(reduction, tmp_path):
    # (Every alpha/gamma configuration of the spec runs through ONNX Runtime in
    # test_conformance; here: which ONNX ops the translation uses, and a dynamic batch.)
    alpha, gamma = 0.4, 0.5
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from customops.export import export_onnx

    model = FocalModule(alpha, gamma, reduction)
    path = export_onnx(model, (torch.randn(8, 7), torch.rand(8, 7)), str(tmp_path / "focal.onnx"))
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    domains = {node.domain for node in proto.graph.node} | {f.domain for f in proto.functions}
    assert domains <= {"", "ai.onnx"}, domains
    op_types = {node.op_type for node in proto.graph.node}
    assert {"Exp", "Log", "Mul"} <= op_types
    assert ({"sum": "ReduceSum", "mean": "ReduceMean"}.get(reduction) in op_types) or reduction == "none"
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for rows in (1, 37):
        x = torch.randn(rows, 7) * 4
        x[0, :4] = torch.tensor([100.0, -100.0, 1e4, -1e4])  # stable for large logits too
        t = (torch.rand(rows, 7) < 0.5).float()
        out = session.run(None, dict(zip(names, (x.numpy(), t.numpy()))))[0]
        ref = torchvision_sigmoid_focal_loss(x.double(), t.double(), alpha, gamma, reduction)
        torch.testing.assert_close(torch.from_numpy(out).double(), ref, rtol=1e-5, atol=1e-5)


def test_onnx_float16_computes_in_float32(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from customops.export import export_onnx

    model = FocalModule(0.25, 2.0, "none")
    x, t = (torch.randn(8, 7) * 4).half(), torch.rand(8, 7).half()
    path = export_onnx(model, (x, t), str(tmp_path / "focal16.onnx"))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    out = session.run(None, dict(zip(names, (x.numpy(), t.numpy()))))[0]
    assert out.dtype.name == "float16"
    assert_close_ref(torch.from_numpy(out), torchvision_sigmoid_focal_loss(x.double(), t.double()), torch.float16)


# --- CUDA runtime ---------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu(dtype):
    # The same formulas on both backends: elementwise results agree to rounding.
    x, t = make_pair("contiguous", "cuda", dtype)
    for reduction in REDUCTIONS:
        torch.testing.assert_close(
            op(x, t, 0.25, 2.0, reduction).cpu(), op(x.cpu(), t.cpu(), 0.25, 2.0, reduction), **TOL[dtype]
        )
        g = torch.ones((), device="cuda", dtype=dtype) if reduction != "none" else torch.ones_like(x)
        for a, b in zip(
            op_bw(g, x, t, 0.25, 2.0, reduction, [True, True]),
            op_bw(g.cpu(), x.cpu(), t.cpu(), 0.25, 2.0, reduction, [True, True]),
        ):
            torch.testing.assert_close(a.cpu(), b, **grads_tol(dtype))


BIG = 2**31 + 2**10 + 3
needs_big_gpu = pytest.mark.skipif(
    not HAS_CUDA or torch.cuda.get_device_properties(0).total_memory < 60 * 2**30,
    reason="needs a GPU with 60 GiB for tensors past 2^31 elements",
)


@needs_big_gpu
def test_cuda_past_2_pow_31_elements():
    x = torch.randn(BIG, device="cuda", dtype=torch.bfloat16)
    t = (torch.rand(BIG, device="cuda") < 0.5).to(torch.bfloat16)
    chunk = 2**28
    ref = sum(
        torchvision_sigmoid_focal_loss(x[i : i + chunk].float(), t[i : i + chunk].float(), reduction="sum").double()
        for i in range(0, BIG, chunk)
    )
    total = op(x, t, 0.25, 2.0, "sum")
    assert abs(total.double().item() - ref.item()) <= 1e-2 * abs(ref.item())
    gx, _ = op_bw(torch.ones((), device="cuda", dtype=torch.bfloat16), x, t, 0.25, 2.0, "sum", [True, False])
    tail = slice(BIG - 4096, BIG)
    _, ref_tail, _ = reference(x[tail], t[tail], 0.25, 2.0, "sum")
    torch.testing.assert_close(gx[tail].double(), ref_tail, **TOL[torch.bfloat16])
    del gx
    out = op(x, t)
    torch.testing.assert_close(
        out[tail].double(), torchvision_sigmoid_focal_loss(x[tail].double(), t[tail].double()), **TOL[torch.bfloat16]
    )
    del out
    torch.cuda.empty_cache()
