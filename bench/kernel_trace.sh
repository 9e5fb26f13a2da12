#!/usr/bin/env bash
# A kernel timeline of one command on the GPU machine, without Nsight Systems (bench/kernel_trace.c):
#   bench/kernel_trace.sh OUT_DIR [--marker REGEX] [--steps N] -- COMMAND [ARGS...]
# builds OUT_DIR/libkiln_kernel_trace.so against a CUPTI found on the machine (CUPTI_ROOT, the CUDA toolkit's, or
# the PyTorch wheels'), runs COMMAND under it, and writes OUT_DIR/trace.csv, OUT_DIR/report.txt,
# OUT_DIR/report.json and OUT_DIR/report.html (bench/kernel_trace_report.py: idle gaps, overlap and per-kernel
# and per-category time of the last windows between marker kernels, the last one as an SVG timeline; the
# default marker 'adamw' makes a window one training step). Example:
#   bench/kernel_trace.sh /tmp/kt -- ./build-gpu/kiln train --device cuda ...
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/kernel_trace.sh OUT_DIR [--marker REGEX] [--steps N] -- COMMAND...}
shift
report_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do report_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || { echo "kernel_trace.sh: no command after --" >&2; exit 2; }
mkdir -p "$out"

# a CUPTI header and the library beside it (the two must be one version: the records' layout is the header's)
roots=()
[ -n "${CUPTI_ROOT:-}" ] && roots+=("$CUPTI_ROOT")
for d in /usr/local/cuda/extras/CUPTI /usr/local/cuda /usr/local/cuda/targets/x86_64-linux; do roots+=("$d"); done
while IFS= read -r h; do roots+=("$(dirname "$(dirname "$h")")"); done < <(python3 - <<'EOF' 2>/dev/null || true
import glob, os, site
for d in site.getsitepackages():
    for h in sorted(glob.glob(os.path.join(d, "nvidia", "**", "include", "cupti.h"), recursive=True)):
        print(h)
EOF
)
inc= lib=
for r in "${roots[@]}"; do
  [ -e "$r/include/cupti.h" ] || continue
  l=$(ls "$r"/lib64/libcupti.so* "$r"/lib/libcupti.so* 2>/dev/null | head -1 || true)
  if [ -n "$l" ]; then inc=$r/include lib=$l; break; fi
done
[ -n "$inc" ] || { echo "kernel_trace.sh: no CUPTI (cupti.h with libcupti.so) found; set CUPTI_ROOT" >&2; exit 1; }
newest() { # the newest versioned name of a CUPTI record struct its headers declare
  grep -hoE "\} *$1[0-9]+ *;" "$inc"/cupti*.h | grep -oE "$1[0-9]+" | sort -V | tail -1
}
kk=$(newest CUpti_ActivityKernel) mc=$(newest CUpti_ActivityMemcpy) ms=$(newest CUpti_ActivityMemset)
echo "kernel_trace: CUPTI $lib ($kk, $mc, $ms)" >&2
so=$out/libkiln_kernel_trace.so
gcc -std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC -I"$inc" -DKT_KERNEL="$kk" -DKT_MEMCPY="$mc" -DKT_MEMSET="$ms" \
    bench/kernel_trace.c -o "$so" "$lib" -Wl,-rpath,"$(dirname "$lib")"

rc=0
CUDA_INJECTION64_PATH=$(realpath "$so") KILN_TRACE_OUT=$out/trace.csv "$@" || rc=$?
echo "kernel_trace: command exited $rc; $(wc -l < "$out/trace.csv") records in $out/trace.csv" >&2
python3 bench/kernel_trace_report.py "$out/trace.csv" --json "$out/report.json" --html "$out/report.html" "${report_args[@]}" \
  | tee "$out/report.txt"
exit "$rc"
