/* kiln size's model of kiln's own CUDA trainer: the memory categories against what kiln allocates (the
 * parameter table, padded as src/models/zaya_cuda.c pads it; the optimizer state as
 * src/models/zaya_cuda_train.c sizes it) and against the trainer's report on the H200; the step by op
 * class from the profile's timed kernels, copy sweep and calibration scales; the profile section and its
 * two mergers (kiln size --bench in C, data/profiles/merge_bench.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/fsutil.h"
#include "kiln/optim.h"
#include "kiln/sizing.h"
#include "test.h"
#include "zaya_testutil.h"

static const double GIB = 1073741824.0;

/* What the CUDA trainer allocates for model m (zaya_cuda.c's padding, zaya_cuda_train.c's state). */
static void check_alloc(const kiln_zaya *m, const char *what) {
    kiln_size_shape s;
    kiln_size_shape_from_zaya(&m->cfg, &s);
    int64_t padded = 0;
    for (int i = 0; i < m->nparams; i++) padded += (m->params[i].numel + 63) & ~(int64_t)63;
    kiln_opt_param *op = calloc((size_t)m->nparams, sizeof *op);
    for (int muon = 0; muon < 2; muon++) {
        kiln_optim_hparams hp;
        memset(&hp, 0, sizeof hp);
        hp.use_muon = muon;
        kiln_optim_classify(m, &hp, op);
        int64_t state = 0, largest_muon = 0;
        for (int i = 0; i < m->nparams; i++) {
            state += kiln_optim_state_numel(&op[i]);
            if (op[i].kind == KILN_OPT_MUON && op[i].numel > largest_muon) largest_muon = op[i].numel;
        }
        kiln_size_train t;
        kiln_size_train_default(&t);
        t.gpus = 1, t.micro_batch = 2, t.seq = 16, t.muon = muon;
        kiln_size_cuda_memory cm;
        CHECK_OK(kiln_size_cuda_memory_train(&s, &t, 0, &cm));
        CHECK_MSG(cm.numel_padded == padded, "%s: padded %lld vs %lld", what, (long long)cm.numel_padded,
                  (long long)padded);
        double nw = (double)(padded + 1);
        CHECK_NEAR(cm.params, nw * 6 + (double)(m->cfg.num_layers * (m->cfg.num_experts + 1)) * 4, 0);
        CHECK_NEAR(cm.grads, nw * 4, 0);
        CHECK_MSG(cm.optim == 4.0 * (double)state, "%s (muon %d): optimizer state %.0f vs %lld floats", what, muon,
                  cm.optim / 4, (long long)state);
        CHECK_NEAR(cm.muon_work, muon ? 4.0 * (double)largest_muon : 0, 0);
        CHECK(cm.activations > 0 && cm.scratch > 0 &&
              cm.total == cm.params + cm.grads + cm.optim + cm.muon_work + cm.activations + cm.scratch + cm.pool);
    }
    free(op);
}

TEST(size_cuda_params_and_state_equal_allocation) {
    static const char *fixtures[] = ZAYA_FIXTURES;
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        kiln_zaya *m = NULL;
        CHECK_OK(zaya_fixture_model(test_src_path("tests/fixtures/zaya"), fixtures[i], &m));
        if (m) check_alloc(m, fixtures[i]);
        kiln_zaya_free(m);
    }
    /* biases everywhere, an untied head with a bias, odd widths (padding in every tensor) */
    kiln_zaya_config c;
    kiln_zaya_config_default(&c);
    c.vocab_size = 1001; c.hidden_size = 96; c.num_layers = 3; c.num_heads = 6; c.num_kv_heads = 3;
    c.head_dim = 10; c.num_experts = 5; c.top_k = 2; c.moe_intermediate = 40; c.router_hidden = 24;
    c.cca_time0 = 3; c.cca_time1 = 4; c.attention_bias = 1; c.tie_word_embeddings = 0; c.lm_head_bias = 1;
    CHECK_OK(kiln_zaya_config_validate(&c, "test"));
    kiln_zaya *m = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    if (m) check_alloc(m, "biases");
    kiln_zaya_free(m);
}

