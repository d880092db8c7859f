"""Argument checks for the fake kernels.

They raise the same messages as csrc/ops/common/checks.h, so an error reads the same in
eager mode and under torch.compile / torch.export (tests/test_errors.py compares them).
"""

import torch

FLOATING_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_floating(t: torch.Tensor, name: str) -> None:
    torch._check(
        t.dtype in FLOATING_DTYPES,
        lambda: f"customops: expected {name} to have a floating dtype (float32, float16, bfloat16 or "
        f"float64), but got {t.dtype}",
    )


def check_same_dtype(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    torch._check(
        t.dtype == ref.dtype,
        lambda: f"customops: expected {name} to have the dtype of {ref_name} ({ref.dtype}), but got {t.dtype}",
    )


def check_same_device(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    torch._check(
        t.device == ref.device,
        lambda: f"customops: expected {name} to be on the device of {ref_name} ({ref.device}), but got {t.device}",
    )


def check_same_shape(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    torch._check(
        t.shape == ref.shape,
        lambda: f"customops: expected {name} to have the shape of {ref_name} {_shape(ref)}, but got {_shape(t)}",
    )


def check_elementwise_pair(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    check_floating(a, a_name)
    check_floating(b, b_name)
    check_same_device(b, b_name, a, a_name)
    check_same_dtype(b, b_name, a, a_name)
    check_same_shape(b, b_name, a, a_name)
