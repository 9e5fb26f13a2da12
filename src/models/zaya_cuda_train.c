/* The CUDA trainer's optimizer side (include/kiln/zaya_cuda.h): AdamW and Muon on this rank's tensors
 * with the state on the device, the gradient scaling and the global-norm sum, on the model's stream; or, on
 * one rank with AdamW only, the step on the optimizer's stream in slices, overlapped with the next forward
 * (kiln_zaya_cuda_opt_step_overlapped).
 * The arithmetic is the CPU optimizer's (src/train/optim.c) through the kernels of src/cuda/optim.cu and
 * the batched Newton-Schulz of src/cuda/zaya_muon.cu. */
#include <stdlib.h>
#include <string.h>

#include "kiln/cuda.h"
#include "kiln/zaya_cuda.h"

#ifndef KILN_HAVE_CUDA

#define NOCUDA return kiln_errorf(KILN_EINVAL, "kiln was built without CUDA")
kiln_error *kiln_zaya_cuda_scale(kiln_zaya_cuda *g, float *x, size_t n, float s) { (void)g, (void)x, (void)n, (void)s; NOCUDA; }
kiln_error *kiln_zaya_cuda_sumsq(kiln_zaya_cuda *g, const float *x, size_t n, double *out) { (void)g, (void)x, (void)n, (void)out; NOCUDA; }
kiln_error *kiln_zaya_cuda_opt_create(kiln_zaya_cuda *g, const kiln_opt_param *op, int first, int last,
                                      kiln_zaya_cuda_opt **out) {
    (void)g, (void)op, (void)first, (void)last;
    *out = NULL;
    NOCUDA;
}
void kiln_zaya_cuda_opt_free(kiln_zaya_cuda_opt *o) { (void)o; }
size_t kiln_zaya_cuda_opt_state_numel(const kiln_zaya_cuda_opt *o) { (void)o; return 0; }
kiln_error *kiln_zaya_cuda_opt_state_upload(kiln_zaya_cuda_opt *o, const float *s) { (void)o, (void)s; NOCUDA; }
kiln_error *kiln_zaya_cuda_opt_state_download(kiln_zaya_cuda_opt *o, float *s) { (void)o, (void)s; NOCUDA; }
float *kiln_zaya_cuda_opt_state(kiln_zaya_cuda_opt *o) { (void)o; return NULL; }
kiln_error *kiln_zaya_cuda_opt_step(kiln_zaya_cuda_opt *o, float *gshard, size_t shard_off, float scale,
                                    const kiln_optim_hparams *hp, double lr, int64_t t, int write_bf16) {
    (void)o, (void)gshard, (void)shard_off, (void)scale, (void)hp, (void)lr, (void)t, (void)write_bf16;
    NOCUDA;
}
int kiln_zaya_cuda_opt_can_overlap(const kiln_zaya_cuda_opt *o) { (void)o; return 0; }
kiln_error *kiln_zaya_cuda_opt_step_zeroing(kiln_zaya_cuda_opt *o, float scale, const kiln_optim_hparams *hp, double lr,
                                            int64_t t) {
    (void)o, (void)scale, (void)hp, (void)lr, (void)t;
    NOCUDA;
}
void kiln_zaya_cuda_opt_set_overlap_blocks(kiln_zaya_cuda_opt *o, int64_t max_blocks) { (void)o, (void)max_blocks; }
kiln_error *kiln_zaya_cuda_opt_step_overlapped(kiln_zaya_cuda_opt *o, float scale, const kiln_optim_hparams *hp,
                                               double lr, int64_t t) {
    (void)o, (void)scale, (void)hp, (void)lr, (void)t;
    NOCUDA;
}

#else

#include <cuda_runtime.h>

#include "kiln/cuda_ops.h"

struct kiln_zaya_cuda_opt {
    kiln_zaya_cuda *g;
    const kiln_opt_param *op;
    int first, last;
    float *state; /* device */
    size_t nstate;
    float *u, *ws; /* Muon: the updates of one group of tensors, the Newton-Schulz scratch */
    double *sum;   /* one device double */
    kiln_adamw_multi *adamw; /* the AdamW tensors' table: one launch a step */
    int naw;                 /* its tensors */
    int64_t ov_blocks;       /* the overlapped step's blocks a launch (0: one launch a slice) */
    size_t *soff;            /* each owned tensor's state offset (index i - first) */
    int *morder, *mgroup, nmg; /* Muon's tensors by group (group k: morder[mgroup[k]..mgroup[k+1])) */
};

