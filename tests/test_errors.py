"""User errors: a RuntimeError naming the argument and what was expected, with the same message
from every backend's kernel and from the fake kernel (what torch.compile / torch.export run)."""

import pytest
import torch

import customops  # noqa: F401
from conftest import DEVICES

flsig = torch.ops.customops.fused_linear_sigmoid
focal = torch.ops.customops.sigmoid_focal_loss


def _cases(device):
    f32 = dict(device=device, dtype=torch.float32)
    x, w, b = torch.randn(4, 8, **f32), torch.randn(3, 8, **f32), torch.randn(3, **f32)
    return [
        # (op, args, substrings the message must hold)
        (flsig, (x.int(), w, b), ["x", "floating dtype", "torch.int32"]),
        (flsig, (x, w.bool(), b), ["weight", "floating dtype", "torch.bool"]),
        (flsig, (x, w.double(), b), ["weight", "dtype of x", "torch.float32", "torch.float64"]),
        (flsig, (x, w, b.half()), ["bias", "dtype of x", "torch.float16"]),
        (flsig, (torch.randn(4, 5, **f32), w, b), ["in_features", "weight.shape[1] = 8", "[4, 5]"]),
        (flsig, (x, w[0], b), ["weight", "2-D", "[8]"]),
        (flsig, (x, w, torch.randn(4, **f32)), ["bias", "(out_features,) = (3,)", "[4]"]),
        (flsig, (torch.randn((), **f32), w, b), ["x", "0-dimensional"]),
        (torch.ops.customops.add, (x, x.double()), ["b", "dtype of a"]),
        (torch.ops.customops.add, (x, x[:2]), ["b", "shape of a", "[4, 8]", "[2, 8]"]),
        (torch.ops.customops.add, (x.long(), x.long()), ["a", "torch.int64"]),
        (torch.ops.customops.sigmoid, (x.int(),), ["x", "torch.int32"]),
        (torch.ops.customops.sigmoid_backward, (x, x.half()), ["y", "dtype of grad_out"]),
        (flsig, (x.to(torch.uint16), w, b), ["x", "torch.uint16"]),
        (torch.ops.customops.sigmoid, (x.to(torch.float8_e4m3fn),), ["x", "torch.float8_e4m3fn"]),
        (focal, (x, x.double()), ["targets", "dtype of inputs"]),
        (focal, (x, x[:2]), ["targets", "shape of inputs", "[4, 8]", "[2, 8]"]),
        (focal, (x, x, 0.25, 2.0, "avg"), ["reduction", "'none', 'mean' or 'sum'", "'avg'"]),
        (focal, (x, x, 0.25, -1.0), ["gamma", ">= 0"]),
        (focal, (x, x, float("nan"), 2.0), ["alpha", "finite", "nan"]),
        (focal, (x, x, float("inf"), 2.0), ["alpha", "finite", "inf"]),
        (torch.ops.customops.sigmoid_focal_loss_backward, (x, x, x, 0.25, 2.0, "sum", [True, True]),
         ["grad_out", "0-dimensional", "[4, 8]"]),
    ]


@pytest.mark.parametrize("case", range(len(_cases("cpu"))))
def test_errors_name_the_argument_and_match_fake(device, case):
    op, args, expected = _cases(device)[case]
    with pytest.raises(RuntimeError) as eager:
        op(*args)
    msg = str(eager.value).splitlines()[0]
    for part in expected:
        assert part in msg, (part, msg)
    # The fake kernel (meta tensors) raises the same first line.
    meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(RuntimeError) as fake:
        op(*meta_args)
    assert str(fake.value).splitlines()[0] == msg


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
@pytest.mark.parametrize("which", ["weight", "x"])
def test_mixed_devices_name_both(which):
    x, w = torch.randn(4, 8, device="cuda"), torch.randn(3, 8, device="cuda")
    if which == "weight":
        w = w.cpu()
    else:
        x = x.cpu()
    with pytest.raises(RuntimeError, match=r"weight to be on the device of x \((cuda:0|cpu)\), but got (cpu|cuda:0)"):
        flsig(x, w, None)
    with pytest.raises(RuntimeError, match=r"b to be on the device of a \((cuda:0|cpu)\), but got (cpu|cuda:0)"):
        torch.ops.customops.add(x, x.cpu() if x.is_cuda else x.cuda())


@pytest.mark.parametrize("case", range(len(_cases("cpu"))))
def test_compiled_errors_match_eager(device, case):
    op, args, _ = _cases(device)[case]
    with pytest.raises(RuntimeError) as eager:
        op(*args)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a), backend="aot_eager", fullgraph=True)
    with pytest.raises(RuntimeError) as traced:
        compiled(*args)
    assert str(eager.value).splitlines()[0] in str(traced.value)
    torch._dynamo.reset()
