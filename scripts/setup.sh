#!/usr/bin/env bash
# Set up kiln on a fresh Debian machine: install the Debian packages the build and the tests use, build,
# and run the default job (scripts/default_job.sh: `kiln train`'s built-in run, a generation from the
# trained model, and a bundled model's numbers checked against HF transformers').
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
if ! dpkg -s libopenblas-dev libopenblas-openmp-dev libcjson-dev libxxhash-dev libpng-dev libjpeg-dev libopenmpi-dev openmpi-bin chromium cmake pkg-config gcc >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq build-essential cmake pkg-config \
    libopenblas-dev libopenblas-openmp-dev libcjson-dev libxxhash-dev libpng-dev libjpeg-dev libopenmpi-dev openmpi-bin chromium >/dev/null
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
scripts/default_job.sh
