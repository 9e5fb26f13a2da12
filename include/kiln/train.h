/* kiln train: the training configuration (one JSON file, every field with a default and help)
 * and the trainer (data-parallel ZeRO-1 over a kiln_comm, Muon+AdamW, expert load balancing by
 * feedback control, resumable sharded checkpoints). */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/comm.h"
#include "kiln/error.h"
#include "kiln/optim.h"
#include "kiln/zaya.h"

typedef struct {
    /* model */
    kiln_zaya_config model;
    uint64_t init_seed;
    /* data */
    char data_dir[1024];
    int64_t seq_len, micro_batch, grad_accum;
    uint64_t data_seed;
    int64_t batch_ramp_start, batch_ramp_steps; /* micro-batch count ramps from start to grad_accum */
    /* optimizer and schedule */
    kiln_optim_hparams optim;
    kiln_schedule sched; /* sched.total = steps */
    double clip;         /* global gradient-norm clip; 0: off */
    /* expert load balancing (ZAYA1): PID on the balancing biases */
    double bal_kp, bal_ki, bal_kd, bal_skip_target;
    /* run */
    int64_t steps, log_every, eval_every, eval_batches, ckpt_every, keep_last;
    int async_ckpt; /* checkpoint shards written by a background thread while training goes on */
    char ckpt_busy[1024]; /* a save due while the previous async one still writes: "defer" or "wait" */
    char out_dir[1024];
    int threads;
    char skip_steps[1024]; /* steps whose data is consumed without training: "9-12,40" */
    char device[1024];     /* "cpu" or "cuda" (one GPU per rank) */
    int recompute;         /* cuda: keep only each layer's input, recompute the rest in backward */
    int deterministic;     /* cuda: bit-identical runs (1); 0: cuDNN's atomic-dQ attention backward */
    int save_final;        /* write the final checkpoint and model/ (0: benchmarks) */
} kiln_train_config;

void kiln_train_config_default(kiln_train_config *c);
/* Overlay a JSON config file on the defaults; unknown or invalid fields are errors naming them. */
kiln_error *kiln_train_config_load(const char *path, kiln_train_config *c);
kiln_error *kiln_train_config_parse(const char *text, const char *ctx, kiln_train_config *c);
kiln_error *kiln_train_config_validate(const kiln_train_config *c);
/* The config as JSON (for checkpoints and logs); malloc'd. */
char *kiln_train_config_to_json(const kiln_train_config *c);
/* Every field with its default and help text (for `kiln train --help-config`). */
void kiln_train_config_print_help(FILE *f);

typedef struct {
    int resume;           /* continue from the newest valid checkpoint in out_dir/ckpt */
    int64_t stop_after;   /* stop (with a checkpoint) after this many steps of this run; 0: no */
    volatile int *interrupted; /* set by a signal handler: save and stop */
    int quiet;
} kiln_train_opts;

/* Run training. On rank 0 logs a progress line and out_dir/metrics.jsonl; checkpoints go to
 * out_dir/ckpt/step_NNNNNNNN/. Final loss in *final_loss (nullable). */
kiln_error *kiln_train(const kiln_train_config *c, const kiln_train_opts *o, kiln_comm *comm, double *final_loss);

/* The built-in corpus: `stories` generated short stories as JSON Lines ({"text": ...}). */
kiln_error *kiln_default_corpus_write(const char *path, int64_t stories, uint64_t seed);

#endif
