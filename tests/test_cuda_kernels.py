"""Every CUDA kernel of fused_linear_sigmoid against a float64 reference.

Each kernel is run by name through customops::_fused_linear_sigmoid_with_kernel
(csrc/ops/fused_linear_sigmoid/fused_linear_sigmoid_cuda.cu) on shapes at and off its tile edges,
with fresh random inputs and
the output's memory poisoned with NaN beforehand, so an element a kernel fails to write shows.
Criterion: ‖out − ref‖ / ‖ref‖ ≤ 1e-2 for bf16/fp16, 1e-5 for IEEE float32, 5e-4 with
TF32, and every element finite.
"""

import pytest
import torch
import torch.nn.functional as F

import customops

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

WITH_KERNEL = torch.ops.customops._fused_linear_sigmoid_with_kernel
KERNEL_FOR = torch.ops.customops._fused_linear_sigmoid_cuda_kernel
SM90_KERNELS = ["sm90_pingpong_128x128", "sm90_pingpong_128x128_epi64", "sm90_coop_128x256"]


def _build_info():
    return customops.build_info()


def _is_hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def _run(kernel, m, k, n, dtype, bias=True, x_layout="contiguous", w_layout="contiguous"):
    gen = torch.Generator(device="cuda").manual_seed(m * 7919 + k * 31 + n)
    x = torch.randn(m, k + (8 if x_layout == "row_stride" else 0), device="cuda", dtype=dtype, generator=gen)
    if x_layout == "row_stride":
        x = x[:, :k]
    w = torch.randn(n, k + (8 if w_layout == "row_stride" else 0), device="cuda", dtype=dtype, generator=gen)
    w = (w[:, :k] if w_layout == "row_stride" else w) / k**0.5
    b = torch.randn(n, device="cuda", dtype=dtype, generator=gen) if bias else None
    ref = torch.sigmoid(F.linear(x.double(), w.double(), None if b is None else b.double()))
    torch.full((m, n), float("nan"), device="cuda", dtype=dtype)  # freed at once: the output reuses it
    out = WITH_KERNEL(x, w, b, kernel) if kernel else customops.fused_linear_sigmoid(x, w, b)
    torch.cuda.synchronize()
    assert out.shape == (m, n) and out.dtype == dtype
    assert torch.isfinite(out).all(), f"{kernel} left elements unwritten (NaN) at {m}x{k}x{n}"
    return _rel_err(out, ref)


SMALL_M_SHAPES = [  # (M, K, N), M <= 8 (one n-tile of x): 16-row weight blocks, k steps and chunks
    (1, 4096, 4096),
    (3, 72, 129),
    (8, 8, 1),
    (5, 4104, 127),
    (8, 1024, 256),
    (7, 520, 300),
    (2, 4096, 1000),
    (6, 8, 1),
    (4, 1000, 256),
    (8, 8192, 520),
    (1, 16384, 136),
    (2, 512, 20000),
]


@pytest.mark.skipif(not _is_hopper(), reason="the small-M kernel needs compute capability 9.0")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n", SMALL_M_SHAPES)
def test_small_m_kernel(m, k, n, dtype):
    assert _run("small_m", m, k, n, dtype) <= 1e-2


@pytest.mark.skipif(not _is_hopper(), reason="the small-M kernel needs compute capability 9.0")
@pytest.mark.parametrize("x_layout,w_layout", [("row_stride", "contiguous"), ("contiguous", "row_stride")])
def test_small_m_kernel_strided_rows_and_no_bias(x_layout, w_layout):
    err = _run("small_m", 7, 264, 200, torch.bfloat16, bias=False, x_layout=x_layout, w_layout=w_layout)
    assert err <= 1e-2


# Edges of 128x128 and 128x256 tiles and of 64x64/64x32 epilogue tiles, K below and off the 64-wide k tile.
SM90_SHAPES = [
    (65, 8, 8),
    (128, 64, 128),
    (129, 72, 136),
    (300, 200, 264),
    (1000, 1024, 1000),
    (257, 4096, 512),
    (4096, 256, 2048),
]


