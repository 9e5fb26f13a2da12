#!/usr/bin/env bash
# The CUDA attention kernels against torch SDPA (flash backend, enable_gqa), bf16, on the GPU machine,
# one script, one run: forward, backward and both in TFLOP/s (the same FLOP formula on both sides),
# kiln vs torch and their ratio. Shapes: the [cuda] benchmark's attention (B=4, T=4096, 8 query / 2 KV
# heads of 128, causal), the same with a 1024-token sliding window (kiln only: SDPA has no fused
# windowed kernel), and 16/4 heads of 64. JSON in $OUT (or ./bench-out).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
. scripts/gpu_machine_build.sh
kiln_gpu_build build-gpu ON kiln_bench_attn_gpu
iters=${ITERS:-20}
./build-gpu/kiln_bench_attn_gpu --shape 4,4096,8,2,128,0 --shape 4,4096,8,2,128,1024 --shape 4,4096,16,4,64,0 \
  --iters "$iters" --json "$out/attn_kiln.json"
python3 bench/peers/torch_attn.py '[[4,4096,8,2,128],[4,4096,16,4,64]]' "$iters" > "$out/attn_torch.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
kiln = json.load(open(f"{out}/attn_kiln.json"))["attention"]
peer = json.load(open(f"{out}/attn_torch.json"))
print(f"# kiln vs torch {peer['torch']} SDPA on {peer['gpu']}, bf16, TFLOP/s (ratio = kiln / torch)")
print(f"{'B':>2} {'T':>5} {'H':>3} {'KV':>3} {'D':>4} {'window':>6} | {'fwd kiln':>8} {'torch':>6} {'ratio':>5}"
      f" | {'bwd kiln':>8} {'torch':>6} {'ratio':>5} | {'f+b kiln':>8} {'torch':>6} {'ratio':>5}")
for k in kiln:
    key = (k["B"], k["T"], k["H"], k["KV"], k["D"], k["window"])
    p = next((x for x in peer["attention"] if (x["B"], x["T"], x["H"], x["KV"], x["D"], x["window"]) == key), None)
    row = f"{key[0]:2} {key[1]:5} {key[2]:3} {key[3]:3} {key[4]:4} {key[5]:6}"
    for f in ("fwd", "bwd", "fwd_bwd"):
        kv = k[f + "_tflops"]
        if p:
            row += f" | {kv:8.1f} {p[f + '_tflops']:6.1f} {kv / p[f + '_tflops']:5.2f}"
        else:
            row += f" | {kv:8.1f} {'-':>6} {'-':>5}"
    print(row)
PY
