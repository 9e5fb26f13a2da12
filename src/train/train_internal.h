/* Pieces of the trainer, one file each. */
#ifndef KILN_TRAIN_INTERNAL_H
#define KILN_TRAIN_INTERNAL_H

#include "kiln/data.h"
#include "kiln/optim.h"
#include "kiln/train.h"

/* ZeRO-1 partition: whole parameter tensors, contiguous in the flat buffer, rank r owning
 * tensors [first[r], first[r+1]) = elements [displs[r], displs[r] + counts[r]). */
typedef struct {
    int world;
    int *first;              /* [world+1] tensor index */
    size_t *counts, *displs; /* [world] elements */
} zero1_partition;
kiln_error *zero1_partition_make(const kiln_zaya *m, int world, zero1_partition *p);
void zero1_partition_free(zero1_partition *p);

/* Expert load balancing as ZAYA1: after each step a PID controller moves every layer's
 * balancing biases toward equal expert load (the skip class toward its own target share). */
typedef struct {
    int64_t layers, classes;
    double *integral, *prev_err; /* [layers*classes] */
    int have_prev;
} balance_ctl;
kiln_error *balance_init(balance_ctl *b, int64_t layers, int64_t classes);
void balance_free(balance_ctl *b);
/* counts [layers, classes] summed over all ranks; updates biases [layers, classes]; writes the
 * per-layer imbalance (max load / mean expert load) into imbalance[layers] (nullable). */
void balance_update(balance_ctl *b, const kiln_train_config *c, const int64_t *counts, float *biases,
                    double *imbalance);

/* Checkpoints: out_dir/ckpt/step_NNNNNNNN/{manifest.json, rank_NNNNN.safetensors, COMMITTED}. */
typedef struct {
    int64_t step;
    const kiln_train_config *cfg;
    kiln_zaya *model;
    const zero1_partition *part;
    const kiln_opt_param *oparams;
    float *opt_state;  /* this rank's optimizer state, tensors in order */
    balance_ctl *bal;
    kiln_loader_state *loaders; /* [world] (all ranks' states, gathered) */
    double tokens_seen;
} ckpt_view;
/* A synchronous save: snapshot, write, commit, all before returning. */
kiln_error *ckpt_save(kiln_comm *comm, const ckpt_view *v);
/* The writer behind every save. async: the snapshot is copied into a staging buffer and this
 * rank's shard is written by a background thread while training continues; the commit
 * (checksums, manifest, COMMITTED, rename: collective) happens at the first poll that finds every
 * rank's shard written, or at the next save, or at a wait. Errors of the background write come
 * back from poll/save as "checkpoint at step N (the previous checkpoint is intact)". */
typedef struct ckpt_writer ckpt_writer;
kiln_error *ckpt_writer_create(int async, ckpt_writer **out);
/* Collective. Waits for the previous save first; wait: also this one (final save, Ctrl-C). */
kiln_error *ckpt_writer_save(ckpt_writer *w, kiln_comm *comm, const ckpt_view *v, int wait);
/* Collective, cheap when nothing is pending (no communication); call once per step. */
kiln_error *ckpt_writer_poll(ckpt_writer *w, kiln_comm *comm, int wait);
int ckpt_writer_pending(const ckpt_writer *w);
/* The GPU trainer: this rank's parameters and optimizer state are read from the device through dev
 * (include/kiln/zaya_cuda_snapshot.h; the writer owns it from now on), not from the view's host
 * buffers. Where the snapshot goes: KILN_CKPT_SNAPSHOT = auto (default), device, pinned or pageable. */
struct kiln_zaya_cuda_snap;
kiln_error *ckpt_writer_use_cuda(ckpt_writer *w, struct kiln_zaya_cuda_snap *dev);
/* Where the last save's snapshot went: "device", "pinned host", "pageable host", "live", "host". */
const char *ckpt_writer_snapshot_where(const ckpt_writer *w);
/* Joins the thread; an uncommitted save is abandoned (its .tmp directory is ignored later). */
void ckpt_writer_free(ckpt_writer *w);
/* Newest valid checkpoint's step (-1: none); verifies checksums and shapes. */
kiln_error *ckpt_find_latest(const char *out_dir, int64_t *step);
kiln_error *ckpt_load(kiln_comm *comm, int64_t step, ckpt_view *v);

#endif
