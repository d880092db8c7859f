# Small-row IEEE float32 GEMMs: cuBLAS's own vs split-K as a batched GEMM + sum.
import torch
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
def t(f, n=40):
    for _ in range(3): f()
    ts = []
    for _ in range(n):
        flush.zero_()
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort(); return ts[len(ts) // 2]
for dt in (torch.float32, torch.float16):
  for M, K, N in [(16, 4608, 512), (49, 4608, 512), (49, 2304, 256), (35, 9216, 1024), (140, 4608, 512), (392, 4608, 512), (196, 2304, 1024), (1050, 4608, 512), (100, 1152, 128), (49, 4608, 2048)]:
    cols = torch.randn(M, K, device=dev, dtype=dt); w = torch.randn(N, K, device=dev, dtype=dt)
    ref = (cols.double() @ w.double().t())
    out = torch.empty(M, N, device=dev, dtype=dt)
    res = {}
    res["mm"] = t(lambda: torch.mm(cols, w.t(), out=out))
    e0 = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    outT = torch.empty(N, M, device=dev, dtype=dt)
    res["mmT"] = t(lambda: torch.mm(w, cols.t(), out=outT))
    errs = {}
    for S in (2, 4, 8, 16, 32):
        if K % S: continue
        Ks = K // S
        part = torch.empty(S, M, N, device=dev, dtype=torch.float32)
        a_ = cols.view(M, S, Ks).transpose(0, 1)
        b_ = w.view(N, S, Ks).permute(1, 2, 0)
        if dt == torch.float32:
            f = lambda: torch.sum(torch.bmm(a_, b_, out=part), 0, out=out)
        else:
            part16 = torch.empty(S, M, N, device=dev, dtype=dt)
            f = lambda: torch.sum(torch.bmm(a_, b_, out=part16), 0, dtype=torch.float32)
        res[f"s{S}"] = t(f)
        f(); 
        if dt == torch.float32:
            errs[S] = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    best = min(res, key=res.get)
    print(f"{str(dt)[6:]:8s} M={M:5d} K={K:5d} N={N:5d} GFLOP={2*M*K*N/1e9:.3f} " + " ".join(f"{k}={v:.1f}" for k, v in res.items()) + f" best={best} mm/best={res['mm']/res[best]:.2f} err0={e0:.1e} errS={max(errs.values()) if errs else 0:.1e}", flush=True)
