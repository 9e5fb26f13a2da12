#!/usr/bin/env python3
"""The peer of `kiln bench attention --device cuda` (bench/attn_gpu.sh): torch.nn.functional.scaled_dot_product_attention,
causal, enable_gqa, bf16, on tensors laid out [B, T, heads, D] as the model holds them (transposed views,
as HF does), forward, backward and both, timed with CUDA events over `iters` calls after `warmup`.
FLOPs counted as kiln counts them (src/bench/kernel_formulas.h): forward 4*B*H*D*(visible pairs),
backward 2.5x. Sliding windows are not offered by SDPA's fused kernels, so only causal shapes run here.
Usage: torch_attn.py '[[B,T,H,KV,D], ...]' [iters] [warmup]   Prints one JSON object."""
import json, sys, torch
import torch.nn.functional as F

def pairs(T):
    return T * (T + 1) / 2

def bench(B, T, H, KV, D, iters, warmup):
    dev, dt = "cuda", torch.bfloat16
    q = (torch.rand(B, T, H, D, device=dev) * 4 - 2).to(dt).requires_grad_()
    k = (torch.rand(B, T, KV, D, device=dev) * 4 - 2).to(dt).requires_grad_()
    v = (torch.rand(B, T, KV, D, device=dev) * 2 - 1).to(dt).requires_grad_()
    dout = (torch.rand(B, H, T, D, device=dev) * 2 - 1).to(dt)
    fwd = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=True)

    def timed(f):
        for _ in range(warmup):
            f()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            f()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) * 1e3 / iters  # microseconds

    with torch.no_grad():
        us_f = timed(fwd)
    o = fwd()
    us_b = timed(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    us_fb = timed(lambda: torch.autograd.grad(fwd(), (q, k, v), dout))
    f = 4.0 * B * H * D * pairs(T)
    return {"B": B, "T": T, "H": H, "KV": KV, "D": D, "window": 0, "fwd_us": us_f, "bwd_us": us_b,
            "fwd_bwd_us": us_fb, "fwd_tflops": f / us_f / 1e6, "bwd_tflops": 2.5 * f / us_b / 1e6,
            "fwd_bwd_tflops": 3.5 * f / us_fb / 1e6}

def main():
    shapes = json.loads(sys.argv[1]) if len(sys.argv) > 1 else [[4, 4096, 8, 2, 128]]
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    warmup = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    res = [bench(*s, iters, warmup) for s in shapes]
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "attention": res}, indent=1))

if __name__ == "__main__":
    main()
