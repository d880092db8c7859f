import pytest
import torch

import customops
from conftest import DTYPES, assert_close_ref

LAYOUTS = ["contiguous", "transposed", "sliced", "channels_last", "0d", "empty", "odd_offset"]


def make(layout, device, dtype):
    t = dict(device=device, dtype=dtype)
    if layout == "contiguous":
        return torch.randn(1000, 37, **t)
    if layout == "transposed":
        return torch.randn(37, 50, **t).t()
    if layout == "sliced":
        return torch.randn(40, 60, **t)[::3, 5:50]
    if layout == "channels_last":
        return torch.randn(2, 5, 7, 9, **t).to(memory_format=torch.channels_last)
    if layout == "0d":
        return torch.randn((), **t)
    if layout == "empty":
        return torch.randn(0, 5, **t)
    if layout == "odd_offset":  # storage offset 1: not 16-byte aligned
        return torch.randn(4099, **t)[1:]
    raise ValueError(layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_matches_reference(device, dtype, layout):
    a, b = make(layout, device, dtype), make(layout, device, dtype)
    a_before, b_before = a.clone(), b.clone()
    out = customops.add(a, b)
    assert out.shape == a.shape and out.dtype == dtype and out.is_contiguous()
    assert_close_ref(out, a.double() + b.double(), dtype)
    assert out.data_ptr() not in (a.data_ptr(), b.data_ptr()) or out.numel() == 0
    assert torch.equal(a, a_before) and torch.equal(b, b_before)
    # Adding zeros is the identity on values, never on storage.
    same = customops.add(a, torch.zeros_like(a))
    assert same.numel() == 0 or same.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_matches_reference(device, dtype, layout):
    x = make(layout, device, dtype) * 4
    x_before = x.clone()
    out = customops.sigmoid(x)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert torch.equal(x, x_before)
    assert_close_ref(out, torch.sigmoid(x.double()), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_backward_matches_reference(device, dtype):
    g, y = torch.randn(333, device=device, dtype=dtype), torch.rand(333, device=device, dtype=dtype)
    assert_close_ref(customops.sigmoid_backward(g, y), g.double() * y.double() * (1 - y.double()), dtype)


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


def test_gradcheck_and_gradgradcheck(device):
    a, b = (torch.randn(3, 5, device=device, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(customops.add, (a, b))
    assert torch.autograd.gradgradcheck(customops.add, (a, b))
    assert torch.autograd.gradcheck(customops.sigmoid, (a,))
    assert torch.autograd.gradgradcheck(customops.sigmoid, (a,))
    y = torch.rand(3, 5, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(customops.sigmoid_backward, (a, y))
    assert torch.autograd.gradgradcheck(customops.sigmoid_backward, (a, y))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "channels_last", "empty"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, layout, dtype, requires_grad):
    a, b = make(layout, device, dtype), make(layout, device, dtype)
    a.requires_grad_(requires_grad)
    b.requires_grad_(requires_grad)
    torch.library.opcheck(torch.ops.customops.add, (a, b))
    torch.library.opcheck(torch.ops.customops.sigmoid, (a,))
    torch.library.opcheck(torch.ops.customops.sigmoid_backward, (a, b))
