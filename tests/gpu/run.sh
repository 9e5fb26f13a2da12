#!/usr/bin/env bash
# The GPU tests of issue [cuda], on the GPU machine: every CUDA op against its CPU reference on random
# inputs (tolerances per op in tests/gpu/*.c). Builds kiln there (scripts/gpu_machine_build.sh), then
# runs kiln_gpu_tests [FILTER].
# Ends with "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu_machine_build.sh
kiln_gpu_build build-gpu ON kiln kiln_gpu_tests
kiln_find_nccl
./build-gpu/kiln_gpu_tests "$@"
