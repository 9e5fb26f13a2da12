#!/usr/bin/env bash
# Issue [size]'s validation on the GPU machine, one script, one run: kiln size's predictions of
# `kiln train --device cuda` against the trainer's own measurements, for several shapes.
#  1. builds kiln (scripts/gpu_machine_build.sh);
#  2. measures a fresh hardware profile from kiln's own kernels in this run: for every shape its exact GEMMs
#     (kiln bench gemm --model), its attention (kiln bench attention --device cuda) and its expert op
#     (kiln bench moe --device cuda), and the GPU copy sweep (kiln bench membw --device cuda), folded into
#     a copy of data/profiles/h200.json by data/profiles/merge_bench.py;
#  3. runs `kiln train --device cuda` (KILN_CUDA_PROFILE=1: the last step's per-op times) on a calibration
#     shape that is NOT validated: for each group of op classes no kiln bench times (CCA convolutions, the
#     memory-bound ops: norms, residual joins, pointwise glue, QK norm, cross-entropy, embedding; the
#     optimizer with the gradient norm; the time outside the profiled ops) its measured over kiln size's modelled
#     time there becomes the group's scale in the profile (kiln_kernels.rates), and the device peak minus
#     kiln's own buffers and the ops' pool the runtime's memory (memory.runtime_gib);
#  4. for each validated shape runs `kiln train --device cuda` and `kiln size predict --json` on that
#     profile, and prints predicted vs measured ms/step, tokens/s and device peak memory (error %), plus
#     the per-op-class comparison of the benchmark config ([cuda]'s: hidden 2048, 8 layers, 16 experts
#     top-1, width 2048, 8 q / 2 kv x 128, vocab 50304, seq 4096, micro-batch 4).
# Outputs in $OUT (default size-validate-out): size_validate.json, size_validate.csv, size_validate_ops.csv,
# size_validate.txt (the tables), h200_measured.json (the profile), the bench JSONs and train logs.
# Env: STEPS (default 8; 3 warm-up, the last is profiled and not timed), SHAPES (default all: names below),
# BUDGET_S (default 180: a shape is started only when it should end by then, so that the tables get made),
# ANALYZE_ONLY=1 (no build and no GPU: redo steps 2-4's profile and tables from the files already in $OUT,
# with KILN=path/to/kiln, e.g. on the CPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-size-validate-out}; mkdir -p "$out"
steps=${STEPS:-8}
t0=$(date +%s)
K=${KILN:-./build-gpu/kiln}
if [ "${ANALYZE_ONLY:-0}" != 1 ]; then
if [ -z "${KILN:-}" ]; then  # (the build also sets LD_LIBRARY_PATH for the GPU machine's unpacked libraries)
  . scripts/gpu_machine_build.sh
  kiln_gpu_build build-gpu ON kiln
  echo "== built in $(( $(date +%s) - t0 )) s"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# data: the built-in corpus (token ids < 2048; a step's work does not depend on them), made once
$K train --steps 0 --quiet >/dev/null 2>&1 || true
test -f runs/default/data/index.json
$K bench membw --device cuda --min 16K --max 256M --factor 4 --iters 5 --json "$out/membw.json" > "$out/membw.txt"

# name hidden layers heads kv head_dim experts top_k inter vocab seq micro_batch. Besides the benchmark config,
# shapes of <= 0.3B parameters: kiln train initialises the model on one CPU thread (~25 ns a parameter), and
# the whole script must fit in the GPU run's 200 s. CUDA_TRAIN_OUT=DIR (bench/cuda_train.sh's $OUT of the same
# run, the same config) takes the benchmark config's kiln train from there instead of training it again.
all_shapes="calib 1024 4 8 2 128 8 1 1024 50304 2048 4
top2 2048 4 16 4 128 4 2 2048 50304 4096 2
s8192 1536 4 12 2 128 8 1 1536 32768 8192 2
h1024 1024 6 8 2 128 8 1 1024 50304 4096 4
e4w3072 1536 4 12 4 128 4 1 3072 50304 2048 8
bench 2048 8 8 2 128 16 1 2048 50304 4096 4
e32w512 1024 4 8 2 128 32 1 512 50304 4096 4"
want=${SHAPES:-calib top2 s8192 h1024 e4w3072 bench e32w512}
budget=${BUDGET_S:-180}  # a shape is started only if it should end by then: the tables are made from what ran
echo "$all_shapes" | while read -r name H L NH KV D E TOP I V T B; do
  case " $want " in *" $name "*) ;; *) continue ;; esac
  est=25  # seconds: init on the CPU, benches, 8 steps
  [ "$name" = bench ] && est=$([ -n "${CUDA_TRAIN_OUT:-}" ] && echo 15 || echo 65)
  if [ $(( $(date +%s) - t0 + est )) -gt "$budget" ]; then echo "== $name: skipped (would end past ${budget} s)"; continue; fi
  python3 - "$out/$name.json" "$out/run_$name" "$steps" "$H" "$L" "$NH" "$KV" "$D" "$E" "$TOP" "$I" "$V" "$T" "$B" <<'PY'
