"""One :class:`OpSpec` per public op. Adding an entry to ``OP_SPECS`` enrolls the op in every
path of tests/test_conformance.py (eager CPU/CUDA, gradcheck, opcheck, torch.compile,
torch.export, AOTInductor and TorchScript from Python and from C++, ONNX) and in
``python -m customops.doctor``. See docs/adding_an_op.md."""

import torch
import torch.nn.functional as F

from .spec import ErrorInput, OpSpec, SampleInput, make_tensor

# Shapes and layouts for elementwise ops: odd sizes, 0-d, empty, every layout.
ELEMENTWISE_CASES = [
    # (name, shape, layout)
    ("2d", (5, 7), "contiguous"),
    ("1d_odd_unaligned", (1029,), "offset"),  # vector loop, then a tail; not 16-byte aligned
    ("large", (257, 131), "contiguous"),  # more than one CPU thread's chunk (32768 elements)
    ("transposed", (6, 4), "transposed"),
    ("strided", (4, 9), "strided"),
    ("padded", (3, 5), "padded"),
    ("channels_last", (2, 3, 4, 5), "channels_last"),
    ("0d", (), "contiguous"),
    ("empty", (0, 5), "contiguous"),
]


def _devices(device):
    """(this device, another) as the messages name them, for mixed-device calls: on CUDA
    ('cuda:0', 'cpu'); on the CPU ('cpu', 'meta'), whose meta tensor takes the call to the fake
    kernel (the op's meta kernel), which must refuse it as the kernels do."""
    return str(torch.empty(0, device=device).device), "cpu" if device == "cuda" else "meta"


def elementwise_errors(first, second):
    """Error inputs of an op on two tensors of one shape, dtype and device (``first``,
    ``second``: their argument names)."""

    def errors(device):
        x = torch.randn(4, 8, device=device)
        yield ErrorInput(SampleInput((x.int(), x)), first, ("floating dtype", "torch.int32"))
        yield ErrorInput(SampleInput((x.long(), x.long())), first, ("torch.int64",))
        yield ErrorInput(SampleInput((x.to(torch.uint16), x)), first, ("torch.uint16",))
        yield ErrorInput(SampleInput((x.to(torch.float8_e4m3fn), x)), first, ("torch.float8_e4m3fn",))
        yield ErrorInput(SampleInput((x, x.bool())), second, ("floating dtype", "torch.bool"))
        yield ErrorInput(SampleInput((x, x.double())), second, (f"dtype of {first}", "torch.float32", "torch.float64"))
        yield ErrorInput(SampleInput((x, x[:2])), second, (f"shape of {first}", "[4, 8]", "[2, 8]"), fake_refuses=True)
        yield ErrorInput(SampleInput((x, x[0])), second, (f"shape of {first}", "[8]"), fake_refuses=True)
        d, o = _devices(device)
        yield ErrorInput(SampleInput((x, x.to(o))), second, (f"device of {first} ({d})", f"but got {o}"))
        yield ErrorInput(SampleInput((x.to(o), x)), second, (f"device of {first} ({o})", f"but got {d}"))

    return errors


# --- add -------------------------------------------------------------------------------------


def add_samples(device, dtype, requires_grad):
    def t(shape, layout):
        return make_tensor(shape, device, dtype, layout, requires_grad)

    for name, shape, layout in ELEMENTWISE_CASES:
        yield SampleInput((t(shape, layout), t(shape, layout)), name=name)
    yield SampleInput((t((6, 4), "transposed"), t((6, 4), "contiguous")), name="mixed_layouts")


ADD = OpSpec(
    name="add",
    sample_inputs=add_samples,
    reference=torch.add,
    error_inputs=elementwise_errors("a", "b"),
    cuda_kernels={"add_kernel": "2d"},
)


# --- sigmoid and sigmoid_backward ------------------------------------------------------------


def sigmoid_samples(device, dtype, requires_grad):
    for name, shape, layout in ELEMENTWISE_CASES:
        # Scaled by 4: the tails, where sigmoid saturates, are sampled too.
        yield SampleInput((make_tensor(shape, device, dtype, layout, requires_grad, scale=4),), name=name)


def sigmoid_backward_samples(device, dtype, requires_grad):
    for name, shape, layout in ELEMENTWISE_CASES:
        grad_out = make_tensor(shape, device, dtype, layout, requires_grad)
        y = make_tensor(shape, device, dtype, "contiguous", requires_grad, uniform=True)  # an output of sigmoid
        yield SampleInput((grad_out, y), name=name)


def sigmoid_errors(device):
    x = torch.randn(4, 8, device=device)
    yield ErrorInput(SampleInput((x.int(),)), "x", ("floating dtype", "torch.int32"))
    yield ErrorInput(SampleInput((x.to(torch.float8_e4m3fn),)), "x", ("torch.float8_e4m3fn",))


SIGMOID = OpSpec(
    name="sigmoid",
    sample_inputs=sigmoid_samples,
    reference=torch.sigmoid,
    error_inputs=sigmoid_errors,
    cuda_kernels={"sigmoid_kernel": "2d"},
)

