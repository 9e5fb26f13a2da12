#!/usr/bin/env bash
# Build and run kiln's test suite (the README's test command). Ends with "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
./build/kiln_tests
