/* The training loop: data-parallel ZeRO-1 over a kiln_comm.
 *
 * Every rank holds the whole model and computes gradients on its own windows; gradients are
 * reduce-scattered so that each rank receives the summed gradient of the tensors it owns, which
 * it alone updates (its slice of the AdamW/Muon state is all the optimizer state it keeps); the
 * updated parameters are all-gathered. Expert load is summed over ranks and fed to the balance
 * controller, identically on every rank, so the balancing biases never diverge. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kiln/cuda.h"
#include "kiln/data.h"
#include "kiln/fsutil.h"
#include "kiln/ft.h"
#include "kiln/hash.h"
#include "kiln/log.h"
#include "kiln/zaya_cuda.h"
#include "kiln/zaya_cuda_snapshot.h"
#include "train_internal.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Micro-batches per rank at this step (the batch-size ramp). */
static int64_t accum_at(const kiln_train_config *c, int64_t step) {
    if (c->batch_ramp_start <= 0 || c->batch_ramp_steps <= 0 || step >= c->batch_ramp_steps) return c->grad_accum;
    return c->batch_ramp_start + (c->grad_accum - c->batch_ramp_start) * step / c->batch_ramp_steps;
}

/* Forward FLOPs per token, active parameters only (matrices x2) plus attention scores. */
static double flops_per_token(const kiln_zaya *m, int64_t T) {
    const kiln_zaya_config *c = &m->cfg;
    double H = (double)c->hidden_size, Q = (double)(c->num_heads * c->head_dim), K = (double)(c->num_kv_heads * c->head_dim);
    double R = (double)c->router_hidden, I = (double)c->moe_intermediate;
    double per_layer = H * (Q + K + K) + Q * H + H * R + 2 * R * R + R * (c->num_experts + 1) + c->top_k * 3 * H * I;
    per_layer += 2.0 * Q * (double)T / 2; /* causal scores and weighted sum, averaged over positions */
    return 2.0 * (per_layer * (double)c->num_layers + H * (double)c->vocab_size);
}

/* A rough peak of this CPU for the MFU estimate: cores x clock x 32 f32 FLOPs/cycle (AVX2 FMA). */
static double cpu_peak_flops(int threads) {
    double mhz = 2000;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "cpu MHz", 7)) {
                char *c = strchr(line, ':');
                if (c) mhz = atof(c + 1);
                break;
            }
        fclose(f);
    }
    return threads * mhz * 1e6 * 32;
}

typedef struct {
    kiln_zaya *m;
    kiln_zaya_acts *acts;
    kiln_loader *train, *val;
    int64_t *ids;
    zero1_partition part;
    kiln_opt_param *op;
    float *state, *gshard, *ws;
    balance_ctl bal;
    int64_t *counts;
    double *imbalance;
    kiln_loader_state *loader_states;
    ckpt_writer *ckw;
    FILE *metrics;
    kiln_ft_env ft;                /* kiln run's protocol: heartbeats, resume, data windows to skip, faults */
    double compute_s, local_gnorm; /* this rank's forward/backward time and own gradient norm, for heartbeats */
    double rs_s, ag_s;             /* the last GPU step's reduce-scatter and all-gather (host wall; KILN_CUDA_PROFILE) */
    kiln_heartbeat hb;
    kiln_heartbeat_writer *hbw;    /* under kiln run: the beats' background writer (NULL: no heartbeats) */
    /* run.device = "cuda": the model, its gradients and this rank's optimizer state on the GPU; m->w and
     * t->state are host mirrors refreshed for checkpoints and the final save */
    kiln_zaya_cuda *gpu;
    kiln_zaya_cuda_opt *gopt;
    float *gshard_dev; /* this rank's summed gradient (device); aliases the gradients on one rank */
    int gshard_owned;
    size_t *dcounts, *ddispls; /* the ZeRO-1 partition in the device layout (tensors 64-element aligned) */
    zero1_run *gruns;          /* several ranks, KILN_ZERO1_GATHER=bf16: the all-gather's broadcasts (gather_params) */
    int ngruns;
    int rs_overlap;            /* several ranks, no KILN_RS_OVERLAP=0, no KILN_FAULT: the reduce-scatter in the backward */
    kiln_comm *rs_comm;        /* rs_span's */
    size_t *span_counts, *span_displs;
    int opt_overlap;  /* one rank, AdamW, KILN_OPT_OVERLAP=1: the optimizer step runs beside the next forward */
    int grads_clean;  /* the last (overlapped or zeroing) optimizer step left the device gradients zero */
    int64_t step_debug; /* KILN_STEP_DEBUG: the GPU steps that print their sums (step_debug_steps) */
    int opt_zero;     /* one rank, AdamW on every tensor, KILN_OPT_ZERO_GRADS=fused: the step zeroes the gradients */
    int zero_added;   /* zero only the gradients the backward adds to (KILN_OPT_ZERO_GRADS=0: all of them) */
} trainer;

static void trainer_free(trainer *t) {
    kiln_error_free(kiln_heartbeat_writer_close(t->hbw)); /* closed (and its error taken) by kiln_train already */
    ckpt_writer_free(t->ckw); /* first: its thread may still be reading the device snapshot */
    kiln_zaya_cuda_opt_free(t->gopt);
    free(t->dcounts);
    free(t->ddispls);
    free(t->gruns);
    free(t->span_counts);
    free(t->span_displs);
    if (t->gshard_owned) kiln_cuda_free(t->gshard_dev);
    kiln_zaya_cuda_free(t->gpu);
    kiln_zaya_acts_free(t->acts);
    kiln_zaya_free(t->m);
    kiln_loader_close(t->train);
    kiln_loader_close(t->val);
    free(t->ids);
    zero1_partition_free(&t->part);
    free(t->op);
    free(t->state);
    free(t->gshard);
    free(t->ws);
    balance_free(&t->bal);
    free(t->counts);
    free(t->imbalance);
    free(t->loader_states);
    if (t->metrics) fclose(t->metrics);
    kiln_ft_env_free(&t->ft);
}

static int on_gpu(const kiln_train_config *c) { return !strcmp(c->device, "cuda"); }

/* KILN_ZERO1_GATHER=bf16 (the default with several ranks): after the sharded step each owner sends the tensors the
 * GPU model reads only as bf16 (the GEMMs' weights: 94% of issue [cuda]'s model; kiln_zaya_cuda_reads_f32) as the
 * bf16 copy its optimizer step wrote, and the rest as f32 masters: about half an f32 all-gather's bytes, and no pass
 * re-deriving the whole bf16 copy after it. Every rank computes with the same bits as =f32 (the optimizer rounds to
 * nearest even, as the re-derivation does; GPU test gpu_zaya_train_gather_bf16_staged). The f32 masters of the
 * other ranks' bf16-only tensors are stale on this rank then: whatever reads all of them (the final save) gathers
 * them first (gather_f32); the checkpoints read each rank's own. =f32: every master as f32, then the whole bf16 copy
 * re-derived (and always under KILN_STEP_DEBUG, whose parameter sums read every master). */
static kiln_error *gather_setup(trainer *t) {
    const char *v = getenv("KILN_ZERO1_GATHER");
    if (v && *v && strcmp(v, "bf16") && strcmp(v, "f32"))
        return kiln_errorf(KILN_EINVAL, "KILN_ZERO1_GATHER=%s: expected bf16 (the default) or f32", v);
    if ((v && !strcmp(v, "f32")) || t->step_debug > 0) return NULL;
    const int np = t->m->nparams;
    unsigned char *f32 = malloc((size_t)np + 1);
    size_t *off = malloc(((size_t)np + 1) * sizeof *off);
    int64_t *numel = malloc(((size_t)np + 1) * sizeof *numel);
    kiln_error *e = !f32 || !off || !numel ? kiln_errorf(KILN_ENOMEM, "ZeRO-1 all-gather plan") : NULL;
    if (!e) e = kiln_zaya_cuda_reads_f32(t->m, f32);
    for (int i = 0; i < np && !e; i++) off[i] = kiln_zaya_cuda_param_offset(t->gpu, i), numel[i] = t->m->params[i].numel;
    if (!e) e = zero1_gather_runs(&t->part, off, numel, f32, &t->gruns, &t->ngruns);
    free(f32), free(off), free(numel);
    if (!e) kiln_log(KILN_LOG_DEBUG, "ZeRO-1 all-gather: %d broadcasts, bf16 where the model reads only bf16", t->ngruns);
    return e;
}

