#!/usr/bin/env python3
"""The GEMMs of a CLIP vision tower alone, in a sustained loop, through torch (cuBLAS), bf16.

    python3 bench/peers/clip_gemm_floor.py DIR BATCH [SECONDS=8] [CHUNK=BATCH/2]

DIR: a benchmark directory of bench/peers/clip_peer.py (its config.json gives the vision tower's shape).

Why: under a sustained load this GPU is held at its board power limit, so a tower's images per second is the
power divided by its energy per image. The projections' GEMMs are work that neither kiln nor the peer can
avoid, and both run them at about cuBLAS's efficiency (kiln's fc1 is its own kernel at a similar rate). Their
energy per image, measured here under bench/peers/gpu_power.py, is therefore a floor under both sides: the
peer's joules per image divided by this floor bounds kiln's throughput ratio at the limit, and kiln's own joules
per image minus the floor is what its attention, layernorms and glue cost.

The work is kiln's tower (src/clip/clip_cuda.c) for BATCH images in chunks of CHUNK (kiln runs two chunks at
once): the patch embedding (patches x 3p^2 -> d), every layer but the last's q/k/v (d -> 3d), out (d -> d),
fc1 (d -> mlp) and fc2 (mlp -> d) over every token, and the last layer's keys and values (d -> 2d; kiln runs
the rest of that layer on the class token only). Random bf16 operands; no bias, activation, layernorm or
attention. Prints one JSON line in clip_peer.py's form (side "floor", images_per_s_median, ...) plus TFLOP/s and
the GEMM GFLOPs per image.
"""
import json
import os
import sys
import time


def tower_shape(config_path):
    """(tokens, d, mlp, layers, patch_in) of the vision tower in an HF CLIPModel config.json"""
    with open(config_path) as f:
        v = json.load(f)["vision_config"]
    p, img = v["patch_size"], v["image_size"]
    return (img // p) ** 2 + 1, v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"], 3 * p * p


def gemm_flops(images, tokens, d, mlp, layers, patch_in):
    """the FLOPs of tower() below for `images` images"""
    per_layer = 3 * d * d + d * d + 2 * d * mlp
    return 2.0 * images * ((tokens - 1) * patch_in * d + (layers - 1) * tokens * per_layer + tokens * 2 * d * d)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    import torch

    tokens, d, mlp, layers, patch_in = tower_shape(os.path.join(sys.argv[1], "config.json"))
    images = int(sys.argv[2])
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 8.0
    chunk = int(sys.argv[4]) if len(sys.argv) > 4 else max(1, images // 2)
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, device=dev, dtype=torch.float32, generator=g) * 0.02).to(dt)

    def out(*shape):
        return torch.empty(*shape, device=dev, dtype=dt)

    m, mp = chunk * tokens, chunk * (tokens - 1)
    w_patch, w_qkv, w_out, w_fc1, w_fc2 = rnd(d, patch_in), rnd(3 * d, d), rnd(d, d), rnd(mlp, d), rnd(d, mlp)
    x_patch, x, h = rnd(mp, patch_in), rnd(m, d), rnd(m, mlp)
    y_qkv, y_d, y_h = out(m, 3 * d), out(m, d), out(m, mlp)
    chunks = [min(chunk, images - c) for c in range(0, images, chunk)]

    def tower():
        for b in chunks:  # a last, smaller chunk runs on the leading rows of the same buffers
            r, rp = b * tokens, b * (tokens - 1)
            torch.matmul(x_patch[:rp], w_patch.t(), out=y_d[:rp])
            for _ in range(layers - 1):
                torch.matmul(x[:r], w_qkv.t(), out=y_qkv[:r])
                torch.matmul(x[:r], w_out.t(), out=y_d[:r])
                torch.matmul(x[:r], w_fc1.t(), out=y_h[:r])
                torch.matmul(h[:r], w_fc2.t(), out=y_d[:r])
            torch.matmul(x[:r], w_qkv[d:].t(), out=y_qkv[:r, : 2 * d])

    flops = gemm_flops(images, tokens, d, mlp, layers, patch_in)
    for _ in range(3):
        tower()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while True:
        tower()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
            if time.perf_counter() - t0 >= seconds:
                break
    el = time.perf_counter() - t0
    print(json.dumps({"side": "floor", "what": "the tower's GEMMs only (torch/cuBLAS bf16)", "device": "cuda",
                      "batch": images, "chunk": chunk, "iters": n, "seconds": round(el, 3),
                      "images_per_s_median": round(n * images / el, 1), "tflops": round(n * flops / el / 1e12, 1),
                      "gemm_gflop_per_image": round(flops / images / 1e9, 2), "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(0)}))


if __name__ == "__main__":
    main()
