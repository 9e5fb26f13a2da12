/* The ZAYA model on one GPU: the CPU model's forward and backward (src/models/zaya_forward.c,
 * zaya_backward.c), step for step, through the CUDA ops of include/kiln/cuda_ops.h.
 *
 * Precision (issue [cuda]): f32 master parameters in the CPU model's flat layout (so kiln_zaya_bind's
 * per-layer pointers work on the device base), a bf16 copy of them for the GEMMs, f32 gradients in the
 * same layout, the residual stream in f32, activations between ops in bf16, math in f32. Weight
 * gradients are deterministic (fixed-order reductions): two runs on the same data give the same bits
 * (unless kiln_zaya_cuda_set_deterministic(g, 0) lets cuDNN's attention backward use float atomics).
 *
 * The activation arena is sized once for (B, T). With recompute on, only each layer's input (and its
 * router state, which the next layer reads) is kept; backward re-runs each layer's forward first.
 * Built only with CUDA; without it kiln_zaya_cuda_create says so. */
#ifndef KILN_ZAYA_CUDA_H
#define KILN_ZAYA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kiln/zaya.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_zaya_cuda kiln_zaya_cuda;

/* The GPU twin of m for batches of B sequences of T tokens: allocates everything and uploads m's
 * parameters and balancing biases. m must outlive it (its config and parameter table are used). */
kiln_error *kiln_zaya_cuda_create(const kiln_zaya *m, int64_t B, int64_t T, int recompute, kiln_zaya_cuda **out);
void kiln_zaya_cuda_free(kiln_zaya_cuda *g);
/* Bit-identical runs (on = 1, the default: every reduction in a fixed order, cuDNN's deterministic attention
 * backward) or not (0: cuDNN's attention backward accumulates dQ with float atomics, as PyTorch's does; 0-1.5%
 * faster at issue [cuda]'s size by run, docs/perf.md session 26). $KILN_ATTENTION, where set, decides instead. */
void kiln_zaya_cuda_set_deterministic(kiln_zaya_cuda *g, int on);

/* Host -> device: the master parameters (m->w, all numel floats) and their bf16 copy. */
kiln_error *kiln_zaya_cuda_upload_params(kiln_zaya_cuda *g, const float *w);
/* Host -> device: the balancing biases [layers, E+1]. */
kiln_error *kiln_zaya_cuda_upload_balancing(kiln_zaya_cuda *g, const float *bias);
/* Device -> host: master parameters / gradients (numel floats each). */
kiln_error *kiln_zaya_cuda_download_params(kiln_zaya_cuda *g, float *w);
kiln_error *kiln_zaya_cuda_download_grads(kiln_zaya_cuda *g, float *grad);
/* Re-derive the bf16 copy from the f32 master parameters (after an optimizer step that did not); split masters
 * (below) are joined first and split again after. */
kiln_error *kiln_zaya_cuda_refresh_bf16(kiln_zaya_cuda *g);
/* The same for elements [off, off+n) of the device layout alone (f32 masters, no split tensor among them), queued on
 * the model's stream. */
kiln_error *kiln_zaya_cuda_refresh_bf16_range(kiln_zaya_cuda *g, size_t off, size_t n);
/* Which tensors the GPU model reads as f32 masters: f32[i] = 1 for the embedding (a tied LM head too), norms,
 * residual scales, the CCA convolutions and temperature, the biases glue kernels read, the router's state scale and
 * norm; 0 for those read only through their bf16 copy (the GEMMs' weights and biases: 94% of issue [cuda]'s model),
 * whose masters a several-rank all-gather need not send (src/train/trainer.c, gather_params). Host only: no device
 * needed, built with or without CUDA. f32 holds m->nparams entries. */
kiln_error *kiln_zaya_cuda_reads_f32(const kiln_zaya *m, unsigned char *f32);
kiln_error *kiln_zaya_cuda_grads_zero(kiln_zaya_cuda *g);
/* Work queued on the model's stream since the last backward leaves every gradient element zero but those of the
 * tensors the next backward overwrites (kiln_zaya_cuda_grad_overwritten): an optimizer step that zeroes what it
 * reads (kiln_zaya_cuda_opt_step_zeroing). The next backward may write instead of add, as after
 * kiln_zaya_cuda_grads_zero. */
