/* kiln ckpt inspect|verify|reshape|export-hf|import-hf: checkpoints for people and tools.
 * inspect/verify take PATH: a run directory (its ckpt/), a ckpt/ directory, or one step_N
 * checkpoint; verify exits 1 if any checkpoint is invalid, naming the file and the problem. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kiln/ckpt.h"

static const char usage[] =
    "usage: kiln ckpt inspect PATH\n"
    "       kiln ckpt verify PATH\n"
    "       kiln ckpt reshape --from PATH --to DIR --world-size M [--force]\n"
    "       kiln ckpt export-hf --from PATH --to HFDIR [--force]\n"
    "       kiln ckpt import-hf --from HFDIR --to DIR [--config FILE] [--world-size M] [--force]\n\n"
    "PATH: a training run's out_dir, its ckpt/ directory, or one checkpoint directory (step_N); for\n"
    "reshape and export-hf a run or ckpt/ directory means its newest checkpoint that verifies.\n"
    "  inspect    step, world size, tokens seen, tensors and parameters, files with checksums, the\n"
    "             data-loader position of every rank\n"
    "  verify     checks every checkpoint: COMMITTED marker, manifest, and each file's size and CRC-32C\n"
    "             checksum against the manifest (FNV-1a 64 for checkpoints that record fnv1a64); exit 1 if\n"
    "             any is invalid\n"
    "  reshape    converts a checkpoint written by N ranks into one for M ranks (1..65536): optimizer state\n"
    "             regrouped by the M-rank ZeRO-1 partition, grad_accum scaled by N/M so the global batch and\n"
    "             the data order are unchanged. Writes DIR/ckpt/step_S/ and DIR/config.json (run.out_dir: DIR's\n"
    "             absolute path); continue with mpirun -np M kiln train --config DIR/config.json --resume\n"
    "  export-hf  the parameters and balancing biases as a HF ZAYA directory (config.json,\n"
    "             model.safetensors, and the data's tokenizer.json when found) for transformers\n"
    "  import-hf  a HF ZAYA directory as a step-0 checkpoint for M ranks (1..65536, default 1) in DIR/ckpt/\n"
    "             with DIR/config.json (FILE's training settings, or the defaults, with the HF model;\n"
    "             run.out_dir: DIR's absolute path); start training from it with\n"
    "             kiln train --config DIR/config.json --resume\n\n"
    "The converters refuse, writing nothing, when the --to directory already holds a file they would write,\n"
    "a model (config.json, model*.safetensors, model.safetensors.index.json) or, for reshape and import-hf,\n"
    "checkpoints (ckpt/step_N). --force writes there anyway, replacing those files; export-hf --force also\n"
    "removes the other weights there (model-*.safetensors shards and model.safetensors.index.json) so that\n"
    "the directory holds one model. A checkpoint of the same step is never replaced.\n";

static int convert(int argc, char **argv) {
    const char *from = NULL, *to = NULL, *config = NULL;
    int64_t world = 1;
    int have_world = 0, force = 0;
    kiln_error *e = NULL;
    const int import = !strcmp(argv[1], "import-hf"), export = !strcmp(argv[1], "export-hf");
    for (int i = 2; i < argc && !e; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--force")) {
            force = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kiln ckpt %s: %s needs a value\n%s", argv[1], a, usage);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--from")) from = v;
        else if (!strcmp(a, "--to")) to = v;
        else if (!strcmp(a, "--world-size") && !export) {
            /* checked here, not by the converter: a value that does not fit an int would wrap into the range */
            e = cli_int_in(a, v, 1, KILN_CKPT_MAX_WORLD, &world);
            have_world = 1;
        } else if (!strcmp(a, "--config") && import) config = v;
        else {
            fprintf(stderr, "kiln ckpt %s: unknown option '%s'\n%s", argv[1], a, usage);
            return 2;
        }
    }
    if (e) return cli_fail("ckpt", e);
    if (!from || !to || (!import && !export && !have_world)) {
        fprintf(stderr, "kiln ckpt %s: --from, --to%s are required\n%s", argv[1],
                import || export ? "" : " and --world-size", usage);
        return 2;
    }
    if (import) e = kiln_ckpt_import_hf(from, to, config, (int)world, force, stdout);
    else if (export) e = kiln_ckpt_export_hf(from, to, force, stdout);
    else e = kiln_ckpt_reshape(from, to, (int)world, force, stdout);
    return e ? cli_fail("ckpt", e) : 0;
}

static int cmd(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "reshape") || !strcmp(argv[1], "export-hf") || !strcmp(argv[1], "import-hf")))
        return convert(argc, argv);
    if (argc != 3 || (strcmp(argv[1], "inspect") && strcmp(argv[1], "verify"))) {
        fputs(usage, stderr);
        return 2;
    }
    char **dirs = NULL;
    int n = 0;
    kiln_error *e = kiln_ckpt_list(argv[2], &dirs, &n);
    if (e) return cli_fail("ckpt", e);
    if (!n) {
        kiln_ckpt_list_free(dirs, n);
        return cli_fail("ckpt", kiln_errorf(KILN_ENOTFOUND, "%s: no checkpoints", argv[2]));
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(argv[1], "verify")) {
            e = kiln_ckpt_verify(dirs[i]);
            printf("%s  %s\n", e ? "INVALID" : "ok     ", dirs[i]);
            if (e) printf("         %s\n", kiln_error_msg(e));
        } else {
            e = kiln_ckpt_describe(dirs[i], stdout);
            if (e) printf("%s: %s\n", dirs[i], kiln_error_msg(e));
        }
        bad += e != NULL;
        kiln_error_free(e);
    }
    if (!strcmp(argv[1], "verify")) printf("%d checkpoints, %d invalid\n", n, bad);
    kiln_ckpt_list_free(dirs, n);
    return bad ? 1 : 0;
}

const kiln_cmd kiln_cmd_ckpt = {"ckpt", "inspect, verify, reshape and convert training checkpoints", cmd, usage};
