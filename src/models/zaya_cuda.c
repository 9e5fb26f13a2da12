/* The ZAYA model on the GPU (include/kiln/zaya_cuda.h): the steps of zaya_forward.c and zaya_backward.c
 * in the same order, each through its CUDA twin (include/kiln/cuda_ops.h). Where the CPU keeps an f32
 * activation the GPU keeps bf16, except the residual stream (x, res1, the layer outputs) and the MoE output
 * (f32), the router's logits and probabilities (f32: routing decisions are taken on them) and the saved
 * norm statistics. Each residual join runs fused with the RMSNorm that reads it (residual_norm.cu), the
 * CCA convolutions with the q/k coupling (cca_conv_fused.cu).
 * Everything runs on one stream; the experts synchronize it once per layer (their row counts). On one rank
 * the trainer's optimizer step runs on a second stream of lower priority, overlapped with the next forward:
 * the forward waits for each slice of tensors just before it first reads them (opt_need), and for the whole
 * step before the LM head (opt_join); everything else that reads the parameters, the optimizer state or the
 * gradients joins first. */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/cuda.h"
#include "kiln/zaya_cuda.h"
#include "zaya_internal.h"

/* ---- which tensors this file reads as f32 (kiln_zaya_cuda_reads_f32); host only, built with or without CUDA ----
 * The fields below are read only through BF(): the GEMMs' weights and biases. Any other field's f32 master is read
 * by a kernel (the embedding, norms, residual scales, the CCA convolutions and temperature, the value shift's bvd,
 * the router's state scale and norm). A tensor is bf16-only when every field in it is listed here (a tied LM head
 * is the embedding's tensor, which is read as f32). Keep this list in step with the BF() calls: a field missing
 * here only costs a several-rank all-gather bytes; a field listed here that a kernel reads as f32 would read stale
 * values on the ranks that do not own it (the GPU test gpu_zaya_train_gather_bf16_staged compares the bits). */
static const size_t bf16_only_layer_fields[] = {
    offsetof(kiln_zaya_layer_ptrs, wq),       offsetof(kiln_zaya_layer_ptrs, bq),
    offsetof(kiln_zaya_layer_ptrs, wk),       offsetof(kiln_zaya_layer_ptrs, bk),
    offsetof(kiln_zaya_layer_ptrs, wvc),      offsetof(kiln_zaya_layer_ptrs, bvc),
    offsetof(kiln_zaya_layer_ptrs, wvd),      offsetof(kiln_zaya_layer_ptrs, wo),
    offsetof(kiln_zaya_layer_ptrs, bo),       offsetof(kiln_zaya_layer_ptrs, r_down_w),
    offsetof(kiln_zaya_layer_ptrs, r_down_b), offsetof(kiln_zaya_layer_ptrs, r_fc1_w),
    offsetof(kiln_zaya_layer_ptrs, r_fc1_b),  offsetof(kiln_zaya_layer_ptrs, r_fc2_w),
    offsetof(kiln_zaya_layer_ptrs, r_fc2_b),  offsetof(kiln_zaya_layer_ptrs, r_out_w),
    offsetof(kiln_zaya_layer_ptrs, gate_up),  offsetof(kiln_zaya_layer_ptrs, down),
};
static const size_t bf16_only_top_fields[] = {offsetof(kiln_zaya_ptrs, lm_head_w), offsetof(kiln_zaya_ptrs, lm_head_b)};

static int listed(const size_t *list, size_t n, size_t field) {
    for (size_t i = 0; i < n; i++)
        if (list[i] == field) return 1;
    return 0;
}

/* the tensor holding element off of the host layout (params are in offset order) */
static int host_tensor_at(const kiln_zaya *m, size_t off) {
    int lo = 0, hi = m->nparams - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->params[mid].offset <= off) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* seen[t]: bit 0 a bf16-only field lies in tensor t, bit 1 another field does */
static void mark_fields(const kiln_zaya *m, const void *table, size_t bytes, const size_t *list, size_t nlist,
                        unsigned char *seen) {
    for (size_t f = 0; f < bytes / sizeof(float *); f++) {
        const float *p;
        memcpy(&p, (const char *)table + f * sizeof(float *), sizeof p);
        if (p) seen[host_tensor_at(m, (size_t)(p - m->w))] |= listed(list, nlist, f * sizeof(float *)) ? 1 : 2;
    }
}

kiln_error *kiln_zaya_cuda_reads_f32(const kiln_zaya *m, unsigned char *f32) {
    unsigned char *seen = calloc((size_t)(m->nparams ? m->nparams : 1), 1);
    if (!seen) return kiln_errorf(KILN_ENOMEM, "ZAYA: the tensors' read precision");
    kiln_zaya_ptrs top = m->W;
    top.layers = NULL; /* the layer table is not a parameter */
    mark_fields(m, &top, sizeof top, bf16_only_top_fields, sizeof bf16_only_top_fields / sizeof(size_t), seen);
    for (int64_t l = 0; l < m->cfg.num_layers; l++)
        mark_fields(m, &m->W.layers[l], sizeof(kiln_zaya_layer_ptrs), bf16_only_layer_fields,
                    sizeof bf16_only_layer_fields / sizeof(size_t), seen);
    for (int i = 0; i < m->nparams; i++) f32[i] = seen[i] != 1; /* unbound tensors too: f32 is always safe */
    free(seen);
    return NULL;
}

/* ---- when the backward has finished each tensor's gradient (kiln_zaya_cuda_grad_stages); host only ----
 * Stage 0: after the LM head's backward and the final norm's (with the last layer's MLP join); stage nl - l: after
 * layer l's backward and its input norm's (with layer l-1's MLP join, or the input scale and bias for layer 0);
 * stage nl + 1: the end, after the embedding's backward and the join of layer 0's expert weight gradients. A layer's
 * expert weights are written on side streams beside the rest of that layer and the next layer down
 * (kiln_experts_backward_cuda's dw_defer), which that next layer's experts backward joins first: stage nl - l + 1
 * for layer l >= 1. Everything else of layer l is written by the end of its stage (its post-MLP scale's hidden-state
 * side earlier, by layer l+1's join). A tensor's stage is the latest of its fields'; a tensor no field binds is
 * finished at the end. Keep in step with kiln_zaya_cuda_backward: a tensor staged too early is handed to the
 * reduce-scatter unfinished (gpu_zaya_train_rs_overlap_staged compares the bits). Below, l >= 0: a field of layer l's
 * pointers; l < 0: of the top-level ones. */
static int field_stage(size_t field, int64_t l, int64_t nl) {
    if (l >= 0) {
        const int expert = field == offsetof(kiln_zaya_layer_ptrs, gate_up) || field == offsetof(kiln_zaya_layer_ptrs, down);
        return (int)(nl - l) + expert;
    }
    if (field == offsetof(kiln_zaya_ptrs, norm) || field == offsetof(kiln_zaya_ptrs, lm_head_w) ||
        field == offsetof(kiln_zaya_ptrs, lm_head_b))
        return 0;
    if (field == offsetof(kiln_zaya_ptrs, in_scale) || field == offsetof(kiln_zaya_ptrs, in_bias)) return (int)nl;
    return (int)nl + 1; /* the embedding (with a tied LM head: the same tensor, the later stage) */
}
static void stage_fields(const kiln_zaya *m, const void *table, size_t bytes, int64_t l, int *stage) {
    for (size_t f = 0; f < bytes / sizeof(float *); f++) {
        const float *p;
        memcpy(&p, (const char *)table + f * sizeof(float *), sizeof p);
        if (!p) continue;
        const int i = host_tensor_at(m, (size_t)(p - m->w));
        const int s = field_stage(f * sizeof(float *), l, m->cfg.num_layers);
        if (s > stage[i]) stage[i] = s;
    }
}

void kiln_zaya_cuda_grad_stages(const kiln_zaya *m, int *stage) {
    const int64_t nl = m->cfg.num_layers;
    for (int i = 0; i < m->nparams; i++) stage[i] = -1;
    kiln_zaya_ptrs top = m->W;
    top.layers = NULL; /* the layer table is not a parameter */
    stage_fields(m, &top, sizeof top, -1, stage);
    for (int64_t l = 0; l < nl; l++) stage_fields(m, &m->W.layers[l], sizeof(kiln_zaya_layer_ptrs), l, stage);
    for (int i = 0; i < m->nparams; i++)
        if (stage[i] < 0) stage[i] = (int)nl + 1;
}

#ifndef KILN_HAVE_CUDA

