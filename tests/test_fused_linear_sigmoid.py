import itertools

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import customops
from conftest import DTYPES, assert_close_ref

op = torch.ops.customops.fused_linear_sigmoid
op_bw = torch.ops.customops.fused_linear_sigmoid_backward


def reference(x, w, b):
    return torch.sigmoid(F.linear(x.double(), w.double(), None if b is None else b.double()))


def make_inputs(layout, device, dtype, M=7, K=12, N=5, bias=True):
    """(x, weight, bias) in the named memory layout."""
    t = dict(device=device, dtype=dtype)
    if layout == "contiguous":
        x, w = torch.randn(M, K, **t), torch.randn(N, K, **t)
    elif layout == "x_transposed":
        x, w = torch.randn(K, M, **t).t(), torch.randn(N, K, **t)
    elif layout == "x_column_slice":  # row stride K + 7, not K
        x, w = torch.randn(M, K + 7, **t)[:, 3 : 3 + K], torch.randn(N, K, **t)
    elif layout == "weight_transposed":
        x, w = torch.randn(M, K, **t), torch.randn(K, N, **t).t()
    elif layout == "3d":
        x, w = torch.randn(2, 3, K, **t), torch.randn(N, K, **t)
    elif layout == "3d_permuted":
        x, w = torch.randn(K, 3, 2, **t).permute(2, 1, 0), torch.randn(N, K, **t)
    elif layout == "1d":
        x, w = torch.randn(K, **t), torch.randn(N, K, **t)
    else:
        raise ValueError(layout)
    b = torch.randn(2 * N, **t)[::2] if bias else None  # strided bias view
    return x, w, b


LAYOUTS = ["contiguous", "x_transposed", "x_column_slice", "weight_transposed", "3d", "3d_permuted", "1d"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_matches_reference(device, dtype, layout, bias):
    x, w, b = make_inputs(layout, device, dtype, bias=bias)
    inputs_before = [t.clone() for t in (x, w) + ((b,) if bias else ())]
    out = customops.fused_linear_sigmoid(x, w, b)
    ref = reference(x, w, b)
    assert out.shape == ref.shape == (*x.shape[:-1], w.shape[0])
    assert out.dtype == dtype and out.device == x.device and out.is_contiguous()
    assert_close_ref(out, ref, dtype)
    # Inputs are never modified.
    for before, after in zip(inputs_before, (x, w) + ((b,) if bias else ())):
        assert torch.equal(before, after)


@pytest.mark.parametrize("dtype", DTYPES)
def test_larger_shapes_hit_vector_and_tail_paths(device, dtype):
    # out_features 24 (vector path) and 29 (scalar path); 16-bit accumulates in float32.
    for n in (24, 29):
        x, w, b = torch.randn(129, 300, device=device, dtype=dtype), torch.randn(n, 300, device=device, dtype=dtype), None
        b = torch.randn(n, device=device, dtype=dtype)
        out = op(x, w / 10, b)
        assert_close_ref(out, reference(x, w / 10, b), dtype)


def test_extreme_logits_saturate_without_nan(device):
    x = torch.tensor([[1.0], [-1.0]], device=device)
    w = torch.tensor([[1e4], [-1e4]], device=device)
    out = op(x, w, None)
    assert torch.equal(out.cpu(), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))


@pytest.mark.parametrize("layout", ["contiguous", "3d", "1d", "x_column_slice"])
def test_fake_matches_real(device, layout):
    x, w, b = make_inputs(layout, device, torch.float32)
    real = op(x, w, b)
    with FakeTensorMode() as mode:
        fx, fw, fb = (mode.from_tensor(t) for t in (x, w, b))
        fake = op(fx, fw, fb)
    assert fake.shape == real.shape
    assert fake.stride() == real.stride()
    assert fake.dtype == real.dtype and fake.device == real.device


@pytest.mark.parametrize("requires_grad", list(itertools.product([False, True], repeat=3)))
def test_grads_for_every_requires_grad_combination(device, requires_grad):
    x, w, b = make_inputs("3d", device, torch.float64)
    for t, rg in zip((x, w, b), requires_grad):
        t.requires_grad_(rg)
    out = op(x, w, b)
    if not any(requires_grad):
        assert not out.requires_grad
        return
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    xr, wr, br = (t.detach().clone().requires_grad_(rg) for t, rg in zip((x, w, b), requires_grad))
    torch.sigmoid(F.linear(xr, wr, br)).backward(grad_out)
    for t, tr, rg in zip((x, w, b), (xr, wr, br), requires_grad):
        if rg:
            torch.testing.assert_close(t.grad, tr.grad)
        else:
            assert t.grad is None


def test_no_bias_grads(device):
    x, w, _ = make_inputs("contiguous", device, torch.float64, bias=False)
    x.requires_grad_()
    w.requires_grad_()
    op(x, w, None).sum().backward()
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    torch.sigmoid(F.linear(xr, wr)).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)


def test_bias_grad_shape_for_3d_input(device):
    x = torch.randn(2, 5, 16, device=device, requires_grad=True)
    w = torch.randn(4, 16, device=device, requires_grad=True)
    b = torch.randn(4, device=device, requires_grad=True)
    op(x, w, b).sum().backward()
    assert b.grad.shape == (4,)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_empty_batch_forward_and_backward(device):
    x = torch.randn(0, 8, device=device, requires_grad=True)
    w = torch.randn(3, 8, device=device, requires_grad=True)
    b = torch.randn(3, device=device, requires_grad=True)
    out = op(x, w, b)
    assert out.shape == (0, 3)
    out.sum().backward()
    assert x.grad.shape == (0, 8)
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_and_gradgradcheck(device, bias):
    x, w, b = make_inputs("3d", device, torch.float64, M=3, K=4, N=3, bias=bias)
    args = [t.requires_grad_() for t in (x, w)] + ([b.requires_grad_()] if bias else [None])
    assert torch.autograd.gradcheck(op, args)
    assert torch.autograd.gradgradcheck(op, args)


