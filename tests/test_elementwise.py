"""add and sigmoid: saturation, gradients with one input requiring grad, fresh outputs."""

import torch

import customops

# Every op against its reference on every layout, dtype and device, gradcheck and opcheck:
# tests/test_conformance.py (from customops/testing/op_specs.py). Here: what is particular to
# add and sigmoid.


def test_adding_zeros_gives_a_new_tensor(device):
    # Adding zeros is the identity on values, never on storage.
    a = torch.randn(5, 7, device=device)
    same = customops.add(a, torch.zeros_like(a))
    assert torch.equal(same, a)
    assert same.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()


def test_sigmoid_saturates(device):
    x = torch.tensor([-1e4, -100.0, 0.0, 100.0, 1e4], device=device)
    out = customops.sigmoid(x).cpu()
    assert torch.equal(out, torch.tensor([0.0, torch.sigmoid(torch.tensor(-100.0)).item(), 0.5, 1.0, 1.0]))


def test_add_grads(device):
    a = torch.randn(3, 4, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, device=device, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 4, device=device, dtype=torch.float64)
    customops.add(a, b).backward(g)
    assert torch.equal(a.grad, g) and torch.equal(b.grad, g)
    # Only one input requiring grad.
    c = torch.randn(3, 4, device=device, dtype=torch.float64)
    a.grad = None
    customops.add(a, c).backward(g)
    assert torch.equal(a.grad, g) and c.grad is None