void kiln_zaya_cuda_grads_mark_zero(kiln_zaya_cuda *g);
/* Whether the first backward after the gradients were zeroed WRITES tensor i's gradient (every element, even of an
 * expert that got no rows) instead of adding to it: the experts' weights (their grouped weight-gradient GEMMs with
 * beta = 0). Zeroing those is wasted work. */
int kiln_zaya_cuda_grad_overwritten(const kiln_zaya_cuda *g, int i);
/* The experts' weight gradients in bf16 (on = 1; off by default): each backward after a zeroing writes them
 * rounded to bf16 once, as the reference's autocast rounds the gradient of its bf16 weight copy, into the first
 * half of their f32 slots (kiln_zaya_cuda_grad_bf16 says which tensors). Half the bytes for the GEMMs' writes,
 * the norm's and the optimizer's reads (91% of the [cuda] model's parameters). kiln_zaya_cuda_grad_sumsq,
 * kiln_zaya_cuda_download_grads and an optimizer made after this call (kiln_zaya_cuda_opt_create, AdamW only on
 * those tensors) read them as bf16; a backward that would add to them (a second micro-batch) fails. Whoever reads
 * kiln_zaya_cuda_grads as f32 throughout (a reduce-scatter over ranks, Muon) would read them wrong: the trainer
 * turns this on only with one rank, one micro-batch a step and AdamW on the experts. */
kiln_error *kiln_zaya_cuda_set_expert_grads_bf16(kiln_zaya_cuda *g, int on);
int kiln_zaya_cuda_grad_bf16(const kiln_zaya_cuda *g, int i);
/* With the bf16 expert gradients on (and each expert's gate_up and down a whole number of KILN_ADAMW_CHUNK
 * elements; KILN_EMPTY_EXPERTS=clear turns it off), an expert that got no rows in a backward keeps whatever its
 * weight gradient held: nothing clears it (a 24 MB pass an expert at the [cuda] size; the first steps route
 * ~40 of 128 expert-layers nothing), and the step's zero mask (device, bit l*E + e; NULL when off) says it is
 * zero. kiln_zaya_cuda_grad_sumsq and an optimizer made after the switch read zeros there instead;
 * kiln_zaya_cuda_download_grads first clears them in memory, as kiln_zaya_cuda_grads_clear_empty does for
 * any other reader of kiln_zaya_cuda_grads. grad_zero_groups: tensor i's first mask bit + 1 (0: none) and its
 * elements a bit (zn). */
kiln_error *kiln_zaya_cuda_grads_clear_empty(kiln_zaya_cuda *g);
const uint32_t *kiln_zaya_cuda_zero_mask(const kiln_zaya_cuda *g);
int kiln_zaya_cuda_grad_zero_groups(const kiln_zaya_cuda *g, int i, int64_t *zn);
/* Split master weights (on = 1; off by default; needs the bf16 expert gradients above): those tensors' f32 masters
 * held as their bf16 copy + their low 16 bits (kiln_f32_split_cuda: the same f32 values bit for bit, the bf16 copy
 * rounded to nearest with ties toward zero), so that AdamW moves 26 bytes an element instead of 28. The optimizer
 * (kiln_zaya_cuda_opt_*) updates them split; whoever reads kiln_zaya_cuda_params as f32 first calls
 * kiln_zaya_cuda_master_f32 (download_params and the checkpoint snapshot do), and the next step splits them again
 * (kiln_zaya_cuda_master_split, a pass over them each way). The trainer turns it on with one rank
 * (KILN_SPLIT_MASTER=0: off). */
kiln_error *kiln_zaya_cuda_set_master_split(kiln_zaya_cuda *g, int on);
int kiln_zaya_cuda_master_is_split(const kiln_zaya_cuda *g);
kiln_error *kiln_zaya_cuda_master_f32(kiln_zaya_cuda *g);
kiln_error *kiln_zaya_cuda_master_split(kiln_zaya_cuda *g);
/* out (device, one double) = the sum of squares of the whole gradient, f32 and bf16 tensors as they are stored;
 * queued on the model's stream */
