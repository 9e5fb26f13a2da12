/* Optimizers over flat f32 buffers: AdamW, and Muon (momentum orthogonalised by a Newton-Schulz
 * iteration) for the hidden 2-D weight matrices, the split ZAYA1 trains with. Each step works on
 * whole parameter tensors so that ZeRO-1 can give every tensor to exactly one rank. */
#ifndef KILN_OPTIM_H
#define KILN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kiln/zaya.h"

typedef enum { KILN_OPT_ADAMW = 0, KILN_OPT_MUON = 1 } kiln_opt_kind;

/* The arithmetic of Muon's Newton-Schulz GEMMs on the GPU (optim.muon_ns_precision). The CPU
 * (kiln_newton_schulz) always computes in f32 and ignores it. FP32 is 0 so that a zeroed or positional
 * kiln_optim_hparams keeps the strict arithmetic; the training config's default is BF16. */
typedef enum {
    KILN_NS_FP32 = 0, /* f32 GEMMs without TF32: the CPU's arithmetic */
    KILN_NS_TF32 = 1, /* f32 data, TF32 tensor-core products, f32 accumulation */
    KILN_NS_BF16 = 2, /* bf16 GEMM inputs, f32 accumulation, the iterate kept in f32 (src/cuda/zaya_muon.cu) */
} kiln_ns_precision;
kiln_error *kiln_ns_precision_parse(const char *name, kiln_ns_precision *out);
const char *kiln_ns_precision_name(kiln_ns_precision p);

typedef struct {
    double beta1, beta2, eps, weight_decay;
    double muon_momentum; /* Nesterov momentum of Muon */
    int muon_ns_steps;    /* Newton-Schulz iterations (5) */
    int use_muon;         /* 0: AdamW everywhere */
    kiln_ns_precision muon_ns_precision; /* the GPU's Newton-Schulz GEMMs; the CPU ignores it (f32) */
} kiln_optim_hparams;

/* How the optimizer treats one parameter tensor. */
typedef struct {
    size_t offset;   /* into the parameter buffer */
    int64_t numel;
    kiln_opt_kind kind;
    int64_t mats, rows, cols; /* Muon: `mats` matrices of [rows, cols] */
    int decay;       /* weight decay applies (matrices and embeddings; not norms, biases, scales) */
} kiln_opt_param;

/* Classify the model's parameters: Muon for hidden matrices (attention and router projections,
 * experts as E matrices each), AdamW for embeddings, the LM head, convolution kernels, norms,
 * biases, scales and temperatures. out has m->nparams entries. */
void kiln_optim_classify(const kiln_zaya *m, const kiln_optim_hparams *hp, kiln_opt_param *out);
/* Floats of optimizer state a tensor needs (AdamW: m and v; Muon: momentum). */
int64_t kiln_optim_state_numel(const kiln_opt_param *p);

/* One AdamW step (t is 1-based) on n elements; state holds m then v (2n floats). */
void kiln_adamw_step(float *w, const float *g, float *state, int64_t n, const kiln_optim_hparams *hp, double lr,
                     int64_t t, int decay);
/* One Muon step on p->mats matrices; state is the momentum (numel floats); ws: workspace of
 * kiln_muon_workspace(p) floats. The update is scaled by 0.2*sqrt(max(rows, cols)) so that its RMS
 * matches AdamW's and one learning rate serves both (Moonlight's rule). */
void kiln_muon_step(float *w, const float *g, float *state, const kiln_opt_param *p, const kiln_optim_hparams *hp,
                    double lr, float *ws);
size_t kiln_muon_workspace(const kiln_opt_param *p);
/* Newton-Schulz quintic iteration: x [rows, cols] -> an approximately orthogonal matrix with the
 * same singular vectors (x is normalised first). ws: kiln_muon_workspace floats. */
void kiln_newton_schulz(float *x, int64_t rows, int64_t cols, int steps, float *ws);

/* Learning-rate schedules. */
typedef enum { KILN_SCHED_COSINE = 0, KILN_SCHED_WSD = 1 } kiln_sched_kind;
typedef struct {
    kiln_sched_kind kind;
    double lr, min_lr;
    int64_t warmup, total;
    double decay_frac; /* WSD: the last decay_frac of training decays linearly to min_lr */
} kiln_schedule;
double kiln_schedule_lr(const kiln_schedule *s, int64_t step); /* step is 0-based */

#endif