/* Every rank's parameters after the sharded optimizer step, on the device: the GEMMs' bf16 copy and the f32 masters
 * the model reads (above), or every f32 master and then the whole bf16 copy. The device is idle meanwhile. */
static kiln_error *gather_params(trainer *t, kiln_comm *comm) {
    kiln_zaya_cuda *g = t->gpu;
    KILN_TRY(kiln_zaya_cuda_sync(g)); /* the update is complete before NCCL's stream reads it */
    if (!t->gruns) {
        KILN_TRY(comm->allgather(comm, kiln_zaya_cuda_params(g), t->dcounts, t->ddispls));
        KILN_TRY(kiln_comm_sync(comm));
        kiln_zaya_cuda_profile_push(g, "bf16 weight copy");
        KILN_TRY(kiln_zaya_cuda_refresh_bf16(g));
        kiln_zaya_cuda_profile_pop(g);
        return NULL;
    }
    float *w = kiln_zaya_cuda_params(g);
    uint16_t *wb = kiln_zaya_cuda_params_bf16(g);
    KILN_TRY(kiln_comm_group_start(comm));
    kiln_error *e = NULL;
    for (int k = 0; k < t->ngruns && !e; k++) {
        const zero1_run *r = &t->gruns[k];
        e = r->f32 ? comm->broadcast_dt(comm, w + r->off, w + r->off, r->n, KILN_DT_F32, r->root)
                   : comm->broadcast_dt(comm, wb + r->off, wb + r->off, r->n, KILN_DT_BF16, r->root);
    }
    kiln_error *ge = kiln_comm_group_end(comm); /* closed on every path: NCCL's group must not stay open */
    if (e) {
        kiln_error_free(ge);
        return e;
    }
    KILN_TRY(ge);
    KILN_TRY(kiln_comm_sync(comm));
    /* the f32-read tensors' bf16 copy (the tied LM head's, the value shift's bias also feeds a GEMM) from their
     * masters; a few percent of the elements */
    kiln_zaya_cuda_profile_push(g, "bf16 weight copy");
    for (int k = 0; k < t->ngruns && !e; k++)
        if (t->gruns[k].f32) e = kiln_zaya_cuda_refresh_bf16_range(g, t->gruns[k].off, t->gruns[k].n);
    kiln_zaya_cuda_profile_pop(g);
    return e;
}

/* every f32 master on every rank, where the bf16 all-gather left the other ranks' GEMM weights' masters stale */
static kiln_error *gather_f32(trainer *t, kiln_comm *comm) {
    if (!t->gruns) return NULL;
    KILN_TRY(kiln_zaya_cuda_sync(t->gpu));
    KILN_TRY(comm->allgather(comm, kiln_zaya_cuda_params(t->gpu), t->dcounts, t->ddispls));
    return kiln_comm_sync(comm);
}

/* The GPU side: model, optimizer for this rank's tensors, and where the reduce-scatter lands. */
static kiln_error *setup_cuda(trainer *t, const kiln_train_config *c, kiln_comm *comm) {
    if (!comm->device_buffers && comm->size > 1)
        return kiln_errorf(KILN_EINVAL, "run.device cuda with %d ranks needs the NCCL or the staged backend (the %s "
                           "backend moves host memory)", comm->size, comm->backend);
    KILN_TRY(kiln_zaya_cuda_create(t->m, c->micro_batch, c->seq_len, c->recompute, &t->gpu));
    kiln_zaya_cuda_set_deterministic(t->gpu, c->deterministic);
    /* The experts' weight gradients in bf16 (KILN_EXPERT_GRADS=bf16, the default where it applies; =f32 keeps
     * them f32): rounded once as their GEMMs write them, as the reference's autocast rounds them, which halves
     * 91% of the gradient's bytes for the GEMMs, the norm and AdamW (~10 GB a step at the [cuda] size). It
     * needs every step's backward to write them once (one micro-batch), the gradient read where it lies (one
     * rank: no reduce-scatter of f32) and AdamW on them. */
    const char *xg = getenv("KILN_EXPERT_GRADS");
    if (xg && *xg && strcmp(xg, "bf16") && strcmp(xg, "f32"))
        return kiln_errorf(KILN_EINVAL, "KILN_EXPERT_GRADS=%s: expected bf16 (the default) or f32", xg);
    int xg16 = !(xg && !strcmp(xg, "f32")) && comm->size == 1 && c->grad_accum == 1 &&
               (c->batch_ramp_start <= 1 || c->batch_ramp_steps <= 0);
    for (int i = 0; i < t->m->nparams && xg16; i++)
        if (kiln_zaya_cuda_grad_overwritten(t->gpu, i) && t->op[i].kind != KILN_OPT_ADAMW) xg16 = 0;
    if (xg16) KILN_TRY(kiln_zaya_cuda_set_expert_grads_bf16(t->gpu, 1));
    kiln_log(KILN_LOG_DEBUG, "the experts' weight gradients in %s", xg16 ? "bf16" : "f32");
    /* Their f32 master weights split (KILN_SPLIT_MASTER=1, the default where the bf16 gradients are on; =0 keeps
     * them f32): held as the bf16 copy the GEMMs read plus the low 16 bits, the same f32 values bit for bit, so
     * AdamW reads and writes 4 bytes of weight an element instead of reading 4 and writing 6 (kiln_f32_split). */
    const char *sm = getenv("KILN_SPLIT_MASTER");
    if (sm && *sm && strcmp(sm, "0") && strcmp(sm, "1"))
        return kiln_errorf(KILN_EINVAL, "KILN_SPLIT_MASTER=%s: expected 1 (the default) or 0", sm);
    if (xg16 && !(sm && !strcmp(sm, "0"))) KILN_TRY(kiln_zaya_cuda_set_master_split(t->gpu, 1));
    KILN_TRY(kiln_zaya_cuda_opt_create(t->gpu, t->op, t->part.first[comm->rank], t->part.first[comm->rank + 1], &t->gopt));
    t->dcounts = calloc((size_t)comm->size, sizeof *t->dcounts);
    t->ddispls = calloc((size_t)comm->size, sizeof *t->ddispls);
    if (!t->dcounts || !t->ddispls) return kiln_errorf(KILN_ENOMEM, "trainer");
    for (int r = 0; r < comm->size; r++) {
        t->ddispls[r] = kiln_zaya_cuda_param_offset(t->gpu, t->part.first[r]);
        t->dcounts[r] = kiln_zaya_cuda_param_offset(t->gpu, t->part.first[r + 1]) - t->ddispls[r];
    }
    if (comm->size > 1) {
        KILN_TRY(kiln_cuda_alloc((void **)&t->gshard_dev, (t->dcounts[comm->rank] + 1) * sizeof(float)));
        t->gshard_owned = 1;
        KILN_TRY(gather_setup(t));
        /* The reduce-scatter inside the backward (the default where the backend can order a collective after a
         * stream: NCCL, staged; KILN_RS_OVERLAP=0 turns it off): each span of the gradient is reduced as soon as
         * the backward has finished it (kiln_zaya_cuda_set_grads_ready, the step's last micro-batch), beside the
         * rest of the backward, instead of with the device idle after it (~17 ms of a step at 8 GPUs by README's
         * estimate, most of it hidden). The same sums: each element is reduced once, over the same ranks; staged,
         * the same bits (gpu_zaya_train_rs_overlap_staged, run on an H100 in session 40). */
        const char *ro = getenv("KILN_RS_OVERLAP");
        if (ro && *ro && strcmp(ro, "0") && strcmp(ro, "1"))
            return kiln_errorf(KILN_EINVAL, "KILN_RS_OVERLAP=%s: expected 1 (the default) or 0", ro);
        t->rs_overlap = comm->after_stream && !(ro && !strcmp(ro, "0"));
        if (t->rs_overlap) {
            t->rs_comm = comm;
            t->span_counts = calloc((size_t)comm->size, sizeof *t->span_counts);
            t->span_displs = calloc((size_t)comm->size, sizeof *t->span_displs);
            if (!t->span_counts || !t->span_displs) return kiln_errorf(KILN_ENOMEM, "trainer");
        }
    } else { /* one rank: the summed gradient is the gradient, and the collectives are identities */
        t->gshard_dev = kiln_zaya_cuda_grads(t->gpu);
    }
    /* KILN_OPT_OVERLAP=1, one rank with AdamW only: the optimizer step runs on its own stream, a slice of
     * tensors at a time, while the next forward starts (each layer waits for its own slice); the same bits
     * either way. Off by default: on the H200 (run r16a, docs/perf.md) the AdamW blocks took the SMs and the
     * bandwidth from the forward (119 ms a step against 90 serial). Muon's grouped Newton-Schulz and the
     * ranks' collectives keep the step on the model's stream. */
    const char *ov = getenv("KILN_OPT_OVERLAP");
    t->opt_overlap = comm->size == 1 && kiln_zaya_cuda_opt_can_overlap(t->gopt) && ov && !strcmp(ov, "1");
    /* KILN_OPT_OVERLAP_BLOCKS=N: its launches of at most N blocks (an experiment: fewer of its blocks waiting
     * ahead of the forward's) */
    const char *ob = getenv("KILN_OPT_OVERLAP_BLOCKS");
    if (ob && *ob) {
        char *end = NULL;
        const long long n = strtoll(ob, &end, 10);
        if (*end || n < 0)
            return kiln_errorf(KILN_EINVAL, "KILN_OPT_OVERLAP_BLOCKS=%s: not a count of blocks (0: one launch a slice)", ob);
        kiln_zaya_cuda_opt_set_overlap_blocks(t->gopt, n);
    }
    /* The step's gradient zeroing: by default (KILN_OPT_ZERO_GRADS=1) only the gradients the backward adds to
     * (kiln_zaya_cuda_grads_zero_added: it overwrites the experts' weights', 91% of the [cuda] model; ~1.4 ms a
     * step by its bytes; the trainer's GPU tests passed with it in run r25). =0: all of them, one memset (the
     * reference the GPU tests compare it with); =fused, on one rank with AdamW only, zeros written by the
     * optimizer step as it reads the gradients (slower on the H200, run r23; elsewhere the whole memset). The
     * same bits every way. */
    const char *oz = getenv("KILN_OPT_ZERO_GRADS");
    if (oz && *oz && strcmp(oz, "0") && strcmp(oz, "1") && strcmp(oz, "fused"))
        return kiln_errorf(KILN_EINVAL, "KILN_OPT_ZERO_GRADS=%s: expected 0, 1 (the default) or fused", oz);
    t->zero_added = !oz || !*oz || !strcmp(oz, "1");
    t->opt_zero = comm->size == 1 && !t->opt_overlap && kiln_zaya_cuda_opt_can_overlap(t->gopt) && oz &&
                  !strcmp(oz, "fused");
    kiln_log(KILN_LOG_DEBUG, "optimizer step %s the next forward", t->opt_overlap ? "overlapped with" : "before");
    return NULL;
}

