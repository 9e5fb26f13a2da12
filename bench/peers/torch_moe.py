"""The peer of `kiln bench moe --device cuda` (bench/moe_gpu.sh): the expert layer's GEMMs in torch, bf16.
argv: tokens hidden inter experts top_k iters. Prints JSON on stdout. For balanced routing (the same
slot counts per expert as kiln's balanced routing: tokens*top_k/experts each, +-1), times
  dense:    one torch.matmul of all routed rows (gate_up and down, forward), as kiln's dense rows;
  loop:     a Python loop over experts (what HF transformers' ZayaExperts-style modules run);
  grouped:  torch._grouped_mm (one launch for all experts) where this torch has it.
Forward GEMMs only (gate_up then down); TFLOP/s over 6*slots*hidden*inter."""
import json
import sys

import torch


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters * 1e3  # microseconds


def main():
    N, H, I, E, top, iters = (int(v) for v in sys.argv[1:7])
    S = N * top
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    counts = [S // E + (1 if e < S % E else 0) for e in range(E)]
    offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0).to(torch.int32)
    xe = torch.randn(S, H, device=dev, dtype=dt, generator=g)
    wgu = torch.randn(E, 2 * I, H, device=dev, dtype=dt, generator=g) * H ** -0.5
    wdn = torch.randn(E, H, I, device=dev, dtype=dt, generator=g) * I ** -0.5
    flops = 6.0 * S * H * I
    res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "tokens": N, "hidden": H, "inter": I,
           "experts": E, "top_k": top}

    def dense():
        gu = xe @ wgu[0].t()
        act = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        return act @ wdn[0].t()

    def loop():
        out, s0 = [], 0
        for e in range(E):
            x = xe[s0:s0 + counts[e]]
            gu = x @ wgu[e].t()
            out.append((torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]) @ wdn[e].t())
            s0 += counts[e]
        return torch.cat(out)

    def grouped():
        gu = torch._grouped_mm(xe, wgu.transpose(-2, -1), offs=offs)
        act = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        return torch._grouped_mm(act, wdn.transpose(-2, -1), offs=offs)

    for name, fn in (("dense", dense), ("loop", loop), ("grouped", grouped)):
        try:
            us = timed(fn, iters)
            res[name] = {"time_us": us, "tflops": flops / (us * 1e-6) / 1e12}
        except Exception as ex:  # torch without _grouped_mm, or a layout it refuses
            res[name] = {"error": f"{type(ex).__name__}: {ex}"[:300]}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
