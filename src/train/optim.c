/* AdamW, Muon and the parameter split between them. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kiln/optim.h"

static int has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

void kiln_optim_classify(const kiln_zaya *m, const kiln_optim_hparams *hp, kiln_opt_param *out) {
    for (int i = 0; i < m->nparams; i++) {
        const kiln_param_info *p = &m->params[i];
        kiln_opt_param *o = &out[i];
        memset(o, 0, sizeof *o);
        o->offset = p->offset;
        o->numel = p->numel;
        o->decay = p->ndim >= 2;
        int matrix = (p->ndim == 2 || (p->ndim == 3 && has(p->name, "mlp.experts."))) && !has(p->name, "embed_tokens") &&
                     !has(p->name, "lm_head");
        if (hp->use_muon && matrix) {
            o->kind = KILN_OPT_MUON;
            o->mats = p->ndim == 3 ? p->shape[0] : 1;
            o->rows = p->ndim == 3 ? p->shape[1] : p->shape[0];
            o->cols = p->ndim == 3 ? p->shape[2] : p->shape[1];
        } else {
            o->kind = KILN_OPT_ADAMW;
        }
    }
}

static const char *const ns_names[] = {"fp32", "tf32", "bf16"};

kiln_error *kiln_ns_precision_parse(const char *name, kiln_ns_precision *out) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, ns_names[i])) {
            *out = (kiln_ns_precision)i;
            return NULL;
        }
    return kiln_errorf(KILN_EINVAL, "Newton-Schulz precision '%s': expected \"bf16\", \"tf32\" or \"fp32\"", name);
}

const char *kiln_ns_precision_name(kiln_ns_precision p) {
    return (unsigned)p < 3 ? ns_names[p] : "?";
}

int64_t kiln_optim_state_numel(const kiln_opt_param *p) { return p->kind == KILN_OPT_ADAMW ? 2 * p->numel : p->numel; }

void kiln_adamw_step(float *w, const float *g, float *state, int64_t n, const kiln_optim_hparams *hp, double lr,
                     int64_t t, int decay) {
    float *m = state, *v = state + n;
    const double b1 = hp->beta1, b2 = hp->beta2;
    const double c1 = 1.0 - pow(b1, (double)t), c2 = 1.0 - pow(b2, (double)t);
    const float wd = decay ? (float)(lr * hp->weight_decay) : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        m[i] = (float)(b1 * m[i] + (1 - b1) * g[i]);
        v[i] = (float)(b2 * v[i] + (1 - b2) * (double)g[i] * g[i]);
        double upd = (m[i] / c1) / (sqrt(v[i] / c2) + hp->eps);
        w[i] = (float)(w[i] - wd * w[i] - lr * upd);
    }
}

size_t kiln_muon_workspace(const kiln_opt_param *p) {
    int64_t r = p->rows < p->cols ? p->rows : p->cols, c = p->rows < p->cols ? p->cols : p->rows;
    /* x (r*c), A (r*r), B (r*r), Bx (r*c), update (r*c) */
    return (size_t)(3 * r * c + 2 * r * r);
}

/* Quintic coefficients from Keller Jordan's Muon: a fast, slightly loose orthogonalisation. */
#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

void kiln_newton_schulz(float *x, int64_t rows, int64_t cols, int steps, float *ws) {
    /* work on the wide orientation X [r, c] with r <= c so that X X^T is the small Gram matrix */
    int tr = rows > cols;
    int64_t r = tr ? cols : rows, c = tr ? rows : cols;
    float *X = ws, *A = X + r * c, *B = A + r * r, *BX = B + r * r;
    if (tr) {
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) X[j * rows + i] = x[i * cols + j];
    } else {
        memcpy(X, x, (size_t)(r * c) * sizeof(float));
    }
    double nrm = 0;
    for (int64_t i = 0; i < r * c; i++) nrm += (double)X[i] * X[i];
    float inv = (float)(1.0 / (sqrt(nrm) + 1e-7));
    for (int64_t i = 0; i < r * c; i++) X[i] *= inv;
    for (int s = 0; s < steps; s++) {
        /* A = X X^T;  B = b A + c A A;  X = a X + B X */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)r, (int)c, 1.0f, X, (int)c, X, (int)c, 0.0f,
                    A, (int)r);
        memcpy(B, A, (size_t)(r * r) * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)r, (int)r, NS_C, A, (int)r, A, (int)r, NS_B,
                    B, (int)r);
        memcpy(BX, X, (size_t)(r * c) * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)c, (int)r, 1.0f, B, (int)r, X, (int)c, NS_A,
                    BX, (int)c);
        memcpy(X, BX, (size_t)(r * c) * sizeof(float));
    }
    if (tr) {
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) x[i * cols + j] = X[j * rows + i];
    } else {
        memcpy(x, X, (size_t)(r * c) * sizeof(float));
    }
}

void kiln_muon_step(float *w, const float *g, float *state, const kiln_opt_param *p, const kiln_optim_hparams *hp,
                    double lr, float *ws) {
    const int64_t mn = p->rows * p->cols;
    const float mu = (float)hp->muon_momentum;
    const float scale = (float)(0.2 * sqrt((double)(p->rows > p->cols ? p->rows : p->cols)));
    const float wd = p->decay ? (float)(lr * hp->weight_decay) : 0.0f;
    float *u = ws + kiln_muon_workspace(p) - (size_t)mn; /* the last r*c floats: the update */
    for (int64_t k = 0; k < p->mats; k++) {
        float *wk = w + k * mn, *mk = state + k * mn;
        const float *gk = g + k * mn;
        for (int64_t i = 0; i < mn; i++) {
            mk[i] = mu * mk[i] + gk[i];
            u[i] = gk[i] + mu * mk[i]; /* Nesterov */
        }
        kiln_newton_schulz(u, p->rows, p->cols, hp->muon_ns_steps, ws);
        for (int64_t i = 0; i < mn; i++) wk[i] = wk[i] - wd * wk[i] - (float)lr * scale * u[i];
    }
}

double kiln_schedule_lr(const kiln_schedule *s, int64_t step) {
    if (s->warmup > 0 && step < s->warmup) return s->lr * (double)(step + 1) / (double)s->warmup;
    int64_t total = s->total > s->warmup ? s->total : s->warmup + 1;
    double prog = (double)(step - s->warmup) / (double)(total - s->warmup);
    if (prog > 1) prog = 1;
    if (s->kind == KILN_SCHED_COSINE) return s->min_lr + 0.5 * (s->lr - s->min_lr) * (1 + cos(M_PI * prog));
    double start = 1.0 - s->decay_frac; /* WSD: stable, then linear decay */
    if (prog <= start) return s->lr;
    return s->lr + (s->min_lr - s->lr) * (prog - start) / (s->decay_frac > 0 ? s->decay_frac : 1);
}
