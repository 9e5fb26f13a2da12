/* What `kiln train --device cuda` allocates on one GPU, byte for byte, from the shape: the categories of
 * the trainer's memory report (src/train/trainer.c) and the layouts of src/models/zaya_cuda.c.
 *  - parameters: f32 master + bf16 copy of every tensor, each padded to 64 elements (so every tensor
 *    starts on a 256-byte boundary), plus one more element, plus the balancing biases [layers, E+1];
 *  - gradients: f32 in the same layout;
 *  - optimizer state: AdamW 2 floats per (unpadded) element, Muon 1, this rank's whole tensors;
 *  - activations: one arena of 256-byte-aligned pieces for (micro-batch B, sequence T): per layer the
 *    tensors layer_layout() takes (one shared set with recomputation) and each layer's input, router
 *    state and ln1 statistics, plus the embedding output, final norm, logits, ids and counts;
 * (the layout of src/models/zaya_cuda.c as of commit 9b7e113: fused residual + RMSNorm, bf16 o_proj output
 * and convolution intermediate, no packed q|k, no bf16 copy of dln2; tests/test_size_cuda.c checks it
 * against the trainer's report on the H200)
 *  - the ops' pool (the report's "ops' pool peak"): the stream-ordered temporaries, of which one is large:
 *    cuDNN's attention backward workspace when cuDNN runs it (KILN_ATTENTION, default cudnn), its dP
 *    [B, heads, T, T] in bf16 plus kiln's row sums (deterministic), or the f32 dQ accumulator
 *    (cudnn-nondet; also what the trainer's run.deterministic false runs, which this estimate, from the
 *    environment alone, does not see: it counts the default's larger dP); past KILN_CUDNN_WORKSPACE_MB
 *    (default 4096) the trainer runs kiln's kernels instead.
 *  - backward scratch: one set of gradient buffers reused by every layer, and the attention backward's
 *    per-row workspace (B·heads·T floats).
 * What the CUDA runtime holds besides (context, cuBLAS workspaces, the ops' stream-ordered pool) is a
 * property of the machine and driver, not of the shape: the profile's measured memory.runtime_gib. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/sizing.h"
#include "sizing_internal.h"

/* Rounded up to 256 bytes in doubles (exact below 2^53): a large shape's byte count (cuDNN's dP is B·heads·T²)
 * may pass int64, where a cast would turn it negative. */
static double align256(double b) { return ceil(floor(b) / 256) * 256; }

static double piece(double n, double elem) { return align256((n > 0 ? n : 1) * elem); }

typedef struct {
    int64_t padded, muon, adamw, largest_muon; /* elements */
    int64_t largest_state[2];                  /* one tensor's optimizer state: with Muon on, AdamW only */
} tensors;

/* One tensor of the parameter table (src/models/zaya_params.c's order): padded to 64 elements on the
 * device; Muon takes 2-D and expert matrices except the embedding and the LM head (src/train/optim.c). */
static void tensor(tensors *t, int64_t numel, int muon) {
    t->padded += (numel + 63) & ~(int64_t)63;
    int64_t st = muon ? numel : 2 * numel;
    if (st > t->largest_state[1]) t->largest_state[1] = st;
    if (2 * numel > t->largest_state[0]) t->largest_state[0] = 2 * numel;
    if (muon) {
        t->muon += numel;
        if (numel > t->largest_muon) t->largest_muon = numel;
    } else {
        t->adamw += numel;
    }
}

static void walk_fn(const kiln_size_shape *s, void (*fn)(void *, const kiln_size_tensor *), void *ctx);

static void add_tensor(void *ctx, const kiln_size_tensor *x) { tensor(ctx, x->numel, x->muon); }

static void walk(const kiln_size_shape *s, tensors *t) {
    memset(t, 0, sizeof *t);
    walk_fn(s, add_tensor, t);
}

void kiln_size_tensor_walk(const kiln_size_shape *s, void (*fn)(void *ctx, const kiln_size_tensor *t), void *ctx) {
    walk_fn(s, fn, ctx);
}

