"""One :class:`OpSpec` per public op. Adding an entry to ``OP_SPECS`` enrolls the op in every
path of tests/test_conformance.py (eager CPU/CUDA, gradcheck, opcheck, torch.compile,
torch.export, AOTInductor and TorchScript from Python and from C++, ONNX) and in
``python -m customops.doctor``. See docs/adding_an_op.md."""

import torch
import torch.nn.functional as F

from .spec import OpSpec, SampleInput, make_tensor

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


# --- add -------------------------------------------------------------------------------------


def add_samples(device, dtype, requires_grad):
    def t(shape, layout):
        return make_tensor(shape, device, dtype, layout, requires_grad)

    for name, shape, layout in ELEMENTWISE_CASES:
        yield SampleInput((t(shape, layout), t(shape, layout)), name=name)
    yield SampleInput((t((6, 4), "transposed"), t((6, 4), "contiguous")), name="mixed_layouts")


ADD = OpSpec(name="add", sample_inputs=add_samples, reference=torch.add)


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


SIGMOID = OpSpec(name="sigmoid", sample_inputs=sigmoid_samples, reference=torch.sigmoid)

SIGMOID_BACKWARD = OpSpec(
    name="sigmoid_backward",
    sample_inputs=sigmoid_backward_samples,
    reference=lambda grad_out, y: grad_out * y * (1 - y),
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


FUSED_LINEAR_SIGMOID = OpSpec(
    name="fused_linear_sigmoid",
    sample_inputs=fused_linear_sigmoid_samples,
    reference=lambda x, weight, bias=None: torch.sigmoid(F.linear(x, weight, bias)),
)

FUSED_LINEAR_SIGMOID_BACKWARD = OpSpec(
    name="fused_linear_sigmoid_backward",
    sample_inputs=fused_linear_sigmoid_backward_samples,
    reference=fused_linear_sigmoid_backward_reference,
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


# (name, shape, layout, alpha, gamma, reduction)
FOCAL_CASES = [
    ("2d", (5, 7), "contiguous", 0.25, 2.0, "none"),  # first sample: the one exported
    ("transposed_mean", (6, 4), "transposed", 0.5, 1.0, "mean"),
    ("strided_sum", (4, 9), "strided", 0.25, 2.0, "sum"),
    ("no_alpha_gamma0", (1029,), "offset", -1.0, 0.0, "none"),  # vector loop, tail, unaligned
    ("empty_sum", (0, 3), "contiguous", 0.25, 2.0, "sum"),
]


def sigmoid_focal_loss_samples(device, dtype, requires_grad):
    for name, shape, layout, alpha, gamma, reduction in FOCAL_CASES:
        # Logits scaled by 4 reach the saturated tails; targets are soft labels in [0, 1).
        inputs = make_tensor(shape, device, dtype, layout, requires_grad, scale=4)
        targets = make_tensor(shape, device, dtype, "contiguous", requires_grad, uniform=True)
        yield SampleInput((inputs, targets), {"alpha": alpha, "gamma": gamma, "reduction": reduction}, name=name)


def sigmoid_focal_loss_backward_samples(device, dtype, requires_grad):
    for name, shape, layout, alpha, gamma, reduction in FOCAL_CASES:
        inputs = make_tensor(shape, device, dtype, layout, requires_grad, scale=4)
        targets = make_tensor(shape, device, dtype, "contiguous", requires_grad, uniform=True)
        grad_shape = shape if reduction == "none" else ()
        grad_out = make_tensor(grad_shape, device, dtype, "contiguous", requires_grad)
        mask = [True, name != "2d"]  # grad w.r.t. targets too, except in one sample
        yield SampleInput((grad_out, inputs, targets, alpha, gamma, reduction, mask), name=name)


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
)

SIGMOID_FOCAL_LOSS_BACKWARD = OpSpec(
    name="sigmoid_focal_loss_backward",
    sample_inputs=sigmoid_focal_loss_backward_samples,
    reference=sigmoid_focal_loss_backward_reference,
    supports_gradgrad=False,
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
