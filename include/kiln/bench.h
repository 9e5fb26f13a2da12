/* kiln bench: cluster characterisation. Each benchmark is one file in src/bench/ exposing
 * `int kiln_bench_<name>_main(int argc, char **argv)` (argv[0] is the benchmark name), dispatched
 * by `kiln bench <name>`; results go to stdout as a table and to a JSON profile (--json FILE) and
 * CSV (--csv FILE) that `kiln bench report` renders. */
#ifndef KILN_BENCH_H
#define KILN_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kiln/error.h"

/* ---- the JSON profile (src/bench/profile.c, docs/bench-profile.md) ---- */
#define KILN_PROFILE_VERSION 1
/* {"kiln_profile": 1, "bench": name, "date": ISO-8601 UTC, "machine": {hostname, cpu, cores,
 * memory_gib, [gpu, gpus, driver, ...]}, "libraries": {openblas, cjson, [mpi, nccl, cuda...]}} */
cJSON *kiln_profile_new(const char *bench);
/* The array `section` ("comm", "gemm", "membw", ...), created if absent; append flat records. */
cJSON *kiln_profile_section(cJSON *p, const char *section);
kiln_error *kiln_profile_write(const cJSON *p, const char *path); /* atomic */

int kiln_bench_comm_main(int argc, char **argv);
int kiln_bench_membw_main(int argc, char **argv);
int kiln_bench_gemm_main(int argc, char **argv);
int kiln_bench_report_main(int argc, char **argv);
int kiln_bench_attention_main(int, char **);
int kiln_bench_moe_main(int, char **);
int kiln_bench_linear_main(int, char **); /* src/bench/linear_gpu.c, --device cuda only */
int kiln_bench_io_main(int, char **);

#endif
