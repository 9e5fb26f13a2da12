#!/usr/bin/env bash
# Issue [multi-gpu], one script, one call, on a machine with several GPUs (works at 1 too):
#  1. `kiln bench comm --backend nccl` (one process, a thread per GPU) for the five collectives at 2, 4, 8 GPUs
#     (as many as the machine has), 8 B to $COMM_MAX (default 4G), float and bfloat16, and in the same run the
#     same collectives through torch.distributed (torchrun, NCCL) as the peer; a table of bus bandwidth at every
#     size >= 64 MiB with the ratio (target >= 0.97) and #wrong; the JSON profiles and an HTML report in $OUT.
#  2. Data-parallel training scaling needs `kiln train --device cuda` (issue [cuda]); it runs here once that exists.
# NCCL_NVLS_ENABLE=0 stays set (scripts/gpu_machine_build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
. scripts/gpu_machine_build.sh
kiln_gpu_build build-gpu ON kiln
kiln_find_nccl
K=./build-gpu/kiln
ngpu=$(nvidia-smi -L | wc -l)
comm_max=${COMM_MAX:-4G}
counts=()
for g in 2 4 8; do [ "$g" -le "$ngpu" ] && counts+=("$g"); done
[ ${#counts[@]} -gt 0 ] || counts=(1)
echo "# $ngpu GPU(s): $(nvidia-smi -L | head -1); GPU counts: ${counts[*]}; sizes 8 B .. $comm_max"
profiles=()
for g in "${counts[@]}"; do
  for dt in float bfloat16; do
    "$K" bench comm --backend nccl -g "$g" -b 8 -e "$comm_max" -d "$dt" --json "$out/comm_nccl_g${g}_${dt}.json" \
      > "$out/comm_nccl_g${g}_${dt}.txt" || { cat "$out/comm_nccl_g${g}_${dt}.txt"; exit 1; }
    torchrun --standalone --nproc_per_node "$g" bench/peers/torch_comm.py 8 "$(numfmt --from=iec "$comm_max")" "$dt" \
      > "$out/comm_torch_g${g}_${dt}.json" 2> "$out/comm_torch_g${g}_${dt}.err" || tail -5 "$out/comm_torch_g${g}_${dt}.err"
    profiles+=("$out/comm_nccl_g${g}_${dt}.json")
  done
done
"$K" bench report "${profiles[@]}" --out "$out/comm_report.html"
python3 - "$out" "${counts[@]}" <<'PY'
import json, sys
out, counts = sys.argv[1], [int(g) for g in sys.argv[2:]]
worst, wrong = 9.9, 0
print(f"{'gpus':>4} {'collective':15} {'dtype':9} {'bytes':>11} {'kiln busbw':>11} {'torch busbw':>12} {'ratio':>6} {'#wrong':>6}")
for g in counts:
    for dt in ["float", "bfloat16"]:
        kc = json.load(open(f"{out}/comm_nccl_g{g}_{dt}.json"))["comm"]
        wrong += sum(x.get("wrong") or 0 for x in kc)
        try:
            tc = json.load(open(f"{out}/comm_torch_g{g}_{dt}.json"))["comm"]
        except (OSError, ValueError) as e:
            print(f"# torch peer at {g} GPUs {dt}: {e}"); continue
        for t in tc:
            if t["bytes"] < (64 << 20): continue
            ip = t["collective"] in ("all_reduce", "broadcast")  # torch's in-place ones
            k = [x for x in kc if x["collective"] == t["collective"] and x["bytes"] == t["bytes"] and x["inplace"] == ip]
            if not k or not t["busbw_gbs"]: continue
            r = k[0]["busbw_gbs"] / t["busbw_gbs"]
            worst = min(worst, r)
            print(f"{g:4} {t['collective']:15} {dt:9} {t['bytes']:11} {k[0]['busbw_gbs']:11.1f} {t['busbw_gbs']:12.1f} {r:6.3f} {k[0].get('wrong') or 0:6.0f}")
print(f"# worst ratio at >= 64 MiB: {worst:.3f} (target 0.97); #wrong over every size: {wrong:.0f}")
PY