kiln_error *kiln_zaya_cuda_create(const kiln_zaya *m, int64_t B, int64_t T, int recompute, kiln_zaya_cuda **out) {
    (void)m, (void)B, (void)T, (void)recompute;
    *out = NULL;
    return kiln_errorf(KILN_EINVAL, "the ZAYA model on CUDA: kiln was built without CUDA");
}
void kiln_zaya_cuda_free(kiln_zaya_cuda *g) { (void)g; }
#define NOCUDA return kiln_errorf(KILN_EINVAL, "kiln was built without CUDA")
kiln_error *kiln_zaya_cuda_upload_params(kiln_zaya_cuda *g, const float *w) { (void)g, (void)w; NOCUDA; }
kiln_error *kiln_zaya_cuda_upload_balancing(kiln_zaya_cuda *g, const float *b) { (void)g, (void)b; NOCUDA; }
kiln_error *kiln_zaya_cuda_download_params(kiln_zaya_cuda *g, float *w) { (void)g, (void)w; NOCUDA; }
kiln_error *kiln_zaya_cuda_download_grads(kiln_zaya_cuda *g, float *d) { (void)g, (void)d; NOCUDA; }
kiln_error *kiln_zaya_cuda_refresh_bf16(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
kiln_error *kiln_zaya_cuda_refresh_bf16_range(kiln_zaya_cuda *g, size_t off, size_t n) { (void)g, (void)off, (void)n; NOCUDA; }
kiln_error *kiln_zaya_cuda_grads_zero(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
void kiln_zaya_cuda_grads_mark_zero(kiln_zaya_cuda *g) { (void)g; }
void kiln_zaya_cuda_set_deterministic(kiln_zaya_cuda *g, int on) { (void)g, (void)on; }
int kiln_zaya_cuda_grad_overwritten(const kiln_zaya_cuda *g, int i) { (void)g, (void)i; return 0; }
kiln_error *kiln_zaya_cuda_set_expert_grads_bf16(kiln_zaya_cuda *g, int on) { (void)g, (void)on; NOCUDA; }
kiln_error *kiln_zaya_cuda_set_master_split(kiln_zaya_cuda *g, int on) { (void)g, (void)on; NOCUDA; }
int kiln_zaya_cuda_master_is_split(const kiln_zaya_cuda *g) { (void)g; return 0; }
kiln_error *kiln_zaya_cuda_master_f32(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
kiln_error *kiln_zaya_cuda_master_split(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
int kiln_zaya_cuda_grad_bf16(const kiln_zaya_cuda *g, int i) { (void)g, (void)i; return 0; }
kiln_error *kiln_zaya_cuda_grad_sumsq(kiln_zaya_cuda *g, double *out) { (void)g, (void)out; NOCUDA; }
int kiln_zaya_cuda_expert_sumsq_given(const kiln_zaya_cuda *g) { (void)g; return 0; }
kiln_error *kiln_zaya_cuda_grads_zero_added(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
float *kiln_zaya_cuda_params(kiln_zaya_cuda *g) { (void)g; return NULL; }
size_t kiln_zaya_cuda_numel(const kiln_zaya_cuda *g) { (void)g; return 0; }
size_t kiln_zaya_cuda_param_offset(const kiln_zaya_cuda *g, int i) { (void)g, (void)i; return 0; }
uint16_t *kiln_zaya_cuda_params_bf16(kiln_zaya_cuda *g) { (void)g; return NULL; }
float *kiln_zaya_cuda_grads(kiln_zaya_cuda *g) { (void)g; return NULL; }
void *kiln_zaya_cuda_stream(kiln_zaya_cuda *g) { (void)g; return NULL; }
kiln_error *kiln_zaya_cuda_sync(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
kiln_error *kiln_zaya_cuda_forward(kiln_zaya_cuda *g, const int64_t *ids, double *loss) { (void)g, (void)ids, (void)loss; NOCUDA; }
kiln_error *kiln_zaya_cuda_logits(kiln_zaya_cuda *g, float *l) { (void)g, (void)l; NOCUDA; }
kiln_error *kiln_zaya_cuda_backward(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
kiln_error *kiln_zaya_cuda_set_grads_ready(kiln_zaya_cuda *g, kiln_zaya_cuda_grads_ready_fn fn, void *ctx) {
    (void)g, (void)fn, (void)ctx;
    NOCUDA;
}
kiln_error *kiln_zaya_cuda_grads_clear_empty(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
const uint32_t *kiln_zaya_cuda_zero_mask(const kiln_zaya_cuda *g) { (void)g; return NULL; }
int kiln_zaya_cuda_grad_zero_groups(const kiln_zaya_cuda *g, int i, int64_t *zn) { (void)g, (void)i; *zn = 0; return 0; }
kiln_error *kiln_zaya_cuda_loss(kiln_zaya_cuda *g, double *loss) { (void)g, (void)loss; NOCUDA; }
int kiln_zaya_cuda_overlap_slices(const kiln_zaya_cuda *g, const int **first) { (void)g; *first = NULL; return 0; }
kiln_error *kiln_zaya_cuda_overlap_begin(kiln_zaya_cuda *g, void **stream) { (void)g; *stream = NULL; NOCUDA; }
kiln_error *kiln_zaya_cuda_overlap_slice_done(kiln_zaya_cuda *g, int k) { (void)g, (void)k; NOCUDA; }
kiln_error *kiln_zaya_cuda_overlap_end(kiln_zaya_cuda *g) { (void)g; NOCUDA; }
kiln_error *kiln_zaya_cuda_route_counts(kiln_zaya_cuda *g, int64_t *c) { (void)g, (void)c; NOCUDA; }
kiln_error *kiln_zaya_cuda_memory(kiln_zaya_cuda *g, kiln_zaya_cuda_mem *m) { (void)g, (void)m; NOCUDA; }
void kiln_zaya_cuda_profile_start(kiln_zaya_cuda *g) { (void)g; }
void kiln_zaya_cuda_profile_push(kiln_zaya_cuda *g, const char *cls) { (void)g, (void)cls; }
void kiln_zaya_cuda_profile_pop(kiln_zaya_cuda *g) { (void)g; }
kiln_error *kiln_zaya_cuda_profile_report(kiln_zaya_cuda *g, kiln_zaya_cuda_prof_row *rows, int max_rows, int *nrows,
                                          double *span_ms) {
    (void)g, (void)rows, (void)max_rows, (void)span_ms;
    *nrows = 0;
    NOCUDA;
}

#else

#include <cuda_runtime.h>

#include "kiln/cuda_ops.h"
#include "kiln/dtype.h"

typedef kiln_bf16 bf;

/* One layer's saved activations on the device (the GPU form of zaya_layer_acts). */
typedef struct {
    float *x;            /* [N,H] layer input (residual stream) */
    bf *ln1;             /* [N,H] */
    float *ln1_r;        /* [N] (one per layer also when recomputing: the backward of layer l's ln1 runs after
                          * layer l-1 is recomputed, fused with that layer's MLP join) */
    bf *qkv;             /* [N,Q+2K] CCA's four projections of ln1: q, k (the convolution input [q | k]) and
                          * the value's current and delayed halves, in proj_view's layout */
    bf *mid;             /* [B,T+k1-1,C] the depthwise convolution's output */
    bf *qpre, *kpre;     /* [N,Q], [N,K] the convolutions plus the q/k coupling */
    float *qinv, *kinv;  /* [N,NH], [N,KV] */
    bf *qr, *kr, *v;     /* [N,Q], [N,K], [N,K] */
    bf *att;             /* [N,Q] */
    float *lse;          /* [B,NH,T] */
    bf *o;               /* [N,H] o_proj output (the residual join's first input) */
    float *res1;         /* [N,H] */
    bf *ln2;             /* [N,H] */
    float *ln2_r;
    bf *rdown, *rn;      /* [N,R] */
    float *rn_r;
    bf *f1, *a1, *f2, *a2; /* [N,R] */
    float *rprobs;       /* [N,E1] */
    int32_t *choice;     /* [S] */
    float *gate;         /* [S] */
    int32_t *exp_off, *exp_off_host, *slot_tok, *slot_k, *tok_slot;
    int64_t nslots;
    bf *xe, *gu, *act, *ye; /* [S,H], [S,2I], [S,I], [S,H] */
    float *moe;          /* [N,H] the experts' gated sum; NULL where the MLP join forms it from ye (moe_gather) */
} glayer;

/* One backward's scratch, reused by every layer. */
typedef struct {
    float *dres, *dnext, *dmoe, *dln2f;                /* [N,H] f32 */
    bf *dob, *dln1, *dhn;                              /* [N,H] bf16 */
    bf *dye, *dact, *dgu, *dxe;                        /* experts */
    float *dgate;                                      /* [S] */
    bf *dlogitb;                                       /* [N,E1] */
    bf *da2, *df2, *da1, *df1, *drn, *dxn, *drs;       /* [N,R] */
    float *carry_a, *carry_b, *prod;                   /* [N,R] f32 */
    bf *datt, *dqr, *dqpre;                            /* [N,Q] */
    bf *dkr, *dv, *dkpre;                              /* [N,K] */
    bf *dqkv;                                          /* [N,Q+2K] the four projections' gradients (proj_view) */
    float *dmid;                                       /* [B,T+k1-1,C] */
    float *dx0;                                        /* [N,H] */
    void *attn_work;
} gscratch;

struct kiln_zaya_cuda {
    const kiln_zaya *m;
    int64_t B, T;
    int recompute;
    int deterministic; /* bit-identical runs (1, the default); 0: cuDNN's atomic-dQ attention backward */
    cudaStream_t stream;   /* the model's (the greatest priority) */
    cudaStream_t ostream;  /* the overlapped optimizer's (the least priority) */
    int proj_separate;     /* KILN_CCA_PROJ=separate: CCA's four projections as four GEMMs (proj_view) */
    int moe_gather;        /* top-1: the MLP join reads the experts' rows ye through tok_slot and gate (no moe) */
    int dln2_pair;         /* with moe_gather: ln2's backward reads the experts' input-gradient rows dxe through
                            * tok_slot and the router's bf16 one beside them (no f32 dln2 combined and added into;
                            * KILN_MOE_DLN=f32 keeps that) */
    float *w, *g;          /* f32 master parameters and gradients, numel_dev each */
    bf *wb;                /* bf16 copy, the same element offsets */
    size_t *poff, numel_dev; /* each tensor's device offset (64-element aligned: every tensor starts on a
                              * 256-byte boundary in f32 and 128 in bf16, as the GEMMs and vector loads want;
                              * the padding stays zero) and the padded total */
    float *bal;            /* [layers, E1] */
    /* pinned host staging, so that uploading the balancing biases and reading the routing counts do not wait for
     * the whole queue: the biases' upload is queued behind the optimizer step, and the host goes on to the next
     * step's launches while that runs (bal_ev: the last upload has read the staging buffer) */
    float *bal_stage;
    int64_t *counts_stage;
    cudaEvent_t bal_ev;
    float *inv_freq[2];
    kiln_zaya_ptrs W, G;   /* device pointers into w and g */
    glayer *L;
    float *x0, *xf, *hn_r;
    bf *hn, *logits;
    int64_t *ids;          /* [N] device */
    float *loss;           /* [1] device */
    int64_t *counts;       /* [layers, E1] device: the last forward's routing decisions */
    int logits_valid, layers_fresh;
    int loss_valid;        /* g->loss holds the last batch's mean loss */
    int grads_zeroed;      /* no backward since kiln_zaya_cuda_grads_zero: the experts write their dW (beta = 0) */
    int xg16;              /* the experts' weight gradients in bf16 (kiln_zaya_cuda_set_expert_grads_bf16) */
    int wsplit;            /* the experts' master weights kept split (kiln_zaya_cuda_set_master_split) */
    int wsplit_now;        /* and they are split now (not joined back to f32 for a reader of w) */
    kiln_sumsq_plan *gsq;  /* the gradient's sum of squares over its f32 and bf16 segments (xg16) */
    int nseg, *xseg;       /* its segments; layer l's two expert tensors are segments xseg[2l], xseg[2l + 1] (the
                            * first of xsegn each: one, or with xkeep one an expert) */
    int xsegn;
    /* xkeep (with xg16): an expert without rows keeps its stale weight gradient (no clearing pass): the step's zero
     * mask, bit l*E + e, says which are zero, and the gradient's sum of squares and AdamW read zeros there instead.
     * zmask: device, zwords words; zhost: the host's copy; zany: some bit is set. KILN_EMPTY_EXPERTS=clear: off. */
    int xkeep, zwords, zany;
    uint32_t *zmask, *zhost;
    unsigned char *seg_queued; /* a segment's partial sums are queued on nstream since the last backward began */
    /* the experts' weight gradients' sums of squares as their GEMM gave them (KILN_GROUPED_DW=wg, one segment an
     * expert): dwsq [layers][2E] device (gate_up's E, then down's), dwsq_ok[l]: layer l's last backward gave them */
    double *dwsq;
    unsigned char *dwsq_ok;
    cudaStream_t nstream;  /* the experts' partial sums of squares, beside the rest of the backward */
    kiln_zaya_cuda_grads_ready_fn ready_fn; /* kiln_zaya_cuda_set_grads_ready */
    void *ready_ctx;
    int *gstage;           /* each tensor's stage (kiln_zaya_cuda_grad_stages), made on the first set */
    cudaEvent_t nsq_ev, nsq_done;
    gscratch s;
    void *arena, *sarena;
    size_t arena_bytes, sarena_bytes;
    size_t used_high;
    /* the overlapped optimizer (kiln_zaya_cuda_overlap_*): slice k = tensors [slice_first[k], slice_first[k+1]),
     * slice_of[tensor]; an event after each slice on ostream, ev_main (ostream waits for the model's stream),
     * ev_done (after the whole step) */
    int nslice, *slice_first, *slice_of;
    cudaEvent_t *slice_ev, ev_main, ev_done;
    int nslice_ev;         /* events created */
    int opt_pending;       /* a step was queued on ostream and the model's stream has not waited for all of it */
    int opt_waited;        /* the last slice the model's stream waited for (-1: none) */
    int slices_recorded;   /* slices of the queued step whose events are recorded */
    /* per-op timing (kiln_zaya_cuda_profile_*): CUDA event pairs around each op, by class; side: on ostream */
    int prof;
    struct prof_ev { const char *cls; cudaEvent_t a, b; int side; } *ev;
    int nev, cap_ev, ev_created;
    int prof_depth;        /* open pairs (only the outermost is recorded) */
};

#define BF(g, p) ((p) ? (const bf *)((g)->wb + ((p) - (g)->w)) : (const bf *)NULL)

/* kiln_zaya_bind for the padded device layout: bind to the host buffer, then move every pointer to its
 * tensor's device offset (tensors are found by their host offset; a tied LM head maps to the embedding). */
static size_t dev_off(const kiln_zaya_cuda *g, size_t host_off) {
    const int i = host_tensor_at(g->m, host_off);
    return g->poff[i] + (host_off - g->m->params[i].offset);
}
static float *to_dev(const kiln_zaya_cuda *g, float *base, const float *host_p) {
    return host_p ? base + dev_off(g, (size_t)(host_p - g->m->w)) : NULL;
}
static kiln_error *bind_padded(kiln_zaya_cuda *g, float *base, kiln_zaya_ptrs *P) {
    const kiln_zaya *m = g->m;
    kiln_zaya_ptrs H = {0};
    H.layers = calloc((size_t)(m->cfg.num_layers ? m->cfg.num_layers : 1), sizeof *H.layers);
    if (!H.layers) return kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA: parameter pointers");
    kiln_zaya_bind(m, m->w, &H);
    P->embed = to_dev(g, base, H.embed), P->in_scale = to_dev(g, base, H.in_scale);
    P->in_bias = to_dev(g, base, H.in_bias), P->norm = to_dev(g, base, H.norm);
    P->lm_head_w = to_dev(g, base, H.lm_head_w), P->lm_head_b = to_dev(g, base, H.lm_head_b);
    for (int64_t l = 0; l < m->cfg.num_layers; l++) {
        float **src = (float **)&H.layers[l], **dst = (float **)&P->layers[l];
        for (size_t f = 0; f < sizeof(kiln_zaya_layer_ptrs) / sizeof(float *); f++) dst[f] = to_dev(g, base, src[f]);
    }
    free(H.layers);
    return NULL;
}

/* ---------- arena layout: one allocation, 256-byte aligned pieces ---------- */

typedef struct {
    char *base;
    size_t off;
} dbump;

static void *take(dbump *b, int64_t n, size_t elem) {
    size_t bytes = ((size_t)(n > 0 ? n : 1) * elem + 255) & ~(size_t)255;
    void *p = b->base ? b->base + b->off : NULL;
    b->off += bytes;
    return p;
}
#define TF(b, n) ((float *)take((b), (n), sizeof(float)))
#define TB(b, n) ((bf *)take((b), (n), sizeof(bf)))
#define TI(b, n) ((int32_t *)take((b), (n), sizeof(int32_t)))

static void layer_layout(const kiln_zaya_config *c, int64_t B, int64_t T, int moe, glayer *L, dbump *b) {
    const int64_t N = B * T, H = c->hidden_size, NH = c->num_heads, KV = c->num_kv_heads, D = c->head_dim;
    const int64_t Q = NH * D, K = KV * D, C = Q + K, R = c->router_hidden, E1 = c->num_experts + 1;
    const int64_t S = N * c->top_k, I = c->moe_intermediate;
    L->ln1 = TB(b, N * H);
    L->qkv = TB(b, N * (Q + 2 * K));
    L->mid = TB(b, B * (T + c->cca_time1 - 1) * C);
    L->qpre = TB(b, N * Q);
    L->kpre = TB(b, N * K);
    L->qinv = TF(b, N * NH);
    L->kinv = TF(b, N * KV);
    L->qr = TB(b, N * Q);
    L->kr = TB(b, N * K);
    L->v = TB(b, N * K);
    L->att = TB(b, N * Q);
    L->lse = TF(b, B * NH * T);
    L->o = TB(b, N * H);
    L->res1 = TF(b, N * H);
    L->ln2 = TB(b, N * H);
    L->ln2_r = TF(b, N);
    L->rn = TB(b, N * R);
    L->rn_r = TF(b, N);
    L->f1 = TB(b, N * R);
    L->a1 = TB(b, N * R);
    L->f2 = TB(b, N * R);
    L->a2 = TB(b, N * R);
    L->rprobs = TF(b, N * E1);
    L->choice = TI(b, S);
    L->gate = TF(b, S);
    L->exp_off = TI(b, E1 + 1);
    L->slot_tok = TI(b, S);
    L->slot_k = TI(b, S);
    L->tok_slot = TI(b, S);
    L->xe = TB(b, S * H);
    L->gu = TB(b, S * 2 * I);
    L->act = TB(b, S * I);
    L->ye = TB(b, S * H);
    L->moe = moe ? TF(b, N * H) : NULL;
}

/* Per-layer inputs always; the rest per layer, or one shared set when recomputing. */
static void arena_layout(struct kiln_zaya_cuda *g, dbump *b) {
    const kiln_zaya_config *c = &g->m->cfg;
    const int64_t N = g->B * g->T, H = c->hidden_size;
    g->x0 = TF(b, N * H);
    g->xf = TF(b, N * H);
    g->hn = TB(b, N * H);
    g->hn_r = TF(b, N);
    g->logits = TB(b, N * c->vocab_size);
    g->ids = (int64_t *)take(b, N, sizeof(int64_t));
    g->loss = TF(b, 1);
    g->counts = (int64_t *)take(b, c->num_layers * (c->num_experts + 1), sizeof(int64_t));
    for (int64_t l = 0; l < c->num_layers; l++) {
        glayer *L = &g->L[l];
        int32_t *host_off = L->exp_off_host;
        if (l == 0 || !g->recompute) layer_layout(c, g->B, g->T, !g->moe_gather, L, b);
        else *L = g->L[0];
        L->exp_off_host = host_off;
        L->x = TF(b, N * H);
        L->rdown = TB(b, N * c->router_hidden);
        L->ln1_r = TF(b, N);
    }
}

static void scratch_layout(struct kiln_zaya_cuda *g, dbump *b, size_t attn_work) {
    const kiln_zaya_config *c = &g->m->cfg;
    const int64_t B = g->B, T = g->T, N = B * T, H = c->hidden_size, Q = c->num_heads * c->head_dim;
    const int64_t K = c->num_kv_heads * c->head_dim, C = Q + K, R = c->router_hidden, E1 = c->num_experts + 1;
    const int64_t S = N * c->top_k, I = c->moe_intermediate;
    gscratch *s = &g->s;
    s->dres = TF(b, N * H), s->dnext = TF(b, N * H), s->dmoe = TF(b, N * H);
    s->dln2f = TF(b, N * H), s->dx0 = TF(b, N * H);
    s->dob = TB(b, N * H), s->dln1 = TB(b, N * H), s->dhn = TB(b, N * H);
    s->dye = TB(b, S * H), s->dact = TB(b, S * I), s->dgu = TB(b, S * 2 * I), s->dxe = TB(b, S * H);
    s->dgate = TF(b, S);
    s->dlogitb = TB(b, N * E1);
    s->da2 = TB(b, N * R), s->df2 = TB(b, N * R), s->da1 = TB(b, N * R), s->df1 = TB(b, N * R);
    s->drn = TB(b, N * R), s->dxn = TB(b, N * R), s->drs = TB(b, N * R);
    s->carry_a = TF(b, N * R), s->carry_b = TF(b, N * R), s->prod = TF(b, N * R);
    s->datt = TB(b, N * Q), s->dqr = TB(b, N * Q), s->dqpre = TB(b, N * Q);
    s->dkr = TB(b, N * K), s->dv = TB(b, N * K), s->dkpre = TB(b, N * K);
    s->dqkv = TB(b, N * (Q + 2 * K));
    s->dmid = TF(b, B * (T + c->cca_time1 - 1) * C);
    s->attn_work = take(b, (int64_t)attn_work, 1);
}

static kiln_attn_shape attn_shape(const kiln_zaya_config *c, int64_t B, int64_t T, int type) {
    return (kiln_attn_shape){B, T, T, T, c->num_heads, c->num_kv_heads, c->head_dim,
                             type == KILN_LAYER_HYBRID_SLIDING ? c->sliding_window : 0,
                             1.0f / sqrtf((float)c->head_dim)};
}

/* CCA's four projections of ln1 (q [Q], k [K], the value's current and delayed halves [K/2] each). Where their
 * weights and gradients are one block in that order and none has a bias (ZAYA's default: attention_bias
 * false), they run as one projection of Q + 2K outputs: one GEMM forward, one for dx and one for dW backward,
 * where four cost 170 + 477 us a layer at issue [cuda]'s shape against 137 + 291 (run s23r1, docs/perf.md);
 * their outputs are then columns of one [N, Q+2K] buffer, rows Q+2K apart, and the convolution and the value
 * shift read and write them there. Otherwise (biases; or KILN_CCA_PROJ=separate, for comparison) four tensors
 * one after another in the same buffer. */
typedef struct {
    bf *q, *k, *vc, *vd;
    int64_t ldq, ldk, ldv; /* row strides */
    int packed;
} proj_view;

static int proj_packed(const kiln_zaya_cuda *g, int64_t li) {
    const kiln_zaya_config *c = &g->m->cfg;
    const kiln_zaya_layer_ptrs *W = &g->W.layers[li], *G = &g->G.layers[li];
    const int64_t H = c->hidden_size, Q = c->num_heads * c->head_dim, K = c->num_kv_heads * c->head_dim;
    return !g->proj_separate && !W->bq && !W->bk && !W->bvc && !W->bvd && W->wk == W->wq + Q * H &&
           W->wvc == W->wk + K * H && W->wvd == W->wvc + K / 2 * H && G->wk == G->wq + Q * H &&
           G->wvc == G->wk + K * H && G->wvd == G->wvc + K / 2 * H;
}

static proj_view proj_view_of(const kiln_zaya_cuda *g, int64_t li, bf *base) {
    const kiln_zaya_config *c = &g->m->cfg;
    const int64_t N = g->B * g->T, Q = c->num_heads * c->head_dim, K = c->num_kv_heads * c->head_dim;
    proj_view v = {.q = base, .packed = proj_packed(g, li)};
    if (v.packed) {
        v.k = base + Q, v.vc = v.k + K, v.vd = v.vc + K / 2;
        v.ldq = v.ldk = v.ldv = Q + 2 * K;
    } else {
        v.k = base + N * Q, v.vc = v.k + N * K, v.vd = v.vc + N * K / 2;
        v.ldq = Q, v.ldk = K, v.ldv = K / 2;
    }
    return v;
}

#define CU(call)                                                                                          \
    do {                                                                                                  \
        cudaError_t st_ = (call);                                                                         \
        if (st_ != cudaSuccess)                                                                           \
            return kiln_errorf(KILN_EIO, "ZAYA on CUDA: %s: %s", #call, cudaGetErrorString(st_));         \
    } while (0)

static void sample_memory(struct kiln_zaya_cuda *g) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > g->used_high) g->used_high = tot - fr;
}

/* the sum of squares' plan, its side stream and events (kiln_zaya_cuda_set_expert_grads_bf16) */
static void expert_sumsq_free(kiln_zaya_cuda *g) {
    if (g->nstream) cudaStreamSynchronize(g->nstream), cudaStreamDestroy(g->nstream);
    if (g->nsq_ev) cudaEventDestroy(g->nsq_ev);
    if (g->nsq_done) cudaEventDestroy(g->nsq_done);
    kiln_sumsq_plan_free(g->gsq);
    free(g->xseg), free(g->seg_queued), free(g->dwsq_ok);
    kiln_cuda_free(g->dwsq);
    g->nstream = NULL, g->nsq_ev = g->nsq_done = NULL, g->gsq = NULL, g->xseg = NULL, g->seg_queued = NULL, g->nseg = 0;
    g->dwsq = NULL, g->dwsq_ok = NULL;
    kiln_cuda_free(g->zmask);
    free(g->zhost);
    g->zmask = g->zhost = NULL, g->xkeep = g->zwords = g->zany = 0;
}

void kiln_zaya_cuda_set_deterministic(kiln_zaya_cuda *g, int on) { g->deterministic = on != 0; }

void kiln_zaya_cuda_free(kiln_zaya_cuda *g) {
    if (!g) return;
    if (g->ostream) cudaStreamSynchronize(g->ostream);
    if (g->stream) cudaStreamSynchronize(g->stream);
    expert_sumsq_free(g);
    free(g->gstage);
    kiln_cuda_free(g->w);
    kiln_cuda_free(g->g);
    kiln_cuda_free(g->wb);
    free(g->poff);
    kiln_cuda_free(g->bal);
    if (g->bal_stage) cudaFreeHost(g->bal_stage);
    if (g->counts_stage) cudaFreeHost(g->counts_stage);
    if (g->bal_ev) cudaEventDestroy(g->bal_ev);
    kiln_cuda_free(g->inv_freq[0]);
    kiln_cuda_free(g->inv_freq[1]);
    kiln_cuda_free(g->arena);
    kiln_cuda_free(g->sarena);
    if (g->L)
        for (int64_t l = 0; l < g->m->cfg.num_layers; l++) free(g->L[l].exp_off_host);
    free(g->L);
    free(g->W.layers);
    free(g->G.layers);
    for (int i = 0; i < g->ev_created; i++) cudaEventDestroy(g->ev[i].a), cudaEventDestroy(g->ev[i].b);
    free(g->ev);
    for (int i = 0; i < g->nslice_ev; i++) cudaEventDestroy(g->slice_ev[i]);
    if (g->ev_main) cudaEventDestroy(g->ev_main);
    if (g->ev_done) cudaEventDestroy(g->ev_done);
    free(g->slice_ev);
    free(g->slice_first);
    free(g->slice_of);
    if (g->ostream) cudaStreamDestroy(g->ostream);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
}

/* The tensor whose device storage holds p (a pointer into w or at its tensor's start). */
static int tensor_of(const kiln_zaya_cuda *g, const float *p) {
    const size_t off = (size_t)(p - g->w);
    int lo = 0, hi = g->m->nparams - 1;
    while (lo < hi) { /* poff is increasing */
        int mid = (lo + hi + 1) / 2;
        if (g->poff[mid] <= off) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The overlapped optimizer's slices, in the forward's order of first use, which is the tensors' order: the
 * embedding and the input scale/bias (the lookup and the first join); per layer [input_layernorm .. the
 * router's out_proj] (its attention, the join after it, the router: the small tensors) and [the experts ..
 * the post-MLP residual scales] (the bulk: read by the experts and the last join); the final norm and an
 * untied LM head. A boundary that would not start a new, later tensor is dropped. */
static kiln_error *overlap_setup(kiln_zaya_cuda *g) {
    const kiln_zaya *m = g->m;
    const int64_t nl = m->cfg.num_layers;
    g->slice_first = malloc((size_t)(2 * nl + 3) * sizeof *g->slice_first);
    g->slice_of = malloc((size_t)(m->nparams + 1) * sizeof *g->slice_of);
    if (!g->slice_first || !g->slice_of) return kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA: optimizer slices");
    int n = 0;
    g->slice_first[n++] = 0;
#define BOUNDARY(p)                                                                                    \
    do {                                                                                               \
        if (p) {                                                                                       \
            const int t_ = tensor_of(g, (p));                                                          \
            if (t_ > g->slice_first[n - 1] && t_ < m->nparams) g->slice_first[n++] = t_;               \
        }                                                                                              \
    } while (0)
    for (int64_t l = 0; l < nl; l++) {
        BOUNDARY(g->W.layers[l].ln1);
        BOUNDARY(g->W.layers[l].gate_up);
    }
    BOUNDARY(g->W.norm);
#undef BOUNDARY
    g->slice_first[n] = m->nparams;
    g->nslice = n;
    for (int k = 0; k < n; k++)
        for (int t = g->slice_first[k]; t < g->slice_first[k + 1]; t++) g->slice_of[t] = k;
    if (!(g->slice_ev = calloc((size_t)n, sizeof *g->slice_ev))) return kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA: events");
    for (; g->nslice_ev < n; g->nslice_ev++)
        CU(cudaEventCreateWithFlags(&g->slice_ev[g->nslice_ev], cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&g->ev_main, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&g->ev_done, cudaEventDisableTiming));
    g->opt_waited = -1;
    return NULL;
}

kiln_error *kiln_zaya_cuda_create(const kiln_zaya *m, int64_t B, int64_t T, int recompute, kiln_zaya_cuda **out) {
    *out = NULL;
    const kiln_zaya_config *c = &m->cfg;
    if (B <= 0 || T <= 0)
        return kiln_errorf(KILN_EINVAL, "ZAYA on CUDA: batch %lld x seq %lld must be positive", (long long)B,
                           (long long)T);
    if (c->num_heads % c->num_kv_heads || (c->num_kv_heads * c->head_dim) % 2)
        return kiln_errorf(KILN_EINVAL, "ZAYA on CUDA: heads %lld / kv heads %lld / head dim %lld unsupported",
                           (long long)c->num_heads, (long long)c->num_kv_heads, (long long)c->head_dim);
    /* KILN_MOE_COMBINE=separate: the experts' gated sum as its own pass into moe (a comparison) */
    const char *comb = getenv("KILN_MOE_COMBINE");
    if (comb && *comb && strcmp(comb, "fused") && strcmp(comb, "separate"))
        return kiln_errorf(KILN_EINVAL, "KILN_MOE_COMBINE=%s: expected fused (the default for top-1 routing) or "
                           "separate", comb);
    const int moe_separate = comb && !strcmp(comb, "separate");
    const char *proj = getenv("KILN_CCA_PROJ");
    if (proj && *proj && strcmp(proj, "packed") && strcmp(proj, "separate"))
        return kiln_errorf(KILN_EINVAL, "KILN_CCA_PROJ=%s: expected packed (the default where the weights allow) or "
                           "separate", proj);
    struct kiln_zaya_cuda *g = calloc(1, sizeof *g);
    if (!g) return kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA");
    g->proj_separate = proj && !strcmp(proj, "separate");
    g->moe_gather = c->top_k == 1 && kiln_residual_norm_gather_ok(c->hidden_size) && !moe_separate;
    const char *mdln = getenv("KILN_MOE_DLN");
    g->dln2_pair = g->moe_gather && !(mdln && !strcmp(mdln, "f32"));
    g->m = m;
    g->B = B;
    g->T = T;
    g->recompute = recompute;
    g->deterministic = 1;
    kiln_error *e = NULL;
    const int64_t Lc = c->num_layers, E1 = c->num_experts + 1;
    g->L = calloc((size_t)(Lc ? Lc : 1), sizeof *g->L);
    g->W.layers = calloc((size_t)(Lc ? Lc : 1), sizeof *g->W.layers);
    g->G.layers = calloc((size_t)(Lc ? Lc : 1), sizeof *g->G.layers);
    if (!g->L || !g->W.layers || !g->G.layers) e = kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA: layer tables");
    for (int64_t l = 0; !e && l < Lc; l++)
        if (!(g->L[l].exp_off_host = malloc((size_t)(E1 + 1) * sizeof(int32_t))))
            e = kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA: layer tables");
    /* the model's stream first in the block scheduler's queue, the optimizer's last (lower numbers are
     * greater priorities) */
    int least = 0, greatest = 0;
    if (!e && cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess)
        e = kiln_errorf(KILN_EIO, "ZAYA on CUDA: cannot read the stream priorities (is there a GPU?)");
    if (!e && (cudaStreamCreateWithPriority(&g->stream, cudaStreamNonBlocking, greatest) != cudaSuccess ||
               cudaStreamCreateWithPriority(&g->ostream, cudaStreamNonBlocking, least) != cudaSuccess))
        e = kiln_errorf(KILN_EIO, "ZAYA on CUDA: cannot create a stream (is there a GPU?)");
    if (!e && !(g->poff = malloc((size_t)(m->nparams + 1) * sizeof *g->poff)))
        e = kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA: parameter table");
    for (int i = 0; !e && i < m->nparams; i++) {
        g->poff[i] = g->numel_dev;
        g->numel_dev += ((size_t)m->params[i].numel + 63) & ~(size_t)63;
    }
    if (!e) g->poff[m->nparams] = g->numel_dev;
    const size_t nw = g->numel_dev + 1;
    if (!e) e = kiln_cuda_alloc((void **)&g->w, nw * sizeof(float));
    if (!e) e = kiln_cuda_alloc((void **)&g->g, nw * sizeof(float));
    if (!e) e = kiln_cuda_alloc((void **)&g->wb, nw * sizeof(bf));
    if (!e) e = kiln_cuda_alloc((void **)&g->bal, (size_t)(Lc * E1 + 1) * sizeof(float));
    if (!e && (cudaHostAlloc((void **)&g->bal_stage, (size_t)(Lc * E1 + 1) * sizeof(float), cudaHostAllocDefault) !=
                   cudaSuccess ||
               cudaHostAlloc((void **)&g->counts_stage, (size_t)(Lc * E1 + 1) * sizeof(int64_t), cudaHostAllocDefault) !=
                   cudaSuccess ||
               cudaEventCreateWithFlags(&g->bal_ev, cudaEventDisableTiming) != cudaSuccess))
        e = kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA: pinned staging for the balancing biases and routing counts");
    for (int t = 0; t < 2 && !e; t++) {
        int64_t nf = m->rot_dim[t] / 2;
        e = kiln_cuda_alloc((void **)&g->inv_freq[t], (size_t)(nf + 1) * sizeof(float));
        if (!e && nf > 0) e = kiln_cuda_copy(g->inv_freq[t], m->inv_freq[t], (size_t)nf * sizeof(float), KILN_CUDA_H2D);
    }
    if (!e) {
        e = bind_padded(g, g->w, &g->W);
        if (!e) e = bind_padded(g, g->g, &g->G);
    }
    if (!e) e = overlap_setup(g);
    if (!e) {
        dbump cnt = {NULL, 0};
        arena_layout(g, &cnt);
        g->arena_bytes = cnt.off;
        e = kiln_cuda_alloc(&g->arena, cnt.off);
        if (e) e = kiln_error_wrap(e, "ZAYA activations for batch %lld x seq %lld", (long long)B, (long long)T);
    }
    if (!e) {
        dbump b = {g->arena, 0};
        arena_layout(g, &b);
        size_t aw = 0;
        for (int t = 0; t < 2; t++) {
            kiln_attn_shape as = attn_shape(c, B, T, t);
            size_t w = kiln_attention_backward_cuda_work(&as);
            aw = w > aw ? w : aw;
        }
        dbump cnt = {NULL, 0};
        scratch_layout(g, &cnt, aw);
        g->sarena_bytes = cnt.off;
        e = kiln_cuda_alloc(&g->sarena, cnt.off);
        if (e) e = kiln_error_wrap(e, "ZAYA backward scratch for batch %lld x seq %lld", (long long)B, (long long)T);
        if (!e) {
            dbump sb = {g->sarena, 0};
            scratch_layout(g, &sb, aw);
        }
    }
    /* On the model's stream, where the upload below is queued after them. A plain cudaMemset runs on the legacy
     * stream, which the non-blocking model stream does not wait for: it could land after the upload and leave
     * the weights zero. It did, on the second of two processes sharing one GPU (session 36: rank 1 began with
     * all-zero weights, its loss ln(vocab), its gradient zero, and the two-rank run hardly learned). */
    if (!e && (cudaMemsetAsync(g->w, 0, nw * sizeof(float), g->stream) != cudaSuccess ||
               cudaMemsetAsync(g->wb, 0, nw * sizeof(bf), g->stream) != cudaSuccess))
        e = kiln_errorf(KILN_EIO, "ZAYA on CUDA: clearing the parameters");
    if (!e) e = kiln_zaya_cuda_upload_params(g, m->w);
    if (!e) e = kiln_zaya_cuda_upload_balancing(g, m->balancing);
    if (!e) e = kiln_zaya_cuda_grads_zero(g);
    if (e) {
        kiln_zaya_cuda_free(g);
        return e;
    }
    sample_memory(g);
    *out = g;
    return NULL;
}

static kiln_error *opt_join(kiln_zaya_cuda *g);

/* Split masters: the experts' tensors (those with bf16 gradients) between their f32 form and the split one,
 * queued on the model's stream. Splitting also rewrites their bf16 copy (the split's rounding). */
static kiln_error *master_convert(kiln_zaya_cuda *g, int to_split) {
    KILN_TRY(opt_join(g));
    for (int i = 0; i < g->m->nparams; i++) {
        if (!kiln_zaya_cuda_grad_bf16(g, i)) continue;
        float *w = g->w + g->poff[i];
        bf *wb = g->wb + g->poff[i];
        const int64_t n = g->m->params[i].numel;
        kiln_error *e = to_split ? kiln_f32_split_cuda(w, wb, n, g->stream) : kiln_f32_join_cuda(w, wb, n, g->stream);
        if (e) return kiln_error_wrap(e, "%s", g->m->params[i].name);
    }
    g->wsplit_now = to_split;
    return NULL;
}

kiln_error *kiln_zaya_cuda_master_f32(kiln_zaya_cuda *g) { return g->wsplit_now ? master_convert(g, 0) : NULL; }
kiln_error *kiln_zaya_cuda_master_split(kiln_zaya_cuda *g) {
    return g->wsplit && !g->wsplit_now ? master_convert(g, 1) : NULL;
}
int kiln_zaya_cuda_master_is_split(const kiln_zaya_cuda *g) { return g->wsplit; }

kiln_error *kiln_zaya_cuda_set_master_split(kiln_zaya_cuda *g, int on) {
    if (!on) {
        KILN_TRY(kiln_zaya_cuda_master_f32(g));
        g->wsplit = 0;
        return NULL;
    }
    if (!g->xg16)
        return kiln_errorf(KILN_EINVAL, "split master weights: they are the experts' with bf16 gradients, which are off "
                           "(kiln_zaya_cuda_set_expert_grads_bf16)");
    g->wsplit = 1;
    return kiln_zaya_cuda_master_split(g);
}

/* All of it from the f32 masters, rounded to nearest even; then the split tensors' copy (and their split) again,
 * rounded as their optimizer step rounds it: a resumed run reads the same bf16 weights as one that went on. */
kiln_error *kiln_zaya_cuda_refresh_bf16(kiln_zaya_cuda *g) {
    KILN_TRY(kiln_zaya_cuda_master_f32(g));
    KILN_TRY(kiln_f32_to_bf16_cuda(g->wb, g->w, (int64_t)g->numel_dev, g->stream));
    return kiln_zaya_cuda_master_split(g);
}

kiln_error *kiln_zaya_cuda_refresh_bf16_range(kiln_zaya_cuda *g, size_t off, size_t n) {
    if (off + n > g->numel_dev)
        return kiln_errorf(KILN_EINVAL, "bf16 copy of elements %zu..%zu: the parameters have %zu", off, off + n,
                           g->numel_dev);
    if (g->wsplit_now)
        for (int i = 0; i < g->m->nparams; i++)
            if (kiln_zaya_cuda_grad_bf16(g, i) && g->poff[i] < off + n && off < g->poff[i] + (size_t)g->m->params[i].numel)
                return kiln_errorf(KILN_EINVAL, "bf16 copy of elements %zu..%zu: %s is held split", off, off + n,
                                   g->m->params[i].name);
    return n ? kiln_f32_to_bf16_cuda(g->wb + off, g->w + off, (int64_t)n, g->stream) : NULL;
}

kiln_error *kiln_zaya_cuda_upload_params(kiln_zaya_cuda *g, const float *w) {
    KILN_TRY(opt_join(g)); /* no update still running writes over the new values */
    for (int i = 0; i < g->m->nparams; i++)
        CU(cudaMemcpyAsync(g->w + g->poff[i], w + g->m->params[i].offset, (size_t)g->m->params[i].numel * sizeof(float),
                           cudaMemcpyHostToDevice, g->stream));
    g->wsplit_now = 0; /* every slot f32 again */
    KILN_TRY(kiln_zaya_cuda_refresh_bf16(g));
    CU(cudaStreamSynchronize(g->stream));
    return NULL;
}

/* Queued on the model's stream, after whatever is queued there (the optimizer step): the caller's buffer is
 * copied into the pinned staging first, so the host neither waits for the queue nor keeps the caller's
 * buffer; only a previous upload still reading the staging is waited for (normally long done). */
kiln_error *kiln_zaya_cuda_upload_balancing(kiln_zaya_cuda *g, const float *bias) {
    const kiln_zaya_config *c = &g->m->cfg;
    const size_t n = (size_t)(c->num_layers * (c->num_experts + 1));
    CU(cudaEventSynchronize(g->bal_ev));
    memcpy(g->bal_stage, bias, n * sizeof(float));
    CU(cudaMemcpyAsync(g->bal, g->bal_stage, n * sizeof(float), cudaMemcpyHostToDevice, g->stream));
    CU(cudaEventRecord(g->bal_ev, g->stream));
    return NULL;
}

kiln_error *kiln_zaya_cuda_download_params(kiln_zaya_cuda *g, float *w) {
    KILN_TRY(opt_join(g));
    KILN_TRY(kiln_zaya_cuda_master_f32(g));
    CU(cudaStreamSynchronize(g->stream));
    for (int i = 0; i < g->m->nparams; i++)
        CU(cudaMemcpy(w + g->m->params[i].offset, g->w + g->poff[i], (size_t)g->m->params[i].numel * sizeof(float),
                      cudaMemcpyDeviceToHost));
    return NULL;
}

/* ---- the experts without rows (xkeep): their weight gradients unwritten, zero by the step's mask ---- */

/* The mask to the device in the model's stream order (kernel parameters: no staging buffer to keep alive). */
static kiln_error *zero_mask_upload(kiln_zaya_cuda *g) {
    return kiln_words_set_cuda(g->zmask, g->zhost, g->zwords, g->stream);
}

static kiln_error *zero_mask_clear(kiln_zaya_cuda *g) {
    if (!g->zany) return NULL;
    memset(g->zhost, 0, (size_t)g->zwords * sizeof *g->zhost);
    g->zany = 0;
    return zero_mask_upload(g);
}

/* The backward about to run writes every expert's weight gradient but those without rows in the forward's
 * routing (exp_off_host): those are the step's zero bits. */
static kiln_error *zero_mask_from_routing(kiln_zaya_cuda *g) {
    if (!g->xkeep) return NULL;
    const int64_t E = g->m->cfg.num_experts, nl = g->m->cfg.num_layers;
    const int had = g->zany;
    memset(g->zhost, 0, (size_t)g->zwords * sizeof *g->zhost);
    g->zany = 0;
    for (int64_t l = 0; l < nl; l++)
        for (int64_t e = 0; e < E; e++)
            if (g->L[l].exp_off_host[e + 1] == g->L[l].exp_off_host[e]) {
                const int64_t b = l * E + e;
                g->zhost[b >> 5] |= 1u << (b & 31);
                g->zany = 1;
            }
    return g->zany || had ? zero_mask_upload(g) : NULL;
}

kiln_error *kiln_zaya_cuda_grads_clear_empty(kiln_zaya_cuda *g) {
    if (!g->zany) return NULL;
    KILN_TRY(opt_join(g));
    const int64_t E = g->m->cfg.num_experts, nl = g->m->cfg.num_layers, H = g->m->cfg.hidden_size,
                  I = g->m->cfg.moe_intermediate;
    for (int64_t l = 0; l < nl; l++)
        for (int64_t e = 0; e < E; e++) {
            const int64_t b = l * E + e;
            if (!((g->zhost[b >> 5] >> (b & 31)) & 1u)) continue;
            /* bf16 elements from the tensors' f32 slots' start (kiln_zaya_cuda_set_expert_grads_bf16) */
            CU(cudaMemsetAsync((uint16_t *)g->G.layers[l].gate_up + e * 2 * I * H, 0, (size_t)(2 * I * H) * 2, g->stream));
            CU(cudaMemsetAsync((uint16_t *)g->G.layers[l].down + e * H * I, 0, (size_t)(H * I) * 2, g->stream));
        }
    return zero_mask_clear(g);
}

const uint32_t *kiln_zaya_cuda_zero_mask(const kiln_zaya_cuda *g) { return g->xkeep ? g->zmask : NULL; }

int kiln_zaya_cuda_grad_zero_groups(const kiln_zaya_cuda *g, int i, int64_t *zn) {
    *zn = 0;
    if (!g->xkeep || i < 0 || i >= g->m->nparams) return 0;
    const int64_t E = g->m->cfg.num_experts, H = g->m->cfg.hidden_size, I = g->m->cfg.moe_intermediate;
    const float *p = g->g + g->poff[i];
    for (int64_t l = 0; l < g->m->cfg.num_layers; l++) {
        if (p == g->G.layers[l].gate_up) *zn = 2 * I * H;
        else if (p == g->G.layers[l].down) *zn = H * I;
        else continue;
        return (int)(l * E) + 1;
    }
    return 0;
}

kiln_error *kiln_zaya_cuda_download_grads(kiln_zaya_cuda *g, float *grad) {
    KILN_TRY(opt_join(g));
    KILN_TRY(kiln_zaya_cuda_grads_clear_empty(g));
    CU(cudaStreamSynchronize(g->stream));
    for (int i = 0; i < g->m->nparams; i++) {
        float *d = grad + g->m->params[i].offset;
        const size_t n = (size_t)g->m->params[i].numel;
        if (!kiln_zaya_cuda_grad_bf16(g, i)) {
            CU(cudaMemcpy(d, g->g + g->poff[i], n * sizeof(float), cudaMemcpyDeviceToHost));
            continue;
        }
        uint16_t *h = malloc(n * 2);
        if (!h) return kiln_errorf(KILN_ENOMEM, "gradient of %s: %zu bf16 values", g->m->params[i].name, n);
        const cudaError_t ce = cudaMemcpy(h, g->g + g->poff[i], n * 2, cudaMemcpyDeviceToHost);
        for (size_t j = 0; j < n && ce == cudaSuccess; j++) d[j] = kiln_bf16_to_f32(h[j]);
        free(h);
        CU(ce);
    }
    return NULL;
}

kiln_error *kiln_zaya_cuda_grads_zero(kiln_zaya_cuda *g) {
    KILN_TRY(opt_join(g));
    CU(cudaMemsetAsync(g->g, 0, g->numel_dev * sizeof(float), g->stream));
    KILN_TRY(zero_mask_clear(g));
    g->grads_zeroed = 1;
    if (g->seg_queued) memset(g->seg_queued, 0, (size_t)g->nseg);
    return NULL;
}
/* The padding between tensors is never written (the backward writes tensors only): zero since the first memset. */
void kiln_zaya_cuda_grads_mark_zero(kiln_zaya_cuda *g) { g->grads_zeroed = 1; }
/* The experts' weights: the backward passes g->grads_zeroed as their dw_write (layer_backward), and the grouped
 * weight-gradient GEMM clears an expert without rows (kiln_grouped_gemm_cuda). */
int kiln_zaya_cuda_grad_overwritten(const kiln_zaya_cuda *g, int i) {
    if (i < 0 || i >= g->m->nparams) return 0;
    const float *p = g->g + g->poff[i];
    for (int64_t l = 0; l < g->m->cfg.num_layers; l++)
        if ((g->G.layers[l].gate_up && p == g->G.layers[l].gate_up) || (g->G.layers[l].down && p == g->G.layers[l].down))
            return 1;
    return 0;
}

int kiln_zaya_cuda_grad_bf16(const kiln_zaya_cuda *g, int i) { return g->xg16 && kiln_zaya_cuda_grad_overwritten(g, i); }

/* The sum of squares of a gradient with bf16 expert tensors runs as a plan of segments: runs of f32 tensors
 * (with the zero padding between them) and each bf16 tensor alone. A layer's expert segments get their partial
 * sums on a side stream as soon as the backward has joined their weight-gradient GEMMs (queue_expert_sumsq), so
 * 7/8 of those bytes (the [cuda] config) are read while the backward goes on; kiln_zaya_cuda_grad_sumsq runs the
 * other segments and the total: the same bits as the whole plan at once. */
kiln_error *kiln_zaya_cuda_set_expert_grads_bf16(kiln_zaya_cuda *g, int on) {
    KILN_TRY(opt_join(g));
    KILN_TRY(kiln_zaya_cuda_grads_clear_empty(g)); /* the mask goes with the plan */
    KILN_TRY(kiln_zaya_cuda_set_master_split(g, 0)); /* its tensors are these */
    CU(cudaStreamSynchronize(g->stream));
    expert_sumsq_free(g);
    g->xg16 = 0;
    if (!on) return NULL;
    const char *ke = getenv("KILN_EMPTY_EXPERTS");
    if (ke && *ke && strcmp(ke, "keep") && strcmp(ke, "clear"))
        return kiln_errorf(KILN_EINVAL, "KILN_EMPTY_EXPERTS=%s: expected keep (the default) or clear", ke);
    const int n = g->m->nparams;
    const int64_t nl = g->m->cfg.num_layers, E = g->m->cfg.num_experts, H = g->m->cfg.hidden_size,
                  I = g->m->cfg.moe_intermediate;
    kiln_error *e = NULL;
    int ns = 0;
    kiln_sumsq_seg *seg = calloc((size_t)(n + 1) * (size_t)(E + 1), sizeof *seg);
    g->xseg = malloc((size_t)(2 * nl + 1) * sizeof *g->xseg);
    if (!seg || !g->xseg) {
        e = kiln_errorf(KILN_ENOMEM, "the gradient's segments");
        goto done;
    }
    for (int64_t k = 0; k < 2 * nl; k++) g->xseg[k] = -1;
    g->xg16 = 1;
    /* xkeep where AdamW's chunks never straddle two experts (KILN_ADAMW_CHUNK); an expert a segment of the sum
     * wherever its bf16 start is a float offset (H*I even), with or without xkeep: the sum's chunks, and so its
     * bits, are the same either way */
    g->xkeep = !(ke && !strcmp(ke, "clear")) && (H * I) % KILN_ADAMW_CHUNK == 0;
    g->xsegn = (H * I) % 2 == 0 ? (int)E : 1;
    if (g->xkeep) {
        g->zwords = (int)((nl * E + 31) / 32) + 1;
        if (!(g->zhost = calloc((size_t)g->zwords, sizeof *g->zhost))) e = kiln_errorf(KILN_ENOMEM, "the experts' zero mask");
        if (!e) e = kiln_cuda_alloc((void **)&g->zmask, (size_t)g->zwords * sizeof *g->zmask);
        if (!e) e = zero_mask_upload(g);
        if (e) goto done;
    }
    for (int i = 0; i < n;) {
        if (kiln_zaya_cuda_grad_bf16(g, i)) {
            const float *p = g->g + g->poff[i];
            for (int64_t l = 0; l < nl; l++)
                if (p == g->G.layers[l].gate_up || p == g->G.layers[l].down) g->xseg[2 * l + (p == g->G.layers[l].down)] = ns;
            if (g->xsegn == 1) { /* the tensor whole */
                seg[ns++] = (kiln_sumsq_seg){(int64_t)g->poff[i], g->m->params[i].numel, 1, 0};
            } else { /* an expert a segment, with its zero-mask bit under xkeep */
                const int64_t ne = g->m->params[i].numel / E;
                int64_t zn;
                const int zb = kiln_zaya_cuda_grad_zero_groups(g, i, &zn); /* 0 without xkeep (else zn = ne) */
                for (int64_t x = 0; x < E; x++)
                    seg[ns++] = (kiln_sumsq_seg){(int64_t)g->poff[i] + x * ne / 2, ne, 1, zb ? zb + (int)x : 0};
            }
            i++;
            continue;
        }
        int j = i + 1;
        while (j < n && !kiln_zaya_cuda_grad_bf16(g, j)) j++;
        seg[ns++] = (kiln_sumsq_seg){(int64_t)g->poff[i], (int64_t)(g->poff[j] - g->poff[i]), 0, 0};
        i = j;
    }
    e = kiln_sumsq_plan_create(seg, ns, &g->gsq);
    if (!e) kiln_sumsq_plan_set_zero_mask(g->gsq, kiln_zaya_cuda_zero_mask(g));
    if (!e && !(g->seg_queued = calloc((size_t)ns + 1, 1))) e = kiln_errorf(KILN_ENOMEM, "the gradient's segments");
    if (!e && g->xsegn == E) { /* room for the sums the experts' weight-gradient kernel may give (one segment an expert) */
        if (!(g->dwsq_ok = calloc((size_t)nl + 1, 1))) e = kiln_errorf(KILN_ENOMEM, "the gradient's segments");
        if (!e) e = kiln_cuda_alloc((void **)&g->dwsq, (size_t)(nl * 2 * E) * sizeof *g->dwsq);
    }
    if (!e && (cudaStreamCreateWithFlags(&g->nstream, cudaStreamNonBlocking) != cudaSuccess ||
               cudaEventCreateWithFlags(&g->nsq_ev, cudaEventDisableTiming) != cudaSuccess ||
               cudaEventCreateWithFlags(&g->nsq_done, cudaEventDisableTiming) != cudaSuccess))
        e = kiln_errorf(KILN_EIO, "ZAYA on CUDA: a stream for the gradient's sum of squares");
    g->nseg = ns;
done:
    free(seg);
    if (e) {
        expert_sumsq_free(g);
        g->xg16 = 0;
    }
    return e;
}

/* Layer l's expert weight gradients are complete in the model's stream order from here on: their partial sums of
 * squares on nstream. */
static kiln_error *queue_expert_sumsq(kiln_zaya_cuda *g, int64_t l) {
    if (!g->gsq) return NULL;
    CU(cudaEventRecord(g->nsq_ev, g->stream));
    CU(cudaStreamWaitEvent(g->nstream, g->nsq_ev, 0));
    const int64_t E = g->m->cfg.num_experts;
    for (int h = 0; h < 2; h++) {
        const int k = g->xseg[2 * l + h];
        if (k < 0 || g->seg_queued[k]) continue;
        if (g->dwsq_ok && g->dwsq_ok[l]) /* the sums the weight-gradient kernel gave: nothing to read back */
            KILN_TRY(kiln_sumsq_plan_give(g->gsq, k, k + g->xsegn, g->dwsq + (l * 2 + h) * E, g->nstream));
        else KILN_TRY(kiln_sumsq_plan_partial(g->gsq, k, k + g->xsegn, g->g, g->nstream));
        memset(g->seg_queued + k, 1, (size_t)g->xsegn);
    }
    return NULL;
}

/* The f32 run after layer l's expert tensors (its post-MLP residual scale, then layer l+1's tensors up to its
 * experts, or the final norm after the last layer) is complete once layer l's backward is: every tensor in it is
 * written on the model's stream by then (layer l+1's backward came first). Its partial sums go to nstream too,
 * instead of a small launch each at the end of the backward (the [cuda] config: 7 runs of ~24 MB, ~43 us each,
 * one after another on the main stream before AdamW). The same bits: each chunk's partial has its own slot. */
static kiln_error *queue_f32_sumsq(kiln_zaya_cuda *g, int64_t l) {
    if (!g->gsq || g->xseg[2 * l + 1] < 0) return NULL;
    const int k = g->xseg[2 * l + 1] + g->xsegn; /* the segment after layer l's down_proj */
    const int next = l + 1 < g->m->cfg.num_layers ? g->xseg[2 * (l + 1)] : g->nseg;
    if (next < 0 || k >= next || g->seg_queued[k]) return NULL; /* no f32 tensor in between */
    CU(cudaEventRecord(g->nsq_ev, g->stream));
    CU(cudaStreamWaitEvent(g->nstream, g->nsq_ev, 0));
    KILN_TRY(kiln_sumsq_plan_partial(g->gsq, k, next, g->g, g->nstream));
    memset(g->seg_queued + k, 1, (size_t)(next - k));
    return NULL;
}

int kiln_zaya_cuda_expert_sumsq_given(const kiln_zaya_cuda *g) {
    int n = 0;
    for (int64_t l = 0; g->dwsq_ok && l < g->m->cfg.num_layers; l++) n += g->dwsq_ok[l] != 0;
    return n;
}

kiln_error *kiln_zaya_cuda_grad_sumsq(kiln_zaya_cuda *g, double *out) {
    KILN_TRY(opt_join(g));
    if (!g->gsq) return kiln_zaya_sumsq_cuda(out, g->g, (int64_t)g->numel_dev, g->stream);
    CU(cudaEventRecord(g->nsq_done, g->nstream)); /* the partials queued during the backward */
    CU(cudaStreamWaitEvent(g->stream, g->nsq_done, 0));
    for (int k = 0; k < g->nseg;) { /* the rest, in runs */
        if (g->seg_queued[k]) {
            k++;
            continue;
        }
        int j = k + 1;
        while (j < g->nseg && !g->seg_queued[j]) j++;
        KILN_TRY(kiln_sumsq_plan_partial(g->gsq, k, j, g->g, g->stream));
        k = j;
    }
    return kiln_sumsq_plan_total(g->gsq, out, g->stream);
}

/* The tensors whose gradient the first backward after a zeroing writes before anything adds to it: the experts'
 * weights (kiln_zaya_cuda_grad_overwritten) and the LM head's weight, whose GEMM is the backward's first (a tied
 * embedding's backward adds into it last). */
static int grad_first_written(const kiln_zaya_cuda *g, int i) {
    return kiln_zaya_cuda_grad_overwritten(g, i) || (g->G.lm_head_w && g->g + g->poff[i] == g->G.lm_head_w);
}

kiln_error *kiln_zaya_cuda_grads_zero_added(kiln_zaya_cuda *g) {
    KILN_TRY(opt_join(g));
    const int n = g->m->nparams;
    for (int i = 0; i < n;) { /* runs of tensors the backward adds to, with the padding between them */
        if (grad_first_written(g, i)) {
            i++;
            continue;
        }
        int j = i + 1;
        while (j < n && !grad_first_written(g, j)) j++;
        CU(cudaMemsetAsync(g->g + g->poff[i], 0, (g->poff[j] - g->poff[i]) * sizeof(float), g->stream));
        i = j;
    }
    g->grads_zeroed = 1;
    return NULL;
}

float *kiln_zaya_cuda_params(kiln_zaya_cuda *g) { return g->w; }
size_t kiln_zaya_cuda_numel(const kiln_zaya_cuda *g) { return g->numel_dev; }
size_t kiln_zaya_cuda_param_offset(const kiln_zaya_cuda *g, int i) { return g->poff[i]; }
uint16_t *kiln_zaya_cuda_params_bf16(kiln_zaya_cuda *g) { return g->wb; }
float *kiln_zaya_cuda_grads(kiln_zaya_cuda *g) { return g->g; }
/* A failed join leaves the step pending: the caller's next sync (or the model's next call) reports it. */
void *kiln_zaya_cuda_stream(kiln_zaya_cuda *g) {
    kiln_error_free(opt_join(g));
    return g->stream;
}
kiln_error *kiln_zaya_cuda_sync(kiln_zaya_cuda *g) {
    KILN_TRY(opt_join(g));
    CU(cudaStreamSynchronize(g->stream));
    return NULL;
}

/* ---------- per-op timing ---------- */

#define PROF_MAX 16384

/* Pairs may nest (a caller's push around a call that times its own ops, such as a wait for the overlapped
 * optimizer): the outermost pair is timed, the time of the inner ones counted in it. */
static void prof_begin_on(kiln_zaya_cuda *g, const char *cls, cudaStream_t st, int side) {
    if (!g->prof || g->prof_depth++ || g->nev >= PROF_MAX) return;
    if (g->nev == g->cap_ev) {
        int cap = g->cap_ev ? 2 * g->cap_ev : 256;
        struct prof_ev *v = realloc(g->ev, (size_t)cap * sizeof *v);
        if (!v) return;
        g->ev = v;
        g->cap_ev = cap;
    }
    struct prof_ev *e = &g->ev[g->nev];
    if (g->nev >= g->ev_created) {
        if (cudaEventCreate(&e->a) != cudaSuccess) return;
        if (cudaEventCreate(&e->b) != cudaSuccess) {
            cudaEventDestroy(e->a);
            return;
        }
        g->ev_created++;
    }
    e->cls = cls;
    e->side = side;
    cudaEventRecord(e->a, st);
}
static void prof_end_on(kiln_zaya_cuda *g, cudaStream_t st) {
    if (!g->prof || !g->prof_depth || --g->prof_depth || g->nev >= g->ev_created) return;
    cudaEventRecord(g->ev[g->nev].b, st);
    g->nev++;
}
static void prof_begin(kiln_zaya_cuda *g, const char *cls) { prof_begin_on(g, cls, g->stream, 0); }
static void prof_end(kiln_zaya_cuda *g) { prof_end_on(g, g->stream); }
/* An op wrapped in the profiler's events (a branch when profiling is off). */
#define OP(g, cls, call)                                                                                  \
    do {                                                                                                  \
        prof_begin((g), (cls));                                                                           \
        kiln_error *op_e_ = (call);                                                                       \
        prof_end(g);                                                                                      \
        if (op_e_) return op_e_;                                                                          \
    } while (0)

void kiln_zaya_cuda_profile_start(kiln_zaya_cuda *g) {
    g->prof = 1;
    g->nev = 0;
    g->prof_depth = 0;
}
void kiln_zaya_cuda_profile_push(kiln_zaya_cuda *g, const char *cls) { prof_begin(g, cls); }
void kiln_zaya_cuda_profile_pop(kiln_zaya_cuda *g) { prof_end(g); }

kiln_error *kiln_zaya_cuda_profile_report(kiln_zaya_cuda *g, kiln_zaya_cuda_prof_row *rows, int max_rows, int *nrows,
                                          double *span_ms) {
    g->prof = 0;
    *nrows = 0;
    *span_ms = 0;
    /* both streams' events complete; the model's stream is not made to wait for the optimizer's */
    CU(cudaStreamSynchronize(g->stream));
    CU(cudaStreamSynchronize(g->ostream));
    int first = -1, last = -1; /* the model's stream's first and last events: the span */
    for (int i = 0; i < g->nev; i++) {
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, g->ev[i].a, g->ev[i].b));
        if (!g->ev[i].side) {
            if (first < 0) first = i;
            last = i;
        }
        int r = 0;
        while (r < *nrows && (strcmp(rows[r].cls, g->ev[i].cls) || rows[r].side != g->ev[i].side)) r++;
        if (r == *nrows) {
            if (*nrows == max_rows) continue;
            rows[r].cls = g->ev[i].cls;
            rows[r].ms = 0;
            rows[r].calls = 0;
            rows[r].side = g->ev[i].side;
            (*nrows)++;
        }
        rows[r].ms += ms;
        rows[r].calls++;
    }
    if (first >= 0) {
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, g->ev[first].a, g->ev[last].b));
        *span_ms = ms;
    }
    for (int i = 1; i < *nrows; i++) /* by time, largest first */
        for (int j = i; j > 0 && rows[j].ms > rows[j - 1].ms; j--) {
            kiln_zaya_cuda_prof_row t = rows[j];
            rows[j] = rows[j - 1];
            rows[j - 1] = t;
        }
    g->nev = 0;
    return NULL;
}

/* ---------- the overlapped optimizer's ordering ---------- */

static kiln_error *wait_event(cudaStream_t st, cudaEvent_t ev) {
    CU(cudaStreamWaitEvent(st, ev, 0));
    return NULL;
}

/* The model's stream waits for the whole queued step (its waits timed as their own class when profiling:
 * the time the model's stream stood still for the optimizer). */
static kiln_error *opt_join(kiln_zaya_cuda *g) {
    if (!g->opt_pending) return NULL;
    OP(g, "waiting for the overlapped optimizer", wait_event(g->stream, g->ev_done));
    g->opt_pending = 0;
    g->opt_waited = g->nslice - 1;
    return NULL;
}

/* Before the model's stream first reads the parameter at p: wait for its slice (earlier slices come before
 * it on the optimizer's stream). The last slice is the whole step. */
static kiln_error *opt_need(kiln_zaya_cuda *g, const float *p) {
    if (!g->opt_pending || !p) return NULL;
    const int k = g->slice_of[tensor_of(g, p)];
    if (k <= g->opt_waited) return NULL;
    if (k == g->nslice - 1) return opt_join(g);
    OP(g, "waiting for the overlapped optimizer", wait_event(g->stream, g->slice_ev[k]));
    g->opt_waited = k;
    return NULL;
}

int kiln_zaya_cuda_overlap_slices(const kiln_zaya_cuda *g, const int **first) {
    *first = g->slice_first;
    return g->nslice;
}

kiln_error *kiln_zaya_cuda_overlap_begin(kiln_zaya_cuda *g, void **stream) {
    *stream = g->ostream;
    /* the gradients are complete (backward, norm) and nothing queued earlier still reads the parameters */
    CU(cudaEventRecord(g->ev_main, g->stream));
    CU(cudaStreamWaitEvent(g->ostream, g->ev_main, 0));
    g->opt_pending = 1;
    g->opt_waited = -1;
    g->slices_recorded = 0;
    prof_begin_on(g, "optimizer (AdamW + gradient zeroing), overlapped with the next forward", g->ostream, 1);
    return NULL;
}

kiln_error *kiln_zaya_cuda_overlap_slice_done(kiln_zaya_cuda *g, int k) {
    if (!g->opt_pending || k != g->slices_recorded || k >= g->nslice)
        return kiln_errorf(KILN_EINVAL, "overlapped optimizer: slice %d done out of order (next %d of %d)", k,
                           g->slices_recorded, g->nslice);
    CU(cudaEventRecord(g->slice_ev[k], g->ostream));
    g->slices_recorded++;
    return NULL;
}

/* Slices not marked done (a step that failed half-way) get their events here, after all that was queued. */
kiln_error *kiln_zaya_cuda_overlap_end(kiln_zaya_cuda *g) {
    if (!g->opt_pending) return kiln_errorf(KILN_EINVAL, "overlapped optimizer: end without a begin");
    const int whole = g->slices_recorded == g->nslice; /* before the loop below: every slice was queued */
    prof_end_on(g, g->ostream);
    for (; g->slices_recorded < g->nslice; g->slices_recorded++)
        CU(cudaEventRecord(g->slice_ev[g->slices_recorded], g->ostream));
    CU(cudaEventRecord(g->ev_done, g->ostream));
    if (whole) g->grads_zeroed = 1; /* by the time the next backward runs (it comes after opt_join) */
    return NULL;
}

/* ---------- forward ---------- */

#define Z(p, bytes) CU(cudaMemsetAsync((p), 0, (size_t)(bytes), st))

/* The RMSNorm fused into a layer's last residual join: the next layer's input_layernorm or the final norm. */
typedef struct {
    bf *y;
    float *rstd;
    const float *w;
} next_norm;

/* out: the layer's output; next (nullable): the norm that reads it, done in the same pass; ln1_done: L->ln1
 * was written by the previous join already. */
static kiln_error *layer_forward(kiln_zaya_cuda *g, int64_t li, glayer *L, const bf *prev_rdown, float *out,
                                 const next_norm *next, int ln1_done) {
    const kiln_zaya *m = g->m;
    const kiln_zaya_config *c = &m->cfg;
    const kiln_zaya_layer_ptrs *W = &g->W.layers[li];
    const int64_t B = g->B, T = g->T, N = B * T, H = c->hidden_size, D = c->head_dim, NH = c->num_heads;
    const int64_t KV = c->num_kv_heads, Q = NH * D, K = KV * D, C = Q + K, R = c->router_hidden;
    const int64_t E = c->num_experts, E1 = E + 1, top = c->top_k;
    const int type = c->layer_types[li];
    const float eps = (float)c->rms_norm_eps;
    void *st = g->stream;

    /* an overlapped optimizer step: its slice of this layer's attention and router tensors (the layer's
     * tensors up to the router's out_proj, in order) */
    KILN_TRY(opt_need(g, W->r_out_w));
    /* input_layernorm (unless the previous residual join did it) */
    if (!ln1_done) OP(g, "RMSNorm fwd", kiln_rmsnorm_forward_cuda(L->ln1, L->ln1_r, L->x, W->ln1, N, H, eps, st));
    /* ZayaCCAProjection: q and k stay where the projections write them, the convolution reads both */
    const proj_view pv = proj_view_of(g, li, L->qkv);
    if (pv.packed) {
        OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(pv.q, L->ln1, BF(g, W->wq), NULL, N, H, Q + 2 * K, st));
    } else {
        OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(pv.q, L->ln1, BF(g, W->wq), BF(g, W->bq), N, H, Q, st));
        OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(pv.k, L->ln1, BF(g, W->wk), BF(g, W->bk), N, H, K, st));
        OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(pv.vc, L->ln1, BF(g, W->wvc), BF(g, W->bvc), N, H, K / 2, st));
        OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(pv.vd, L->ln1, BF(g, W->wvd), BF(g, W->bvd), N, H, K / 2, st));
    }
    kiln_conv_shape cs = {B, T, C, NH + KV, c->cca_time0, c->cca_time1};
    /* the convolutions and the q/k residual coupling, one fused op (bf16 tensor cores) */
    OP(g, "CCA convolutions fwd", kiln_cca_conv_couple_forward_cuda(L->qpre, L->kpre, L->mid, pv.q, pv.k, W->conv0_w, W->conv0_b,
                                                                    W->conv1_w, W->conv1_b, &cs, NH, KV, pv.ldq, pv.ldk, st));
    /* value: current half and the previous token's delayed projection */
    OP(g, "pointwise + glue fwd", kiln_value_shift_forward_cuda(L->v, pv.vc, pv.vd, W->bvd, B, T, K / 2, pv.ldv, st));
    /* ZayaQKNorm, then partial RoPE (one fused pass each) */
    OP(g, "QK norm + RoPE fwd", kiln_qk_norm_rope_forward_cuda(L->qr, L->qinv, L->qpre, NULL, g->inv_freq[type], B, T, NH, D,
                                            m->rot_dim[type], 0, sqrtf((float)D), FLT_EPSILON, st));
    OP(g, "QK norm + RoPE fwd", kiln_qk_norm_rope_forward_cuda(L->kr, L->kinv, L->kpre, W->temp, g->inv_freq[type], B, T, KV, D,
                                            m->rot_dim[type], 0, sqrtf((float)D), FLT_EPSILON, st));
    /* causal GQA attention */
    kiln_attn_shape as = attn_shape(c, B, T, type);
    OP(g, "attention (flash) fwd", kiln_attention_forward_cuda(L->att, L->lse, L->qr, L->kr, L->v, &as, st));
    /* o_proj */
    OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(L->o, L->att, BF(g, W->wo), BF(g, W->bo), N, Q, H, st));
    /* post_attention_residual_scale and post_attention_layernorm, one pass */
    OP(g, "residual + RMSNorm fwd", kiln_residual_norm_forward_cuda(L->res1, L->ln2, L->ln2_r, NULL, L->o, W->attn_hb, W->attn_hs,
                                                                    L->x, W->attn_rb, W->attn_rs, W->ln2, N, H, eps, st));
    /* ZayaRouter */
    OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(L->rdown, L->ln2, BF(g, W->r_down_w), BF(g, W->r_down_b), N, H, R, st));
    if (W->r_state_scale && prev_rdown)
        OP(g, "pointwise + glue fwd", kiln_zaya_router_state_forward_cuda(L->rdown, prev_rdown, W->r_state_scale, N, R, st));
    OP(g, "RMSNorm fwd", kiln_rmsnorm_forward_bf16_cuda(L->rn, L->rn_r, L->rdown, W->r_norm, N, R, eps, st));
    OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(L->f1, L->rn, BF(g, W->r_fc1_w), BF(g, W->r_fc1_b), N, R, R, st));
    OP(g, "pointwise + glue fwd", kiln_gelu_forward_cuda(L->a1, L->f1, N * R, st));
    OP(g, "linear (cuBLASLt) fwd", kiln_linear_forward_cuda(L->f2, L->a1, BF(g, W->r_fc2_w), BF(g, W->r_fc2_b), N, R, R, st));
    OP(g, "pointwise + glue fwd", kiln_gelu_forward_cuda(L->a2, L->f2, N * R, st));
    /* out_proj and the softmax in one pass (the logits are not kept: the backward reads the probabilities) */
    OP(g, "pointwise + glue fwd",
       kiln_router_head_forward_cuda(NULL, L->rprobs, L->a2, BF(g, W->r_out_w), N, R, E1, st));
    OP(g, "pointwise + glue fwd", kiln_route_topk_cuda(L->choice, L->gate, L->rprobs, g->bal + li * E1, N, E1, top, st));
    /* ZayaExperts (the optimizer's slice of the experts and the post-MLP scales, the layer's last tensors) */
    KILN_TRY(opt_need(g, W->mlp_rb));
    kiln_experts_cuda ex = {N, H, c->moe_intermediate, E, top, L->choice, L->gate, L->exp_off, L->exp_off_host,
                            L->slot_tok, L->slot_k, L->tok_slot, 0, L->xe, L->gu, L->act, L->ye};
    OP(g, "experts (dispatch + grouped GEMMs) fwd", kiln_experts_forward_cuda(&ex, L->moe, L->ln2, BF(g, W->gate_up), BF(g, W->down), st));
    /* (with moe_gather, L->moe is NULL: no gated sum here; the join below forms it from ye) */
    L->nslots = ex.nslots;
    /* post_mlp_residual_scale, and the norm that reads the output where given (the next layer's
     * input_layernorm or the final norm: the optimizer's next slice) */
    if (next) KILN_TRY(opt_need(g, next->w));
    if (g->moe_gather)
        OP(g, "residual + RMSNorm fwd",
           kiln_residual_norm_forward_gather_cuda(out, next ? next->y : NULL, next ? next->rstd : NULL, L->ye, L->tok_slot,
                                                  L->gate, W->mlp_hb, W->mlp_hs, L->res1, W->mlp_rb, W->mlp_rs,
                                                  next ? next->w : NULL, N, H, eps, st));
    else
        OP(g, "residual + RMSNorm fwd",
           kiln_residual_norm_forward_cuda(out, next ? next->y : NULL, next ? next->rstd : NULL, L->moe, NULL, W->mlp_hb,
                                           W->mlp_hs, L->res1, W->mlp_rb, W->mlp_rs, next ? next->w : NULL, N, H, eps,
                                           st));
    return NULL;
}

