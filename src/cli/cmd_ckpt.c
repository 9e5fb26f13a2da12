/* kiln ckpt inspect|verify PATH: PATH is a run directory (its ckpt/), a ckpt/ directory, or one
 * step_N checkpoint. verify exits 1 if any checkpoint is invalid, naming the file and the problem. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kiln/ckpt.h"

static const char usage[] =
    "usage: kiln ckpt inspect PATH\n"
    "       kiln ckpt verify PATH\n\n"
    "PATH: a training run's out_dir, its ckpt/ directory, or one checkpoint directory (step_N).\n"
    "  inspect   step, world size, tokens seen, tensors and parameters, files with checksums, the\n"
    "            data-loader position of every rank\n"
    "  verify    checks every checkpoint: COMMITTED marker, manifest, and each file's size and FNV-1a 64\n"
    "            checksum against the manifest; exit 1 if any is invalid\n";

static int cmd(int argc, char **argv) {
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

const kiln_cmd kiln_cmd_ckpt = {"ckpt", "inspect and verify training checkpoints", cmd, usage};
