#!/usr/bin/env bash
# The CUDA attention kernels against torch SDPA (flash backend, enable_gqa), bf16, on the GPU machine,
# one script, one run: forward and forward + backward in TFLOP/s (the same FLOP formula on both sides:
# forward 4·B·H·D·pairs, forward + backward 3.5×), kiln vs torch and their ratio. kiln's side is
# `kiln bench attention --device cuda --impl $IMPL`, one row per implementation (default own,cudnn-nondet,cudnn:
# kiln's kernels, cuDNN's fused flash attention with the atomic-dQ backward, with the deterministic one —
# the trainer's default, last so that kiln size takes it from these profiles). Shapes: the [cuda] benchmark's attention (B=4, T=4096, 8 query /
# 2 KV heads of 128, causal), the same with a 1024-token sliding window (kiln only: SDPA has no fused
# windowed kernel), and 16/4 heads of 64. JSON profiles in $OUT (or ./bench-out).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
. scripts/gpu_machine_build.sh
kiln_gpu_build build-gpu ON kiln
K=./build-gpu/kiln
iters=${ITERS:-20}
common=(bench attention --device cuda --impl "${IMPL:-own,cudnn-nondet,cudnn}" --batch 4 --seq 4096 --iters "$iters" --warmup 3)
"$K" "${common[@]}" --heads 8 --kv-heads 2 --head-dim 128 --json "$out/attn_kiln_h128.json"
"$K" "${common[@]}" --heads 8 --kv-heads 2 --head-dim 128 --window 1024 --json "$out/attn_kiln_h128_w1024.json"
"$K" "${common[@]}" --heads 16 --kv-heads 4 --head-dim 64 --json "$out/attn_kiln_h64.json"
python3 bench/peers/torch_attn.py '[[4,4096,8,2,128],[4,4096,16,4,64]]' "$iters" > "$out/attn_torch.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
kiln = {}
for f in ("attn_kiln_h128", "attn_kiln_h128_w1024", "attn_kiln_h64"):
    for r in json.load(open(f"{out}/{f}.json"))["attention"]:
        key = (r["batch"], r["seq"], r["heads"], r["kv_heads"], r["head_dim"], r["window"], r["backend"])
        kiln.setdefault(key, {})[r["pass"]] = r["flops"] / r["time_us"] / 1e6
peer = json.load(open(f"{out}/attn_torch.json"))
print(f"# kiln vs torch {peer['torch']} SDPA on {peer['gpu']}, bf16, TFLOP/s (ratio = kiln / torch)")
print(f"{'B':>2} {'T':>5} {'H':>3} {'KV':>3} {'D':>4} {'window':>6} {'kiln backend':>14} | {'fwd kiln':>8} {'torch':>6} {'ratio':>5}"
      f" | {'f+b kiln':>8} {'torch':>6} {'ratio':>5}")
for key, k in kiln.items():
    p = next((x for x in peer["attention"] if (x["B"], x["T"], x["H"], x["KV"], x["D"], x["window"]) == key[:6]), None)
    row = f"{key[0]:2} {key[1]:5} {key[2]:3} {key[3]:3} {key[4]:4} {key[5]:6} {key[6]:>14}"
    for kp, tp in (("fwd", "fwd_tflops"), ("fwd_bwd", "fwd_bwd_tflops")):
        row += f" | {k[kp]:8.1f} {p[tp]:6.1f} {k[kp] / p[tp]:5.2f}" if p else f" | {k[kp]:8.1f} {'-':>6} {'-':>5}"
    print(row)
PY