static kiln_error *forward_impl(kiln_zaya_cuda *g, const int64_t *ids) {
    const kiln_zaya *m = g->m;
    const kiln_zaya_config *c = &m->cfg;
    const int64_t N = g->B * g->T, H = c->hidden_size;
    cudaStream_t st = g->stream;
    KILN_TRY(kiln_zaya_check_ids(m, ids, N));
    g->loss_valid = 0; /* g->loss is the last batch's until this batch's cross-entropy runs */
    CU(cudaMemcpyAsync(g->ids, ids, (size_t)N * sizeof(int64_t), cudaMemcpyHostToDevice, st));
    KILN_TRY(opt_need(g, g->W.embed));
    OP(g, "embedding fwd", kiln_embedding_forward_cuda(g->x0, g->W.embed, g->ids, N, H, st));
    const int64_t E1 = c->num_experts + 1;
    CU(cudaMemsetAsync(g->counts, 0, (size_t)(c->num_layers * E1) * sizeof(int64_t), st));
    /* input scale/bias, each residual join and the final one with the norm that reads it in the same pass;
     * with recomputation the layers share one activation set, so a join cannot write the next layer's ln1
     * (the shared set's ln1 is the current layer's, needed by its backward) */
    const float eps = (float)c->rms_norm_eps;
    const int64_t nl = c->num_layers;
    const next_norm fin = {g->hn, g->hn_r, g->W.norm};
    KILN_TRY(opt_need(g, g->W.in_scale));
    KILN_TRY(opt_need(g, g->W.in_bias));
    KILN_TRY(opt_need(g, nl ? g->W.layers[0].ln1 : g->W.norm));
    if (nl)
        OP(g, "residual + RMSNorm fwd", kiln_residual_norm_forward_cuda(g->L[0].x, g->L[0].ln1, g->L[0].ln1_r, g->x0, NULL,
                                                                        g->W.in_bias, g->W.in_scale, NULL, NULL, NULL,
                                                                        g->W.layers[0].ln1, N, H, eps, st));
    else
        OP(g, "residual + RMSNorm fwd", kiln_residual_norm_forward_cuda(g->xf, g->hn, g->hn_r, g->x0, NULL, g->W.in_bias,
                                                                        g->W.in_scale, NULL, NULL, NULL, g->W.norm, N, H,
                                                                        eps, st));
    for (int64_t l = 0; l < nl; l++) {
        float *out = l + 1 < nl ? g->L[l + 1].x : g->xf;
        next_norm nx = {NULL, NULL, NULL};
        if (l + 1 < nl && !g->recompute) nx = (next_norm){g->L[l + 1].ln1, g->L[l + 1].ln1_r, g->W.layers[l + 1].ln1};
        const next_norm *np = l + 1 == nl ? &fin : nx.y ? &nx : NULL;
        kiln_error *e = layer_forward(g, l, &g->L[l], l > 0 ? g->L[l - 1].rdown : NULL, out, np, l == 0 || !g->recompute);
        if (!e) e = kiln_zaya_route_count_cuda(g->counts + l * E1, g->L[l].choice, N * c->top_k, E1, st);
        if (e) return kiln_error_wrap(e, "layer %lld forward", (long long)l);
    }
    KILN_TRY(opt_join(g)); /* the LM head's tensors, and after it the backward writes the gradients */
    OP(g, "LM head (cuBLASLt) fwd", kiln_linear_forward_cuda(g->logits, g->hn, BF(g, g->W.lm_head_w), BF(g, g->W.lm_head_b), N, H,
                                      c->vocab_size, st));
    g->logits_valid = 1;
    g->layers_fresh = 1;
    return NULL;
}