kiln_error *kiln_zaya_cuda_scale(kiln_zaya_cuda *g, float *x, size_t n, float s) {
    return kiln_zaya_scale_cuda(x, (int64_t)n, s, kiln_zaya_cuda_stream(g));
}

/* The one device double comes from the stream-ordered pool: a cudaMalloc/cudaFree pair here would
 * synchronize the device every step. */
kiln_error *kiln_zaya_cuda_sumsq(kiln_zaya_cuda *g, const float *x, size_t n, double *out) {
    double *d = NULL;
    cudaStream_t st = (cudaStream_t)kiln_zaya_cuda_stream(g);
    if (cudaMallocAsync((void **)&d, sizeof *d, st) != cudaSuccess)
        return kiln_errorf(KILN_EIO, "gradient norm: no device memory for the sum");
    /* the whole gradient as stored (its experts' weights may be bf16; those without rows zero by the mask), else
     * n floats as they lie in memory */
    const int whole = x == kiln_zaya_cuda_grads(g) && n == kiln_zaya_cuda_numel(g);
    kiln_error *e = whole ? NULL : kiln_zaya_cuda_grads_clear_empty(g);
    if (!e) e = whole ? kiln_zaya_cuda_grad_sumsq(g, d) : kiln_zaya_sumsq_cuda(d, x, (int64_t)n, st);
    if (!e && cudaMemcpyAsync(out, d, sizeof *out, cudaMemcpyDeviceToHost, st) != cudaSuccess)
        e = kiln_errorf(KILN_EIO, "gradient norm: copying the sum to the host failed");
    cudaFreeAsync(d, st);
    if (!e && cudaStreamSynchronize(st) != cudaSuccess) e = kiln_errorf(KILN_EIO, "gradient norm: the stream failed");
    return e;
}

void kiln_zaya_cuda_opt_free(kiln_zaya_cuda_opt *o) {
    if (!o) return;
    cudaStreamSynchronize((cudaStream_t)kiln_zaya_cuda_stream(o->g));
    kiln_cuda_free(o->state);
    kiln_cuda_free(o->u);
    kiln_cuda_free(o->ws);
    kiln_adamw_multi_free(o->adamw);
    free(o->soff), free(o->morder), free(o->mgroup);
    free(o);
}

