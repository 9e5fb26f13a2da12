# The [cuda] benchmark's training config (hidden 2048, 8 'hybrid' layers, 16 experts top-1, moe_intermediate 2048,
# 8 query / 2 KV heads of 128, vocab 50304, sequence 4096, micro-batch 4, AdamW like the peer) as kiln train's JSON.
# Shared by bench/cuda_train.sh (one GPU) and bench/multi_gpu.sh (data parallel over several).
# Usage: python3 zaya_bench_config.py OUT.json STEPS RUN_DIR [DETERMINISTIC=1] [GRAD_ACCUM=1] [CKPT_EVERY=0]
# BENCH_LAYERS=N in the environment: N layers instead of 8 (a smaller model, to try the scripts' several-rank paths
# with ranks sharing one GPU; not the benchmark).
import json, os, sys
path, steps, run = sys.argv[1], int(sys.argv[2]), sys.argv[3]
det = sys.argv[4] != "0" if len(sys.argv) > 4 else True
accum = int(sys.argv[5]) if len(sys.argv) > 5 else 1
ckpt = int(sys.argv[6]) if len(sys.argv) > 6 else 0
L = int(os.environ.get("BENCH_LAYERS") or 8)
cfg = {
    "model": {"vocab_size": 50304, "hidden_size": 2048, "num_hidden_layers": L, "layer_types": ["hybrid"] * L,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "num_experts": 16,
              "num_experts_per_tok": 1, "moe_intermediate_size": 2048, "router_hidden_size": 256,
              "tie_word_embeddings": True},
    "data": {"dir": "runs/default/data", "seq_len": 4096, "micro_batch": 4, "grad_accum": accum},
    "optim": {"muon": False, "lr": 1e-4, "min_lr": 1e-5, "warmup": 2},
    "run": {"steps": steps, "log_every": 1, "eval_every": 0, "ckpt_every": ckpt, "save_final": False,
            "device": "cuda", "out_dir": run, "deterministic": det},
}
json.dump(cfg, open(path, "w"), indent=1)
