#!/usr/bin/env bash
# CPU training throughput of the built-in default config at 1 and 2 MPI ranks (ZeRO-1).
# Prints tokens/s from each run's metrics.jsonl (the mean over its last 40 steps).
# There is no peer on the CPU machines (PyTorch cannot be installed there).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target kiln >/dev/null
steps=${STEPS:-120}
./build/kiln train --steps 0 --quiet >/dev/null 2>&1 || true   # prepares runs/default/data once
tps() { python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = rows[-4:]
print(f"{sum(r['tokens_per_s'] for r in rows) / len(rows):.0f}")
PY
}
echo "# $(date -u +%F) $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
printf "%-8s %12s\n" ranks tokens/s
out1=$(mktemp -d); out2=$(mktemp -d)
./build/kiln train --steps "$steps" --out "$out1" --data runs/default/data --quiet
printf "%-8s %12s\n" 1 "$(tps "$out1/metrics.jsonl")"
mpirun --allow-run-as-root --oversubscribe -np 2 ./build/kiln train --steps "$steps" --out "$out2" --data runs/default/data --quiet
printf "%-8s %12s\n" 2 "$(tps "$out2/metrics.jsonl")"
rm -rf "$out1" "$out2"