kiln_error *kiln_zaya_cuda_opt_create(kiln_zaya_cuda *g, const kiln_opt_param *op, int first, int last,
                                      kiln_zaya_cuda_opt **out) {
    *out = NULL;
    kiln_zaya_cuda_opt *o = calloc(1, sizeof *o);
    if (!o) return kiln_errorf(KILN_ENOMEM, "optimizer on CUDA");
    o->g = g, o->op = op, o->first = first, o->last = last;
    size_t umax = 0, wsmax = 0;
    const size_t nt = (size_t)(last > first ? last - first : 0) + 1;
    kiln_adamw_tensor *aw = calloc(nt, sizeof *aw);
    int naw = 0, *gid = calloc(nt, sizeof *gid);
    o->soff = calloc(nt, sizeof *o->soff), o->morder = calloc(nt, sizeof *o->morder), o->mgroup = calloc(nt + 1, sizeof(int));
    if (!aw || !gid || !o->soff || !o->morder || !o->mgroup) {
        free(aw), free(gid);
        kiln_zaya_cuda_opt_free(o);
        return kiln_errorf(KILN_ENOMEM, "optimizer on CUDA");
    }
    for (int i = first; i < last; i++) {
        o->soff[i - first] = o->nstate;
        const size_t off = kiln_zaya_cuda_param_offset(g, i) - kiln_zaya_cuda_param_offset(g, first); /* in the shard */
        int64_t zn = 0;
        const int zb = kiln_zaya_cuda_grad_zero_groups(g, i, &zn); /* an expert without rows: its gradient is zero */
        if (op[i].kind == KILN_OPT_ADAMW) /* a zeroing step leaves the gradients the next backward overwrites */
            aw[naw++] = (kiln_adamw_tensor){(int64_t)off, (int64_t)o->nstate, op[i].numel, op[i].decay,
                                            kiln_zaya_cuda_grad_overwritten(g, i), kiln_zaya_cuda_grad_bf16(g, i), zb, zn};
        else if (kiln_zaya_cuda_grad_bf16(g, i)) {
            free(aw), free(gid);
            kiln_zaya_cuda_opt_free(o);
            return kiln_errorf(KILN_EINVAL, "optimizer on CUDA: tensor %d has a bf16 gradient, which only AdamW reads "
                               "(turn kiln_zaya_cuda_set_expert_grads_bf16 off for Muon on the experts)", i);
        }
        o->nstate += (size_t)kiln_optim_state_numel(&op[i]);
        if (op[i].kind != KILN_OPT_MUON) continue;
        if ((size_t)op[i].numel > umax) umax = (size_t)op[i].numel;
        size_t w = kiln_zaya_newton_schulz_cuda_ws(op[i].mats, op[i].rows, op[i].cols);
        if (w > wsmax) wsmax = w;
    }
    /* Muon's tensors of one shape grouped (the layers' q_proj, ...): one batched Newton-Schulz per group. A
     * group grows only while its updates and scratch fit in what the largest tensor needs alone, so
     * grouping costs no memory; groups keep the tensors' order. */
    int64_t *gm = calloc(nt, sizeof *gm), *gn = calloc(nt, sizeof *gn); /* each group's matrices, elements */
    for (int i = first; i < last && gm && gn; i++) {
        if (op[i].kind != KILN_OPT_MUON) continue;
        int k = 0;
        for (; k < o->nmg; k++) {
            const kiln_opt_param *q = &op[o->mgroup[k]]; /* its first member (tensor index until sorted below) */
            if (q->rows == op[i].rows && q->cols == op[i].cols && (size_t)(gn[k] + op[i].numel) <= umax &&
                kiln_zaya_newton_schulz_cuda_ws(gm[k] + op[i].mats, op[i].rows, op[i].cols) <= wsmax)
                break;
        }
        if (k == o->nmg) o->mgroup[o->nmg++] = i;
        gid[i - first] = k, gm[k] += op[i].mats, gn[k] += op[i].numel;
    }
    const int grouped = gm && gn;
    free(gm), free(gn);
    if (!grouped) {
        free(aw), free(gid);
        kiln_zaya_cuda_opt_free(o);
        return kiln_errorf(KILN_ENOMEM, "optimizer on CUDA");
    }
    for (int k = 0, n = 0; k < o->nmg; k++) { /* members by group, in order */
        o->mgroup[k] = n;
        for (int i = first; i < last; i++)
            if (op[i].kind == KILN_OPT_MUON && gid[i - first] == k) o->morder[n++] = i;
        o->mgroup[k + 1] = n;
    }
    free(gid);
    kiln_error *e = kiln_cuda_alloc((void **)&o->state, (o->nstate + 1) * sizeof(float));
    if (!e && umax) e = kiln_cuda_alloc((void **)&o->u, umax * sizeof(float));
    if (!e && wsmax) e = kiln_cuda_alloc((void **)&o->ws, wsmax * sizeof(float));
    if (!e && cudaMemset(o->state, 0, (o->nstate + 1) * sizeof(float)) != cudaSuccess)
        e = kiln_errorf(KILN_EIO, "optimizer on CUDA: clearing the state");
    if (!e) e = kiln_adamw_multi_create(aw, naw, &o->adamw);
    /* the state's memset and the AdamW tables' uploads ran on the legacy stream, which the model's non-blocking
     * stream does not wait for (and an upload from pageable memory may return before its data lands): without
     * this the first step could read the tables before they arrive */
    if (!e && cudaDeviceSynchronize() != cudaSuccess) e = kiln_errorf(KILN_EIO, "optimizer on CUDA: setting up the state");
    o->naw = naw;
    free(aw);
    if (e) {
        double gb = (double)o->nstate * 4e-9;
        kiln_zaya_cuda_opt_free(o);
        return kiln_error_wrap(e, "optimizer state (%.2f GB) on the GPU", gb);
    }
    *out = o;
    return NULL;
}

size_t kiln_zaya_cuda_opt_state_numel(const kiln_zaya_cuda_opt *o) { return o->nstate; }
float *kiln_zaya_cuda_opt_state(kiln_zaya_cuda_opt *o) { return o->state; }

