"""Modules built on customops' ops."""

import math
import sys
from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .ops.deform_conv2d import _ints


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
    """Whether any module has forward or backward hooks or pre-hooks of its own, which a
    replacement module would drop."""
    return any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks for m in modules)


def _has_extra_state(module: nn.Module) -> bool:
    """Whether a module holds buffers, submodules or parameters besides weight and bias."""
    return bool(module._buffers or module._modules or set(module._parameters) - {"weight", "bias"})


def fuse_linear_sigmoid(model: nn.Module) -> int:
    """Replaces, in place, every ``nn.Linear`` directly followed by ``nn.Sigmoid`` inside an
    ``nn.Sequential`` (at any depth of ``model``) with a :class:`FusedLinearSigmoid` sharing the
    Linear's parameters, and the ``nn.Sigmoid`` with ``nn.Identity``, so state_dict keys and
    indices stay the same. Returns the number of pairs fused.

    Only ``nn.Sequential`` children have an order that a module tree shows; a Linear and a
    Sigmoid called one after the other in a custom ``forward`` are left alone. So are pairs
    where either module has forward or backward hooks or pre-hooks (fusing would drop them),
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


def _pair(v, name: str = "kernel_size") -> Tuple[int, int]:
    pair = _ints(v, name)
    if len(pair) != 2:
        raise TypeError(f"customops: expected {name} to be an int or a pair of ints, but got {v!r}")
    return pair[0], pair[1]


def _check_positive(name: str, v: int) -> None:
    if v < 1:
        raise ValueError(f"customops: expected {name} to be >= 1, but got {v}")


class DeformConv2d(nn.Module):
    """A deformable convolution layer, :func:`customops.deform_conv2d` with its weight and bias:
    a drop-in for :class:`torchvision.ops.DeformConv2d`.

    Same constructor (``in_channels, out_channels, kernel_size, stride=1, padding=0,
    dilation=1, groups=1, bias=True``), attributes, parameters (``weight`` of shape
    ``(out_channels, in_channels / groups, kh, kw)``, ``bias`` of shape ``(out_channels,)``),
    initialization and state_dict keys as torchvision's, so its checkpoints load as they are.
    ``forward(input, offset, mask=None)``: the offsets (and the DCNv2 mask) come from the
    caller, with the shapes of :func:`customops.deform_conv2d` (Dai et al. 2017; Zhu et al.
    2019). Raises ValueError when ``in_channels``, ``groups`` or a side of ``kernel_size`` is
    below 1, ``out_channels`` is negative or ``groups`` does not divide both channel counts, and
    TypeError when ``kernel_size``, ``stride``, ``padding`` or ``dilation`` is not an int or a
    pair of ints (their values are checked at the first call, as :func:`customops.deform_conv2d`
    checks them).
    """

    __constants__ = ["in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"]
    weight: Tensor
    bias: Optional[Tensor]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        # The op needs an input channel per group; zero output channels give an empty output.
        _check_positive("in_channels", in_channels)
        if out_channels < 0:
            raise ValueError(f"customops: expected out_channels to be >= 0, but got {out_channels}")
        _check_positive("groups", groups)
        kernel_size = _pair(kernel_size)
        _check_positive("kernel_size", min(kernel_size))
        if in_channels % groups != 0:
            raise ValueError(f"customops: expected in_channels ({in_channels}) to be divisible by groups ({groups})")
        if out_channels % groups != 0:
            raise ValueError(f"customops: expected out_channels ({out_channels}) to be divisible by groups ({groups})")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        self.dilation = _pair(dilation, "dilation")
        self.groups = groups
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # torchvision's (and nn.Conv2d's) initialization.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, offset: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return torch.ops.customops.deform_conv2d(
            input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask
        )

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        s += f", padding={self.padding}" if self.padding != (0, 0) else ""
        s += f", dilation={self.dilation}" if self.dilation != (1, 1) else ""
        s += f", groups={self.groups}" if self.groups != 1 else ""
        return s + ("" if self.bias is not None else ", bias=False")


class ModulatedDeformConv2d(DeformConv2d):
    """A modulated deformable convolution (DCNv2, Zhu et al. 2019) that predicts its own offsets
    and mask from its input: ``forward(input)``.

    ``conv_offset``, an ``nn.Conv2d(in_channels, 3 * offset_groups * kh * kw, kernel_size,
    stride, padding, dilation)``, gives ``2 * offset_groups * kh * kw`` offset channels followed
    by ``offset_groups * kh * kw`` mask logits (the layout of mmcv's ModulatedDeformConv2dPack);
    the mask is their sigmoid. ``conv_offset`` starts at zero (weight and bias), as in DCNv2, so
    a new layer samples the regular grid with mask 0.5: ``0.5 * conv2d(input, weight) + bias``
    (the bias is not scaled) until training moves the offsets and the mask. Other arguments and
    parameters as :class:`DeformConv2d`; ``offset_groups`` must be >= 1 and divide
    ``in_channels``, and stride and dilation be >= 1 and padding >= 0 (``conv_offset`` runs
    before the op's own checks), else ValueError.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        offset_groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
        _check_positive("offset_groups", offset_groups)
        if in_channels % offset_groups != 0:
            raise ValueError(
                f"customops: expected in_channels ({in_channels}) to be divisible by offset_groups ({offset_groups})"
            )
        for name, pair, low in (
            ("stride", self.stride, 1),
            ("padding", self.padding, 0),
            ("dilation", self.dilation, 1),
        ):
            if min(pair) < low:
                raise ValueError(f"customops: expected {name} to be >= {low}, but got {pair}")
        self.offset_groups = offset_groups
        taps = self.kernel_size[0] * self.kernel_size[1]
        self.conv_offset = nn.Conv2d(
            in_channels, 3 * offset_groups * taps, self.kernel_size, self.stride, self.padding, self.dilation
        )
        nn.init.zeros_(self.conv_offset.weight)
        nn.init.zeros_(self.conv_offset.bias)

    def forward(self, input: Tensor) -> Tensor:  # type: ignore[override]
        out = self.conv_offset(input)
        n = 2 * self.offset_groups * self.kernel_size[0] * self.kernel_size[1]
        offset, mask = out[:, :n], torch.sigmoid(out[:, n:])
        return torch.ops.customops.deform_conv2d(
            input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", offset_groups={self.offset_groups}" if self.offset_groups != 1 else "")


def replace_torchvision_deform_conv2d(model: nn.Module) -> int:
    """Replaces, in place, every :class:`torchvision.ops.DeformConv2d` inside ``model`` (at any
    depth, ``model`` itself excepted) with a :class:`DeformConv2d` that shares its parameters
    (same tensors, no copy), so state_dict keys, training state and optimizers' references stay
    the same; returns the number of modules replaced (a module held under two names counts once
    and stays one module). Subclasses of torchvision's class, modules with forward or
    backward hooks or pre-hooks, and modules holding buffers, submodules or parameters besides
    ``weight`` and ``bias`` are left alone (they may compute something else, and hooks and state
    would be dropped); so are calls of the function ``torchvision.ops.deform_conv2d`` in a
    custom ``forward``, which no module tree shows. Does not import torchvision: a model holding
    its modules has imported it already.
    """
    module = sys.modules.get("torchvision.ops.deform_conv")
    tv_class = getattr(module, "DeformConv2d", None)
    if tv_class is None:
        return 0
    replacements = {}  # id of a torchvision module -> its replacement: a module held twice stays one
    for parent in model.modules():
        for name, child in list(parent._modules.items()):
            if type(child) is not tv_class or _has_hooks(child) or _has_extra_state(child):
                continue
            if id(child) in replacements:
                parent._modules[name] = replacements[id(child)]
                continue
            new = DeformConv2d.__new__(DeformConv2d)
            nn.Module.__init__(new)
            for attr in ("in_channels", "out_channels", "groups"):
                setattr(new, attr, getattr(child, attr))
            for attr in ("kernel_size", "stride", "padding", "dilation"):
                setattr(new, attr, _pair(getattr(child, attr), attr))
            new.weight = child.weight
            if child.bias is not None:
                new.bias = child.bias
            else:
                new.register_parameter("bias", None)
            new.train(child.training)
            parent._modules[name] = replacements[id(child)] = new
    return len(replacements)