/* Host mirrors <- device (before the final save), and the reverse after a resume; checkpoints read the
 * device through the writer's snapshot (src/models/zaya_cuda_snapshot.c). */
static kiln_error *cuda_to_host(trainer *t, kiln_comm *comm) {
    if (!t->gpu) return NULL;
    KILN_TRY(gather_f32(t, comm));
    KILN_TRY(kiln_zaya_cuda_download_params(t->gpu, t->m->w));
    return kiln_zaya_cuda_opt_state_download(t->gopt, t->state);
}
static kiln_error *host_to_cuda(trainer *t) {
    if (!t->gpu) return NULL;
    KILN_TRY(kiln_zaya_cuda_upload_params(t->gpu, t->m->w));
    KILN_TRY(kiln_zaya_cuda_upload_balancing(t->gpu, t->m->balancing));
    return kiln_zaya_cuda_opt_state_upload(t->gopt, t->state);
}

/* KILN_STEP_DEBUG=N: each rank prints, for the first N steps of the GPU trainer, what it feeds into and gets out of
 * the step's collectives (its micro-batches' token hash and loss, its own gradient's sum of squares, its shard's
 * after the reduce-scatter, the parameters' before the optimizer and after the all-gather), so that a several-rank
 * run can be compared with one rank accumulating the same micro-batches, line by line. A debugging aid: each
 * sum costs a device pass and a synchronisation, and with split master weights (one rank, bf16 expert gradients)
 * the parameters' sums read the split form. */
static int64_t step_debug_steps(void) {
    const char *v = getenv("KILN_STEP_DEBUG");
    return v && *v ? atoll(v) : 0;
}

static kiln_error *setup(trainer *t, const kiln_train_config *c, kiln_comm *comm) {
    KILN_TRY(kiln_zaya_create(&c->model, &t->m));
    kiln_zaya_init_random(t->m, c->init_seed);
    if (!on_gpu(c)) KILN_TRY(kiln_zaya_grads_enable(t->m));
    if (!on_gpu(c)) KILN_TRY(kiln_zaya_acts_create(t->m, c->micro_batch, c->seq_len, &t->acts));
    KILN_TRY(kiln_loader_open(c->data_dir, "train", c->seq_len, c->data_seed, comm->rank, comm->size, &t->train));
    KILN_TRY(kiln_loader_set_block(t->train, c->micro_batch));
    if (kiln_loader_vocab_size(t->train) > c->model.vocab_size)
        return kiln_errorf(KILN_EINVAL, "%s: the shards' vocabulary (%lld tokens) is larger than the model's vocab_size "
                           "(%lld): the tokenizer does not match this config", c->data_dir,
                           (long long)kiln_loader_vocab_size(t->train), (long long)c->model.vocab_size);
    if (c->eval_every > 0) {
        kiln_error *e = kiln_loader_open(c->data_dir, "val", c->seq_len, c->data_seed, comm->rank, comm->size, &t->val);
        if (!e) e = kiln_loader_set_block(t->val, c->micro_batch);
        if (e) { /* no validation split: say so once, train anyway */
            if (comm->rank == 0) kiln_log(KILN_LOG_WARN, "no validation loss: %s", kiln_error_msg(e));
            kiln_error_free(e);
            kiln_loader_close(t->val);
            t->val = NULL;
        }
    }
    t->ids = malloc((size_t)(c->micro_batch * c->seq_len) * sizeof *t->ids);
    KILN_TRY(zero1_partition_make(t->m, comm->size, &t->part));
    t->op = calloc((size_t)t->m->nparams, sizeof *t->op);
    if (!t->ids || !t->op) return kiln_errorf(KILN_ENOMEM, "trainer");
    kiln_optim_classify(t->m, &c->optim, t->op);
    size_t nstate = 0, ws = 1;
    for (int i = t->part.first[comm->rank]; i < t->part.first[comm->rank + 1]; i++) {
        nstate += (size_t)kiln_optim_state_numel(&t->op[i]);
        if (t->op[i].kind == KILN_OPT_MUON && kiln_muon_workspace(&t->op[i]) > ws) ws = kiln_muon_workspace(&t->op[i]);
    }
    const int64_t L = c->model.num_layers, E1 = c->model.num_experts + 1;
    t->state = calloc(nstate + 1, sizeof(float));
    t->gshard = calloc(t->part.counts[comm->rank] + 1, sizeof(float));
    t->ws = calloc(ws, sizeof(float));
    t->counts = calloc((size_t)(L * E1), sizeof *t->counts);
    t->imbalance = calloc((size_t)L + 1, sizeof *t->imbalance);
    t->loader_states = calloc((size_t)comm->size, sizeof *t->loader_states);
    if (!t->state || !t->gshard || !t->ws || !t->counts || !t->imbalance || !t->loader_states)
        return kiln_errorf(KILN_ENOMEM, "optimizer state");
    t->step_debug = step_debug_steps();
    if (on_gpu(c)) KILN_TRY(setup_cuda(t, c, comm));
    return balance_init(&t->bal, L, E1);
}

