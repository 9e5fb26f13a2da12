#!/usr/bin/env bash
# The experts of issue [cuda] on the GPU machine, one script, one run: for the benchmark layer (16384
# tokens = micro-batch 4 x 4096, hidden 2048, 16 experts top-1, moe_intermediate 2048), balanced and
# skewed (Zipf) routing, for every grouped-GEMM path of src/cuda/experts_gemm.cu (grouped, lt_loop,
# lt_chunks, lt_streams, lt_mixed):
#   - kiln's whole expert op (dispatch, gather, grouped GEMMs, SwiGLU, gated sum), fwd and fwd+bwd;
#   - each of its six grouped expert GEMMs (fwd: gate_up, down; bwd: dX and dW of both) against ONE dense
#     cuBLASLt GEMM of the same total size, TFLOP/s and the ratio dense time / grouped time, and the fwd /
#     bwd sums;
#   - the side-stream count (KILN_GROUPED_STREAMS 2 and 4; default 8), algorithms chosen by timing
#     (KILN_GROUPED_TUNE=1) and the chunk height (KILN_GROUPED_CHUNK 128 and 512; default 256) varied for the
#     paths they tune (SWEEP=0 skips these);
#   - torch's side for the forward (bench/peers/torch_moe.py): one dense matmul of all rows, a loop over
#     experts (the HF way), torch._grouped_mm.
# JSON and CSV in $OUT (or ./bench-out). ITERS (default 20) timed calls per row.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
. scripts/gpu_machine_build.sh
kiln_gpu_build build-gpu ON kiln
iters=${ITERS:-20}
N=16384 H=2048 I=2048 E=16 K=1
moe() { ./build-gpu/kiln bench moe --device cuda --tokens $N --hidden $H --inter $I --experts $E --top-k $K --iters "$iters" "$@"; }
moe --routing balanced,skewed --paths all --json "$out/moe_gpu.json" --csv "$out/moe_gpu.csv"
if [ "${SWEEP:-1}" != 0 ]; then
  for s in 2 4; do
    echo; echo "# KILN_GROUPED_STREAMS=$s (default 8)"
    KILN_GROUPED_STREAMS=$s moe --routing balanced,skewed --paths lt_streams,lt_mixed \
      --json "$out/moe_gpu_streams$s.json" --csv "$out/moe_gpu_streams$s.csv" | sed -n '/(.*routing; ratio/,/^$/p'
  done
  echo; echo "# KILN_GROUPED_TUNE=1: each large cuBLASLt plan's algorithm chosen by timing its candidates"
  KILN_GROUPED_TUNE=1 moe --routing balanced,skewed --paths lt_chunks,lt_streams,lt_mixed \
    --json "$out/moe_gpu_tune.json" --csv "$out/moe_gpu_tune.csv" | sed -n '/(.*routing; ratio/,/^$/p'
  for c in 128 512; do
    echo; echo "# KILN_GROUPED_CHUNK=$c (default 256)"
    KILN_GROUPED_CHUNK=$c moe --routing balanced,skewed --paths lt_chunks \
      --json "$out/moe_gpu_chunk$c.json" --csv "$out/moe_gpu_chunk$c.csv" | sed -n '/(.*routing; ratio/,/^$/p'
  done
fi
echo
python3 bench/peers/torch_moe.py $N $H $I $E $K "$iters" > "$out/moe_torch.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
kiln = json.load(open(f"{out}/moe_gpu.json"))["moe"]
peer = json.load(open(f"{out}/moe_torch.json"))
print(f"# forward of the balanced layer: kiln vs torch {peer['torch']} on {peer['gpu']}, bf16, TFLOP/s over 6*slots*H*I")
rows = []
for path in dict.fromkeys(r["path"] for r in kiln):
    bal = [r for r in kiln if r["routing"] == "balanced" and r["path"] == path]
    gemms = [r for r in bal if r["part"] in ("gate_up_fwd", "down_fwd")]
    op = next(r for r in bal if r["part"] == "op" and r["pass"] == "fwd")
    fl = sum(r["flops"] for r in gemms)
    tag = " (default)" if op["default_path"] else ""
    rows.append((f"kiln {path}{tag}: grouped GEMMs (gate_up + down)", fl / (sum(r["time_us"] for r in gemms) * 1e-6) / 1e12))
    rows.append((f"kiln {path}{tag}: whole expert op", op["tflops"]))
    if not any(n.startswith("kiln dense") for n, _ in rows):
        rows.append(("kiln dense GEMMs, same total size", fl / (sum(r["dense_time_us"] for r in gemms) * 1e-6) / 1e12))
for name in ("dense", "loop", "grouped"):
    p = peer[name]
    rows.append((f"torch {name} (GEMMs + SwiGLU)", p.get("tflops")))
for name, v in rows:
    print(f"  {name:52} {v:8.1f}" if v is not None else f"  {name:52} {'n/a':>8}")
PY