SIGMOID_BACKWARD = OpSpec(
    name="sigmoid_backward",
    sample_inputs=sigmoid_backward_samples,
    reference=lambda grad_out, y: grad_out * y * (1 - y),
    error_inputs=elementwise_errors("grad_out", "y"),
    cuda_kernels={"sigmoid_backward_kernel": "2d"},
    unsupported={"onnx": "no ONNX translation: a backward op, absent from inference graphs"},
)


# --- fused_linear_sigmoid and its backward ---------------------------------------------------


def fused_linear_sigmoid_samples(device, dtype, requires_grad):
    def t(shape, layout="contiguous"):
        return make_tensor(shape, device, dtype, layout, requires_grad)

    M, K, N = 7, 12, 5
    yield SampleInput((t((M, K)), t((N, K)), t((N,))), name="2d")
    yield SampleInput((t((M, K), "transposed"), t((N, K)), t((N,), "strided")), name="x_transposed")
    yield SampleInput((t((M, K), "padded"), t((N, K)), None), name="x_padded_no_bias")
    yield SampleInput((t((M, K), "offset"), t((N, K), "transposed"), t((N,))), name="weight_transposed")
    yield SampleInput((t((2, 3, K)), t((N, K))), {"bias": t((N,))}, name="3d_bias_kwarg")
    yield SampleInput((t((2, 3, K), "transposed"), t((N, K)), None), name="3d_permuted_no_bias")
    yield SampleInput((t((K,)), t((N, K)), t((N,))), name="1d")
    yield SampleInput((t((0, K)), t((N, K)), t((N,))), name="empty_batch")
    yield SampleInput((t((4, 0)), t((3, 0)), t((3,))), name="zero_in_features")  # sigmoid(bias) per row
    yield SampleInput((t((4, 5)), t((0, 5)), t((0,))), name="zero_out_features")
    yield SampleInput((t((4, 0)), t((0, 0)), None), name="zero_features")


def fused_linear_sigmoid_backward_samples(device, dtype, requires_grad):
    def t(shape, layout="contiguous", uniform=False):
        return make_tensor(shape, device, dtype, layout, requires_grad, uniform=uniform)

    K, N = 6, 4
    for name, x_shape, layout, mask in [
        ("2d", (5, K), "contiguous", [True, True, True]),
        ("3d_x_transposed", (2, 3, K), "transposed", [True, True, True]),
        ("grad_x_only", (5, K), "padded", [True, False, False]),
        ("no_grad_x", (5, K), "contiguous", [False, True, True]),
        ("1d", (K,), "contiguous", [True, True, False]),
        ("empty_batch", (0, K), "contiguous", [True, True, True]),
    ]:
        y_shape = (*x_shape[:-1], N)
        grad_out, y = t(y_shape, "strided" if y_shape[0] > 0 else "contiguous"), t(y_shape, uniform=True)
        yield SampleInput((grad_out, t(x_shape, layout), t((N, K)), y, mask), name=name)


def fused_linear_sigmoid_backward_reference(grad_out, x, weight, y, output_mask):
    # sigmoid'(z) = y (1 - y); the rows are every dim of x but the last.
    grad_z = (grad_out * y * (1 - y)).reshape(-1, weight.shape[0])
    x2 = x.reshape(-1, weight.shape[1])
    empty = x.new_empty(0)
    return (
        (grad_z @ weight).reshape(x.shape) if output_mask[0] else empty,
        grad_z.t() @ x2 if output_mask[1] else empty,
        grad_z.sum(0) if output_mask[2] else empty,
    )


def fused_linear_sigmoid_errors(device):
    x, w, b = torch.randn(4, 8, device=device), torch.randn(3, 8, device=device), torch.randn(3, device=device)
    yield ErrorInput(SampleInput((x.int(), w, b)), "x", ("floating dtype", "torch.int32"))
    yield ErrorInput(SampleInput((x.to(torch.uint16), w, b)), "x", ("torch.uint16",))
    yield ErrorInput(SampleInput((x, w.bool(), b)), "weight", ("floating dtype", "torch.bool"))
    yield ErrorInput(SampleInput((x, w.double(), b)), "weight", ("dtype of x", "torch.float32", "torch.float64"))
    yield ErrorInput(SampleInput((x, w, b.half())), "bias", ("dtype of x", "torch.float16"))
    yield ErrorInput(
        SampleInput((torch.randn(4, 5, device=device), w, b)),
        "x.shape[-1]",
        ("in_features", "weight.shape[1] = 8", "[4, 5]"),
        fake_refuses=True,
    )
    yield ErrorInput(SampleInput((x, w[0], b)), "weight", ("2-D", "[8]"), fake_refuses=True)
    yield ErrorInput(
        SampleInput((x, w, torch.randn(4, device=device))), "bias", ("(out_features,) = (3,)", "[4]"), fake_refuses=True
    )
    yield ErrorInput(SampleInput((x, w, b[None])), "bias", ("(out_features,) = (3,)", "[1, 3]"), fake_refuses=True)
    yield ErrorInput(SampleInput((torch.randn((), device=device), w, b)), "x", ("0-dimensional",), fake_refuses=True)
    d, o = _devices(device)
    yield ErrorInput(SampleInput((x, w.to(o), None)), "weight", (f"device of x ({d})", f"but got {o}"))
    yield ErrorInput(SampleInput((x.to(o), w, None)), "weight", (f"device of x ({o})", f"but got {d}"))
    yield ErrorInput(SampleInput((x, w, b.to(o))), "bias", (f"device of x ({d})", f"but got {o}"))