static ckpt_view view_of(trainer *t, const kiln_train_config *c, int64_t step, double tokens) {
    return (ckpt_view){step, c, t->m, &t->part, t->op, t->state, &t->bal, t->loader_states, tokens};
}

/* Every rank's loader position, for the checkpoint. */
static kiln_error *gather_loader_states(trainer *t, kiln_comm *comm) {
    for (int r = 0; r < comm->size; r++) {
        kiln_loader_state s = kiln_loader_get_state(t->train);
        KILN_TRY(comm->broadcast(comm, &s, sizeof s, r));
        t->loader_states[r] = s;
    }
    return NULL;
}

static kiln_error *eval_loss(trainer *t, const kiln_train_config *c, kiln_comm *comm, double *out) {
    kiln_loader_state keep = kiln_loader_get_state(t->val); /* the same windows every evaluation */
    double acc[2] = {0, 0};
    for (int64_t i = 0; i < c->eval_batches; i++) {
        double loss;
        KILN_TRY(kiln_loader_next(t->val, c->micro_batch, t->ids));
        if (t->gpu) KILN_TRY(kiln_zaya_cuda_forward(t->gpu, t->ids, &loss));
        else KILN_TRY(kiln_zaya_forward(t->m, t->acts, t->ids, NULL, &loss));
        acc[0] += loss;
        acc[1] += 1;
    }
    KILN_TRY(kiln_loader_set_state(t->val, &keep));
    KILN_TRY(comm->allreduce_sum_f64(comm, acc, 2));
    *out = acc[0] / acc[1];
    return NULL;
}

/* Expert load over all ranks -> balancing biases, the same on every rank. */
static kiln_error *balance_step(trainer *t, const kiln_train_config *c, kiln_comm *comm) {
    const int64_t L = c->model.num_layers, E1 = c->model.num_experts + 1;
    double *cnt = malloc((size_t)(L * E1) * sizeof(double));
    if (!cnt) return kiln_errorf(KILN_ENOMEM, "route counts");
    for (int64_t i = 0; i < L * E1; i++) cnt[i] = (double)t->counts[i];
    kiln_error *e = comm->allreduce_sum_f64(comm, cnt, (size_t)(L * E1));
    for (int64_t i = 0; i < L * E1; i++) t->counts[i] = (int64_t)llround(cnt[i]);
    free(cnt);
    KILN_TRY(e);
    balance_update(&t->bal, c, t->counts, t->m->balancing, t->imbalance);
    return NULL;
}

static void step_debug(const kiln_comm *comm, int64_t step, const char *what, double v) {
    fprintf(stderr, "kiln step-debug: rank %d step %lld %s %.9g\n", comm->rank, (long long)step + 1, what, v);
}

static void step_debug_sumsq(kiln_zaya_cuda *g, const kiln_comm *comm, int64_t step, const char *what, const float *x,
                             size_t n) {
    double v = NAN;
    kiln_error *e = kiln_zaya_cuda_sumsq(g, x, n, &v);
    kiln_error_free(e);
    step_debug(comm, step, what, v);
}

/* The backward's hook (the default on several ranks; KILN_RS_OVERLAP=0 turns it off): ZeRO-1's reduce-scatter of
 * the gradient's elements [lo, hi), which the work queued on `stream` finishes, each owner's part of it
 * (zero1_span_blocks; empty for most ranks) reduced to that owner's shard; on the comm's stream, after that work,
 * beside the rest of the backward. */
static kiln_error *rs_span(void *ctx, size_t lo, size_t hi, void *stream) {
    trainer *t = ctx;
    kiln_comm *comm = t->rs_comm;
    const int me = comm->rank;
    zero1_span_blocks(t->dcounts, t->ddispls, comm->size, lo, hi, t->span_counts, t->span_displs);
    float *recv = t->gshard_dev + (t->span_counts[me] ? lo + t->span_displs[me] - t->ddispls[me] : 0);
    KILN_TRY(comm->after_stream(comm, stream));
    return comm->reduce_scatter_sum(comm, kiln_zaya_cuda_grads(t->gpu) + lo, recv, t->span_counts, t->span_displs);
}

/* kiln_zaya_cuda_backward, with rs_span as its hook when `hook` */
static kiln_error *backward_cuda(trainer *t, int hook) {
    if (hook) KILN_TRY(kiln_zaya_cuda_set_grads_ready(t->gpu, rs_span, t));
    kiln_error *e = kiln_zaya_cuda_backward(t->gpu);
    if (hook) kiln_error_free(kiln_zaya_cuda_set_grads_ready(t->gpu, NULL, NULL)); /* no error without a hook */
    return e;
}

/* The step on the GPU: the CPU step's sequence, with the gradients, the reduce-scatter (NCCL), the norm,
 * the optimizer and the all-gather on the device; the balance controller stays on the host. */
