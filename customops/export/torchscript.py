"""TorchScript: export_torchscript and load_torchscript."""

from typing import Optional

import torch
from torch import nn

import customops

from ._common import _as_tuple, _check_file, _eval_mode, _quiet_torchscript, _staged


def export_torchscript(model: nn.Module, example_inputs, path: str, trace: bool = False) -> str:
    """Writes ``model`` as TorchScript: ``torch.jit.script`` (``trace=True``: ``torch.jit.trace``
    on ``example_inputs``, which scripting does not need: pass None). Scripted models take any
    input shape. Load it in C++ with ``torch::jit::load`` once the op library is loaded, or in
    Python with :func:`load_torchscript`. Returns ``path``; nothing is written if it fails."""
    with _quiet_torchscript(), _eval_mode(model):
        if trace:
            if example_inputs is None:
                raise ValueError("customops: trace=True needs example_inputs")
            module = torch.jit.trace(model, _as_tuple(example_inputs))
        else:
            module = torch.jit.script(model)
        with _staged(path) as tmp:
            module.save(tmp)
    return path


def load_torchscript(path: str, map_location: Optional[str] = None) -> torch.jit.ScriptModule:
    """Loads a TorchScript file whose graph uses customops' ops (the op library is loaded
    first). Raises FileNotFoundError for a missing file and RuntimeError naming the file for
    one that is not a TorchScript archive."""
    _check_file(path)
    customops.load_library()
    try:
        with _quiet_torchscript():
            return torch.jit.load(path, map_location=map_location)
    except RuntimeError as e:
        raise RuntimeError(f"customops: could not load TorchScript model {path!r}: {e}") from e
