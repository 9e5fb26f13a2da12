/* Internals shared by the ZAYA model files: saved activations and the decode cache. */
#ifndef KILN_ZAYA_INTERNAL_H
#define KILN_ZAYA_INTERNAL_H

#include "kiln/zaya.h"

kiln_error *kiln_zaya_build_params(kiln_zaya *m);
void kiln_zaya_bind(const kiln_zaya *m, float *base, kiln_zaya_ptrs *P);

/* What one layer keeps from forward for backward. N = B*T tokens. */
typedef struct {
    float *x;          /* [N,H] layer input (the fp32 residual stream) */
    float *ln1, *ln1_r;/* [N,H], [N] */
    float *q, *k;      /* [N,Q], [N,K] projections */
    float *qk;         /* [N,C] q|k packed: the convolution input */
    float *mid;        /* [B, T+k1-1, C] depthwise output */
    float *conv;       /* [N,C] grouped-conv output */
    float *qpre, *kpre;/* [N,Q], [N,K] conv + residual coupling, before the L2 norm */
    float *qinv, *kinv;/* [N,NH], [N,KV] */
    float *qr, *kr;    /* [N,Q], [N,K] normalised and rotated */
    float *v;          /* [N,K] current | delayed halves */
    float *vd;         /* [N,K/2] delayed projection of each token (used by the next token) */
    float *probs;      /* [B,NH,T,T] (NULL in decode) */
    float *att;        /* [N,Q] attention output */
    float *o;          /* [N,H] o_proj output */
    float *res1;       /* [N,H] residual after the attention block */
    float *ln2, *ln2_r;
    float *rdown;      /* [N,R] router state after depth averaging (passed to the next layer) */
    float *rn, *rn_r;  /* [N,R], [N] */
    float *f1, *a1, *f2, *a2; /* [N,R] router MLP pre/post GELU */
    float *rlogits, *rprobs;  /* [N,E+1] */
    int32_t *choice;   /* [N,top_k] chosen class (E = skip) */
    float *gate;       /* [N,top_k] unbiased prob of the choice, 0 for skip */
    /* experts, slots grouped by expert: slot s serves token slot_tok[s] at choice slot_k[s] */
    int32_t *slot_tok, *slot_k, *exp_off; /* [N*top_k], [N*top_k], [E+1] */
    int64_t nslots;
    int32_t *fill;     /* [E] scratch */
    float *xe;         /* [slots,H] gathered expert inputs */
    float *gu, *act, *ye; /* [slots,2I], [slots,I], [slots,H] */
    float *moe;        /* [N,H] */
} zaya_layer_acts;

struct kiln_zaya_acts {
    int64_t B, T;
    zaya_layer_acts *L;
    float *x0;        /* [N,H] embedding output (before input scale/bias) */
    float *xf;        /* [N,H] final residual stream */
    float *hn, *hn_r; /* final norm */
    float *logits;    /* [N,V] */
    float *pool;      /* one allocation behind all float arrays */
    int32_t *ipool;
    /* backward scratch */
    float *scratch;
    size_t scratch_len;
};

/* The forward of every layer, shared by training and decoding. cache may be NULL. */
struct zaya_layer_cache;
kiln_error *kiln_zaya_forward_impl(kiln_zaya *m, kiln_zaya_acts *a, const int64_t *ids, float *logits,
                                   kiln_zaya_cache *cache);

/* The experts op's view of a layer's saved routing and activations. */
#include "kiln/nn.h"
kiln_experts experts_of(const kiln_zaya_config *c, zaya_layer_acts *L, int64_t N);

struct kiln_zaya_cache {
    int64_t B, cap, pos, P;
    float *hist;  /* [L, B, P, C] last P convolution inputs */
    float *vprev; /* [L, B, K/2] last delayed-value projection */
    float *kc, *vc; /* [L, B, cap, KV, D] */
    kiln_zaya_acts *acts; /* workspace for the current chunk */
};

#endif