static kiln_error *one_step_cuda(trainer *t, const kiln_train_config *c, kiln_comm *comm, int64_t step,
                                 double *loss_out, double *gnorm_out, double *lr_out, int64_t *ntok) {
    kiln_zaya *m = t->m;
    kiln_zaya_cuda *g = t->gpu;
    const int64_t accum = accum_at(c, step), L = c->model.num_layers, E1 = c->model.num_experts + 1;
    const int me = comm->rank;
    const int64_t dbg = t->step_debug;
    const int overlap = t->rs_overlap; /* the reduce-scatter in the last micro-batch's backward */
    if (step < dbg)
        step_debug_sumsq(g, comm, step, "parameters' sum of squares before the step", kiln_zaya_cuda_params(g),
                         kiln_zaya_cuda_numel(g));
    if (!t->grads_clean) /* else the last optimizer step zeroed them */
        KILN_TRY(t->zero_added ? kiln_zaya_cuda_grads_zero_added(g) : kiln_zaya_cuda_grads_zero(g));
    t->grads_clean = 0;
    memset(t->counts, 0, (size_t)(L * E1) * sizeof *t->counts);
    double loss_sum = 0, tc = now();
    for (int64_t a = 0; a < accum; a++) {
        double loss;
        KILN_TRY(kiln_loader_next(t->train, c->micro_batch, t->ids));
        /* the loss comes from the backward's cross-entropy pass: the host does not wait between the two */
        KILN_TRY(kiln_zaya_cuda_forward(g, t->ids, NULL));
        KILN_TRY(backward_cuda(t, overlap && a == accum - 1));
        KILN_TRY(kiln_zaya_cuda_loss(g, &loss));
        if (step < dbg) {
            const size_t nb = (size_t)(c->micro_batch * c->seq_len) * sizeof *t->ids;
            step_debug(comm, step, "micro-batch token hash (low 32 bits)",
                       (double)(kiln_fnv1a64(KILN_FNV1A64_INIT, t->ids, nb) & 0xffffffffu));
            step_debug(comm, step, "micro-batch loss", loss);
            step_debug_sumsq(g, comm, step, "gradient sum of squares so far (all tensors, f32 as stored)",
                             kiln_zaya_cuda_grads(g), kiln_zaya_cuda_numel(g));
        }
        KILN_TRY(kiln_zaya_cuda_route_counts(g, t->counts));
        loss_sum += loss;
    }
    if (t->ft.faults.n) kiln_ft_fault_slow(&t->ft, comm->rank, step + 1);
    t->compute_s = now() - tc;
    if (t->ft.faults.n) { /* KILN_FAULT, a testing hook */
        if (kiln_faults_find(&t->ft.faults, KILN_FAULT_NAN, comm->rank, step + 1, t->ft.attempt)) {
            const float nan = NAN;
            KILN_TRY(kiln_cuda_copy(kiln_zaya_cuda_grads(g), &nan, sizeof nan, KILN_CUDA_H2D));
        }
        if (kiln_faults_find(&t->ft.faults, KILN_FAULT_SPIKE, comm->rank, step + 1, t->ft.attempt)) loss_sum *= 1000;
    }
    double local_sq = -1; /* this rank's own gradient's sum of squares, when the heartbeat wants it */
    if (t->ft.heartbeat_dir[0]) {
        KILN_TRY(kiln_zaya_cuda_sumsq(g, kiln_zaya_cuda_grads(g), kiln_zaya_cuda_numel(g), &local_sq));
        t->local_gnorm = sqrt(local_sq);
    }
    /* the mean over micro-batches and ranks is applied by the optimizer's scale, with the clip: one pass */
    const float inv = 1.0f / (float)(accum * comm->size);
    if (comm->size > 1) {
        /* from here to the sync, the collective alone (with overlap, what of it the backward did not hide): the
         * device is idle */
        const double t0 = now();
        if (!overlap) {
            KILN_TRY(kiln_zaya_cuda_sync(g)); /* the gradients are complete before NCCL's stream reads them */
            KILN_TRY(comm->reduce_scatter_sum(comm, kiln_zaya_cuda_grads(g), t->gshard_dev, t->dcounts, t->ddispls));
        }
        KILN_TRY(kiln_comm_sync(comm));
        t->rs_s = now() - t0;
        if (step < dbg) step_debug_sumsq(g, comm, step, "shard's sum of squares after the reduce-scatter",
                                         t->gshard_dev, t->dcounts[me]);
    }
    double stats[3] = {0, loss_sum / (double)accum, 0};
    kiln_zaya_cuda_profile_push(g, "gradient norm");
    /* on one rank the shard is the whole gradient: the heartbeat's sum is the same pass, not run twice */
    if (comm->size == 1 && local_sq >= 0 && (size_t)t->dcounts[me] == (size_t)kiln_zaya_cuda_numel(g)) stats[0] = local_sq;
    else KILN_TRY(kiln_zaya_cuda_sumsq(g, t->gshard_dev, t->dcounts[me], &stats[0]));
    kiln_zaya_cuda_profile_pop(g);
    KILN_TRY(comm->allreduce_sum_f64(comm, stats, 2));
    double gnorm = sqrt(stats[0]) * inv;
    if (!isfinite(gnorm) || !isfinite(stats[1])) {
        *loss_out = stats[1] / comm->size;
        *gnorm_out = gnorm;
        *lr_out = 0;
        *ntok = 0;
        return NULL;
    }
    float scale = (c->clip > 0 && gnorm > c->clip) ? (float)(c->clip / (gnorm + 1e-6)) : 1.0f;
    scale *= inv;
    kiln_schedule sched = c->sched;
    sched.total = c->steps;
    double lr = kiln_schedule_lr(&sched, step);
    if (t->opt_overlap) { /* queued on the optimizer's stream; it zeroes the gradients as it goes */
        KILN_TRY(kiln_zaya_cuda_opt_step_overlapped(t->gopt, scale, &c->optim, lr, step + 1));
        t->grads_clean = 1;
    } else if (t->opt_zero) { /* the same step, zeroing the gradients as it reads them: no memset next step */
        kiln_zaya_cuda_profile_push(g, "optimizer (AdamW)");
        KILN_TRY(kiln_zaya_cuda_opt_step_zeroing(t->gopt, scale, &c->optim, lr, step + 1));
        kiln_zaya_cuda_profile_pop(g);
        t->grads_clean = 1;
    } else {
        kiln_zaya_cuda_profile_push(g, c->optim.use_muon ? "optimizer (Muon + AdamW)" : "optimizer (AdamW)");
        /* its bf16 copy too where the bf16 all-gather sends that (one rank: always) */
        KILN_TRY(kiln_zaya_cuda_opt_step(t->gopt, t->gshard_dev, t->ddispls[me], scale, &c->optim, lr, step + 1,
                                         comm->size == 1 || t->gruns));
        kiln_zaya_cuda_profile_pop(g);
    }
    if (comm->size > 1) { /* one rank's optimizer wrote the whole bf16 copy itself */
        const double t0 = now();
        KILN_TRY(gather_params(t, comm));
        t->ag_s = now() - t0;
        if (step < dbg) step_debug_sumsq(g, comm, step, "parameters' sum of squares after the all-gather",
                                         kiln_zaya_cuda_params(g), kiln_zaya_cuda_numel(g));
    }
    KILN_TRY(balance_step(t, c, comm));
    KILN_TRY(kiln_zaya_cuda_upload_balancing(g, m->balancing));
    *loss_out = stats[1] / comm->size;
    *gnorm_out = gnorm;
    *lr_out = lr;
    *ntok = accum * c->micro_batch * c->seq_len * comm->size;
    return NULL;
}

static kiln_error *one_step(trainer *t, const kiln_train_config *c, kiln_comm *comm, int64_t step, double *loss_out,
                            double *gnorm_out, double *lr_out, int64_t *ntok) {
    kiln_zaya *m = t->m;
    const int64_t accum = accum_at(c, step), L = c->model.num_layers, E1 = c->model.num_experts + 1;
    if (kiln_step_ranges_contains(&t->ft.skip, step + 1)) { /* a skipped window: consumed, not trained on */
        for (int64_t a = 0; a < accum; a++) KILN_TRY(kiln_loader_next(t->train, c->micro_batch, t->ids));
        *loss_out = *gnorm_out = NAN;
        *lr_out = 0;
        *ntok = 0;
        return NULL;
    }
    if (t->gpu) return one_step_cuda(t, c, comm, step, loss_out, gnorm_out, lr_out, ntok);
    kiln_zaya_grads_zero(m);
    memset(t->counts, 0, (size_t)(L * E1) * sizeof *t->counts);
    double loss_sum = 0, tc = now();
    for (int64_t a = 0; a < accum; a++) {
        double loss;
        KILN_TRY(kiln_loader_next(t->train, c->micro_batch, t->ids));
        KILN_TRY(kiln_zaya_forward(m, t->acts, t->ids, NULL, &loss));
        KILN_TRY(kiln_zaya_backward(m, t->acts, t->ids));
        kiln_zaya_route_counts(m, t->acts, t->counts);
        loss_sum += loss;
    }
    if (t->ft.faults.n) kiln_ft_fault_slow(&t->ft, comm->rank, step + 1);
    t->compute_s = now() - tc;
    if (t->ft.faults.n) { /* KILN_FAULT, a testing hook */
        if (kiln_faults_find(&t->ft.faults, KILN_FAULT_NAN, comm->rank, step + 1, t->ft.attempt)) m->g[0] = NAN;
        if (kiln_faults_find(&t->ft.faults, KILN_FAULT_SPIKE, comm->rank, step + 1, t->ft.attempt)) loss_sum *= 1000;
    }
    if (t->ft.heartbeat_dir[0]) { /* tells the supervisor which rank produced a NaN */
        double sq = 0;
        for (size_t i = 0; i < m->numel; i++) sq += (double)m->g[i] * m->g[i];
        t->local_gnorm = sqrt(sq);
    }
    /* mean over every micro-batch of every rank */
    const float inv = 1.0f / (float)(accum * comm->size);
    for (size_t i = 0; i < m->numel; i++) m->g[i] *= inv;
    const int me = comm->rank;
    KILN_TRY(comm->reduce_scatter_sum(comm, m->g, t->gshard, t->part.counts, t->part.displs));
    /* global gradient norm: each rank's shard, then summed */
    double stats[3] = {0, loss_sum / (double)accum, 0};
    for (size_t i = 0; i < t->part.counts[me]; i++) stats[0] += (double)t->gshard[i] * t->gshard[i];
    KILN_TRY(comm->allreduce_sum_f64(comm, stats, 2));
    double gnorm = sqrt(stats[0]);
    if (!isfinite(gnorm) || !isfinite(stats[1])) { /* nothing is updated from a non-finite step: the caller stops */
        *loss_out = stats[1] / comm->size;
        *gnorm_out = gnorm;
        *lr_out = 0;
        *ntok = 0;
        return NULL;
    }
    float scale = (c->clip > 0 && gnorm > c->clip) ? (float)(c->clip / (gnorm + 1e-6)) : 1.0f;
    kiln_schedule sched = c->sched;
    sched.total = c->steps;
    double lr = kiln_schedule_lr(&sched, step);
    /* update the tensors this rank owns */
    float *state = t->state;
    for (int i = t->part.first[me]; i < t->part.first[me + 1]; i++) {
        const kiln_opt_param *p = &t->op[i];
        float *g = t->gshard + (p->offset - t->part.displs[me]);
        if (scale != 1.0f)
            for (int64_t j = 0; j < p->numel; j++) g[j] *= scale;
        if (p->kind == KILN_OPT_MUON) kiln_muon_step(m->w + p->offset, g, state, p, &c->optim, lr, t->ws);
        else kiln_adamw_step(m->w + p->offset, g, state, p->numel, &c->optim, lr, step + 1, p->decay);
        state += kiln_optim_state_numel(p);
    }
    KILN_TRY(comm->allgather(comm, m->w, t->part.counts, t->part.displs));
    KILN_TRY(balance_step(t, c, comm));
    *loss_out = stats[1] / comm->size;
    *gnorm_out = gnorm;
    *lr_out = lr;
    *ntok = accum * c->micro_batch * c->seq_len * comm->size;
    return NULL;
}

