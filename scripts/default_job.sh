#!/usr/bin/env bash
# kiln's default job: run a bundled ZAYA model (tests/fixtures/zaya/sliding_tied, a tiny random
# model whose numbers were made by HF transformers) through `kiln logits --grads` and `kiln generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
model=tests/fixtures/zaya/sliding_tied
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
./build/kiln logits --model "$model" --input "$model/input.safetensors" --out "$out/out.safetensors" --grads
echo "HF transformers' loss for the same input: see $model/expected.safetensors (the tests compare every tensor)"
./build/kiln generate --model "$model" --prompt-ids 1,2,3 --max-new 16 --temperature 0.8 --seed 1
