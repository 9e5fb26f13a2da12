/* The CUDA trainer's optimizer side (include/kiln/zaya_cuda.h): AdamW and Muon on this rank's tensors
 * with the state on the device, the gradient scaling and the global-norm sum, all on the model's stream.
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

#else

#include <cuda_runtime.h>

#include "kiln/cuda_ops.h"

struct kiln_zaya_cuda_opt {
    kiln_zaya_cuda *g;
    const kiln_opt_param *op;
    int first, last;
    float *state; /* device */
    size_t nstate;
    float *u, *ws; /* Muon: the update of one tensor, the Newton-Schulz scratch */
    double *sum;   /* one device double */
    kiln_adamw_multi *adamw; /* the AdamW tensors' table: one launch a step */
};

kiln_error *kiln_zaya_cuda_scale(kiln_zaya_cuda *g, float *x, size_t n, float s) {
    return kiln_zaya_scale_cuda(x, (int64_t)n, s, kiln_zaya_cuda_stream(g));
}

kiln_error *kiln_zaya_cuda_sumsq(kiln_zaya_cuda *g, const float *x, size_t n, double *out) {
    double *d = NULL;
    void *st = kiln_zaya_cuda_stream(g);
    KILN_TRY(kiln_cuda_alloc((void **)&d, sizeof *d));
    kiln_error *e = kiln_zaya_sumsq_cuda(d, x, (int64_t)n, st);
    if (!e && (cudaMemcpyAsync(out, d, sizeof *out, cudaMemcpyDeviceToHost, (cudaStream_t)st) != cudaSuccess ||
               cudaStreamSynchronize((cudaStream_t)st) != cudaSuccess))
        e = kiln_errorf(KILN_EIO, "gradient norm: copying the sum to the host failed");
    kiln_cuda_free(d);
    return e;
}

void kiln_zaya_cuda_opt_free(kiln_zaya_cuda_opt *o) {
    if (!o) return;
    cudaStreamSynchronize((cudaStream_t)kiln_zaya_cuda_stream(o->g));
    kiln_cuda_free(o->state);
    kiln_cuda_free(o->u);
    kiln_cuda_free(o->ws);
    kiln_adamw_multi_free(o->adamw);
    free(o);
}

kiln_error *kiln_zaya_cuda_opt_create(kiln_zaya_cuda *g, const kiln_opt_param *op, int first, int last,
                                      kiln_zaya_cuda_opt **out) {
    *out = NULL;
    kiln_zaya_cuda_opt *o = calloc(1, sizeof *o);
    if (!o) return kiln_errorf(KILN_ENOMEM, "optimizer on CUDA");
    o->g = g, o->op = op, o->first = first, o->last = last;
    size_t umax = 0, wsmax = 0;
    kiln_adamw_tensor *aw = calloc((size_t)(last > first ? last - first : 0) + 1, sizeof *aw);
    int naw = 0;
    if (!aw) {
        free(o);
        return kiln_errorf(KILN_ENOMEM, "optimizer on CUDA");
    }
    for (int i = first; i < last; i++) {
        const size_t off = kiln_zaya_cuda_param_offset(g, i) - kiln_zaya_cuda_param_offset(g, first); /* in the shard */
        if (op[i].kind == KILN_OPT_ADAMW) aw[naw++] = (kiln_adamw_tensor){(int64_t)off, (int64_t)o->nstate, op[i].numel, op[i].decay};
        o->nstate += (size_t)kiln_optim_state_numel(&op[i]);
        if (op[i].kind != KILN_OPT_MUON) continue;
        if ((size_t)op[i].numel > umax) umax = (size_t)op[i].numel;
        size_t w = kiln_zaya_newton_schulz_cuda_ws(op[i].mats, op[i].rows, op[i].cols);
        if (w > wsmax) wsmax = w;
    }
    kiln_error *e = kiln_cuda_alloc((void **)&o->state, (o->nstate + 1) * sizeof(float));
    if (!e && umax) e = kiln_cuda_alloc((void **)&o->u, umax * sizeof(float));
    if (!e && wsmax) e = kiln_cuda_alloc((void **)&o->ws, wsmax * sizeof(float));
    if (!e && cudaMemset(o->state, 0, (o->nstate + 1) * sizeof(float)) != cudaSuccess)
        e = kiln_errorf(KILN_EIO, "optimizer on CUDA: clearing the state");
    if (!e) e = kiln_adamw_multi_create(aw, naw, &o->adamw);
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
        cudaMemcpy(o->state, state, o->nstate * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
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

/* AdamW's tensors in one launch, Muon's one tensor at a time (momentum, Newton-Schulz, update); the
 * gradient's scale is applied as each kernel reads it, so gshard is read once and never written. */
kiln_error *kiln_zaya_cuda_opt_step(kiln_zaya_cuda_opt *o, float *gshard, size_t shard_off, float scale,
                                    const kiln_optim_hparams *hp, double lr, int64_t t, int write_bf16) {
    void *st = kiln_zaya_cuda_stream(o->g);
    float *w = kiln_zaya_cuda_params(o->g), *state = o->state;
    kiln_bf16 *wb = kiln_zaya_cuda_params_bf16(o->g);
    if (o->first >= o->last) return NULL;
    if (shard_off != kiln_zaya_cuda_param_offset(o->g, o->first))
        return kiln_errorf(KILN_EINVAL, "optimizer step: the gradient shard starts at element %zu, the first owned "
                           "tensor at %zu", shard_off, kiln_zaya_cuda_param_offset(o->g, o->first));
    KILN_TRY(kiln_adamw_multi_step_cuda(o->adamw, w + shard_off, gshard, state, scale, hp, lr, t,
                                        write_bf16 ? wb + shard_off : NULL, st));
    for (int i = o->first; i < o->last; i++) {
        const kiln_opt_param *p = &o->op[i];
        const size_t off = kiln_zaya_cuda_param_offset(o->g, i);
        if (p->kind == KILN_OPT_MUON) {
            KILN_TRY(kiln_muon_momentum_scaled_cuda(state, o->u, gshard + (off - shard_off), p->numel, hp, scale, st));
            KILN_TRY(kiln_zaya_newton_schulz_cuda(o->u, p->mats, p->rows, p->cols, hp->muon_ns_steps, o->ws, st));
            KILN_TRY(kiln_muon_update_cuda(w + off, o->u, p, hp, lr, write_bf16 ? wb + off : NULL, st));
        }
        state += kiln_optim_state_numel(p);
    }
    return NULL;
}

#endif
