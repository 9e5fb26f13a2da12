#!/usr/bin/env bash
# GPU benchmarks of issue [bench], one script, one run, on the GPU machine: kiln's cuBLASLt GEMM vs
# torch.matmul on the same shapes and dtypes, and kiln's GPU copy bandwidth vs torch's tensor copy;
# prints both sides and the ratio, and leaves the JSON profiles in $OUT (or ./bench-out). Knobs: ROUNDS (3),
# SHAPES (JSON list of [m,n,k]), DTYPES ("bf16 fp16 fp32 fp8"), COMM_MAX (256M), COMM_DTYPES ("" skips).
# Needs nvcc, CMake and PyTorch there (scripts/gpu_machine_build.sh builds kiln).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
. scripts/gpu_machine_build.sh
kiln_gpu_build build-gpu ON kiln
K=./build-gpu/kiln
kiln_find_nccl
ngpu=$(nvidia-smi -L | wc -l)
comm_max=${COMM_MAX:-256M}
for dt in ${COMM_DTYPES-float bfloat16}; do  # COMM_DTYPES="" skips the collectives
  "$K" bench comm --backend nccl -g "$ngpu" -b 8 -e "$comm_max" -d "$dt" --json "$out/comm_nccl_${dt}.json" \
    > "$out/comm_nccl_${dt}.txt" || { cat "$out/comm_nccl_${dt}.txt"; exit 1; }
  torchrun --standalone --nproc_per_node "$ngpu" bench/peers/torch_comm.py 8 $(numfmt --from=iec "$comm_max") "$dt" \
    > "$out/comm_torch_${dt}.json" 2> "$out/comm_torch_${dt}.err" || cat "$out/comm_torch_${dt}.err"
done
shapes=${SHAPES:-'[[8192,8192,8192],[4096,4096,4096],[16384,2048,2048],[16384,4096,2048],[16384,2048,4096],[2048,2048,2048]]'}
dtypes=${DTYPES:-bf16 fp16 fp32 fp8}
# Alternate the peer and kiln for ROUNDS rounds and compare medians: single passes on the H200 move
# by several percent between runs for the same shape (clocks, thermals), more than the 3% we judge.
rounds=${ROUNDS:-3}
for r in $(seq 1 "$rounds"); do
  # the copies first, each side in its own process, before any GEMM has heated the GPU
  python3 bench/peers/torch_gemm_membw.py "$shapes" copy > "$out/peer_copy_$r.json"
  "$K" bench membw --device cuda --min 64M --max 4G --factor 4 --json "$out/membw_gpu_$r.json" > "$out/membw_gpu_$r.txt"
  python3 bench/peers/torch_gemm_membw.py "$shapes" "${dtypes// /,}" > "$out/peer_$r.json"
  # kiln times exactly the peer's shapes, one process per shape like the peer's one call per shape: a long
  # cartesian sweep keeps the GPU hotter (lower clocks) than the peer's six shapes and biases the ratio
  for dt in $dtypes; do
    for mnk in $(python3 -c "import json,sys; print(' '.join('x'.join(map(str,s)) for s in json.loads(sys.argv[1])))" "$shapes"); do
      IFS=x read -r m n k <<< "$mnk"
      "$K" bench gemm --device cuda --dtype "$dt" -m "$m" -n "$n" -k "$k" --iters 20 --warmup 5 \
        --json "$out/gemm_${dt}_${r}_$mnk.json" > "$out/gemm_${dt}_${r}_$mnk.txt" 2>&1 ||
        { cat "$out/gemm_${dt}_${r}_$mnk.txt"; [ "$dt" = fp8 ] || exit 1; }  # fp8 needs Hopper or later
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import glob, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
R = range(1, rounds + 1)
peers = [json.load(open(f"{out}/peer_{r}.json")) for r in R]
print(f"# {peers[0]['gpu']}, torch {peers[0]['torch']}; medians over {rounds} alternating rounds")
print(f"{'dtype':6} {'m':>6} {'n':>6} {'k':>6} {'kiln TFLOP/s':>13} {'torch TFLOP/s':>14} {'ratio':>6}")
for dt in ["bf16", "fp16", "fp32", "fp8"]:
    try:
        kiln = [{(x["m"], x["n"], x["k"]): x["tflops"] for f in glob.glob(f"{out}/gemm_{dt}_{r}_*.json")
                 for x in json.load(open(f))["gemm"]} for r in R]
        if not kiln[0]: raise OSError(f"no {out}/gemm_{dt}_*.json")
    except OSError as e:
        print(f"# {dt}: no kiln numbers ({e})"); continue
    for p in [x for x in peers[0]["gemm"] if x["dtype"] == dt]:
        key = (p["m"], p["n"], p["k"])
        if key not in kiln[0]: continue
        kv = statistics.median(k[key] for k in kiln)
        tv = statistics.median(x["tflops"] for pr in peers for x in pr["gemm"] if x["dtype"] == dt and (x["m"], x["n"], x["k"]) == key)
        print(f"{dt:6} {key[0]:6} {key[1]:6} {key[2]:6} {kv:13.1f} {tv:14.1f} {kv / tv:6.3f}")
print(f"{'copy bytes':>12} {'kiln GB/s':>10} {'torch GB/s':>11} {'ratio':>6}")
copies = [json.load(open(f"{out}/peer_copy_{r}.json")) for r in R]
for p in copies[0]["copy"]:
    kv = statistics.median(x["gbs_best"] for r in R for x in json.load(open(f"{out}/membw_gpu_{r}.json"))["membw"]
                           if x["device"] == "cuda" and x["kernel"] == "copy" and x["bytes_per_array"] == p["bytes"])
    tv = statistics.median(x["gbs_best"] for pr in copies for x in pr["copy"] if x["bytes"] == p["bytes"])
    print(f"{p['bytes']:12} {kv:10.0f} {tv:11.0f} {kv / tv:6.3f}")
# the ratio is torch's time over kiln's (> 1: kiln faster): on one GPU both bus bandwidths are 0 (nothing moves
# between ranks), and at several it equals the busbw ratio
print(f"{'collective':15} {'dtype':9} {'bytes':>11} {'kiln busbw':>11} {'torch busbw':>12} {'kiln us':>9} {'torch us':>9} {'ratio':>6}  (NCCL, {peers[0]['gpu']})")
for dt in ["float", "bfloat16"]:
    try:
        kc = json.load(open(f"{out}/comm_nccl_{dt}.json"))["comm"]
        tc = json.load(open(f"{out}/comm_torch_{dt}.json"))["comm"]
    except (OSError, ValueError) as e:
        print(f"# comm {dt}: {e}"); continue
    for t in tc:
        if t["bytes"] < (64 << 20): continue
        # torch's all_reduce and broadcast work in place, its other three out of place: compare like with like
        ip = t["collective"] in ("all_reduce", "broadcast")
        k = [x for x in kc if x["collective"] == t["collective"] and x["bytes"] == t["bytes"] and x["inplace"] == ip]
        if k: print(f"{t['collective']:15} {dt:9} {t['bytes']:11} {k[0]['busbw_gbs']:11.1f} {t['busbw_gbs']:12.1f} "
                    f"{k[0]['time_us_avg']:9.1f} {t['time_us_avg']:9.1f} {t['time_us_avg'] / k[0]['time_us_avg']:6.3f}")
PY
cat "$out/membw_gpu_$rounds.txt"
[ -e "$out/comm_nccl_float.txt" ] && cat "$out/comm_nccl_float.txt"; true