def fused_linear_sigmoid_backward_errors(device):
    x, w = torch.randn(4, 8, device=device), torch.randn(3, 8, device=device)
    y = torch.rand(4, 3, device=device)
    mask = [True, True, True]
    yield ErrorInput(SampleInput((y, x, w, y[:2], mask)), "y", ("shape of grad_out",), fake_refuses=True)
    yield ErrorInput(SampleInput((y[:2], x, w, y[:2], mask)), "y", ("shape [4, 3]", "[2, 3]"), fake_refuses=True)
    yield ErrorInput(SampleInput((y, x, w, y.double(), mask)), "y", ("dtype of grad_out",))
    yield ErrorInput(SampleInput((y, x, w[:, :5], y, mask)), "x.shape[-1]", ("weight.shape[1] = 5",), fake_refuses=True)
    d, o = _devices(device)
    yield ErrorInput(SampleInput((y.to(o), x, w, y, mask)), "y", (f"device of grad_out ({o})", f"but got {d}"))


FUSED_LINEAR_SIGMOID = OpSpec(
    name="fused_linear_sigmoid",
    sample_inputs=fused_linear_sigmoid_samples,
    reference=lambda x, weight, bias=None: torch.sigmoid(F.linear(x, weight, bias)),
    error_inputs=fused_linear_sigmoid_errors,
    # The GEMM is cuBLAS's or CUTLASS's; the small-M kernel runs on sm_90 in bfloat16 and
    # float16 only (tests/test_cuda_kernels.py checks its launch errors).
)

FUSED_LINEAR_SIGMOID_BACKWARD = OpSpec(
    name="fused_linear_sigmoid_backward",
    sample_inputs=fused_linear_sigmoid_backward_samples,
    reference=fused_linear_sigmoid_backward_reference,
    error_inputs=fused_linear_sigmoid_backward_errors,
    cuda_kernels={"sigmoid_backward_colsum_kernel": "2d"},
    unsupported={"onnx": "no ONNX translation: a backward op, absent from inference graphs"},
)


# --- sigmoid_focal_loss and its backward -----------------------------------------------------


def sigmoid_focal_loss_reference(inputs, targets, alpha=0.25, gamma=2.0, reduction="none"):
    """torchvision.ops.sigmoid_focal_loss (torchvision/ops/focal_loss.py, Lin et al. 2017), op
    for op apart from its logging call and error message: the composite a user would otherwise
    write, and the reference the tests and benchmarks hold the op to."""
    p = torch.sigmoid(inputs)
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    raise ValueError(reduction)


# (name, shape, layout, alpha, gamma, reduction): every reduction, every layout, and the
# (alpha, gamma) pairs that take different branches: the defaults, no weighting (alpha < 0),
# weighted BCE (gamma = 0), gamma = 1, fractional gamma below and above 1.
FOCAL_CASES = [
    ("2d", (5, 7), "contiguous", 0.25, 2.0, "none"),  # first sample: the one exported
    ("transposed_mean", (6, 4), "transposed", 0.5, 1.0, "mean"),
    ("strided_sum", (4, 9), "strided", 0.25, 2.0, "sum"),
    ("no_alpha_gamma0", (1029,), "offset", -1.0, 0.0, "none"),  # vector loop, tail, unaligned
    ("no_alpha_sum", (3, 5), "padded", -1.0, 2.0, "sum"),
    ("gamma_half_mean", (2, 3, 4, 5), "channels_last", 0.75, 0.5, "mean"),
    ("gamma_3_5", (6, 5), "contiguous", 0.25, 3.5, "none"),
    ("weighted_bce_sum", (7, 3), "contiguous", 0.25, 0.0, "sum"),
    ("0d", (), "contiguous", 0.4, 1.5, "none"),
    ("empty_sum", (0, 3), "contiguous", 0.25, 2.0, "sum"),
]


def _focal_pair(shape, layout, device, dtype, requires_grad):
    # Logits scaled by 4 reach the saturated tails; targets are soft labels in [0, 1).
    inputs = make_tensor(shape, device, dtype, layout, requires_grad, scale=4)
    targets = make_tensor(shape, device, dtype, "contiguous", requires_grad, uniform=True)
    return inputs, targets


