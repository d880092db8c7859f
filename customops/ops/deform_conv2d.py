"""customops::deform_conv2d and customops::deform_conv2d_backward.

Schema: csrc/registration.cpp; kernels (CPU, CUDA, autograd) and the formula:
csrc/ops/deform_conv2d/.
"""

import math
import operator
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from ._fake import check_same_device

__all__ = ["deform_conv2d"]


def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: Union[int, Tuple[int, int]] = (1, 1),
    padding: Union[int, Tuple[int, int]] = (0, 0),
    dilation: Union[int, Tuple[int, int]] = (1, 1),
    mask: Optional[Tensor] = None,
) -> Tensor:
    """Deformable convolution (DCNv1), modulated when ``mask`` is given (DCNv2).

    Same function, arguments and defaults as :func:`torchvision.ops.deform_conv2d`. The
    convolution of Dai et al., "Deformable Convolutional Networks" (ICCV 2017), with the
    modulation of Zhu et al., "Deformable ConvNets v2: More Deformable, Better Results"
    (CVPR 2019): for output pixel ``(oy, ox)``, kernel tap ``k = (i, j)`` and the offset group
    ``g`` of input channel ``c``::

        y = oy * stride[0] - padding[0] + i * dilation[0] + offset[b, 2 * (g * kh * kw + k), oy, ox]
        x = ox * stride[1] - padding[1] + j * dilation[1] + offset[b, 2 * (g * kh * kw + k) + 1, oy, ox]
        out[b, o, oy, ox] = bias[o] + sum_{c in o's group, k} weight[o, c', i, j]
                                       * mask[b, g * kh * kw + k, oy, ox] * bilinear(input[b, c], y, x)

    where ``c'`` is ``c``'s index within its group and ``bilinear`` interpolates the four
    pixels around ``(y, x)``, each 0 outside the image (so a point with ``y <= -1``,
    ``y >= H``, ``x <= -1`` or ``x >= W`` samples 0, and so does a NaN or infinite position, with
    a zero offset gradient: a diverging offset branch does not show in the output, unlike
    :func:`torch.nn.functional.grid_sample`, which returns NaN there). Such a point contributes 0
    whatever its mask, a NaN or infinite one included (torchvision's op multiplies it in: NaN).
    On the lines ``y = -1`` and ``x = -1`` themselves (where zero offsets and padding put a
    layer's border taps) the point reads its neighbours inside the image with weight 0, which
    gives the offsets their one-sided derivative there; so an infinite or NaN pixel next to
    such a point, or a NaN or infinite mask, gives NaN (torchvision's op: 0 for the pixel, NaN
    for the mask).
    With zero offsets and no mask it is :func:`torch.nn.functional.conv2d`.

    Args:
        input: ``(B, C_in, H, W)``.
        offset: ``(B, 2 * offset_groups * kh * kw, H_out, W_out)``, ``(dy, dx)`` interleaved per
            kernel tap, taps in row-major order, offset groups outermost; in pixels.
        weight: ``(C_out, C_in / groups, kh, kw)``; ``groups = C_in / weight.shape[1]``, which
            must divide ``C_out``.
        bias: ``(C_out,)`` or None.
        stride, padding, dilation: ints or pairs ``(h, w)``; stride and dilation >= 1,
            padding >= 0. ``H_out = (H + 2 padding[0] - dilation[0] (kh - 1) - 1) // stride[0] + 1``
            and likewise ``W_out``; both must be positive.
        mask: ``(B, offset_groups * kh * kw, H_out, W_out)`` or None (no modulation, DCNv1).
        ``offset_groups = offset.shape[1] / (2 kh kw)`` must divide ``C_in``. Every tensor of one
        floating dtype (float32, float16, bfloat16; float64 for gradcheck), on one device (CPU
        or CUDA), any strides (channels_last included). 16-bit inputs: sampling positions and
        bilinear weights in float32; on the CPU all in float32, rounded once; on CUDA, float16's
        four corners blend in float16 FMAs (bfloat16's in float32, rounded once) into 16-bit
        columns, whose GEMMs accumulate in float32 (forward error against float64 at
        8x256x64x64: 4.4e-4 in float16, 2.7e-3 in bfloat16; docs/deform_conv2d.md). float32
        GEMMs follow torch's matmul precision settings.

    Returns:
        A new tensor ``(B, C_out, H_out, W_out)`` of ``input``'s dtype and device, in
        ``input``'s suggested memory format, as :func:`torch.nn.functional.conv2d`'s output
        with a contiguous weight: channels_last where ``input``'s strides are channels_last-like
        (a channels_last tensor, or a slice of one), else contiguous (NCHW). The gradients are
        contiguous.

    Raises:
        TypeError: ``input``, ``offset`` or ``weight`` not a Tensor, ``bias`` or ``mask`` neither
            a Tensor nor None, or stride, padding or dilation not an int (or integer-like, as
            numpy's ints, in eager mode: torch.compile traces numpy values as tensors, and
            fails on them, as it does for F.conv2d's) or a sequence of them.
        RuntimeError: a non-floating dtype, mixed dtypes or devices; a tensor of the wrong
            rank; ``C_in`` not a multiple of ``weight.shape[1]`` or of ``offset_groups``;
            ``C_out`` not a multiple of ``groups``; ``offset.shape[1]`` not a positive multiple
            of ``2 kh kw``; ``offset``'s or ``mask``'s batch, channels or spatial size not those
            expected; ``bias`` not ``(C_out,)``; stride or dilation < 1, padding < 0, any of
            them over 2**31 - 1; an output size <= 0, or an output of 2**63 elements or more
            (expanded arguments). The message names the argument and what was expected (the
            same under torch.compile and torch.export).

    Autograd: gradients w.r.t. ``input``, ``offset``, ``weight``, ``bias`` and ``mask``
    (only those required are computed), by ``customops::deform_conv2d_backward``, which
    recomputes the sampled columns from the saved inputs. The derivative in the offsets is
    that of the bilinear formula, right-hand at integer sampling positions, the border lines
    y = -1 and x = -1 included (as torchvision's).
    Double backward is not implemented (it raises a RuntimeError saying so).

    Autocast: under ``torch.autocast`` it casts its floating inputs (not float64) to the
    autocast dtype, as ``F.conv2d`` does, so offsets predicted by an autocast conv2d (16-bit)
    go with a float32 input there; outside autocast, mixed dtypes raise.
    """
    if not torch.jit.is_scripting():  # scripted, the signature's types are checked already
        _check_types(input, offset, weight, bias, mask)
        stride, padding, dilation = _ints(stride, "stride"), _ints(padding, "padding"), _ints(dilation, "dilation")
    # Pairs: under torch.compile with dynamic shapes an int argument arrives as a SymInt, which
    # the schema's int[2] does not broadcast.
    return torch.ops.customops.deform_conv2d(
        input, offset, weight, bias, _pair(stride), _pair(padding), _pair(dilation), mask
    )


