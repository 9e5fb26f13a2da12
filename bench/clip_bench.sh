#!/usr/bin/env bash
# CPU image-embedding throughput of kiln's CLIP (kiln_clip_embed_images) vs transformers CLIPModel,
# fp32, same machine, same thread count, same random weights and pixels, for ViT-B/32 and ViT-L/14
# configs (issue 8's benchmark). Alternates the two sides for ROUNDS rounds and compares medians;
# checks that kiln's embeddings match torch's on the same pixels. Needs CMake, a C compiler and
# PyTorch + transformers; cJSON/OpenBLAS come from .debs/ when the machine has no package manager.
# Leaves two files in $OUT (or ./bench-out): clip_bench.json (every measurement) and clip_bench.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
work=${CLIP_BENCH_DIR:-/tmp/kiln-clip-bench}; mkdir -p "$work"
extra=()
if [ -d .debs ] && ! [ -e /usr/include/cjson/cJSON.h ]; then
  for f in .debs/*.deb; do dpkg -x "$f" /opt/kdeps; done
  export LD_LIBRARY_PATH=/opt/kdeps/usr/lib/x86_64-linux-gnu:/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}
  extra=(-DCMAKE_PREFIX_PATH=/opt/kdeps/usr
         -DOPENBLAS_LIB=/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
         -DOPENBLAS_INCLUDE=/opt/kdeps/usr/include/x86_64-linux-gnu/openblas-openmp)
fi
cmake -S . -B build-clipbench -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=OFF -DKILN_WERROR=OFF "${extra[@]}" >/dev/null
cmake --build build-clipbench -j"$(nproc)" --target kiln_bench_clip 2>&1 | grep -E "error|warning" || true
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-2}
batch=${BATCH:-16}
export OMP_NUM_THREADS=$threads OMP_PROC_BIND=${OMP_PROC_BIND:-false}
: > "$out/clip_bench.json.tmp"
log() { echo "$@" | tee -a "$out/clip_bench.txt"; }
: > "$out/clip_bench.txt"
log "# $(date -u +%F) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $threads threads, batch $batch, fp32"
for cfg in vit-b-32 vit-l-14; do
  d="$work/$cfg"
  [ -e "$d/pixels.safetensors" ] || python3 bench/peers/clip_peer.py make "$cfg" "$d"
  iters=5; [ "$cfg" = vit-l-14 ] && iters=3
  for r in $(seq 1 "$rounds"); do
    python3 bench/peers/clip_peer.py time "$d" "$batch" "$iters" "$threads" |
      python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(config='$cfg', round=$r); print(json.dumps(d))" \
      >> "$out/clip_bench.json.tmp"
    ./build-clipbench/kiln_bench_clip --clip "$d" --pixels "$d/pixels.safetensors" --batch "$batch" --iters "$iters" \
      --ref "$d/torch_embeds.safetensors" |
      python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(config='$cfg', round=$r, threads=$threads); print(json.dumps(d))" \
      >> "$out/clip_bench.json.tmp"
  done
done
python3 - "$out" <<'PY' | tee -a "$out/clip_bench.txt"
import json, statistics, sys
out = sys.argv[1]
recs = [json.loads(l) for l in open(f"{out}/clip_bench.json.tmp") if l.strip()]
json.dump(recs, open(f"{out}/clip_bench.json", "w"), indent=1)
print(f"{'config':9} {'kiln img/s':>11} {'torch img/s':>12} {'ratio':>6} {'kiln rel err vs torch':>22}  (medians over rounds)")
for cfg in ["vit-b-32", "vit-l-14"]:
    k = [r for r in recs if r["config"] == cfg and r["side"] == "kiln"]
    t = [r for r in recs if r["config"] == cfg and r["side"] == "torch"]
    if not k or not t:
        print(f"{cfg:9} missing"); continue
    kv = statistics.median(r["images_per_s_median"] for r in k)
    tv = statistics.median(r["images_per_s_median"] for r in t)
    print(f"{cfg:9} {kv:11.2f} {tv:12.2f} {kv / tv:6.3f} {max(r['rel_err_vs_ref'] for r in k):22.3g}")
tv = [r.get("torch") for r in recs if r["side"] == "torch"]
print(f"torch {tv[0] if tv else '?'}")
PY
rm -f "$out/clip_bench.json.tmp"
