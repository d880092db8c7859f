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


def _other_device(device):
    """On CUDA, the CPU: a tensor there makes a mixed-device call."""
    return "cpu" if device == "cuda" else None


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
        if _other_device(device):
            yield ErrorInput(SampleInput((x, x.cpu())), second, (f"device of {first} (cuda:0)", "but got cpu"))
            yield ErrorInput(SampleInput((x.cpu(), x)), second, (f"device of {first} (cpu)", "but got cuda:0"))

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
    if _other_device(device):
        yield ErrorInput(SampleInput((x, w.cpu(), None)), "weight", ("device of x (cuda:0)", "but got cpu"))
        yield ErrorInput(SampleInput((x.cpu(), w, None)), "weight", ("device of x (cpu)", "but got cuda:0"))
        yield ErrorInput(SampleInput((x, w, b.cpu())), "bias", ("device of x (cuda:0)", "but got cpu"))


def fused_linear_sigmoid_backward_errors(device):
    x, w = torch.randn(4, 8, device=device), torch.randn(3, 8, device=device)
    y = torch.rand(4, 3, device=device)
    mask = [True, True, True]
    yield ErrorInput(SampleInput((y, x, w, y[:2], mask)), "y", ("shape of grad_out",), fake_refuses=True)
    yield ErrorInput(SampleInput((y[:2], x, w, y[:2], mask)), "y", ("shape [4, 3]", "[2, 3]"), fake_refuses=True)
    yield ErrorInput(SampleInput((y, x, w, y.double(), mask)), "y", ("dtype of grad_out",))
    yield ErrorInput(SampleInput((y, x, w[:, :5], y, mask)), "x.shape[-1]", ("weight.shape[1] = 5",), fake_refuses=True)
    if _other_device(device):
        yield ErrorInput(SampleInput((y.cpu(), x, w, y, mask)), "y", ("device of grad_out (cpu)", "but got cuda:0"))


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
    if _other_device(device):
        yield ErrorInput(SampleInput((x, t.cpu())), "targets", ("device of inputs (cuda:0)", "but got cpu"))
        yield ErrorInput(SampleInput((x.cpu(), t)), "targets", ("device of inputs (cpu)", "but got cuda:0"))


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
    if _other_device(device):
        yield ErrorInput(
            SampleInput((g0.cpu(), x, t, 0.25, 2.0, "sum", [True, False])),
            "grad_out",
            ("device of inputs (cuda:0)", "but got cpu"),
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


OP_SPECS = [
    ADD,
    SIGMOID,
    SIGMOID_BACKWARD,
    FUSED_LINEAR_SIGMOID,
    FUSED_LINEAR_SIGMOID_BACKWARD,
    SIGMOID_FOCAL_LOSS,
    SIGMOID_FOCAL_LOSS_BACKWARD,
]