kiln_error *kiln_zaya_cuda_grad_sumsq(kiln_zaya_cuda *g, double *out);
/* the layers whose experts' weight-gradient kernel gave their gradients' sums of squares in the last backward
 * (KILN_GROUPED_DW=wg where it runs both projections; KILN_GROUPED_DW_SQ=0: none), which the sum above then takes
 * instead of reading those gradients back */
int kiln_zaya_cuda_expert_sumsq_given(const kiln_zaya_cuda *g);
/* kiln_zaya_cuda_grads_zero for the next backward: zeroes only the gradients it adds to (one memset per run of such
 * tensors), not those it overwrites (kiln_zaya_cuda_grad_overwritten, and the LM head's weight, whose GEMM comes
 * first and writes it): 0.2 of 7 GB at the [cuda] size. The next backward gives the same gradients as after
 * kiln_zaya_cuda_grads_zero. */
kiln_error *kiln_zaya_cuda_grads_zero_added(kiln_zaya_cuda *g);

/* Device buffers: f32 master parameters, their bf16 copy, f32 grads, kiln_zaya_cuda_numel elements each,
 * the CPU's tensor order with every tensor starting at a 64-element boundary (zero padding between):
 * tensor i of m->params lives at kiln_zaya_cuda_param_offset(g, i); i = nparams gives the total. */
size_t kiln_zaya_cuda_numel(const kiln_zaya_cuda *g);
size_t kiln_zaya_cuda_param_offset(const kiln_zaya_cuda *g, int i);
float *kiln_zaya_cuda_params(kiln_zaya_cuda *g); /* f32 throughout only after kiln_zaya_cuda_master_f32 */
uint16_t *kiln_zaya_cuda_params_bf16(kiln_zaya_cuda *g);
float *kiln_zaya_cuda_grads(kiln_zaya_cuda *g);
/* The model's stream, made to wait first for any optimizer step still running on the optimizer's stream
 * (below): whatever a caller queues on it (a checkpoint snapshot, a copy of the state) sees the updated
 * parameters, optimizer state and zeroed gradients. */
void *kiln_zaya_cuda_stream(kiln_zaya_cuda *g);
/* Wait for everything queued on the model's stream (and the optimizer's). */
kiln_error *kiln_zaya_cuda_sync(kiln_zaya_cuda *g);

/* A hook the backward calls, on the calling thread, for each span [lo, hi) of the gradient's device layout (runs of
 * whole tensors, each with the padding after it) as soon as it has queued the last write to it: the work queued on
 * `stream` (a cudaStream_t) so far finishes it (side streams are joined to it first). Every element is in exactly
 * one span per backward, and spans come in the order the backward finishes them, from the LM head and the last layer
 * down to the embedding. The trainer's several ranks start the ZeRO-1 reduce-scatter of each span there, while the
 * backward goes on. An error from fn ends the backward with it. fn NULL: no hook (the default). */
typedef kiln_error *(*kiln_zaya_cuda_grads_ready_fn)(void *ctx, size_t lo, size_t hi, void *stream);
kiln_error *kiln_zaya_cuda_set_grads_ready(kiln_zaya_cuda *g, kiln_zaya_cuda_grads_ready_fn fn, void *ctx);
/* The stage of the backward after which each tensor's gradient is complete (stage[m->nparams]): 0 after the LM head
 * and the final norm, nl - l after layer l (with its input norm), nl + 1 at the end (the embedding, layer 0's experts).
 * Layer l's expert weights (written beside the next layer down) are finished a stage after the rest of layer l.
 * Host only: no device needed, built with or without CUDA. */
void kiln_zaya_cuda_grad_stages(const kiln_zaya *m, int *stage);

/* Forward over host ids [B,T] (checked against the vocabulary). loss (nullable): the mean next-token
 * loss, as kiln_zaya_forward's (its pass over the logits, and a wait for it). The logits stay on the device
 * until backward overwrites them. A training step passes NULL and reads the loss the backward computes
 * (kiln_zaya_cuda_loss): no wait between the forward and the backward, one pass over the logits. */
kiln_error *kiln_zaya_cuda_forward(kiln_zaya_cuda *g, const int64_t *ids, double *loss);
/* Logits [B,T,V] of the last forward, to the host as f32 (before backward). */
kiln_error *kiln_zaya_cuda_logits(kiln_zaya_cuda *g, float *logits);
/* Backward of the mean next-token loss of the last forward; accumulates into the device gradients. The
 * loss itself comes out of the same cross-entropy pass (the same bits as the forward's). */