def sigmoid_focal_loss_samples(device, dtype, requires_grad):
    for name, shape, layout, alpha, gamma, reduction in FOCAL_CASES:
        inputs, targets = _focal_pair(shape, layout, device, dtype, requires_grad)
        yield SampleInput((inputs, targets), {"alpha": alpha, "gamma": gamma, "reduction": reduction}, name=name)
    # Logits of +-100 and +-1e4 with hard 0/1 targets: a finite loss everywhere. Not for
    # gradcheck: finite differences of a saturated function in float64 are not meaningful.
    if not requires_grad:
        inputs = torch.tensor([100.0, -100.0, 1e4, -1e4, 3.0, -3.0], dtype=torch.float64)
        targets = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
        big = dict(device=device, dtype=dtype)
        yield SampleInput(
            (inputs.to(**big), targets.to(**big)),
            {"alpha": 0.25, "gamma": 0.5, "reduction": "none"},
            name="large_logits",
        )


def sigmoid_focal_loss_backward_samples(device, dtype, requires_grad):
    masks = [[True, True], [True, False], [False, True]]
    for i, (name, shape, layout, alpha, gamma, reduction) in enumerate(FOCAL_CASES):
        inputs, targets = _focal_pair(shape, layout, device, dtype, requires_grad)
        grad_shape = shape if reduction == "none" else ()
        grad_out = make_tensor(grad_shape, device, dtype, "contiguous", requires_grad)
        yield SampleInput((grad_out, inputs, targets, alpha, gamma, reduction, masks[i % 3]), name=name)


def sigmoid_focal_loss_errors(device):
    x, t = torch.randn(4, 5, device=device), torch.rand(4, 5, device=device)
    yield ErrorInput(SampleInput((x.int(), t)), "inputs", ("floating dtype", "torch.int32"))
    yield ErrorInput(SampleInput((x, t.long())), "targets", ("floating dtype", "torch.int64"))
    yield ErrorInput(SampleInput((x, t.double())), "targets", ("dtype of inputs", "torch.float32", "torch.float64"))
    yield ErrorInput(SampleInput((x, t[:2])), "targets", ("shape of inputs", "[4, 5]", "[2, 5]"), fake_refuses=True)
    yield ErrorInput(SampleInput((x, t[0])), "targets", ("shape of inputs", "[4, 5]", "[5]"), fake_refuses=True)
    yield ErrorInput(
        SampleInput((x, t, 0.25, 2.0, "avg")), "reduction", ("'none', 'mean' or 'sum'", "'avg'"), fake_refuses=True
    )
    yield ErrorInput(SampleInput((x, t, 0.25, 2.0, "Sum")), "reduction", ("'Sum'",), fake_refuses=True)
    yield ErrorInput(SampleInput((x, t, 0.25, -1.0, "none")), "gamma", (">= 0", "-1"))
    yield ErrorInput(SampleInput((x, t, 0.25, float("inf"), "sum")), "gamma", ("finite", "inf"))
    yield ErrorInput(SampleInput((x, t, float("nan"), 2.0)), "alpha", ("finite", "nan"))
    yield ErrorInput(SampleInput((x, t, float("inf"), 2.0)), "alpha", ("finite", "inf"))
    d, o = _devices(device)
    yield ErrorInput(SampleInput((x, t.to(o))), "targets", (f"device of inputs ({d})", f"but got {o}"))
    yield ErrorInput(SampleInput((x.to(o), t)), "targets", (f"device of inputs ({o})", f"but got {d}"))


def sigmoid_focal_loss_backward_errors(device):
    x, t = torch.randn(4, 5, device=device), torch.rand(4, 5, device=device)
    g0 = torch.ones((), device=device)
    yield ErrorInput(
        SampleInput((g0, x, t, 0.25, 2.0, "none", [True, True])),
        "grad_out",
        ("shape of inputs", "[]"),
        fake_refuses=True,
    )
    yield ErrorInput(
        SampleInput((x, x, t, 0.25, 2.0, "sum", [True, True])),
        "grad_out",
        ("0-dimensional", "'sum'", "[4, 5]"),
        fake_refuses=True,
    )
    yield ErrorInput(
        SampleInput((g0.half(), x, t, 0.25, 2.0, "mean", [True, False])),
        "grad_out",
        ("dtype of inputs", "torch.float16"),
    )
    yield ErrorInput(
        SampleInput((g0, x, t, 0.25, 2.0, "max", [True, False])), "reduction", ("'max'",), fake_refuses=True
    )
    yield ErrorInput(SampleInput((g0.int(), x, t, 0.25, 2.0, "sum", [True, False])), "grad_out", ("floating dtype",))
    d, o = _devices(device)
    yield ErrorInput(
        SampleInput((g0.to(o), x, t, 0.25, 2.0, "sum", [True, False])),
        "grad_out",
        (f"device of inputs ({d})", f"but got {o}"),
    )


def sigmoid_focal_loss_backward_reference(grad_out, inputs, targets, alpha, gamma, reduction, output_mask):
    with torch.enable_grad():
        x = inputs.detach().requires_grad_()
        t = targets.detach().requires_grad_()
        loss = sigmoid_focal_loss_reference(x, t, alpha, gamma, reduction)
        gx, gt = torch.autograd.grad(loss, (x, t), grad_out)
    empty = inputs.new_empty(0)
    return (gx if output_mask[0] else empty, gt if output_mask[1] else empty)


