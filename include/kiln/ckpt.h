/* Checking, describing and converting training checkpoints (out_dir/ckpt/step_N/, see
 * src/train/checkpoint.c and docs/checkpoint-format.md). The writer and the resume path live in
 * the trainer; these are for people and tools. */
#ifndef KILN_CKPT_H
#define KILN_CKPT_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/error.h"

/* The most ranks a checkpoint may have (manifests are checked against it, reshapes and imports refuse more). */
#define KILN_CKPT_MAX_WORLD 65536

struct cJSON;
/* A manifest's world_size: required, a whole number in 1..KILN_CKPT_MAX_WORLD; errors start with ctx (the manifest's
 * path). */
kiln_error *kiln_ckpt_manifest_world(const struct cJSON *man, const char *ctx, int64_t *world);
/* A rank's shard in a step directory, "DIR/rank_NNNNN.safetensors" (dir NULL: the bare name), written into buf
 * (n bytes; truncated to fit) and returned: the one place that spells the name. */
const char *kiln_ckpt_shard_path(char *buf, size_t n, const char *dir, int rank);
/* The rank a bare shard name stands for, or -1 where the name is not exactly a shard's. */
int kiln_ckpt_shard_rank(const char *name);

/* A committed checkpoint is valid when its COMMITTED marker and manifest exist and every file the
 * manifest lists has the recorded size and checksum (CRC-32C; FNV-1a 64 in older checkpoints that say so). The
 * error names the first problem. */
kiln_error *kiln_ckpt_verify(const char *step_dir);
/* Print step, world size, tokens seen, tensors and parameters, files and loader positions. */
kiln_error *kiln_ckpt_describe(const char *step_dir, FILE *out);
/* The step directories under a run's out_dir/ckpt (or a ckpt/ directory itself), newest first;
 * *dirs is malloc'd, each entry too. A step directory given directly is returned alone. */
kiln_error *kiln_ckpt_list(const char *path, char ***dirs, int *n);
void kiln_ckpt_list_free(char **dirs, int n);

/* Convert a checkpoint written by N ranks into one for M ranks. from: a step directory, or a run
 * or ckpt/ directory (its newest valid checkpoint); checksums are verified first. Writes
 * to/ckpt/step_N/ (never over an existing one) and to/config.json (grad_accum scaled by N/M so the
 * global batch is unchanged, run.out_dir = to's absolute path); `kiln train --config to/config.json --resume` on M
 * ranks continues the run. Errors say why a world size cannot work (the global batch or the data
 * position does not divide). Progress and notes go to log (nullable). */
kiln_error *kiln_ckpt_reshape(const char *from, const char *to, int world_size, int force, FILE *log);
/* A checkpoint's parameters and balancing biases as a HF ZAYA directory (config.json,
 * model.safetensors, and the data's tokenizer.json when present). */
kiln_error *kiln_ckpt_export_hf(const char *from, const char *hf_dir, int force, FILE *log);
/* A HF ZAYA directory as a step-0 checkpoint for world_size ranks in to/ckpt/, with to/config.json:
 * the training config (file `config`, or the defaults when NULL) with the HF model. */
kiln_error *kiln_ckpt_import_hf(const char *hf_dir, const char *to, const char *config, int world_size, int force,
                                FILE *log);
/* force (the three converters): without it a converter refuses, before writing anything and naming the file, a --to
 * directory that already holds what it writes (to/config.json; for export-hf config.json, model.safetensors,
 * tokenizer.json), a model (config.json, model*.safetensors, model.safetensors.index.json) or checkpoints; with it
 * those files are replaced, and export-hf also removes the weights it does not write (a sharded model's shards and
 * index) so that the directory holds one model. An existing to/ckpt/step_N of the step written is never replaced. */

#endif