/* ckpt_deferred_from > 0: this step took the checkpoint that came due at that step and was deferred */
static void log_metrics(trainer *t, const kiln_train_config *c, int64_t step, double loss, double val, double lr,
                        double gnorm, double tokens, double tps, double mfu, int64_t ckpt_deferred_from) {
    if (!t->metrics) return;
    fprintf(t->metrics, "{\"step\":%lld,\"loss\":%.6f,", (long long)step, loss);
    if (!isnan(val)) fprintf(t->metrics, "\"val_loss\":%.6f,", val);
    if (ckpt_deferred_from > 0) fprintf(t->metrics, "\"ckpt_deferred_from\":%lld,", (long long)ckpt_deferred_from);
    fprintf(t->metrics, "\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens\":%.0f,\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"imbalance\":[",
            lr, gnorm, tokens, tps, mfu);
    for (int64_t l = 0; l < c->model.num_layers; l++) fprintf(t->metrics, l ? ",%.3f" : "%.3f", t->imbalance[l]);
    /* per layer: each class's share of the routed tokens (the last one is the skip expert) */
    const int64_t E1 = c->model.num_experts + 1;
    fprintf(t->metrics, "],\"load\":[");
    for (int64_t l = 0; l < c->model.num_layers; l++) {
        int64_t tot = 0;
        for (int64_t e = 0; e < E1; e++) tot += t->counts[l * E1 + e];
        fprintf(t->metrics, l ? ",[" : "[");
        for (int64_t e = 0; e < E1; e++)
            fprintf(t->metrics, e ? ",%.4f" : "%.4f", tot ? (double)t->counts[l * E1 + e] / (double)tot : 0.0);
        fprintf(t->metrics, "]");
    }
    fprintf(t->metrics, "]}\n");
    fflush(t->metrics);
}

/* KILN_CUDA_PROFILE: the last step's time by op class (CUDA events on the model's stream), rank 0. */
static kiln_error *print_profile(trainer *t, kiln_comm *comm, double step_s) {
    kiln_zaya_cuda_prof_row rows[64];
    int n = 0;
    double span = 0, sum = 0;
    KILN_TRY(kiln_zaya_cuda_profile_report(t->gpu, rows, 64, &n, &span));
    if (comm->rank) return NULL;
    printf("\nper-op time of the last step (CUDA events; step wall time %.1f ms, first to last event %.1f ms):\n",
           step_s * 1e3, span);
    printf("  %-40s %10s %7s %6s\n", "op class", "ms", "share", "calls");
    for (int i = 0; i < n; i++) sum += rows[i].side ? 0 : rows[i].ms;
    for (int i = 0; i < n; i++)
        if (!rows[i].side)
            printf("  %-40s %10.2f %6.1f%% %6d\n", rows[i].cls, rows[i].ms, 100 * rows[i].ms / (step_s * 1e3),
                   rows[i].calls);
    printf("  %-40s %10.2f %6.1f%%\n", "sum of the ops", sum, 100 * sum / (step_s * 1e3));
    /* the overlapped optimizer runs on its own stream beside the model's: its time is not the step's (the
     * next forward's waits for it, above, are), and it is not in the sum */
    for (int i = 0; i < n; i++)
        if (rows[i].side)
            printf("  beside the model's stream: %s %.2f ms (%d)\n", rows[i].cls, rows[i].ms, rows[i].calls);
    /* ZeRO-1's collectives run between the backward and the optimizer (the reduce-scatter's part the backward did not
     * hide, by default), and after it, with the model's stream idle: their host wall time is part of the
     * step, and not of the ops above */
    if (comm->size > 1)
        printf("  %-40s %10.2f %6.1f%%\n  %-40s %10.2f %6.1f%%\n",
               t->rs_overlap ? "gradient reduce-scatter, after the backward"
                             : "gradient reduce-scatter (host wall, idle GPU)",
               t->rs_s * 1e3, 100 * t->rs_s / step_s, "parameter all-gather (host wall, idle GPU)", t->ag_s * 1e3,
               100 * t->ag_s / step_s);
    if (comm->size > 1) { /* what they move, for the bus bandwidth */
        const double all = (double)kiln_zaya_cuda_numel(t->gpu);
        double ag = 0;
        for (int k = 0; k < t->ngruns; k++) ag += (double)t->gruns[k].n * (t->gruns[k].f32 ? 4 : 2);
        printf("  (the reduce-scatter %.3f GB of f32 gradients; the all-gather %.3f GB, %s)\n", all * 4 / 1e9,
               (t->gruns ? ag : all * 4) / 1e9,
               t->gruns ? "the GEMM weights as bf16, the rest as f32 masters" : "every f32 master: KILN_ZERO1_GATHER=f32");
    }
    return NULL;
}

/* kiln run's heartbeat; nothing outside it. Posted to the background writer: the training thread only copies it
 * (the file's rename costs 0.3-1.5 ms on ext4). An error of an earlier beat's write comes back here, and stops the
 * trainer as a failed beat always has. */
static kiln_error *beat(trainer *t, const kiln_train_config *c, kiln_comm *comm, int64_t step, const char *phase,
                        double loss, double gnorm, double step_s) {
    if (!t->hbw) return NULL;
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    kiln_heartbeat *h = &t->hb; /* keeps the recent steps */
    h->rank = comm->rank, h->world = comm->size, h->attempt = t->ft.attempt, h->pid = (long)getpid();
    h->step = step, h->steps = c->steps, h->loss = loss, h->grad_norm = gnorm, h->local_grad_norm = t->local_gnorm;
    h->step_s = step_s, h->compute_s = t->compute_s, h->time = w.tv_sec + w.tv_nsec * 1e-9;
    snprintf(h->phase, sizeof h->phase, "%s", phase);
    if (!strcmp(phase, "train")) kiln_heartbeat_record(h, step, loss, gnorm);
    return kiln_heartbeat_writer_post(t->hbw, h);
}

/* Everything posted is on disk: before a checkpoint (a committed checkpoint of a step the supervisor could never
 * judge, its line lost with a crash, would be resumed from unjudged), and before an injected kill or stop as a step
 * begins (the fault stands for a crash after the previous step's beat, as when beats were written synchronously). */
static kiln_error *beat_flush(trainer *t) { return t->hbw ? kiln_heartbeat_writer_flush(t->hbw) : NULL; }

/* kiln run's environment and the config's skipped windows; checkpoints trained on a bad window
 * are set aside before resuming. */