static void bench_shape(kiln_size_shape *s) {
    kiln_zaya_config c;
    kiln_zaya_config_default(&c);
    c.vocab_size = 50304; c.hidden_size = 2048; c.num_layers = 8; c.num_heads = 8; c.num_kv_heads = 2;
    c.head_dim = 128; c.num_experts = 16; c.top_k = 1; c.moe_intermediate = 2048; c.router_hidden = 256;
    c.tie_word_embeddings = 1;
    for (int l = 0; l < 8; l++) c.layer_types[l] = KILN_LAYER_HYBRID;
    kiln_size_shape_from_zaya(&c, s);
}

/* The [cuda] benchmark's report on the H200 (the lead's run B of 2026-12-02, HEAD 2f2b19d: the layout with
 * fused residual + RMSNorm, bf16 o_proj output and convolution intermediate; KILN_ATTENTION=own): parameters
 * 9.86 GiB, gradients 6.57, optimizer state 13.14, activations 10.85, backward scratch 1.53 (less one bf16
 * [N, H] since 9b7e113: 1.47), ops' pool 0.03; device peak 43.20. Activations since session 23: 10.87 with the
 * packed CCA projections (one [N, Q+2K] buffer a layer for q, k and both value halves; no router logits since
 * session 22; run s23r2's report), 9.87 without the f32 MoE output (the MLP join gathers ye; run s23r5's report).
 * The categories are kiln's own buffers: predicted to the report's two decimals. */
TEST(size_cuda_memory_matches_the_benchmark_report) {
    kiln_size_shape s;
    bench_shape(&s);
    const char *impl = getenv("KILN_ATTENTION");
    char saved[64] = "";
    if (impl) snprintf(saved, sizeof saved, "%s", impl);
    setenv("KILN_ATTENTION", "own", 1);
    kiln_size_train t;
    kiln_size_train_default(&t);
    t.gpus = 1, t.micro_batch = 4, t.seq = 4096, t.muon = 0;
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    kiln_size_cuda_memory cm;
    CHECK_OK(kiln_size_cuda_memory_train(&s, &t, p->runtime_gib * GIB, &cm));
    CHECK_NEAR(cm.params / GIB, 9.86, 0.005);
    CHECK_NEAR(cm.grads / GIB, 6.57, 0.005);
    CHECK_NEAR(cm.optim / GIB, 13.14, 0.005);
    CHECK_NEAR(cm.activations / GIB, 9.87, 0.005);
    CHECK_NEAR(cm.scratch / GIB, 1.53 - 16384.0 * 2048 * 2 / GIB, 0.005);
    CHECK(cm.pool == 0);
    CHECK(fabs(cm.total / GIB / 43.20 - 1) < 0.10);
    /* cuDNN's deterministic backward (the default): its dP [B, heads, T, T] in bf16 and the row sums; past the
     * workspace cap the trainer runs kiln's kernels (no workspace); cudnn-nondet: the f32 dQ accumulator */
    unsetenv("KILN_ATTENTION");
    unsetenv("KILN_CUDNN_WORKSPACE_MB");
    CHECK_NEAR(kiln_size_cuda_attention_workspace(&s, 4, 4096), 4.0 * 8 * 4096 * 4096 * 2 + 4.0 * 8 * 4096 * 4, 0);
    CHECK(kiln_size_cuda_attention_workspace(&s, 4, 16384) == 0); /* 16 GiB > the 4 GiB cap */
    setenv("KILN_CUDNN_WORKSPACE_MB", "0", 1);                    /* no cap */
    CHECK(kiln_size_cuda_attention_workspace(&s, 4, 16384) > 16 * GIB);
    unsetenv("KILN_CUDNN_WORKSPACE_MB");
    setenv("KILN_ATTENTION", "cudnn-nondet", 1);
    CHECK_NEAR(kiln_size_cuda_attention_workspace(&s, 4, 4096), 4.0 * 8 * 4096 * 4 + 4.0 * 8 * 4096 * 128 * 4, 0);
    setenv("KILN_ATTENTION", "own", 1);
    /* recomputation keeps one layer's set: the arena shrinks by 7 layers' sets, the scratch stays */
    double a0, s0, a1, s1;
    kiln_size_cuda_arena(&s, 4, 4096, 0, &a0, &s0);
    kiln_size_cuda_arena(&s, 4, 4096, 1, &a1, &s1);
    CHECK(s0 == s1 && a1 < a0 && fabs(a0 - cm.activations) < 1);
    /* and the arena is affine in the micro-batch except for 256-byte rounding */
    double a2, s2, a4, s4;
    kiln_size_cuda_arena(&s, 2, 4096, 0, &a2, &s2);
    kiln_size_cuda_arena(&s, 4, 4096, 0, &a4, &s4);
    CHECK(fabs(a4 / a2 - 2) < 1e-3 && fabs(s4 / s2 - 2) < 1e-3);
    /* ZeRO-1 over 8 GPUs: a rank holds an eighth of the state (no tensor is larger than that here) */
    t.gpus = 8;
    kiln_size_cuda_memory c8;
    CHECK_OK(kiln_size_cuda_memory_train(&s, &t, 0, &c8));
    CHECK_NEAR(c8.optim, cm.optim / 8, 1);
    CHECK(c8.params == cm.params && c8.grads == cm.grads);
    /* a dense shape is not what the CUDA trainer trains */
    s.arch = KILN_ARCH_DENSE, s.ffn = 4096;
    CHECK_ERR(kiln_size_cuda_memory_train(&s, &t, 0, &cm), "ZAYA");
    if (saved[0]) setenv("KILN_ATTENTION", saved, 1);
    else unsetenv("KILN_ATTENTION");
    free(p);
}

