"""customops.sigmoid_focal_loss against a float64 reference written as torchvision's composite:
every reduction, several alpha/gamma, every dtype and layout, numel 0, logits of +-100 and
+-1e4, autograd w.r.t. inputs and targets, opcheck, gradcheck, torch.compile, torch.export,
AOTInductor, TorchScript, ONNX Runtime, and the CUDA runtime rules (current stream, CUDA graphs, failed
launches, sizes past 2^31). The `device` fixture adds CUDA wherever a GPU is visible."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import customops
from conftest import DTYPES, HAS_CUDA, TOL, assert_close_ref
from customops.testing.op_specs import sigmoid_focal_loss_reference

op = torch.ops.customops.sigmoid_focal_loss
op_bw = torch.ops.customops.sigmoid_focal_loss_backward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    torch.testing.assert_close(op(x[1:], t[1:], reduction="sum").double(), ref - torchvision_sigmoid_focal_loss(
        x[:1].double(), t[:1].double(), reduction="sum"), atol=0, rtol=1e-5)


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


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("alpha,gamma", ALPHA_GAMMA)
def test_gradcheck(device, alpha, gamma, reduction):
    x = (torch.randn(4, 6, device=device, dtype=torch.float64) * 2).requires_grad_()
    t = (torch.rand(4, 6, device=device, dtype=torch.float64) * 0.8 + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, t: op(x, t, alpha, gamma, reduction), (x, t))
    # Hard 0/1 targets, gradient w.r.t. the logits only.
    hard = (torch.rand(4, 6, device=device, dtype=torch.float64) < 0.5).double()
    assert torch.autograd.gradcheck(lambda x: op(x, hard, alpha, gamma, reduction), (x,))


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
        "assert torch.autograd.gradcheck(lambda x, t: torch.ops.customops.sigmoid_focal_loss(x, t, 0.25, 2.0, 'mean'), (x, t))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# --- opcheck and the fake kernel ------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "empty", "0d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, layout, dtype, requires_grad):
    x, t = make_pair(layout, device, dtype)
    x.requires_grad_(requires_grad)
    t.requires_grad_(requires_grad)
    # (The mean of no elements is NaN, which opcheck's comparisons count as a mismatch.)
    reductions = ["none", "sum"] if x.numel() == 0 else REDUCTIONS
    for reduction in reductions:
        torch.library.opcheck(op, (x, t, 0.25, 2.0, reduction))
    torch.library.opcheck(op, (x, t, -1.0, 0.5, reductions[-1]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mask", [[True, True], [True, False], [False, True]])
def test_opcheck_backward(device, reduction, mask):
    x, t = make_pair("contiguous", device, torch.float32)
    g = torch.randn(x.shape if reduction == "none" else (), device=device)
    torch.library.opcheck(op_bw, (g, x, t, 0.25, 2.0, reduction, mask))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "channels_last", "0d"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fake_matches_real(device, layout, reduction):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, t = make_pair(layout, device, torch.float32)
    real = op(x, t, 0.25, 2.0, reduction)
    g = torch.ones_like(real)
    real_grads = op_bw(g, x, t, 0.25, 2.0, reduction, [True, False])
    with FakeTensorMode() as mode:
        fx, ft, fg = (mode.from_tensor(a) for a in (x, t, g))
        fake = op(fx, ft, 0.25, 2.0, reduction)
        fake_grads = op_bw(fg, fx, ft, 0.25, 2.0, reduction, [True, False])
    for r, f in zip((real, *real_grads), (fake, *fake_grads)):
        assert (r.shape, r.stride(), r.dtype, r.device) == (f.shape, f.stride(), f.dtype, f.device)


# --- errors ---------------------------------------------------------------------------------


def _error_cases(device):
    f32 = dict(device=device, dtype=torch.float32)
    x, t = torch.randn(4, 5, **f32), torch.rand(4, 5, **f32)
    g0 = torch.ones((), **f32)
    return [
        # (op, args, substrings the message must hold)
        (op, (x.int(), t), ["inputs", "floating dtype", "torch.int32"]),
        (op, (x, t.long()), ["targets", "floating dtype", "torch.int64"]),
        (op, (x, t.double()), ["targets", "dtype of inputs", "torch.float32", "torch.float64"]),
        (op, (x, t[:2]), ["targets", "shape of inputs", "[4, 5]", "[2, 5]"]),
        (op, (x, t[0]), ["targets", "shape of inputs", "[4, 5]", "[5]"]),
        (op, (x, t, 0.25, 2.0, "avg"), ["reduction", "'none', 'mean' or 'sum'", "'avg'"]),
        (op, (x, t, 0.25, 2.0, "Sum"), ["reduction", "'Sum'"]),
        (op, (x, t, 0.25, -1.0, "none"), ["gamma", ">= 0", "-1.000000"]),
        (op, (x, t, 0.25, float("inf"), "sum"), ["gamma", "finite", "inf"]),
        (op_bw, (g0, x, t, 0.25, 2.0, "none", [True, True]), ["grad_out", "shape of inputs", "[]"]),
        (op_bw, (x, x, t, 0.25, 2.0, "sum", [True, True]), ["grad_out", "0-dimensional", "'sum'", "[4, 5]"]),
        (op_bw, (g0.half(), x, t, 0.25, 2.0, "mean", [True, False]), ["grad_out", "dtype of inputs", "torch.float16"]),
        (op_bw, (g0, x, t, 0.25, 2.0, "max", [True, False]), ["reduction", "'max'"]),
    ]


@pytest.mark.parametrize("case", range(len(_error_cases("cpu"))))
def test_errors_name_the_argument_and_match_fake(device, case):
    fn, args, expected = _error_cases(device)[case]
    with pytest.raises(RuntimeError) as eager:
        fn(*args)
    msg = str(eager.value).splitlines()[0]
    assert msg.startswith("customops: expected "), msg
    for part in expected:
        assert part in msg, (part, msg)
    meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(RuntimeError) as fake:
        fn(*meta_args)
    assert str(fake.value).splitlines()[0] == msg


@pytest.mark.parametrize("case", [0, 3, 5, 7])
def test_compiled_errors_match_eager(device, case):
    fn, args, _ = _error_cases(device)[case]
    with pytest.raises(RuntimeError) as eager:
        fn(*args)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: fn(*a), backend="aot_eager", fullgraph=True)
    with pytest.raises(RuntimeError) as traced:
        compiled(*args)
    assert str(eager.value).splitlines()[0] in str(traced.value)
    torch._dynamo.reset()


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_mixed_devices_name_both():
    x, t = torch.randn(4, 5, device="cuda"), torch.rand(4, 5)
    with pytest.raises(RuntimeError, match=r"targets to be on the device of inputs \(cuda:0\), but got cpu"):
        op(x, t)
    with pytest.raises(RuntimeError, match=r"targets to be on the device of inputs \(cpu\), but got cuda:0"):
        op(x.cpu(), t.cuda())
    with pytest.raises(RuntimeError, match=r"grad_out to be on the device of inputs \(cuda:0\), but got cpu"):
        op_bw(torch.ones(()), x, t.cuda(), 0.25, 2.0, "sum", [True, False])


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


def test_compiled_graph_calls_the_ops(device, _reset_dynamo):
    from functorch.compile import aot_function, make_boxed_func

    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    x = torch.randn(9, 6, device=device, requires_grad=True)
    t = torch.rand(9, 6, device=device)
    aot_function(lambda x, t: op(x, t, reduction="sum"), fw_compiler=keep, bw_compiler=keep)(x, t).backward()
    targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert "customops.sigmoid_focal_loss.default" in targets
    assert "customops.sigmoid_focal_loss_backward.default" in targets
    assert not [t for t in targets if "auto_functionalized" in t], targets


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
    args = list(nodes[0].args) + [a.default_value for a in schema_args[len(nodes[0].args):]]
    assert args[2:] == [0.4, 1.5, reduction]
    path = tmp_path / "focal.pt2"
    torch.export.save(ep, str(path))
    loaded = torch.export.load(str(path))
    for rows in (1, 37):
        x, t = torch.randn(rows, 7, device=device), torch.rand(rows, 7, device=device)
        torch.testing.assert_close(ep.module()(x, t), model(x, t))
        torch.testing.assert_close(loaded.module()(x, t), model(x, t))


class FocalAndMean(nn.Module):
    def forward(self, x, t):
        return customops.sigmoid_focal_loss(x, t, 0.4, 1.5, "sum") + customops.sigmoid_focal_loss(x, t).mean()


def test_aoti_package_dynamic_batch(device, tmp_path):
    from customops.export import aoti_python_loading_works, export_aoti, load_aoti

    if not aoti_python_loading_works():
        pytest.skip(f"torch {torch.__version__}'s aoti_load_package is known to crash")
    model = FocalAndMean()
    path = export_aoti(model, (torch.randn(8, 5, device=device), torch.rand(8, 5, device=device)),
                       str(tmp_path / "focal.pt2"))
    runner = load_aoti(path)
    for rows in (1, 37):
        x, t = torch.randn(rows, 5, device=device), torch.rand(rows, 5, device=device)
        torch.testing.assert_close(runner(x, t), model(x, t))


class ScriptedUse(nn.Module):
    def forward(self, x, t):
        return customops.sigmoid_focal_loss(x, t) + customops.sigmoid_focal_loss(x, t, 0.5, 0.0, "sum")


def test_torchscript_script_save_load_in_fresh_process(device, tmp_path):
    scripted = torch.jit.script(ScriptedUse())
    x, t = torch.randn(6, 5, device=device), torch.rand(6, 5, device=device)
    torch.testing.assert_close(scripted(x, t), ScriptedUse()(x, t))
    assert "customops::sigmoid_focal_loss" in str(scripted.inlined_graph)
    path, inp, outp = tmp_path / "m.pt", tmp_path / "in.pt", tmp_path / "out.pt"
    scripted.save(str(path))
    torch.save((x, t), inp)
    script = textwrap.dedent(
        f"""
        import torch, customops
        m = torch.jit.load({str(path)!r})
        torch.save(m(*torch.load({str(inp)!r})), {str(outp)!r})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    torch.testing.assert_close(torch.load(outp), ScriptedUse()(x, t), rtol=0, atol=0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("alpha,gamma", [(0.25, 2.0), (-1.0, 0.0), (0.6, 1.0), (0.4, 0.5)])
def test_onnx_standard_ops_in_onnxruntime(reduction, alpha, gamma, tmp_path):
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
def test_cuda_ops_run_on_the_current_stream():
    # The new inputs are written on the side stream behind a long sleep; a kernel launched on
    # another stream would read the old ones.
    x = torch.zeros(1000, 40, device="cuda")
    t = torch.zeros(1000, 40, device="cuda")
    new_x, new_t = torch.randn(1000, 40, device="cuda") * 3, torch.rand(1000, 40, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.copy_(new_x)
        t.copy_(new_t)
        outs = [op(x, t, 0.25, 2.0, r) for r in REDUCTIONS]
        grads = op_bw(torch.ones((), device="cuda"), x, t, 0.25, 2.0, "sum", [True, True])
    torch.cuda.current_stream().wait_stream(side)
    for r, out in zip(REDUCTIONS, outs):
        assert_close_ref(out, torchvision_sigmoid_focal_loss(new_x.double(), new_t.double(), reduction=r), torch.float32)
    _, ref_gx, ref_gt = reference(new_x, new_t, 0.25, 2.0, "sum")
    torch.testing.assert_close(grads[0].double(), ref_gx, **grads_tol(torch.float32))
    torch.testing.assert_close(grads[1].double(), ref_gt, **grads_tol(torch.float32))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replay_with_new_inputs(dtype):
    static_x = torch.randn(77, 40, device="cuda", dtype=dtype, requires_grad=True)
    static_t = torch.rand(77, 40, device="cuda", dtype=dtype)

    def step():
        loss = op(static_x, static_t, 0.25, 2.0, "sum") + op(static_x, static_t, 0.5, 1.5, "mean")
        (gx,) = torch.autograd.grad(loss, (static_x,))
        return loss, gx, op(static_x, static_t)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss, static_gx, static_none = step()
    for k in range(3):
        new_x = (torch.randn(77, 40, device="cuda") * (k + 1)).to(dtype)
        new_t = torch.rand(77, 40, device="cuda").to(dtype)
        with torch.no_grad():
            static_x.copy_(new_x)
            static_t.copy_(new_t)
        graph.replay()
        ref = (torchvision_sigmoid_focal_loss(new_x.double(), new_t.double(), 0.25, 2.0, "sum")
               + torchvision_sigmoid_focal_loss(new_x.double(), new_t.double(), 0.5, 1.5, "mean"))
        assert_close_ref(static_loss, ref, dtype)
        assert_close_ref(static_none, torchvision_sigmoid_focal_loss(new_x.double(), new_t.double()), dtype)
        _, g1, _ = reference(new_x, new_t, 0.25, 2.0, "sum")
        _, g2, _ = reference(new_x, new_t, 0.5, 1.5, "mean")
        torch.testing.assert_close(static_gx.double(), g1 + g2, **grads_tol(dtype))


FOCAL_LAUNCHES = {
    "sigmoid_focal_loss_kernel": "customops.sigmoid_focal_loss(x, t)",
    "sigmoid_focal_loss_reduce_kernel": "customops.sigmoid_focal_loss(x, t, reduction='sum')",
    "sigmoid_focal_loss_finalize_kernel": "customops.sigmoid_focal_loss(x, t, reduction='mean')",
    "sigmoid_focal_loss_backward_kernel": "torch.ops.customops.sigmoid_focal_loss_backward(x[0, 0], x, t, 0.25, 2.0, 'sum', [True, True])",
}


@needs_cuda
@pytest.mark.parametrize("kernel", sorted(FOCAL_LAUNCHES))
def test_cuda_failed_launch_is_a_runtime_error_naming_the_kernel(kernel):
    script = textwrap.dedent(
        f"""
        import torch, customops
        x = torch.randn(64, 64, device="cuda")
        t = torch.rand(64, 64, device="cuda")
        try:
            {FOCAL_LAUNCHES[kernel]}
            torch.cuda.synchronize()
        except RuntimeError as e:
            print("RAISED:", e)
        else:
            print("NO ERROR")
        print("AFTER:", torch.allclose(customops.sigmoid(x), torch.sigmoid(x)))
        """
    )
    env = dict(os.environ, CUSTOMOPS_TEST_FAIL_LAUNCH=kernel, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"RAISED: customops: CUDA kernel {kernel} failed to launch: invalid" in proc.stdout, proc.stdout
    assert "AFTER: True" in proc.stdout, proc.stdout


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu(dtype):
    # The same formulas on both backends: elementwise results agree to rounding.
    x, t = make_pair("contiguous", "cuda", dtype)
    for reduction in REDUCTIONS:
        torch.testing.assert_close(op(x, t, 0.25, 2.0, reduction).cpu(), op(x.cpu(), t.cpu(), 0.25, 2.0, reduction),
                                   **TOL[dtype])
        g = torch.ones((), device="cuda", dtype=dtype) if reduction != "none" else torch.ones_like(x)
        for a, b in zip(op_bw(g, x, t, 0.25, 2.0, reduction, [True, True]),
                        op_bw(g.cpu(), x.cpu(), t.cpu(), 0.25, 2.0, reduction, [True, True])):
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
    torch.testing.assert_close(out[tail].double(), torchvision_sigmoid_focal_loss(x[tail].double(), t[tail].double()),
                               **TOL[torch.bfloat16])
    del out
    torch.cuda.empty_cache()