kiln_error *kiln_zaya_cuda_backward(kiln_zaya_cuda *g);
/* The mean loss of the last backward (or of the last forward given a loss), to the host. */
kiln_error *kiln_zaya_cuda_loss(kiln_zaya_cuda *g, double *loss);
/* Add the last forward's routing decisions to counts [layers, E+1] (host), as kiln_zaya_route_counts. */
kiln_error *kiln_zaya_cuda_route_counts(kiln_zaya_cuda *g, int64_t *counts);

/* Memory: bytes this object allocated (parameters, gradients, arena), and the device's peak use seen so
 * far (this object's bytes + the stream-ordered pool's high-water mark + what cudaMemGetInfo showed
 * beyond them when sampled after each pass). */
typedef struct {
    size_t param_bytes, grad_bytes, arena_bytes, scratch_bytes;
    size_t pool_high_bytes;   /* cudaMallocAsync pool high-water mark (ops' temporaries) */
    size_t device_used_high;  /* max over samples of total - free (cudaMemGetInfo) */
} kiln_zaya_cuda_mem;
kiln_error *kiln_zaya_cuda_memory(kiln_zaya_cuda *g, kiln_zaya_cuda_mem *mem);

/* Per-op timing of the next passes (forward, backward, and what the caller brackets with push/pop on
 * the model's stream): CUDA events around every op, summed by op class ("linear (cuBLASLt) fwd",
 * "attention (flash) bwd", ...). report: the classes by time (largest first), and the span from the first
 * event to the last; stops timing. */
typedef struct {
    const char *cls;
    double ms;
    int calls;
    int side; /* ran on the optimizer's stream, beside the model's: not part of the step's serial time */
} kiln_zaya_cuda_prof_row;
void kiln_zaya_cuda_profile_start(kiln_zaya_cuda *g);
void kiln_zaya_cuda_profile_push(kiln_zaya_cuda *g, const char *cls);
void kiln_zaya_cuda_profile_pop(kiln_zaya_cuda *g);
kiln_error *kiln_zaya_cuda_profile_report(kiln_zaya_cuda *g, kiln_zaya_cuda_prof_row *rows, int max_rows, int *nrows,
                                          double *span_ms);

/* ---- the optimizer overlapped with the next forward (one rank) ----
 * The optimizer's stream has a lower priority than the model's (the forward's GEMMs keep their SMs, the
 * memory-bound update fills in). A step on it runs in slices of tensors in the forward's order of use: the
 * embedding with the input scale/bias; then per layer its attention and router tensors, then its experts
 * and MLP residual scales; last the final norm (and an untied LM head). The next forward waits, before its
 * first use of a slice's tensors, for that slice alone (an event), and for the whole step before the LM
 * head; every other reader joins through kiln_zaya_cuda_stream / kiln_zaya_cuda_sync. The tied LM head
 * reads the embedding, the first slice. */
/* The slices: slice k holds tensors [first[k], first[k + 1]) of m->params; returns their number. */
int kiln_zaya_cuda_overlap_slices(const kiln_zaya_cuda *g, const int **first);
/* Start a step on the optimizer's stream: it waits for everything queued so far on the model's stream (the
 * backward, the norm). *stream: the optimizer's stream. */
kiln_error *kiln_zaya_cuda_overlap_begin(kiln_zaya_cuda *g, void **stream);
/* Slice k is queued on the optimizer's stream (in order, k = 0, 1, ...). */
kiln_error *kiln_zaya_cuda_overlap_slice_done(kiln_zaya_cuda *g, int k);
/* The step is queued, and it left the gradients zero (the next backward starts from them). */
kiln_error *kiln_zaya_cuda_overlap_end(kiln_zaya_cuda *g);

/* ---- the trainer's GPU pieces (src/models/zaya_cuda_train.c) ---- */
#include "kiln/optim.h"
/* x *= s over n floats of device memory, on g's stream. */
kiln_error *kiln_zaya_cuda_scale(kiln_zaya_cuda *g, float *x, size_t n, float s);
/* sum of x^2 (device, n floats) in a fixed order, to the host. */
kiln_error *kiln_zaya_cuda_sumsq(kiln_zaya_cuda *g, const float *x, size_t n, double *out);