# Bounds stride, padding and dilation so that the output size's arithmetic cannot overflow int64
# (csrc/ops/deform_conv2d/deform_conv2d.h too).
_MAX_PARAM = 2147483647


def _pair(v: Union[int, Tuple[int, int]]) -> List[int]:
    if isinstance(v, int):
        return [v, v]
    return [v[0], v[1]] if len(v) == 2 else list(v)


@torch.jit.unused
def _check_types(input: Tensor, offset: Tensor, weight: Tensor, bias: Optional[Tensor], mask: Optional[Tensor]) -> None:
    for name, t in (("input", input), ("offset", offset), ("weight", weight), ("bias", bias), ("mask", mask)):
        if not isinstance(t, Tensor) and not (t is None and name in ("bias", "mask")):
            raise TypeError(f"customops: expected {name} to be a Tensor, but got {type(t).__name__}")


@torch.jit.unused
def _ints(v: Union[int, Tuple[int, int]], name: str) -> List[int]:
    """stride, padding or dilation (also customops.nn's sizes) as a list of ints, one per
    dimension: ints, SymInts (torch.compile's dynamic shapes, kept as they are: their __index__
    would specialize the graph) and integer-like values such as numpy's, as F.conv2d takes them.
    Values past int64 raise here, worded as the op's checks word them, where the op's schema
    would refuse them without naming the argument; the op checks the rest, other lengths too."""

    def index(e):
        if isinstance(e, (int, torch.SymInt)):
            return e
        try:
            return operator.index(e)
        except TypeError:
            raise TypeError(f"customops: expected {name} to be an int or a pair of ints, but got {v!r}") from None

    pair = [index(e) for e in v] if isinstance(v, (tuple, list)) else [index(v)] * 2
    for e in pair:
        if isinstance(e, int) and e >= 2**63:
            raise RuntimeError(f"customops: expected {name} to be at most {_MAX_PARAM}, but got {pair}")
        if isinstance(e, int) and e < -(2**63):
            low = ">= 0" if name == "padding" else ">= 1"
            raise RuntimeError(f"customops: expected {name} to be {low}, but got {pair}")
    return pair


