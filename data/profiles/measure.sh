#!/usr/bin/env bash
# Measure what a built-in hardware profile of `kiln size` needs, on the GPU machine, and fold it into
# data/profiles/<name>.json: bf16 GEMMs over the shapes sizing asks about (token counts x projection
# widths x inner dims, incl. the experts' short-and-wide GEMMs), GPU memory bandwidth, and, with 2+ GPUs,
# NCCL reduce-scatter / all-gather bus bandwidth. Usage: data/profiles/measure.sh h200
# Leaves the raw kiln bench profiles in $OUT (or ./size-bench-out) and rewrites data/profiles/<name>.json
# through merge_bench.py (the JSON stays the one source of truth; rebuild to compile it in).
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: data/profiles/measure.sh PROFILE_NAME}
out=${OUT:-size-bench-out}; mkdir -p "$out"
. scripts/gpu_machine_build.sh
kiln_gpu_build build-gpu ON kiln
K=./build-gpu/kiln
"$K" bench gemm --device cuda --dtype bf16 -m 256,512,1024,2048,4096,8192,16384 -n 1024,2048,2560,3072,4096,5120,8192 \
  -k 1024,2048,4096 --iters 20 --warmup 5 --json "$out/gemm.json" > "$out/gemm.txt"
"$K" bench membw --device cuda --json "$out/membw.json" > "$out/membw.txt"
files=("$out/gemm.json" "$out/membw.json")
ngpu=$(nvidia-smi -L | wc -l)
if [ "$ngpu" -ge 2 ]; then
  kiln_find_nccl
  "$K" bench comm --backend nccl -g "$ngpu" -b 1M -e 1G -f 2 -d bfloat16 --collectives reduce_scatter,all_gather \
    --outofplace --json "$out/comm.json" > "$out/comm.txt"
  files+=("$out/comm.json")
fi
python3 data/profiles/merge_bench.py "data/profiles/$name.json" "${files[@]}"
echo "updated data/profiles/$name.json from ${files[*]}"
