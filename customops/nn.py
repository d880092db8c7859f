"""Modules built on customops' ops."""

from typing import Optional

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize


class FusedLinearSigmoid(nn.Module):
    """``sigmoid(Linear(x))`` in one op: a drop-in for ``nn.Sequential(nn.Linear(...), nn.Sigmoid())``.

    Same parameters, initialization and state_dict keys as :class:`torch.nn.Linear`
    (``weight`` of shape ``(out_features, in_features)``, ``bias`` of shape ``(out_features,)``),
    so an ``nn.Linear`` checkpoint loads as is. Input ``(*, in_features)``, output
    ``(*, out_features)``; dtypes and devices as :func:`customops.fused_linear_sigmoid`.
    Works with torch.compile, torch.jit.script and torch.export.
    """

    __constants__ = ["in_features", "out_features"]
    in_features: int
    out_features: int
    weight: Tensor
    bias: Optional[Tensor]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory_kwargs))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory_kwargs))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's initialization; it reads only self.weight and self.bias.
        nn.Linear.reset_parameters(self)  # type: ignore[arg-type]

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.customops.fused_linear_sigmoid(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "FusedLinearSigmoid":
        """A FusedLinearSigmoid that shares ``linear``'s parameters (same tensors, no copy)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"customops: expected linear to be an nn.Linear, but got {type(linear).__name__}")
        if parametrize.is_parametrized(linear):
            # Its weight is computed on each access; sharing a snapshot would silently stop training it.
            raise ValueError(
                "customops: expected linear to have plain parameters, but it is parametrized "
                f"({', '.join(linear.parametrizations.keys())}); remove the parametrization first "
                "(torch.nn.utils.parametrize.remove_parametrizations)"
            )
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.in_features = linear.in_features
        fused.out_features = linear.out_features
        fused.weight = linear.weight
        if linear.bias is not None:
            fused.bias = linear.bias
        else:
            fused.register_parameter("bias", None)
        fused.train(linear.training)
        return fused


def _has_hooks(*modules: nn.Module) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def fuse_linear_sigmoid(model: nn.Module) -> int:
    """Replaces, in place, every ``nn.Linear`` directly followed by ``nn.Sigmoid`` inside an
    ``nn.Sequential`` (at any depth of ``model``) with a :class:`FusedLinearSigmoid` sharing the
    Linear's parameters, and the ``nn.Sigmoid`` with ``nn.Identity``, so state_dict keys and
    indices stay the same. Returns the number of pairs fused.

    Only ``nn.Sequential`` children have an order that a module tree shows; a Linear and a
    Sigmoid called one after the other in a custom ``forward`` are left alone. So are pairs
    where either module has forward hooks or pre-hooks (fusing would drop them),
    parametrized Linears (e.g. weight_norm) and subclasses of ``nn.Linear`` (``LazyLinear``,
    quantization stubs and users' own subclasses may compute something else), which only
    ``type(m) is nn.Linear`` rules out.
    """
    fused = 0
    for module in model.modules():
        if not isinstance(module, nn.Sequential):
            continue
        names = list(module._modules.keys())
        for first, second in zip(names, names[1:]):
            linear, act = module._modules[first], module._modules[second]
            if type(linear) is nn.Linear and isinstance(act, nn.Sigmoid) and not _has_hooks(linear, act):
                module._modules[first] = FusedLinearSigmoid.from_linear(linear)
                module._modules[second] = nn.Identity()
                fused += 1
    return fused
