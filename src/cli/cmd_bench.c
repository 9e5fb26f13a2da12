/* kiln bench <name> ...: dispatch to the benchmarks of src/bench/. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kiln/bench.h"

static const char usage[] =
    "usage: kiln bench <benchmark> [options]   (kiln bench <benchmark> --help for its options)\n\n"
    "  comm      collectives (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all) over message\n"
    "            sizes, nccl-tests' columns and bus-bandwidth conventions; MPI on CPUs (mpirun -np N)\n"
    "  gemm      matrix-multiply TFLOP/s over shapes, or the exact GEMMs of a model config\n"
    "  membw     memory bandwidth: copy, scale, add, triad over array sizes\n"
    "  attention the trainer's attention kernel, forward and forward+backward: time, GFLOP/s, tokens/s\n"
    "  moe       the trainer's expert path (grouped SwiGLU experts), fwd and fwd+bwd: time, TFLOP/s, tokens/s\n"
    "  linear    the CUDA trainer's linear-layer backward of one ZAYA layer, old vs new path, by part (--device cuda)\n"
    "  io        storage: sequential and parallel write (fsync) and read of checkpoint-sized files, and the\n"
    "            checkpoint writer against them (--ckpt)\n"
    "  report    render JSON profiles as an HTML page with SVG plots\n";

static const struct {
    const char *name;
    int (*run)(int, char **);
} benches[] = {{"comm", kiln_bench_comm_main}, {"gemm", kiln_bench_gemm_main},
               {"membw", kiln_bench_membw_main}, {"report", kiln_bench_report_main},
               {"attention", kiln_bench_attention_main}, {"moe", kiln_bench_moe_main},
               {"linear", kiln_bench_linear_main},
               {"io", kiln_bench_io_main}};

static int cmd(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kiln bench: unknown benchmark '%s'\n\n%s", argv[1], usage);
    return 2;
}

const kiln_cmd kiln_cmd_bench = {"bench", "characterise the machine: collectives, GEMM, memory bandwidth; reports", cmd, usage};