SIGMOID_FOCAL_LOSS = OpSpec(
    name="sigmoid_focal_loss",
    sample_inputs=sigmoid_focal_loss_samples,
    reference=sigmoid_focal_loss_reference,
    supports_gradgrad=False,  # first-order gradients only: double backward raises
    error_inputs=sigmoid_focal_loss_errors,
    cuda_kernels={
        "sigmoid_focal_loss_kernel": "2d",
        "sigmoid_focal_loss_reduce_kernel": "strided_sum",
        "sigmoid_focal_loss_finalize_kernel": "transposed_mean",
    },
)

SIGMOID_FOCAL_LOSS_BACKWARD = OpSpec(
    name="sigmoid_focal_loss_backward",
    sample_inputs=sigmoid_focal_loss_backward_samples,
    reference=sigmoid_focal_loss_backward_reference,
    supports_gradgrad=False,
    error_inputs=sigmoid_focal_loss_backward_errors,
    cuda_kernels={"sigmoid_focal_loss_backward_kernel": "strided_sum"},
    unsupported={
        "autograd": "first-order gradients only: the backward op has no derivative of its own (it raises)",
        "onnx": "no ONNX translation: a backward op, absent from inference graphs",
    },
)


# --- deform_conv2d and its backward ----------------------------------------------------------


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def deform_conv2d_reference(input, offset, weight, bias=None, stride=1, padding=0, dilation=1, mask=None):
    """The formula of :func:`customops.deform_conv2d` (Dai et al. 2017; Zhu et al. 2019) written
    out in PyTorch ops, independently of torchvision and of the kernels' column buffers: every
    sampling point's four neighbours gathered from the flattened image, weighted by the
    bilinear weights (0 for a neighbour outside the image) and the mask, then contracted
    with the weight per group. Differentiable by autograd (floor's derivative is 0, so the
    offsets' derivative is the bilinear formula's, one-sided at integers)."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    B, C, H, W = input.shape
    C_out, per_group, kh, kw = weight.shape
    groups, taps = C // per_group, kh * kw
    offset_groups = offset.shape[1] // (2 * taps)
    H_out, W_out = offset.shape[2], offset.shape[3]
    dev = input.device
    off = offset.reshape(B, offset_groups, taps, 2, H_out, W_out)
    ki = torch.arange(kh, device=dev).repeat_interleave(kw)
    kj = torch.arange(kw, device=dev).repeat(kh)
    base_y = (torch.arange(H_out, device=dev) * sh - ph).view(1, 1, 1, H_out, 1) + (ki * dh).view(1, 1, taps, 1, 1)
    base_x = (torch.arange(W_out, device=dev) * sw - pw).view(1, 1, 1, 1, W_out) + (kj * dw).view(1, 1, taps, 1, 1)
    y = base_y + off[:, :, :, 0]  # (B, offset_groups, taps, H_out, W_out)
    x = base_x + off[:, :, :, 1]
    y0, x0 = torch.floor(y), torch.floor(x)
    ly, lx = y - y0, x - x0
    per_offset_group, points = C // offset_groups, taps * H_out * W_out
    planes = input.reshape(B, offset_groups, per_offset_group, H * W)
    # A point past the border line y = -1 or x = -1, or on or past y = H or x = W, samples 0
    # with no derivative. On y = -1 (x = -1) it samples 0 too, but its neighbour inside moves
    # in: the right-hand derivative, the kernels' and torchvision's rule (zero offsets with
    # padding put taps there; bfloat16 offsets hit the line exactly).
    point_inside = (y >= -1) & (y < H) & (x >= -1) & (x < W)
    sampled = 0
    for yy, xx, w in (
        (y0, x0, (1 - ly) * (1 - lx)),
        (y0, x0 + 1, (1 - ly) * lx),
        (y0 + 1, x0, ly * (1 - lx)),
        (y0 + 1, x0 + 1, ly * lx),
    ):
        inside = (yy >= 0) & (yy <= H - 1) & (xx >= 0) & (xx <= W - 1)
        index = (yy.clamp(0, max(H - 1, 0)) * W + xx.clamp(0, max(W - 1, 0))).long()
        index = index.reshape(B, offset_groups, 1, points).expand(B, offset_groups, per_offset_group, points)
        values = torch.gather(planes, 3, index) if H * W > 0 else planes.new_zeros(index.shape)
        sampled = sampled + values * (w * (inside & point_inside)).reshape(B, offset_groups, 1, points)
    if mask is not None:
        sampled = sampled * mask.reshape(B, offset_groups, 1, points)
    columns = sampled.reshape(B, groups, per_group * taps, H_out * W_out)  # (channel, tap) rows
    w = weight.reshape(groups, C_out // groups, per_group * taps)
    out = torch.einsum("gok,bgkp->bgop", w, columns).reshape(B, C_out, H_out, W_out)
    if bias is not None:
        out = out + bias.view(1, C_out, 1, 1)
    return out


# (name, B, C_in, (H, W), C_out, groups, offset_groups, (kh, kw), stride, padding, dilation,
#  mask, bias, layout of input, offset scale). Offsets of scale 1.5 land between pixels and
#  partly outside the image; scale 6 mostly outside.
DEFORM_CONV2D_CASES = [
    ("3x3_pad1_mask", 2, 4, (5, 6), 3, 1, 1, (3, 3), 1, 1, 1, True, True, "contiguous", 1.5),  # first: exported
    ("dcnv1_stride2_2x3", 1, 3, (7, 6), 2, 1, 1, (2, 3), [2, 2], [0, 0], [1, 1], False, False, "contiguous", 1.5),
    ("groups2_offset_groups3", 1, 6, (5, 5), 4, 2, 3, (3, 3), 1, 1, 1, True, True, "channels_last", 1.5),
    ("dilated_channels_last", 1, 4, (6, 7), 2, 1, 2, (3, 3), [1, 2], [2, 1], [2, 1], True, False, "channels_last", 1.5),
    ("depthwise", 1, 4, (5, 5), 4, 4, 2, (3, 3), 1, 1, 1, True, True, "contiguous", 1.5),
    ("1x1_no_mask", 2, 4, (4, 5), 3, 1, 2, (1, 1), 1, 0, 1, False, True, "strided", 1.5),
    ("outside_image", 1, 2, (4, 4), 2, 1, 1, (3, 3), 1, 1, 1, True, True, "transposed", 6.0),
    ("empty_batch", 0, 4, (5, 6), 3, 1, 1, (3, 3), 1, 1, 1, True, True, "contiguous", 1.5),
    # Groups with a bias and 16 output pixels: the CUDA forward's vector bias fill (P % 8 == 0).
    ("groups2_16_pixels", 1, 4, (4, 4), 2, 2, 1, (3, 3), 1, 1, 1, True, True, "contiguous", 1.5),
    # More output channels than the batch's output pixels: the CPU's GEMMs in the weight's order.
    ("out_channels_above_pixels", 2, 4, (3, 3), 26, 2, 2, (2, 3), 1, 1, 1, True, True, "contiguous", 1.5),
]


def _deform_conv2d_tensors(case, device, dtype, requires_grad):
    name, B, C, (H, W), C_out, groups, og, (kh, kw), stride, padding, dilation, has_mask, has_bias, layout, scale = case
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    H_out = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    W_out = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    input = make_tensor((B, C, H, W), device, dtype, layout, requires_grad)
    offset = make_tensor((B, 2 * og * kh * kw, H_out, W_out), device, dtype, "contiguous", requires_grad, scale=scale)
    weight = make_tensor((C_out, C // groups, kh, kw), device, dtype, "contiguous", requires_grad, scale=0.5)
    bias = make_tensor((C_out,), device, dtype, "contiguous", requires_grad) if has_bias else None
    mask = make_tensor((B, og * kh * kw, H_out, W_out), device, dtype, "contiguous", requires_grad, uniform=True)
    return input, offset, weight, bias, [sh, sw], [ph, pw], [dh, dw], (mask if has_mask else None)


def deform_conv2d_samples(device, dtype, requires_grad):
    for case in DEFORM_CONV2D_CASES:
        yield SampleInput(_deform_conv2d_tensors(case, device, dtype, requires_grad), name=case[0])
    # Keyword arguments, other layouts of offset, weight and mask.
    input, offset, weight, bias, stride, padding, dilation, mask = _deform_conv2d_tensors(
        DEFORM_CONV2D_CASES[0], device, dtype, False
    )
    rg = lambda t: t.detach().requires_grad_(requires_grad)  # noqa: E731
    yield SampleInput(
        (rg(input), rg(offset.transpose(2, 3).contiguous().transpose(2, 3))),
        {
            "weight": rg(weight.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)),
            "bias": make_tensor(bias.shape, device, dtype, "strided", requires_grad),
            "padding": padding,  # stride and dilation: the defaults
        },
        name="kwargs_strided_offset_weight",
    )
    yield SampleInput(
        (rg(input), rg(offset), rg(weight)),
        {
            "stride": stride,
            "padding": padding,
            "dilation": dilation,
            "mask": rg(mask.transpose(2, 3).contiguous().transpose(2, 3)),
        },
        name="kwargs_mask_no_bias",
    )
    # Integer offsets: sampling points on pixels (and at -1, H, on the border). The bilinear
    # interpolation has a kink there, so the offsets take no part in gradcheck.
    offset_int = torch.randint(-2, 3, offset.shape, dtype=torch.float64).to(device=device, dtype=dtype)
    yield SampleInput(
        (rg(input), offset_int, rg(weight), rg(bias), stride, padding, dilation, rg(mask)), name="integer_offsets"
    )


def _deform_conv2d_output_format(sample):
    """The input's suggested memory format, as conv2d's output."""
    from torch._prims_common import suggest_memory_format

    return (
        torch.channels_last
        if suggest_memory_format(sample.args[0]) == torch.channels_last
        else (torch.contiguous_format)
    )


def deform_conv2d_backward_samples(device, dtype, requires_grad):
    masks = [[True, True, True, True, True], [True, False, False, False, False], [False, True, True, False, True]]
    for i, case in enumerate(DEFORM_CONV2D_CASES):
        input, offset, weight, bias, stride, padding, dilation, mask = _deform_conv2d_tensors(
            case, device, dtype, requires_grad
        )
        H_out, W_out = offset.shape[2], offset.shape[3]
        grad_out = make_tensor(
            (input.shape[0], weight.shape[0], H_out, W_out), device, dtype, "contiguous", requires_grad
        )
        yield SampleInput(
            (grad_out, input, offset, weight, mask, stride, padding, dilation, masks[i % 3]), name=case[0]
        )


def deform_conv2d_backward_reference(grad_out, input, offset, weight, mask, stride, padding, dilation, output_mask):
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (input, offset, weight)]
        bias = torch.zeros(weight.shape[0], dtype=input.dtype, device=input.device, requires_grad=True)
        m = mask.detach().requires_grad_() if mask is not None else None
        wrt = [*leaves, bias] + ([m] if m is not None else [])
        out = deform_conv2d_reference(*leaves, bias, stride, padding, dilation, m)
        grads = torch.autograd.grad(out, wrt, grad_out, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt)]
    if m is None:
        grads.append(None)
    empty = input.new_empty(0)
    return tuple(g if want and g is not None else empty for g, want in zip(grads, output_mask))


def deform_conv2d_errors(device):
    x = torch.randn(2, 4, 5, 5, device=device)
    w = torch.randn(3, 4, 3, 3, device=device)
    off = torch.randn(2, 18, 5, 5, device=device)
    m = torch.rand(2, 9, 5, 5, device=device)
    b = torch.randn(3, device=device)

    def call(x=x, off=off, w=w, b=b, stride=1, padding=1, dilation=1, m=m):
        return SampleInput((x, off, w, b, stride, padding, dilation, m))

    yield ErrorInput(call(x=x.int()), "input", ("floating dtype", "torch.int32"))
    yield ErrorInput(call(off=off.long()), "offset", ("floating dtype", "torch.int64"))
    yield ErrorInput(call(w=w.double()), "weight", ("dtype of input", "torch.float32", "torch.float64"))
    yield ErrorInput(call(m=m.half()), "mask", ("dtype of input", "torch.float16"))
    yield ErrorInput(call(b=b.bfloat16()), "bias", ("dtype of input", "torch.bfloat16"))
    yield ErrorInput(
        call(off=off[:, :17]),
        "offset",
        ("a positive multiple of 18", "(kh = 3, kw = 3)", "[2, 17, 5, 5]"),
        fake_refuses=True,
    )
    yield ErrorInput(
        call(off=torch.randn(2, 36, 5, 5, device=device)),
        "mask",
        ("shape [2, 18, 5, 5]", "offset_groups = 2", "[2, 9, 5, 5]"),
        fake_refuses=True,
    )
    yield ErrorInput(call(off=off[:, :, :4]), "offset", ("shape [2, 18, 5, 5]", "[2, 18, 4, 5]"), fake_refuses=True)
    yield ErrorInput(call(off=off[:1]), "offset", ("shape [2, 18, 5, 5]", "[1, 18, 5, 5]"), fake_refuses=True)
    yield ErrorInput(call(m=m[:, :, :, :3]), "mask", ("shape [2, 9, 5, 5]", "[2, 9, 5, 3]"), fake_refuses=True)
    yield ErrorInput(
        call(w=torch.randn(3, 3, 3, 3, device=device)),
        "input.shape[1]",
        ("weight.shape[1] (in_channels / groups) = 3", "[2, 4, 5, 5]"),
        fake_refuses=True,
    )
    yield ErrorInput(
        call(
            x=torch.randn(2, 6, 5, 5, device=device),
            w=torch.randn(4, 3, 3, 3, device=device),
            off=torch.randn(2, 72, 5, 5, device=device),
            b=None,
            m=None,
        ),
        "input.shape[1]",
        ("divisible by offset_groups = 4", "[2, 6, 5, 5]"),
        fake_refuses=True,
    )
    yield ErrorInput(
        call(w=torch.randn(3, 2, 3, 3, device=device)),
        "weight.shape[0]",
        ("divisible by groups = 2", "[3, 2, 3, 3]"),
        fake_refuses=True,
    )
    yield ErrorInput(call(stride=0), "stride", (">= 1", "[0, 0]"), fake_refuses=True)
    yield ErrorInput(call(stride=[1, 0]), "stride", (">= 1", "[1, 0]"), fake_refuses=True)
    yield ErrorInput(call(dilation=[0, 1]), "dilation", (">= 1", "[0, 1]"), fake_refuses=True)
    yield ErrorInput(call(padding=[-1, 1]), "padding", (">= 0", "[-1, 1]"), fake_refuses=True)
    # Large enough to overflow the output size's int64 arithmetic.
    yield ErrorInput(call(stride=[1, 2**62]), "stride", ("at most 2147483647",), fake_refuses=True)
    yield ErrorInput(call(stride=[1, 1, 1]), "stride", ("a pair of ints", "[1, 1, 1]"), fake_refuses=True)
    yield ErrorInput(
        SampleInput(
            (torch.randn(1, 4, 2, 2, device=device), torch.randn(1, 18, 1, 1, device=device), w, None, 1, 0, 1, None)
        ),
        "input",
        ("at least as large as the dilated kernel [3, 3]", "output size [0, 0]"),
        fake_refuses=True,
    )
    # Expanded arguments whose output would have 2^67 elements.
    big = dict(x=x[:1, :1, :1, :1].expand(2**16, 4, 2**10, 2**10), w=w[:1].expand(2**31, 4, 3, 3), b=None)
    big.update(off=off[:1, :, :1, :1].expand(2**16, 18, 2**10, 2**10), m=None)
    yield ErrorInput(
        call(**big),
        "input",
        ("fewer than 2^63 elements", "[65536, 2147483648, 1024, 1024]", "[2147483648, 4, 3, 3]"),
        fake_refuses=True,
    )
    yield ErrorInput(call(x=x[0]), "input", ("4-D", "[4, 5, 5]"), fake_refuses=True)
    yield ErrorInput(call(w=w[0]), "weight", ("4-D", "[4, 3, 3]"), fake_refuses=True)
    yield ErrorInput(
        call(b=torch.randn(4, device=device)), "bias", ("(out_channels,) = (3,)", "[4]"), fake_refuses=True
    )
    d, o = _devices(device)
    yield ErrorInput(call(off=off.to(o)), "offset", (f"device of input ({d})", f"but got {o}"))
    yield ErrorInput(call(m=m.to(o)), "mask", (f"device of input ({d})", f"but got {o}"))
    yield ErrorInput(call(x=x.to(o)), "offset", (f"device of input ({o})", f"but got {d}"))


def deform_conv2d_backward_errors(device):
    x = torch.randn(1, 4, 5, 5, device=device)
    w = torch.randn(3, 4, 3, 3, device=device)
    off = torch.randn(1, 18, 5, 5, device=device)
    m = torch.rand(1, 9, 5, 5, device=device)
    g = torch.randn(1, 3, 5, 5, device=device)
    pair, mask5 = [1, 1], [True] * 5
    yield ErrorInput(
        SampleInput((g[:, :2], x, off, w, m, pair, pair, pair, mask5)),
        "grad_out",
        ("output's shape [1, 3, 5, 5]", "[1, 2, 5, 5]"),
        fake_refuses=True,
    )
    yield ErrorInput(
        SampleInput((g.double(), x, off, w, m, pair, pair, pair, mask5)),
        "grad_out",
        ("dtype of input", "torch.float64"),
    )
    yield ErrorInput(
        SampleInput((g, x, off[:, :10], w, m, pair, pair, pair, mask5)),
        "offset",
        ("a positive multiple of 18",),
        fake_refuses=True,
    )
    yield ErrorInput(
        SampleInput((g, x, off, w, m.int(), pair, pair, pair, mask5)), "mask", ("floating dtype", "torch.int32")
    )
    d, o = _devices(device)
    yield ErrorInput(
        SampleInput((g.to(o), x, off, w, m, pair, pair, pair, mask5)),
        "grad_out",
        (f"device of input ({d})", f"but got {o}"),
    )


DEFORM_CONV2D = OpSpec(
    name="deform_conv2d",
    sample_inputs=deform_conv2d_samples,
    reference=deform_conv2d_reference,
    supports_gradgrad=False,  # first-order gradients only: double backward raises
    gradcheck_nondet_tol=1e-12,  # the CUDA backward's atomics
    error_inputs=deform_conv2d_errors,
    output_format=_deform_conv2d_output_format,
    cuda_kernels={
        "deform_conv2d_transpose_kernel": "3x3_pad1_mask",
        "deform_conv2d_im2col_kernel": "3x3_pad1_mask",
        "deform_conv2d_depthwise_tile_kernel": "depthwise",
        "deform_conv2d_bias_kernel": "groups2_16_pixels",
    },
)

DEFORM_CONV2D_BACKWARD = OpSpec(
    name="deform_conv2d_backward",
    sample_inputs=deform_conv2d_backward_samples,
    reference=deform_conv2d_backward_reference,
    supports_gradgrad=False,
    error_inputs=deform_conv2d_backward_errors,
    cuda_kernels={
        "deform_conv2d_transpose_kernel": "3x3_pad1_mask",
        "deform_conv2d_im2col_kernel": "3x3_pad1_mask",
        "deform_conv2d_col2im_kernel": "3x3_pad1_mask",
    },
    unsupported={
        "autograd": "first-order gradients only: the backward op has no derivative of its own (it raises)",
        "onnx": "no ONNX translation: a backward op, absent from inference graphs",
    },
)

OP_SPECS = [
    ADD,
    SIGMOID,
    SIGMOID_BACKWARD,
    FUSED_LINEAR_SIGMOID,
    FUSED_LINEAR_SIGMOID_BACKWARD,
    SIGMOID_FOCAL_LOSS,
    SIGMOID_FOCAL_LOSS_BACKWARD,
    DEFORM_CONV2D,
    DEFORM_CONV2D_BACKWARD,
]
