#!/usr/bin/env bash
# The experts of issue [cuda] on the GPU machine, one script, one run: for the benchmark layer (16384
# tokens = micro-batch 4 x 4096, hidden 2048, 16 experts top-1, moe_intermediate 2048), balanced and
# skewed (Zipf) routing:
#   - kiln's whole expert op (dispatch, gather, grouped GEMMs, SwiGLU, gated sum), fwd and fwd+bwd;
#   - each of its six grouped expert GEMMs (fwd: gate_up, down; bwd: dX and dW of both) against ONE dense
#     cuBLASLt GEMM of the same total size, TFLOP/s and the ratio grouped / dense, and the fwd / bwd sums;
#   - all of it again with KILN_GROUPED_GEMM=lt_loop (a cuBLASLt GEMM per expert instead of the grouped call)
#     and KILN_GROUPED_GEMM=lt_chunks (forward and dX as one pointer-array batched cuBLASLt GEMM over chunks);
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
./build-gpu/kiln bench moe --device cuda --tokens $N --hidden $H --inter $I --experts $E --top-k $K \
  --routing balanced,skewed --iters "$iters" --json "$out/moe_gpu.json" --csv "$out/moe_gpu.csv"
echo
echo "# the same with KILN_GROUPED_GEMM=lt_loop: one cuBLASLt GEMM per expert (cached plans) instead of cuBLAS's grouped call"
KILN_GROUPED_GEMM=lt_loop ./build-gpu/kiln bench moe --device cuda --tokens $N --hidden $H --inter $I --experts $E \
  --top-k $K --routing balanced,skewed --iters "$iters" --json "$out/moe_gpu_lt_loop.json" --csv "$out/moe_gpu_lt_loop.csv"
echo
echo "# the same with KILN_GROUPED_GEMM=lt_chunks: forward and dX as one cuBLASLt pointer-array batched GEMM over 256-row chunks"
KILN_GROUPED_GEMM=lt_chunks ./build-gpu/kiln bench moe --device cuda --tokens $N --hidden $H --inter $I --experts $E \
  --top-k $K --routing balanced,skewed --iters "$iters" --json "$out/moe_gpu_lt_chunks.json" --csv "$out/moe_gpu_lt_chunks.csv"
echo
python3 bench/peers/torch_moe.py $N $H $I $E $K "$iters" > "$out/moe_torch.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
kiln = json.load(open(f"{out}/moe_gpu.json"))["moe"]
peer = json.load(open(f"{out}/moe_torch.json"))
print(f"# forward of the balanced layer: kiln vs torch {peer['torch']} on {peer['gpu']}, bf16, TFLOP/s over 6*slots*H*I")
gemms = [r for r in kiln if r["routing"] == "balanced" and r["part"] in ("gate_up_fwd", "down_fwd")]
op = next(r for r in kiln if r["routing"] == "balanced" and r["part"] == "op" and r["pass"] == "fwd")
fl = sum(r["flops"] for r in gemms)
rows = [("kiln grouped GEMMs (gate_up + down)", fl / (sum(r["time_us"] for r in gemms) * 1e-6) / 1e12),
        ("kiln dense GEMMs, same total size", fl / (sum(r["dense_time_us"] for r in gemms) * 1e-6) / 1e12),
        ("kiln whole expert op (dispatch..scatter)", op["tflops"])]
for name in ("dense", "loop", "grouped"):
    p = peer[name]
    rows.append((f"torch {name} (GEMMs + SwiGLU)", p.get("tflops")))
for name, v in rows:
    print(f"  {name:42} {v:8.1f}" if v is not None else f"  {name:42} {'n/a':>8}  ({peer.get(name.split()[1], {}).get('error', '')})")
PY
