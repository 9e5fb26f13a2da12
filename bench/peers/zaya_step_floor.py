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

The design floor (session 44) adds what that floor leaves out, at its least. Issue [cuda] fixes the design: GEMMs
through cuBLASLt (their inputs and outputs in memory; epilogues of bias and activation only, no prologue, no gather),
the residual stream and its gradient in f32, f32 master weights and AdamW state. Under those rules:
- AdamW can move no fewer than 26 bytes a parameter (m and v read and written, 16; the f32 master read and written,
  8, its high half serving as the bf16 weight; a bf16 gradient read, 2). kiln's AdamW moves ~26.35.
- Every pass between two GEMMs must read the GEMM outputs and the stored tensors it needs, and write the next GEMMs'
  inputs, the residual stream and what the backward reads, at least once each. `pass_bytes` lists those bytes
  tensor by tensor, as if each run of non-GEMM ops between two GEMMs were one perfect pass. They are timed here as
  device copies of the same byte count.
The design floor is the tensor work, plus 26/30 of the optimizer's copies, plus the passes' copies. No implementation
of that design steps faster on this board while every token reaches an expert (tokens routed to the skip expert
cost no expert work: at a skip share s the experts' GEMMs and passes shrink by s). kiln's step minus it is what
kiln's own passes, kernel gaps and distance from cuBLAS cost. Otherwise the floor is optimistic: the experts are one
dense GEMM, every pass is perfect, nothing waits on the host, the CCA convolutions' FLOPs and the gradient norm's
reads (kiln clips; the peer does not) are left out.
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


OPT_MIN_BYTES = 26  # AdamW's least traffic a parameter under the design rules above


def pass_bytes(m):
    """[(key, what, bytes a token)] of the least memory traffic of the step's passes under the design rules above;
    the layers' items count all of the layers; key names the group of kiln's op classes the item is set against
    (bench/cuda_train.sh). Activations bf16, the residual stream and its gradient f32; every token is routed to an
    expert (top-k, no skip), as the tensor work counts it."""
    H, L, V, R = m["hidden_size"], m["num_hidden_layers"], m["vocab_size"], m["router_hidden_size"]
    Q, K = m["num_attention_heads"] * m["head_dim"], m["num_key_value_heads"] * m["head_dim"]
    E1, top = m["num_experts"] + 1, m["num_experts_per_tok"]
    I = top * m["moe_intermediate_size"]
    P = Q + 2 * K  # the in-projection's output: q, k and the value's two halves; also qr, kr and v together
    router = 3 * 2 * R + 2 * 2 * 2 * R + 4 * E1 + 8  # rdown + the previous layer's in, rn out; two GELUs; the head
    return [
        # forward, a layer
        ("joins_fwd", "residual joins + RMSNorm fwd: read the stream (f32) and the branch (o, or the experts' rows), "
         "write the stream and the next norm's bf16 output; two a layer", L * 2 * (4 * H + 2 * H + 4 * H + 2 * H)),
        ("cca_fwd", "CCA convolutions + QK norm + RoPE + value shift fwd: read the in-projection, write qr, kr, v",
         L * 2 * P * 2),
        ("router_fwd", "router fwd: state mix + RMSNorm, two GELUs, softmax + top-k", L * router),
        ("experts", "experts fwd: gather the routed rows (read ln2, write them)", L * top * 2 * 2 * H),
        ("experts", "experts fwd: SwiGLU (read gate and up, write the product)", L * (2 * 2 * I + 2 * I)),
        # backward, a layer
        # the MLP join's with the next norm's: read d(out) (f32), res1 and the experts' rows (the per-channel
        # scales' gradients and the gate's; out, the norm's input, recomputed from them), the norm output's
        # gradient; write d(res1) and the rows' gradient. The attention join's with ln2's: read d(res1), x and o
        # (the scales' gradients; res1, ln2's input, recomputed from them), ln2's gradient from the experts and
        # from the router; write d(x) and d(o)
        ("joins_bwd", "residual joins + RMSNorm bwd: the MLP join (with the next norm) and the attention join (with "
         "ln2)", L * ((4 * H + 4 * H + 2 * H + 2 * H + 4 * H + 2 * H) + (4 * H + 4 * H + 2 * H + 2 * 2 * H + 4 * H + 2 * H))),
        ("cca_bwd", "CCA convolutions + QK norm + RoPE + value shift bwd: read dqr, dkr, dv and the in-projection (the "
         "rest recomputed), write the in-projection's gradient", L * 3 * P * 2),
        ("router_bwd", "router bwd: the same tensors' gradients, the depth carry in f32", L * 2 * router),
        ("experts", "experts bwd: SwiGLU (read the product's gradient, gate and up; write their gradients)",
         L * (2 * I + 2 * 2 * I + 2 * 2 * I)),
        # once
        ("embedding", "embedding fwd + the input join: read the row, write the stream and layer 0's norm output",
         2 * H + 4 * H + 2 * H),
        ("embedding", "embedding bwd: read the stream's gradient, add it into the tied weight's f32 gradient row",
         4 * H + 2 * 4 * H),
        ("cross_entropy", "cross-entropy: read the logits, write their gradient (bf16)", 2 * V + 2 * V),
    ]


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
    passes = pass_bytes(m)
    pass_step = N * sum(b for _, _, b in passes)
    npass = max(1, round(pass_step / (2 * buf)))

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

    def copies(n):
        for _ in range(n):
            dst.copy_(src)

    mm_flops = 6.0 * N * (L * sum(i * o for _, i, o in layer) + H * V)
    attn_flops = L * 3.5 * 4.0 * B * NH * D * T * (T + 1) / 2  # forward QKᵀ, PV over the causal half; backward 2.5x
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    for _ in range(2):
        tensor_work(), copies(ncopy), copies(npass)
    torch.cuda.synchronize()
    steps, t_tensor, t_opt, t_pass = 0, 0.0, 0.0, 0.0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ev[0].record()
        tensor_work()
        ev[1].record()
        copies(ncopy)
        ev[2].record()
        copies(npass)
        ev[3].record()
        ev[3].synchronize()
        t_tensor += ev[0].elapsed_time(ev[1])
        t_opt += ev[1].elapsed_time(ev[2])
        t_pass += ev[2].elapsed_time(ev[3])
        steps += 1
    wall = time.perf_counter() - t0
    # the step floor (as before session 44) is the tensor work and the optimizer's copies; the design floor takes
    # 26 of the optimizer's 30 bytes a parameter and adds the passes' copies (each copy's time scaled to the exact
    # byte count: the copies move whole GiB)
    tensor_ms, opt_ms, pass_ms = t_tensor / steps, t_opt / steps, t_pass / steps
    tb_s = 2 * buf * (ncopy + npass) / ((opt_ms + pass_ms) * 1e-3) / 1e12
    opt_min_ms, pass_min_ms = OPT_MIN_BYTES * params / (tb_s * 1e9), pass_step / (tb_s * 1e9)
    design = {"ms_per_step": tensor_ms + opt_min_ms + pass_min_ms,
              "optimizer_bytes_per_param": OPT_MIN_BYTES, "optimizer_ms_per_step": opt_min_ms,
              "passes_bytes_per_step": pass_step, "passes_ms_per_step": pass_min_ms,
              "copy_tb_per_s": tb_s,
              "passes": [{"key": k, "what": w, "bytes": N * b} for k, w, b in passes]}
    floor_ms = tensor_ms + opt_ms
    res = {"side": "step floor", "steps": steps, "ms_per_step": floor_ms, "loop_wall_ms_per_step": 1e3 * wall / steps,
           "tensor_ms_per_step": tensor_ms, "optimizer_traffic_ms_per_step": opt_ms,
           "matmul_tflop_per_step": mm_flops / 1e12, "attention_tflop_per_step": attn_flops / 1e12,
           "tensor_tflops": (mm_flops + attn_flops) / (tensor_ms * 1e-3) / 1e12,
           "optimizer_bytes_per_step": 2 * buf * ncopy, "optimizer_tb_per_s": 2 * buf * ncopy / (opt_ms * 1e-3) / 1e12,
           "passes_copies_ms_per_step": pass_ms, "design_floor": design,
           "tokens_per_step": N, "tokens_per_s": N / (floor_ms * 1e-3), "params": params,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
