/* A committed checkpoint opened for conversion (reshape, export): the manifest parsed and checked
 * against the parameter table its own config implies, every shard mapped (nothing is read until a
 * tensor is touched, so a conversion streams tensor by tensor through the page cache). */
#ifndef KILN_CKPT_SOURCE_H
#define KILN_CKPT_SOURCE_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "kiln/data.h"
#include "kiln/optim.h"
#include "kiln/safetensors.h"
#include "kiln/train.h"
#include "kiln/zaya.h"

typedef struct {
    char dir[1300];       /* the step directory */
    cJSON *man;           /* manifest.json */
    int64_t step;
    int world;
    kiln_train_config cfg; /* the config it was trained with */
    kiln_zaya table;       /* parameter table only (no buffers) */
    kiln_opt_param *op;    /* [nparams] */
    int *owner;            /* [nparams] rank whose shard holds the tensor */
    kiln_st **st;          /* [world] mapped shards */
    kiln_loader_state *loaders; /* [world] */
} ckpt_src;

/* path: a step directory, a ckpt/ directory or a run directory (then its newest checkpoint that
 * verifies; older ones are tried with a note on log). Checksums are verified before anything else. */
kiln_error *ckpt_src_open(const char *path, FILE *log, ckpt_src *s);
void ckpt_src_close(ckpt_src *s);
/* The tensor `kind.name` (kind "param" or "opt") of tensor t, from its owner's shard. */
const kiln_st_tensor *ckpt_src_tensor(const ckpt_src *s, const char *kind, int t);

#endif
