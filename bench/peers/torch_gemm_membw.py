#!/usr/bin/env python3
"""The peer of `kiln bench gemm --device cuda` and `kiln bench membw --device cuda`, measured in
the same run by bench/gpu_bench.sh: torch.matmul TFLOP/s on the same shapes and dtypes, and
torch's device-to-device tensor copy bandwidth (bytes read + written), timed with CUDA events.
Prints one JSON object."""
import json, sys, torch

def gemm(m, n, k, dtype, iters=20, warmup=5):
    a = torch.randn(m, k, device="cuda", dtype=dtype) * 0.5
    b = torch.randn(k, n, device="cuda", dtype=dtype) * 0.5
    for _ in range(warmup):
        torch.matmul(a, b)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        torch.matmul(a, b)
    e1.record()
    torch.cuda.synchronize()
    us = e0.elapsed_time(e1) * 1e3 / iters
    return {"m": m, "n": n, "k": k, "time_us": us, "tflops": 2 * m * n * k / (us * 1e-6) / 1e12}

def gemm_fp8(m, n, k, iters=20, warmup=5):
    """E4M3 x E4M3 -> bf16 with unit scales: y = x @ w.T, w stored [n, k] (cuBLASLt's FP8 layout)."""
    a = (torch.randn(m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    f = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    for _ in range(warmup):
        f()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        f()
    e1.record()
    torch.cuda.synchronize()
    us = e0.elapsed_time(e1) * 1e3 / iters
    return {"m": m, "n": n, "k": k, "time_us": us, "tflops": 2 * m * n * k / (us * 1e-6) / 1e12}

def copy(nbytes, iters=20):
    a = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32).fill_(1)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    best = 0
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); b.copy_(a); e1.record(); torch.cuda.synchronize()
        best = max(best, 2 * nbytes / (e0.elapsed_time(e1) * 1e-3) / 1e9)
    return {"bytes": nbytes, "gbs_best": best}

if __name__ == "__main__":
    # argv: SHAPES_JSON [DTYPES comma list, "copy" for the copies]; default: bf16,fp16,fp32,fp8,copy
    shapes = json.loads(sys.argv[1])
    want = (sys.argv[2] if len(sys.argv) > 2 else "bf16,fp16,fp32,fp8,copy").split(",")
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "gemm": [], "copy": []}
    for dt in [d for d in ["bf16", "fp16", "fp32"] if d in want]:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
        for m, n, k in shapes:
            r = gemm(m, n, k, dtype); r["dtype"] = dt; out["gemm"].append(r)
    if "fp8" in want:
        for m, n, k in shapes:
            r = gemm_fp8(m, n, k); r["dtype"] = "fp8"; out["gemm"].append(r)
    if "copy" in want:
        for nb in [1 << 26, 1 << 28, 1 << 30, 1 << 32]:
            out["copy"].append(copy(nb))
    print(json.dumps(out))