import json, sys
path, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
H, L, NH, KV, D, E, TOP, I, V, T, B = map(int, sys.argv[4:])
cfg = {"model": {"vocab_size": V, "hidden_size": H, "num_hidden_layers": L, "layer_types": ["hybrid"] * L,
                 "num_attention_heads": NH, "num_key_value_heads": KV, "head_dim": D, "num_experts": E,
                 "num_experts_per_tok": TOP, "moe_intermediate_size": I, "router_hidden_size": 256,
                 "tie_word_embeddings": True},
       "data": {"dir": "runs/default/data", "seq_len": T, "micro_batch": B, "grad_accum": 1},
       "optim": {"muon": False, "lr": 1e-4, "min_lr": 1e-5, "warmup": 2},
       "run": {"steps": steps, "log_every": 1, "eval_every": 0, "ckpt_every": 0, "save_final": False,
               "device": "cuda", "out_dir": run}}
json.dump(cfg, open(path, "w"), indent=1)
PY
  N=$((B * T))
  echo "== $name: hidden $H, $L layers, $NH/$KV heads x $D, $E experts top-$TOP width $I, vocab $V, seq $T x $B"
  if [ "$name" != calib ]; then  # the calibration uses only the groups no bench times
  $K bench gemm --device cuda --dtype bf16 --model "$out/$name.json" --iters 5 --warmup 2 \
    --json "$out/gemm_$name.json" < /dev/null > "$out/gemm_$name.txt" || echo "(kiln bench gemm failed: $name)"
  $K bench attention --device cuda --batch "$B" --seq "$T" --heads "$NH" --kv-heads "$KV" --head-dim "$D" \
    --iters 5 --warmup 2 --json "$out/attn_$name.json" < /dev/null > "$out/attn_$name.txt" || echo "(kiln bench attention failed: $name)"
  $K bench moe --device cuda --tokens "$N" --hidden "$H" --inter "$I" --experts "$E" --top-k "$TOP" \
    --routing balanced --paths default --iters 5 --warmup 2 --json "$out/moe_$name.json" < /dev/null > "$out/moe_$name.txt" || echo "(kiln bench moe failed: $name)"
  fi
  rm -rf "$out/run_$name"
  if [ "$name" = bench ] && [ -n "${CUDA_TRAIN_OUT:-}" ] && python3 - "$out/$name.json" "$CUDA_TRAIN_OUT" <<'PY'
import json, os, sys
mine, theirs = json.load(open(sys.argv[1])), os.path.join(sys.argv[2], "cuda_train_config.json")
t = json.load(open(theirs))
ok = (t["model"] == mine["model"] and all(t["data"][k] == mine["data"][k] for k in ("seq_len", "micro_batch", "grad_accum"))
      and t["optim"].get("muon") == mine["optim"]["muon"] and os.path.exists(os.path.join(sys.argv[2], "kiln_run/metrics.jsonl"))
      and "per-op time of the last step" in open(os.path.join(sys.argv[2], "kiln_train.log")).read())
sys.exit(0 if ok else 1)
PY
  then
    echo "   kiln train of the benchmark config: bench/cuda_train.sh's run in $CUDA_TRAIN_OUT (same config)"
    mkdir -p "$out/run_$name" && cp "$CUDA_TRAIN_OUT/kiln_run/metrics.jsonl" "$out/run_$name/"
    cp "$CUDA_TRAIN_OUT/kiln_train.log" "$out/train_$name.log"
  else
    KILN_CUDA_PROFILE=1 $K train --config "$out/$name.json" < /dev/null > "$out/train_$name.log" 2>&1 || echo "(kiln train failed: $name)"
  fi
  grep -E "device peak|step wall" "$out/train_$name.log" || true
  echo "   ($(( $(date +%s) - t0 )) s)"
done
fi

