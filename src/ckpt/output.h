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
    char root[1200], fin[1300], tmp[1320];
    int world;
    uint64_t *sums, *sizes; /* [world] */
} ckpt_out;

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
/* TO/config.json: cfg with run.out_dir = to, for `kiln train --config TO/config.json --resume`. */
kiln_error *ckpt_out_config(const char *to, const kiln_train_config *cfg);

#endif
