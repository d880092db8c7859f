"""ONNX: export_onnx, with customops' translation table (onnx_translation.py)."""

from typing import Sequence

import torch
from torch import nn

from ._common import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_DIM,
    _as_tuple,
    _batch_hint,
    _dynamic_spec,
    _export_program,
    _quiet_export,
    _quiet_onnx_registration,
    _staged,
)


def export_onnx(
    model: nn.Module,
    example_inputs,
    path: str,
    max_batch: int = DEFAULT_MAX_BATCH,
    dynamic_dims: Sequence[int] = (0,),
    max_dim: int = DEFAULT_MAX_DIM,
) -> str:
    """Writes ONNX through ``torch.onnx.export(dynamo=True)`` with customops' translation table:
    standard-domain ops only, dynamic dims as in :func:`export_model`, runnable in a stock
    onnxruntime. Needs ``onnx`` and ``onnxscript``. Returns ``path`` (large models also write
    external data beside it); nothing is written if it fails. Raises ValueError when the
    exported graph fixes a dim asked to be dynamic."""
    import onnx

    from .onnx_translation import ONNX_OPSET, ONNX_TRANSLATION_TABLE

    inputs, dynamic_shapes, ranges = _dynamic_spec(_as_tuple(example_inputs), dynamic_dims, max_batch, max_dim)
    exported, ranges = _export_program(model, inputs, dynamic_shapes, ranges)
    with _quiet_onnx_registration(), _quiet_export():
        program = torch.onnx.export(
            exported,
            inputs,
            dynamo=True,
            custom_translation_table=ONNX_TRANSLATION_TABLE,
            opset_version=ONNX_OPSET,
            optimize=True,
            verbose=False,
        )
    with _staged(path) as tmp:
        program.save(tmp)
        # The exporter may fall back to static sizes where torch.export would refuse (e.g. a
        # model that adds a fixed-size buffer): an ONNX file with fixed sizes is not what was asked.
        graph = onnx.load(tmp, load_external_data=False).graph
        for graph_input, r in zip(graph.input, ranges):
            shape = graph_input.type.tensor_type.shape.dim
            for d in r:
                if d >= len(shape) or not shape[d].dim_param:
                    what = "a dynamic batch dimension (dim 0)" if d == 0 else f"a dynamic dim {d}"
                    raise ValueError(
                        f"customops: the model's input {graph_input.name!r} cannot have {what}; the model "
                        "fixes it (check with torch.export.export and dynamic_shapes). " + _batch_hint(inputs)
                    )
    return path