@pytest.mark.skipif(not _is_hopper(), reason="the CUTLASS kernels need compute capability 9.0")
@pytest.mark.parametrize("kernel", SM90_KERNELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n", SM90_SHAPES)
def test_sm90_kernels(kernel, m, k, n, dtype):
    if not _build_info().get("cutlass_sm90_kernels"):
        pytest.fail(
            "the CUTLASS kernels were not built, but this is a Hopper GPU: pip install nvidia-cutlass and rebuild"
        )
    assert _run(kernel, m, k, n, dtype, bias=(m % 2 == 1)) <= 1e-2


@pytest.mark.skipif(not _is_hopper(), reason="the CUTLASS kernels need compute capability 9.0")
@pytest.mark.parametrize("m,k,n", SM90_SHAPES)
def test_sm90_tf32_kernel(monkeypatch, m, k, n):
    if not _build_info().get("cutlass_sm90_kernels"):
        pytest.fail(
            "the CUTLASS kernels were not built, but this is a Hopper GPU: pip install nvidia-cutlass and rebuild"
        )
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    assert _run("sm90_pingpong_128x128", m, k, n, torch.float32, bias=(m % 2 == 1)) <= 5e-4


@pytest.mark.skipif(not _is_hopper(), reason="the CUTLASS kernels need compute capability 9.0")
def test_sm90_float32_needs_tf32_allowed(monkeypatch):
    # IEEE float32 never runs on the TF32 tensor cores, and only Pingpong has a TF32 build.
    if not _build_info().get("cutlass_sm90_kernels"):
        pytest.fail(
            "the CUTLASS kernels were not built, but this is a Hopper GPU: pip install nvidia-cutlass and rebuild"
        )
    x = torch.randn(512, 64, device="cuda")
    w = torch.randn(128, 64, device="cuda")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    with pytest.raises(RuntimeError, match="kernel sm90_pingpong_128x128 cannot run"):
        WITH_KERNEL(x, w, None, "sm90_pingpong_128x128")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    for kernel in ["sm90_pingpong_128x128_epi64", "sm90_coop_128x256"]:
        with pytest.raises(RuntimeError, match=f"kernel {kernel} cannot run"):
            WITH_KERNEL(x, w, None, kernel)


@pytest.mark.skipif(not _is_hopper(), reason="the CUTLASS kernels need compute capability 9.0")
@pytest.mark.parametrize(
    "kernel,dtype",
    [(k, d) for k in SM90_KERNELS for d in (torch.bfloat16, torch.float16)]
    + [("sm90_pingpong_128x128", torch.float32)],
)
def test_sm90_epilogue_saturates_and_carries_nan(monkeypatch, kernel, dtype):
    # The epilogue's sigmoid (tanh.approx for 16-bit, exp and a reciprocal for TF32): logits of
    # +-inf and +-1e4 give exactly 1 and 0, a NaN in x or the bias gives NaN as torch does, and
    # every other output stays in [0, 1] and near the float64 reference.
    if not _build_info().get("cutlass_sm90_kernels"):
        pytest.fail(
            "the CUTLASS kernels were not built, but this is a Hopper GPU: pip install nvidia-cutlass and rebuild"
        )
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", dtype == torch.float32)
    m, k, n = 300, 128, 264
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k**0.5
    b = torch.randn(n, device="cuda", dtype=dtype, generator=gen)
    b[:5] = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e4, -1e4])
    x[7] = float("nan")
    torch.full((m, n), float("nan"), device="cuda", dtype=dtype)  # freed at once: an unwritten element stays NaN
    out = WITH_KERNEL(x, w, b, kernel).double()
    ref = torch.sigmoid(F.linear(x.double(), w.double(), b.double()))
    assert (
        torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[7]).all() and torch.isnan(out[:, 2]).all()
    )
    rows = torch.arange(m, device="cuda") != 7
    assert (out[rows, 0] == 1).all() and (out[rows, 3] == 1).all()
    assert (out[rows, 1] == 0).all() and (out[rows, 4] == 0).all()
    finite = out[rows][:, 5:]
    assert ((finite >= 0) & (finite <= 1)).all()
    assert _rel_err(finite, ref[rows][:, 5:]) <= (5e-4 if dtype == torch.float32 else 1e-2)


@pytest.mark.skipif(not _is_hopper(), reason="the CUTLASS kernels need compute capability 9.0")
@pytest.mark.parametrize("kernel", SM90_KERNELS)
def test_sm90_kernel_strided_rows(kernel):
    assert _run(kernel, 200, 256, 136, torch.bfloat16, x_layout="row_stride", w_layout="row_stride") <= 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (77, 129, 7), (300, 200, 264)])
def test_generic_kernel(monkeypatch, m, k, n, dtype):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    limit = 1e-5 if dtype == torch.float32 else 1e-2
    assert _run("generic", m, k, n, dtype) <= limit


def test_float32_follows_the_tf32_setting(monkeypatch):
    # IEEE float32 unless the user allows TF32, like torch.mm.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    assert _run("", 512, 1024, 512, torch.float32) <= 1e-5
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    assert _run("", 512, 1024, 512, torch.float32) <= 5e-4  # the TF32 CUTLASS kernel on Hopper
    assert _run("", 77, 129, 7, torch.float32) <= 5e-4  # cuBLAS TF32


