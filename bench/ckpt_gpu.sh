#!/usr/bin/env bash
# Issue [ft] item 2 on the GPU machine, one script, one run (about 2-3 minutes on the H200 machine):
#   1. kiln bench io --ckpt --device cuda on the local disk: sequential/parallel write and read of
#      checkpoint-sized files, and the checkpoint writer's save throughput against the sequential write
#      measured in the same run (target >= 80%), from host memory (the CPU trainer) and from the GPU (the
#      CUDA trainer: live buffers streamed through pinned chunks; device snapshot streamed in the background);
#   2. the step-time overhead of checkpoints while training on the GPU at issue [cuda]'s benchmark config
#      (hidden 2048, 8 hybrid layers, 16 experts top-1, moe_intermediate 2048, 8 q / 2 kv heads x 128,
#      vocab 50304, seq 4096, micro-batch 4; AdamW: f32 master + m + v = 21.2 GB a checkpoint):
#      - async: a run of ASYNC_STEPS (EVERY+220) steps with one background save at EVERY (150): every
#        step's time after the save against the median step before it (the same run, steps 11..EVERY),
#        summed (the save's blocking, and what the writing thread costs the steps while it writes);
#      - sync (SYNC=1; off by default to fit the GPU machine's 200 s: then estimated from bench io's
#        ckpt_save_cuda throughput): a run of SYNC_STEPS (SYNC_EVERY+10) steps with one synchronous save at
#        SYNC_EVERY (30), measured the same way;
#      per-save cost scaled to one save per 100 steps: cost / (100 x step time) (target <= 2% for async).
#      A save must be written before the next is due: 21.2 GB at the disk's ~1.3 GB/s is ~16 s = ~180
#      steps of 90 ms. With EVERY below that, a save that comes due while the previous one is still being
#      written is deferred (run.ckpt_busy "defer", the default: training goes on, the save is taken at the
#      first step after the previous one commits); the analysis reads the steps the saves were actually
#      taken at from the trainer's debug lines and reports saves requested / taken / deferred and the mean
#      interval achieved (the disk, not the writer, sets it; the commit lines in train_async.log give the
#      write speed). Each save's cost is summed from its step to the next save taken.
#      DIR=/dev/shm measures on tmpfs: the writer isolated from the disk (RAM-bound; label such results
#      "tmpfs", not the disk's; a 21 GB checkpoint needs that much free memory beside the run's).
#      The baseline: a second run of the same steps without checkpoints (NONE=1, the default; ~40 s more).
#      The median step before the first save is not enough: the step time drifts as the balancer spreads the
#      routing over the experts (+3 ms a step from step ~200 to 400 in run r17, the same in runs with saves at
#      different steps), and training is deterministic, so the control routes every step as the measured run
#      does and its time for the same step is the baseline ("against the run without checkpoints" line).
#      Both are printed; NONE=0 leaves the control out (then only the median baseline).
# Results in $OUT (default bench-out): io.json, io.txt, ckpt_overhead.txt, ckpt_overhead.json, train_*.log,
# metrics_*.jsonl, config_*.json, disk.txt. Knobs: IO_SIZE (512M), IO_FILES (2), IO_ITERS (2), DIR (the disk to measure,
# default $TMPDIR or /tmp), EVERY, ASYNC_STEPS, SYNC_EVERY, SYNC_STEPS, SYNC=0 (no sync run), LAYERS (8; fewer
# for a short run), NONE (1),
# SKIP_IO=1, SKIP_TRAIN=1. Disk: keep_last 1 and each run deleted after it (a checkpoint is 21 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}; mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -n "${KILN:-}" ]; then # a smoke test of this script elsewhere: KILN=build/kiln DEVICE=cpu HIDDEN=64 ...
  K=$(cd "$(dirname "$KILN")" && pwd)/$(basename "$KILN")
else
  . scripts/gpu_machine_build.sh
  kiln_gpu_build build-gpu ON kiln
  K=$(pwd)/build-gpu/kiln
