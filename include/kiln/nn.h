/* CPU reference ops: one op per file under src/nn/, each with its forward and
 * backward side by side. Layout is row-major, tokens first: an activation of
 * N tokens and D channels is float[N*D]. Backward functions ACCUMULATE into
 * their gradient outputs (so a tensor used twice just receives two calls);
 * any gradient pointer may be NULL when that gradient is not wanted.
 * A CUDA twin of an op carries the same name with a _cuda suffix. */
#ifndef KILN_NN_H
#define KILN_NN_H

#include <stdint.h>

/* ---- linear: y[n,out] = x[n,in] @ w[out,in]^T + b ---- */
void kiln_linear_forward(float *y, const float *x, const float *w, const float *b,
                         int64_t n, int64_t in, int64_t out);
void kiln_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                          const float *w, int64_t n, int64_t in, int64_t out);

/* ---- embedding: y[n,d] = table[ids[n]]; backward skips rows equal to pad (pad<0: none) ---- */
void kiln_embedding_forward(float *y, const float *table, const int64_t *ids, int64_t n, int64_t d);
void kiln_embedding_backward(float *dtable, const float *dy, const int64_t *ids, int64_t n, int64_t d,
                             int64_t pad);

/* ---- rmsnorm: y = w * x / sqrt(mean(x^2) + eps); saves rstd[n] ---- */
void kiln_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d,
                          float eps);
void kiln_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                           const float *rstd, int64_t n, int64_t d);

/* ---- scale-shift: y = (x + b) * s, per channel (ZAYA's residual scaling and input scale) ---- */
void kiln_scale_shift_forward(float *y, const float *x, const float *b, const float *s, int64_t n,
                              int64_t d, int accumulate);
void kiln_scale_shift_backward(float *dx, float *db, float *ds, const float *dy, const float *x,
                               const float *b, const float *s, int64_t n, int64_t d);

/* ---- layernorm forward (inference): y = (x - mean) / sqrt(var + eps) * w + b; w, b may be NULL ---- */
void kiln_layernorm_forward(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t d,
                            float eps);

/* ---- multi-head attention forward (inference): for each of B sequences of T tokens and each head h,
 * out[:, h*hd:(h+1)*hd] = softmax(q_h k_hᵀ * scale, causal or not) v_h. q, k, v rows are `stride`
 * floats apart (e.g. 3*H*hd for a fused qkv buffer), out rows `out_stride`. Returns -1 when out of
 * memory (out is then incomplete), else 0. ---- */
int kiln_mha_forward(float *out, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                     int64_t heads, int64_t hd, int64_t stride, int64_t out_stride, float scale, int causal);

/* ---- exp and CLIP's quick_gelu on vector lanes (src/nn/vexp.h: within 1 ulp of exp over every float,
 * subnormal results rounded, inf and nan as expf), in the vector ISA chosen at run time (src/nn/simd.c) ---- */
void kiln_exp_forward(float *y, const float *x, int64_t n);
/* y[n,m] = v / (1 + exp(-1.702 v)) with v = x + b (b [m] may be NULL); y may alias x; rows on threads */
void kiln_quick_gelu_forward(float *y, const float *x, const float *b, int64_t n, int64_t m);
/* The ISA those ops (and layernorm, mha's softmax) run: "avx512", "avx2" or "generic". set_isa picks one
 * the CPU has (NULL: its best) and returns -1 if it lacks it; KILN_SIMD=<isa> caps the first choice. */
const char *kiln_simd_isa(void);
int kiln_simd_set_isa(const char *isa);

/* ---- pointwise activations (y may alias x in forward) ---- */
void kiln_gelu_forward(float *y, const float *x, int64_t n);           /* exact erf GELU */
void kiln_gelu_backward(float *dx, const float *dy, const float *x, int64_t n);
/* SwiGLU over [n, 2I] rows (gate | up): y[n,I] = silu(gate) * up */
void kiln_swiglu_forward(float *y, const float *gu, int64_t n, int64_t inter);
void kiln_swiglu_backward(float *dgu, const float *dy, const float *gu, int64_t n, int64_t inter);

/* ---- softmax over rows of d (numerically stable) ---- */
void kiln_softmax_forward(float *y, const float *x, int64_t n, int64_t d);
void kiln_softmax_backward(float *dx, const float *dy, const float *y, int64_t n, int64_t d);

/* ---- L2 normalisation of head vectors to norm `scale`, times a per-head factor t[h]
 * (t NULL: 1). x is [rows, heads, dim]; eps clamps the norm from below. Saves inv[rows*heads]
 * = 1/max(norm, eps). ---- */
void kiln_l2norm_scale_forward(float *y, float *inv, const float *x, const float *t, int64_t rows,
                               int64_t heads, int64_t dim, float scale, float eps);
void kiln_l2norm_scale_backward(float *dx, float *dt, const float *dy, const float *x, const float *t,
                                const float *inv, int64_t rows, int64_t heads, int64_t dim, float scale,
                                float eps);

/* ---- partial rotary embedding (HF "rotate_half" convention) on the first rot_dim channels of
 * each head. x is [b, t, heads, dim]; position of token (bi, ti) is pos0 + ti.
 * inv_freq has rot_dim/2 entries. In-place. Backward applies the inverse rotation to dy. ---- */