kiln_error *kiln_zaya_cuda_forward(kiln_zaya_cuda *g, const int64_t *ids, double *loss) {
    KILN_TRY(forward_impl(g, ids));
    if (loss) {
        float lf = 0;
        OP(g, "cross-entropy fwd", kiln_cross_entropy_cuda(NULL, NULL, g->loss, g->logits, g->ids, g->B, g->T, g->m->cfg.vocab_size,
                                         g->stream));
        CU(cudaMemcpyAsync(&lf, g->loss, sizeof lf, cudaMemcpyDeviceToHost, g->stream));
        CU(cudaStreamSynchronize(g->stream));
        *loss = lf;
        g->loss_valid = 1;
    }
    sample_memory(g);
    return NULL;
}

kiln_error *kiln_zaya_cuda_loss(kiln_zaya_cuda *g, double *loss) {
    float lf = 0;
    if (!g->loss_valid) return kiln_errorf(KILN_EINVAL, "ZAYA on CUDA: no loss (no backward, no forward with a loss)");
    CU(cudaMemcpyAsync(&lf, g->loss, sizeof lf, cudaMemcpyDeviceToHost, g->stream));
    CU(cudaStreamSynchronize(g->stream));
    *loss = lf;
    return NULL;
}

kiln_error *kiln_zaya_cuda_logits(kiln_zaya_cuda *g, float *logits) {
    if (!g->logits_valid)
        return kiln_errorf(KILN_EINVAL, "ZAYA on CUDA: no logits (no forward since the last backward)");
    const size_t n = (size_t)(g->B * g->T * g->m->cfg.vocab_size);
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) return kiln_errorf(KILN_ENOMEM, "logits");
    kiln_error *e = NULL;
    if (cudaStreamSynchronize(g->stream) != cudaSuccess ||
        cudaMemcpy(h, g->logits, n * 2, cudaMemcpyDeviceToHost) != cudaSuccess)
        e = kiln_errorf(KILN_EIO, "ZAYA on CUDA: copying the logits to the host failed");
    for (size_t i = 0; !e && i < n; i++) logits[i] = kiln_bf16_to_f32(h[i]);
    free(h);
    return e;
}

