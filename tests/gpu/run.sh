#!/usr/bin/env bash
# The GPU tests of issue [cuda], on the GPU machine: every CUDA op against its CPU reference on random
# inputs (tolerances per op in tests/gpu/*.c). Builds kiln there (cJSON/OpenBLAS from .debs/ when the
# machine has no package manager, as bench/gpu_bench.sh), then runs kiln_gpu_tests [FILTER].
# Ends with "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/../.."
extra=()
if [ -d .debs ] && ! [ -e /usr/include/cjson/cJSON.h ]; then
  for f in .debs/*.deb; do dpkg -x "$f" /opt/kdeps; done
  export LD_LIBRARY_PATH=/opt/kdeps/usr/lib/x86_64-linux-gnu:/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}
  extra=(-DCMAKE_PREFIX_PATH=/opt/kdeps/usr
         -DOPENBLAS_LIB=/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
         -DOPENBLAS_INCLUDE=/opt/kdeps/usr/include/x86_64-linux-gnu/openblas-openmp)
fi
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_WERROR=OFF "${extra[@]}" >/dev/null
cmake --build build-gpu -j"$(nproc)" --target kiln_gpu_tests 2>&1 | grep -E "error|warning" || true
./build-gpu/kiln_gpu_tests "$@"