/* A small profile with timed kernels for the shape below. */
static const char *kernels_json =
    "\"kiln_kernels\": {\"source\": \"test\", "
    "\"attention\": [{\"batch\": 2, \"seq\": 128, \"heads\": 4, \"kv_heads\": 2, \"head_dim\": 64, \"window\": 0, "
    "\"fwd_us\": 50, \"bwd_us\": 170}], "
    "\"moe\": [{\"tokens\": 256, \"hidden\": 256, \"inter\": 512, \"experts\": 4, \"top_k\": 1, \"fwd_us\": 80, "
    "\"bwd_us\": 200}], "
    "\"copy_sweep\": [{\"bytes\": 1048576, \"gbs\": 1000}, {\"bytes\": 4194304, \"gbs\": 3000}], "
    "\"rates\": [%s]}";

static char *profile_text(const char *rates) {
    char *text = NULL;
    size_t len = 0;
    if (kiln_read_file(test_src_path("data/profiles/h200.json"), &text, &len)) return NULL;
    char *end = strrchr(text, '}');
    size_t cap = len + 2048;
    char *out = malloc(cap);
    *end = 0;
    char k[1024];
    snprintf(k, sizeof k, kernels_json, rates);
    snprintf(out, cap, "%s, %s}", text, k);
    free(text);
    return out;
}

static void small_shape(kiln_size_shape *s, kiln_size_setup *u) {
    kiln_size_shape_zaya_default(s);
    s->vocab = 1000, s->hidden = 256, s->layers = 2, s->heads = 4, s->kv_heads = 2, s->head_dim = 64;
    s->experts = 4, s->top_k = 1, s->expert_inter = 512, s->router_hidden = 32, s->sliding_layers = 0;
    kiln_size_setup_default(u);
    u->seq = u->train.seq = 128;
    u->train.micro_batch = 2, u->train.gpus = 1, u->train.muon = 0;
    u->tokens_per_step = 256;
}

static const kiln_size_op_class *find(const kiln_size_cuda_step *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->c[i].cls, name)) return &r->c[i];
    return NULL;
}