def test_backward_output_mask_returns_empty_for_masked_outputs(device):
    x, w, _ = make_inputs("contiguous", device, torch.float32)
    y = op(x, w, None)
    gx, gw, gb = op_bw(torch.ones_like(y), x, w, y, [True, False, False])
    assert gx.shape == x.shape and gw.numel() == 0 and gb.numel() == 0


OPCHECK_CASES = [
    ("contiguous", torch.float32, True),
    ("x_transposed", torch.float32, True),
    ("x_column_slice", torch.float32, False),
    ("weight_transposed", torch.float64, True),
    ("3d", torch.bfloat16, True),
    ("1d", torch.float16, True),
]


@pytest.mark.parametrize("layout,dtype,bias", OPCHECK_CASES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, layout, dtype, bias, requires_grad):
    x, w, b = make_inputs(layout, device, dtype, bias=bias)
    if requires_grad:
        for t in (x, w, b):
            if t is not None:
                t.requires_grad_()
    torch.library.opcheck(op, (x, w, b))


@pytest.mark.parametrize("mask", [[True, True, True], [True, False, False], [False, True, True]])
def test_opcheck_backward(device, mask):
    x, w, _ = make_inputs("3d", device, torch.float64)
    y = op(x, w, None)
    g = torch.randn_like(y)
    args = [t.requires_grad_() for t in (g, x, w, y)]
    torch.library.opcheck(op_bw, (*args, mask))


def test_output_and_grads_are_fresh_tensors_not_views(device):
    x = torch.randn(2, 3, 5, device=device, requires_grad=True)
    w = torch.randn(4, 5, device=device)
    y = op(x, w, None)
    assert not y._is_view()
    y.add_(1)  # in-place on the output works as on any fresh tensor (as F.linear's output does)
    gx, gw, gb = op_bw(torch.ones(2, 3, 4, device=device), x.detach(), w, torch.rand(2, 3, 4, device=device), [True, True, True])
    assert not any(t._is_view() for t in (gx, gw, gb))


def test_identity_weight_and_zero_bias_still_give_a_new_tensor(device):
    # sigmoid is not the identity, but x @ I.T + 0 is: no step may hand back x's storage.
    x = torch.randn(6, 6, device=device)
    x_before = x.clone()
    out = op(x, torch.eye(6, device=device), torch.zeros(6, device=device))
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    torch.testing.assert_close(out, torch.sigmoid(x_before))
    out.zero_()
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("in_features,out_features", [(0, 3), (5, 0), (0, 0)])
def test_zero_features(device, in_features, out_features):
    x = torch.randn(4, in_features, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(out_features, in_features, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(out_features, device=device, dtype=torch.float64, requires_grad=True)
    out = op(x, w, b)
    ref = reference(x, w, b)
    torch.testing.assert_close(out, ref)  # in_features 0: sigmoid(bias) on every row
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, w, b), g)
    ref_grads = torch.autograd.grad(torch.sigmoid(F.linear(x, w, b)), (x, w, b), g)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)
    torch.library.opcheck(op, (x, w, b))


def test_library_alone_has_autograd():
    # As a C++ program or a bare torch.ops.load_library uses it: the autograd kernels are C++,
    # so gradients (and double backward) need no Python module of ours.
    import subprocess
    import sys

    code = (
        "import torch\n"
        f"torch.ops.load_library({customops.library_path()!r})\n"
        "import sys; assert 'customops' not in sys.modules\n"
        "x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)\n"
        "w = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)\n"
        "b = torch.randn(2, dtype=torch.float64, requires_grad=True)\n"
        "ops = torch.ops.customops\n"
        "f = lambda x, w, b: ops.add(ops.sigmoid(ops.fused_linear_sigmoid(x, w, b)), x[:, :2])\n"
        "ref = lambda x, w, b: torch.sigmoid(torch.sigmoid(x @ w.T + b)) + x[:, :2]\n"
        "g = torch.autograd.grad(f(x, w, b).sum(), (x, w, b))\n"
        "rg = torch.autograd.grad(ref(x, w, b).sum(), (x, w, b))\n"
        "assert all(torch.allclose(a, r) for a, r in zip(g, rg))\n"
        "assert torch.autograd.gradgradcheck(f, (x, w, b))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_unsupported_transforms_raise_instead_of_answering_wrong(device):
    # Forward-mode AD and torch.func's grad transforms are not supported by C++ autograd
    # kernels: they must raise, never return zero tangents. vmap (no grad) works.
    import torch.autograd.forward_ad as fwAD

    x = torch.randn(4, 6, device=device, dtype=torch.float64)
    w = torch.randn(3, 6, device=device, dtype=torch.float64)
    with fwAD.dual_level(), pytest.raises(RuntimeError, match="jvp is not implemented"):
        op(fwAD.make_dual(x, torch.ones_like(x)), w, None)
    with pytest.raises(RuntimeError, match="functorch transforms"):
        torch.func.grad(lambda w: op(x, w, None).sum())(w)
    batched = torch.vmap(lambda x: op(x, w, None))(x.reshape(2, 2, 6))
    torch.testing.assert_close(batched.reshape(4, 3), torch.sigmoid(F.linear(x, w)))