def _check_pair(v, name, low, what):
    torch._check(len(v) == 2, lambda: f"customops: expected {name} to be an int or a pair of ints, but got {list(v)}")
    torch._check(v[0] >= low and v[1] >= low, lambda: f"customops: expected {name} to be {what}, but got {list(v)}")
    torch._check(
        v[0] <= _MAX_PARAM and v[1] <= _MAX_PARAM,
        lambda: f"customops: expected {name} to be at most {_MAX_PARAM}, but got {list(v)}",
    )


def _check_dims(t, name, n, what):
    torch._check(
        t.dim() == n, lambda: f"customops: expected {name} to be {n}-D ({what}), but got shape {list(t.shape)}"
    )


def _check_shape(t, name, shape, message):
    torch._check(t.dim() == len(shape), message)
    for a, b in zip(t.shape, shape):
        torch._check(a == b, message)


def _check_devices(input, **tensors):
    for name, t in tensors.items():
        if t is not None:
            check_same_device(t, name, input, "input")


def _output_shape(input, offset, weight, bias, stride, padding, dilation, mask):
    """The relations between the sizes that the output's shape rests on, in the order of the
    C++ checks (csrc/ops/deform_conv2d/deform_conv2d.h), and the output's shape."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    _check_pair(stride, "stride", 1, ">= 1")
    _check_pair(padding, "padding", 0, ">= 0")
    _check_pair(dilation, "dilation", 1, ">= 1")
    _check_dims(input, "input", 4, "batch, in_channels, height, width")
    _check_dims(weight, "weight", 4, "out_channels, in_channels / groups, kh, kw")
    _check_dims(offset, "offset", 4, "batch, 2 * offset_groups * kh * kw, out_height, out_width")
    batch, in_channels, height, width = input.shape
    out_channels, per_group, kh, kw = weight.shape
    torch._check(
        per_group > 0,
        lambda: (
            f"customops: expected weight to have in_channels / groups, kh and kw of at least 1, but got shape "
            f"{list(weight.shape)}"
        ),
    )
    torch._check(
        kh > 0,
        lambda: (
            f"customops: expected weight to have in_channels / groups, kh and kw of at least 1, but got shape "
            f"{list(weight.shape)}"
        ),
    )
    torch._check(
        kw > 0,
        lambda: (
            f"customops: expected weight to have in_channels / groups, kh and kw of at least 1, but got shape "
            f"{list(weight.shape)}"
        ),
    )

    def channels_message():
        return (
            "customops: expected input.shape[1] (in_channels) to be a positive multiple of weight.shape[1] "
            f"(in_channels / groups) = {per_group}, but got input of shape {list(input.shape)}"
        )

    torch._check(in_channels > 0, channels_message)
    torch._check(in_channels % per_group == 0, channels_message)
    groups = in_channels // per_group
    torch._check(
        out_channels % groups == 0,
        lambda: (
            f"customops: expected weight.shape[0] (out_channels) to be divisible by groups = {groups} "
            f"(in_channels / weight.shape[1]), but got weight of shape {list(weight.shape)}"
        ),
    )
    out_h = (height + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (width + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1

    def size_message():
        kernel = [dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1]
        return (
            f"customops: expected input to be at least as large as the dilated kernel {kernel} after padding "
            f"{list(padding)}, but got input of shape {list(input.shape)} (output size {[out_h, out_w]})"
        )

    torch._check(out_h > 0, size_message)
    torch._check(out_w > 0, size_message)
    out_sizes = [batch, out_channels, out_h, out_w]
    if all(isinstance(v, int) for v in out_sizes):  # symbolic sizes would add a guard
        torch._check(
            math.prod(out_sizes) < 2**63,
            lambda: (
                "customops: expected input and weight to give an output of fewer than 2^63 elements, but got "
                f"(batch, out_channels, out_height, out_width) = {out_sizes} from input of shape "
                f"{list(input.shape)} and weight of shape {list(weight.shape)}"
            ),
        )
    taps2 = 2 * kh * kw

    def offset_channels_message():
        return (
            "customops: expected offset to have 2 * offset_groups * kh * kw channels, a positive multiple of "
            f"{taps2} (kh = {kh}, kw = {kw}), but got offset of shape {list(offset.shape)}"
        )

    torch._check(offset.shape[1] > 0, offset_channels_message)
    torch._check(offset.shape[1] % taps2 == 0, offset_channels_message)
    offset_groups = offset.shape[1] // taps2
    torch._check(
        in_channels % offset_groups == 0,
        lambda: (
            f"customops: expected input.shape[1] (in_channels) to be divisible by offset_groups = "
            f"{offset_groups} (offset.shape[1] / (2 * kh * kw)), but got input of shape {list(input.shape)}"
        ),
    )
    offset_shape = [batch, offset.shape[1], out_h, out_w]
    _check_shape(
        offset,
        "offset",
        offset_shape,
        lambda: (
            f"customops: expected offset to have shape {offset_shape} (batch, 2 * offset_groups * kh * kw, "
            f"out_height, out_width), but got {list(offset.shape)}"
        ),
    )
    if mask is not None:
        mask_shape = [batch, offset_groups * kh * kw, out_h, out_w]
        _check_shape(
            mask,
            "mask",
            mask_shape,
            lambda: (
                f"customops: expected mask to have shape {mask_shape} (batch, offset_groups * kh * kw, "
                f"out_height, out_width; offset_groups = {offset_groups}), but got {list(mask.shape)}"
            ),
        )
    if bias is not None:
        _check_shape(
            bias,
            "bias",
            [out_channels],
            lambda: (
                f"customops: expected bias to have shape (out_channels,) = ({out_channels},), but got shape "
                f"{list(bias.shape)}"
            ),
        )
    return [batch, out_channels, out_h, out_w]


@torch.library.register_fake("customops::deform_conv2d")
def _deform_conv2d_fake(input, offset, weight, bias=None, stride=1, padding=0, dilation=1, mask=None):
    _check_devices(input, offset=offset, weight=weight, bias=bias, mask=mask)
    shape = _output_shape(input, offset, weight, bias, stride, padding, dilation, mask)
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=_output_format(input))


def _output_format(input: Tensor) -> torch.memory_format:
    """deform_conv2d_output_format (csrc/ops/deform_conv2d/deform_conv2d.h), the same loop:
    torch's channels_last stride test with the batch taken as 1. A symbolic size or stride that
    cannot be decided gives contiguous (no guard, no data-dependent error)."""
    from torch.fx.experimental.symbolic_shapes import guard_or_true

    sizes, strides = (1, *input.shape[1:]), input.stride()
    if guard_or_true(strides[1] == 0):
        return torch.contiguous_format
    lo = 0
    for d in (1, 3, 2, 0):
        if guard_or_true(sizes[d] == 0) or guard_or_true(strides[d] < lo):
            return torch.contiguous_format
        if d == 0 and guard_or_true(lo == strides[1]):
            return torch.contiguous_format
        lo = strides[d] * sizes[d]
    return torch.channels_last


@torch.library.register_fake("customops::deform_conv2d_backward")
def _deform_conv2d_backward_fake(grad_out, input, offset, weight, mask, stride, padding, dilation, output_mask):
    _check_devices(input, offset=offset, weight=weight, mask=mask, grad_out=grad_out)
    shape = _output_shape(input, offset, weight, None, stride, padding, dilation, mask)
    _check_shape(
        grad_out,
        "grad_out",
        shape,
        lambda: f"customops: expected grad_out to have the output's shape {shape}, but got {list(grad_out.shape)}",
    )

    def grad(wanted, like_shape):
        return input.new_empty(like_shape) if wanted else input.new_empty(0)

    return (
        grad(output_mask[0], input.shape),
        grad(output_mask[1], offset.shape),
        grad(output_mask[2], weight.shape),
        grad(output_mask[3], (weight.shape[0],)),
        grad(output_mask[4] and mask is not None, mask.shape if mask is not None else (0,)),
    )
