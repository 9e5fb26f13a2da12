#!/usr/bin/env bash
# kiln's default job: a bundled ZAYA model (tests/fixtures/zaya/sliding_tied, a tiny random model
# whose reference numbers were made by HF transformers) through `kiln logits --grads`, compared
# with transformers' logits, loss and gradients by `kiln diff`, then `kiln generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
model=tests/fixtures/zaya/sliding_tied
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
./build/kiln logits --model "$model" --input "$model/input.safetensors" --out "$out/kiln.safetensors" --grads
echo "== kiln vs HF transformers (logits, loss, every gradient):"
./build/kiln diff "$out/kiln.safetensors" "$model/expected.safetensors" --tol 1e-4
echo "== kiln generate (greedy, cached decoding):"
./build/kiln generate --model "$model" --prompt-ids 5,17,42 --max-new 12 --temperature 0 --ignore-eos
