/* Checking and describing training checkpoints (out_dir/ckpt/step_N/, see src/train/checkpoint.c).
 * The writer and the resume path live in the trainer; these are for people and tools. */
#ifndef KILN_CKPT_H
#define KILN_CKPT_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/error.h"

/* A committed checkpoint is valid when its COMMITTED marker and manifest exist and every file the
 * manifest lists has the recorded size and FNV-1a 64 checksum. The error names the first problem. */
kiln_error *kiln_ckpt_verify(const char *step_dir);
/* Print step, world size, tokens seen, tensors and parameters, files and loader positions. */
kiln_error *kiln_ckpt_describe(const char *step_dir, FILE *out);
/* The step directories under a run's out_dir/ckpt (or a ckpt/ directory itself), newest first;
 * *dirs is malloc'd, each entry too. A step directory given directly is returned alone. */
kiln_error *kiln_ckpt_list(const char *path, char ***dirs, int *n);
void kiln_ckpt_list_free(char **dirs, int n);

#endif
