#!/usr/bin/env bash
# Whether the optimizer's memory-bound step can share the GPU with the forward's GEMMs by splitting the SMs
# (bench/sm_partition.cu; docs/perf.md, issue [cuda] session 19), on the GPU machine. ELEMS_MI = the stream's
# size in Mi elements (default 1024: 28 GiB touched a pass).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
. scripts/gpu_machine_build.sh
kiln_gpu_build build-gpu ON kiln_bench_sm_partition
./build-gpu/kiln_bench_sm_partition "${ELEMS_MI:-1024}" | tee "$out/sm_partition.txt"
