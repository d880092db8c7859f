"""ONNX translation table for customops' ops, for ``torch.onnx.export(..., dynamo=True)``.

Each op becomes standard-domain ONNX ops only, so the exported model runs in a stock
onnxruntime with no extra library:

- ``fused_linear_sigmoid(x, W, b)`` -> ``Sigmoid(Add(MatMul(x, Transpose(W)), b))`` (the ONNX
  optimizer folds MatMul + Transpose + Add into ``Gemm`` for 2-D x);
- ``add(a, b)`` -> ``Add``;  ``sigmoid(x)`` -> ``Sigmoid``;
- ``sigmoid_focal_loss(x, t, alpha, gamma, reduction)`` -> the same stable formulas as the
  kernels (csrc/ops/sigmoid_focal_loss/sigmoid_focal_loss.h) in Relu, Abs, Neg, Exp, Log,
  Sigmoid, Mul, Sub, Add, Pow (none for gamma 0, 1 or 2), then ReduceMean / ReduceSum over
  all axes; 16-bit inputs are computed in float32 and cast back, as the kernels do;
- ``deform_conv2d(input, offset, weight, bias, stride, padding, dilation, mask)`` -> the
  standard ``DeformConv`` (opset 19 and later), whose inputs (X, W, offset, B, mask) and offset
  layout ((dy, dx) per kernel tap, offset groups outermost) are torchvision's; 16-bit inputs
  are computed in float32 and cast back.

Models are written at opset :data:`ONNX_OPSET` (DeformConv needs 19).

Use it when calling the exporter yourself::

    from customops.export.onnx_translation import ONNX_OPSET, ONNX_TRANSLATION_TABLE
    torch.onnx.export(model, (x,), dynamo=True, custom_translation_table=ONNX_TRANSLATION_TABLE,
                      opset_version=ONNX_OPSET)

Needs the ``onnxscript`` package (``pip install onnx onnxscript``).
"""

import torch
from onnxscript import ir, opset19
from onnxscript import opset18 as op

import customops  # noqa: F401  (the ops must exist before the table names them)

# The opset the translations need: DeformConv is in the standard domain since opset 19.
ONNX_OPSET = 19


def fused_linear_sigmoid(x, weight, bias=None):
    z = op.MatMul(x, op.Transpose(weight, perm=[1, 0]))
    if bias is not None:
        z = op.Add(z, bias)
    return op.Sigmoid(z)


def add(a, b):
    return op.Add(a, b)


def sigmoid(x):
    return op.Sigmoid(x)


def sigmoid_focal_loss(inputs, targets, alpha: float = 0.25, gamma: float = 2.0, reduction: str = "none"):
    # alpha, gamma and reduction are constants of the exported graph (Python values here).
    x, t = inputs, targets
    low_precision = inputs.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    if low_precision:
        x, t = op.Cast(x, to=ir.DataType.FLOAT), op.Cast(t, to=ir.DataType.FLOAT)

    def const(value):
        return op.CastLike(op.Constant(value_float=float(value)), x)

    one = const(1.0)
    p, q = op.Sigmoid(x), op.Sigmoid(op.Neg(x))
    one_minus_t = op.Sub(one, t)
    # BCE with logits: max(x, 0) - x t + log(1 + exp(-|x|)).
    ce = op.Add(op.Sub(op.Relu(x), op.Mul(x, t)), op.Log(op.Add(one, op.Exp(op.Neg(op.Abs(x))))))
    m = op.Add(op.Mul(p, one_minus_t), op.Mul(q, t))  # 1 - p_t without cancellation
    if gamma == 0:
        loss = ce
    elif gamma == 1:
        loss = op.Mul(ce, m)
    elif gamma == 2:
        loss = op.Mul(ce, op.Mul(m, m))
    else:
        loss = op.Mul(ce, op.Pow(m, const(gamma)))
    if alpha >= 0:
        alpha_t = op.Add(op.Mul(const(alpha), t), op.Mul(const(1.0 - alpha), one_minus_t))
        loss = op.Mul(alpha_t, loss)
    if reduction == "mean":
        loss = op.ReduceMean(loss, keepdims=0)
    elif reduction == "sum":
        loss = op.ReduceSum(loss, keepdims=0)
    if low_precision:
        loss = op.CastLike(loss, inputs)
    return loss


def _static(value, what):
    if not isinstance(value, int):
        raise ValueError(f"customops: the ONNX translation of deform_conv2d needs a static {what}, but got {value}")
    return value


def deform_conv2d(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None):
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    kh, kw = _static(weight.shape[2], "kernel height"), _static(weight.shape[3], "kernel width")
    groups = _static(input.shape[1], "number of input channels") // _static(weight.shape[1], "weight.shape[1]")
    offset_groups = _static(offset.shape[1], "number of offset channels") // (2 * kh * kw)
    tensors = [input, weight, offset, bias, mask]
    low_precision = input.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    if low_precision:
        tensors = [None if t is None else op.Cast(t, to=ir.DataType.FLOAT) for t in tensors]
    out = opset19.DeformConv(
        *tensors,
        dilations=[dh, dw],
        group=groups,
        kernel_shape=[kh, kw],
        offset_group=offset_groups,
        pads=[ph, pw, ph, pw],
        strides=[sh, sw],
    )
    return op.CastLike(out, input) if low_precision else out


ONNX_TRANSLATION_TABLE = {
    torch.ops.customops.fused_linear_sigmoid.default: fused_linear_sigmoid,
    torch.ops.customops.add.default: add,
    torch.ops.customops.sigmoid.default: sigmoid,
    torch.ops.customops.sigmoid_focal_loss.default: sigmoid_focal_loss,
    torch.ops.customops.deform_conv2d.default: deform_conv2d,
}
