"""Property-based tests (hypothesis): random shapes including 0 and 1, random strides from
slicing and transposition, every supported dtype, against the eager reference, forward and
backward. CPU (CI); CUDA too where a GPU is visible."""

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import customops
from conftest import DEVICES, TOL

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
dims = st.integers(min_value=0, max_value=9)


@st.composite
def strided(draw, shape, dtype, device):
    """A tensor of `shape` that is, at random, a transposed or step-sliced view."""
    layout = draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
    if layout == "transposed" and len(shape) >= 2:
        return torch.randn(tuple(reversed(shape)), dtype=dtype, device=device).permute(*reversed(range(len(shape))))
    if layout == "sliced" and len(shape) >= 1:
        step = draw(st.integers(1, 3))
        big = torch.randn((shape[0] * step + 1, *shape[1:]), dtype=dtype, device=device)
        return big[1::step][: shape[0]]
    return torch.randn(tuple(shape), dtype=dtype, device=device)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    lead=st.lists(dims, min_size=0, max_size=2),
    in_features=dims,
    out_features=dims,
    bias=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    device=st.sampled_from(DEVICES),
)
def test_fused_linear_sigmoid_forward_backward(data, lead, in_features, out_features, bias, dtype, device):
    x = data.draw(strided((*lead, in_features), dtype, device)).requires_grad_()
    w = data.draw(strided((out_features, in_features), dtype, device)).requires_grad_()
    b = data.draw(strided((out_features,), dtype, device)).requires_grad_() if bias else None
    out = customops.fused_linear_sigmoid(x, w, b)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if bias else None
    ref = torch.sigmoid(F.linear(x64, w64, b64))
    assert out.shape == ref.shape and out.dtype == dtype and out.is_contiguous()
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    g = torch.rand_like(out)
    inputs = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(out, inputs, g)
    ref_grads = torch.autograd.grad(ref, [t for t in (x64, w64, b64) if t is not None], g.double())
    scale = max(1, in_features, lead[0] if lead else 1) * (lead[1] if len(lead) > 1 else 1)
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape
        tol = {k: v * scale for k, v in TOL[dtype].items()}  # sums over up to `scale` terms
        torch.testing.assert_close(got.double(), want, **tol)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    shape=st.lists(dims, min_size=0, max_size=3),
    dtype=st.sampled_from(DTYPES),
    device=st.sampled_from(DEVICES),
)
def test_elementwise_forward_backward(data, shape, dtype, device):
    a = data.draw(strided(tuple(shape), dtype, device)).requires_grad_()
    c = data.draw(strided(tuple(shape), dtype, device)).requires_grad_()
    s = customops.add(a, c)
    y = customops.sigmoid(a)
    torch.testing.assert_close(s.double(), a.double() + c.double(), **TOL[dtype])
    torch.testing.assert_close(y.double(), torch.sigmoid(a.double()), **TOL[dtype])
    g = torch.randn_like(y)
    (ga,) = torch.autograd.grad(y, a, g)
    want = g.double() * torch.sigmoid(a.double()) * (1 - torch.sigmoid(a.double()))
    torch.testing.assert_close(ga.double(), want, **TOL[dtype])
    ga2, gc2 = torch.autograd.grad(s, (a, c), g)
    assert torch.equal(ga2, g) and torch.equal(gc2, g)
