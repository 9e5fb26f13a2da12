#!/usr/bin/env bash
# Image-embedding throughput of kiln's CLIP (kiln_clip_embed_images) vs transformers CLIPModel, same
# machine, same random weights and pixels, for ViT-B/32 and ViT-L/14 configs (issue 8's benchmark):
#   DEVICE=cpu (default): fp32, the same thread count on both sides (THREADS, default all CPUs), batch 16
#   DEVICE=cuda: bf16 on GPU 0; both sides timed from host pixels (page-locked on both: torch's pinned
#                tensor, kiln_clip_pixels_alloc) to host embeddings, and with the pixels already on the GPU
#                ("resident"); batch 256 (B/32) and 128 (L/14) (BATCH overrides)
# PROFILE=1 adds one kiln run per config with KILN_CLIP_PROFILE=1: time per op class (CUDA events on the
# GPU, wall clock on the CPU) into clip_bench_$DEVICE.profile.txt.
# Alternates the two sides for ROUNDS rounds and compares medians; checks kiln's embeddings against
# torch's fp32 CPU embeddings of the same pixels, and on CUDA the bf16 peer's by the same metric (the
# precision both sides give up for bf16). Needs CMake, a C compiler (nvcc for cuda) and PyTorch +
# transformers; cJSON/OpenBLAS come from .debs/ when the machine has no package manager.
# On CUDA each side then runs once more for longer (ITERS_POWER calls, default 100; POWER=0 skips it) under
# bench/peers/gpu_power.py: the power draw and SM clock it ran at. A sustained load on this GPU meets the
# board's power limit, the driver then lowers the clock, so the two sides also compete on energy per image.
# Then the tower's GEMMs alone run the same way (bench/peers/clip_gemm_floor.py, torch/cuBLAS, FLOOR_SECONDS,
# default 8): their joules per image are a floor under both sides, so the peer's J/image over the floor's bounds
# kiln's ratio at the limit, and kiln's J/image over the floor's is what its attention, norms and glue cost.
# CONFIGS picks the configs (default "vit-b-32 vit-l-14"). Leaves two files in $OUT (or ./bench-out):
# clip_bench_$DEVICE.json (every measurement) and .txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
work=${CLIP_BENCH_DIR:-/tmp/kiln-clip-bench}; mkdir -p "$work"
device=${DEVICE:-cpu}
. scripts/gpu_machine_build.sh
# the CUDA build serves the CPU runs too where nvcc exists (the GPU machine has built it already)
if [ "$device" = cuda ] || command -v nvcc > /dev/null; then
  kiln_gpu_build build-gpu ON kiln_bench_clip; B=./build-gpu/kiln_bench_clip
else
  kiln_gpu_build build-clipbench OFF kiln_bench_clip; B=./build-clipbench/kiln_bench_clip
