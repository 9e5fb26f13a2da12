#!/usr/bin/env bash
# Issue [ft] item 2 on the GPU machine, one script, one run:
#   1. kiln bench io --ckpt on the local disk: sequential/parallel write and read of checkpoint-sized
#      files, and the checkpoint writer's save throughput against the sequential write (target >= 80%);
#   2. the step-time overhead of checkpoints while training on the GPU: the same run without
#      intermediate checkpoints, with asynchronous ones and with synchronous ones every EVERY steps; the
#      overhead per save is scaled to one save per 100 steps (target <= 2% for async).
# Results in $OUT (or ./bench-out): io.json, ckpt_overhead.txt. Knobs: DEVICE (cuda), STEPS (200),
# EVERY (50), IO_SIZE (1G), IO_FILES (4), DIR (scratch directory on the disk to measure, default
# $TMPDIR or /tmp), and the model: HIDDEN (512) LAYERS (8) EXPERTS (8) INTER (1024) SEQ (1024) MB (8).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
out=$(cd "$out" && pwd)
device=${DEVICE:-cuda}
if [ "$device" = cuda ]; then
  . scripts/gpu_machine_build.sh
  kiln_gpu_build build-gpu ON kiln
  K=./build-gpu/kiln
else
  K=${KILN:-./build/kiln}
fi
scratch=$(mktemp -d "${DIR:-${TMPDIR:-/tmp}}/kiln-ckpt-bench.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
echo "== kiln bench io on $scratch"
$K bench io --dir "$scratch" --size "${IO_SIZE:-1G}" --files "${IO_FILES:-4}" --iters 3 --ckpt --json "$out/io.json"

echo "== training step time with and without checkpoints ($device)"
$K train --steps 0 --out "$scratch/prep" --quiet >/dev/null 2>&1 || true   # prepares runs/default/data once
vocab=$(python3 -c 'import json; print(json.load(open("runs/default/data/index.json"))["vocab_size"])')
steps=${STEPS:-200} every=${EVERY:-50}
run() { # name ckpt_every async
  local d="$scratch/$1"
  cat > "$scratch/$1.json" <<JSON
{"model": {"vocab_size": $vocab, "hidden_size": ${HIDDEN:-512}, "num_hidden_layers": ${LAYERS:-8},
  "num_attention_heads": $(( ${HIDDEN:-512} / 64 )), "num_key_value_heads": 2, "head_dim": 64,
  "num_experts": ${EXPERTS:-8}, "moe_intermediate_size": ${INTER:-1024}, "router_hidden_size": 64,
  "eos_token_id": 0, "pad_token_id": null, "bos_token_id": null},
 "data": {"dir": "runs/default/data", "seq_len": ${SEQ:-1024}, "micro_batch": ${MB:-8}},
 "optim": {"warmup": 10},
 "run": {"steps": $steps, "out_dir": "$d", "log_every": 1, "eval_every": 0, "ckpt_every": $2,
         "async_ckpt": $3, "keep_last": 2, "device": "$device"}}
JSON
  local t0 t1
  t0=$(date +%s.%N)
  $K train --config "$scratch/$1.json" --quiet
  t1=$(date +%s.%N)
  python3 - "$d/metrics.jsonl" "$1" "$t0" "$t1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# per-step wall time from the cumulative tokens/s of the last record (it includes every save so far)
last = rows[-1]
step_s = last["tokens"] / last["tokens_per_s"] / last["step"]
print(f"{sys.argv[2]}: {last['step']} steps, {step_s * 1e3:.2f} ms/step (incl. checkpoints), process wall {float(sys.argv[4]) - float(sys.argv[3]):.1f} s")
open(sys.argv[1] + ".step_s", "w").write(repr(step_s))
PY
  # the final save is the same in all three runs (it always waits); drop the run to free the disk
  cp "$d/metrics.jsonl" "$out/metrics_$1.jsonl"
  du -sh "$d/ckpt" 2>/dev/null | sed "s/^/$1 checkpoint dir: /"
  cat "$d/metrics.jsonl.step_s" > "$scratch/$1.step_s"
  rm -rf "$d"
}
# none twice, first and last, so that drift (clocks, page cache, other load) shows and averages out
run none 0 true
run async "$every" true
run sync "$every" false
run none2 0 true
python3 - "$scratch" "$steps" "$every" <<'PY' | tee "$out/ckpt_overhead.txt"
import sys
d, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = {k: float(open(f"{d}/{k}.step_s").read()) for k in ("none", "async", "sync", "none2")}
print(f"without checkpoints: {t['none'] * 1e3:.2f} and {t['none2'] * 1e3:.2f} ms/step (first and last run)")
t["none"] = (t["none"] + t["none2"]) / 2
for k in ("async", "sync"):
    per_save = (t[k] - t["none"]) * steps / (steps // every)   # seconds each intermediate save cost
    at100 = per_save / (100 * t["none"])
    print(f"{k}: {per_save * 1e3:.1f} ms per save = {100 * at100:.2f}% step-time overhead at one save per 100 steps"
          f" (step {t['none'] * 1e3:.2f} ms without checkpoints){'  target <= 2%' if k == 'async' else ''}")
PY
