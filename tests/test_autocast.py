"""torch.autocast: fused_linear_sigmoid follows F.linear's policy and deform_conv2d conv2d's (cast
to the autocast dtype); add and sigmoid follow torch.add's and torch.sigmoid's (no cast). Eager,
autograd, compile, and training with a GradScaler."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import customops
from conftest import HAS_CUDA, TOL
from customops.nn import FusedLinearSigmoid, ModulatedDeformConv2d

# (device, autocast dtype): CUDA autocasts to float16 or bfloat16, CPU to bfloat16.
CASES = [("cpu", torch.bfloat16)] + ([("cuda", torch.float16), ("cuda", torch.bfloat16)] if HAS_CUDA else [])
IDS = [f"{d}-{str(t).split('.')[-1]}" for d, t in CASES]


def _linear_args(device, dtype=torch.float32, bias=True):
    x = torch.randn(9, 24, device=device, dtype=dtype)
    w = torch.randn(10, 24, device=device, dtype=dtype) / 5
    b = torch.randn(10, device=device, dtype=dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
@pytest.mark.parametrize("bias", [True, False])
def test_casts_inputs_like_linear(device, dtype, bias):
    x, w, b = _linear_args(device, bias=bias)
    with torch.autocast(device, dtype=dtype):
        out = customops.fused_linear_sigmoid(x, w, b)
        ref = torch.sigmoid(F.linear(x, w, b))
    assert ref.dtype == dtype
    assert out.dtype == dtype and out.device == x.device
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])
    # The computation happened in the 16-bit dtype: it equals the op on pre-cast inputs.
    cast = [t.to(dtype) if t is not None else None for t in (x, w, b)]
    torch.testing.assert_close(out, customops.fused_linear_sigmoid(*cast), atol=0, rtol=0)


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_mixed_input_dtypes_work_under_autocast_only(device, dtype):
    x, w, b = _linear_args(device)
    x16 = x.to(dtype)
    with pytest.raises(RuntimeError, match="weight"):
        customops.fused_linear_sigmoid(x16, w, b)
    with torch.autocast(device, dtype=dtype):
        out = customops.fused_linear_sigmoid(x16, w, b)
        ref = F.linear(x16, w, b)
    assert out.dtype == ref.dtype == dtype


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_float64_and_disabled_regions_are_not_cast(device, dtype):
    x, w, b = _linear_args(device, dtype=torch.float64)
    with torch.autocast(device, dtype=dtype):
        assert customops.fused_linear_sigmoid(x, w, b).dtype == F.linear(x, w, b).dtype == torch.float64
        x32, w32, b32 = x.float(), w.float(), b.float()
        with torch.autocast(device, enabled=False):
            assert customops.fused_linear_sigmoid(x32, w32, b32).dtype == torch.float32


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_gradients_flow_back_to_float32_leaves(device, dtype):
    x, w, b = _linear_args(device)
    ours = [t.clone().requires_grad_() for t in (x, w, b)]
    theirs = [t.clone().requires_grad_() for t in (x, w, b)]
    g = torch.rand(9, 10, device=device)
    with torch.autocast(device, dtype=dtype):
        out = customops.fused_linear_sigmoid(*ours)
        ref = torch.sigmoid(F.linear(*theirs))
    (out.float() * g).sum().backward()
    (ref.float() * g).sum().backward()
    for a, r in zip(ours, theirs):
        assert a.grad.dtype == torch.float32
        torch.testing.assert_close(a.grad, r.grad, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_elementwise_ops_follow_aten_policy(device, dtype):
    # torch.add and torch.sigmoid are in no autocast cast list: they run in their inputs' dtype.
    x32 = torch.randn(4, 5, device=device)
    x16 = x32.to(dtype)
    with torch.autocast(device, dtype=dtype):
        assert customops.sigmoid(x32).dtype == torch.sigmoid(x32).dtype == torch.float32
        assert customops.sigmoid(x16).dtype == torch.sigmoid(x16).dtype == dtype
        assert customops.add(x32, x32).dtype == torch.add(x32, x32).dtype == torch.float32
        assert customops.add(x16, x16).dtype == torch.add(x16, x16).dtype == dtype
        torch.testing.assert_close(customops.sigmoid(x32), torch.sigmoid(x32))


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_compiled_under_autocast_matches_eager(device, dtype):
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(24, 16), FusedLinearSigmoid(16, 10)).to(device)
    x = torch.randn(9, 24, device=device)
    compiled = torch.compile(model, fullgraph=True)
    with torch.autocast(device, dtype=dtype):
        eager = model(x)
        out = compiled(x)
    assert out.dtype == eager.dtype == dtype
    torch.testing.assert_close(out.float(), eager.float(), **TOL[dtype])
    torch._dynamo.reset()


def _train(model, device, dtype, steps=60):
    # Mixed precision recipe from the torch.amp docs: autocast forward, scaled backward.
    torch.manual_seed(1)
    data = torch.randn(256, 16, device=device)
    target = (data[:, :4].sum(1, keepdim=True) > 0).float().expand(-1, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10)
    losses = []
    for step in range(steps):
        batch = slice((step * 32) % 256, (step * 32) % 256 + 32)
        opt.zero_grad()
        with torch.autocast(device, dtype=dtype):
            out = model(data[batch])
        # Outside the region: CUDA autocast refuses binary_cross_entropy on 16-bit inputs.
        loss = F.binary_cross_entropy(out.float(), target[batch])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return torch.tensor(losses)


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_mixed_model_trains_with_grad_scaler_like_linear_sigmoid(device, dtype):
    torch.manual_seed(0)
    reference = nn.Sequential(
        nn.Linear(16, 32), nn.Sigmoid(), nn.Linear(32, 32), nn.Sigmoid(), nn.Linear(32, 4), nn.Sigmoid()
    )
    # Same weights: the middle pair is an nn.Linear + nn.Sigmoid in the reference and a
    # FusedLinearSigmoid here; the other layers stay nn.Linear in both.
    mixed = copy.deepcopy(reference)
    mixed[2] = FusedLinearSigmoid.from_linear(mixed[2])
    mixed[3] = nn.Identity()
    mixed[4] = FusedLinearSigmoid.from_linear(mixed[4])
    mixed[5] = nn.Identity()
    ref_losses = _train(reference.to(device), device, dtype)
    losses = _train(mixed.to(device), device, dtype)
    assert torch.isfinite(losses).all()
    assert losses[-5:].mean() < 0.5 * losses[:5].mean(), "the mixed model did not learn"
    torch.testing.assert_close(losses, ref_losses, atol=2e-2, rtol=2e-2)
    for p in mixed.parameters():
        assert p.dtype == torch.float32


def _deform_args(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    t = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device, dtype)  # noqa: E731
    return dict(
        input=t(2, 8, 6, 7), offset=t(2, 18, 6, 7, scale=1.5), weight=t(4, 8, 3, 3, scale=0.2), bias=t(4),
        padding=1, mask=torch.rand(2, 9, 6, 7, generator=g).to(device, dtype),
    )  # fmt: skip


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_deform_conv2d_casts_inputs_like_conv2d(device, dtype):
    kw = _deform_args(device)
    with torch.autocast(device, dtype=dtype):
        out = customops.deform_conv2d(**kw)
        dense = F.conv2d(kw["input"], kw["weight"], kw["bias"], padding=1)
    assert out.dtype == dense.dtype == dtype
    # The computation happened in the 16-bit dtype: it equals the op on pre-cast inputs.
    cast = {k: v.to(dtype) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    torch.testing.assert_close(out, customops.deform_conv2d(**cast), atol=0, rtol=0)


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_deform_conv2d_mixed_dtypes_work_under_autocast_only(device, dtype):
    # The offsets of a modulated layer come from a conv2d, which autocast runs in 16 bits.
    kw = _deform_args(device)
    kw["offset"] = kw["offset"].to(dtype)
    with pytest.raises(RuntimeError, match="offset"):
        customops.deform_conv2d(**kw)
    with torch.autocast(device, dtype=dtype):
        assert customops.deform_conv2d(**kw).dtype == dtype
    kw64 = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in _deform_args(device).items()}
    with torch.autocast(device, dtype=dtype):
        assert customops.deform_conv2d(**kw64).dtype == torch.float64


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_modulated_module_trains_under_autocast(device, dtype, compiled):
    torch.manual_seed(0)
    layer = ModulatedDeformConv2d(8, 4, 3, padding=1).to(device)
    with torch.no_grad():  # offsets and mask away from their initial zeros
        layer.conv_offset.weight.normal_(0, 0.1)
    ref = copy.deepcopy(layer)
    x = torch.randn(2, 8, 6, 7, device=device)
    torch._dynamo.reset()
    run = torch.compile(layer, fullgraph=True) if compiled else layer
    # Before pytorch/pytorch#181564 (in torch 2.11, not 2.14) AOTAutograd's cache key held
    # whether autocast was on, not its dtype: this graph would come back from the float16 case.
    with torch._functorch.config.patch(enable_autograd_cache=False), torch.autocast(device, dtype=dtype):
        out = run(x)
    assert out.dtype == dtype
    expected = ref(x)
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=5e-2)
    out.float().sum().backward()
    expected.sum().backward()
    for (name, p), r in zip(layer.named_parameters(), ref.parameters()):
        assert p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), name
        if name.startswith("conv_offset"):
            # The offsets' gradient changes wherever rounding moves a sampling point across a
            # pixel line: float64 on bfloat16-rounded inputs is 10 to 17% off already.
            assert F.cosine_similarity(p.grad.flatten(), r.grad.flatten(), dim=0) > 0.9, name
        else:
            assert (p.grad - r.grad).norm() <= 2e-2 * r.grad.norm(), name
    torch._dynamo.reset()


@pytest.mark.parametrize("device,dtype", CASES, ids=IDS)
def test_scripted_module_under_autocast_casts_both_ops(device, dtype):
    # The C++ autocast kernels apply to a TorchScript module run inside an autocast region (one
    # opened inside scripted code is TorchScript's rewrite, for ATen's ops alone: the README says so).
    class Both(torch.nn.Module):
        def forward(self, x, w, inp, off, wd):
            return customops.fused_linear_sigmoid(x, w), customops.deform_conv2d(inp, off, wd)

    g = torch.Generator().manual_seed(0)
    args = [
        torch.randn(*s, generator=g).to(device) for s in ((9, 24), (10, 24), (2, 4, 7, 8), (2, 18, 5, 6), (6, 4, 3, 3))
    ]
    scripted = torch.jit.script(Both())
    with torch.autocast(device, dtype=dtype):
        outs = scripted(*args)
    assert [o.dtype for o in outs] == [dtype, dtype]
    cast = [a.to(dtype) for a in args]
    torch.testing.assert_close(outs[0], customops.fused_linear_sigmoid(*cast[:2]), atol=0, rtol=0)
    torch.testing.assert_close(outs[1], customops.deform_conv2d(*cast[2:]), atol=0, rtol=0)