fi
device=${DEVICE:-cuda}
scratch=$(mktemp -d "${DIR:-${TMPDIR:-/tmp}}/kiln-ckpt-bench.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
{ df -h "$scratch"; free -g; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader; } 2>&1 | tee "$out/disk.txt" || true

analyse() { # what has been measured so far -> ckpt_overhead.txt/json (after every phase: a run cut short keeps its numbers)
  python3 - "$out" "${EVERY:-150}" <<'PY' > "$out/ckpt_overhead.txt" || echo "(analysis failed)"
import json, os, re, statistics, sys
out, none_every = sys.argv[1], int(sys.argv[2])
res, dts = {}, {}
for name in ("async", "sync", "none"):
    p = f"{out}/metrics_{name}.jsonl"
    if not os.path.exists(p):
        continue
    every = json.load(open(f"{out}/config_{name}.json"))["run"]["ckpt_every"] or none_every
    rows = [json.loads(l) for l in open(p)]
    # tokens_per_s is cumulative over the run (tokens / seconds since the loop began): each step's end time
    el = {r["step"]: r["tokens"] / r["tokens_per_s"] for r in rows if r["tokens_per_s"] > 0}
    steps = sorted(el)
    dt = {s: el[s] - el[s - 1] for s in steps if s - 1 in el}
    dts[name] = dt
    base = statistics.median(dt[s] for s in dt if 11 <= s <= every)
    last = steps[-1]
    log = open(f"{out}/train_{name}.log").read() if os.path.exists(f"{out}/train_{name}.log") else ""
    commits = re.findall(r"checkpoint step (\d+) committed: rank 0's shard ([0-9.]+) GB written in ([0-9.]+) s "
                         r"\(([0-9.]+) GB/s\), training blocked ([0-9.]+) s \(snapshot ([0-9.]+) s\) after waiting "
                         r"([0-9.]+) s", log)
    committed = {int(c[0]) for c in commits}
    # the saves actually taken: run.ckpt_busy "defer" (the default) moves a save that comes due while the
    # previous one is still being written to the first step after that one commits (the trainer's debug
    # lines "checkpoint of step N deferred" and "checkpoint deferred from step N taken at step M")
    requested = list(range(every, last + 1, every)) if name != "none" else []
    deferred = sorted({int(x) for x in re.findall(r"checkpoint of step (\d+) deferred", log)})
    late = [(int(a), int(b)) for a, b in re.findall(r"checkpoint deferred from step (\d+) taken at step (\d+)", log)]
    taken = sorted(set(requested) - set(deferred) | {b for _, b in late})
    if name == "sync":
        saves, hi = [every], last
        periods = [(every, last)]
    elif name == "none" or len(taken) < 1:
        # the run without checkpoints (a control): the steps of saves every `every`, up to last - every
        saves = list(range(every, last - every + 1, every)) or [every]
        hi = min(last, saves[-1] + every)
        periods = [(sv, min(hi, sv + every)) for sv in saves]
    else:
        # each save pays from its step to the next save taken (its write is over by then: a save is only
        # taken once the previous one has committed), the last one to the end of the run if it committed
        # in the run (else it is not counted: its write went on past the end)
        periods = [(a, b) for a, b in zip(taken, taken[1:])]
        if taken[-1] in committed and taken[-1] < last:
            periods.append((taken[-1], last))
        if not periods:  # one save, still being written at the end: counted up to the end (a lower bound)
            periods = [(taken[0], last)]
        saves, hi = [a for a, _ in periods], periods[-1][1]
    span = [s for s in sorted(dt) if saves[0] < s <= hi]
    extra = sum(dt[s] - base for s in span)
    per_save = extra / len(saves)
    each = [sum(dt[s] - base for s in span if a < s <= b) for a, b in periods] if name != "sync" else [extra]
    where = re.findall(r"snapshot of [0-9.]+ GB of GPU state in ([a-z ]+) memory", log)
    res[name] = {"step_ms": base * 1e3, "saves": saves, "steps_measured": [span[0], span[-1]] if span else [],
                 "saves_requested": requested, "saves_taken": taken, "saves_deferred": deferred,
                 "deferred_taken_late": [list(x) for x in late],
                 "mean_interval_steps": (taken[-1] - taken[0]) / (len(taken) - 1) if len(taken) > 1 else None,
                 "overhead_pct_measured": 100 * extra / (len(span) * base) if span else None,
                 "extra_s_per_save": per_save, "extra_s_each": each,
                 "overhead_pct_at_1_per_100": 100 * per_save / (100 * base),
                 "commits": [{"step": int(c[0]), "gb": float(c[1]), "write_s": float(c[2]), "gbs": float(c[3]),
                              "blocked_s": float(c[4]), "snapshot_s": float(c[5]), "waited_s": float(c[6])}
                             for c in commits],
                 "snapshot_in": where[0] if where else "?"}
# Against the control: the step time drifts as training goes on (the balancer spreads the routing from one
# expert over all of them: +3 ms a step by step 400 in run r17), so the median of the steps before the first
# save is not the baseline of the steps after it. Training is deterministic, so the run without checkpoints
# routes every step as the run with them: its time for the same step is the baseline.
if "async" in res and "none" in res:
    a, n = dts["async"], dts["none"]
    r = res["async"]
    span = [s for s in sorted(a) if s in n and r["steps_measured"] and r["steps_measured"][0] <= s <= r["steps_measured"][-1]]
    if span:
        extra = sum(a[s] - n[s] for s in span)
        periods = list(zip(r["saves"], r["saves"][1:] + [span[-1]]))
        r["vs_control"] = {"steps": [span[0], span[-1]], "extra_s": extra, "extra_s_per_save": extra / len(r["saves"]),
                           "extra_s_each": [sum(a[s] - n[s] for s in span if lo < s <= hi) for lo, hi in periods],
                           "overhead_pct_measured": 100 * extra / sum(n[s] for s in span),
                           "overhead_pct_at_1_per_100": 100 * extra / len(r["saves"]) / (100 * r["step_ms"] / 1e3),
                           "control_drift_s": sum(n[s] - r["step_ms"] / 1e3 for s in span)}
print("# checkpoint overhead while training on the GPU ([cuda] benchmark config; 21.2 GB a checkpoint at 8 layers)")
for name, r in res.items():
    print(f"{name:6s}: step {r['step_ms']:.1f} ms (median of steps 11..{r['saves'][0]}); saves at {r['saves']}; steps "
          f"{r['steps_measured']} took {r['extra_s_per_save'] * 1e3:+.0f} ms per save over the median = "
          f"{r['overhead_pct_at_1_per_100']:.2f}% step-time overhead at one save per 100 steps"
          + (("  (an upper bound: it charges the step-time drift to the saves; the control below is the baseline)"
              if "vs_control" in r else "  (target <= 2%)") if name == "async" else ""))
    if len(r["extra_s_each"]) > 1:
        print("        each save's period: " + ", ".join(f"{sv}: {x * 1e3:+.0f} ms" for sv, x in zip(r["saves"], r["extra_s_each"])))
    if name == "async":
        ti = r["mean_interval_steps"]
        print(f"        saves requested {len(r['saves_requested'])} (every {r['saves_requested'][0] if r['saves_requested'] else '?'}"
              f" steps), taken {len(r['saves_taken'])} at {r['saves_taken']}, deferred {len(r['saves_deferred'])}"
              f" ({len(r['deferred_taken_late'])} taken late: "
              + ", ".join(f"{a}->{b}" for a, b in r["deferred_taken_late"]) + "); mean interval achieved "
              + (f"{ti:.1f} steps" if ti else "-")
              + (f"; steps {r['steps_measured'][0]}..{r['steps_measured'][-1]} ran "
                 f"{r['overhead_pct_measured']:+.2f}% over the median at that interval" if r["steps_measured"] else ""))
        for line in re.findall(r"checkpoints: \d+ scheduled.*", open(f"{out}/train_{name}.log").read()):
            print(f"        trainer: {line}")
    lt = r["saves_taken"][-1] if name == "async" and r.get("saves_taken") else None
    if lt is not None and not any(c["step"] == lt for c in r["commits"]):
        print(f"        the save at {lt} was still being written when the run ended: "
              + (f"its cost after step {r['steps_measured'][-1] if r['steps_measured'] else '?'} is not counted"
                 if lt in r["saves"] else "not counted") + " (more ASYNC_STEPS)")
    if "vs_control" in r:
        v = r["vs_control"]
        print(f"        against the run without checkpoints, step by step (same routing): steps {v['steps'][0]}..{v['steps'][1]} "
              f"took {v['extra_s'] * 1e3:+.0f} ms = {v['overhead_pct_measured']:+.2f}% at the interval achieved; "
              f"{v['extra_s_per_save'] * 1e3:+.0f} ms per save = {v['overhead_pct_at_1_per_100']:.2f}% at one save per 100 steps "
              f"(target <= 2%; each save: " + ", ".join(f"{x * 1e3:+.0f} ms" for x in v["extra_s_each"])
              + f"); the control itself drifted {v['control_drift_s'] * 1e3:+.0f} ms over those steps against the median above")
    for c in r["commits"]:
        print(f"        step {c['step']}: {c['gb']:.2f} GB written in {c['write_s']:.2f} s ({c['gbs']:.2f} GB/s), "
              f"training blocked {c['blocked_s'] * 1e3:.1f} ms in the save call (snapshot {c['snapshot_s'] * 1e3:.1f} ms "
              f"in {r['snapshot_in']} memory; waited {c['waited_s'] * 1e3:.1f} ms for the previous save before it)")
try:
    io = {r["test"]: r for r in json.load(open(f"{out}/io.json"))["io"]}
    seq = io["seq_write"]["gbs"]
    print(f"# kiln bench io, same run: sequential write {seq:.2f} GB/s (fsynced), parallel {io['par_write']['gbs']:.2f} GB/s")
    if "seq_write_mapped" in io:
        print(f"  {'seq_write_mapped':24s} {io['seq_write_mapped']['gbs']:6.2f} GB/s = "
              f"{100 * io['seq_write_mapped']['gbs'] / seq:4.0f}% of the sequential write (the writer's mapped path)")
    for k in ("ckpt_save", "ckpt_async_total", "ckpt_save_cuda", "ckpt_async_total_cuda"):
        if k in io:
            print(f"  {k:24s} {io[k]['gbs']:6.2f} GB/s = {100 * io[k]['gbs'] / seq:4.0f}% of the sequential write (target >= 80%)")
    for k in ("ckpt_async_block", "ckpt_async_block_cuda"):
        if k in io:
            print(f"  {k:24s} {io[k]['seconds'] * 1e3:8.1f} ms blocking")
    res["io"] = io
    if "sync" not in res and "async" in res and res["async"]["commits"] and "ckpt_save_cuda" in io:
        gb, step = res["async"]["commits"][0]["gb"], res["async"]["step_ms"] / 1e3
        t = gb / io["ckpt_save_cuda"]["gbs"]
        print(f"# no sync run (SYNC=1 adds one): a synchronous save of these {gb:.1f} GB at ckpt_save_cuda's "
              f"{io['ckpt_save_cuda']['gbs']:.2f} GB/s would block training {t:.1f} s = {100 * t / (100 * step):.1f}% "
              f"at one save per 100 steps")
except (OSError, KeyError, ValueError) as ex:
    print(f"(no io results: {ex})")
json.dump(res, open(f"{out}/ckpt_overhead.json", "w"), indent=1)
PY
}

if [ "${SKIP_IO:-0}" != 1 ]; then
  echo "== kiln bench io --ckpt --device cuda on $scratch"
  $K bench io --dir "$scratch" --size "${IO_SIZE:-512M}" --files "${IO_FILES:-2}" --iters "${IO_ITERS:-2}" --ckpt \
    --device "$device" --json "$out/io.json" 2>&1 | grep -v '^bench io' | tee "$out/io.txt"
  analyse
fi
if [ "${SKIP_TRAIN:-0}" = 1 ]; then cat "$out/ckpt_overhead.txt"; exit 0; fi

echo "== training step time with checkpoints ($device, [cuda] benchmark config)"
$K train --steps 0 --quiet >/dev/null 2>&1 || true   # prepares runs/default/data once
test -f runs/default/data/index.json
every=${EVERY:-150} sync_every=${SYNC_EVERY:-30} layers=${LAYERS:-8}
run() { # name steps ckpt_every async
  local d="$scratch/run_$1"
  python3 - "$scratch/$1.json" "$2" "$d" "$3" "$4" "$layers" "$device" <<'PY'
import json, os, sys
path, steps, run, every, asyn, L = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "true", int(sys.argv[6])
env = lambda k, d: int(os.environ.get(k, d))
H, hd = env("HIDDEN", 2048), min(128, env("HIDDEN", 2048) // 8)
cfg = {
    "model": {"vocab_size": env("VOCAB", 50304), "hidden_size": H, "num_hidden_layers": L, "layer_types": ["hybrid"] * L,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": hd, "num_experts": 16,
              "num_experts_per_tok": 1, "moe_intermediate_size": env("INTER", 2048), "router_hidden_size": min(256, H),
              "tie_word_embeddings": True},
    "data": {"dir": "runs/default/data", "seq_len": env("SEQ", 4096), "micro_batch": env("MB", 4), "grad_accum": 1},
    "optim": {"muon": False, "lr": 1e-4, "min_lr": 1e-5, "warmup": 2},
    "run": {"steps": steps, "log_every": 1, "eval_every": 0, "ckpt_every": every, "keep_last": 1,
            "async_ckpt": asyn, "save_final": False, "device": sys.argv[7], "out_dir": run},
}
json.dump(cfg, open(path, "w"), indent=1)
PY
  cp "$scratch/$1.json" "$out/config_$1.json"
  local t0 t1
  t0=$(date +%s.%N)
  KILN_LOG=debug $K train --config "$scratch/$1.json" > "$out/train_$1.log" 2>&1 || { tail -20 "$out/train_$1.log"; return 1; }
  t1=$(date +%s.%N)
  grep -E "committed|snapshot|GPU memory|training " "$out/train_$1.log" || true
  echo "$1: process wall $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
  cp "$d/metrics.jsonl" "$out/metrics_$1.jsonl"
  du -sh "$d/ckpt" 2>/dev/null | sed "s/^/$1 checkpoint dir: /" || true
  rm -rf "$d"
  analyse
}
run async "${ASYNC_STEPS:-$((every + 220))}" "$every" true
if [ "${SYNC:-0}" = 1 ]; then run sync "${SYNC_STEPS:-$((sync_every + 10))}" "$sync_every" false; fi
# the control: the same steps (and so the same learning-rate schedule and routing) without checkpoints
if [ "${NONE:-1}" = 1 ]; then run none "${ASYNC_STEPS:-$((every + 220))}" 0 true; fi
cat "$out/ckpt_overhead.txt"
