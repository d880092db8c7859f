"""Fits the FMA-pipe sigmoid of scripts/diag/sm90_variants.cu (SigmoidSplit) and checks it in
float32 arithmetic, beside the tanh.approx form the library's bf16/fp16 kernels use.

sigmoid(z) ~ p(min(|z|, 8)) for z >= 0 and 1 - p(min(|z|, 8)) for z < 0, p of degree 7 fitted
on [0, 8] by iteratively reweighted least squares on Chebyshev nodes (near minimax), with p(8)
pinned to 1 so that the tails are 0 and 1. Runs on the CPU:

    python scripts/diag/sigmoid_poly.py
"""
import numpy as np
import torch

HI, DEG = 8.0, 7


def sigmoid64(z):
    return 1.0 / (1.0 + np.exp(-z))


def fit():
    z = np.cos(np.pi * (np.arange(6000) + 0.5) / 6000) * HI / 2 + HI / 2
    z = np.append(z, HI)
    target = sigmoid64(z)
    target[-1] = 1.0
    a = np.stack([z**j for j in range(DEG + 1)], 1)
    w = np.ones_like(z)
    for _ in range(80):
        ww = w.copy()
        ww[-1] = 1e4  # pins p(HI) to 1
        c, *_ = np.linalg.lstsq(a * ww[:, None], target * ww, rcond=None)
        e = np.abs(a @ c - target)
        e[-1] = 0
        w = w * (1 + e / e.max())
        w /= w.mean()
    return c.astype(np.float32)


def sigmoid_poly32(z, c):
    """The kernel's arithmetic in float32 (min.NaN keeps NaN)."""
    a = np.fmin(np.abs(z), np.float32(HI))
    a = np.where(np.isnan(z), z, a)
    p = np.full_like(a, c[-1])
    for cc in c[-2::-1]:
        p = (p * a + cc).astype(np.float32)
    p = np.where(np.isnan(p), p, np.minimum(p, np.float32(1)))
    return np.where(z < 0, (np.float32(1) - p).astype(np.float32), p)


def main():
    c = fit()
    print("coefficients (c0 .. c7):", ", ".join(f"{float(x):.9g}f" for x in c))
    z = np.linspace(-40, 40, 2_000_001).astype(np.float32)
    ref = sigmoid64(z.astype(np.float64))
    y = sigmoid_poly32(z, c)
    tanh_form = 0.5 + 0.5 * np.tanh(z.astype(np.float64) / 2) * (1 + 2.0**-11)  # tanh.approx's bound, worst sign
    print(f"max abs error: polynomial {np.abs(y - ref).max():.2e}, tanh.approx form (bound) {np.abs(tanh_form - ref).max():.2e}")
    print(f"range: [{y.min()}, {y.max()}]; NaN in -> {sigmoid_poly32(np.array([np.nan], np.float32), c)[0]}; "
          f"+-inf -> {sigmoid_poly32(np.array([np.inf, -np.inf], np.float32), c)}")
    inside = np.abs(z) <= HI
    for dtype in (torch.bfloat16, torch.float16):
        yq = torch.from_numpy(y).to(dtype).double().numpy()
        rq = torch.from_numpy(ref).to(dtype).double().numpy()
        print(f"{str(dtype)[6:]}: outputs that differ from the correctly rounded sigmoid (|z| <= 8) "
              f"{np.mean((yq != rq)[inside]):.1%}, max abs error after rounding {np.abs(yq - ref).max():.2e}")
    assert y.min() >= 0 and y.max() <= 1 and np.abs(y - ref).max() < 5e-4


if __name__ == "__main__":
    main()