fi
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-2}
export OMP_NUM_THREADS=$threads
# OpenBLAS picks its kernels from the CPU model; in a VM that reports a generic model it can fall back to
# old SSE kernels. The CPU's flags tell what it can run (the JSON records the core OpenBLAS used).
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
res="$out/clip_bench_$device"
: > "$res.json.tmp"
: > "$res.txt"
[ -n "${PROFILE:-}" ] && : > "$res.profile.txt"
: > "$res.power.jsonl"
log() { echo "$@" | tee -a "$res.txt"; }
log "# $(date -u +%F) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $threads threads, device $device, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-auto}"
tag() { python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(config='$1', round=$2, threads=$threads); print(json.dumps(d))"; }
for cfg in ${CONFIGS:-vit-b-32 vit-l-14}; do
  d="$work/$cfg"
  [ -e "$d/pixels.safetensors" ] || python3 bench/peers/clip_peer.py make "$cfg" "$d"
  if [ "$device" = cuda ]; then
    batch=256; [ "$cfg" = vit-l-14 ] && batch=128; batch=${BATCH:-$batch}; iters=10
    # the fp32 CPU reference of the first 16 images, once
    [ -e "$d/torch_embeds.safetensors" ] || python3 bench/peers/clip_peer.py time "$d" 16 1 "$threads" > /dev/null
  else
    batch=${BATCH:-16}; iters=5; [ "$cfg" = vit-l-14 ] && iters=3
  fi
  for r in $(seq 1 "$rounds"); do
    python3 bench/peers/clip_peer.py time "$d" "$batch" "$iters" "$threads" "$device" | tag "$cfg" "$r" >> "$res.json.tmp"
    "$B" --clip "$d" --pixels "$d/pixels.safetensors" --batch "$batch" --iters "$iters" --device "$device" \
      --ref "$d/torch_embeds.safetensors" | tag "$cfg" "$r" >> "$res.json.tmp"
  done
  if [ "$device" = cuda ] && [ "${POWER:-1}" != 0 ]; then
    pit=${ITERS_POWER:-100}
    python3 bench/peers/gpu_power.py "$res.power.jsonl" "$cfg torch" -- \
      python3 bench/peers/clip_peer.py time "$d" "$batch" "$pit" "$threads" "$device" | tag "$cfg" 0 > "$work/power_torch.json"
    python3 bench/peers/gpu_power.py "$res.power.jsonl" "$cfg kiln" -- \
      "$B" --clip "$d" --pixels "$d/pixels.safetensors" --batch "$batch" --iters "$pit" --device "$device" | tag "$cfg" 0 > "$work/power_kiln.json"
    # the floor is context, not the benchmark: a failure there leaves the rest of the results
    python3 bench/peers/gpu_power.py "$res.power.jsonl" "$cfg floor" -- \
      python3 bench/peers/clip_gemm_floor.py "$d" "$batch" "${FLOOR_SECONDS:-8}" | tag "$cfg" 0 > "$work/power_floor.json" \
      || { echo "clip_bench: the GEMM-floor run failed" >&2; : > "$work/power_floor.json"; }
    python3 - "$res.power.jsonl" "$work/power_torch.json" "$work/power_kiln.json" "$work/power_floor.json" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for side_file in sys.argv[2:]:  # each side's long run: its rate beside its power line (labelled "config side")
    text = open(side_file).read()
    if not text.strip():
        continue
    d = json.loads(text)
    for rec in recs:
        if rec["label"] == f"{d['config']} {d['side']}":
            rec.update(config=d["config"], side=d["side"], batch=d["batch"], images_per_s_median=d["images_per_s_median"])
            if rec.get("power_mean_w"):
                rec["joules_per_image"] = rec["power_mean_w"] / d["images_per_s_median"]
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in recs))
PY
  fi
  if [ -n "${PROFILE:-}" ]; then
    echo "## $cfg batch $batch" >> "$res.profile.txt"
    KILN_CLIP_PROFILE=1 "$B" --clip "$d" --pixels "$d/pixels.safetensors" --batch "$batch" --iters 1 --device "$device" \
      2>> "$res.profile.txt" > /dev/null
  fi
done
python3 - "$res" <<'PY' | tee -a "$res.txt"
import json, statistics, sys
res = sys.argv[1]
recs = [json.loads(l) for l in open(f"{res}.json.tmp") if l.strip()]
pw = [json.loads(l) for l in open(f"{res}.power.jsonl") if l.strip()]
for r in recs:  # each measurement keeps its config and side's power lines (the longer runs on CUDA)
    if pw:
        r["power"] = [p for p in pw if p.get("config") == r["config"] and p.get("side") == r["side"]]
recs += [dict(config=p["config"], side="floor", batch=p.get("batch"), images_per_s_median=p.get("images_per_s_median"),
              power=[p]) for p in pw if p.get("side") == "floor"]  # the GEMMs-alone runs, with their power line
json.dump(recs, open(f"{res}.json", "w"), indent=1)
cuda = any(r.get("device") == "cuda" for r in recs)
print(f"{'config':9} {'batch':>5} {'kiln img/s':>11} {'torch img/s':>12} {'ratio':>6}"
      + (f" {'kiln resident':>14} {'torch resident':>15} {'ratio':>6}" if cuda else "")
      + f" {'kiln vs fp32 ref: rel err':>26} {'worst cos':>10}"
      + (f" {'torch vs fp32 ref: rel err':>27} {'worst cos':>10}" if cuda else ""))