/* An AdamW tensor of n elements; a Muon matrix set (mats x rows x cols) */
#define A(n) fn(t, &(kiln_size_tensor){(n), 0, 0, 0, 0})
#define M(m, r, c) fn(t, &(kiln_size_tensor){(m) * (r) * (c), (m), (r), (c), 1})
static void walk_fn(const kiln_size_shape *s, void (*fn)(void *, const kiln_size_tensor *), void *t) {
    const int64_t H = s->hidden, Q = s->heads * s->head_dim, K = s->kv_heads * s->head_dim, C = Q + K;
    const int64_t R = s->router_hidden, E = s->experts, I = s->expert_inter;
    const int ab = s->attention_bias;
    A(s->vocab * H);
    A(H), A(H);
    for (int64_t l = 0; l < s->layers; l++) {
        A(H);
        M(1, Q, H);
        if (ab) A(Q);
        M(1, K, H);
        if (ab) A(K);
        M(1, K / 2, H);
        if (ab) A(K / 2);
        M(1, K / 2, H);
        if (ab) A(K / 2);
        A(C * s->cca_time0), A(C);
        A(C * s->head_dim * s->cca_time1), A(C);
        A(s->kv_heads);
        M(1, H, Q);
        if (ab) A(H);
        for (int i = 0; i < 5; i++) A(H); /* post-attention norm, residual scaling */
        M(1, R, H), A(R);
        if (l > 0) A(R);
        A(R);
        M(1, R, R), A(R), M(1, R, R), A(R);
        M(1, E + 1, R);
        M(E, 2 * I, H), M(E, H, I);
        for (int i = 0; i < 4; i++) A(H);
    }
    A(H);
    if (!s->tied) A(s->vocab * H);
    if (s->lm_head_bias) A(s->vocab);
}
#undef A
#undef M

/* zaya_cuda.c's layer_layout(): one layer's saved activations. */
static double layer_bytes(const kiln_size_shape *s, double B, double T) {
    const double N = B * T, H = (double)s->hidden, NH = (double)s->heads, KV = (double)s->kv_heads;
    const double Q = NH * (double)s->head_dim, K = KV * (double)s->head_dim, C = Q + K, R = (double)s->router_hidden;
    const double E1 = (double)s->experts + 1, S = N * (double)s->top_k, I = (double)s->expert_inter;
    double b = 0;
    b += piece(N * H, 2);                                                     /* ln1 */
    b += piece(N * (Q + 2 * K), 2);                                           /* qkv: the four projections */
    b += piece(B * (T + (double)s->cca_time1 - 1) * C, 2);                    /* mid */
    b += piece(N * Q, 2) + piece(N * K, 2);                                   /* qpre, kpre */
    b += piece(N * NH, 4) + piece(N * KV, 4);                                 /* qinv, kinv */
    b += piece(N * Q, 2) + piece(N * K, 2) + piece(N * K, 2);                 /* qr, kr, v */
    b += piece(N * Q, 2) + piece(B * NH * T, 4);                              /* att, lse */
    b += piece(N * H, 2) + piece(N * H, 4) + piece(N * H, 2) + piece(N, 4);   /* o, res1, ln2, its rstd */
    b += piece(N * R, 2) + piece(N, 4) + 4 * piece(N * R, 2);                 /* rn, its rstd, f1 a1 f2 a2 */
    b += piece(N * E1, 4);                                                    /* router probabilities */
    b += piece(S, 4) + piece(S, 4) + piece(E1 + 1, 4) + 3 * piece(S, 4);      /* choice gate offsets slots */
    b += piece(S * H, 2) + piece(S * 2 * I, 2) + piece(S * I, 2) + piece(S * H, 2); /* xe gu act ye */
    /* moe: the experts' gated sum, f32, unless the MLP join forms it from ye (top-1 routing, rows the residual
     * norm's ring takes: kiln_residual_norm_gather_ok; KILN_MOE_COMBINE=separate keeps it) */
    const char *comb = getenv("KILN_MOE_COMBINE");
    const int gather = s->top_k == 1 && s->hidden % 8 == 0 && s->hidden <= 4096 && !(comb && !strcmp(comb, "separate"));
    if (!gather) b += piece(N * H, 4);
    return b;
}

