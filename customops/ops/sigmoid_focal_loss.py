"""customops::sigmoid_focal_loss and customops::sigmoid_focal_loss_backward.

Schema: csrc/registration.cpp; kernels (CPU, CUDA, autograd) and the formulas:
csrc/ops/sigmoid_focal_loss/.
"""

import torch
from torch import Tensor

from ._fake import check_same_device, check_same_shape

REDUCTIONS = ("none", "mean", "sum")


__all__ = ["sigmoid_focal_loss"]


def sigmoid_focal_loss(
    inputs: Tensor, targets: Tensor, alpha: float = 0.25, gamma: float = 2.0, reduction: str = "none"
) -> Tensor:
    """The focal loss of Lin et al., "Focal Loss for Dense Object Detection" (ICCV 2017), in fused kernels.

    Same semantics and defaults as :func:`torchvision.ops.sigmoid_focal_loss`, which computes,
    elementwise, with ``p = sigmoid(inputs)`` and ``t = targets``::

        ce   = binary_cross_entropy_with_logits(inputs, t, reduction="none")
        p_t  = p * t + (1 - p) * (1 - t)
        loss = ce * (1 - p_t) ** gamma
        if alpha >= 0: loss = (alpha * t + (1 - alpha) * (1 - t)) * loss

    then ``reduction``. Here the loss is one kernel pass (no intermediate tensors), computed
    from ``exp(-|x|)`` and ``log1p`` so that it is finite for any finite logit (``±1e4``
    included), and ``1 - p_t`` is formed as ``p (1 - t) + sigmoid(-x) t`` without cancellation.

    Args:
        inputs: logits, any shape (0-d and numel 0 included), any strides; float32, float16,
            bfloat16 or float64; on CPU or CUDA. 16-bit inputs compute and accumulate in
            float32 and round once.
        targets: same shape, dtype and device as ``inputs`` (no broadcasting); values in
            [0, 1]: 0/1 labels or soft targets (not checked, as in torchvision).
        alpha: weight of the positive class, a finite number; ``alpha < 0`` (e.g. -1) disables
            the weighting.
        gamma: focusing exponent, a finite number >= 0 (``gamma = 0`` gives
            ``alpha``-weighted binary cross-entropy; ``0 ** 0`` is 1, as in torch.pow).
        reduction: ``"none"`` (the loss per element, ``inputs``' shape), ``"mean"`` or
            ``"sum"`` (a 0-dim tensor). The mean of no elements is NaN and their sum 0, as
            torch.mean / torch.sum give. Reductions run inside the kernel (float64 partial sums
            on CPU; float32 block sums and one float64 final pass on CUDA), deterministically.

    Returns:
        A new tensor of ``inputs``' dtype and device: contiguous of ``inputs``' shape for
        ``"none"``, 0-dim otherwise.

    Raises:
        RuntimeError: a non-floating dtype; ``targets``' dtype, device or shape differ from
            ``inputs``'; ``reduction`` not one of ``"none"``, ``"mean"``, ``"sum"``; ``alpha``
            not finite; ``gamma`` negative or not finite. The message names the argument and
            what was expected (the same under torch.compile / torch.export).

    Autograd: gradients w.r.t. ``inputs`` and ``targets`` (only those that require grad are
    computed), by ``customops::sigmoid_focal_loss_backward`` in one pass that recomputes the
    sigmoid from the saved ``inputs`` and ``targets`` (nothing else is kept for backward); for
    ``"mean"``/``"sum"`` it reads the scalar gradient and writes ``grad_inputs`` directly. The
    formulas are in csrc/ops/sigmoid_focal_loss/sigmoid_focal_loss.h. They equal
    torchvision's autograd values except where torchvision's are NaN: for ``0 < gamma < 1``
    and a saturated, correct prediction (``1 - p_t`` exactly 0, e.g. logit 1e4 with target
    1) torchvision forms ``0 ** (gamma - 1) = inf`` and returns NaN, while this op returns
    the limit of the true derivative, 0. Double backward is not implemented: differentiating
    the gradient (``gradgradcheck``, ``create_graph=True`` then backward) raises a
    RuntimeError saying so. Forward-mode AD raises (a C++ autograd function; see README).
    """
    return torch.ops.customops.sigmoid_focal_loss(inputs, targets, alpha, gamma, reduction)


def _check_shapes(inputs, targets, reduction):
    # The output's shape depends on the reduction, so the fake kernel needs a valid one.
    check_same_shape(targets, "targets", inputs, "inputs")
    torch._check(
        reduction in REDUCTIONS,
        lambda: f"customops: expected reduction to be 'none', 'mean' or 'sum', but got '{reduction}'",
    )


@torch.library.register_fake("customops::sigmoid_focal_loss")
def _sigmoid_focal_loss_fake(inputs, targets, alpha=0.25, gamma=2.0, reduction="none"):
    check_same_device(targets, "targets", inputs, "inputs")
    _check_shapes(inputs, targets, reduction)
    if reduction == "none":
        return torch.empty_like(inputs, memory_format=torch.contiguous_format)
    return inputs.new_empty(())


@torch.library.register_fake("customops::sigmoid_focal_loss_backward")
def _sigmoid_focal_loss_backward_fake(grad_out, inputs, targets, alpha, gamma, reduction, output_mask):
    check_same_device(targets, "targets", inputs, "inputs")
    check_same_device(grad_out, "grad_out", inputs, "inputs")
    _check_shapes(inputs, targets, reduction)
    if reduction == "none":
        check_same_shape(grad_out, "grad_out", inputs, "inputs")
    else:
        torch._check(
            grad_out.dim() == 0,
            lambda: (
                f"customops: expected grad_out to be 0-dimensional (reduction '{reduction}'), "
                f"but got shape {list(grad_out.shape)}"
            ),
        )

    def grad(needed):
        return torch.empty_like(inputs, memory_format=torch.contiguous_format) if needed else inputs.new_empty(0)

    return grad(output_mask[0]), grad(output_mask[1])