TEST(size_cuda_step_from_timed_kernels) {
    kiln_hw_profile *p = malloc(sizeof *p);
    char *text = profile_text("");
    CHECK_OK(kiln_hw_profile_parse(text, "t.json", p));
    free(text);
    CHECK(p->nattn_t == 1 && p->nmoe_t == 1 && p->nbw == 2 && p->nrate == 0 && p->runtime_gib > 0);
    kiln_size_shape s;
    kiln_size_setup u;
    small_shape(&s, &u);
    kiln_size_cuda_step r;
    CHECK_OK(kiln_size_cuda_step_predict(&s, p, &u, &r));
    /* the same shapes as the timed kernels: their times, once per layer */
    const kiln_size_op_class *c = find(&r, "attention (flash) fwd");
    CHECK(c && fabs(c->ms - 2 * 0.050) < 1e-12 && strstr(c->how, "same shape"));
    c = find(&r, "attention (flash) bwd");
    CHECK(c && fabs(c->ms - 2 * 0.170) < 1e-12);
    c = find(&r, "experts (dispatch + grouped GEMMs) fwd");
    CHECK(c && fabs(c->ms - 2 * 0.080) < 1e-12);
    c = find(&r, "experts (dispatch + grouped GEMMs) bwd");
    CHECK(c && fabs(c->ms - 2 * 0.200) < 1e-12);
    /* memory-bound classes: bytes over the sweep, clamped below 2 MiB moved per call: 1000 GB/s */
    c = find(&r, "RMSNorm fwd");
    CHECK(c && c->bytes && fabs(c->ms - c->work / 1000e9 * 1e3) < 1e-12);
    /* the steps add up; one micro-batch of 256 tokens */
    double sum = 0;
    for (int i = 0; i < r.n; i++) sum += r.c[i].ms;
    CHECK_NEAR(r.ms_ops, sum, 1e-9);
    CHECK(r.grad_accum == 1 && fabs(r.tokens_per_s - 256 / (r.ms_step * 1e-3)) < 1e-6);
    /* a longer sequence: the timed kernel's rate on this shape's FLOPs (causal: (T+1)/2 keys a query) */
    kiln_size_setup u2 = u;
    u2.seq = u2.train.seq = 256;
    u2.tokens_per_step = 512;
    kiln_size_cuda_step r2;
    CHECK_OK(kiln_size_cuda_step_predict(&s, p, &u2, &r2));
    c = find(&r2, "attention (flash) fwd");
    CHECK(c && fabs(c->ms - 2 * 0.050 * (256.0 * 257) / (128.0 * 129)) < 1e-12 && strstr(c->how, "nearest"));
    c = find(&r2, "experts (dispatch + grouped GEMMs) fwd");
    CHECK(c && fabs(c->ms - 2 * 0.080 * 2) < 1e-12);
    /* twice the tokens per step: two micro-batches, every class twice but the optimizer's and the norm's */
    kiln_size_setup u3 = u;
    u3.tokens_per_step = 512;
    kiln_size_cuda_step r3;
    CHECK_OK(kiln_size_cuda_step_predict(&s, p, &u3, &r3));
    CHECK(r3.grad_accum == 2);
    CHECK_NEAR(find(&r3, "linear (cuBLASLt) bwd")->ms, 2 * find(&r, "linear (cuBLASLt) bwd")->ms, 1e-12);
    CHECK_NEAR(find(&r3, "optimizer (AdamW)")->ms, find(&r, "optimizer (AdamW)")->ms, 1e-12);
    /* a measured GEMM shape is its measurement: the q projection [256 tokens, 256 out, 256 in] */
    kiln_hw_gemm_why w;
    p->gemm[0] = (kiln_hw_gemm_point){256, 256, 256, 123.0};
    CHECK_NEAR(kiln_hw_gemm_time(p, 256, 256, 256, &w), 2.0 * 256 * 256 * 256 / 123e12, 1e-18);
    CHECK_NEAR(w.tflops, 123.0, 1e-9);
    /* calibration scales multiply the model's time of their class, and only theirs */
    text = profile_text("{\"class\": \"RMSNorm fwd\", \"scale\": 2.5}, {\"class\": \"optimizer (AdamW)\", \"scale\": 0.5}");
    CHECK_OK(kiln_hw_profile_parse(text, "t.json", p));
    free(text);
    kiln_size_cuda_step r4;
    CHECK_OK(kiln_size_cuda_step_predict(&s, p, &u, &r4));
    CHECK_NEAR(find(&r4, "RMSNorm fwd")->ms, 2.5 * find(&r, "RMSNorm fwd")->ms, 1e-12);
    CHECK_NEAR(find(&r4, "optimizer (AdamW)")->ms, 0.5 * find(&r, "optimizer (AdamW)")->ms, 1e-12);
    CHECK_NEAR(find(&r4, "RMSNorm bwd")->ms, find(&r, "RMSNorm bwd")->ms, 1e-12);
    CHECK(strstr(find(&r4, "RMSNorm fwd")->how, "calibration"));
    /* a group's scale applies to its classes; a class's own scale wins over its group's */
    CHECK(!strcmp(kiln_size_op_group("residual + RMSNorm fwd"), "memory-bound ops"));
    CHECK(!strcmp(kiln_size_op_group("gradient norm"), "optimizer"));
    CHECK(!strcmp(kiln_size_op_group("LM head (cuBLASLt) bwd"), "GEMMs"));
    text = profile_text("{\"class\": \"memory-bound ops\", \"scale\": 3}, {\"class\": \"RMSNorm bwd\", \"scale\": 0.25}");
    CHECK_OK(kiln_hw_profile_parse(text, "t.json", p));
    free(text);
    kiln_size_cuda_step r5;
    CHECK_OK(kiln_size_cuda_step_predict(&s, p, &u, &r5));
    CHECK_NEAR(find(&r5, "pointwise + glue fwd")->ms, 3 * find(&r, "pointwise + glue fwd")->ms, 1e-12);
    CHECK_NEAR(find(&r5, "RMSNorm bwd")->ms, 0.25 * find(&r, "RMSNorm bwd")->ms, 1e-12);
    CHECK_NEAR(find(&r5, "linear (cuBLASLt) fwd")->ms, find(&r, "linear (cuBLASLt) fwd")->ms, 1e-12);
    CHECK_NEAR(find(&r5, "gradient norm")->ms, find(&r, "gradient norm")->ms, 1e-12);
    /* errors name the field */
    text = profile_text("{\"class\": \"RMSNorm fwd\", \"scale\": -1}");
    CHECK_ERR(kiln_hw_profile_parse(text, "t.json", p), "scale");
    free(text);
    text = profile_text("{\"scale\": 1}");
    CHECK_ERR(kiln_hw_profile_parse(text, "t.json", p), "class");
    free(text);
    text = profile_text("");
    char *cut = strstr(text, ", \"bwd_us\": 170");
    memmove(cut, cut + strlen(", \"bwd_us\": 170"), strlen(cut + strlen(", \"bwd_us\": 170")) + 1);
    CHECK_ERR(kiln_hw_profile_parse(text, "t.json", p), "kiln_kernels.attention[0]: field 'bwd_us'");
    free(text);
    text = profile_text("");
    cut = strstr(text, "\"source\": \"test\", ");
    memmove(cut, cut + strlen("\"source\": \"test\", "), strlen(cut + strlen("\"source\": \"test\", ")) + 1);
    CHECK_ERR(kiln_hw_profile_parse(text, "t.json", p), "source");
    free(text);
    s.arch = KILN_ARCH_DENSE, s.ffn = 512;
    CHECK_ERR(kiln_size_cuda_step_predict(&s, p, &u, &r), "ZAYA");
    free(p);
}

