"""What the spec (customops/testing/op_specs.py) cannot say about deform_conv2d: semantics
against torchvision's op and against conv2d, sizes large enough for several column chunks,
the backward's determinism across thread counts, the gradients of each output_mask subset,
no recompiles over batch and spatial sizes, the nn modules and the converter, and the ONNX
graph's node."""

import os
import re
import tempfile

import pytest
import torch
import torch.nn.functional as F

import customops
from customops.testing.op_specs import deform_conv2d_reference


def _torchvision():
    try:
        import torchvision.ops

        return torchvision.ops, None
    except Exception as e:  # noqa: BLE001  (ImportError, or a RuntimeError from a torchvision built for another torch)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


tvops, TV_MISSING = _torchvision()
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_torchvision = pytest.mark.skipif(
    tvops is None,
    reason=f"torchvision is not importable here ({TV_MISSING}); torchvision 0.29.1 loads with torch 2.14.1 only "
    "(scripts/setup.sh installs it there)",
)


def _inputs(B=2, C=6, H=7, W=8, C_out=4, groups=2, og=3, k=(3, 3), stride=(1, 1), pad=(1, 1), dil=(1, 1),
            mask=True, bias=True, dtype=torch.float64, scale=2.0, seed=0):  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    kh, kw = k
    H_out = (H + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    W_out = (W + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    return dict(
        input=t(B, C, H, W),
        offset=(t(B, 2 * og * kh * kw, H_out, W_out) * scale).to(dtype),
        weight=t(C_out, C // groups, kh, kw),
        bias=t(C_out) if bias else None,
        stride=stride,
        padding=pad,
        dilation=dil,
        mask=torch.rand(B, og * kh * kw, H_out, W_out, generator=g, dtype=torch.float64).to(dtype) if mask else None,
    )


CONFIGS = {
    "dcnv2_groups_offset_groups": {},
    "dcnv1_stride_dilation": dict(mask=False, stride=(2, 1), dil=(1, 2), pad=(2, 1), og=1, groups=1),
    "depthwise": dict(C=6, C_out=6, groups=6, og=2),
    # One input channel per group but two outputs: columns and a GEMM per group, not the
    # depthwise kernels.
    "depthwise_multiplier_2": dict(C=6, C_out=12, groups=6, og=2),
    "5x5_outside": dict(k=(5, 5), scale=5.0, og=1),
    # More output channels than output pixels in the batch. Where the columns are smaller than
    # the weight, the GEMMs take the weight in its own order and reorder the columns instead: the
    # CPU's gemm_in_weight_order (9 pixels x 2 groups < 36; 9 < 24 with one group), CUDA's
    # weight_order where they are at most half of it (36 <= 36, 18 <= 24). With 2 images of 2
    # groups (36 > 24) the columns are larger, and the weight takes their order.
    "more_outputs_than_pixels": dict(H=2, W=3, C_out=24, k=(2, 3)),
    "weight_order_groups": dict(B=1, H=2, W=3, C_out=36, k=(2, 3)),
    "weight_order_one_group": dict(B=1, H=2, W=3, C_out=24, k=(2, 3), groups=1, og=2),
    # ... with 16-byte output rows (8 pixels: CUDA's GEMM straight into NCHW in 16 bits), with
    # several images of several groups, and with 49 taps and 64 channels (the tiled reorder).
    "weight_order_aligned_rows": dict(B=1, C=8, H=2, W=4, C_out=16, groups=1, og=1),
    "weight_order_images_groups": dict(B=2, C=8, H=1, W=2, C_out=16, groups=2, og=2),
    "weight_order_7x7": dict(B=1, C=64, H=2, W=2, C_out=16, groups=1, og=1, k=(7, 7), pad=(3, 3)),
    # Offset groups of 2 channels: CUDA's column units of one item, 8 offset groups x 4 pixels of
    # a tap a warp with a last row block past the 105 rows, and 12 as 2 sets of 6 x 5 pixels.
    "narrow_offset_groups": dict(B=3, C=16, H=5, W=7, C_out=8, groups=1, og=8, k=(7, 7), pad=(3, 3)),
    "narrow_offset_groups_in_sets": dict(B=2, C=24, H=5, W=6, C_out=8, groups=1, og=12),
    # Groups of 256 channels (a reduction of 2304) on 30 pixels: in IEEE float32, CUDA's GEMM
    # per group (gemm_per_group), not one batched over the groups.
    "groups_long_reduction": dict(B=1, C=512, H=5, W=6, C_out=16, groups=2, og=2),
}


@needs_torchvision
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_torchvision_forward_and_gradients(name):
    kw = _inputs(**CONFIGS[name])
    ours_in = {k: (v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    tv_in = {k: (v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ours = customops.deform_conv2d(**ours_in)
    theirs = tvops.deform_conv2d(**tv_in)
    torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10)
    grad = torch.randn_like(ours)
    ours.backward(grad)
    theirs.backward(grad)
    for key, v in ours_in.items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(v.grad, tv_in[key].grad, atol=1e-9, rtol=1e-9, msg=lambda m, k=key: f"{k}: {m}")


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_torchvision_at_a_network_size(dtype):
    kw = _inputs(B=2, C=32, H=24, W=20, C_out=16, groups=1, og=1, dtype=dtype)
    ours = customops.deform_conv2d(**kw).double()
    theirs = tvops.deform_conv2d(**{k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(ours, theirs.double(), atol=tol * 10, rtol=tol)


@needs_torchvision
def test_module_has_torchvisions_state_dict_and_converts():
    torch.manual_seed(0)
    tv = tvops.DeformConv2d(6, 4, 3, stride=1, padding=1, groups=2)
    ours = customops.nn.DeformConv2d(6, 4, 3, stride=1, padding=1, groups=2)
    assert list(ours.state_dict()) == list(tv.state_dict())
    ours.load_state_dict(tv.state_dict())
    kw = _inputs(C=6, C_out=4, groups=2, og=1, dtype=torch.float32)
    torch.testing.assert_close(ours(kw["input"], kw["offset"], kw["mask"]), tv(kw["input"], kw["offset"], kw["mask"]))
    model = torch.nn.Sequential(tvops.DeformConv2d(6, 4, 3, padding=1, groups=2))
    weight = model[0].weight
    assert customops.nn.replace_torchvision_deform_conv2d(model) == 1
    assert type(model[0]) is customops.nn.DeformConv2d and model[0].weight is weight
    # A module held under two names is replaced once and stays one module.
    model = torch.nn.Sequential(tvops.DeformConv2d(6, 4, 3, padding=1))
    model.alias = model[0]
    assert customops.nn.replace_torchvision_deform_conv2d(model) == 1
    assert type(model.alias) is customops.nn.DeformConv2d and model.alias is model[0]
    # Modules whose hooks or extra state a replacement would drop are left alone.
    model = torch.nn.Sequential(*(tvops.DeformConv2d(6, 4, 3, padding=1) for _ in range(4)))
    model[0].register_full_backward_hook(lambda m, grad_in, grad_out: None)
    model[1].register_full_backward_pre_hook(lambda m, grad_out: None)
    model[2].register_buffer("running_scale", torch.ones(4))
    model[3].observer = torch.nn.Identity()
    keys = list(model.state_dict())
    assert customops.nn.replace_torchvision_deform_conv2d(model) == 0
    assert all(type(m) is tvops.DeformConv2d for m in model) and list(model.state_dict()) == keys


def test_zero_offsets_without_mask_are_conv2d():
    for groups, stride, dil, pad in [(1, (1, 1), (1, 1), (1, 1)), (2, (2, 1), (1, 2), (0, 2))]:
        kw = _inputs(groups=groups, og=3, mask=False, stride=stride, dil=dil, pad=pad)
        kw["offset"].zero_()
        expected = F.conv2d(kw["input"], kw["weight"], kw["bias"], stride, pad, dil, groups)
        torch.testing.assert_close(customops.deform_conv2d(**kw), expected, atol=1e-12, rtol=1e-12)


def test_integer_offsets_shift_the_image():
    # Every tap moved one row down and two columns left: output (oy, ox) reads input pixels
    # (oy + i, ox + j - 3) for taps (i, j) (padding 1), zero outside: a valid conv2d over a
    # canvas holding the input at that shift.
    kw = _inputs(og=1, mask=False, dtype=torch.float32)
    B, C, H, W = kw["input"].shape
    off = kw["offset"].view(B, 1, 9, 2, H, W)
    off[:, :, :, 0], off[:, :, :, 1] = 1.0, -2.0
    canvas = torch.zeros(B, C, H + 2, W + 2)
    canvas[:, :, :H, 3:] = kw["input"][:, :, :, : W - 1]
    expected = F.conv2d(canvas, kw["weight"], kw["bias"], 1, 0, 1, 2)
    torch.testing.assert_close(customops.deform_conv2d(**kw), expected)


def test_points_outside_the_image_sample_zero_and_nothing_leaks_from_other_pixels():
    kw = _inputs(og=1, dtype=torch.float32)
    kw["offset"].fill_(100.0)
    kw["input"][:, :, 0, 0] = float("inf")  # never read: every point is outside
    out = customops.deform_conv2d(**kw)
    torch.testing.assert_close(out, kw["bias"].view(1, -1, 1, 1).expand_as(out))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_non_finite_sampling_positions_sample_zero_with_zero_offset_gradient(device):
    # As documented: a NaN or infinite offset is a point outside the image.
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in _inputs(og=1).items()}
    bad = kw["offset"].clone()
    bad[0, 0, 2, 3], bad[1, 5, 4, 1], bad[0, 8, 0, 0] = float("nan"), float("inf"), -float("inf")
    outside = kw["offset"].clone()
    outside[0, 0, 2, 3], outside[1, 5, 4, 1], outside[0, 8, 0, 0] = 1e6, 1e6, -1e6
    grads = []
    for off in (bad, outside):
        off = off.requires_grad_()
        out = customops.deform_conv2d(**dict(kw, offset=off))
        assert torch.isfinite(out).all()
        (g,) = torch.autograd.grad(out, off, torch.ones_like(out))
        assert torch.isfinite(g).all() and g[0, 0, 2, 3] == 0 and g[1, 5, 4, 1] == 0 and g[0, 8, 0, 0] == 0
        grads.append((out, g))
    torch.testing.assert_close(grads[0], grads[1], atol=0, rtol=0)


def _right_hand_offset_gradient(kw, eps=1e-7):
    base = customops.deform_conv2d(**kw).sum()
    grad = torch.empty_like(kw["offset"])
    for i in range(grad.numel()):
        off = kw["offset"].clone()
        off.view(-1)[i] += eps
        grad.view(-1)[i] = (customops.deform_conv2d(**{**kw, "offset": off}).sum() - base) / eps
    return grad


@pytest.mark.parametrize("mask", [False, True])
def test_offset_gradient_at_integer_points_and_on_the_border_lines_is_right_hand(mask):
    # Zero offsets with padding 1: every point is on an integer position, and the border taps on
    # the lines y = -1 and x = -1, where the point samples 0 but moving it down or right does
    # not (torchvision's gradient there too).
    kw = _inputs(B=1, C=2, H=3, W=4, C_out=2, groups=1, og=1, mask=mask)
    kw["offset"] = torch.zeros_like(kw["offset"], requires_grad=True)
    customops.deform_conv2d(**kw).sum().backward()
    expected = _right_hand_offset_gradient({**kw, "offset": kw["offset"].detach()})
    torch.testing.assert_close(kw["offset"].grad, expected, atol=1e-5, rtol=1e-5)
    on_border_line = kw["offset"].grad[0, 0::2, 0]  # dy of every tap of the first output row
    assert on_border_line[:3].abs().sum() > 0  # the taps of kernel row 0 sit on y = -1
    if tvops is not None:
        o = torch.zeros_like(kw["offset"], requires_grad=True)
        tvops.deform_conv2d(kw["input"], o, kw["weight"], kw["bias"], 1, 1, 1, kw["mask"]).sum().backward()
        torch.testing.assert_close(kw["offset"].grad, o.grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_several_column_chunks_and_layouts(dtype):
    # 64 channels x 9 taps x 4 bytes per pixel: a 72x72 image needs two 8 MB column chunks.
    kw = _inputs(B=1, C=64, H=72, W=72, C_out=8, groups=1, og=2, dtype=dtype)
    out = customops.deform_conv2d(**kw)
    ref = deform_conv2d_reference(**{k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    tol = dict(atol=1e-3, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=1.6e-2)
    torch.testing.assert_close(out.double(), ref, **tol)
    kw_cl = dict(kw, input=kw["input"].to(memory_format=torch.channels_last))
    out_cl = customops.deform_conv2d(**kw_cl)
    assert out_cl.is_contiguous(memory_format=torch.channels_last) and not out_cl.is_contiguous()
    torch.testing.assert_close(out_cl.double(), out.double(), **tol)  # GEMMs into the other layout


CHANNELS_LAST_CONFIGS = {
    "one_group": dict(B=2, C=16, H=9, W=11, C_out=8, groups=1, og=2),
    "one_group_no_bias": dict(B=2, C=16, H=9, W=11, C_out=8, groups=1, og=2, bias=False),
    "groups": dict(B=2, C=12, H=8, W=7, C_out=6, groups=3, og=1),
    "groups_one_image": dict(B=1, C=12, H=8, W=7, C_out=6, groups=3, og=1),
    # the weight in its own order (fewer output pixels than output channels), one and 2 groups
    "weight_order": dict(B=1, C=8, H=4, W=4, C_out=64, groups=1, og=1),
    "weight_order_groups": dict(B=2, C=8, H=2, W=2, C_out=32, groups=2, og=1),
    "groups_long_reduction": CONFIGS["groups_long_reduction"],
    "depthwise": dict(B=3, C=24, H=10, W=9, C_out=24, groups=24, og=3),
    "depthwise_direct": dict(B=2, C=8, H=6, W=7, C_out=8, groups=8, og=1),
    "one_pixel_output": dict(B=2, C=8, H=3, W=3, C_out=4, groups=1, og=1, pad=(0, 0)),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("name", list(CHANNELS_LAST_CONFIGS))
def test_channels_last_input_gives_a_channels_last_output_and_the_same_values(name, device, monkeypatch):
    # As conv2d: a channels_last input gives a channels_last output, and autograd then hands the
    # backward a channels_last grad_out (the CUDA backward with one group copies each chunk's
    # operand out of it, with no NCHW copy of the whole). A 1x1 output is both layouts at once.
    if name == "depthwise_direct":
        monkeypatch.setenv("CUSTOMOPS_TEST_DEPTHWISE_DIRECT", "1")
    dtype = torch.float64 if device == "cpu" else torch.float32
    kw = {k: (v.to(device, dtype) if isinstance(v, torch.Tensor) else v)
          for k, v in _inputs(**CHANNELS_LAST_CONFIGS[name]).items()}  # fmt: skip
    leaves = {k: v.requires_grad_() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    out = customops.deform_conv2d(**kw)
    grad = torch.randn_like(out)
    want = torch.autograd.grad(out, list(leaves.values()), grad)
    x_cl = kw["input"].detach().to(memory_format=torch.channels_last).requires_grad_()
    out_cl = customops.deform_conv2d(**dict(kw, input=x_cl))
    if name == "one_pixel_output":
        assert out_cl.shape[2:] == (1, 1) and out_cl.is_contiguous()
    else:
        assert out_cl.is_contiguous(memory_format=torch.channels_last) and not out_cl.is_contiguous()
    torch.testing.assert_close(out_cl, out, atol=1e-5, rtol=1e-5)
    got = torch.autograd.grad(out_cl, [x_cl] + list(leaves.values())[1:], grad.to(memory_format=torch.channels_last))
    for key, a, b in zip(leaves, got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, key=key: f"grad {key}: {m}")
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:  # the fake kernel's strides
        fake = customops.deform_conv2d(**{k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v)
                                          for k, v in dict(kw, input=x_cl).items()})  # fmt: skip
    assert fake.stride() == out_cl.stride()


def _layouts():
    """(name, input, kernel size): inputs of several layouts, ambiguous ones included."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    cl = torch.channels_last
    return [
        ("contiguous", r(2, 4, 5, 6), 3),
        ("channels_last", r(2, 4, 5, 6).to(memory_format=cl), 3),
        ("slice_of_channels_last", r(2, 8, 5, 6).to(memory_format=cl)[:, 2:6], 3),
        ("one_channel_channels_last", r(2, 1, 5, 6).to(memory_format=cl), 3),
        ("one_pixel_channels_last", r(2, 4, 1, 1).to(memory_format=cl), 1),
        ("batch_0_channels_last", r(0, 4, 5, 6).to(memory_format=cl), 3),
        ("batch_1_channels_last", r(1, 4, 5, 6).to(memory_format=cl), 3),
        ("transposed_hw", r(2, 4, 6, 5).transpose(2, 3), 3),
    ]


@pytest.mark.parametrize("name", [c[0] for c in _layouts()])
def test_output_layout_is_conv2ds_and_the_fake_kernels(name):
    # The output takes the input's suggested memory format, as conv2d's output (contiguous
    # weight) does, and the fake kernel's strides are the kernel's, so that compiled and exported
    # graphs see the real layout.
    from torch._prims_common import check_significant_strides

    x, k = next((x, k) for n, x, k in _layouts() if n == name)
    B, C, H, W = x.shape
    w = torch.randn(3, C, k, k, dtype=x.dtype)
    off = torch.randn(B, 2 * k * k, H, W, dtype=x.dtype)
    out = customops.deform_conv2d(x, off, w, padding=k // 2)
    conv = torch.nn.functional.conv2d(x, w, padding=k // 2)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = customops.deform_conv2d(mode.from_tensor(x), mode.from_tensor(off), mode.from_tensor(w), padding=k // 2)
    for other in (conv, fake):
        same, _ = check_significant_strides(out, other, only_cuda=False)
        assert same, (name, out.stride(), other.stride())


def test_fake_kernel_decides_the_layout_of_a_data_dependent_batch():
    # A batch from nonzero() or a mask is an unbacked size under torch.compile: the fake kernel
    # decides the layout without a guard on it (torch's own stride test raises or answers
    # contiguous there), as the kernels do at any batch.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    with FakeTensorMode(shape_env=env):
        u0 = env.create_unbacked_symint()
        torch._check(u0 >= 0)
        for fmt in (torch.channels_last, torch.contiguous_format):
            x = torch.empty((u0, 4, 5, 6), memory_format=fmt)
            out = customops.deform_conv2d(x, torch.empty((u0, 18, 5, 6)), torch.empty(3, 4, 3, 3), padding=1)
            assert out.stride() == torch.empty((1, 3, 5, 6), memory_format=fmt).stride()


# The CPU's column chunks (column_chunk_pixels in deform_conv2d_cpu.cpp), forward and gradients:
# 176 channels x 7 x 7 taps x 4 bytes per row, of which 8 MB holds 243, so chunks take 256
# pixels: an 18x18 output is a chunk of 256 and one of 68; depthwise (whose forward is direct,
# so only the backward is chunked), 64 channels x 9 taps: a 64x64 output is a chunk of 3640 and
# one of 456.
CPU_CHUNK_CONFIGS = {
    "wide_rows_256_pixels": dict(B=1, C=176, H=18, W=18, C_out=4, groups=1, og=2, k=(7, 7), pad=(3, 3)),
    "depthwise_two_chunks": dict(B=2, C=64, H=64, W=64, C_out=64, groups=64, og=2),
    # 455-pixel chunks of 144-pixel images: 3 images per chunk (3 + 3 + 2), one GEMM per group.
    "images_per_chunk_groups": dict(B=8, C=512, H=12, W=12, C_out=8, groups=2, og=2),
    # One image of 16 pixels and 64 output channels: the weight's order, one image per chunk.
    "weight_order_one_image": dict(B=1, C=64, H=4, W=4, C_out=64, groups=1, og=2),
    # 400-pixel images of one group: the forward's GEMM batched over a chunk's images, as many
    # images to each thread (4 + 1 on 2 threads); the backward's chunks the same, an image per
    # task in the first (grads_by_image), image by image in the last.
    "images_batched_per_thread": dict(B=5, C=8, H=20, W=20, C_out=6, groups=1, og=2),
    # 4 MB images, copied channels-last (and grad_input accumulated) 2 at a time: 2 + 1 (the
    # forward's batched GEMMs too).
    "images_in_copies_of_two": dict(
        B=3, C=64, H=128, W=128, C_out=4, groups=1, og=2, k=(1, 1), stride=(2, 2), pad=(0, 0)
    ),
}


# Both GEMMs of the columns (onednn_gemm: BLAS, or oneDNN's 1x1 convolution over channels-last
# views of the rows), whichever this CPU's vendor gets by default.
@pytest.mark.parametrize("gemm", ["blas", "onednn"])
@pytest.mark.parametrize("name", list(CPU_CHUNK_CONFIGS))
def test_cpu_chunks_forward_and_gradients(name, gemm, monkeypatch):
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_CPU_GEMM", gemm)
    kw = _inputs(**CPU_CHUNK_CONFIGS[name], dtype=torch.float32)
    leaves = {k: v.requires_grad_() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    ref_in = {k: (v.detach().double().requires_grad_() if k in leaves else v) for k, v in kw.items()}
    out, ref = customops.deform_conv2d(**kw), deform_conv2d_reference(**ref_in)
    torch.testing.assert_close(out.double(), ref, atol=1e-3, rtol=1e-4)
    grad_out = torch.randn(out.shape, dtype=torch.float64)
    out.backward(grad_out.float())
    ref.backward(grad_out)
    for k, v in leaves.items():
        torch.testing.assert_close(
            v.grad.double(), ref_in[k].grad, atol=2e-3, rtol=1e-3, msg=lambda m, k=k: f"{k}: {m}"
        )


def _backward(kw, grad_out, output_mask):
    return torch.ops.customops.deform_conv2d_backward(
        grad_out, kw["input"], kw["offset"], kw["weight"], kw["mask"], kw["stride"], kw["padding"], kw["dilation"],
        output_mask,
    )  # fmt: skip


def test_each_output_mask_subset_gives_the_same_gradients():
    kw = _inputs(dtype=torch.float64)
    grad_out = torch.randn(2, 4, 7, 8, dtype=torch.float64)
    full = _backward(kw, grad_out, [True] * 5)
    for i in range(5):
        only = _backward(kw, grad_out, [j == i for j in range(5)])
        torch.testing.assert_close(only[i], full[i], atol=0, rtol=0)
        assert all(only[j].numel() == 0 for j in range(5) if j != i)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["dcnv2_groups_offset_groups", "depthwise", "5x5_outside", "weight_order_groups"])
def test_backward_outputs_own_their_memory(name, dtype, device):
    """Each gradient is a tensor of its own, not a view of a buffer shared with another gradient
    or with the backward's temporaries (a leaf's .grad would keep the whole buffer alive)."""
    kw = {k: v.to(device, dtype) if isinstance(v, torch.Tensor) else v for k, v in _inputs(**CONFIGS[name]).items()}
    out = torch.ops.customops.deform_conv2d(
        kw["input"], kw["offset"], kw["weight"], kw["bias"], kw["stride"], kw["padding"], kw["dilation"], kw["mask"]
    )  # fmt: skip
    grads = _backward(kw, torch.randn_like(out), [True] * 5)
    assert len({g.untyped_storage().data_ptr() for g in grads}) == 5
    for g, like in zip(grads, (kw["input"], kw["offset"], kw["weight"], kw["bias"], kw["mask"])):
        assert g.shape == like.shape and g.dtype == dtype and g.device == like.device
        assert g.untyped_storage().nbytes() == g.numel() * g.element_size()


# One image: col2im over blocks of 16 channels (40: two threads). Three small images in one
# chunk: on 1 thread an image per task (grads_by_image), on 2 threads col2im, image by image.
# Depthwise: grad_input and grad_weight over blocks of channels, without columns.
@pytest.mark.parametrize("B, H, groups", [(1, 20, 1), (3, 10, 1), (2, 20, 40)])
def test_backward_is_the_same_for_any_number_of_threads(B, H, groups):
    C_out = 8 if groups == 1 else 40
    kw = _inputs(B=B, C=40, H=H, W=H, C_out=C_out, groups=groups, og=2, dtype=torch.float32)
    grad_out = torch.randn(B, C_out, H, H)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _backward(kw, grad_out, [True] * 5)
        torch.set_num_threads(2)
        two = _backward(kw, grad_out, [True] * 5)
    finally:
        torch.set_num_threads(threads)
    # input (col2im: each thread owns its channels), offset and mask; depthwise, weight too
    for i in (0, 1, 4) if groups == 1 else (0, 1, 2, 4):
        torch.testing.assert_close(one[i], two[i], atol=0, rtol=0)


def test_backward_of_many_small_images_matches_image_by_image():
    # Two chunks of small images (145 + 5 of 100 pixels at 16 x 9 columns), each an image per
    # task (grads_by_image), against each image's backward alone (col2im over channels): the same
    # additions in the same order for each image's input, offset and mask gradients.
    kw = _inputs(B=150, C=16, H=10, W=10, C_out=8, groups=1, og=2, dtype=torch.float32)
    grad_out = torch.randn(150, 8, 10, 10, generator=torch.Generator().manual_seed(1))
    whole = _backward(kw, grad_out, [True] * 5)
    parts = [
        _backward({k: (v[b : b + 1] if k in ("input", "offset", "mask") else v) for k, v in kw.items()},
                  grad_out[b : b + 1], [True] * 5)
        for b in range(150)
    ]  # fmt: skip
    for i in (0, 1, 4):
        torch.testing.assert_close(whole[i], torch.cat([p[i] for p in parts]), atol=0, rtol=0)
    torch.testing.assert_close(whole[2], sum(p[2] for p in parts), atol=1e-4, rtol=1e-4)


def test_double_backward_raises():
    kw = _inputs(dtype=torch.float64)
    x = kw["input"].requires_grad_()
    (g,) = torch.autograd.grad(customops.deform_conv2d(**kw).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="deform_conv2d supports first-order gradients only"):
        g.sum().backward()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(offset=None), "expected offset to be a Tensor, but got NoneType"),
        (dict(input=None), "expected input to be a Tensor, but got NoneType"),
        (dict(weight=[[1.0]]), "expected weight to be a Tensor, but got list"),
        (dict(mask=1.0), "expected mask to be a Tensor, but got float"),
        (dict(stride=1.0), "expected stride to be an int or a pair of ints, but got 1.0"),
        (dict(padding=(1.5, 1)), r"expected padding to be an int or a pair of ints, but got \(1.5, 1\)"),
        (dict(dilation=None), "expected dilation to be an int or a pair of ints, but got None"),
    ],
)
def test_arguments_of_the_wrong_type_raise_type_errors_naming_them(change, message):
    kw = dict(_inputs(dtype=torch.float32), **change)
    with pytest.raises(TypeError, match=message):
        customops.deform_conv2d(**kw)


def test_integer_like_geometry_and_values_past_int64():
    # numpy's ints pass as F.conv2d's do, and give the ints' result; ints past int64 raise
    # naming the argument, where the op's schema would not name it.
    np = pytest.importorskip("numpy")
    kw = _inputs(dtype=torch.float64, H=9, W=9, stride=(2, 2))
    ref = customops.deform_conv2d(**kw)
    for stride in (np.int64(2), (np.int32(2), 2), [2, np.int16(2)]):
        torch.testing.assert_close(customops.deform_conv2d(**dict(kw, stride=stride)), ref, atol=0, rtol=0)
    with pytest.raises(
        RuntimeError, match=r"expected stride to be at most 2147483647, but got \[1, 9223372036854775808\]"
    ):
        customops.deform_conv2d(**dict(kw, stride=(1, 2**63)))
    with pytest.raises(RuntimeError, match="expected padding to be >= 0, but got"):
        customops.deform_conv2d(**dict(kw, padding=-(2**64)))


@pytest.mark.parametrize(
    "cls, args, error, message",
    [
        ("DeformConv2d", dict(in_channels=0), ValueError, "expected in_channels to be >= 1, but got 0"),
        ("DeformConv2d", dict(out_channels=-2), ValueError, "expected out_channels to be >= 0, but got -2"),
        ("DeformConv2d", dict(groups=0), ValueError, "expected groups to be >= 1, but got 0"),
        ("DeformConv2d", dict(kernel_size=0), ValueError, "expected kernel_size to be >= 1, but got 0"),
        ("DeformConv2d", dict(kernel_size=(3, 0)), ValueError, "expected kernel_size to be >= 1, but got 0"),
        ("DeformConv2d", dict(stride=1.5), TypeError, "expected stride to be an int or a pair of ints, but got 1.5"),
        ("DeformConv2d", dict(padding=(1, 1, 1)), TypeError, "expected padding to be an int or a pair of ints"),
        ("ModulatedDeformConv2d", dict(offset_groups=0), ValueError, "expected offset_groups to be >= 1, but got 0"),
        ("ModulatedDeformConv2d", dict(dilation="2"), TypeError, "expected dilation to be an int or a pair of ints"),
        ("ModulatedDeformConv2d", dict(stride=0), ValueError, r"expected stride to be >= 1, but got \(0, 0\)"),
        ("ModulatedDeformConv2d", dict(padding=(1, -1)), ValueError, r"expected padding to be >= 0, but got \(1, -1\)"),
        ("ModulatedDeformConv2d", dict(dilation=(0, 1)), ValueError, r"expected dilation to be >= 1, but got \(0, 1\)"),
    ],
)
def test_module_arguments_out_of_range_raise_naming_them(cls, args, error, message):
    kw = {**dict(in_channels=4, out_channels=4, kernel_size=3), **args}
    with pytest.raises(error, match=message):
        getattr(customops.nn, cls)(**kw)


def test_module_pairs_accept_integer_like_values():
    m = customops.nn.DeformConv2d(4, 4, torch.tensor(3).item(), stride=(1, 2), padding=[1, 1])
    assert (m.kernel_size, m.stride, m.padding, m.dilation) == ((3, 3), (1, 2), (1, 1), (1, 1))


def test_compile_over_batch_and_spatial_sizes_does_not_recompile():
    torch._dynamo.reset()
    fn = torch.compile(customops.deform_conv2d, fullgraph=True, dynamic=True)
    fn(**_inputs(B=2, H=7, W=8, dtype=torch.float32))
    # Sizes >= 2: dynamo specializes sizes 0 and 1 for every op (torch._dynamo.mark_unbacked
    # avoids that).
    with torch.compiler.set_stance("fail_on_recompile"):
        for B, H, W in [(3, 9, 6), (4, 12, 12), (5, 6, 10)]:
            kw = _inputs(B=B, H=H, W=W, dtype=torch.float32, seed=B)
            torch.testing.assert_close(fn(**kw), customops.deform_conv2d(**kw))
    torch._dynamo.reset()


def test_int_stride_padding_dilation_under_compile_and_torchscript():
    # Ints as the wrapper's arguments: under dynamic shapes dynamo passes them as SymInts.
    kw = _inputs(B=2, C=4, H=9, W=11, C_out=3, groups=1, og=1, mask=False, stride=(2, 2), pad=(1, 1), dil=(2, 2))
    x, offset, weight = kw["input"], kw["offset"], kw["weight"]
    expected = customops.deform_conv2d(x, offset, weight, None, (2, 2), (1, 1), (2, 2))

    def fn(x, offset, weight, s: int, p: int, d: int):
        return customops.deform_conv2d(x, offset, weight, None, s, p, d)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(x, offset, weight, 2, 1, 2), expected)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.jit.script(fn)(x, offset, weight, 2, 1, 2), expected)


def test_compiled_module_trains_with_flexible_input_layouts():
    # Without flexible_layout, Inductor gives a custom op's inputs eager's exact strides, and
    # those strides' guards on the sizes recompiled a compiled modulated layer at every size
    # (this torch's CPU conv2d, the offset convolution, adds guards of its own, so the test
    # checks the tag and the results, not the recompiles).
    for op in (torch.ops.customops.deform_conv2d, torch.ops.customops.deform_conv2d_backward):
        assert torch.Tag.flexible_layout in op.default.tags
    torch.manual_seed(0)
    m = customops.nn.ModulatedDeformConv2d(6, 5, 3, padding=1).double()
    with torch.no_grad():
        m.conv_offset.weight.normal_(0, 0.1)  # offsets that are not the plain grid
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, dynamic=True)
    for B, H, W in [(2, 11, 13), (3, 9, 7), (4, 16, 20)]:
        x = torch.randn(B, 6, H, W, dtype=torch.float64, requires_grad=True)
        x = x if B != 3 else x.to(memory_format=torch.channels_last)
        out, expected = compiled(x), m(x)
        torch.testing.assert_close(out, expected)
        params = (x, m.weight, m.conv_offset.weight)
        got, want = (
            torch.autograd.grad(out.square().sum(), params),
            torch.autograd.grad(expected.square().sum(), params),
        )
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    torch._dynamo.reset()


def test_modulated_module_starts_as_a_plain_convolution():
    torch.manual_seed(0)
    m = customops.nn.ModulatedDeformConv2d(6, 4, 3, padding=1, groups=2, offset_groups=3)
    assert m.conv_offset.out_channels == 3 * 3 * 9
    x = torch.randn(2, 6, 7, 8)
    expected = 0.5 * F.conv2d(x, m.weight, None, 1, 1, 1, 2) + m.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(m(x), expected)
    m(x).sum().backward()
    assert m.conv_offset.weight.grad is not None and m.conv_offset.weight.grad.abs().sum() > 0
    scripted = torch.jit.script(m)
    torch.testing.assert_close(scripted(x), m(x))


def test_onnx_graph_is_one_deformconv():
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from customops.export.onnx_translation import ONNX_OPSET, ONNX_TRANSLATION_TABLE

    torch.manual_seed(0)
    model = customops.nn.ModulatedDeformConv2d(4, 3, 3, padding=1, offset_groups=2).eval()
    with torch.no_grad():
        model.conv_offset.weight.normal_(0, 0.3)  # offsets and mask that are not the plain grid
    x = torch.randn(1, 4, 9, 10)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        torch.onnx.export(
            model, (x,), path, dynamo=True, custom_translation_table=ONNX_TRANSLATION_TABLE, opset_version=ONNX_OPSET
        )
        proto = onnx.load(path)
        assert [n.op_type for n in proto.graph.node].count("DeformConv") == 1
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), model(x), atol=1e-5, rtol=1e-5)


# --- CUDA: against the CPU kernel in float64 and torchvision's CUDA op ----------------------


def _cuda_vs_cpu(kw, dtype, fwd_tol, grad_tol):
    """Forward and all five gradients on CUDA in ``dtype`` against the CPU kernel in float64
    (itself checked against the reference and torchvision above) on the same values (the
    inputs and grad_out rounded to ``dtype``: a rounded offset that crosses a pixel line
    changes its gradient by a step); relative errors in norm. The offsets are multiples of
    1/256 first, so that the CUDA kernels' float32 sampling positions (integer base + offset)
    are exact: at 160 x 160, rounding them put a few points of 460k on the other side of a pixel
    line, which moved float32's grad_offset by 1e-3 in norm."""

    def leaf(v, **to):
        return v.detach().to(**to).clone().requires_grad_() if isinstance(v, torch.Tensor) else v

    kw = dict(kw, offset=(kw["offset"].double() * 256).round() / 256)
    kw = {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    cpu = {k: leaf(v, dtype=torch.float64) for k, v in kw.items()}
    gpu = {k: leaf(v, device="cuda", dtype=dtype) for k, v in kw.items()}
    ref = customops.deform_conv2d(**cpu)
    out = customops.deform_conv2d(**gpu)
    assert out.dtype == dtype and out.is_contiguous() and out.shape == ref.shape

    def rel(a, b):
        return ((a.detach().double().cpu() - b.detach()).norm() / b.detach().norm().clamp_min(1e-30)).item()

    assert rel(out, ref) < fwd_tol
    grad = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(dtype)
    ref.backward(grad.double())
    out.backward(grad.cuda())
    for key, v in gpu.items():
        if isinstance(v, torch.Tensor):
            assert v.grad.dtype == dtype, key
            assert rel(v.grad, cpu[key].grad) < grad_tol, (key, rel(v.grad, cpu[key].grad))


CUDA_TOL = {torch.float64: (1e-12, 1e-11), torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 5e-3),
            torch.bfloat16: (1.5e-2, 3e-2)}  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("forward", ["columns", "direct", "grouped_gemm"])
@pytest.mark.parametrize("dtype", list(CUDA_TOL))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cuda_matches_cpu(name, dtype, forward, monkeypatch):
    # Every forward of layers that are not depthwise (CUSTOMOPS_TEST_DEFORM_FORWARD forces the
    # columns or the direct kernel; CUSTOMOPS_TEST_DEFORM_GROUPED_GEMM=1 the columns of grouped
    # layers through one GEMM batched over the groups).
    _force_forward(monkeypatch, forward)
    _cuda_vs_cpu(_inputs(**CONFIGS[name]), dtype, *CUDA_TOL[dtype])


def _force_forward(monkeypatch, forward):
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", "columns" if forward == "grouped_gemm" else forward)
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_GROUPED_GEMM", "1" if forward == "grouped_gemm" else "0")


@needs_cuda
@pytest.mark.parametrize("gemm", ["rows_major", "nchw"])
@pytest.mark.parametrize("dtype", list(CUDA_TOL))
@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if 1 < c.get("groups", 2) < c.get("C", 6)])
def test_cuda_gemm_per_group_matches_cpu(name, dtype, gemm, monkeypatch):
    # The columns' GEMM per group (CUSTOMOPS_TEST_DEFORM_GEMM_PER_GROUP=1 forces it in any dtype;
    # IEEE float32 layers of long reductions on few tiles take it), into the rows-major buffer
    # and straight into NCHW, and the backward's grad_weight GEMM per group
    # (CUSTOMOPS_TEST_DEFORM_GRAD_WEIGHT_PER_GROUP=1, forced only).
    _force_forward(monkeypatch, "grouped_gemm" if gemm == "rows_major" else "columns")
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_GEMM_PER_GROUP", "1")
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_SPLIT_K", "0")  # which takes small float32 ones
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_GRAD_WEIGHT_PER_GROUP", "1")
    _cuda_vs_cpu(_inputs(**CONFIGS[name]), dtype, *CUDA_TOL[dtype])


# Sizes past one chunk (deform_conv2d_cuda.cu's budgets, 96 MB at these small C_out), through
# each of the forward's GEMM forms (one GEMM over the chunk's rows into a rows-major buffer;
# straight into NCHW where the output rows are 16-byte aligned, for 16-bit types or chunks of
# one image): several chunks of several whole images (float32, rows-major: 3 x 3; backward
# float32 3 x 3, 16-bit 5 + 4), the same into NCHW (16-bit 2 + 2 + 1; float32 one image per
# chunk), several chunks of one image's pixels (one group, and two groups: float32 4 or 5 per
# image, 16-bit 2), with output rows not aligned (rows-major runs of a multiple of 16 pixels
# and a shorter last run); depthwise, with several images per backward chunk and a smaller last
# chunk (float32: 4 + 3, 16-bit: 6 + 1); and offset groups of 2 channels (the column kernel's row
# blocks of a tap) over chunks of one image's pixels.
CUDA_CHUNK_CONFIGS = {
    "images_per_chunk": dict(B=9, C=256, H=48, W=48, C_out=24, groups=1, og=2),
    "images_per_chunk_into_nchw": dict(B=5, C=512, H=64, W=64, C_out=16, groups=1, og=1),
    "pixels_per_chunk": dict(B=2, C=256, H=160, W=160, C_out=16, groups=1, og=1),
    "unaligned_pixels_per_chunk": dict(B=2, C=256, H=157, W=161, C_out=16, groups=1, og=1),
    "groups_pixels_per_chunk": dict(B=1, C=512, H=112, W=112, C_out=8, groups=2, og=4),
    "narrow_offset_groups_pixels_per_chunk": dict(B=2, C=128, H=157, W=161, C_out=16, groups=1, og=64),
    "depthwise_8_per_thread": dict(B=2, C=24, H=33, W=31, C_out=24, groups=24, og=3),
    "depthwise_images_per_chunk": dict(B=7, C=128, H=48, W=48, C_out=128, groups=128, og=2),
}


# The grouped layers' batched GEMM (CUSTOMOPS_TEST_DEFORM_GROUPED_GEMM=1): chunks of several
# whole images (float32: 3 + 3 + 3 of 21 MB each with the rows-major buffer), runs of one
# image's pixels where an image passes the budget, and output rows not 16-byte aligned.
GROUPED_GEMM_CHUNK_CONFIGS = {
    "grouped_gemm_images_per_chunk": dict(B=9, C=256, H=48, W=48, C_out=24, groups=2, og=2),
    "grouped_gemm_pixels_per_chunk": dict(B=1, C=512, H=112, W=112, C_out=8, groups=2, og=4),
    "grouped_gemm_unaligned_rows": dict(B=3, C=96, H=13, W=15, C_out=48, groups=3, og=3),
}


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(CUDA_CHUNK_CONFIGS) + list(GROUPED_GEMM_CHUNK_CONFIGS))
def test_cuda_chunks_match_cpu(name, dtype, monkeypatch):
    _force_forward(monkeypatch, "grouped_gemm" if name in GROUPED_GEMM_CHUNK_CONFIGS else "columns")
    config = CUDA_CHUNK_CONFIGS.get(name) or GROUPED_GEMM_CHUNK_CONFIGS[name]
    _cuda_vs_cpu(_inputs(**config, scale=1.5), dtype, *CUDA_TOL[dtype])


# The thin transposes (one side under 32, the other not: in float32 and float64, tiles of the
# whole thin side through shared memory; in 16 bits, an element per thread): the weight's
# reorder to taps-major over several tiles of 448 channels and a shorter last one (600 x 9), the
# columns' reorder to the weight's order and back (4 pixels, 300 channels: 9 x 300 each way),
# 1 x 7 taps, few output channels (the rows-major GEMM's output and grad_out, 3 channels by 480
# pixels, with the bias added on the way), and the input's channels-last copy (5 channels by 480
# pixels).
THIN_TRANSPOSE_CONFIGS = {
    "weight_in_tiles": dict(B=1, C=600, H=3, W=4, C_out=8, groups=1, og=1),
    "columns_to_weight_order": dict(B=1, C=300, H=2, W=2, C_out=64, groups=1, og=3),
    "1x7_taps": dict(B=2, C=40, H=5, W=9, C_out=36, groups=1, og=1, k=(1, 7), pad=(0, 3)),
    "few_output_channels": dict(B=2, C=5, H=20, W=24, C_out=3, groups=1, og=1),
}


@needs_cuda
@pytest.mark.parametrize("forward", ["columns", "direct"])
@pytest.mark.parametrize("dtype", list(CUDA_TOL))
@pytest.mark.parametrize("name", list(THIN_TRANSPOSE_CONFIGS))
def test_cuda_thin_transposes_match_cpu(name, dtype, forward, monkeypatch):
    _force_forward(monkeypatch, forward)
    _cuda_vs_cpu(_inputs(**THIN_TRANSPOSE_CONFIGS[name]), dtype, *CUDA_TOL[dtype])


# The column kernel's taps per thread where a unit is one or two 16-byte items, which the GPU's
# size sets: forced (CUSTOMOPS_TEST_DEFORM_TAPS_PER_THREAD) to one, to slices of 2 and 4 taps
# with a shorter last one (49 and 9 taps), and to all taps. Units of 2 channels (one item), 8
# (float32: two items; float64: four, staged) and 16 (16-bit: two items).
TAPS_PER_THREAD_CONFIGS = {
    "narrow_offset_groups": CONFIGS["narrow_offset_groups"],
    "narrow_offset_groups_in_sets": CONFIGS["narrow_offset_groups_in_sets"],
    "units_of_8_channels": dict(B=2, C=32, H=6, W=7, C_out=8, groups=1, og=4),
    "units_of_16_channels": dict(B=2, C=32, H=5, W=6, C_out=8, groups=1, og=2),
    # Padding and dilation past float32's integers: a tap's base point must round once, as the
    # CPU's does (-2^24 - 1 + 2^24 + 2 is 1; rounded twice it is 2).
    "huge_padding_and_dilation": dict(
        B=1, C=4, H=8, W=5, C_out=2, groups=1, og=2, k=(2, 1), stride=(2**24, 1), pad=(2**24 + 1, 0), dil=(2**24 + 2, 1)
    ),
}


@needs_cuda
@pytest.mark.parametrize("taps_per_thread", ["1", "2", "4", "49"])
@pytest.mark.parametrize("dtype", list(CUDA_TOL))
@pytest.mark.parametrize("name", list(TAPS_PER_THREAD_CONFIGS))
def test_cuda_column_taps_per_thread(name, dtype, taps_per_thread, monkeypatch):
    _force_forward(monkeypatch, "columns")
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_TAPS_PER_THREAD", taps_per_thread)
    _cuda_vs_cpu(_inputs(**TAPS_PER_THREAD_CONFIGS[name]), dtype, *CUDA_TOL[dtype])


# The tiled depthwise forward: its tiling's edges, against the CPU kernel and bitwise against the
# direct kernel, its fallback (CUSTOMOPS_TEST_DEPTHWISE_DIRECT=1 forces it). One channel (a lane
# per pixel), tiles across images, several slices, a slice over several offset groups (12 channels
# each in 128-channel slices, in stages of fewer than 9 taps), 7x7 taps in stages, stride,
# dilation and no mask, and one channel per offset group.
DEPTHWISE_TILE_CONFIGS = {
    "3x3": dict(B=3, C=64, H=17, W=19, C_out=64, groups=64, og=1),
    "one_channel": dict(B=5, C=1, H=7, W=6, C_out=1, groups=1, og=1),
    "several_slices": dict(B=2, C=520, H=8, W=9, C_out=520, groups=520, og=1),
    "offset_groups_in_a_slice": dict(B=2, C=96, H=9, W=11, C_out=96, groups=96, og=8),
    "7x7_in_stages": dict(B=2, C=40, H=14, W=15, C_out=40, groups=40, og=2, k=(7, 7), pad=(3, 3)),
    "stride_dilation_no_mask": dict(
        B=2, C=24, H=13, W=12, C_out=24, groups=24, og=3, stride=(2, 1), dil=(1, 2), pad=(1, 2), mask=False
    ),
    "a_channel_per_offset_group": dict(B=2, C=7, H=10, W=9, C_out=7, groups=7, og=7),
}


@needs_cuda
@pytest.mark.parametrize("dtype", list(CUDA_TOL))
@pytest.mark.parametrize("name", list(DEPTHWISE_TILE_CONFIGS))
def test_cuda_depthwise_tiled_matches_cpu_and_the_direct_kernel(name, dtype, monkeypatch):
    kw = _inputs(**DEPTHWISE_TILE_CONFIGS[name], scale=1.5)
    _cuda_vs_cpu(kw, dtype, *CUDA_TOL[dtype])
    gpu = {k: (v.to(device="cuda", dtype=dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    tiled = _ran_kernel("deform_conv2d_depthwise_tile_kernel", customops.deform_conv2d, gpu)
    tiled_cl = customops.deform_conv2d(**dict(gpu, input=gpu["input"].to(memory_format=torch.channels_last)))
    monkeypatch.setenv("CUSTOMOPS_TEST_DEPTHWISE_DIRECT", "1")
    direct = _ran_kernel("deform_conv2d_depthwise_kernel", customops.deform_conv2d, gpu)
    # The same arithmetic in the same order as the direct kernel.
    torch.testing.assert_close(tiled, direct, atol=0, rtol=0)
    torch.testing.assert_close(tiled_cl, direct, atol=0, rtol=0)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", ["3x3", "several_slices", "offset_groups_in_a_slice", "7x7_in_stages", "7x7_odd"])
def test_cuda_depthwise_grad_weight_in_registers_or_shared_memory_matches_cpu(name, dtype):
    # The depthwise col2im sums grad_weight per thread in registers, each (pixel, tap) slot
    # keeping one tap, where at most 1/16 of a block's slots would idle (3x3) and the fixed-tap
    # kernel's registers leave it at least 7/8 of the threads; else by shared-memory atomics per
    # task (49 taps). 3x3 in float32 takes the registers (71 registers, 896 threads, in the builds
    # seen); in float16 (73 or fewer) it depends on the build. several_slices: a last slice of 8
    # of its 32 channels; offset_groups_in_a_slice: 12 channels per offset group, so that a
    # slice's threads sample different points. 7x7_odd: one channel a thread.
    odd = dict(B=2, C=3, H=9, W=10, C_out=3, groups=3, og=3, k=(7, 7), pad=(3, 3))
    kw = odd if name == "7x7_odd" else DEPTHWISE_TILE_CONFIGS[name]
    t, v = {torch.float32: "float", torch.float16: "c10::Half"}[dtype], 1 if name == "7x7_odd" else 4
    kernel = f"deform_conv2d_col2im_kernel<{t}, {v}, true, "  # <T, V, kDepthwise, kFixedK>
    if kw.get("k", (3, 3)) != (3, 3):
        kernel += "false>("
    elif dtype == torch.float32:
        kernel += "true>("
    _ran_kernel(kernel, lambda: _cuda_vs_cpu(_inputs(**kw, scale=1.5), dtype, *CUDA_TOL[dtype]), {})


@needs_cuda
def test_cuda_depthwise_direct_failed_launch_is_a_runtime_error_naming_it(monkeypatch):
    from customops.testing.paths import assert_launch_fails

    monkeypatch.setenv("CUSTOMOPS_TEST_DEPTHWISE_DIRECT", "1")  # inherited by the subprocess
    setup = "x, off, w = (torch.randn(*s, device='cuda') for s in ((1, 8, 5, 5), (1, 18, 5, 5), (8, 1, 3, 3)))"
    assert_launch_fails("deform_conv2d_depthwise_kernel", setup, "customops.deform_conv2d(x, off, w, padding=1)")


# The direct forward (deform_conv2d_direct_kernel), forced, at the edges of its tiling: 2, 4, 6 and
# 8 output channels per thread (a group of 2, 24, 48 and 100 outputs: two blocks of 64 with a
# short last one), slices of 32 channels and a shorter last (80 per group), offset groups of 20
# channels in 40-channel groups (stages end at offset groups), 3 channels per group across
# 2-channel offset groups (one channel per load), an offset group over two groups, 8-channel offset
# groups in 12-channel groups, several groups per block, blocks of 128 pixels across images, stride,
# dilation, no mask and no bias, 5x5 taps; images whose channels-last copies go in chunks (48 MB:
# float32 2 + 1 images, float64 one each).
DIRECT_CONFIGS = {
    "two_per_thread": dict(B=3, C=8, H=9, W=10, C_out=2, groups=1, og=1),
    "four_per_thread_groups": dict(B=2, C=32, H=11, W=13, C_out=48, groups=2, og=1),
    "six_per_thread": dict(B=5, C=48, H=12, W=12, C_out=48, groups=1, og=1),
    "two_blocks_of_channels": dict(B=2, C=16, H=7, W=9, C_out=100, groups=1, og=2),
    "slices": dict(B=2, C=160, H=6, W=7, C_out=16, groups=2, og=1),
    "offset_groups_in_a_group": dict(B=2, C=80, H=8, W=8, C_out=16, groups=2, og=4),
    "odd_channels": dict(B=2, C=6, H=7, W=8, C_out=4, groups=2, og=3),
    "an_offset_group_over_groups": dict(B=2, C=16, H=7, W=6, C_out=8, groups=4, og=2),
    "offset_groups_end_inside_slices": dict(B=2, C=24, H=6, W=9, C_out=6, groups=2, og=3),
    "stride_dilation_5x5_plain": dict(
        B=2,
        C=16,
        H=13,
        W=11,
        C_out=8,
        groups=1,
        og=2,
        k=(5, 5),
        stride=(2, 1),
        dil=(1, 2),
        pad=(2, 3),
        mask=False,
        bias=False,
    ),
    "images_in_chunks": dict(B=3, C=1024, H=72, W=72, C_out=8, groups=1, og=1),
    # Several groups per block (direct_tiling; float64's stages of 16 channels hold fewer): 4 groups of
    # 8 (float64: 2), 2 groups of 16 (float64: 1), 4 groups of 8 inputs and 4 outputs over 2 offset
    # groups (float64: 1), 8 groups of one input channel and 2 outputs.
    "groups_per_block": dict(B=2, C=32, H=9, W=10, C_out=32, groups=4, og=1),
    "two_groups_per_block": dict(B=3, C=64, H=7, W=6, C_out=64, groups=4, og=1),
    "groups_per_block_offset_groups": dict(B=2, C=64, H=7, W=9, C_out=32, groups=8, og=2),
    "groups_of_one_channel": dict(B=2, C=16, H=8, W=7, C_out=32, groups=16, og=1),
}


@needs_cuda
@pytest.mark.parametrize("dtype", list(CUDA_TOL))
@pytest.mark.parametrize("name", list(DIRECT_CONFIGS))
def test_cuda_direct_forward_matches_cpu(name, dtype, monkeypatch):
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", "direct")
    kw = _inputs(**DIRECT_CONFIGS[name], scale=1.5)
    _cuda_vs_cpu(kw, dtype, *CUDA_TOL[dtype])
    gpu = {k: (v.to(device="cuda", dtype=dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    out = _ran_kernel("deform_conv2d_direct_kernel", customops.deform_conv2d, gpu)
    # The kernel writes either layout from the same sums.
    out_cl = customops.deform_conv2d(**dict(gpu, input=gpu["input"].to(memory_format=torch.channels_last)))
    assert out_cl.is_contiguous(memory_format=torch.channels_last) or out_cl.shape[2:] == (1, 1)
    torch.testing.assert_close(out_cl, out, atol=0, rtol=0)


@needs_cuda
def test_cuda_direct_failed_launch_is_a_runtime_error_naming_it(monkeypatch):
    from customops.testing.paths import assert_launch_fails

    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", "direct")  # inherited by the subprocess
    setup = "x, off, w = (torch.randn(*s, device='cuda') for s in ((1, 8, 5, 5), (1, 18, 5, 5), (4, 8, 3, 3)))"
    assert_launch_fails("deform_conv2d_direct_kernel", setup, "customops.deform_conv2d(x, off, w, padding=1)")


# The default dispatch (direct_forward): the direct kernel for grouped layers of at most 32 output
# channels per group in IEEE float32, 16 in TF32 (several groups a block), and in 16 bits one input
# channel and at most 4 outputs per group, with the blocks' slots at least half used and 4 blocks
# per SM; the columns elsewhere. `blocks`: the direct kernel's grid, over 4 per SM (the H100's and
# H200's 132 SMs) where the row expects the columns for another reason.
@needs_cuda
@pytest.mark.parametrize(
    "dtype, tf32, C_out, groups, B, blocks, kernel",
    [
        (torch.float32, False, 128, 4, 32, 1024, "deform_conv2d_direct_kernel"),  # 32 per group
        (torch.float32, False, 32, 4, 64, 1024, "deform_conv2d_direct_kernel"),  # 8 per group, 2 a block
        (torch.float32, True, 32, 4, 64, 1024, "deform_conv2d_direct_kernel"),  # TF32, 8 per group
        (torch.float16, False, 128, 64, 16, 1024, "deform_conv2d_direct_kernel"),  # 2 per group, 8 a block
        (torch.float32, True, 128, 4, 32, 1024, "deform_conv2d_im2col"),  # TF32, 32 per group
        (torch.float32, True, 32, 2, 64, 1024, "deform_conv2d_im2col"),  # TF32, 16 per group, one a block
        (torch.float32, False, 256, 4, 32, 1024, "deform_conv2d_im2col"),  # 64 per group
        (torch.float32, False, 16, 4, 32, 1024, "deform_conv2d_im2col"),  # 4 per group, one a block
        (torch.float32, False, 16, 1, 128, 1024, "deform_conv2d_im2col"),  # one group
        (torch.float32, False, 128, 4, 1, 32, "deform_conv2d_im2col"),  # one image: 32 blocks
        (torch.float16, False, 64, 16, 64, 1024, "deform_conv2d_im2col"),  # 4 per group, 4 inputs
        (torch.float16, False, 128, 4, 32, 1024, "deform_conv2d_im2col"),  # tensor cores
        (torch.bfloat16, False, 128, 4, 32, 1024, "deform_conv2d_im2col"),
        (torch.float64, False, 128, 4, 32, 1024, "deform_conv2d_im2col"),
    ],
)
def test_cuda_default_forward_takes_the_direct_kernel_where_it_wins(
    dtype, tf32, C_out, groups, B, blocks, kernel, monkeypatch
):
    monkeypatch.delenv("CUSTOMOPS_TEST_DEFORM_FORWARD", raising=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if "direct" in kernel and blocks < 4 * sms:
        pytest.skip(f"the layer has fewer than 4 blocks of the direct kernel per SM of this GPU's {sms}")
    kw = _inputs(B=B, C=64, H=32, W=32, C_out=C_out, groups=groups, og=1, scale=1.5)
    gpu = {k: (v.to(device="cuda", dtype=dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    _ran_kernel(kernel, customops.deform_conv2d, gpu)


def _kernel_names(fn, kwargs):
    """fn(**kwargs) under torch.profiler: its result and the names of the CUDA kernels it ran,
    in order, or None under compute-sanitizer (scripts/sanitize.sh sets the variable), where
    the profiler sees no kernel at all: the tool holds CUPTI."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn(**kwargs)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return out, (None if not names and os.environ.get("CUSTOMOPS_UNDER_SANITIZER") == "1" else names)


def _ran_kernel(kernel, fn, kwargs):
    """fn(**kwargs) under torch.profiler; asserts that a CUDA kernel whose name contains
    ``kernel`` ran, and returns fn's result."""
    out, names = _kernel_names(fn, kwargs)
    if names is not None:
        assert any(kernel in n for n in names), f"{kernel} did not run: {sorted(set(names))}"
    return out


# Where IEEE float32 runs a GEMM per group instead of one batched over the groups, the default
# runs what the test hook's =1 forces (more cuBLAS launches than the batched GEMM); with TF32
# allowed, what =0 forces. The forward's columns GEMM (gemm_per_group) at 1x512x7x7 -> 512 in 2
# groups: 4 tiles of 128 x 128 and a reduction of 2304 per group; the backward's grad_weight GEMM
# (grad_weight_per_group) at 16x32x56x38 -> 64 in 2 groups, DCNv1: 4 tiles, each a reduction over
# 34048 rows.
PER_GROUP_RULES = {
    "forward": ("CUSTOMOPS_TEST_DEFORM_GEMM_PER_GROUP", dict(B=1, C=512, H=7, W=7, C_out=512, groups=2, og=1)),
    "grad_weight": (
        "CUSTOMOPS_TEST_DEFORM_GRAD_WEIGHT_PER_GROUP",
        dict(B=16, C=32, H=56, W=38, C_out=64, groups=2, og=1, mask=False),
    ),
}


@needs_cuda
@pytest.mark.parametrize("gemm", list(PER_GROUP_RULES))
def test_cuda_gemm_per_group_only_where_its_rule_says(gemm, monkeypatch):
    var, config = PER_GROUP_RULES[gemm]
    backward = gemm == "grad_weight"
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_SPLIT_K", "0")  # which would take the forward's GEMM
    kw = _inputs(**config, dtype=torch.float32)
    gpu = {k: (v.cuda().requires_grad_(backward) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}

    def step(**kwargs):
        out = customops.deform_conv2d(**kwargs)
        if backward:
            out.sum().backward()

    def kernels(setting, tf32):
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
        if setting is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, setting)
        step(**gpu)  # cuBLAS's first call may launch kernels of its own
        return _kernel_names(step, gpu)[1]

    ran = {(s, tf32): kernels(s, tf32) for s in (None, "0", "1") for tf32 in (False, True)}
    if any(v is None for v in ran.values()):
        return
    assert ran[(None, False)] == ran[("1", False)] and len(ran[(None, False)]) > len(ran[("0", False)]), ran
    assert ran[(None, True)] == ran[("0", True)], ran


@needs_cuda
@pytest.mark.parametrize("C_out", [128, 32], ids=["a_group_a_block", "two_groups_a_block"])
def test_cuda_direct_float32_takes_its_bounded_build_past_one_wave(C_out, monkeypatch):
    # float32: a grid that one wave of the direct kernel holds (one image: 32 or 16 blocks) runs its
    # build of unbounded registers, a larger one (32 images: 1024 or 512 blocks) the build bounded
    # to 3 blocks per SM, where that build fits more blocks per SM (the H100's and H200's sm_90);
    # both against the CPU, with a group a block (32 outputs per group) and two (8).
    if torch.cuda.get_device_properties(0).multi_processor_count < 16:
        pytest.skip("one wave of the unbounded build holds fewer than 32 blocks on this GPU")
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", "direct")
    names = {}
    for B in (1, 32):
        kw = _inputs(B=B, C=64, H=32, W=32, C_out=C_out, groups=4, og=1, scale=1.5, dtype=torch.float32)
        _cuda_vs_cpu(kw, torch.float32, *CUDA_TOL[torch.float32])
        gpu = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        _, ran = _kernel_names(customops.deform_conv2d, gpu)
        names[B] = ran and {n for n in ran if "deform_conv2d_direct_kernel" in n}
    if names[1] is not None:
        assert len(names[1]) == 1 and len(names[32]) == 1 and names[1] != names[32], names


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("grad_format", [torch.contiguous_format, torch.channels_last])
def test_cuda_grouped_layer_of_several_images_takes_one_gemm(dtype, grad_format, monkeypatch):
    # grouped_gemm: by default the columns of a grouped layer's 4 images go through one GEMM
    # batched over the groups, forward and backward; forced off, a GEMM per image
    # (test_cuda_matches_cpu checks the values of both, and the channels_last test those of a
    # channels_last grad_out).
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", "columns")
    kw = _inputs(B=4, C=64, H=16, W=16, C_out=64, groups=4, og=1, dtype=dtype)
    gpu = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    grad = torch.randn(4, 64, 16, 16, device="cuda", dtype=dtype).contiguous(memory_format=grad_format)

    def backward(**kw):
        leaves = {k: v.detach().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        out = customops.deform_conv2d(**leaves)
        torch.cuda.synchronize()
        _, ran = _kernel_names(lambda: out.backward(grad), {})
        return ran

    gemms = {}
    for setting in (None, "0"):
        if setting is None:
            monkeypatch.delenv("CUSTOMOPS_TEST_DEFORM_GROUPED_GEMM", raising=False)
        else:
            monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_GROUPED_GEMM", setting)
        _, ran = _kernel_names(customops.deform_conv2d, gpu)
        ran_backward = backward(**gpu)
        if ran is None or ran_backward is None:
            return
        gemms[setting] = [n for n in ran if "deform_conv2d" not in n]  # cuBLAS's
        # cuBLAS's GEMMs (nvjet, xmma or cutlass kernels; not torch's reductions and copies)
        gemms[(setting, "backward")] = [n for n in ran_backward if re.search("gemm|nvjet|xmma|cutlass", n, re.I)]
    assert len(gemms["0"]) >= 4 and len(gemms[None]) < len(gemms["0"]), gemms
    # Per image: 2 GEMMs each; whole images: 2 in all (and any split-K parts).
    assert len(gemms[("0", "backward")]) >= 8 and len(gemms[(None, "backward")]) <= 4, gemms


@needs_cuda
@pytest.mark.parametrize("direct", ["0", "1"])
def test_cuda_depthwise_with_a_weight_at_any_offset(direct, monkeypatch):
    # One tap: the (taps, C) weight the kernels read is a view of the caller's, here 4 bytes
    # past a 16-byte boundary; the kernels' vector loads need an aligned copy. The backward
    # (col2im) is the same for both forwards.
    monkeypatch.setenv("CUSTOMOPS_TEST_DEPTHWISE_DIRECT", direct)
    kw = _inputs(B=2, C=8, H=6, W=7, C_out=8, groups=8, og=1, k=(1, 1), pad=(0, 0), dtype=torch.float32)
    cpu = {k: (v.double().requires_grad_() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    gpu = {k: (v.cuda().requires_grad_() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    buf = torch.zeros(9, device="cuda")
    buf[1:] = kw["weight"].flatten().cuda()
    gpu["weight"] = buf[1:].view(8, 1, 1, 1).requires_grad_()
    assert gpu["weight"].data_ptr() % 16 == 4
    kernel = "deform_conv2d_depthwise_kernel" if direct == "1" else "deform_conv2d_depthwise_tile_kernel"
    ref, out = customops.deform_conv2d(**cpu), _ran_kernel(kernel, customops.deform_conv2d, gpu)
    torch.testing.assert_close(out.double().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    grad = torch.randn(ref.shape, dtype=torch.float64)
    ref.backward(grad)
    out.backward(grad.float().cuda())
    for key in ("input", "offset", "weight", "mask"):
        torch.testing.assert_close(gpu[key].grad.double().cpu(), cpu[key].grad, rtol=1e-4, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("forward", ["columns", "direct"])
def test_cuda_channels_last_and_strided_inputs_give_the_same_result(forward, monkeypatch):
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", forward)
    kw = {k: (v.cuda().float() if isinstance(v, torch.Tensor) else v) for k, v in _inputs(B=2, C=16, H=12, W=10,
          C_out=8, groups=1, og=2).items()}  # fmt: skip
    out = customops.deform_conv2d(**kw)
    cl = dict(kw, input=kw["input"].to(memory_format=torch.channels_last))
    strided = dict(kw, offset=kw["offset"].transpose(2, 3).contiguous().transpose(2, 3))
    res = customops.deform_conv2d(**strided)
    assert res.is_contiguous()
    torch.testing.assert_close(res, out, atol=0, rtol=0)
    res = customops.deform_conv2d(**cl)  # columns: another GEMM, rows-major, straight into the output
    assert res.is_contiguous(memory_format=torch.channels_last) and not res.is_contiguous()
    torch.testing.assert_close(res, out, atol=1e-5, rtol=1e-5)


# A channels_last output of one group in 16 bits takes cuBLASLt's bias epilogue where every
# chunk's output fills a wave of 128 x 128 tiles (256 here, 8 at the small size), and the bias
# pass (deform_conv2d_bias_kernel) elsewhere: both against the CPU kernel in float64.
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("H, epilogue", [(128, True), (32, False)], ids=["a_wave_of_tiles", "fewer"])
def test_cuda_channels_last_16_bit_bias_in_the_gemm_or_a_pass(dtype, H, epilogue, monkeypatch):
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", "columns")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if epilogue and 2 * H * H // 128 < sms:
        pytest.skip(f"the layer's output has fewer 128 x 128 tiles than this GPU's {sms} SMs")
    kw = _inputs(B=2, C=8, H=H, W=H, C_out=8, groups=1, og=1, scale=1.5)
    kw = dict(kw, offset=(kw["offset"] * 256).round() / 256)  # exact sampling positions in float32
    kw = {k: (v.to(dtype).double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ref = customops.deform_conv2d(**kw)
    gpu = {k: (v.to(device="cuda", dtype=dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    gpu["input"] = gpu["input"].to(memory_format=torch.channels_last)
    out, names = _kernel_names(customops.deform_conv2d, gpu)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    if names is not None:
        assert any("deform_conv2d_im2col" in n for n in names), sorted(set(names))
        assert any("deform_conv2d_bias_kernel" in n for n in names) != epilogue, sorted(set(names))
    rel = ((out.double().cpu() - ref).norm() / ref.norm()).item()
    assert rel < CUDA_TOL[dtype][0], rel


# The split-K GEMM of float32 layers (split_k_forward; CUSTOMOPS_TEST_DEFORM_SPLIT_K=1 forces it):
# one and several 64 x 64 tiles of rows and of outputs, rows and reductions that are not
# multiples of 4 (padded partials, scalar loads: 45 values), groups whose outputs end inside a
# tile, the weight in its own order, DCNv1 without a bias, several images a chunk, several chunks
# of whole images and of one image's pixels (unaligned runs), NCHW and channels_last outputs,
# against the CPU kernel in float64.
SPLIT_K_CONFIGS = {
    **{n: CONFIGS[n] for n in ("dcnv2_groups_offset_groups", "dcnv1_stride_dilation", "weight_order_one_group",
                               "weight_order_images_groups", "groups_long_reduction", "depthwise_multiplier_2")},
    "tiles_of_rows_and_outputs": dict(B=2, C=32, H=9, W=10, C_out=130, groups=1, og=1),
    "odd_reduction_no_bias": dict(B=1, C=5, H=7, W=7, C_out=70, groups=1, og=1, bias=False),
    "groups_across_tiles": dict(B=3, C=64, H=5, W=5, C_out=100, groups=2, og=2),
    "images_per_chunk": CUDA_CHUNK_CONFIGS["images_per_chunk"],
    "unaligned_pixels_per_chunk": CUDA_CHUNK_CONFIGS["unaligned_pixels_per_chunk"],
}  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("name", list(SPLIT_K_CONFIGS))
def test_cuda_split_k_gemm_matches_cpu(name, layout, monkeypatch):
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", "columns")
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_SPLIT_K", "1")
    kw = _inputs(**SPLIT_K_CONFIGS[name], scale=1.5)
    kw = dict(kw, offset=(kw["offset"] * 256).round() / 256)  # exact sampling positions in float32
    kw = {k: (v.float().double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ref = customops.deform_conv2d(**kw)
    gpu = {k: (v.to(device="cuda", dtype=torch.float32) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    if layout == "channels_last":
        gpu["input"] = gpu["input"].to(memory_format=torch.channels_last)
    out = _ran_kernel("deform_conv2d_split_k_sum_kernel", customops.deform_conv2d, gpu)
    assert out.is_contiguous(
        memory_format=torch.channels_last if layout == "channels_last" else torch.contiguous_format
    )
    rel = ((out.double().cpu() - ref).norm() / ref.norm()).item()
    assert rel < CUDA_TOL[torch.float32][0], rel
    if layout == "nchw":  # the backward does not change; it runs after the split-K forward
        _cuda_vs_cpu(_inputs(**SPLIT_K_CONFIGS[name]), torch.float32, *CUDA_TOL[torch.float32])


@needs_cuda
@pytest.mark.parametrize("dtype", list(CUDA_TOL))
@pytest.mark.parametrize(
    "name", ["weight_order_one_group", "weight_order_aligned_rows", "weight_order_7x7", "weight_order_images"]
)
def test_cuda_nn_gemm_matches_cpu(name, dtype, monkeypatch):
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", "columns")
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_NN_GEMM", "1")
    config = CONFIGS.get(name) or dict(B=2, C=64, H=3, W=3, C_out=64, groups=1, og=1)
    _cuda_vs_cpu(_inputs(**config), dtype, *CUDA_TOL[dtype])


# The default dispatch (split_k_forward): the split-K GEMM for IEEE float32 grouped layers where a
# GEMM per group would run, up to 2^27 multiply-adds per group over a chunk of whole images;
# cuBLAS with one group, with TF32, in 16 bits and past that size.
@needs_cuda
@pytest.mark.parametrize(
    "dtype, tf32, config, split_k",
    [
        (torch.float32, False, dict(B=1, C=512, H=7, W=7, C_out=512, groups=2), True),  # 49 x 2304 x 256 a group
        (torch.float32, False, dict(B=2, C=512, H=7, W=7, C_out=512, groups=2), True),
        (torch.float32, True, dict(B=1, C=512, H=7, W=7, C_out=512, groups=2), False),
        (torch.float16, False, dict(B=1, C=512, H=7, W=7, C_out=512, groups=2), False),
        (torch.float32, False, dict(B=8, C=512, H=7, W=7, C_out=512, groups=2), False),  # 2.3e8 a group
        (torch.float32, False, dict(B=1, C=256, H=14, W=14, C_out=256, groups=1), False),  # one group
        (torch.float32, False, dict(B=2, C=256, H=8, W=8, C_out=256, groups=4), False),  # batched over groups
    ],
)
def test_cuda_split_k_only_where_its_rule_says(dtype, tf32, config, split_k, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in _inputs(**config, og=1, dtype=dtype).items()}
    names = _kernel_names(customops.deform_conv2d, kw)[1]
    if names is not None:
        assert any("deform_conv2d_split_k_gemm_kernel" in n for n in names) == split_k, sorted(set(names))


@needs_cuda
@pytest.mark.parametrize("kernel", ["deform_conv2d_split_k_gemm_kernel", "deform_conv2d_split_k_sum_kernel"])
def test_cuda_split_k_failed_launch_is_a_runtime_error_naming_it(kernel, monkeypatch):
    from customops.testing.paths import assert_launch_fails

    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_SPLIT_K", "1")  # inherited by the subprocess
    setup = "x, off, w = (torch.randn(*s, device='cuda') for s in ((1, 64, 5, 5), (1, 18, 5, 5), (128, 64, 3, 3)))"
    assert_launch_fails(kernel, setup, "customops.deform_conv2d(x, off, w, padding=1)")


@needs_cuda
@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_matches_torchvision_at_a_network_size(dtype):
    kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in _inputs(B=2, C=64, H=24, W=20, C_out=32,
          groups=1, og=1, dtype=dtype).items()}  # fmt: skip
    ours = customops.deform_conv2d(**kw).double()
    theirs = tvops.deform_conv2d(**{k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    rel = ((ours - theirs.double()).norm() / theirs.double().norm()).item()
    assert rel < (1e-5 if dtype == torch.float32 else 2e-3), rel


@needs_cuda
@pytest.mark.parametrize("forward", ["columns", "direct"])
def test_cuda_64_bit_indexing(forward, monkeypatch):
    monkeypatch.setenv("CUSTOMOPS_TEST_DEFORM_FORWARD", forward)
    # input.numel() > 2**31 (fp16, 4.4 GB): the last channels' samples sit past int32 offsets.
    # The output is linear in the channels, so it equals the sum of the two halves' outputs,
    # each under 2**31 elements; so are the gradients of each half's input.
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs a GPU with 40 GB of memory")
    B, C, H, W = 1, 2048, 1024, 1040
    assert B * C * H * W > 2**31
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, C, H, W, device="cuda", dtype=torch.float16, generator=g)
    w = torch.randn(3, C, 1, 1, device="cuda", dtype=torch.float16, generator=g) / C**0.5
    H_out, W_out = (H - 1) // 64 + 1, (W - 1) // 64 + 1
    off = torch.randn(B, 2, H_out, W_out, device="cuda", dtype=torch.float16, generator=g) * 4
    mask = torch.rand(B, 1, H_out, W_out, device="cuda", dtype=torch.float16, generator=g)
    args = dict(stride=64, padding=0, dilation=1)
    xr = x.requires_grad_()
    out = customops.deform_conv2d(xr, off, w, mask=mask, **args)
    grad = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, xr, grad)
    half = C // 2
    for sl in (slice(0, half), slice(half, C)):
        xs = x.detach()[:, sl].contiguous().requires_grad_()
        part = customops.deform_conv2d(xs, off, w[:, sl].contiguous(), mask=mask, **args)
        (gxs,) = torch.autograd.grad(part, xs, grad)
        torch.testing.assert_close(gx[:, sl], gxs, atol=1e-3, rtol=1e-3)
        del xs, gxs
        if sl.start == 0:
            total = part.float()
        else:
            total += part.float()
    torch.testing.assert_close(out.float(), total, atol=2e-2, rtol=2e-2)