void kiln_size_cuda_arena(const kiln_size_shape *s, int64_t batch, int64_t seq, int recompute, double *arena,
                          double *scratch) {
    const double B = (double)batch, T = (double)seq, N = B * T, H = (double)s->hidden, L = (double)s->layers;
    const double Q = (double)(s->heads * s->head_dim), K = (double)(s->kv_heads * s->head_dim), C = Q + K;
    const double R = (double)s->router_hidden, E1 = (double)s->experts + 1, S = N * (double)s->top_k;
    const double I = (double)s->expert_inter;
    /* arena_layout(): x0, xf, hn, its rstd, logits, ids, loss, counts; then the layers */
    double a = piece(N * H, 4) + piece(N * H, 4) + piece(N * H, 2) + piece(N, 4) + piece(N * (double)s->vocab, 2) +
               piece(N, 8) + piece(1, 4) + piece(L * E1, 8);
    a += (recompute ? 1 : L) * layer_bytes(s, B, T);
    a += L * (piece(N * H, 4) + piece(N * R, 2) + piece(N, 4)); /* every layer's input, router state, ln1 rstd */
    *arena = a;
    /* scratch_layout() */
    double w = 5 * piece(N * H, 4) + 3 * piece(N * H, 2);
    w += piece(S * H, 2) + piece(S * I, 2) + piece(S * 2 * I, 2) + piece(S * H, 2) + piece(S, 4);
    w += piece(N * E1, 2); /* the router's logit gradient */
    w += 7 * piece(N * R, 2) + 3 * piece(N * R, 4);
    w += 3 * piece(N * Q, 2) + 3 * piece(N * K, 2) + piece(N * (Q + 2 * K), 2);
    w += piece(B * (T + (double)s->cca_time1 - 1) * C, 4);
    w += piece(B * (double)s->heads * T * 4, 1); /* kiln_attention_backward_cuda_work */
    *scratch = w;
}

double kiln_size_cuda_attention_workspace(const kiln_size_shape *s, int64_t batch, int64_t seq) {
    const char *impl = getenv("KILN_ATTENTION"), *cap_env = getenv("KILN_CUDNN_WORKSPACE_MB");
    if (impl && *impl && strcmp(impl, "cudnn") && strcmp(impl, "cudnn-nondet")) return 0; /* kiln's kernels */
    const int nondet = impl && !strcmp(impl, "cudnn-nondet");
    const double B = (double)batch, T = (double)seq, NH = (double)s->heads, D = (double)s->head_dim;
    double ws = nondet ? 0 : align256(B * NH * T * T * 2) + align256(B * NH * T * 4);
    if (nondet) ws = align256(B * NH * T * 4) + align256(B * NH * T * D * 4);
    const double cap = (cap_env && *cap_env ? atof(cap_env) : 4096) * 1048576.0;
    return cap > 0 && ws > cap ? 0 : ws;
}

kiln_error *kiln_size_cuda_memory_train(const kiln_size_shape *s, const kiln_size_train *t, double runtime_bytes,
                                        kiln_size_cuda_memory *m) {
    memset(m, 0, sizeof *m);
    KILN_TRY(kiln_size_shape_validate(s));
    if (s->arch != KILN_ARCH_ZAYA)
        return kiln_errorf(KILN_EINVAL, "kiln's CUDA trainer trains ZAYA shapes (this one is dense)");
    KILN_TRY(kiln_size_check_run("CUDA memory", t->gpus, t->micro_batch, t->seq, -1));
    tensors tt;
    walk(s, &tt);
    const double G = (double)t->gpus, nw = (double)(tt.padded + 1);
    m->numel_padded = tt.padded;
    m->params = nw * (4 + 2) + (double)(s->layers * (s->experts + 1)) * 4;
    m->grads = nw * 4;
    /* ZeRO-1 gives whole tensors: a rank holds at least its share and at least the largest tensor's state */
    double state = t->muon ? 2 * (double)tt.adamw + (double)tt.muon : 2 * (double)(tt.adamw + tt.muon);
    double largest = (double)tt.largest_state[t->muon ? 1 : 0];
    double mine = state / G;
    if (G > 1 && mine < largest) mine = largest;
    m->optim = 4 * mine;
    m->muon_work = t->muon && tt.muon ? 4 * (double)tt.largest_muon : 0;
    kiln_size_cuda_arena(s, t->micro_batch, t->seq, t->recompute, &m->activations, &m->scratch);
    m->pool = kiln_size_cuda_attention_workspace(s, t->micro_batch, t->seq);
    m->runtime = runtime_bytes;
    m->total = m->params + m->grads + m->optim + m->muon_work + m->activations + m->scratch + m->pool + m->runtime;
    return NULL;
}
