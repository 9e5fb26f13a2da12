#!/usr/bin/env bash
# GPU benchmarks of issue [bench], one script, one run, on the GPU machine: kiln's cuBLASLt GEMM vs
# torch.matmul on the same shapes and dtypes, and kiln's GPU copy bandwidth vs torch's tensor copy;
# prints both sides and the ratio, and leaves the JSON profiles in $OUT (or ./bench-out).
# Needs nvcc, CMake and PyTorch there; cJSON/OpenBLAS come from .debs/ (apt-get download here) when
# the machine has no package manager.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
extra=()
if [ -d .debs ] && ! [ -e /usr/include/cjson/cJSON.h ]; then
  for f in .debs/*.deb; do dpkg -x "$f" /opt/kdeps; done
  export LD_LIBRARY_PATH=/opt/kdeps/usr/lib/x86_64-linux-gnu:/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}
  extra=(-DCMAKE_PREFIX_PATH=/opt/kdeps/usr
         -DOPENBLAS_LIB=/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
         -DOPENBLAS_INCLUDE=/opt/kdeps/usr/include/x86_64-linux-gnu/openblas-openmp)
fi
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_WERROR=OFF "${extra[@]}" >/dev/null
cmake --build build-gpu -j"$(nproc)" --target kiln 2>&1 | grep -E "error|warning" || true
K=./build-gpu/kiln
shapes='[[8192,8192,8192],[4096,4096,4096],[16384,2048,2048],[16384,4096,2048],[16384,2048,4096],[2048,2048,2048]]'
python3 bench/peers/torch_gemm_membw.py "$shapes" > "$out/peer.json"
for dt in bf16 fp16 fp32; do
  "$K" bench gemm --device cuda --dtype "$dt" -m 8192,4096,16384,2048 -n 8192,4096,2048 -k 8192,4096,2048 \
    --iters 20 --warmup 5 --json "$out/gemm_$dt.json" > "$out/gemm_$dt.txt"
done
"$K" bench membw --device cuda --min 64M --max 4G --factor 4 --json "$out/membw_gpu.json" > "$out/membw_gpu.txt"
python3 - "$out" "$shapes" <<'PY'
import json, sys
out, shapes = sys.argv[1], json.loads(sys.argv[2])
peer = json.load(open(f"{out}/peer.json"))
print(f"# {peer['gpu']}, torch {peer['torch']}")
print(f"{'dtype':6} {'m':>6} {'n':>6} {'k':>6} {'kiln TFLOP/s':>13} {'torch TFLOP/s':>14} {'ratio':>6}")
for dt in ["bf16", "fp16", "fp32"]:
    kiln = {(r["m"], r["n"], r["k"]): r for r in json.load(open(f"{out}/gemm_{dt}.json"))["gemm"]}
    for p in [r for r in peer["gemm"] if r["dtype"] == dt]:
        k = kiln.get((p["m"], p["n"], p["k"]))
        if k: print(f"{dt:6} {p['m']:6} {p['n']:6} {p['k']:6} {k['tflops']:13.1f} {p['tflops']:14.1f} {k['tflops']/p['tflops']:6.3f}")
mem = {r["bytes_per_array"]: r for r in json.load(open(f"{out}/membw_gpu.json"))["membw"] if r["device"] == "cuda" and r["kernel"] == "copy"}
print(f"{'copy bytes':>12} {'kiln GB/s':>10} {'torch GB/s':>11} {'ratio':>6}")
for p in peer["copy"]:
    k = mem.get(p["bytes"])
    if k: print(f"{p['bytes']:12} {k['gbs_best']:10.0f} {p['gbs_best']:11.0f} {k['gbs_best']/p['gbs_best']:6.3f}")
PY
cat "$out/membw_gpu.txt"
