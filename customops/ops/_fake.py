"""Shape relations for the fake kernels (what torch.compile and torch.export run instead of the
kernels). A fake kernel states the relations between its inputs' sizes that its output shape
rests on, as ``torch._check``s, so that symbolic shapes learn them, and computes the output.
Dtype and value checks live in the C++ kernels alone (csrc/ops/common/checks.h): a traced
graph that gets a wrong dtype raises the kernel's error when it runs. Device checks are here
too: a fake kernel is also the op's meta kernel, which a call that mixes meta tensors with
others reaches with no kernel after it (it would return an uninitialised tensor)."""

import torch


def check_same_device(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    """The kernels' check_same_device, with their message."""
    torch._check(
        t.device == ref.device,
        lambda: f"customops: expected {name} to be on the device of {ref_name} ({ref.device}), but got {t.device}",
    )


def check_same_shape(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    def message():
        return f"customops: expected {name} to have the shape of {ref_name} {list(ref.shape)}, but got {list(t.shape)}"

    torch._check(t.dim() == ref.dim(), message)
    for a, b in zip(t.shape, ref.shape):
        torch._check(a == b, message)