kiln_error *kiln_zaya_cuda_route_counts(kiln_zaya_cuda *g, int64_t *counts) {
    const kiln_zaya_config *c = &g->m->cfg;
    const size_t n = (size_t)(c->num_layers * (c->num_experts + 1));
    /* on the model's stream into pinned memory: one wait, no round trip through the legacy stream */
    if (cudaMemcpyAsync(g->counts_stage, g->counts, n * sizeof(int64_t), cudaMemcpyDeviceToHost, g->stream) != cudaSuccess ||
        cudaStreamSynchronize(g->stream) != cudaSuccess)
        return kiln_errorf(KILN_EIO, "ZAYA on CUDA: copying the routing counts failed");
    for (size_t i = 0; i < n; i++) counts[i] += g->counts_stage[i];
    return NULL;
}

/* ---------- backward ---------- */

/* dout: grad of the layer's output (s->dres), s->dmoe that of its MoE output (the caller's norm_join);
 * leaves in s->dnext the grad of its input except through input_layernorm, whose input gradient dln1 is
 * in s->dln1 (the caller's norm_join finishes both). carry_in: what the next layer's depth averaging sent to
 * this layer's router state (NULL for the last layer); carry_out receives what goes to the previous layer's. */
static kiln_error *layer_backward(kiln_zaya_cuda *g, int64_t li, glayer *L, const bf *prev_rdown,
                                  const float *carry_in, float *carry_out) {
    const kiln_zaya *m = g->m;
    const kiln_zaya_config *c = &m->cfg;
    const kiln_zaya_layer_ptrs *W = &g->W.layers[li], *Gd = &g->G.layers[li];
    const int64_t B = g->B, T = g->T, N = B * T, H = c->hidden_size, D = c->head_dim, NH = c->num_heads;
    const int64_t KV = c->num_kv_heads, Q = NH * D, K = KV * D, C = Q + K, R = c->router_hidden;
    const int64_t E = c->num_experts, E1 = E + 1, top = c->top_k, I = c->moe_intermediate;
    const int type = c->layer_types[li];
    gscratch *s = &g->s;
    cudaStream_t st = g->stream;
    const float *dout = s->dres;

    /* post_mlp_residual_scale: its MoE side came with dmoe, its res1 side joins the attention residual's
     * backward below */
    /* experts: the first writer of dln2f (dx_write: no zeroing pass, no read-back) */
    kiln_experts_cuda ex = {N, H, I, E, top, L->choice, L->gate, L->exp_off, L->exp_off_host,
                            L->slot_tok, L->slot_k, L->tok_slot, L->nslots, L->xe, L->gu, L->act, L->ye};
    if (g->xg16 && !g->grads_zeroed)
        return kiln_errorf(KILN_EINVAL, "layer %lld backward: the experts' weight gradients are bf16 and written once "
                           "per zeroing; a second backward would add to them (one micro-batch a step, or turn "
                           "kiln_zaya_cuda_set_expert_grads_bf16 off)", (long long)li);
    kiln_experts_cuda_scratch xs = {s->dye, s->dact, s->dgu, s->dxe, g->grads_zeroed, 1, 1, g->xg16, g->xkeep,
                                    g->dwsq ? g->dwsq + li * 2 * E : NULL, 0};
    /* dln2_pair: no dx here; ln2's backward reads the rows dxe (slot order) through tok_slot */
    OP(g, "experts (dispatch + grouped GEMMs) bwd", kiln_experts_backward_cuda(&ex, g->dln2_pair ? NULL : s->dln2f, s->dgate, Gd->gate_up, Gd->down, s->dmoe, BF(g, W->gate_up),
                                        BF(g, W->down), &xs, st));
    if (g->dwsq_ok) g->dwsq_ok[li] = (unsigned char)xs.dw_sq_done;
    /* it joined the previous (next higher) layer's deferred weight gradients first */
    if (li + 1 < c->num_layers) KILN_TRY(queue_expert_sumsq(g, li + 1));
    /* router: the gate is the unbiased probability of the chosen (non-skip) class */
    OP(g, "pointwise + glue bwd", kiln_router_head_dlogits_cuda(s->dlogitb, s->dgate, L->choice, L->rprobs, N, E1, top, st));
    /* the first gradient of an input writes it (KILN_LINEAR_DX_WRITE: no zeroing pass, no read-back) */
    OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_ex_cuda(s->da2, Gd->r_out_w, NULL, s->dlogitb, L->a2, BF(g, W->r_out_w), N, R, E1,
                                                                KILN_LINEAR_DX_WRITE, st));
    OP(g, "pointwise + glue bwd", kiln_gelu_backward_cuda(s->df2, s->da2, L->f2, N * R, st));
    OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_ex_cuda(s->da1, Gd->r_fc2_w, Gd->r_fc2_b, s->df2, L->a1, BF(g, W->r_fc2_w), N, R, R,
                                                                KILN_LINEAR_DX_WRITE, st));
    OP(g, "pointwise + glue bwd", kiln_gelu_backward_cuda(s->df1, s->da1, L->f1, N * R, st));
    OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_ex_cuda(s->drn, Gd->r_fc1_w, Gd->r_fc1_b, s->df1, L->rn, BF(g, W->r_fc1_w), N, R, R,
                                                                KILN_LINEAR_DX_WRITE, st));
    OP(g, "RMSNorm bwd", kiln_rmsnorm_backward_bf16_cuda(s->dxn, Gd->r_norm, s->drn, L->rdown, W->r_norm, L->rn_r, N, R, st));
    const int has_prev = W->r_state_scale && prev_rdown;
    OP(g, "pointwise + glue bwd", kiln_zaya_router_state_backward_cuda(s->drs, has_prev ? carry_out : NULL, Gd->r_state_scale, s->prod,
                                                  s->dxn, carry_in, has_prev ? prev_rdown : NULL,
                                                  has_prev ? W->r_state_scale : NULL, N, R, st));
    /* a lower layer reads carry_out as its carry_in; layer 0 has none (a 16 MB memset a step saved) */
    if (!has_prev && carry_out && li > 0) Z(carry_out, N * R * 4);
    /* r_down: its input gradient accumulates in f32 onto the experts' (no bf16 copy of dln2); with dln2_pair it is
     * written in bf16 (as the reference's autocast rounds it) into dln2f's first half, and ln2's backward adds the
     * two as it reads them */
    kiln_bf16 *dln2b = (kiln_bf16 *)s->dln2f;
    if (g->dln2_pair)
        OP(g, "linear (cuBLASLt) bwd", kiln_gemm_bf16_cuda(dln2b, 0, s->drs, BF(g, W->r_down_w), N, H, R, "NN", 0, st));
    else
        OP(g, "linear (cuBLASLt) bwd", kiln_gemm_bf16_cuda(s->dln2f, 1, s->drs, BF(g, W->r_down_w), N, H, R, "NN", 1, st));
    OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_cuda(NULL, Gd->r_down_w, Gd->r_down_b, s->drs, L->ln2, BF(g, W->r_down_w), N, H,
                                       R, st));
    /* post_attention_layernorm, post_attention_residual_scale and the MLP residual's res1 side, one pass:
     * dres1 = dout*mlp_rs + the norm's backward; dob = bf16(dres1*attn_hs), dnext = dres1*attn_rs (written) */
    const kiln_residual_norm_bwd rb = {.y = L->res1, .dln_f32 = g->dln2_pair ? NULL : s->dln2f,
                                       .dln_rows = g->dln2_pair ? s->dxe : NULL, .dln_slot = L->tok_slot,
                                       .dln_add = g->dln2_pair ? dln2b : NULL, .w = W->ln2, .rstd = L->ln2_r, .dw = Gd->ln2,
                                       .dup = dout, .upb = W->mlp_rb, .ups = W->mlp_rs, .dupb = Gd->mlp_rb,
                                       .dups = Gd->mlp_rs, .a = L->o, .ab = W->attn_hb, .as = W->attn_hs,
                                       .dab = Gd->attn_hb, .das = Gd->attn_hs, .da = s->dob, .x = L->x,
                                       .xb = W->attn_rb, .xs = W->attn_rs, .dxb = Gd->attn_rb, .dxs = Gd->attn_rs,
                                       .dx = s->dnext};
    OP(g, "residual + RMSNorm bwd", kiln_residual_norm_backward_cuda(&rb, N, H, st));
    /* o_proj and attention */
    OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_ex_cuda(s->datt, Gd->wo, Gd->bo, s->dob, L->att, BF(g, W->wo), N, Q, H,
                                                                KILN_LINEAR_DX_WRITE, st));
    kiln_attn_shape as = attn_shape(c, B, T, type);
    OP(g, "attention (flash) bwd", kiln_attention_backward_ex_cuda(s->dqr, s->dkr, s->dv, s->datt, L->att, L->lse, L->qr, L->kr, L->v,
                                                                   &as, s->attn_work, !g->deterministic, st));
    /* value */
    const proj_view pv = proj_view_of(g, li, L->qkv), dp = proj_view_of(g, li, s->dqkv);
    OP(g, "pointwise + glue bwd", kiln_value_shift_backward_cuda(dp.vc, dp.vd, Gd->bvd, s->dv, B, T, K / 2, dp.ldv, st));
    if (!dp.packed) {
        OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_ex_cuda(s->dln1, Gd->wvc, Gd->bvc, dp.vc, L->ln1, BF(g, W->wvc), N, H,
                                                                    K / 2, KILN_LINEAR_DX_WRITE, st));
        OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_cuda(s->dln1, Gd->wvd, Gd->bvd, dp.vd, L->ln1, BF(g, W->wvd), N, H, K / 2,
                                                                 st));
    }
    /* RoPE and the QK norm */
    OP(g, "QK norm + RoPE bwd", kiln_qk_norm_rope_backward_cuda(s->dqpre, NULL, s->dqr, L->qpre, NULL, L->qinv, g->inv_freq[type], B, T,
                                             NH, D, m->rot_dim[type], 0, sqrtf((float)D), FLT_EPSILON, st));
    OP(g, "QK norm + RoPE bwd", kiln_qk_norm_rope_backward_cuda(s->dkpre, Gd->temp, s->dkr, L->kpre, W->temp, L->kinv, g->inv_freq[type],
                                             B, T, KV, D, m->rot_dim[type], 0, sqrtf((float)D), FLT_EPSILON, st));
    /* the convolutions and the residual coupling, one fused op: dq/dk = the coupling's adjoint + the conv's dx */
    kiln_conv_shape cs = {B, T, C, NH + KV, c->cca_time0, c->cca_time1};
    OP(g, "CCA convolutions bwd", kiln_cca_conv_couple_backward_cuda(dp.q, dp.k, Gd->conv0_w, Gd->conv0_b, Gd->conv1_w, Gd->conv1_b,
                                                                     s->dmid, NULL, s->dqpre, s->dkpre, pv.q, pv.k, L->mid, W->conv0_w,
                                                                     W->conv1_w, &cs, NH, KV, pv.ldq, pv.ldk, st));
    if (dp.packed) { /* the first gradient of ln1 here: written */
        OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_ex_cuda(s->dln1, Gd->wq, NULL, dp.q, L->ln1, BF(g, W->wq), N, H,
                                                                    Q + 2 * K, KILN_LINEAR_DX_WRITE, st));
    } else {
        OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_cuda(s->dln1, Gd->wq, Gd->bq, dp.q, L->ln1, BF(g, W->wq), N, H, Q, st));
        OP(g, "linear (cuBLASLt) bwd", kiln_linear_backward_cuda(s->dln1, Gd->wk, Gd->bk, dp.k, L->ln1, BF(g, W->wk), N, H, K, st));
    }
    /* the experts' weight gradients ran on their side streams beside the rest of this layer (dw_defer). With
     * recomputation the re-run forward of layer l-1 rewrites the shared xe and act they read, so the stream waits
     * for them here (timed as the experts' stall); otherwise their last wave also runs beside the residual join
     * that follows, and the next layer's experts backward (which reuses their scratch) or the end of the
     * backward joins them */
    if (g->recompute) OP(g, "experts (dispatch + grouped GEMMs) bwd", kiln_experts_backward_join_cuda(st));
    return NULL;
}

