#!/usr/bin/env bash
# kiln's default job (README's main job):
#  1. `kiln train` with no arguments: the built-in default run (a generated story corpus, a BPE
#     tokenizer trained on it, token shards, a ~2M-parameter ZAYA model trained on the CPU cores);
#  2. `kiln generate` samples text from the trained model;
#  3. a bundled tiny model's logits, loss and gradients checked against HF transformers' numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
./build/kiln train
echo "== kiln generate --model runs/default/model --prompt \"Anna\":"
./build/kiln generate --model runs/default/model --prompt "Anna" --max-new 80 --temperature 0.7 --seed 1
model=tests/fixtures/zaya/sliding_tied
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
./build/kiln logits --model "$model" --input "$model/input.safetensors" --out "$out/kiln.safetensors" --grads >/dev/null
echo "== kiln vs HF transformers on $model (logits, loss, every gradient):"
./build/kiln diff "$out/kiln.safetensors" "$model/expected.safetensors" --tol 1e-4 | tail -1
