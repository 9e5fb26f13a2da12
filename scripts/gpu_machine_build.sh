# Sourced by the scripts that run on the GPU machine (bench/*.sh, tests/gpu/run.sh): builds kiln there.
# That machine has nvcc, CMake and PyTorch but no Debian package manager, so cJSON and OpenBLAS come from
# the .deb files in .debs/ (apt-get download on a Debian machine), unpacked into /opt/kdeps.
#   kiln_gpu_build BUILD_DIR CUDA(ON|OFF) TARGET...
kiln_gpu_build() {
  local dir=$1 cuda=$2
  shift 2
  local extra=()
  if [ -d .debs ] && ! [ -e /usr/include/cjson/cJSON.h ]; then
    for f in .debs/*.deb; do dpkg -x "$f" /opt/kdeps; done
    export LD_LIBRARY_PATH=/opt/kdeps/usr/lib/x86_64-linux-gnu:/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}
    extra=(-DCMAKE_PREFIX_PATH=/opt/kdeps/usr
           -DOPENBLAS_LIB=/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
           -DOPENBLAS_INCLUDE=/opt/kdeps/usr/include/x86_64-linux-gnu/openblas-openmp)
  fi
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA="$cuda" -DKILN_WERROR=OFF "${extra[@]}" >/dev/null
  local t
  for t in "$@"; do
    cmake --build "$dir" -j"$(nproc)" --target "$t" 2>&1 | grep -E "error|warning" || true
  done
}

# NCCL for `kiln bench comm --backend nccl`: the library of the PyTorch wheels, opened at run time.
kiln_find_nccl() {
  if [ -z "${KILN_NCCL_LIB:-}" ]; then
    KILN_NCCL_LIB=$(python3 -c 'import glob, site, os
for d in site.getsitepackages():
    g = sorted(glob.glob(os.path.join(d, "nvidia/nccl/lib/libnccl.so*")))
    if g: print(g[0]); break')
    export KILN_NCCL_LIB
  fi
  export NCCL_NVLS_ENABLE=0
}