def test_float32_follows_the_new_fp32_precision_setting(monkeypatch):
    # torch >= 2.9's fp32_precision, alone (ATen's legacy allowTF32CuBLAS() throws then): TF32 is
    # allowed, and on Hopper the default dispatch is the TF32 CUTLASS kernel, bit for bit. K = 256 is
    # also where 16-bit inputs take the 64x64-epilogue kernel, which has no TF32 build: float32 must
    # fall through to Pingpong (the dispatch would raise an internal error otherwise).
    owner = torch.backends.cuda.matmul
    monkeypatch.setattr(owner, "fp32_precision", "tf32")
    x = torch.randn(2048, 256, device="cuda")
    w = torch.randn(2048, 256, device="cuda") / 16
    b = torch.randn(2048, device="cuda")
    out = customops.fused_linear_sigmoid(x, w, b)
    ref = torch.sigmoid(F.linear(x.double(), w.double(), b.double()))
    assert _rel_err(out, ref) <= 5e-4
    if _is_hopper() and _build_info().get("cutlass_sm90_kernels"):
        assert torch.equal(out, WITH_KERNEL(x, w, b, "sm90_pingpong_128x128"))
    monkeypatch.setattr(owner, "fp32_precision", "ieee")
    assert _rel_err(customops.fused_linear_sigmoid(x, w, b), ref) <= 1e-5


@pytest.mark.skipif(not _is_hopper(), reason="the CUTLASS kernels need compute capability 9.0")
def test_expanded_weight_rows_take_the_generic_path():
    # A weight whose rows all alias one row (stride 0) cannot be a TMA operand.
    x = torch.randn(512, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1, 64, device="cuda", dtype=torch.bfloat16).expand(96, 64)
    ref = torch.sigmoid(F.linear(x.double(), w.double()))
    assert _rel_err(customops.fused_linear_sigmoid(x, w), ref) <= 1e-2
    assert KERNEL_FOR(x, w) == "generic"
    with pytest.raises(RuntimeError, match="cannot run"):
        WITH_KERNEL(x, w, None, "sm90_pingpong_128x128")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (40, 96, 72), (100, 64, 64), (512, 512, 512), (33, 30, 7)])
def test_default_dispatch(m, k, n, dtype):
    assert _run("", m, k, n, dtype) <= 1e-2


DISPATCH_CASES = [  # (M, K, N, dtype, the kernel choose_kernel must pick on Hopper with CUTLASS built)
    (1, 4096, 4096, torch.bfloat16, "small_m"),
    (8, 256, 8192, torch.float16, "small_m"),
    (8, 256, 8200, torch.bfloat16, "generic"),  # N > 8192
    (9, 256, 256, torch.bfloat16, "generic"),
    (511, 512, 256, torch.bfloat16, "generic"),
    (512, 512, 256, torch.bfloat16, "sm90_pingpong_128x128_epi64"),  # K <= 512
    (512, 520, 2048, torch.float16, "sm90_pingpong_128x128"),
    (2048, 2048, 8192, torch.bfloat16, "sm90_coop_128x256"),  # M * N = 2^24
    (2048, 2048, 8200, torch.bfloat16, "sm90_pingpong_128x128"),  # M * N > 2^24
    (2047, 2048, 4096, torch.bfloat16, "sm90_pingpong_128x128"),  # M < 2048
    (16384, 2048, 248, torch.float16, "sm90_pingpong_128x128"),  # N < 256
    # The wave model: too few output tiles for the SMs over a long K.
    (512, 4096, 1024, torch.bfloat16, "generic"),  # 32 tiles
    (8192, 8192, 128, torch.bfloat16, "generic"),  # a router's shape: 64 tiles
    (2048, 4096, 1024, torch.bfloat16, "sm90_pingpong_128x128"),  # Cooperative's 64 tiles lose, Pingpong's 128 not
    (512, 256, 192, torch.float32, "generic"),  # IEEE float32 (TF32 not allowed)
]


@pytest.mark.skipif(not _is_hopper(), reason="the thresholds are Hopper's (small-M and CUTLASS kernels)")
@pytest.mark.parametrize("m,k,n,dtype,expected", DISPATCH_CASES)
def test_default_dispatch_picks_the_documented_kernel(monkeypatch, m, k, n, dtype, expected):
    if not _build_info().get("cutlass_sm90_kernels"):
        pytest.fail(
            "the CUTLASS kernels were not built, but this is a Hopper GPU: pip install nvidia-cutlass and rebuild"
        )
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(n, device="cuda", dtype=dtype)
    assert KERNEL_FOR(x, w, b) == expected
    # The report is the forward's own choice: the named kernel's output, bit for bit.
    torch.testing.assert_close(customops.fused_linear_sigmoid(x, w, b), WITH_KERNEL(x, w, b, expected), rtol=0, atol=0)


