# Sourced by the scripts that run on the GPU machine (bench/*.sh, tests/gpu/run.sh): builds kiln there.
# That machine has nvcc, CMake and PyTorch but no Debian package manager, so cJSON and OpenBLAS come from
# the .deb files in .debs/ (apt-get download on a Debian machine), unpacked into /opt/kdeps (OpenMPI's, in .debs/mpi/,
# into /opt/kdeps-mpi by kiln_kdeps_mpi):
#   apt-get download libcjson1 libcjson-dev libxxhash-dev libxxhash0 libopenblas0-openmp libopenblas-openmp-dev libopenblas-dev libopenblas0 \
#     libgfortran5 libgomp1 libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo libjpeg-dev zlib1g-dev \
#     openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libhwloc15 libevent-core-2.1-7 \
#     libevent-pthreads-2.1-7 libevent-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 \
#     libpsm-infinipath1 libpsm2-2 libnuma1 libmunge2 libltdl7 libpciaccess0 libxnvctrl0
#   kiln_gpu_build BUILD_DIR CUDA(ON|OFF) TARGET...
kiln_gpu_build() {
  local dir=$1 cuda=$2
  shift 2
  local extra=()
  kiln_find_cudnn
  if [ -d .debs ] && ! [ -e /usr/include/cjson/cJSON.h ]; then
    for f in .debs/*.deb; do dpkg -x "$f" /opt/kdeps; done
    export LD_LIBRARY_PATH=/opt/kdeps/usr/lib/x86_64-linux-gnu:/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}
    extra=(-DCMAKE_PREFIX_PATH=/opt/kdeps/usr
           -DOPENBLAS_LIB=/opt/kdeps/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
           -DOPENBLAS_INCLUDE=/opt/kdeps/usr/include/x86_64-linux-gnu/openblas-openmp)
  fi
  kiln_kdeps_mpi && extra+=(-DMPI_C_COMPILER=/opt/kdeps-mpi/usr/bin/mpicc)
  if [ -n "${KILN_CUDNN_INCLUDE:-}" ]; then extra+=(-DKILN_CUDNN_INCLUDE="$KILN_CUDNN_INCLUDE"); fi
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA="$cuda" -DKILN_WERROR=OFF "${extra[@]}" >/dev/null
  local t
  for t in "$@"; do
    cmake --build "$dir" -j"$(nproc)" --target "$t" 2>&1 | grep -E "error|warning" || true
  done
}

# OpenMPI from .debs/mpi (the second half of the list above, kept apart so that a machine with an MPI of its own
# never gets these libraries on its LD_LIBRARY_PATH), unpacked into /opt/kdeps-mpi only where the machine has no
# mpirun: the two-rank GPU test (gpu_zaya_train_two_ranks_staged) runs `mpirun -np 2 kiln train --device cuda`
# there. OpenMPI and PMIx look for their plugins and help files under their build prefix (/usr); OPAL_PREFIX,
# PMIX_DESTDIR and PMIx's component path move them to the copy. Returns 1 (and changes nothing) where the machine
# has its own mpirun or there are no such .debs; sourcing twice is harmless (OPAL_PREFIX then names the copy).
kiln_kdeps_mpi() {
  local k=/opt/kdeps-mpi f
  if [ "${OPAL_PREFIX:-}" != "$k/usr" ]; then
    command -v mpirun >/dev/null 2>&1 && return 1
    ls .debs/mpi/*.deb >/dev/null 2>&1 || return 1
    for f in .debs/mpi/*.deb; do dpkg -x "$f" $k; done
  fi
  [ -x $k/usr/bin/orterun ] || return 1
  ln -sf mpirun.openmpi $k/usr/bin/mpirun
  ln -sf mpicc.openmpi $k/usr/bin/mpicc
  export OPAL_PREFIX=$k/usr PMIX_DESTDIR=$k
  export PMIX_MCA_mca_base_component_path=$k/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
  export OMPI_MCA_plm_rsh_agent=false # one host: no remote shell (the image has none)
  # large messages between the ranks by copies through shared memory, not process_vm_readv (a sandbox may refuse it)
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  case ":$PATH:" in *":$k/usr/bin:"*) ;; *) export PATH=$k/usr/bin:$PATH ;; esac
  case ":${LD_LIBRARY_PATH:-}:" in *":$k/usr/lib/x86_64-linux-gnu/openmpi/lib:"*) ;;
    *) export LD_LIBRARY_PATH=$k/usr/lib/x86_64-linux-gnu:$k/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-} ;;
  esac
  return 0
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

# cuDNN for the attention (src/cuda/attention_cudnn.cu opens it at run time): $KILN_CUDNN_LIB if set, else
# the library of PyTorch's nvidia-cudnn wheel, else libcudnn.so.9 wherever the loader finds it. Exports
# KILN_CUDNN_LIB, its directory on LD_LIBRARY_PATH (cuDNN 9 loads its sub-libraries from there) and
# KILN_CUDNN_INCLUDE (the wheel's headers: the build checks kiln's declarations against them).
kiln_find_cudnn() {
  local found
  found=$(python3 -c 'import glob, site, os
for d in site.getsitepackages():
    g = sorted(glob.glob(os.path.join(d, "nvidia/cudnn/lib/libcudnn.so.9*")))
    if g: print(g[0] + "|" + os.path.join(d, "nvidia/cudnn/include")); break' 2>/dev/null || true)
  if [ -z "${KILN_CUDNN_LIB:-}" ] && [ -n "$found" ]; then export KILN_CUDNN_LIB=${found%%|*}; fi
  if [ -z "${KILN_CUDNN_LIB:-}" ]; then
    local l
    for l in /usr/local/cuda/lib64/libcudnn.so.9 /usr/local/cuda/lib/libcudnn.so.9 /usr/lib/x86_64-linux-gnu/libcudnn.so.9; do
      if [ -e "$l" ]; then export KILN_CUDNN_LIB=$l; break; fi
    done
  fi
  if [ -n "${KILN_CUDNN_LIB:-}" ]; then
    export LD_LIBRARY_PATH=$(dirname "$KILN_CUDNN_LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    if [ -n "$found" ] && [ -e "${found#*|}/cudnn.h" ] && [ -z "${KILN_CUDNN_INCLUDE:-}" ]; then
      export KILN_CUDNN_INCLUDE=${found#*|}
    fi
    echo "cuDNN: $KILN_CUDNN_LIB${KILN_CUDNN_INCLUDE:+ (headers $KILN_CUDNN_INCLUDE)}" >&2
  else
    echo "cuDNN: not found (attention runs kiln's own kernels)" >&2
  fi
}