kiln_error *kiln_zaya_cuda_set_grads_ready(kiln_zaya_cuda *g, kiln_zaya_cuda_grads_ready_fn fn, void *ctx) {
    if (fn && !g->gstage) {
        if (!(g->gstage = malloc((size_t)(g->m->nparams + 1) * sizeof *g->gstage)))
            return kiln_errorf(KILN_ENOMEM, "ZAYA on CUDA: the gradient's stages");
        kiln_zaya_cuda_grad_stages(g->m, g->gstage);
    }
    g->ready_fn = fn, g->ready_ctx = fn ? ctx : NULL;
    return NULL;
}

/* The backward has queued the last write of every tensor of stage s on the model's stream: their spans (runs of
 * tensors with the padding after each) go to the caller's hook. */
static kiln_error *grads_ready(kiln_zaya_cuda *g, int s) {
    if (!g->ready_fn) return NULL;
    const int n = g->m->nparams;
    for (int i = 0; i < n;) {
        if (g->gstage[i] != s) {
            i++;
            continue;
        }
        int j = i + 1;
        while (j < n && g->gstage[j] == s) j++;
        KILN_TRY(g->ready_fn(g->ready_ctx, g->poff[i], g->poff[j], g->stream));
        i = j;
    }
    return NULL;
}

