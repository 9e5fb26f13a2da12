/* Writing a checkpoint outside training (reshape, import-hf): the same layout and commit protocol
 * as the trainer's (src/train/checkpoint.c): shards into TO/ckpt/step_N.tmp/, each fsynced and
 * checksummed, then manifest.json, COMMITTED, rename to step_N. An existing committed step_N is
 * never replaced. */
#ifndef KILN_CKPT_OUTPUT_H
#define KILN_CKPT_OUTPUT_H

#include <cjson/cJSON.h>

#include "kiln/data.h"
#include "kiln/optim.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "kiln/zaya.h"

typedef struct {
    char abs[1024]; /* the output directory's absolute path (realpath): what DIR/config.json's run.out_dir says */
    char root[1200], fin[1300], tmp[1320];
    int world;
    uint64_t *sums, *sizes; /* [world] */
} ckpt_out;

/* Refuses (nothing written) when `to` exists and is not a directory, or unless force, when it already holds a file
 * the command writes (writes: names relative to `to`, NULL-terminated), a model (config.json, model*.safetensors,
 * model.safetensors.index.json: a HF directory given as --to by mistake) or, with ckpt, checkpoints (ckpt/step_*:
 * `kiln train --resume` there would take the newest, and run.keep_last may delete them). The error names the file.
 * cmd: the command's name for the message ("reshape"). Reads only: call it before anything is written. */
kiln_error *ckpt_out_check_target(const char *to, const char *const *writes, int ckpt, int force, const char *cmd);
/* Creates `to` and its ckpt/ (o->abs: its realpath) and the temp step directory. */
kiln_error *ckpt_out_begin(ckpt_out *o, const char *to, int64_t step, int world);
/* Write rank's shard (atomic, fsynced) and record its checksum and size. */
kiln_error *ckpt_out_shard(ckpt_out *o, int rank, const kiln_st_entry *ent, size_t n);
/* Add the 'files' list to man, write it and COMMITTED, rename into place. Frees nothing. */
kiln_error *ckpt_out_commit(ckpt_out *o, cJSON *man);
/* Remove the temp directory (after a failure) and release o. Safe after commit. */
void ckpt_out_end(ckpt_out *o);

/* The manifest (format 1) without 'files': tensor t of table is owned by owner[t]. */
cJSON *ckpt_manifest_new(const kiln_train_config *cfg, const kiln_zaya *table, const kiln_opt_param *op,
                         const int *owner, int world, int64_t step, double tokens_seen, int have_prev,
                         const kiln_loader_state *loaders);
/* o->abs/config.json: cfg with run.out_dir = o->abs, for `kiln train --config TO/config.json --resume`. Absolute,
 * because the config is read from wherever that command runs: a relative out_dir would resolve against that
 * directory and silently start a fresh run there instead of resuming this checkpoint. */
kiln_error *ckpt_out_config(const ckpt_out *o, const kiln_train_config *cfg);

#endif
