"""fused_linear_sigmoid: what is particular to it. Every op against its reference on every
layout, dtype and device, gradcheck, opcheck and the export paths: tests/test_conformance.py
(from customops/testing/op_specs.py)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import customops
from conftest import DTYPES, assert_close_ref

op = torch.ops.customops.fused_linear_sigmoid
op_bw = torch.ops.customops.fused_linear_sigmoid_backward


def reference(x, w, b):
    return torch.sigmoid(F.linear(x.double(), w.double(), None if b is None else b.double()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_larger_shapes_hit_vector_and_tail_paths(device, dtype):
    # out_features 24 (rows a multiple of 8 elements) and 29 (not). At 129 rows both devices run
    # linear_sigmoid_aten (ATen's addmm, then sigmoid_); 16-bit accumulates in float32.
    for n in (24, 29):
        x, w, b = (
            torch.randn(129, 300, device=device, dtype=dtype),
            torch.randn(n, 300, device=device, dtype=dtype),
            None,
        )
        b = torch.randn(n, device=device, dtype=dtype)
        out = op(x, w / 10, b)
        assert_close_ref(out, reference(x, w / 10, b), dtype)


@pytest.mark.parametrize("rows", [1, 5, 301])  # 301 x 257: two threads split the pass mid-row
@pytest.mark.parametrize("out_features", [1, 15, 16, 17, 257])  # whole 16-float vectors and tails
def test_cpu_float32_bias_sigmoid_pass_matches_aten(rows, out_features):
    # The CPU float32 forward runs its own bias + sigmoid pass (Cephes expf) after the GEMM; it
    # must agree with ATen's sigmoid to about an ulp, with and without a bias.
    x, w = torch.randn(rows, 40), torch.randn(out_features, 40) / 4
    for b in (torch.randn(out_features) * 10, None):
        out = op(x, w, b)
        torch.testing.assert_close(out, torch.sigmoid(F.linear(x, w, b)), rtol=1e-6, atol=1e-37)
        assert_close_ref(out, reference(x, w, b), torch.float32)


def test_cpu_float32_bias_sigmoid_pass_at_the_limits():
    # Pre-activations through the bias: around exp's normal range (|z| = 87.3), beyond it, and
    # non-finite. Below -87.3 the pass gives 0 where the true value is under 1.2e-38.
    z = torch.tensor(
        [0.0, -0.0, 1e-8, -1e-8, 1, -1, 10, -10, 20, -20, 80, -80, 87, -87, 87.3, -87.3, 88, -88, 100, -100]
        + [float("inf"), float("-inf"), float("nan"), 3.0]  # 2 rows of 24: three whole vectors across rows
    )
    out = op(torch.zeros(2, 8), torch.zeros(len(z), 8), z)
    expected = torch.sigmoid(z.double()).float().expand(2, -1)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1.3e-38, equal_nan=True)
    assert out[:, z == float("-inf")].eq(0).all() and out[:, z == float("inf")].eq(1).all()


def test_extreme_logits_saturate_without_nan(device):
    x = torch.tensor([[1.0], [-1.0]], device=device)
    w = torch.tensor([[1e4], [-1e4]], device=device)
    out = op(x, w, None)
    assert torch.equal(out.cpu(), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))


@pytest.mark.parametrize("requires_grad", list(itertools.product([False, True], repeat=3)))
def test_grads_for_every_requires_grad_combination(device, requires_grad):
    x, w, b = (torch.randn(*s, device=device, dtype=torch.float64) for s in ((2, 3, 12), (5, 12), (5,)))
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


def test_empty_batch_forward_and_backward(device):
    x = torch.randn(0, 8, device=device, requires_grad=True)
    w = torch.randn(3, 8, device=device, requires_grad=True)
    b = torch.randn(3, device=device, requires_grad=True)
    out = op(x, w, b)
    assert out.shape == (0, 3)
    out.sum().backward()
    assert x.grad.shape == (0, 8)
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


def test_output_and_grads_are_fresh_tensors_not_views(device):
    x = torch.randn(2, 3, 5, device=device, requires_grad=True)
    w = torch.randn(4, 5, device=device)
    y = op(x, w, None)
    assert not y._is_view()
    y.add_(1)  # in-place on the output works as on any fresh tensor (as F.linear's output does)
    gx, gw, gb = op_bw(
        torch.ones(2, 3, 4, device=device), x.detach(), w, torch.rand(2, 3, 4, device=device), [True, True, True]
    )
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
def test_zero_features_grads(device, in_features, out_features):
    # Gradients are zeros, not undefined, even where the output is empty (gradcheck has no
    # output entries to check there).
    x = torch.randn(4, in_features, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(out_features, in_features, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(out_features, device=device, dtype=torch.float64, requires_grad=True)
    out = op(x, w, b)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, w, b), g)
    ref_grads = torch.autograd.grad(torch.sigmoid(F.linear(x, w, b)), (x, w, b), g)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


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