/* Muon's Newton-Schulz is priced at the peak of optim.muon_ns_precision's arithmetic (bf16 by default, TF32 at
 * half of it, strict f32 at the f32 peak): the optimizer's class grows by exactly the FLOPs over each rate. */
TEST(size_cuda_muon_newton_schulz_follows_its_precision) {
    kiln_hw_profile *p = malloc(sizeof *p);
    char *text = profile_text("");
    CHECK_OK(kiln_hw_profile_parse(text, "t.json", p));
    free(text);
    kiln_size_shape s;
    kiln_size_setup u;
    small_shape(&s, &u);
    u.train.muon = 1;
    double ms[3];
    for (int pr = 0; pr < 3; pr++) {
        u.train.ns_precision = pr;
        kiln_size_cuda_step r;
        CHECK_OK(kiln_size_cuda_step_predict(&s, p, &u, &r));
        const kiln_size_op_class *c = find(&r, "optimizer (Muon + AdamW)");
        CHECK(c != NULL);
        ms[pr] = c ? c->ms : 0;
        if (c) CHECK_MSG(strstr(c->how, pr == 2 ? "bf16 peak" : pr == 1 ? "tf32 peak" : "fp32 peak"), "%s", c->how);
    }
    /* the memory traffic is the same in all three: the differences are the Newton-Schulz times alone */
    const double f32 = p->peak_fp32 > 0 ? p->peak_fp32 : p->peak_bf16 / 16;
    const double ns_bf16 = (ms[1] - ms[2]) / (2.0 - 1.0); /* tf32 takes twice bf16's time */
    CHECK(ms[2] < ms[1] && ms[1] < ms[0]);
    CHECK_NEAR(ms[0] - ms[2], ns_bf16 * (p->peak_bf16 / f32 - 1), 1e-9 * ms[0]);
    free(p);
}

/* kiln bench's records become the kiln_kernels tables, through kiln size --bench (C) and through
 * data/profiles/merge_bench.py alike: of several grouped-GEMM paths the trainer's (default_path). */