/* AdamW/Muon for the tensors op[first..last) (this rank's ZeRO-1 shard) on the device: the state of each
 * tensor in order, laid out as the CPU trainer's (AdamW: m then v; Muon: the momentum), so checkpoints
 * are the same files. */
typedef struct kiln_zaya_cuda_opt kiln_zaya_cuda_opt;
kiln_error *kiln_zaya_cuda_opt_create(kiln_zaya_cuda *g, const kiln_opt_param *op, int first, int last,
                                      kiln_zaya_cuda_opt **out);
void kiln_zaya_cuda_opt_free(kiln_zaya_cuda_opt *o);
size_t kiln_zaya_cuda_opt_state_numel(const kiln_zaya_cuda_opt *o);
kiln_error *kiln_zaya_cuda_opt_state_upload(kiln_zaya_cuda_opt *o, const float *state);
kiln_error *kiln_zaya_cuda_opt_state_download(kiln_zaya_cuda_opt *o, float *state);
/* The state itself (device, kiln_zaya_cuda_opt_state_numel floats): for the checkpoint's snapshot. */
float *kiln_zaya_cuda_opt_state(kiln_zaya_cuda_opt *o);
/* One step (t 1-based) on the owned tensors of g's master parameters. gshard (device): the summed
 * gradient of the owned tensors in the device layout, element 0 being device element shard_off
 * (kiln_zaya_cuda_param_offset of the first owned tensor); multiplied by scale as it is read (the mean
 * over micro-batches and ranks, and the clip), never written. AdamW runs as one launch over all its
 * tensors. write_bf16: the update also writes the owned tensors' bf16 copy (one rank); else the caller
 * refreshes it after the all-gather. */
kiln_error *kiln_zaya_cuda_opt_step(kiln_zaya_cuda_opt *o, float *gshard, size_t shard_off, float scale,
                                    const kiln_optim_hparams *hp, double lr, int64_t t, int write_bf16);
/* Whether the step can run overlapped: o owns every tensor of the model (one rank) and all are AdamW's
 * (Muon's grouped Newton-Schulz mixes layers: it runs on the model's stream, kiln_zaya_cuda_opt_step). */
int kiln_zaya_cuda_opt_can_overlap(const kiln_zaya_cuda_opt *o);
/* kiln_zaya_cuda_opt_step on the model's own gradients (gshard = kiln_zaya_cuda_grads, write_bf16 on) on the
 * model's stream, for an optimizer that can overlap (every tensor, AdamW): one launch that also writes zeros over
 * the gradients as it reads them, but for the tensors the next backward overwrites (kiln_zaya_cuda_grad_overwritten),
 * instead of a separate 4 B/param memset. The next backward gives the bits it gives after kiln_zaya_cuda_opt_step
 * and kiln_zaya_cuda_grads_zero. */
kiln_error *kiln_zaya_cuda_opt_step_zeroing(kiln_zaya_cuda_opt *o, float scale, const kiln_optim_hparams *hp,
                                            double lr, int64_t t);
/* kiln_zaya_cuda_opt_step on the model's own gradients (gshard = kiln_zaya_cuda_grads, write_bf16 on) on the
 * optimizer's stream, a launch per slice with its gradients zeroed as they are read (as the zeroing step: not those
 * the next backward overwrites); returns once queued. The same weights and state as kiln_zaya_cuda_opt_step, and the
 * same gradients from the next backward as after kiln_zaya_cuda_grads_zero. */
kiln_error *kiln_zaya_cuda_opt_step_overlapped(kiln_zaya_cuda_opt *o, float scale, const kiln_optim_hparams *hp,
                                               double lr, int64_t t);
/* The overlapped step's launches of at most max_blocks blocks of 4096 elements each, one after the other (0, the
 * default: one launch a slice). Few blocks waiting at a time leave the forward's kernels, and the experts' side
 * streams, fewer of the optimizer's blocks ahead of them in the block scheduler. The same bits. */
void kiln_zaya_cuda_opt_set_overlap_blocks(kiln_zaya_cuda_opt *o, int64_t max_blocks);

#ifdef __cplusplus
}
#endif
#endif
