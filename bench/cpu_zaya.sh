#!/usr/bin/env bash
# CPU forward and forward+backward tokens/s for a ~20M-parameter ZAYA config.
# There is no peer on the CPU machines (PyTorch cannot be installed there); this is kiln's baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target kiln_bench_zaya_cpu >/dev/null
echo "# $(date -u +%F) $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
./build/kiln_bench_zaya_cpu "$@"