/* the MLP join's first input for the norm + join backward: layer L's gated expert rows where the forward formed
 * them as it read them (moe_gather), else its moe */
static void moe_join_input(const kiln_zaya_cuda *g, const glayer *L, kiln_norm_join_bwd *p) {
    if (!g->moe_gather) return;
    p->a = NULL, p->a_rows = L->ye, p->a_slot = L->tok_slot, p->a_gate = L->gate;
}

kiln_error *kiln_zaya_cuda_backward(kiln_zaya_cuda *g) {
    const kiln_zaya *m = g->m;
    const kiln_zaya_config *c = &m->cfg;
    const int64_t B = g->B, T = g->T, N = B * T, H = c->hidden_size, V = c->vocab_size;
    gscratch *s = &g->s;
    cudaStream_t st = g->stream;
    if (!g->logits_valid) return kiln_errorf(KILN_EINVAL, "ZAYA on CUDA: backward without a forward");
    KILN_TRY(opt_join(g)); /* the forward joined already; the gradients are written from here on */
    if (g->seg_queued) memset(g->seg_queued, 0, (size_t)g->nseg);
    KILN_TRY(zero_mask_from_routing(g));
    /* loss -> logits (the gradient overwrites them; the same pass gives the loss, bit for bit the forward's) ->
     * lm_head -> final norm */
    OP(g, "cross-entropy bwd", kiln_cross_entropy_cuda(g->logits, NULL, g->loss, g->logits, g->ids, B, T, V, st));
    g->logits_valid = 0;
    g->loss_valid = 1;
    /* the first writer of dhn, and after a zeroing of its weight's gradient (grads_first_written: the tied
     * embedding's backward adds into it last) */
    OP(g, "LM head (cuBLASLt) bwd", kiln_linear_backward_ex_cuda(s->dhn, g->G.lm_head_w, g->G.lm_head_b, g->logits, g->hn,
                                       BF(g, g->W.lm_head_w), N, H, V,
                                       KILN_LINEAR_DX_WRITE | (g->grads_zeroed ? KILN_LINEAR_DW_WRITE : 0), st));
    /* Each norm's backward runs with the join that made its input (norm_join): the final norm with the last
     * layer's MLP join (its MoE side: dmoe), layer l's input_layernorm with layer l-1's, the first with the
     * input scale/bias (dx0). With recomputation layer l-1 is re-run before layer l's ln1 backward (it needs
     * l-1's MoE output); the re-run's output goes to dx0, free until the end. */
    const int64_t nl = c->num_layers;
    float *carry_in = NULL, *carry_out = s->carry_a;
    kiln_error *e = NULL;
    if (nl && g->recompute && !g->layers_fresh)
        e = layer_forward(g, nl - 1, &g->L[nl - 1], nl > 1 ? g->L[nl - 2].rdown : NULL, s->dx0, NULL, 0);
    if (e) return kiln_error_wrap(e, "layer %lld backward", (long long)(nl - 1));
    const kiln_zaya_layer_ptrs *Wl = nl ? &g->W.layers[nl - 1] : NULL, *Gl = nl ? &g->G.layers[nl - 1] : NULL;
    kiln_norm_join_bwd fj = {.gin = NULL, .gout = s->dres, .dln = s->dhn, .y = g->xf, .w = g->W.norm, .rstd = g->hn_r,
                             .dw = g->G.norm, .a = nl ? g->L[nl - 1].moe : g->x0, .ab = nl ? Wl->mlp_hb : g->W.in_bias,
                             .as = nl ? Wl->mlp_hs : g->W.in_scale, .dab = nl ? Gl->mlp_hb : g->G.in_bias,
                             .das = nl ? Gl->mlp_hs : g->G.in_scale, .da = nl ? s->dmoe : s->dx0};
    if (nl) moe_join_input(g, &g->L[nl - 1], &fj);
    OP(g, "residual + RMSNorm bwd", kiln_norm_join_backward_cuda(&fj, N, H, st));
    KILN_TRY(grads_ready(g, 0)); /* the LM head and the final norm */
    for (int64_t l = nl - 1; l >= 0; l--) {
        glayer *L = &g->L[l];
        const bf *prev = l > 0 ? g->L[l - 1].rdown : NULL;
        e = layer_backward(g, l, L, prev, carry_in, carry_out);
        if (!e) e = queue_f32_sumsq(g, l);
        /* the shared set moves to layer l-1 (its MoE output is next), after layer l's backward */
        if (!e && l > 0 && g->recompute)
            e = layer_forward(g, l - 1, &g->L[l - 1], l > 1 ? g->L[l - 2].rdown : NULL, s->dx0, NULL, 0);
        if (e) return kiln_error_wrap(e, "layer %lld backward", (long long)l);
        const kiln_zaya_layer_ptrs *W = &g->W.layers[l], *Gd = &g->G.layers[l];
        const kiln_zaya_layer_ptrs *Wp = l > 0 ? &g->W.layers[l - 1] : NULL, *Gp = l > 0 ? &g->G.layers[l - 1] : NULL;
        kiln_norm_join_bwd nj = {.gin = s->dnext, .gout = s->dnext, .dln = s->dln1, .y = L->x, .w = W->ln1,
                                 .rstd = L->ln1_r, .dw = Gd->ln1, .a = l > 0 ? g->L[l - 1].moe : g->x0,
                                 .ab = l > 0 ? Wp->mlp_hb : g->W.in_bias, .as = l > 0 ? Wp->mlp_hs : g->W.in_scale,
                                 .dab = l > 0 ? Gp->mlp_hb : g->G.in_bias, .das = l > 0 ? Gp->mlp_hs : g->G.in_scale,
                                 .da = l > 0 ? s->dmoe : s->dx0};
        if (l > 0) moe_join_input(g, &g->L[l - 1], &nj);
        OP(g, "residual + RMSNorm bwd", kiln_norm_join_backward_cuda(&nj, N, H, st));
        e = grads_ready(g, (int)(nl - l)); /* layer l's, and layer l+1's experts (joined by layer l's) */
        if (e) return kiln_error_wrap(e, "layer %lld backward: its finished gradients", (long long)l);
        float *t = s->dres;
        s->dres = s->dnext;
        s->dnext = t;
        carry_in = carry_out;
        carry_out = carry_out == s->carry_a ? s->carry_b : s->carry_a;
    }
    g->layers_fresh = 0;
    g->grads_zeroed = 0;
    /* the embedding (the pad row gets nothing) */
    OP(g, "embedding bwd", kiln_embedding_backward_cuda(g->G.embed, s->dx0, g->ids, N, H, c->pad_token_id, st));
    /* the first layer's expert weight gradients, left running beside the joins and the embedding's backward */
    OP(g, "experts (dispatch + grouped GEMMs) bwd", kiln_experts_backward_join_cuda(st));
    if (c->num_layers) KILN_TRY(queue_expert_sumsq(g, 0));
    KILN_TRY(grads_ready(g, (int)nl + 1)); /* the rest */
    CU(cudaStreamSynchronize(st));
    sample_memory(g);
    return NULL;
}

kiln_error *kiln_zaya_cuda_memory(kiln_zaya_cuda *g, kiln_zaya_cuda_mem *mem) {
    memset(mem, 0, sizeof *mem);
    const kiln_zaya_config *c = &g->m->cfg;
    mem->param_bytes = g->numel_dev * (sizeof(float) + sizeof(bf)) +
                       (size_t)(c->num_layers * (c->num_experts + 1)) * sizeof(float);
    mem->grad_bytes = g->numel_dev * sizeof(float);
    mem->arena_bytes = g->arena_bytes;
    mem->scratch_bytes = g->sarena_bytes;
    sample_memory(g);
    mem->device_used_high = g->used_high;
    int dev = 0;
    cudaMemPool_t pool;
    uint64_t high = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) == cudaSuccess)
        mem->pool_high_bytes = (size_t)high;
    return NULL;
}

#endif