static kiln_error *ft_start(trainer *t, const kiln_train_config *c, kiln_comm *comm) {
    KILN_TRY(kiln_ft_env_read(&t->ft));
    KILN_TRY(kiln_step_ranges_parse(c->skip_steps, &t->ft.skip));
    /* KILN_FAULT's hooks change the gradient after the backward: the reduce-scatter waits for them (setup_cuda,
     * which ran before, chose the reduce-scatter inside the backward) */
    if (t->ft.faults.n) t->rs_overlap = 0;
    if (t->ft.heartbeat_dir[0]) KILN_TRY(kiln_heartbeat_writer_open(t->ft.heartbeat_dir, &t->hbw)); /* its thread */
    int n = 0;
    if (comm->rank == 0 && t->ft.reject_from > 0) {
        KILN_TRY(kiln_ft_reject_checkpoints(c->out_dir, t->ft.reject_from, &n));
        if (n) kiln_log(KILN_LOG_WARN, "set aside %d checkpoint%s of step >= %lld (trained on a bad data window)", n,
                        n > 1 ? "s" : "", (long long)t->ft.reject_from);
    }
    return comm->barrier(comm);
}

/* The step of a metrics.jsonl record: the line starts {"step":N (log_metrics writes that); 0 for another line. */
static int record_step(const char *line, size_t len, int64_t *step) {
    static const char key[] = "{\"step\":";
    if (len <= sizeof key - 1 || memcmp(line, key, sizeof key - 1)) return 0;
    int64_t s = 0;
    size_t i = sizeof key - 1, d = 0;
    for (; i < len && line[i] >= '0' && line[i] <= '9' && d < 18; i++, d++) s = 10 * s + (line[i] - '0');
    if (!d) return 0;
    *step = s;
    return 1;
}

/* Resuming from step S: the records of steps after S are an abandoned timeline's (the run went past S before and
 * resumes from an older checkpoint: newer ones invalid, set aside by kiln run, or removed); they would appear twice
 * once the run passes them again. Everything else is kept, a last line cut short by a crash too (terminated, so that
 * the next record is not glued to it); the file is replaced atomically (temp file, fsync, rename), and only when
 * something changes. */
static kiln_error *metrics_keep_upto(const char *path, int64_t S) {
    char *text = NULL;
    size_t len = 0;
    kiln_error *e = kiln_read_file(path, &text, &len);
    if (e && kiln_error_code(e) == KILN_ENOTFOUND) {
        kiln_error_free(e);
        return NULL; /* nothing to keep */
    }
    if (e) return kiln_error_wrap(e, "resuming from step %lld", (long long)S);
    char *out = malloc(len + 2);
    if (!out) {
        free(text);
        return kiln_errorf(KILN_ENOMEM, "%s", path);
    }
    size_t n = 0, dropped = 0;
    int torn = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        const size_t l = nl ? (size_t)(nl - (text + at)) + 1 : len - at;
        int64_t step = 0;
        if (record_step(text + at, l, &step) && step > S) dropped++;
        else {
            memcpy(out + n, text + at, l);
            n += l;
            if (!nl) out[n++] = '\n', torn = 1;
        }
        at += l;
    }
    if (dropped || torn) e = kiln_write_file_atomic(path, out, n);
    if (!e && dropped)
        kiln_log(KILN_LOG_INFO, "%s: dropped %zu record%s of steps after %lld (an abandoned timeline)", path, dropped,
                 dropped > 1 ? "s" : "", (long long)S);
    free(out);
    free(text);
    return e;
}

/* Opens out_dir/metrics.jsonl (rank 0), creating out_dir and its parents. A fresh run starts the file over (as
 * always); a resumed one keeps the records up to its step and appends (metrics_keep_upto); a --resume that found no
 * checkpoint at all starts over too, but moves an existing file aside first (metrics.jsonl.1, .2, ...; a warning says
 * where) instead of truncating it: those records may be all that is left of a run whose checkpoints are gone. */
static kiln_error *open_metrics(trainer *t, const kiln_train_config *c, int resume, int resumed, int64_t start) {
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->out_dir);
    KILN_TRY(kiln_mkdirs(c->out_dir));
    struct stat sb;
    if (resumed) KILN_TRY(metrics_keep_upto(path, start));
    else if (resume && stat(path, &sb) == 0 && sb.st_size > 0) {
        char aside[1300];
        int k = 1;
        for (; k < 10000; k++) {
            snprintf(aside, sizeof aside, "%s.%d", path, k);
            if (access(aside, F_OK) != 0 && errno == ENOENT) break;
        }
        if (k == 10000) return kiln_errorf(KILN_EIO, "%s: no free name to move it aside as (%s.1 to .9999 exist)", path, path);
        if (rename(path, aside))
            return kiln_errorf(KILN_EIO, "%s: cannot move it aside to %s: %s", path, aside, strerror(errno));
        KILN_TRY(kiln_fsync_path(c->out_dir));
        kiln_log(KILN_LOG_WARN, "no checkpoint to resume from: starting from step 0; the previous %s is kept as %s", path,
                 aside);
    }
    if (!(t->metrics = fopen(path, resumed ? "a" : "w")))
        return kiln_errorf(KILN_EIO, "%s: cannot write: %s", path, strerror(errno));
    return NULL;
}

