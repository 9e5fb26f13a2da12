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
/* The GPU all-gather after the sharded step as broadcasts from each owner: rank root's tensors [first[root],
 * first[root+1]), consecutive tensors of one kind merged into a run of elements [off, off+n) of the device layout
 * (off[i]: tensor i's offset there, numel[i] its elements; padding between merged tensors included). A run with
 * f32 = 1 holds tensors the GPU model reads as f32 (f32[i], kiln_zaya_cuda_reads_f32) and goes out as f32 masters;
 * the others go as their bf16 copy only, half the bytes. Runs in rank order, then offset order; *runs is the
 * caller's to free. */
typedef struct {
    size_t off, n;
    int root, f32;
} zero1_run;
kiln_error *zero1_gather_runs(const zero1_partition *p, const size_t *off, const int64_t *numel,
                              const unsigned char *f32, zero1_run **runs, int *nruns);
/* The reduce-scatter of the span [lo, hi) of a buffer partitioned into world contiguous blocks in rank order
 * (rank r's: [displs[r], +counts[r])): each rank's part of the span as a block of the span itself (out_displs
 * relative to lo, out_counts 0 for a rank with none of it), so again contiguous in rank order and summing to
 * hi - lo where the partition covers the span. */
void zero1_span_blocks(const size_t *counts, const size_t *displs, int world, size_t lo, size_t hi,
                       size_t *out_counts, size_t *out_displs);

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
/* The save in flight (begun, not yet committed): 1 and its step, the seconds since it began and this
 * rank's shard (data bytes written so far, in all); 0 when none is. */
typedef struct {
    int64_t step;
    double elapsed_s;
    uint64_t bytes_done, bytes_total;
} ckpt_progress;
int ckpt_writer_progress(ckpt_writer *w, ckpt_progress *p);
/* Whether the last save found the previous one still in flight and waited for it (*seconds: how long). */
int ckpt_writer_waited(const ckpt_writer *w, double *seconds);
/* KILN_FAULT slow-save (a testing hook), for the next save: the writer sleeps ms before writing this
 * rank's shard; async with steps > 0, the shard counts as written only at the steps-th poll after the
 * save (which then waits for it), so that saves overlap at the same steps on any machine. */
void ckpt_writer_set_slow(ckpt_writer *w, int64_t ms, int64_t steps);
/* The GPU trainer: this rank's parameters and optimizer state are read from the device through dev
 * (include/kiln/zaya_cuda_snapshot.h; the writer owns it from now on), not from the view's host
 * buffers. Where the snapshot goes: KILN_CKPT_SNAPSHOT = auto (default), device, pinned or pageable. */
struct kiln_zaya_cuda_snap;
kiln_error *ckpt_writer_use_cuda(ckpt_writer *w, struct kiln_zaya_cuda_snap *dev);
/* A checkpoint the trainer resumed from (verified): pruning counts it as valid without reading it again. */
void ckpt_writer_known_valid(ckpt_writer *w, int64_t step);
/* Where the last save's snapshot went: "device", "pinned host", "pageable host", "live", "host". */
const char *ckpt_writer_snapshot_where(const ckpt_writer *w);
/* Joins the thread; an uncommitted save is abandoned (its .tmp directory is ignored later). */
void ckpt_writer_free(ckpt_writer *w);

/* When to save (ckpt_schedule.c): every run.ckpt_every steps, the last step, a stop request; a save due
 * while the previous async one is still being written is deferred (run.ckpt_busy "defer") to the first
 * step after it commits, or the save waits for it ("wait"). */
typedef struct {
    int64_t every;
    int save_final, defer;
    int64_t deferred_from; /* the step of the save waiting to be taken (0: none) */
    int warned;
    /* counts: scheduled (multiples of every), taken, deferred, taken late (and their total lateness in
     * steps), superseded by a newer request before they were taken; saves that waited for the previous
     * one, final/stop saves or others (the trainer counts these) */
    int64_t requested, taken, deferred, taken_late, late_steps, superseded, waited_must, waited_other;
} ckpt_schedule;
typedef struct {
    int save;              /* take a checkpoint after this step */
    int wait;              /* it must not be skipped: wait for the previous save and for this one's commit */
    int64_t deferred_from; /* > 0: it is the save that came due at this step and was deferred */
} ckpt_due;
void ckpt_schedule_init(ckpt_schedule *s, const kiln_train_config *c);
/* After optimizer step `step`: last (step == run.steps), stop (a stop request, agreed by all ranks),
 * busy (the writer's previous save is still in flight after this step's poll). */
ckpt_due ckpt_schedule_step(ckpt_schedule *s, int64_t step, int last, int stop, int busy);
/* The first deferral's warning (once): the save in flight, its speed so far, the speed the schedule needs. */
void ckpt_schedule_warn(ckpt_schedule *s, int64_t step, const ckpt_progress *p);
/* The end of the run: the counts (a warning when saves were deferred or waited). */
void ckpt_schedule_report(const ckpt_schedule *s);
/* Newest valid checkpoint's step (-1: no step_N directory at all); verifies the manifest's fields against the
 * directory (its step) and the checksums, skipping invalid ones with a warning. step_N directories that are all
 * invalid are an error naming each (the newest eight) and why. Rank 0 only. */
kiln_error *ckpt_find_latest(const char *out_dir, int64_t *step);
/* How many step_N directories under out_dir/ckpt are of a step greater than `step` (*newest: the greatest, -1 when
 * none): an abandoned timeline's or another run's, which pruning leaves alone (checkpoint.c, prune). */
int ckpt_count_newer(const char *out_dir, int64_t step, int64_t *newest);
kiln_error *ckpt_load(kiln_comm *comm, int64_t step, ckpt_view *v);

#endif