@pytest.mark.skipif(not _is_hopper(), reason="the thresholds are Hopper's (small-M and CUTLASS kernels)")
def test_tf32_at_small_k_takes_pingpong_not_the_16_bit_only_kernel(monkeypatch):
    # K <= 512 sends 16-bit inputs to the 64x64-epilogue kernel, which has no TF32 build.
    if not _build_info().get("cutlass_sm90_kernels"):
        pytest.fail(
            "the CUTLASS kernels were not built, but this is a Hopper GPU: pip install nvidia-cutlass and rebuild"
        )
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    x, w = torch.randn(2048, 256, device="cuda"), torch.randn(2048, 256, device="cuda") / 16
    assert KERNEL_FOR(x, w) == "sm90_pingpong_128x128"


def test_float64_takes_the_generic_kernel_anywhere():
    x = torch.randn(3, 5, device="cuda", dtype=torch.float64)
    w = torch.randn(4, 5, device="cuda", dtype=torch.float64)
    assert KERNEL_FOR(x, w) == "generic"
    assert KERNEL_FOR(x[None], w) == "generic"  # the dispatch sees x's rows, whatever its rank


def test_forcing_a_kernel_that_cannot_run_names_it():
    x = torch.randn(4, 12, device="cuda")  # float32: no small-M or CUTLASS kernel
    w = torch.randn(8, 12, device="cuda")
    with pytest.raises(RuntimeError, match="kernel small_m cannot run x of shape \\[4, 12\\] and dtype torch.float32"):
        WITH_KERNEL(x, w, None, "small_m")
    big = torch.randn(9, 64, device="cuda", dtype=torch.bfloat16)  # the small-M kernel takes M <= 8
    with pytest.raises(RuntimeError, match="kernel small_m cannot run"):
        WITH_KERNEL(big, torch.randn(8, 64, device="cuda", dtype=torch.bfloat16), None, "small_m")
    with pytest.raises(RuntimeError, match="expected kernel to be one of generic, small_m, sm90_pingpong_128x128, "):
        WITH_KERNEL(x, w, None, "fastest")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
# (70000, 8): several passes of each thread's four-row loop.
@pytest.mark.parametrize("rows,n", [(1, 8), (5000, 64), (37, 1000), (300, 12), (70000, 8)])
def test_backward_bias_gradient_pass(rows, n, dtype):
    # The fused sigmoid' + column-sum pass (N a multiple of the vector width) and its fallback.
    k = 24
    x = torch.randn(rows, k, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, k, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn(rows, n, device="cuda", dtype=dtype)
    grads = torch.autograd.grad(customops.fused_linear_sigmoid(x, w, b), (x, w, b), g)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    refs = torch.autograd.grad(torch.sigmoid(F.linear(xd, wd, bd)), (xd, wd, bd), g.double())
    for name, got, ref in zip("xWb", grads, refs):
        err = _rel_err(got, ref)
        assert err <= (1e-5 if dtype == torch.float32 else 1e-2), f"grad {name}: relative error {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_generic_kernel_is_eager_bit_for_bit(monkeypatch, dtype, bias):
    # The generic path makes eager's own calls (addmm with the bias, then sigmoid), so it
    # rounds exactly as F.linear + torch.sigmoid does.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    x = torch.randn(100, 72, device="cuda", dtype=dtype)
    w = torch.randn(40, 72, device="cuda", dtype=dtype)
    b = torch.randn(40, device="cuda", dtype=dtype) if bias else None
    assert torch.equal(WITH_KERNEL(x, w, b, "generic"), torch.sigmoid(F.linear(x, w, b)))


@pytest.mark.skipif(not _is_hopper(), reason="the small-M kernel needs compute capability 9.0")
def test_small_m_failed_launch_is_a_runtime_error_naming_it():
    # The spec's cuda_launch path covers the kernels every GPU runs; this one runs on sm_90 alone.
    from customops.testing.paths import assert_launch_fails

    setup = 'x, w = torch.randn(4, 64, device="cuda").bfloat16(), torch.randn(64, 64, device="cuda").bfloat16()'
    assert_launch_fails("fused_linear_sigmoid_small_m_kernel", setup, "customops.fused_linear_sigmoid(x, w, None)")