kiln_error *kiln_train(const kiln_train_config *c, const kiln_train_opts *o, kiln_comm *comm, double *final_loss) {
    KILN_TRY(kiln_train_config_validate(c));
    int threads = c->threads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(n / comm->size > 0 ? n / comm->size : 1);
    }
    omp_set_num_threads(threads);

    trainer t;
    memset(&t, 0, sizeof t);
    ckpt_schedule sched;
    ckpt_schedule_init(&sched, c);
    kiln_error *e = setup(&t, c, comm);
    if (!e) e = ckpt_writer_create(c->async_ckpt, &t.ckw);
    if (!e && t.gpu) { /* checkpoints read the GPU's state through a device snapshot, not the host mirrors */
        kiln_zaya_cuda_snap *snap = NULL;
        e = kiln_zaya_cuda_snap_create(t.gpu, t.gopt, t.m, t.op, t.part.first[comm->rank], t.part.first[comm->rank + 1],
                                       0, &snap);
        if (!e) e = ckpt_writer_use_cuda(t.ckw, snap);
    }
    if (!e) e = ft_start(&t, c, comm);
    int64_t start = 0;
    double tokens = 0;
    int resumed = 0; /* from a checkpoint (of step `start`) */
    if (!e && (o->resume || t.ft.resume)) {
        int64_t step = -1;
        /* rank 0 picks the checkpoint; when it cannot (step_N directories, none valid) every rank must stop, not
         * wait for a broadcast rank 0 never makes */
        kiln_error *fe = comm->rank == 0 ? ckpt_find_latest(c->out_dir, &step) : NULL;
        if (fe) step = -2;
        e = comm->broadcast(comm, &step, sizeof step, 0);
        if (fe) kiln_error_free(e), e = fe;
        else if (!e && step == -2) e = kiln_errorf(KILN_EINVAL, "resuming: rank 0 found no valid checkpoint");
        if (!e && step >= 0) {
            ckpt_view v = view_of(&t, c, 0, 0);
            e = ckpt_load(comm, step, &v);
            if (!e) e = kiln_loader_set_state(t.train, &t.loader_states[comm->rank]);
            if (!e) e = host_to_cuda(&t);
            start = v.step;
            tokens = v.tokens_seen;
            resumed = !e;
            if (!e) ckpt_writer_known_valid(t.ckw, step);
            if (!e && comm->rank == 0 && !o->quiet) printf("resumed from step %lld\n", (long long)start);
        } else if (!e && comm->rank == 0 && !o->quiet) {
            printf("no checkpoint in %s/ckpt: starting from step 0\n", c->out_dir);
        }
    }
    if (!e && comm->rank == 0) {
        int64_t newest = -1;
        const int n = ckpt_count_newer(c->out_dir, start, &newest);
        if (n)
            kiln_log(KILN_LOG_WARN, "%s/ckpt holds %d checkpoint%s newer than step %lld (up to step_%08lld): an abandoned "
                     "timeline's or another run's. They are left in place and not counted by run.keep_last until this "
                     "run passes their step; --resume takes the newest valid checkpoint, which may be one of them",
                     c->out_dir, n, n > 1 ? "s" : "", (long long)start, (long long)newest);
    }
    if (!e && comm->rank == 0) e = open_metrics(&t, c, o->resume || t.ft.resume, resumed, start);
    const double fpt = t.m ? 3.0 * flops_per_token(t.m, c->seq_len) : 0;
    const double peak = (t.gpu ? 989e12 /* H200 dense bf16 */ : cpu_peak_flops(threads)) * comm->size;
    const int tty = isatty(1);
    double t0 = now(), last = 0, run_tokens = 0;
    int64_t step = start;
    if (!e) e = beat(&t, c, comm, start, "start", NAN, NAN, 0);
    if (!e && comm->rank == 0 && !o->quiet)
        printf("training %.2fM parameters on %d rank%s x %d threads: %lld steps of %lld tokens\n", t.m->numel / 1e6,
               comm->size, comm->size > 1 ? "s" : "", threads, (long long)c->steps,
               (long long)(c->grad_accum * c->micro_batch * c->seq_len * comm->size));
    while (!e && step < c->steps) {
        double loss = 0, gnorm = 0, lr = 0, val = NAN;
        int64_t ntok = 0;
        const int skipped = kiln_step_ranges_contains(&t.ft.skip, step + 1);
        if (t.ft.faults.n && (kiln_faults_find(&t.ft.faults, KILN_FAULT_KILL, comm->rank, step + 1, t.ft.attempt) ||
                              kiln_faults_find(&t.ft.faults, KILN_FAULT_STOP, comm->rank, step + 1, t.ft.attempt)) &&
            (e = beat_flush(&t)))
            break;
        kiln_ft_fault_step_begin(&t.ft, comm->rank, step + 1);
        double ts = now();
        const int prof = t.gpu && step + 1 == c->steps && getenv("KILN_CUDA_PROFILE") && !skipped;
        if (prof) kiln_zaya_cuda_profile_start(t.gpu);
        e = one_step(&t, c, comm, step, &loss, &gnorm, &lr, &ntok);
        if (!e && prof) e = print_profile(&t, comm, now() - ts);
        if (e) break;
        step++;
        tokens += (double)ntok;
        run_tokens += (double)ntok;
        if (!skipped) last = loss;
        e = beat(&t, c, comm, step, skipped ? "skip" : "train", loss, gnorm, now() - ts);
        if (!e && !skipped && (!isfinite(loss) || !isfinite(gnorm)))
            e = kiln_errorf(KILN_EINVAL, "loss %g, gradient norm %g at step %lld: stopping (lower optim.lr?)", loss, gnorm,
                            (long long)step);
        if (e) break;
        if (t.val && c->eval_every > 0 && (step % c->eval_every == 0 || step == c->steps)) e = eval_loss(&t, c, comm, &val);
        /* stop requests (Ctrl-C, --stop-after) are agreed by all ranks, then saved */
        double stop[1] = {(o->interrupted && *o->interrupted) || (o->stop_after > 0 && step - start >= o->stop_after)};
        if (!e) e = comm->allreduce_sum_f64(comm, stop, 1);
        if (!e) e = ckpt_writer_poll(t.ckw, comm, 0); /* commit a background save once every shard is written */
        /* a save due while the previous one is still being written is deferred (ckpt_schedule.c) */
        const ckpt_due due = e ? (ckpt_due){0, 0, 0}
                               : ckpt_schedule_step(&sched, step, step == c->steps, stop[0] > 0, ckpt_writer_pending(t.ckw));
        if (!e && sched.deferred_from == step && comm->rank == 0) {
            ckpt_progress p = {0};
            if (ckpt_writer_progress(t.ckw, &p)) ckpt_schedule_warn(&sched, step, &p);
            kiln_log(KILN_LOG_DEBUG, "checkpoint of step %lld deferred: the save of step %lld is still being written",
                     (long long)step, (long long)p.step);
        }
        double el = now() - t0, tps = run_tokens / el, mfu = tps * fpt / peak;
        if (!e && !skipped && comm->rank == 0 &&
            (step % c->log_every == 0 || step == c->steps || !isnan(val) || due.deferred_from)) {
            log_metrics(&t, c, step, loss, val, lr, gnorm, tokens, tps, mfu, due.deferred_from);
            if (!o->quiet) {
                double eta = (c->steps - step) * el / (double)(step - start);
                printf("%sstep %6lld/%lld  loss %.4f", tty ? "\r" : "", (long long)step, (long long)c->steps, loss);
                if (!isnan(val)) printf("  val %.4f", val);
                printf("  lr %.2e  %7.0f tok/s  MFU~%.1f%%  ETA %4.0fs%s", lr, tps, 100 * mfu, eta,
                       tty && isnan(val) && step != c->steps ? "" : "\n");
                fflush(stdout);
            }
        }
        if (!e && due.save) {
            if (due.deferred_from && comm->rank == 0)
                kiln_log(KILN_LOG_DEBUG, "checkpoint deferred from step %lld taken at step %lld", (long long)due.deferred_from,
                         (long long)step);
            /* kiln run: rank 0's step log tells of this checkpoint (after step's own line; the flush below writes both
             * before the checkpoint can exist), so that the supervisor keeps the window of losses before it */
            if (t.hbw && comm->rank == 0) e = kiln_heartbeat_writer_checkpoint(t.hbw, t.ft.attempt, step);
            if (!e) e = beat_flush(&t);
            if (!e) e = gather_loader_states(&t, comm);
            ckpt_view v = view_of(&t, c, step, tokens);
            if (!e) e = kiln_ft_fault_before_save(&t.ft, comm->rank, step);
            const kiln_fault *slow = kiln_ft_fault_slow_save(&t.ft, comm->rank, step);
            ckpt_writer_set_slow(t.ckw, slow ? slow->ms : 0, slow ? slow->steps : 0);
            if (!e) e = ckpt_writer_save(t.ckw, comm, &v, due.wait);
            if (!e && ckpt_writer_waited(t.ckw, NULL)) {
                if (due.wait) sched.waited_must++;
                else sched.waited_other++;
            }
        }
        if (!e && stop[0] > 0) {
            /* under kiln run the supervisor resumes it (the same kiln run command again, after a Ctrl-C) */
            if (comm->rank == 0 && !o->quiet)
                printf("\nstopped at step %lld; checkpoint saved, %s\n", (long long)step,
                       t.ft.heartbeat_dir[0] ? "kiln run resumes from it" : "resume with --resume");
            break;
        }
    }
    if (!e && t.gpu && step >= c->steps && c->save_final) e = cuda_to_host(&t, comm);
    if (!e && t.gpu && comm->rank == 0 && !o->quiet) {
        kiln_zaya_cuda_mem mem;
        e = kiln_zaya_cuda_memory(t.gpu, &mem);
        if (!e)
            printf("GPU memory: parameters %.2f GiB, gradients %.2f GiB, optimizer state %.2f GiB, activations %.2f GiB "
                   "(+ backward scratch %.2f GiB), ops' pool peak %.2f GiB; device peak in use %.2f GiB\n",
                   mem.param_bytes / 1073741824.0, mem.grad_bytes / 1073741824.0,
                   kiln_zaya_cuda_opt_state_numel(t.gopt) * 4 / 1073741824.0, mem.arena_bytes / 1073741824.0,
                   mem.scratch_bytes / 1073741824.0, mem.pool_high_bytes / 1073741824.0,
                   mem.device_used_high / 1073741824.0);
    }
    if (!e && comm->rank == 0 && step >= c->steps && c->save_final) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/model", c->out_dir);
        e = kiln_zaya_save_dir(t.m, dir);
        if (!e && !o->quiet) printf("saved %s (HF ZAYA format)\n", dir);
    }
    if (!e && step >= c->steps) e = beat(&t, c, comm, step, "done", last, NAN, 0);
    /* the last beats on disk before the process exits, on every path (done, stopped, an error); an error of theirs
     * fails the run as a failed beat always has */
    kiln_error *he = kiln_heartbeat_writer_close(t.hbw);
    t.hbw = NULL;
    if (he && e) {
        kiln_log(KILN_LOG_WARN, "%s", kiln_error_msg(he));
        kiln_error_free(he);
    } else if (he) e = he;
    if (comm->rank == 0) ckpt_schedule_report(&sched);
    if (final_loss) *final_loss = last;
    trainer_free(&t);
    return e;
}