kiln_error *kiln_zaya_cuda_opt_state_upload(kiln_zaya_cuda_opt *o, const float *state) {
    cudaStream_t st = (cudaStream_t)kiln_zaya_cuda_stream(o->g);
    if (cudaStreamSynchronize(st) != cudaSuccess ||
        cudaMemcpy(o->state, state, o->nstate * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) /* landed before the model's stream reads it (as above) */
        return kiln_errorf(KILN_EIO, "optimizer state to the GPU: copy failed");
    return NULL;
}

kiln_error *kiln_zaya_cuda_opt_state_download(kiln_zaya_cuda_opt *o, float *state) {
    cudaStream_t st = (cudaStream_t)kiln_zaya_cuda_stream(o->g);
    if (cudaStreamSynchronize(st) != cudaSuccess ||
        cudaMemcpy(state, o->state, o->nstate * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
        return kiln_errorf(KILN_EIO, "optimizer state from the GPU: copy failed");
    return NULL;
}

/* Split master weights (kiln_zaya_cuda_set_master_split): split before AdamW reads them, and its table told so. */
static kiln_error *opt_split(kiln_zaya_cuda_opt *o, int write_bf16) {
    const int sp = kiln_zaya_cuda_master_is_split(o->g);
    if (sp && !write_bf16)
        return kiln_errorf(KILN_EINVAL, "optimizer step: split master weights need the step to write their bf16 copy "
                           "(one rank)");
    if (sp) KILN_TRY(kiln_zaya_cuda_master_split(o->g));
    kiln_adamw_multi_set_split(o->adamw, sp);
    return NULL;
}

/* AdamW's tensors in one launch; Muon's a group at a time: each member's momentum into the group's update
 * buffer, one batched Newton-Schulz, each member's update. The gradient's scale is applied as each kernel
 * reads it, so gshard is read once and never written. */
kiln_error *kiln_zaya_cuda_opt_step(kiln_zaya_cuda_opt *o, float *gshard, size_t shard_off, float scale,
                                    const kiln_optim_hparams *hp, double lr, int64_t t, int write_bf16) {
    void *st = kiln_zaya_cuda_stream(o->g);
    float *w = kiln_zaya_cuda_params(o->g);
    kiln_bf16 *wb = kiln_zaya_cuda_params_bf16(o->g);
    if (o->first >= o->last) return NULL;
    if (shard_off != kiln_zaya_cuda_param_offset(o->g, o->first))
        return kiln_errorf(KILN_EINVAL, "optimizer step: the gradient shard starts at element %zu, the first owned "
                           "tensor at %zu", shard_off, kiln_zaya_cuda_param_offset(o->g, o->first));
    KILN_TRY(opt_split(o, write_bf16));
    /* the zero mask describes the model's own gradients only (another buffer is read as it is) */
    kiln_adamw_multi_set_zero_mask(o->adamw, gshard == kiln_zaya_cuda_grads(o->g) ? kiln_zaya_cuda_zero_mask(o->g) : NULL);
    KILN_TRY(kiln_adamw_multi_step_cuda(o->adamw, w + shard_off, gshard, o->state, scale, hp, lr, t,
                                        write_bf16 ? wb + shard_off : NULL, st));
    for (int k = 0; k < o->nmg; k++) {
        const int m0 = o->mgroup[k], m1 = o->mgroup[k + 1];
        int64_t mats = 0;
        for (int j = m0; j < m1; j++) {
            const int i = o->morder[j];
            const kiln_opt_param *p = &o->op[i];
            const size_t off = kiln_zaya_cuda_param_offset(o->g, i);
            KILN_TRY(kiln_muon_momentum_scaled_cuda(o->state + o->soff[i - o->first], o->u + mats * p->rows * p->cols,
                                                    gshard + (off - shard_off), p->numel, hp, scale, st));
            mats += p->mats;
        }
        const kiln_opt_param *p0 = &o->op[o->morder[m0]];
        KILN_TRY(kiln_zaya_newton_schulz_cuda(o->u, mats, p0->rows, p0->cols, hp->muon_ns_steps, hp->muon_ns_precision,
                                              o->ws, st));
        mats = 0;
        for (int j = m0; j < m1; j++) {
            const int i = o->morder[j];
            const kiln_opt_param *p = &o->op[i];
            const size_t off = kiln_zaya_cuda_param_offset(o->g, i);
            KILN_TRY(kiln_muon_update_cuda(w + off, o->u + mats * p->rows * p->cols, p, hp, lr,
                                           write_bf16 ? wb + off : NULL, st));
            mats += p->mats;
        }
    }
    return NULL;
}

void kiln_zaya_cuda_opt_set_overlap_blocks(kiln_zaya_cuda_opt *o, int64_t max_blocks) {
    o->ov_blocks = max_blocks > 0 ? max_blocks : 0;
}

/* Every tensor of the model, all AdamW's: then the AdamW table's index is the tensor's index. */
int kiln_zaya_cuda_opt_can_overlap(const kiln_zaya_cuda_opt *o) {
    const int *first = NULL;
    const int n = kiln_zaya_cuda_overlap_slices(o->g, &first);
    return n > 0 && o->first == 0 && o->last == first[n] && o->nmg == 0 && o->naw == o->last;
}

/* One launch on the model's stream over every tensor (the table's index is the tensor's), each gradient element
 * overwritten with 0 once read, but for the tensors the next backward overwrites: it starts from zero without a
 * memset. */
kiln_error *kiln_zaya_cuda_opt_step_zeroing(kiln_zaya_cuda_opt *o, float scale, const kiln_optim_hparams *hp, double lr,
                                            int64_t t) {
    if (!kiln_zaya_cuda_opt_can_overlap(o))
        return kiln_errorf(KILN_EINVAL, "optimizer step zeroing the gradients: it needs every tensor of the model "
                           "(tensors %d..%d owned) and AdamW on all of them (%d of them Muon's)", o->first, o->last - 1,
                           o->last - o->first - o->naw);
    kiln_zaya_cuda *g = o->g;
    void *st = kiln_zaya_cuda_stream(g);
    KILN_TRY(opt_split(o, 1));
    kiln_adamw_multi_set_zero_mask(o->adamw, kiln_zaya_cuda_zero_mask(g));
    KILN_TRY(kiln_adamw_multi_step_range_cuda(o->adamw, 0, o->naw, kiln_zaya_cuda_params(g), kiln_zaya_cuda_grads(g),
                                              o->state, scale, hp, lr, t, kiln_zaya_cuda_params_bf16(g), 1, 0, st));
    kiln_zaya_cuda_grads_mark_zero(g);
    return NULL;
}

/* A launch per slice on the optimizer's stream, each zeroing the gradients it read, an event after each: the
 * next forward reads a slice's weights as soon as that slice is done. The chunks are the single launch's,
 * so each element gets the same arithmetic (kiln_zaya_cuda_opt_step's bits). */
kiln_error *kiln_zaya_cuda_opt_step_overlapped(kiln_zaya_cuda_opt *o, float scale, const kiln_optim_hparams *hp,
                                               double lr, int64_t t) {
    if (!kiln_zaya_cuda_opt_can_overlap(o))
        return kiln_errorf(KILN_EINVAL, "overlapped optimizer step: it needs every tensor of the model (tensors %d..%d "
                           "owned) and AdamW on all of them (%d of them Muon's)", o->first, o->last - 1,
                           o->last - o->first - o->naw);
    kiln_zaya_cuda *g = o->g;
    const int *first = NULL;
    const int n = kiln_zaya_cuda_overlap_slices(g, &first);
    void *st = NULL;
    KILN_TRY(opt_split(o, 1)); /* on the model's stream, which the optimizer's waits for */
    kiln_adamw_multi_set_zero_mask(o->adamw, kiln_zaya_cuda_zero_mask(g));
    KILN_TRY(kiln_zaya_cuda_overlap_begin(g, &st));
    kiln_error *e = NULL;
    float *w = kiln_zaya_cuda_params(g), *gr = kiln_zaya_cuda_grads(g);
    kiln_bf16 *wb = kiln_zaya_cuda_params_bf16(g);
    for (int k = 0; k < n && !e; k++) {
        e = kiln_adamw_multi_step_range_cuda(o->adamw, first[k], first[k + 1], w, gr, o->state, scale, hp, lr, t, wb, 1,
                                             o->ov_blocks, st);
        if (!e) e = kiln_zaya_cuda_overlap_slice_done(g, k);
    }
    kiln_error *e2 = kiln_zaya_cuda_overlap_end(g); /* also after a failure: the waits on it stay well defined */
    if (e) {
        kiln_error_free(e2);
        return kiln_error_wrap(e, "overlapped optimizer step");
    }
    return e2;
}

#endif
