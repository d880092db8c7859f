"""ONNX translation table for customops' ops, for ``torch.onnx.export(..., dynamo=True)``.

Each op becomes standard-domain ONNX ops only, so the exported model runs in a stock
onnxruntime with no extra library:

- ``fused_linear_sigmoid(x, W, b)`` -> ``Sigmoid(Add(MatMul(x, Transpose(W)), b))`` (the ONNX
  optimizer folds MatMul + Transpose + Add into ``Gemm`` for 2-D x);
- ``add(a, b)`` -> ``Add``;  ``sigmoid(x)`` -> ``Sigmoid``.

Use it when calling the exporter yourself::

    from customops.export import ONNX_TRANSLATION_TABLE
    torch.onnx.export(model, (x,), dynamo=True, custom_translation_table=ONNX_TRANSLATION_TABLE)

Needs the ``onnxscript`` package (``pip install onnx onnxscript``).
"""

import torch
from onnxscript import opset18 as op

import customops  # noqa: F401  (the ops must exist before the table names them)


def fused_linear_sigmoid(x, weight, bias=None):
    z = op.MatMul(x, op.Transpose(weight, perm=[1, 0]))
    if bias is not None:
        z = op.Add(z, bias)
    return op.Sigmoid(z)


def add(a, b):
    return op.Add(a, b)


def sigmoid(x):
    return op.Sigmoid(x)


ONNX_TRANSLATION_TABLE = {
    torch.ops.customops.fused_linear_sigmoid.default: fused_linear_sigmoid,
    torch.ops.customops.add.default: add,
    torch.ops.customops.sigmoid.default: sigmoid,
}