void kiln_rope_forward(float *x, const float *inv_freq, int64_t b, int64_t t, int64_t heads,
                       int64_t dim, int64_t rot_dim, int64_t pos0);
void kiln_rope_backward(float *dx, const float *inv_freq, int64_t b, int64_t t, int64_t heads,
                        int64_t dim, int64_t rot_dim, int64_t pos0);
/* HF's default inverse frequencies, computed in f32 as the reference does. Returns rot_dim. */
int64_t kiln_rope_inv_freq(float *inv_freq, int64_t head_dim, double partial_factor, double theta);

/* ---- causal GQA attention with optional sliding window.
 * q [B, Tq, NH, D]; k, v [B, Tk_cap, KV, D] (batch stride Tk_cap), keys 0..tk-1 valid;
 * query i sits at position q_pos0 + i (q_pos0 = tk - Tq). Key s is visible to query at
 * position p iff s <= p and (window == 0 or s > p - window).
 * out [B, Tq, NH, D]; probs (nullable) [B, NH, Tq, tk] saved for backward. ---- */
typedef struct {
    int64_t B, Tq, tk, tk_cap, NH, KV, D, window;
    float scale;
} kiln_attn_shape;
void kiln_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                            const kiln_attn_shape *s);
void kiln_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                             const float *q, const float *k, const float *v, const kiln_attn_shape *s);

/* ---- CCA's two causal convolutions over [B, T, C] (channels last):
 * depthwise kernel k0 (w0 [C, k0], b0 [C]) then grouped kernel k1 (w1 [C, C/groups, k1], b1 [C]),
 * over the input left-padded by P = (k0-1)+(k1-1) steps. hist [B, P, C] holds those P earlier
 * inputs (NULL: zeros, as at the start of a sequence). mid [B, T+k1-1, C] is the depthwise output
 * (saved for backward). ---- */
typedef struct {
    int64_t B, T, C, groups, k0, k1;
} kiln_conv_shape;
void kiln_cca_conv_forward(float *y, float *mid, const float *x, const float *hist, const float *w0,
                           const float *b0, const float *w1, const float *b1, const kiln_conv_shape *s);
/* dmid: workspace of B*(T+k1-1)*C floats. History gets no gradient. */
void kiln_cca_conv_backward(float *dx, float *dw0, float *db0, float *dw1, float *db1, float *dmid,
                            const float *dy, const float *x, const float *hist, const float *mid,
                            const float *w0, const float *w1, const kiln_conv_shape *s);

/* ---- routing (ZayaRouter's decision): per token, top slots over e1 classes (the last, e1-1, is the
 * skip class) by probs + bias, distinct, ties to the lower index; gate = probs of the chosen class, 0 for
 * the skip class. choice, gate [n*top]. Backward: dprobs [n,e1] += dgate at the chosen non-skip classes. */
void kiln_route_topk(int32_t *choice, float *gate, const float *probs, const float *bias, int64_t n, int64_t e1,
                     int64_t top);
void kiln_route_gate_backward(float *dprobs, const float *dgate, const int32_t *choice, int64_t n, int64_t e1,
                              int64_t top);

/* ---- mixture of SwiGLU experts (ZayaExperts), top-k slots per token.
 * The caller fills N, H, I, E, top, choice [N*top] (E = the skip class) and gate [N*top], and
 * provides the arrays; forward fills exp_off [E+1], fill [E], slot_tok/slot_k [N*top], nslots and the
 * saved xe [S,H], gu [S,2I], act [S,I], ye [S,H] (S = N*top at most). ---- */
typedef struct {
    int64_t N, H, inter, E, top; /* tokens, hidden, expert width, experts, slots per token */
    const int32_t *choice;
    const float *gate;
    int32_t *exp_off, *fill, *slot_tok, *slot_k;
    int64_t nslots;
    float *xe, *gu, *act, *ye;
} kiln_experts;
typedef struct {
    float *dye, *dact, *dgu, *dxe; /* [S,H], [S,I], [S,2I], [S,H] */
} kiln_experts_scratch;
/* out [N,H] = sum over each token's slots of gate * SwiGLU expert(in) (overwritten). */
void kiln_experts_forward(kiln_experts *x, float *out, const float *in, const float *wgu, const float *wdn);
/* dx [N,H] += ; dgate [N*top] = (0 for skipped slots); dwgu, dwdn += . */
void kiln_experts_backward(const kiln_experts *x, float *dx, float *dgate, float *dwgu, float *dwdn, const float *dout,
                           const float *wgu, const float *wdn, kiln_experts_scratch *w);

/* ---- mean cross-entropy of predicting ids[b, t+1] from logits[b, t], t < T-1 (HF's causal LM
 * loss with labels = input_ids). dlogits (nullable) gets the gradient of the mean loss, 0 at the
 * last position. Returns the loss; computes in double for the sum. ---- */
double kiln_cross_entropy(float *dlogits, const float *logits, const int64_t *ids, int64_t B, int64_t T,
                          int64_t V);

#endif