TEST(size_cuda_merge_timed_kernels) {
    const char *dir = test_tmpdir();
    const char *bench = test_join(dir, "kernels_bench.json");
    FILE *f = fopen(bench, "w");
    fputs("{\"kiln_profile\": 1, \"attention\": ["
          "{\"device\": \"cuda\", \"backend\": \"cuda\", \"dtype\": \"bf16\", \"pass\": \"fwd\", \"batch\": 4, \"seq\": 4096, "
          "\"heads\": 8, \"kv_heads\": 2, \"head_dim\": 128, \"window\": 0, \"flops\": 1.4e11, \"time_us\": 700}, "
          "{\"device\": \"cuda\", \"backend\": \"cuda\", \"dtype\": \"bf16\", \"pass\": \"fwd_bwd\", \"batch\": 4, \"seq\": 4096, "
          "\"heads\": 8, \"kv_heads\": 2, \"head_dim\": 128, \"window\": 0, \"flops\": 4.9e11, \"time_us\": 3200}, "
          "{\"device\": \"cpu\", \"backend\": \"cpu\", \"dtype\": \"fp32\", \"pass\": \"fwd\", \"batch\": 1, \"seq\": 64, "
          "\"heads\": 8, \"kv_heads\": 2, \"head_dim\": 128, \"window\": 0, \"flops\": 1e6, \"time_us\": 70}], "
          "\"moe\": ["
          "{\"backend\": \"cuda\", \"routing\": \"balanced\", \"path\": \"lt_loop\", \"default_path\": false, \"part\": \"op\", "
          "\"pass\": \"fwd\", \"tokens\": 16384, \"hidden\": 2048, \"inter\": 2048, \"experts\": 16, \"top_k\": 1, \"time_us\": 950}, "
          "{\"backend\": \"cuda\", \"routing\": \"balanced\", \"path\": \"grouped\", \"default_path\": true, \"part\": \"op\", "
          "\"pass\": \"fwd\", \"tokens\": 16384, \"hidden\": 2048, \"inter\": 2048, \"experts\": 16, \"top_k\": 1, \"time_us\": 1746}, "
          "{\"backend\": \"cuda\", \"routing\": \"balanced\", \"path\": \"grouped\", \"default_path\": true, \"part\": \"op\", "
          "\"pass\": \"fwd_bwd\", \"tokens\": 16384, \"hidden\": 2048, \"inter\": 2048, \"experts\": 16, \"top_k\": 1, \"time_us\": 4566}, "
          "{\"backend\": \"cuda\", \"routing\": \"balanced\", \"path\": \"lt_loop\", \"default_path\": false, \"part\": \"op\", "
          "\"pass\": \"fwd_bwd\", \"tokens\": 16384, \"hidden\": 2048, \"inter\": 2048, \"experts\": 16, \"top_k\": 1, \"time_us\": 3100}, "
          "{\"backend\": \"cuda\", \"routing\": \"skewed\", \"part\": \"op\", \"pass\": \"fwd\", \"tokens\": 16384, "
          "\"hidden\": 2048, \"inter\": 2048, \"experts\": 16, \"top_k\": 1, \"time_us\": 1785}, "
          "{\"backend\": \"cuda\", \"routing\": \"balanced\", \"part\": \"down_fwd\", \"pass\": \"fwd\", \"tokens\": 16384, "
          "\"hidden\": 2048, \"inter\": 2048, \"experts\": 16, \"top_k\": 1, \"time_us\": 449}], "
          "\"membw\": [{\"device\": \"cuda\", \"kernel\": \"copy\", \"bytes_per_array\": 1048576, \"gbs_best\": 1500}, "
          "{\"device\": \"cuda\", \"kernel\": \"copy\", \"bytes_per_array\": 1073741824, \"gbs_best\": 4300}, "
          "{\"device\": \"cuda\", \"kernel\": \"triad\", \"bytes_per_array\": 1073741824, \"gbs_best\": 4400}, "
          "{\"device\": \"h2d\", \"kernel\": \"copy\", \"bytes_per_array\": 1048576, \"gbs_best\": 40}, "
          "{\"device\": \"d2h\", \"kernel\": \"copy\", \"bytes_per_array\": 1073741824, \"gbs_best\": 55}, "
          "{\"device\": \"cpu\", \"kernel\": \"copy\", \"bytes_per_array\": 1048576, \"gbs_best\": 90}]}", f);
    fclose(f);
    kiln_hw_profile *p = malloc(sizeof *p), *q = malloc(sizeof *q);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    CHECK_OK(kiln_hw_profile_merge_bench(p, bench));
    CHECK(p->nattn_t == 1 && p->nmoe_t == 1 && p->nbw == 2);
    CHECK(p->attn_t[0].kv_heads == 2 && p->attn_t[0].fwd_us == 700 && p->attn_t[0].bwd_us == 2500);
    CHECK(p->moe_t[0].tokens == 16384 && p->moe_t[0].fwd_us == 1746 && p->moe_t[0].bwd_us == 4566 - 1746);
    CHECK(p->bw[0].bytes == 2097152 && p->bw[0].gbs == 1500 && p->bw[1].gbs == 4300);
    /* merged twice: the same shapes are replaced, not added */
    CHECK_OK(kiln_hw_profile_merge_bench(p, bench));
    CHECK(p->nattn_t == 1 && p->nmoe_t == 1 && p->nbw == 2);
    /* merge_bench.py writes the same tables into a profile file */
    if (system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
        const char *prof = test_join(dir, "h200_merged.json");
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s' && python3 '%s' '%s' '%s' >/dev/null",
                 test_src_path("data/profiles/h200.json"), prof, test_src_path("data/profiles/merge_bench.py"), prof,
                 bench);
        CHECK(system(cmd) == 0);
        CHECK_OK(kiln_hw_profile_load(prof, q));
        CHECK(q->nattn_t == 1 && q->nmoe_t == 1 && q->nbw == 2);
        CHECK(q->attn_t[0].fwd_us == p->attn_t[0].fwd_us && q->attn_t[0].bwd_us == p->attn_t[0].bwd_us &&
              q->attn_t[0].heads == 8 && q->attn_t[0].window == 0);
        CHECK(q->moe_t[0].fwd_us == p->moe_t[0].fwd_us && q->moe_t[0].bwd_us == p->moe_t[0].bwd_us);
        CHECK(q->bw[0].bytes == p->bw[0].bytes && q->bw[1].gbs == p->bw[1].gbs);
        CHECK(q->mem_gbs == p->mem_gbs && q->runtime_gib == p->runtime_gib);
    }
    free(p);
    free(q);
}