for cfg in ["vit-b-32", "vit-l-14"]:
    k = [r for r in recs if r["config"] == cfg and r["side"] == "kiln"]
    t = [r for r in recs if r["config"] == cfg and r["side"] == "torch"]
    if not k or not t:
        print(f"{cfg:9} missing"); continue
    kv = statistics.median(r["images_per_s_median"] for r in k)
    tv = statistics.median(r["images_per_s_median"] for r in t)
    line = f"{cfg:9} {k[0]['batch']:5} {kv:11.2f} {tv:12.2f} {kv / tv:6.3f}"
    if cuda:
        kr = statistics.median(r.get("images_per_s_resident", -1) for r in k)
        tr = statistics.median(r["images_per_s_resident"] for r in t)
        line += f" {kr:14.2f} {tr:15.2f} {kr / tr:6.3f}"
    line += f" {max(r['rel_err_vs_ref'] for r in k):26.3g} {min(r['worst_cosine_vs_ref'] for r in k):10.6f}"
    if cuda:  # the bf16 peer's own error against the same fp32 reference (absent: no reference then)
        te = [r["rel_err_vs_ref"] for r in t if r.get("rel_err_vs_ref") is not None]
        tc = [r["worst_cosine_vs_ref"] for r in t if r.get("worst_cosine_vs_ref") is not None]
        line += f" {max(te):27.3g} {min(tc):10.6f}" if te and tc else f" {'-':>27} {'-':>10}"
    print(line)
if pw:
    print(f"power (a longer run of each side): {'config':9} {'side':5} {'img/s':>9} {'W mean':>7} {'SM MHz':>7} "
          f"{'capped':>7} {'J/image':>8}")
    for p in pw:
        if not p.get("busy_samples") or not p.get("images_per_s_median"):
            print(f"{'':35}{p.get('label', '?')}: " + ("no busy samples" if p.get("images_per_s_median") else "no rate")); continue
        print(f"{'':35}{p['config']:9} {p['side']:5} {p['images_per_s_median']:9.1f} {p['power_mean_w']:7.0f} "
              f"{p['sm_clock_mean_mhz']:7.0f} {100 * p['power_capped_share']:6.0f}% {p['joules_per_image']:8.4f}")
    for cfg in ["vit-b-32", "vit-l-14"]:  # what the GEMMs alone leave: the bound at the power limit
        j = {p["side"]: p["joules_per_image"] for p in pw if p.get("config") == cfg and p.get("joules_per_image")}
        capped = {p["side"]: p.get("power_capped_share", 0) for p in pw if p.get("config") == cfg}
        if "floor" in j and "torch" in j:
            line = (f"{cfg}: at the power limit kiln / torch <= torch J/image / GEMM-floor J/image = "
                    f"{j['torch'] / j['floor']:.2f}")
            if capped.get("torch", 0) < 0.5:  # a side below the limit is bound by time, not energy
                line += " (the peer ran below the limit here: not a bound on this run)"
            if "kiln" in j:
                line += (f"; kiln spends {j['kiln'] - j['floor']:.4f} J/image ({100 * (j['kiln'] - j['floor']) / j['kiln']:.0f}%)"
                         " beyond its GEMMs (attention, norms, glue)")
            print(line)
tv = [r for r in recs if r["side"] == "torch"]
kv = [r for r in recs if r["side"] == "kiln"]
print(f"torch {tv[0].get('torch') if tv else '?'}" + (f", {tv[0].get('gpu')}" if cuda and tv else "")
      + (f"; kiln's OpenBLAS core {kv[0].get('openblas_core')}, {kv[0].get('openblas_threads')} threads, "
         f"vector ops {kv[0].get('simd', '?')}" if kv else ""))
PY
rm -f "$res.json.tmp"
[ -s "$res.power.jsonl" ] || rm -f "$res.power.jsonl"
