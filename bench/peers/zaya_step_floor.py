#!/usr/bin/env python3
"""The tensor work of one ZAYA training step alone, in a sustained loop, through torch (cuBLAS, SDPA), bf16.

    python3 bench/peers/zaya_step_floor.py [SECONDS=8] [CONFIG.json]

CONFIG: a kiln training config (bench/cuda_train.sh writes one); without it, issue [cuda]'s benchmark config
(hidden 2048, 8 hybrid layers, 16 experts top-1, moe_intermediate 2048, 8 query / 2 KV heads of 128, router 256,
vocab 50304 tied, sequence 4096, micro-batch 4).

Why: a sustained load on this GPU meets the board's power limit, and the driver then lowers the clock, so a
training step can go no faster than the energy of its unavoidable work allows. That work, measured here under
bench/peers/gpu_power.py, is every matmul of the step at cuBLAS's efficiency — each linear's forward (X Wᵀ),
input gradient (dY W) and weight gradient (dYᵀ X): the in-projection (q, k and both v: hidden -> Q + 2K), o_proj,
the router MLP, the experts as one dense GEMM over every token (gate_up hidden -> 2I and down I -> hidden; a
grouped GEMM over 16 experts is no cheaper), the tied LM head — and causal GQA attention forward and backward
through torch's SDPA (flash), plus AdamW's memory traffic (30 bytes a parameter: w, g, m, v read; w, m, v and the
bf16 copy written) as device copies of the same byte count. Not included: the CCA convolutions (0.7% of the
FLOPs), norms, residual scaling, routing glue, embedding and cross-entropy. Prints one JSON line: the step's time
in the loop (tensor work and optimizer traffic separately, CUDA events), the matmul and attention FLOPs, their
rate, and the traffic's rate; bench/cuda_train.sh sets it beside both sides' steps.
"""
import json
import sys
import time


def shapes(m):
    """(name, in, out) of every linear of one layer, for `m` the config's model section"""
    H, R, E, I = m["hidden_size"], m["router_hidden_size"], m["num_experts"], m["moe_intermediate_size"]
    Q, K = m["num_attention_heads"] * m["head_dim"], m["num_key_value_heads"] * m["head_dim"]
    return [("in_proj", H, Q + 2 * K), ("o_proj", Q, H), ("router0", H, R), ("router1", R, R), ("router2", R, R),
            ("router3", R, E + 1), ("gate_up", H, 2 * I * m["num_experts_per_tok"]),
            ("down", I * m["num_experts_per_tok"], H)]


def main():
    import torch
    import torch.nn.functional as F

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    cfg = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {
        "model": {"vocab_size": 50304, "hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 8,
                  "num_key_value_heads": 2, "head_dim": 128, "num_experts": 16, "num_experts_per_tok": 1,
                  "moe_intermediate_size": 2048, "router_hidden_size": 256},
        "data": {"seq_len": 4096, "micro_batch": 4}}
    m = cfg["model"]
    T, B = cfg["data"]["seq_len"], cfg["data"]["micro_batch"]
    N, H, V, L = B * T, m["hidden_size"], m["vocab_size"], m["num_hidden_layers"]
    NH, KV, D = m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"]
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*s):
        return (torch.randn(*s, device=dev, dtype=torch.float32, generator=g) * 0.02).to(dt)

    layer = shapes(m)
    lin = layer + [("lm_head", H, V)]
    widest = max(max(i, o) for _, i, o in lin)
    x, dy = rnd(N, widest), rnd(N, widest)
    ws = {n: rnd(o, i) for n, i, o in lin}
    y, dx = torch.empty(N, widest, device=dev, dtype=dt), torch.empty(N, widest, device=dev, dtype=dt)
    dws = {n: torch.empty(o, i, device=dev, dtype=dt) for n, i, o in lin}
    q = rnd(B, NH, T, D).requires_grad_()
    k, v = rnd(B, KV, T, D).requires_grad_(), rnd(B, KV, T, D).requires_grad_()
    do = rnd(B, NH, T, D)
    # AdamW's traffic: parameters as kiln counts them (embedding tied with the head; the experts' full weights)
    params = V * H + L * sum(i * o for n, i, o in layer if n not in ("gate_up", "down")) \
        + L * m["num_experts"] * 3 * H * m["moe_intermediate_size"]
    opt_bytes = 30 * params
    buf = 1 << 30  # 1 GiB copies: a copy moves twice its size
    src, dst = torch.empty(buf, device=dev, dtype=torch.uint8), torch.empty(buf, device=dev, dtype=torch.uint8)
    ncopy = max(1, round(opt_bytes / (2 * buf)))

    def linear3(n, i, o, rows):
        torch.matmul(x[:rows, :i], ws[n].t(), out=y[:rows, :o])   # forward
        torch.matmul(dy[:rows, :o], ws[n], out=dx[:rows, :i])     # input gradient
        torch.matmul(dy[:rows, :o].t(), x[:rows, :i], out=dws[n])  # weight gradient

    def tensor_work():
        for _ in range(L):
            for n, i, o in layer:
                linear3(n, i, o, N)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=KV != NH)
            out.backward(do)
        linear3("lm_head", H, V, N)

    def optim_traffic():
        for _ in range(ncopy):
            dst.copy_(src)

    mm_flops = 6.0 * N * (L * sum(i * o for _, i, o in layer) + H * V)
    attn_flops = L * 3.5 * 4.0 * B * NH * D * T * (T + 1) / 2  # forward QKᵀ, PV over the causal half; backward 2.5x
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    for _ in range(2):
        tensor_work(), optim_traffic()
    torch.cuda.synchronize()
    steps, t_tensor, t_opt = 0, 0.0, 0.0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ev[0].record()
        tensor_work()
        ev[1].record()
        optim_traffic()
        ev[2].record()
        ev[2].synchronize()
        t_tensor += ev[0].elapsed_time(ev[1])
        t_opt += ev[1].elapsed_time(ev[2])
        steps += 1
    wall = time.perf_counter() - t0
    res = {"side": "step floor", "steps": steps, "ms_per_step": 1e3 * wall / steps,
           "tensor_ms_per_step": t_tensor / steps, "optimizer_traffic_ms_per_step": t_opt / steps,
           "matmul_tflop_per_step": mm_flops / 1e12, "attention_tflop_per_step": attn_flops / 1e12,
           "tensor_tflops": (mm_flops + attn_flops) / (t_tensor / steps * 1e-3) / 1e12,
           "optimizer_bytes_per_step": 2 * buf * ncopy, "optimizer_tb_per_s": 2 * buf * ncopy / (t_opt / steps * 1e-3) / 1e12,
           "tokens_per_step": N, "tokens_per_s": N * steps / wall, "params": params,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