TEST(size_cuda_predict_cli) {
    static char out[1 << 17];
    const char *cfg = test_join(test_tmpdir(), "bench_train.json");
    FILE *f = fopen(cfg, "w");
    fputs("{\"model\": {\"vocab_size\": 50304, \"hidden_size\": 2048, \"num_hidden_layers\": 8, "
          "\"layer_types\": [\"hybrid\", \"hybrid\", \"hybrid\", \"hybrid\", \"hybrid\", \"hybrid\", \"hybrid\", \"hybrid\"], "
          "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 128, \"num_experts\": 16, "
          "\"num_experts_per_tok\": 1, \"moe_intermediate_size\": 2048, \"router_hidden_size\": 256, "
          "\"tie_word_embeddings\": true}, \"data\": {\"seq_len\": 4096, \"micro_batch\": 4, \"grad_accum\": 1}, "
          "\"optim\": {\"muon\": false}}", f);
    fclose(f);
    char args[1200];
    snprintf(args, sizeof args, "size predict '%s' --profile h200 --gpus 1", cfg);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK(strstr(out, "GPU memory: parameters 9.86 GiB, gradients 6.57 GiB, optimizer state 13.14 GiB, "
                      "activations 9.87 GiB (+ backward scratch 1.47 GiB), ops' pool peak") != NULL);
    CHECK(strstr(out, "attention (flash) bwd") && strstr(out, "optimizer (AdamW)") && strstr(out, "CCA convolutions fwd"));
    snprintf(args, sizeof args, "size predict '%s' --profile h200 --gpus 1 --json", cfg);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    cJSON *j = cJSON_Parse(out), *k = j ? cJSON_GetObjectItem(j, "kiln_cuda") : NULL;
    CHECK(k != NULL);
    if (k) {
        cJSON *st = cJSON_GetObjectItem(k, "step"), *mem = cJSON_GetObjectItem(k, "memory_gib");
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(st, "classes")) >= 20);
        double sum = 0;
        cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(st, "classes")) sum += cJSON_GetObjectItem(c, "ms")->valuedouble;
        CHECK_NEAR(sum, cJSON_GetObjectItem(st, "ms_ops")->valuedouble, 1e-6);
        CHECK_NEAR(cJSON_GetObjectItem(mem, "activations")->valuedouble, 9.87, 0.005);
    }
    cJSON_Delete(j);
}