prof="$out/h200_measured.json"
cp data/profiles/h200.json "$prof"
python3 data/profiles/merge_bench.py "$prof" "$out"/gemm_*.json "$out"/attn_*.json "$out"/moe_*.json "$out/membw.json"
cp "$prof" "$out/h200_benches_only.json"
for lg in "$out"/train_*.log; do
  n=${lg##*/train_}; n=${n%.log}
  $K size predict "$out/$n.json" --profile "$out/h200_benches_only.json" --gpus 1 --json > "$out/predict0_$n.json" ||
    { echo "(kiln size predict failed: $n)"; rm -f "$out/predict0_$n.json"; }
done

python3 - "$out" "$K" <<'PY'
import glob, json, math, os, re, subprocess, sys
out, K = sys.argv[1], sys.argv[2]
OUTSIDE = "outside the profiled ops"
BENCHED = ("GEMMs", "attention", "experts")

def group_of(c):  # as kiln_size_op_group (src/sizing/step_cuda.c)
    if c.startswith(("linear", "LM head")): return "GEMMs"
    if c.startswith("attention"): return "attention"
    if c.startswith("experts"): return "experts"
    if c.startswith("CCA conv"): return "CCA convolutions"
    if c.startswith(("optimizer", "bf16 weight copy", "gradient norm")): return "optimizer"
    if c.startswith("outside"): return OUTSIDE
    return "memory-bound ops"

def measured(name):
    log = open(f"{out}/train_{name}.log").read()
    rows = [json.loads(l) for l in open(f"{out}/run_{name}/metrics.jsonl")]
    # tokens_per_s in metrics is cumulative (tokens / elapsed): the elapsed time of each step
    el = [(r["step"], r["tokens"], r["tokens"] / r["tokens_per_s"]) for r in rows if r["tokens_per_s"] > 0]
    warm = min(3, len(el) - 3)
    s0, t0, e0 = el[warm]
    s1, t1, e1 = el[-2]  # the last step carries the per-op events
    ops = {}
    sec = log.split("per-op time of the last step", 1)
    if len(sec) > 1:
        for line in sec[1].splitlines()[2:]:
            m = re.match(r"^\s+(.+?)\s+([0-9.]+)\s+([0-9.]+)%\s+(\d+)\s*$", line)
            if m: ops[m.group(1)] = float(m.group(2))
            elif "sum of the ops" in line: break
    ms = 1000 * (e1 - e0) / (s1 - s0)
    groups = {}
    for k, v in ops.items():
        groups[group_of(k)] = groups.get(group_of(k), 0) + v
    groups[OUTSIDE] = ms - sum(ops.values())  # memsets, host work and gaps between the profiled ops
    mem = re.search(r"GPU memory: parameters ([0-9.]+) GiB, gradients ([0-9.]+) GiB, optimizer state ([0-9.]+) GiB, "
                    r"activations ([0-9.]+) GiB \(\+ backward scratch ([0-9.]+) GiB\), ops' pool peak ([0-9.]+) GiB; "
                    r"device peak in use ([0-9.]+) GiB", log)
    m = dict(zip(["parameters", "gradients", "optimizer_state", "activations", "backward_scratch", "pool",
                  "device_peak"], map(float, mem.groups()))) if mem else {}
    return {"tokens_per_s": (t1 - t0) / (e1 - e0), "ms_per_step": ms, "steps_timed": f"{s0 + 1}..{s1}",
            "ops_ms": ops, "groups_ms": groups, "memory_gib": m}

def by_group(pred):
    g = {}
    for c in pred["step"]["classes"]:
        g[c["group"]] = g.get(c["group"], 0) + c["ms"]
    return g

def predict(cfg, prof):
    r = subprocess.run([K, "size", "predict", cfg, "--profile", prof, "--gpus", "1", "--json"], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)["kiln_cuda"]

def p0_of(name):
    return json.load(open(f"{out}/predict0_{name}.json"))["kiln_cuda"]

def scales(p0, m):  # measured / modelled per unbenched group
    g0 = by_group(p0)
    return {g: m["groups_ms"][g] / g0[g] for g in g0
            if g not in BENCHED and g0[g] > 0 and m["groups_ms"].get(g, 0) > 0}

# calibration on the calib shape: the groups no kiln bench times, and what the runtime holds
prof = f"{out}/h200_measured.json"
P = json.load(open(prof))
rates, runtime = [], None
mc = None
try:
    mc = measured("calib")
except Exception as ex:
    print(f"calib: no measurement ({ex}): no calibration scales")
if mc is not None and os.path.exists(f"{out}/predict0_calib.json"):
    rates = [{"class": g, "scale": round(v, 4)} for g, v in sorted(scales(p0_of("calib"), mc).items())]
    mm = mc["memory_gib"]
    if mm:
        own = sum(mm[k] for k in ("parameters", "gradients", "optimizer_state", "activations", "backward_scratch", "pool"))
        runtime = mm["device_peak"] - own
P.setdefault("kiln_kernels", {"source": "measured", "attention": [], "moe": [], "copy_sweep": []})["rates"] = rates
if runtime is not None:
    P["memory"]["runtime_gib"] = round(max(runtime, 0), 3)
    P["memory"]["source"] += "; runtime_gib: device peak in use minus kiln's own buffers and the ops' pool, calibration run"
json.dump(P, open(prof, "w"), indent=2)

rows, groups, oprows, meas_all = [], [], [], {}
for lg in sorted(glob.glob(f"{out}/train_*.log")):
    name = os.path.basename(lg)[len("train_"):-4]
    cfg = f"{out}/{name}.json"
    try:
        m = measured(name)
        p0 = p0_of(name)
    except Exception as ex:
        print(f"{name}: no measurement or prediction ({ex})")
        continue
    meas_all[name] = m
    if name == "calib":
        continue
    p = predict(cfg, prof)
    c = json.load(open(cfg))
    mo, d = c["model"], c["data"]
    shape = (f"h{mo['hidden_size']} L{mo['num_hidden_layers']} q{mo['num_attention_heads']}/kv{mo['num_key_value_heads']}"
             f"x{mo['head_dim']} E{mo['num_experts']} k{mo['num_experts_per_tok']} I{mo['moe_intermediate_size']} "
             f"V{mo['vocab_size']} T{d['seq_len']} B{d['micro_batch']}")
    mp = m["memory_gib"].get("device_peak", float("nan"))
    pp = p["memory_gib"]["device_peak"]
    rows.append({"name": name, "shape": shape, "pred_ms": p["step"]["ms"], "meas_ms": m["ms_per_step"],
                 "pred_tok_s": p["step"]["tokens_per_s"], "meas_tok_s": m["tokens_per_s"],
                 "err_time_pct": 100 * (p["step"]["ms"] / m["ms_per_step"] - 1),
                 "pred_ms_benches_only": p0["step"]["ms"],
                 "err_time_benches_only_pct": 100 * (p0["step"]["ms"] / m["ms_per_step"] - 1),
                 "pred_peak_gib": pp, "meas_peak_gib": mp, "err_mem_pct": 100 * (pp / mp - 1),
                 "memory_pred": p["memory_gib"], "memory_meas": m["memory_gib"], "steps_timed": m["steps_timed"]})
    pg = by_group(p)
    for g in sorted(set(pg) | set(m["groups_ms"])):
        groups.append({"name": name, "group": g, "pred_ms": pg.get(g, 0.0), "meas_ms": m["groups_ms"].get(g, 0.0)})
    for cl in p["step"]["classes"]:
        meas = m["groups_ms"][OUTSIDE] if cl["class"] == OUTSIDE else m["ops_ms"].get(cl["class"], 0.0)
        oprows.append({"name": name, "class": cl["class"], "group": cl["group"], "pred_ms": cl["ms"],
                       "meas_ms": meas, "from": cl["from"]})
    for k, v in m["ops_ms"].items():
        if not any(o["name"] == name and o["class"] == k for o in oprows):
            oprows.append({"name": name, "class": k, "group": group_of(k), "pred_ms": 0.0, "meas_ms": v,
                           "from": "(no class of that name in the model: see its group)"})

# leave-one-out: each shape's unbenched groups scaled by the geometric mean of measured/modelled over all the
# OTHER shapes' runs (the calibration shape included) instead of the calibration shape alone
pool = {n: scales(p0_of(n), m) for n, m in meas_all.items()}
for r in rows:
    pred = 0.0
    for g, v in by_group(p0_of(r["name"])).items():
        others = [q[g] for n, q in pool.items() if n != r["name"] and g in q]
        pred += v * (math.exp(sum(math.log(x) for x in others) / len(others)) if others and g not in BENCHED else 1.0)
    r["pred_ms_loo"] = pred
    r["err_time_loo_pct"] = 100 * (pred / r["meas_ms"] - 1)

lines = []
P = lambda s="": lines.append(s)
P(f"# kiln size predict vs kiln train --device cuda, {len(rows)} shapes. Profile {prof}: this run's kiln bench")
P("# gemm --model / attention / moe / membw; the groups no bench times scaled by the calibration shape's measured/modelled")
P(f"{'shape':50} {'pred ms':>8} {'meas ms':>8} {'err':>7} {'pred tok/s':>10} {'meas tok/s':>10} {'pred GiB':>8} {'meas GiB':>8} {'err':>7} {'benches-only':>12} {'leave-1-out':>11}")
for r in rows:
    P(f"{r['shape']:50} {r['pred_ms']:8.1f} {r['meas_ms']:8.1f} {r['err_time_pct']:+6.1f}% {r['pred_tok_s']:10.0f} "
      f"{r['meas_tok_s']:10.0f} {r['pred_peak_gib']:8.2f} {r['meas_peak_gib']:8.2f} {r['err_mem_pct']:+6.1f}% "
      f"{r['err_time_benches_only_pct']:+11.1f}% {r['err_time_loo_pct']:+10.1f}%")
P("(benches-only: no calibration scales; leave-1-out: the scales from all the other shapes' runs, not the calibration shape's)")
if rows:
    P(f"worst |time error| {max(abs(r['err_time_pct']) for r in rows):.1f}% (target <= 15%), worst |memory error| "
      f"{max(abs(r['err_mem_pct']) for r in rows):.1f}% (target <= 10%)")
P("calibration (measured / modelled on the calib shape): " + ", ".join(f"{x['class']} x{x['scale']:.2f}" for x in rates) +
  (f"; runtime memory {runtime:.2f} GiB" if runtime is not None else ""))
for r in rows:
    mp, mm = r["memory_pred"], r["memory_meas"]
    P(f"memory {r['name']}: " + ", ".join(f"{k} {mp.get(k, 0):.2f}/{mm.get(k, float('nan')):.2f}" for k in
      ["parameters", "gradients", "optimizer_state", "activations", "backward_scratch", "pool", "device_peak"]) +
      " GiB (predicted/measured)")
P()
P("by group of op classes, ms per step, predicted/measured (the last step's CUDA events; 'outside' = step - sum of the ops)")
gnames = ["GEMMs", "attention", "experts", "CCA convolutions", "memory-bound ops", "optimizer", OUTSIDE]
P(f"  {'shape':14}" + "".join(f" {g[:16]:>16}" for g in gnames))
for r in rows:
    cells = []
    for g in gnames:
        x = [q for q in groups if q["name"] == r["name"] and q["group"] == g]
        cells.append(f"{x[0]['pred_ms']:7.1f}/{x[0]['meas_ms']:<7.1f}" if x else f"{'-':>16}")
    P(f"  {r['name']:14} " + " ".join(f"{c:>16}" for c in cells))
for name in ["bench"] + [r["name"] for r in rows if r["name"] != "bench"]:
    ops = sorted([o for o in oprows if o["name"] == name], key=lambda o: -o["meas_ms"])
    if not ops:
        continue
    P()
    P(f"per op class, {name} (ms per step; the last step's CUDA events vs kiln size)")
    P(f"  {'op class':42} {'pred':>8} {'meas':>8} {'diff':>8}  from")
    for o in ops:
        P(f"  {o['class']:42} {o['pred_ms']:8.2f} {o['meas_ms']:8.2f} {o['pred_ms'] - o['meas_ms']:+8.2f}  {o['from']}")
txt = "\n".join(lines)
print(txt)
open(f"{out}/size_validate.txt", "w").write(txt + "\n")
json.dump({"profile": prof, "rates": rates, "runtime_gib": runtime, "shapes": rows, "groups": groups, "ops": oprows},
          open(f"{out}/size_validate.json", "w"), indent=1)
with open(f"{out}/size_validate.csv", "w") as f:
    f.write("name,shape,pred_ms,meas_ms,err_time_pct,pred_tok_s,meas_tok_s,pred_peak_gib,meas_peak_gib,err_mem_pct,"
            "err_time_benches_only_pct,err_time_leave_one_out_pct\n")
    for r in rows:
        f.write(f"{r['name']},\"{r['shape']}\",{r['pred_ms']:.3f},{r['meas_ms']:.3f},{r['err_time_pct']:.2f},{r['pred_tok_s']:.0f},"
                f"{r['meas_tok_s']:.0f},{r['pred_peak_gib']:.3f},{r['meas_peak_gib']:.3f},{r['err_mem_pct']:.2f},"
                f"{r['err_time_benches_only_pct']:.2f},{r['err_time_loo_pct']:.2f}\n")
with open(f"{out}/size_validate_ops.csv", "w") as f:
    f.write("name,class,group,pred_ms,meas_ms,from\n")
    for o in oprows:
        f.write(f"{o['name']},\"{o['class']}\",\"{o['group']}\",{o['pred_ms']:.3f},{o['meas_ms']:.3f},\"{o['from']}\"\n")
print(f"-> {out}/size_validate.json, size_validate.csv, size_validate_ops.csv, size_validate.txt")
PY
echo "== done in $(( $(date +%s) - t0 )) s"
