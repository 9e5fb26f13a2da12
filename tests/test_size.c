/* kiln size: parameter counts against kiln's own parameter table, FLOP and memory conventions,
 * the GEMM quantization model, hardware profiles, the CLI and its errors. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kiln/fsutil.h"
#include "kiln/log.h"
#include "kiln/optim.h"
#include "kiln/sizing.h"
#include "models/zaya_internal.h"
#include "test.h"
#include "zaya_testutil.h"

static const char *fixtures[] = ZAYA_FIXTURES;

/* Compare the cost model's counts with a model's parameter table, tensor class by tensor class. */
static void check_counts(const kiln_zaya *m, const char *what) {
    kiln_size_shape s;
    kiln_size_params p;
    kiln_size_shape_from_zaya(&m->cfg, &s);
    kiln_size_count(&s, &p);
    int64_t experts = 0, embed = 0;
    for (int i = 0; i < m->nparams; i++) {
        const kiln_param_info *t = &m->params[i];
        if (strstr(t->name, "mlp.experts.")) experts += t->numel;
        if (strstr(t->name, "embed_tokens") || strstr(t->name, "lm_head")) embed += t->numel;
    }
    int64_t active = (int64_t)m->numel - experts + experts / m->cfg.num_experts * m->cfg.top_k;
    CHECK_MSG(p.total == (int64_t)m->numel, "%s: total %lld vs allocated %zu", what, (long long)p.total, m->numel);
    CHECK_MSG(p.experts_total == experts, "%s: experts %lld vs %lld", what, (long long)p.experts_total, (long long)experts);
    CHECK_MSG(p.active == active, "%s: active %lld vs %lld", what, (long long)p.active, (long long)active);
    CHECK_MSG(p.embedding == embed, "%s: embedding %lld vs %lld", what, (long long)p.embedding, (long long)embed);
    CHECK(p.total_nonembed == p.total - p.embedding && p.active_nonembed == p.active - p.embedding);
    /* the optimizer split of src/train/optim.c */
    kiln_optim_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.use_muon = 1;
    kiln_opt_param *op = calloc((size_t)m->nparams, sizeof *op);
    kiln_optim_classify(m, &hp, op);
    int64_t muon = 0, adamw = 0;
    for (int i = 0; i < m->nparams; i++) {
        if (op[i].kind == KILN_OPT_MUON) muon += op[i].numel;
        else adamw += op[i].numel;
    }
    free(op);
    CHECK_MSG(p.muon == muon && p.adamw == adamw, "%s: muon %lld/%lld adamw %lld/%lld", what, (long long)p.muon,
              (long long)muon, (long long)p.adamw, (long long)adamw);
}

TEST(size_params_equal_fixture_models) {
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        kiln_zaya *m = NULL;
        CHECK_OK(zaya_fixture_model(test_src_path("tests/fixtures/zaya"), fixtures[i], &m));
        if (m) check_counts(m, fixtures[i]);
        kiln_zaya_free(m);
    }
}

TEST(size_params_equal_other_models) {
    /* biases everywhere, untied head, top-2, odd widths, a window; built and allocated by kiln */
    kiln_zaya_config c;
    kiln_zaya_config_default(&c);
    c.vocab_size = 1000; c.hidden_size = 96; c.num_layers = 5; c.num_heads = 6; c.num_kv_heads = 3;
    c.head_dim = 16; c.num_experts = 5; c.top_k = 2; c.moe_intermediate = 40; c.router_hidden = 24;
    c.cca_time0 = 3; c.cca_time1 = 4; c.attention_bias = 1; c.tie_word_embeddings = 0; c.lm_head_bias = 1;
    c.sliding_window = 7; c.layer_types[1] = c.layer_types[3] = KILN_LAYER_HYBRID_SLIDING;
    for (int variant = 0; variant < 3; variant++) {
        if (variant == 1) { c.attention_bias = 0; c.tie_word_embeddings = 1; c.lm_head_bias = 0; c.num_layers = 1; }
        if (variant == 2) { c.num_layers = 3; c.num_kv_heads = 1; c.num_experts = 1; c.top_k = 1; }
        CHECK_OK(kiln_zaya_config_validate(&c, "test"));
        kiln_zaya *m = NULL;
        CHECK_OK(kiln_zaya_create(&c, &m));
        if (m) check_counts(m, variant == 0 ? "biases" : variant == 1 ? "one layer" : "one expert");
        kiln_zaya_free(m);
    }
    /* ZAYA1-8B: the parameter table alone (allocating 8.8B floats is not a test) */
    kiln_zaya m0;
    memset(&m0, 0, sizeof m0);
    kiln_zaya_config_default(&m0.cfg);
    CHECK_OK(kiln_zaya_build_params(&m0));
    check_counts(&m0, "zaya1-8b");
    kiln_size_shape s;
    kiln_size_params p;
    kiln_size_shape_from_zaya(&m0.cfg, &s);
    kiln_size_count(&s, &p);
    /* the paper's budget: 8.3B total, 760M active non-embedding (within 1%) */
    CHECK_NEAR((double)p.total_nonembed / 8.3e9, 1.0, 0.01);
    CHECK_NEAR((double)p.active_nonembed / 760e6, 1.0, 0.01);
    free(m0.params);
}

TEST(size_params_dense_llama2_7b) {
    /* Llama-2-7B has 6,738,415,616 parameters (HF's num_parameters) */
    kiln_size_shape s;
    memset(&s, 0, sizeof s);
    s.arch = KILN_ARCH_DENSE; s.vocab = 32000; s.hidden = 4096; s.layers = 32; s.heads = 32; s.kv_heads = 32;
    s.head_dim = 128; s.ffn = 11008; s.tied = 0;
    kiln_size_params p;
    kiln_size_count(&s, &p);
    CHECK(p.total == 6738415616LL);
    CHECK(p.active == p.total);
    CHECK(p.embedding == 2LL * 32000 * 4096);
}

TEST(size_flops_conventions) {
    /* visible keys: brute force over (query, key) pairs */
    for (int64_t T = 1; T <= 9; T++)
        for (int64_t W = 0; W <= 10; W++) {
            int64_t pairs = 0;
            for (int64_t q = 0; q < T; q++)
                for (int64_t k = 0; k <= q; k++) pairs += W == 0 || q - W < k;
            CHECK_NEAR(kiln_size_visible_keys(T, W), (double)pairs / (double)T, 1e-12);
        }
    kiln_size_shape s;
    memset(&s, 0, sizeof s);
    s.arch = KILN_ARCH_DENSE; s.vocab = 1000; s.hidden = 64; s.layers = 2; s.heads = 4; s.kv_heads = 2;
    s.head_dim = 16; s.ffn = 128; s.tied = 1;
    kiln_size_flops f, fr;
    kiln_size_flops_per_token(&s, 8, 0, &f);
    kiln_size_flops_per_token(&s, 8, 1, &fr);
    kiln_size_params p;
    kiln_size_count(&s, &p);
    /* forward GEMMs: 2 FLOPs per weight of every matrix a token multiplies (norms are not GEMMs), lm_head included */
    double matrices = (double)(p.total - p.embedding) - (double)(2 * s.layers + 1) * 64;
    CHECK_NEAR(f.gemm, 2 * (matrices + 1000.0 * 64), 1e-6);
    CHECK_NEAR(f.attn, 4.0 * 64 * 4.5 * 2, 1e-9); /* 4 x query channels x mean visible keys (T=8: 4.5) x layers */
    CHECK_NEAR(f.bwd, 2 * f.gemm + 2.5 * f.attn, 1e-6);
    CHECK(f.recompute == 0 && fr.recompute == f.fwd && fr.train == f.train + f.fwd);
    /* a sliding window lowers attention only */
    s.sliding_layers = 1; s.sliding_window = 2;
    kiln_size_flops fw;
    kiln_size_flops_per_token(&s, 8, 0, &fw);
    CHECK_NEAR(fw.attn, 4.0 * 64 * (4.5 + (3.0 + 6 * 2) / 8), 1e-9);
    CHECK(fw.gemm == f.gemm);
}

TEST(size_memory_zero1_and_kv) {
    kiln_size_shape s;
    kiln_size_shape_zaya_default(&s);
    kiln_size_params p;
    kiln_size_count(&s, &p);
    kiln_size_train t;
    kiln_size_train_default(&t);
    kiln_size_memory m1, m8, ma, mr;
    t.gpus = 1; kiln_size_memory_train(&s, &t, &m1);
    t.gpus = 8; kiln_size_memory_train(&s, &t, &m8);
    CHECK_NEAR(m1.weights, 2.0 * (double)p.total, 1);
    CHECK_NEAR(m1.grads, 4.0 * (double)p.total, 1);
    CHECK(m8.weights == m1.weights && m8.grads == m1.grads);
    CHECK_NEAR(m8.master * 8, m1.master, 1);
    CHECK_NEAR(m8.optim * 8, m1.optim, 1);
    CHECK_NEAR(m1.optim, 4.0 * (double)p.muon + 8.0 * (double)p.adamw, 1);
    t.muon = 0; t.gpus = 1; kiln_size_memory_train(&s, &t, &ma);
    CHECK_NEAR(ma.optim, 8.0 * (double)p.total, 1);
    /* fp32 weights carry no separate master copy; bf16 gradients halve the buffer */
    kiln_size_memory mf;
    t.muon = 1; t.weight_bytes = 4; t.grad_bytes = 2; kiln_size_memory_train(&s, &t, &mf);
    CHECK_NEAR(mf.weights, 4.0 * (double)p.total, 1);
    CHECK(mf.master == 0);
    CHECK_NEAR(mf.grads, 2.0 * (double)p.total, 1);
    t.weight_bytes = 2; t.grad_bytes = 4;
    t.muon = 1; t.recompute = 1; kiln_size_memory_train(&s, &t, &mr);
    CHECK(mr.activations < m1.activations / 4);
    /* KV cache: what zaya_decode.c allocates, in floats (4 bytes) */
    kiln_zaya_config c;
    CHECK_OK(kiln_zaya_config_load(test_src_path("tests/fixtures/zaya/many_experts/config.json"), &c));
    kiln_size_shape_from_zaya(&c, &s);
    kiln_size_kv kv;
    kiln_size_kv_cache(&s, 3, 50, 4, &kv);
    const double L = 4, B = 3, K = 2 * 8, C = 6 * 8 + K, P = (3 - 1) + (3 - 1);
    CHECK_NEAR(kv.kv, 4 * 2 * L * B * 50 * K, 1e-9);
    CHECK_NEAR(kv.conv_state, 4 * L * B * P * C, 1e-9);
    CHECK_NEAR(kv.vprev, 4 * L * B * K / 2, 1e-9);
}

TEST(size_gemm_quantization_and_interpolation) {
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    /* at a measured shape the prediction is the measurement (its volume is measured once) */
    kiln_hw_gemm_why w;
    kiln_hw_gemm_time(p, 8192, 8192, 8192, &w);
    CHECK_NEAR(w.tflops, 793.4, 1e-6);
    kiln_hw_gemm_time(p, 2048, 2048, 2048, &w);
    CHECK_NEAR(w.tflops, 689.1, 1e-6);
    /* wave quantization: 132 tiles of 128x256 fill one wave over 132 SMs, one tile more needs two */
    double t1 = kiln_hw_gemm_time(p, 128 * 12, 256 * 11, 8192, &w);
    CHECK(w.tiles == 132 && w.waves == 1 && w.wave_util == 1 && w.tile_util == 1);
    CHECK(w.tile_m == 128 && w.tile_n == 256);
    double t2 = kiln_hw_gemm_time(p, 128 * 12 + 1, 256 * 11, 8192, &w);
    /* 143 tiles of 128x256 would need 2 waves (54% full); the chosen tile quantizes at least as well
     * after paying its per-tile efficiency, and the time follows from it exactly */
    double q = w.tile_util * w.wave_util * w.tile_eff;
    CHECK(q >= (1537.0 / 1664) * (143.0 / 264) - 1e-12);
    CHECK(w.tile_m == 64 || w.tile_n == 128);
    CHECK_NEAR(t2 / t1, (1537.0 / 1536) / q, 1e-3); /* base efficiency moves with the volume */
    CHECK(t2 > 1.3 * t1);
    /* tile quantization: N = 257 costs two tiles of 256 (or three of 128 at 90%: 0.67 x 0.9 < ... ) */
    kiln_hw_gemm_time(p, 4096, 257, 4096, &w);
    CHECK(w.tile_n == 256 || w.tile_n == 128);
    CHECK_NEAR(w.tile_util, 257.0 / (double)(((257 + w.tile_n - 1) / w.tile_n) * w.tile_n), 1e-12);
    /* grouped: 16 experts' tiles share the waves, so the full-size tile fills them; alone, one expert's
     * GEMM needs smaller, slower tiles */
    kiln_hw_gemm_why g;
    kiln_hw_gemm_time_grouped(p, 16, 256, 4096, 2048, &g);
    kiln_hw_gemm_time(p, 256, 4096, 2048, &w);
    CHECK_MSG(g.tflops > 1.2 * w.tflops && g.tile_m * g.tile_n > w.tile_m * w.tile_n, "grouped %g waves %g util %g TF; "
              "single %g waves %g util %g TF", g.waves, g.wave_util, g.tflops, w.waves, w.wave_util, w.tflops);
    /* head dim 96 runs the padded 128 kernel: 0.75 of its rate */
    CHECK_NEAR(kiln_hw_attn_eff(p, 96, 0), 0.75 * kiln_hw_attn_eff(p, 128, 0), 1e-12);
    /* comm: one GPU costs nothing; 8 GPUs at the intra-node bus bandwidth */
    CHECK(kiln_hw_comm_time(p, 0, 1e9, 1) == 0);
    CHECK_NEAR(kiln_hw_comm_time(p, 0, 1e9, 8), 1e9 * 7 / 8 / 360e9 + 20e-6, 1e-12);
    free(p);
}

static kiln_error *parse_file(const char *path, kiln_hw_profile *p) { return kiln_hw_profile_load(path, p); }

TEST(size_profiles_builtin_and_errors) {
    kiln_hw_profile *p = malloc(sizeof *p), *q = malloc(sizeof *q);
    const char *const *names = kiln_hw_builtin_names();
    int n = 0;
    for (int i = 0; names[i]; i++, n++) {
        CHECK_OK(kiln_hw_profile_load(names[i], p));
        /* compiled in == the file under data/profiles */
        char rel[96];
        snprintf(rel, sizeof rel, "data/profiles/%s.json", names[i]);
        CHECK_OK(parse_file(test_src_path(rel), q));
        CHECK(p->peak_bf16 == q->peak_bf16 && p->sm_count == q->sm_count && p->ngemm == q->ngemm &&
              !strcmp(p->device, q->device));
    }
    CHECK(n == 3);
    CHECK_OK(kiln_hw_profile_load("mi300x", p));
    CHECK(strstr(p->source, "datasheet") && p->sm_count == 304 && p->mem_gib == 192);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    CHECK(p->ngemm == 6 && strstr(p->gemm_source, "measured"));
    CHECK_ERR(kiln_hw_profile_load("a100", p), "unknown profile 'a100'");
    /* missing fields name themselves */
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(test_src_path("data/profiles/h200.json"), &text, &len));
    char *cut = strstr(text, "\"sm_count\": 132, ");
    CHECK(cut != NULL);
    if (cut) memmove(cut, cut + strlen("\"sm_count\": 132, "), strlen(cut + strlen("\"sm_count\": 132, ")) + 1);
    CHECK_ERR(kiln_hw_profile_parse(text, "x.json", p), "sm_count");
    free(text);
    CHECK_ERR(kiln_hw_profile_parse("{\"kiln_hw_profile\": 1, \"name\": \"x\", \"device\": \"d\", \"source\": \"s\"}",
                                    "y.json", p), "compute");
    CHECK_ERR(kiln_hw_profile_parse("{\"kiln_profile\": 1, \"bench\": \"gemm\"}", "bench.json", p),
              "is a `kiln bench` profile");
    /* merging kiln bench measurements replaces the GEMM table */
    const char *dir = test_tmpdir();
    const char *bench = test_join(dir, "gemm.json");
    FILE *f = fopen(bench, "w");
    fputs("{\"kiln_profile\": 1, \"bench\": \"gemm\", \"gemm\": [{\"backend\": \"cublaslt\", \"dtype\": \"bf16\", "
          "\"m\": 4096, \"n\": 4096, \"k\": 4096, \"layout\": \"NN\", \"tflops\": 500.0}]}", f);
    fclose(f);
    CHECK_OK(kiln_hw_profile_load("mi300x", p));
    CHECK_OK(kiln_hw_profile_merge_bench(p, bench));
    kiln_hw_gemm_why w;
    kiln_hw_gemm_time(p, 4096, 4096, 4096, &w);
    CHECK(p->ngemm == 1);
    CHECK_NEAR(w.tflops, 500.0, 1e-6);
    const char *cpu = test_join(dir, "cpu.json");
    f = fopen(cpu, "w");
    fputs("{\"kiln_profile\": 1, \"bench\": \"gemm\", \"gemm\": [{\"backend\": \"openblas\", \"dtype\": \"fp32\", "
          "\"m\": 64, \"n\": 64, \"k\": 64, \"tflops\": 0.1}]}", f);
    fclose(f);
    CHECK_ERR(kiln_hw_profile_merge_bench(p, cpu), "no GPU measurements");
    /* comm, membw and attention records: the collective time and the attention efficiency follow them */
    const char *more = test_join(dir, "more.json");
    f = fopen(more, "w");
    fputs("{\"kiln_profile\": 1, \"bench\": \"mixed\", "
          "\"comm\": [{\"backend\": \"nccl\", \"collective\": \"reduce_scatter\", \"ranks\": 8, \"bytes\": 1048576, "
          "\"busbw_gbs\": 100.0}, {\"backend\": \"nccl\", \"collective\": \"reduce_scatter\", \"ranks\": 8, "
          "\"bytes\": 4194304, \"busbw_gbs\": 200.0}, {\"backend\": \"local\", \"collective\": \"all_gather\", "
          "\"ranks\": 1, \"bytes\": 4194304, \"busbw_gbs\": 9.0}], "
          "\"membw\": [{\"device\": \"cpu\", \"kernel\": \"copy\", \"gbs_best\": 99999.0}, "
          "{\"device\": \"cuda\", \"kernel\": \"copy\", \"gbs_best\": 4000.0}], "
          "\"attention\": [{\"backend\": \"cuda\", \"dtype\": \"bf16\", \"pass\": \"fwd\", \"batch\": 1, \"seq\": 4096, "
          "\"heads\": 8, \"head_dim\": 128, \"window\": 0, \"flops\": 1e12, \"time_us\": 2000}, "
          "{\"backend\": \"cuda\", \"dtype\": \"bf16\", \"pass\": \"fwd_bwd\", \"batch\": 1, \"seq\": 4096, \"heads\": 8, "
          "\"head_dim\": 128, \"window\": 0, \"flops\": 3.5e12, \"time_us\": 7000}]}", f);
    fclose(f);
    CHECK_OK(kiln_hw_profile_merge_bench(p, more));
    CHECK(p->nrs == 2 && p->nag == 0 && p->mem_gbs == 4000.0 && p->nattn == 1);
    /* 1e12 FLOPs in 2 ms = 500 TFLOP/s forward; backward 2.5e12 in 5 ms = 500 TFLOP/s */
    CHECK_NEAR(kiln_hw_attn_eff(p, 128, 0), 500.0 / p->peak_bf16, 1e-9);
    CHECK_NEAR(kiln_hw_attn_eff(p, 128, 1), 500.0 / p->peak_bf16, 1e-9);
    /* `kiln bench attention --device cuda` profiles (bench/attn_gpu.sh writes one per shape): per head dim the
     * full-causal record with the most work; windowed records are left out; a second file adds head dims */
    const char *ag = test_join(dir, "attn_kiln_h128.json"), *ag2 = test_join(dir, "attn_kiln_h64.json");
#define ATT(pass, b, t, d, w, fl, us)                                                                     \
    "{\"backend\": \"cuda\", \"device\": \"cuda\", \"dtype\": \"bf16\", \"pass\": \"" pass "\", \"batch\": " #b \
    ", \"seq\": " #t ", \"heads\": 8, \"head_dim\": " #d ", \"window\": " #w ", \"flops\": " #fl ", \"time_us\": " #us "}"
    f = fopen(ag, "w");
    fputs("{\"kiln_profile\": 1, \"attention\": [" ATT("fwd", 4, 4096, 128, 0, 4e12, 10000) ","
          ATT("fwd_bwd", 4, 4096, 128, 0, 14e12, 45000) "," ATT("fwd", 1, 1024, 128, 0, 1e11, 1000) ","
          ATT("fwd_bwd", 1, 1024, 128, 0, 3.5e11, 3500) "," ATT("fwd", 4, 4096, 128, 1024, 1e12, 20000) ","
          ATT("fwd_bwd", 4, 4096, 128, 1024, 3.5e12, 70000) "]}", f);
    fclose(f);
    f = fopen(ag2, "w");
    fputs("{\"kiln_profile\": 1, \"attention\": [" ATT("fwd", 4, 4096, 64, 0, 2e12, 6250) ","
          ATT("fwd_bwd", 4, 4096, 64, 0, 7e12, 31250) "]}", f);
    fclose(f);
#undef ATT
    kiln_hw_profile *fresh = malloc(sizeof *fresh);
    CHECK_OK(kiln_hw_profile_load("h200", fresh));
    CHECK_OK(kiln_hw_profile_merge_bench(fresh, ag));
    CHECK_OK(kiln_hw_profile_merge_bench(fresh, ag2));
    CHECK(fresh->nattn == 2 && strstr(fresh->attention_source, "attn_kiln_h128"));
    /* 4e12 FLOPs in 10 ms = 400 TFLOP/s forward; backward 1e13 in 35 ms = 285.7 TFLOP/s */
    CHECK_NEAR(kiln_hw_attn_eff(fresh, 128, 0), 400.0 / fresh->peak_bf16, 1e-9);
    CHECK_NEAR(kiln_hw_attn_eff(fresh, 128, 1), 1e13 / 35e-3 / 1e12 / fresh->peak_bf16, 1e-9);
    CHECK_NEAR(kiln_hw_attn_eff(fresh, 64, 0), 320.0 / fresh->peak_bf16, 1e-9);
    CHECK_NEAR(kiln_hw_attn_eff(fresh, 96, 0), 0.75 * 400.0 / fresh->peak_bf16, 1e-9);
    const char *bad = test_join(dir, "not_a_profile.json");
    f = fopen(bad, "w");
    fputs("{\"attention\": []}", f);
    fclose(f);
    CHECK_ERR(kiln_hw_profile_merge_bench(fresh, bad), "not a kiln bench profile");
    free(fresh);
    /* 2 MiB: halfway in log2 between 1 and 4 MiB -> 150 GB/s */
    CHECK_NEAR(kiln_hw_comm_time(p, 0, 2097152, 8), 2097152.0 * 7 / 8 / 150e9 + p->comm_latency_us * 1e-6, 1e-12);
    free(p);
    free(q);
}

/* `kiln bench comm` records stand for the GPUs' interconnect only when measured between GPUs (backend nccl):
 * MPI on CPU ranks ("mpi") and one process ("local") were merged as the interconnect, and the interconnect's
 * source, which --explain and the header print, still said it was an estimate. */
TEST(size_bench_comm_only_gpu_records) {
    const char *dir = test_tmpdir();
    char mpi[600], mixed[600], gemm[600];
    snprintf(mpi, sizeof mpi, "%s", test_join(dir, "comm_mpi.json"));
    snprintf(mixed, sizeof mixed, "%s", test_join(dir, "comm_mixed.json"));
    snprintf(gemm, sizeof gemm, "%s", test_join(dir, "gemm.json"));
    FILE *f = fopen(mpi, "w");
    fputs("{\"kiln_profile\": 1, \"bench\": \"comm\", \"comm\": ["
          "{\"backend\": \"mpi\", \"collective\": \"reduce_scatter\", \"ranks\": 2, \"bytes\": 1048576, \"busbw_gbs\": 5.0}, "
          "{\"backend\": \"mpi\", \"collective\": \"all_gather\", \"ranks\": 2, \"bytes\": 1048576, \"busbw_gbs\": 6.0}]}", f);
    fclose(f);
    f = fopen(mixed, "w");
    fputs("{\"kiln_profile\": 1, \"bench\": \"comm\", \"comm\": ["
          "{\"backend\": \"nccl\", \"collective\": \"reduce_scatter\", \"ranks\": 8, \"bytes\": 1048576, \"busbw_gbs\": 100.0}, "
          "{\"backend\": \"mpi\", \"collective\": \"reduce_scatter\", \"ranks\": 2, \"bytes\": 1048576, \"busbw_gbs\": 5.0}, "
          "{\"backend\": \"local\", \"collective\": \"all_gather\", \"ranks\": 1, \"bytes\": 1048576, \"busbw_gbs\": 9.0}]}", f);
    fclose(f);
    f = fopen(gemm, "w");
    fputs("{\"kiln_profile\": 1, \"bench\": \"gemm\", \"gemm\": [{\"backend\": \"cublaslt\", \"dtype\": \"bf16\", "
          "\"m\": 4096, \"n\": 4096, \"k\": 4096, \"tflops\": 500.0}]}", f);
    fclose(f);
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    CHECK(strncmp(p->interconnect_source, "estimate", 8) == 0);
    /* only CPU records: nothing to merge, and the error says why */
    CHECK_ERR(kiln_hw_profile_merge_bench(p, mpi), "2 comm record(s) skipped: backend mpi, not collectives between GPUs");
    CHECK(p->nrs == 0 && p->nag == 0 && strncmp(p->interconnect_source, "estimate", 8) == 0);
    /* GPU and CPU records: only the GPUs' (the warning about the others is the CLI test's, below) */
    const kiln_log_level level = kiln_log_get_level();
    kiln_log_set_level(KILN_LOG_ERROR);
    CHECK_OK(kiln_hw_profile_merge_bench(p, mixed));
    kiln_log_set_level(level);
    CHECK_MSG(p->nrs == 1 && p->rs[0].ranks == 8 && p->nag == 0, "%d reduce-scatter records (ranks %lld), %d all-gather",
              p->nrs, (long long)(p->nrs ? p->rs[0].ranks : 0), p->nag);
    /* 2 GPUs take the nearest measured rank count, the GPUs' 100 GB/s, not the CPU ranks' 5 */
    CHECK_NEAR(kiln_hw_comm_time(p, 0, 1048576, 2), 1048576.0 / 2 / 100e9 + p->comm_latency_us * 1e-6, 1e-12);
    CHECK_MSG(!strncmp(p->interconnect_source, "measured: kiln bench comm over 8 GPUs (nccl", 43) &&
                  strstr(p->interconnect_source, "comm_mixed.json") &&
                  strstr(p->interconnect_source, "2 comm record(s) skipped: backend mpi, local"),
              "interconnect source: %s", p->interconnect_source);
    CHECK_MSG(!strncmp(p->source, "interconnect measured by --bench ", 33) && strstr(p->source, "comm_mixed.json") &&
                  strstr(p->source, "; profile before --bench: measured bf16 GEMMs"),
              "profile source: %s", p->source);
    /* a second file adds its note; the profile's own summary is marked once */
    CHECK_OK(kiln_hw_profile_merge_bench(p, gemm));
    const char *mark = strstr(p->source, "profile before --bench");
    CHECK_MSG(!strncmp(p->source, "GEMMs measured by --bench ", 26) && strstr(p->source, "interconnect measured by") &&
                  mark && !strstr(mark + 1, "profile before --bench"),
              "profile source: %s", p->source);
    free(p);
    /* the command line: --explain's interconnect line and the header say measured, and from which file */
    static char out[1 << 17];
    char args[2000];
    snprintf(args, sizeof args, "size --profile h200 --total-params 8.3B --active-params 760M --bench '%s' --explain "
             "--top 1", mixed);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "  interconnect: measured: kiln bench comm over 8 GPUs") &&
                  strstr(out, "profile h200: NVIDIA H200 SXM (141 GB HBM3e), 8 per node over NVLink 4 (interconnect "
                              "measured by --bench ") &&
                  strstr(out, "warning: ") && strstr(out, "2 comm record(s) skipped"),
              "%s", out);
    snprintf(args, sizeof args, "size --profile h200 --total-params 8.3B --active-params 760M --bench '%s'", mpi);
    CHECK(test_run_kiln(args, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "no GPU measurements to merge") && strstr(out, "2 comm record(s) skipped"), "%s", out);
}

/* The H200 profile with `kiln bench comm` records merged from a file written to dir/name (its path in path[600]):
 * a reduce-scatter and an all-gather of 1 MiB, each with the record fields `fields` and busbw GB/s. NULL when the
 * profile cannot be loaded (the failure reported). */
static kiln_hw_profile *h200_with_comm(const char *name, const char *fields, double busbw, char *path) {
    snprintf(path, 600, "%s", test_join(test_tmpdir(), name));
    char text[1024];
    snprintf(text, sizeof text,
             "{\"kiln_profile\": 1, \"bench\": \"comm\", \"comm\": ["
             "{\"backend\": \"nccl\", \"collective\": \"reduce_scatter\", %s, \"bytes\": 1048576, \"busbw_gbs\": %g}, "
             "{\"backend\": \"nccl\", \"collective\": \"all_gather\", %s, \"bytes\": 1048576, \"busbw_gbs\": %g}]}",
             fields, busbw, fields, busbw);
    CHECK_OK(kiln_write_file_atomic(path, text, strlen(text)));
    kiln_hw_profile *p = malloc(sizeof *p);
    kiln_error *e = p ? kiln_hw_profile_load("h200", p) : kiln_errorf(KILN_ENOMEM, "profile");
    if (!e) e = kiln_hw_profile_merge_bench(p, path);
    CHECK_OK(e);
    if (e) free(p), p = NULL;
    return p;
}

/* Measured comm records stand only for jobs on their side of the node boundary. The H200 profile has 8 GPUs a
 * node, NVLink inside (360 GB/s) and 45 GB/s a GPU across nodes: a kiln bench comm over the 8 GPUs of one node
 * (350 GB/s) was used for 64 GPUs on 8 nodes too, predicting ZeRO-1's collectives ~8x faster than the network
 * allows, while --explain said the bus bandwidth came "from the measured comm records". */
TEST(size_comm_measured_inside_a_node_not_across) {
    char path[600];
    kiln_hw_profile *p = h200_with_comm("nccl8.json", "\"ranks\": 8", 350, path);
    if (!p) return;
    CHECK(p->gpus_per_node == 8 && p->inter_busbw_gbs == 45 && p->intra_busbw_gbs == 360);
    const double S = 1e9, lat = p->comm_latency_us * 1e-6;
    /* inside the node: the measurement (8 and 4 GPUs alike) */
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 8), S * 7 / 8 / 350e9 + lat, 1e-12);
    CHECK_NEAR(kiln_hw_comm_time(p, 1, S, 4), S * 3 / 4 / 350e9 + lat, 1e-12);
    /* across nodes: the profile's inter-node figure, not NVLink's measurement */
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 64), S * 63 / 64 / 45e9 + lat, 1e-12);
    CHECK_NEAR(kiln_hw_comm_time(p, 1, S, 16), S * 15 / 16 / 45e9 + lat, 1e-12);
    char why[600];
    CHECK(kiln_hw_comm_source(p, 8, why, sizeof why) == 1);
    CHECK_MSG(strstr(why, "reduce-scatter measured over 8 GPUs") && strstr(why, "all-gather measured over 8 GPUs"), "%s",
              why);
    CHECK(kiln_hw_comm_source(p, 64, why, sizeof why) == 0);
    CHECK_MSG(strstr(why, "64 GPUs are across nodes") && strstr(why, "inter-node figure, 45 GB/s") &&
                  strstr(why, "measured records are all inside a node"), "%s", why);
    /* a measurement across nodes (16 GPUs) stands for 64, and not for 8 */
    p->rs[0].ranks = 16;
    p->ag[0].ranks = 16;
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 64), S * 63 / 64 / 350e9 + lat, 1e-12);
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 8), S * 7 / 8 / 360e9 + lat, 1e-12);
    free(p);
    /* the CLI: --explain's rule 8 says which for the --gpus asked, and the step's comm time follows */
    static char out[1 << 17];
    char args[2000];
    snprintf(args, sizeof args, "size --profile h200 --total-params 8.3B --active-params 760M --bench '%s' --explain "
             "--top 1 --gpus 64", path);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "bus bandwidth: 64 GPUs are across nodes (8 per node): reduce-scatter at the profile's "
                          "inter-node figure, 45 GB/s") && !strstr(out, "from the measured comm records"),
              "%s", out);
    snprintf(args, sizeof args, "size --profile h200 --total-params 8.3B --active-params 760M --bench '%s' --explain "
             "--top 1 --gpus 8", path);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "bus bandwidth: 8 GPUs are inside one node (8 per node): reduce-scatter measured over 8 GPUs"),
              "%s", out);
}

/* The records say which hosts their ranks ran on (kiln bench comm's "hosts"): 8 ranks on 2 hosts (4 GPUs of each of
 * two 8-GPU nodes) crossed the network although 8 <= gpus_per_node, and stand for jobs across nodes, not for one
 * node; a set over 8 ranks on 1 host beside it is the one used inside a node. Without "hosts" (an older profile)
 * the rank count decides, as above. */
TEST(size_comm_records_sided_by_hosts) {
    char path[600];
    kiln_hw_profile *p = h200_with_comm("hosts.json", "\"ranks\": 8, \"hosts\": 2", 40, path);
    if (!p) return;
    CHECK(p->nrs == 1 && p->rs[0].hosts == 2);
    const double S = 1e9, lat = p->comm_latency_us * 1e-6;
    /* across nodes: the two-host measurement; inside one: the profile's NVLink figure, not the network's 40 GB/s */
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 64), S * 63 / 64 / 40e9 + lat, 1e-12);
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 8), S * 7 / 8 / 360e9 + lat, 1e-12);
    char why[600];
    CHECK(kiln_hw_comm_source(p, 64, why, sizeof why) == 1);
    CHECK_MSG(strstr(why, "reduce-scatter measured over 8 GPUs on 2 hosts"), "%s", why);
    CHECK(kiln_hw_comm_source(p, 8, why, sizeof why) == 0);
    CHECK_MSG(strstr(why, "measured records are all across nodes"), "%s", why);
    /* a one-host set of the same rank count beside it: each used on its own side, never mixed */
    p->rs[1] = p->rs[0], p->rs[1].hosts = 1, p->rs[1].busbw_gbs = 350, p->nrs = 2;
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 8), S * 7 / 8 / 350e9 + lat, 1e-12);
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 64), S * 63 / 64 / 40e9 + lat, 1e-12);
    /* hosts absent: 8 ranks of an 8-GPU node count as inside it */
    p->rs[0].hosts = 0, p->nrs = 1;
    CHECK_NEAR(kiln_hw_comm_time(p, 0, S, 8), S * 7 / 8 / 40e9 + lat, 1e-12);
    free(p);
}

/* The experts' evidence compares the shape with the alternative of the same total AND active parameters: twice
 * the experts at half the width and twice the top-k (so the same rows per expert). It compared with twice the
 * experts at the same top-k, half the active parameters and half the rows per expert, whose lower GEMM rate
 * (502 against 688 TFLOP/s for ZAYA1's experts on the H200) argued for fewer, wider experts where the same budget
 * runs at the same rate. */
TEST(size_expert_evidence_same_active_parameters) {
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    kiln_size_budget b;
    kiln_size_budget_default(&b, KILN_ARCH_ZAYA);
    kiln_size_candidate c;
    memset(&c, 0, sizeof c);
    c.shape = b.base;
    c.shape.arch = KILN_ARCH_ZAYA;
    c.shape.vocab = 262144, c.shape.hidden = 2048, c.shape.layers = 40, c.shape.heads = 8, c.shape.kv_heads = 2;
    c.shape.head_dim = 128, c.shape.experts = 16, c.shape.top_k = 1, c.shape.expert_inter = 2048;
    CHECK_OK(kiln_size_predict(&c.shape, p, &b.setup, &c.pred));
    kiln_size_explain_candidate(p, &b, &c);
    const char *line = NULL;
    for (int i = 0; i < c.nwhy; i++)
        if (strstr(c.why[i], "16 experts x width 2048")) line = c.why[i];
    CHECK(line != NULL);
    if (line) {
        const int64_t n = b.setup.train.micro_batch * b.setup.seq;
        kiln_hw_gemm_why w;
        kiln_hw_gemm_time_grouped(p, 32, (n * 2 + 31) / 32, 2048, 2048, &w); /* 32 x 1024 at top-2: gate_up N = 2048 */
        char want[128];
        snprintf(want, sizeof want, "the same total and active parameters as 32 x 1024 top-2: %.0f TFLOP/s", w.tflops);
        CHECK_MSG(strstr(line, want), "'%s' lacks '%s'", line, want);
    }
    free(p);
}

/* A step is whole micro-batches on every GPU: with --gpus 2048 at micro-batch 1 x 4096 the prediction is for
 * 8388608 tokens a step while the setup line said "4194304 tokens per step" (the global batch silently doubled). */
TEST(size_setup_says_the_tokens_per_step_predicted) {
    CHECK(kiln_size_step_tokens(&(kiln_size_setup){.seq = 4096, .tokens_per_step = 4194304,
                                                  .train = {.gpus = 2048, .micro_batch = 1}}, NULL) == 8388608);
    int64_t mbs = 0;
    CHECK(kiln_size_step_tokens(&(kiln_size_setup){.seq = 4096, .tokens_per_step = 4194304,
                                                  .train = {.gpus = 24, .micro_batch = 1}}, &mbs) == 43 * 24 * 4096 &&
          mbs == 43);
    static char out[1 << 17];
    CHECK(test_run_kiln("size --profile h200 --total-params 8.3B --active-params 760M --gpus 2048 --top 1", out,
                        sizeof out) == 0);
    CHECK_MSG(strstr(out, "note: a step is whole micro-batches on every GPU: 1 x 2048 GPU(s) x 1 x 4096 = 8388608 tokens "
                          "per step are predicted, 2x the 4194304 asked"), "%s", out);
    CHECK(test_run_kiln("size --profile h200 --total-params 8.3B --active-params 760M --gpus 8 --top 1 --json", out,
                        sizeof out) == 0);
    CHECK_MSG(!strstr(out, "note: a step") && strstr(out, "\"tokens_per_step_predicted\":\t4194304"), "%s", out);
}

/* kiln size check keeps a config's own vocabulary; its evidence line said "vocab 50257 = 392 x 128 (no padding
 * needed)" (392 x 128 is 50176) right above the warning that 50257 is not a multiple of 128. */
TEST(size_check_vocab_evidence_not_a_multiple) {
    const char *dir = test_tmpdir();
    char cfg[600], args[1200];
    static char out[1 << 16];
    snprintf(cfg, sizeof cfg, "%s", test_join(dir, "config.json"));
    static const char text[] =
        "{\"model_type\": \"zaya\", \"hidden_size\": 2048, \"num_hidden_layers\": 8, \"num_attention_heads\": 8, "
        "\"num_key_value_heads\": 2, \"head_dim\": 128, \"num_experts\": 16, \"moe_intermediate_size\": 2048, "
        "\"vocab_size\": 50257}";
    CHECK_OK(kiln_write_file_atomic(cfg, text, strlen(text)));
    snprintf(args, sizeof args, "size check '%s' --profile h200", cfg);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "- vocab 50257 (not a multiple of 128; 50304 is): lm_head at") &&
                  strstr(out, "! vocab 50257 is not a multiple of 128: pad to 50304") && !strstr(out, "= 392 x 128") &&
                  !strstr(out, "50257 = "), "%s", out);
}

/* The attention forward and forward + backward records pair by every field that tells cases apart: a sweep
 * over KV heads or implementations paired one case's forward with another's backward (the last match). */
TEST(size_bench_attention_pairs_same_case) {
    const char *dir = test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s", test_join(dir, "attn_sweep.json"));
#define ATT(be, kv, pass, fl, us)                                                                              \
    "{\"backend\": \"" be "\", \"device\": \"cuda\", \"dtype\": \"bf16\", \"pass\": \"" pass "\", \"batch\": 1, "        \
    "\"seq\": 4096, \"heads\": 8, \"kv_heads\": " #kv ", \"head_dim\": 128, \"window\": 0, \"flops\": " #fl            \
    ", \"time_us\": " #us "}"
    FILE *f = fopen(path, "w");
    fputs("{\"kiln_profile\": 1, \"attention\": [" ATT("cuda", 2, "fwd", 1e12, 2000) "," ATT("cuda", 8, "fwd", 1e12, 4000)
          "," ATT("cuda", 2, "fwd_bwd", 3.5e12, 7000) "," ATT("cuda", 8, "fwd_bwd", 3.5e12, 20000) ","
          ATT("cudnn", 2, "fwd", 1e12, 1000) "," ATT("cudnn", 2, "fwd_bwd", 3.5e12, 9000) "]}", f);
    fclose(f);
#undef ATT
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    CHECK_OK(kiln_hw_profile_merge_bench(p, path));
    /* head dim 128 from the first case (cuda, 2 KV heads): forward 1e12 in 2 ms, backward 2.5e12 in 7 - 2 ms */
    CHECK_NEAR(kiln_hw_attn_eff(p, 128, 0), 500.0 / p->peak_bf16, 1e-9);
    CHECK_NEAR(kiln_hw_attn_eff(p, 128, 1), 500.0 / p->peak_bf16, 1e-9);
    /* the timed kernels: per (shape, KV heads), the later implementation's own pair */
    int seen = 0;
    for (int i = 0; i < p->nattn_t; i++) {
        const kiln_hw_attn_timed *a = &p->attn_t[i];
        if (a->kv_heads == 2) CHECK_MSG(a->fwd_us == 1000 && a->bwd_us == 8000, "kv 2: %g / %g us", a->fwd_us, a->bwd_us);
        if (a->kv_heads == 8) CHECK_MSG(a->fwd_us == 4000 && a->bwd_us == 16000, "kv 8: %g / %g us", a->fwd_us, a->bwd_us);
        seen += a->kv_heads == 2 || a->kv_heads == 8;
    }
    CHECK(seen == 2 && p->nattn_t == 2);
    free(p);
}

/* Every count flag is bounded (docs/sizing.md): past the bounds the step's token counts overflowed int64 and
 * kiln size printed negative memory, -inf step times and negative counts; the bound applies after the K/M
 * suffix; a malformed or out-of-range flag exits 2. */
TEST(size_flag_ranges) {
    static char out[1 << 17];
    char args[1200];
    const char *cfg = test_src_path("tests/fixtures/zaya/many_experts/config.json");
    const char *base = "size --profile h200 --total-params 8.3B --active-params 760M";
    struct { const char *flags, *needle; } bad[] = {
        {"--seq 1073741824 --tokens-per-step 1024M", "--seq must be 1..16777216"},
        {"--seq 9223372036854775807", "--seq must be 1..16777216"},
        {"--context 0", "--context must be 1..16777216"},
        {"--gpus 9223372036854775807", "--gpus must be 1..1048576"},
        {"--micro-batch 1048577", "--micro-batch must be 1..1048576"},
        {"--micro-batch 1048576 --seq 16777216", "is more than 4294967296"},
        {"--tokens-per-step 1099511627776M", "'1099511627776M' is not a token count in 1..1099511627776"},
        {"--tokens-per-step 1048577M", "is not a token count"},
        {"--tokens-per-step 9223372036854775807K", "is not a token count"},
        {"--tokens-per-step 99999999999999999999", "is not a token count"},
        {"--vocab 9223372036854775807", "--vocab must be 1..2147483647"},
        {"--vocab 2147483648", "--vocab must be 1..2147483647"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "%s %s", base, bad[i].flags);
        int rc = test_run_kiln(args, out, sizeof out);
        CHECK_MSG(rc == 2 && strstr(out, bad[i].needle), "kiln %s: exit %d, want 2 and '%s':\n%s", args, rc,
                  bad[i].needle, out);
        snprintf(args, sizeof args, "size predict '%s' --profile h200 %s", cfg, bad[i].flags);
        rc = test_run_kiln(args, out, sizeof out);
        CHECK_MSG(rc == 2 && strstr(out, bad[i].needle), "kiln %s: exit %d, want 2:\n%s", args, rc, out);
    }
    /* the largest values predict finite, non-negative numbers */
    snprintf(args, sizeof args, "size predict '%s' --profile h200 --seq 16777216 --micro-batch 256 --tokens-per-step "
             "1048576M --gpus 1048576 --json", cfg);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK_MSG(!strstr(out, "null") && !strstr(out, ": -") && !strstr(out, ":\t-"), "%s", out);
    cJSON *j = cJSON_Parse(out);
    const cJSON *pr = cJSON_GetObjectItem(j, "prediction");
    double mem = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(pr, "memory_gib"), "total"));
    double step = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(pr, "train"), "step_s"));
    CHECK_MSG(mem > 0 && isfinite(mem) && step > 0 && isfinite(step), "memory %g GiB, step %g s", mem, step);
    cJSON_Delete(j);
    snprintf(args, sizeof args, "%s --gpus 1048576 --tokens-per-step 1048576M --json --top 1", base);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    j = cJSON_Parse(out);
    step = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j,
                                "ranked"), 0), "train"), "step_s"));
    CHECK_MSG(step > 0 && isfinite(step), "step %g s", step);
    cJSON_Delete(j);
    /* the library refuses the same */
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    kiln_size_shape s;
    kiln_size_shape_zaya_default(&s);
    kiln_size_setup u;
    kiln_size_setup_default(&u);
    kiln_size_pred r;
    u.seq = (int64_t)1 << 25;
    CHECK_ERR(kiln_size_predict(&s, p, &u, &r), "sequence 33554432 is outside 1..16777216");
    u.seq = 4096;
    u.train.gpus = INT64_MAX;
    CHECK_ERR(kiln_size_predict(&s, p, &u, &r), "gpus");
    u.train.gpus = 8;
    u.tokens_per_step = ((int64_t)1 << 40) + 1;
    CHECK_ERR(kiln_size_predict(&s, p, &u, &r), "tokens per step");
    free(p);
    kiln_size_budget b;
    kiln_size_budget_default(&b, KILN_ARCH_ZAYA);
    b.total = 8.3e9, b.active = 760e6, b.vocab = INT64_MAX;
    kiln_size_result res;
    p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    CHECK_ERR(kiln_size_search(&b, p, &res), "vocab 9223372036854775807 is outside 1..2147483647");
    free(p);
}

/* Byte counts past int64 (cuDNN's attention workspace is B·heads·T² bf16) were rounded to 256 through an int64
 * cast, which turned them negative. */
TEST(size_cuda_memory_huge_counts_stay_positive) {
    const char *old = getenv("KILN_CUDNN_WORKSPACE_MB"), *old_impl = getenv("KILN_ATTENTION");
    char saved[64] = "", saved_impl[64] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    if (old_impl) snprintf(saved_impl, sizeof saved_impl, "%s", old_impl);
    setenv("KILN_CUDNN_WORKSPACE_MB", "0", 1); /* no cap: the workspace counts whatever its size */
    unsetenv("KILN_ATTENTION");
    kiln_size_shape s;
    kiln_size_shape_zaya_default(&s);
    s.layers = 2;
    s.heads = 4096, s.kv_heads = 2, s.head_dim = 128, s.hidden = 2048;
    kiln_size_train t;
    kiln_size_train_default(&t);
    t.micro_batch = 256, t.seq = (int64_t)1 << 24, t.gpus = 1; /* 2^32 tokens: the largest micro-batch */
    kiln_size_cuda_memory m;
    CHECK_OK(kiln_size_cuda_memory_train(&s, &t, 0, &m));
    /* B·heads·T²·2 = 2^8·2^12·2^48·2 = 2^69 bytes */
    CHECK_MSG(m.pool >= 0x1p69 && isfinite(m.pool) && m.total > m.pool && m.activations > 0 && m.scratch > 0,
              "pool %g, activations %g, scratch %g, total %g", m.pool, m.activations, m.scratch, m.total);
    t.micro_batch = 257;
    CHECK_ERR(kiln_size_cuda_memory_train(&s, &t, 0, &m), "is more than 4294967296");
    if (old) setenv("KILN_CUDNN_WORKSPACE_MB", saved, 1);
    else unsetenv("KILN_CUDNN_WORKSPACE_MB");
    if (old_impl) setenv("KILN_ATTENTION", saved_impl, 1);
}

/* Messages: no shape formed (a sentinel leaked: "the smallest layer has 1e+300 parameters"), trailing garbage
 * after --aspect, hexadecimal counts, the memory limit as it is (90% of the device). */
TEST(size_messages) {
    static char out[1 << 17];
    const char *base = "size --profile h200 --total-params 8.3B --active-params 760M";
    char args[1200];
    snprintf(args, sizeof args, "%s --head-dims 1048576", base);
    CHECK(test_run_kiln(args, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "the lists form no shape") && strstr(out, "--head-dims 1048576") && !strstr(out, "1e+300"),
              "%s", out);
    const char *aspects[] = {"32:128xyz", "32:128:4", "0x20:128", "32:inf", "32:nan", ":128", "32:", "32", "64:32"};
    for (size_t i = 0; i < sizeof aspects / sizeof aspects[0]; i++) {
        snprintf(args, sizeof args, "%s --aspect '%s'", base, aspects[i]);
        int rc = test_run_kiln(args, out, sizeof out);
        CHECK_MSG(rc == 2 && strstr(out, "--aspect"), "--aspect %s: exit %d\n%s", aspects[i], rc, out);
    }
    snprintf(args, sizeof args, "%s --aspect 16.5:256 --top 1", base);
    CHECK(test_run_kiln(args, out, sizeof out) == 0 && strstr(out, "outside hidden/layers 16.5..256"));
    CHECK(test_run_kiln("size --profile h200 --total-params 0x2B --active-params 760M", out, sizeof out) == 2);
    CHECK_MSG(strstr(out, "'0x2B' is not a decimal parameter count"), "%s", out);
    double v;
    const char *nondecimal[] = {"0x2B", "0X1p3", " 8B", "infB", "nan", "1e3 "};
    for (size_t i = 0; i < sizeof nondecimal / sizeof nondecimal[0]; i++) {
        kiln_error *e = kiln_size_parse_count("--total-params", nondecimal[i], &v);
        CHECK_MSG(e != NULL, "'%s' was read as %g", nondecimal[i], v);
        kiln_error_free(e);
    }
    CHECK_OK(kiln_size_parse_count("--total-params", "1.5e9", &v));
    CHECK_NEAR(v, 1.5e9, 1);
    CHECK_OK(kiln_size_parse_count("--total-params", "+8.3B", &v));
    /* the real limit: 90% of the H100 profile's 79.6 GiB */
    CHECK(test_run_kiln("size --profile h100 --total-params 80B --active-params 20B --micro-batch 64", out,
                        sizeof out) == 1);
    CHECK_MSG(strstr(out, "do not fit in 71.6 GiB per GPU (90% of the profile's 79.6 GiB)") &&
                  !strstr(out, "in 80 GiB"),
              "%s", out);
}

TEST(size_search_budget_errors) {
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    kiln_size_budget b;
    kiln_size_result r;
    kiln_size_budget_default(&b, KILN_ARCH_ZAYA);
    b.total = 1e9; b.active = 2e9;
    CHECK_ERR(kiln_size_search(&b, p, &r), "exceed the total");
    b.total = 2e6; b.active = 1e6;
    CHECK_ERR(kiln_size_search(&b, p, &r), "too small for one layer");
    double v;
    CHECK_ERR(kiln_size_parse_count("--total-params", "10X", &v), "unknown suffix");
    CHECK_ERR(kiln_size_parse_count("--total-params", "-5B", &v), "positive");
    /* the suffix's product overflowed to inf and was accepted (found by the flags fuzz target) */
    CHECK_ERR(kiln_size_parse_count("--total-params", "1e300T", &v), "'1e300T' is beyond 10^18");
    CHECK_ERR(kiln_size_parse_count("--total-params", "5E307", &v), "beyond 10^18");
    CHECK_OK(kiln_size_parse_count("--total-params", "1000000T", &v));
    CHECK_NEAR(v, 1e18, 1);
    CHECK_OK(kiln_size_parse_count("--total-params", "8.3B", &v));
    CHECK_NEAR(v, 8.3e9, 1);
    CHECK_OK(kiln_size_parse_count("--active-params", "760M", &v));
    CHECK_NEAR(v, 760e6, 1e-3);
    /* a dense budget: every candidate within the tolerance, ranked best first */
    kiln_size_budget_default(&b, KILN_ARCH_DENSE);
    b.total = b.active = 7e9;
    b.vocab = 32000;
    CHECK_OK(kiln_size_search(&b, p, &r));
    CHECK(r.n > 0 && r.vocab == 32000);
    for (int64_t i = 0; i < r.n; i++) {
        CHECK(fabs((double)r.c[i].pred.params.total_nonembed / 7e9 - 1) <= 0.05);
        if (i) CHECK(r.c[i].score >= r.c[i - 1].score);
    }
    kiln_size_result_free(&r);
    free(p);
}

/* ZAYA1 (arXiv 2511.17127) on the MI300X profile with its budget: the shape is among the candidates,
 * and the output either ranks it in the top 10 or explains why not. */
TEST(size_zaya1_mi300x) {
    const char *dir = test_tmpdir();
    kiln_zaya_config c;
    kiln_zaya_config_default(&c);
    const char *cfg = test_join(dir, "config.json");
    CHECK_OK(kiln_zaya_config_save(&c, cfg));
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("mi300x", p));
    kiln_size_budget b;
    kiln_size_budget_default(&b, KILN_ARCH_ZAYA);
    b.total = 8.3e9; b.active = 760e6; b.vocab = c.vocab_size;
    kiln_size_result r;
    CHECK_OK(kiln_size_search(&b, p, &r));
    kiln_size_shape z;
    kiln_size_shape_from_zaya(&c, &z);
    int64_t rank = kiln_size_find(&r, &z);
    CHECK_MSG(rank >= 0, "ZAYA1's shape is not a candidate for its own budget");
    kiln_size_result_free(&r);
    free(p);
    static char out[1 << 17];
    char args[1200];
    snprintf(args, sizeof args, "size --profile mi300x --total-params 8.3B --active-params 760M --reference '%s'", cfg);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK(strstr(out, "zaya h2048 L40 q8x128 kv2 E16 k1 I2048 V262272") != NULL);
    CHECK(strstr(out, "head dim 128: attention") != NULL);
    int top = strstr(out, "among the top 10\n") != NULL;
    int why = strstr(out, "not among the top 10, because") && strstr(out, "slower than #1");
    CHECK_MSG(top || why, "neither ranked in the top 10 nor explained:\n%s", out);
}

TEST(size_cli) {
    static char out[1 << 17];
    const char *cfg = test_src_path("tests/fixtures/zaya/many_experts/config.json");
    char args[1200];
    /* predict: one command for the validation on the GPU machine */
    snprintf(args, sizeof args, "size predict '%s' --profile h200 --micro-batch 2 --seq 64 --gpus 1", cfg);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK(strstr(out, "tokens/s per GPU") && strstr(out, "peak (total)") && strstr(out, "decode ms/step, batch 64"));
    snprintf(args, sizeof args, "size predict '%s' --profile h200 --json", cfg);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    cJSON *j = cJSON_Parse(out);
    CHECK(j && cJSON_GetObjectItem(j, "prediction"));
    cJSON_Delete(j);
    /* a kiln train config: its sequence, micro-batch, accumulation and optimizer are the defaults */
    const char *tc = test_join(test_tmpdir(), "train.json");
    FILE *f = fopen(tc, "w");
    fputs("{\"model\": {\"vocab_size\": 128, \"hidden_size\": 48, \"num_hidden_layers\": 4, \"num_attention_heads\": 6, "
          "\"num_key_value_heads\": 2, \"head_dim\": 8, \"num_experts\": 8, \"moe_intermediate_size\": 16, "
          "\"router_hidden_size\": 32}, \"data\": {\"seq_len\": 64, \"micro_batch\": 2, \"grad_accum\": 3}, "
          "\"optim\": {\"muon\": false}}", f);
    fclose(f);
    snprintf(args, sizeof args, "size predict '%s' --profile h200 --gpus 1", tc);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK(strstr(out, "sequence 64; micro-batch 2; 384 tokens per step; AdamW;") != NULL);
    CHECK(strstr(out, "zaya h48 L4 q6x8 kv2 E8 k1 I16 V128") != NULL);
    /* check: the config's own rank and suggestions */
    snprintf(args, sizeof args, "size check '%s' --profile h200 --seq 64 --hidden 32,48,64,96 --head-dims 8,16 "
             "--widths 8,16,32 --experts 4,8,16 --top-k 1,2 --tolerance 0.2", cfg);
    CHECK(test_run_kiln(args, out, sizeof out) == 0);
    CHECK(strstr(out, "config ") && strstr(out, "zaya h48 L4 q6x8 kv2 E8 k1 I16 V128"));
    CHECK(strstr(out, "nearest faster shapes") || strstr(out, "no faster shape"));
    /* search JSON */
    CHECK(test_run_kiln("size --profile h100 --total-params 2B --active-params 400M --json --top 3", out, sizeof out) == 0);
    j = cJSON_Parse(out);
    CHECK(j && cJSON_GetArraySize(cJSON_GetObjectItem(j, "ranked")) == 3);
    cJSON_Delete(j);
    CHECK(test_run_kiln("size --profile h200 --total-params 8.3B --active-params 760M --explain --top 1", out,
                        sizeof out) == 0);
    CHECK(strstr(out, "Rules") && strstr(out, "wave"));
    /* errors */
    CHECK(test_run_kiln("size --profile b200 --total-params 1B --active-params 100M", out, sizeof out) == 1);
    CHECK(strstr(out, "unknown profile 'b200'"));
    CHECK(test_run_kiln("size --profile h200 --total-params 1B --active-params 2B", out, sizeof out) == 1);
    CHECK(strstr(out, "exceed the total"));
    CHECK(test_run_kiln("size --profile h200 --total-params 1B --active-params 1Q", out, sizeof out) == 2);
    CHECK(strstr(out, "--active-params"));
    CHECK(test_run_kiln("size --total-params 1B --active-params 1M", out, sizeof out) == 2);
    CHECK(strstr(out, "--profile is required"));
    CHECK(test_run_kiln("size check /nonexistent/config.json --profile h200", out, sizeof out) == 1);
    CHECK(strstr(out, "/nonexistent/config.json"));
}

TEST(size_predict_consistency) {
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    kiln_size_shape s;
    kiln_size_shape_zaya_default(&s);
    kiln_size_setup u;
    kiln_size_setup_default(&u);
    kiln_size_pred a, b, r1, rr;
    CHECK_OK(kiln_size_predict(&s, p, &u, &a));
    /* the step is its parts; tokens/s and MFU follow from it */
    CHECK_NEAR(a.t_micro, a.t_gemm + a.t_attn + a.t_mem, 1e-12);
    CHECK_NEAR(a.t_step, (double)a.grad_accum * a.t_micro + a.t_optim + a.t_comm, 1e-9);
    CHECK(a.grad_accum == (4 << 20) / (8 * 4096));
    CHECK_NEAR(a.tokens_per_s, (double)a.grad_accum * 4096 / a.t_step, 1e-6);
    CHECK_NEAR(a.mfu, (a.flops.fwd + a.flops.bwd) * a.tokens_per_s / 989.4e12, 1e-12);
    CHECK(a.mfu > 0.05 && a.mfu < 1);
    /* one GPU: no collectives; recomputation: slower micro-batches, fewer activations */
    u.train.gpus = 1;
    CHECK_OK(kiln_size_predict(&s, p, &u, &r1));
    CHECK(r1.t_comm == 0 && a.t_comm > 0);
    u.train.gpus = 8;
    u.train.recompute = 1;
    CHECK_OK(kiln_size_predict(&s, p, &u, &rr));
    CHECK(rr.t_micro > a.t_micro && rr.mem.activations < a.mem.activations);
    /* decode: batch 64 reads every expert, so it costs more than batch 1 but far less than 64 steps */
    CHECK(a.decode_ms_b64 > a.decode_ms_b1 && a.decode_ms_b64 < 64 * a.decode_ms_b1);
    /* a longer context costs more attention per token */
    u.train.recompute = 0;
    u.seq = 16384;
    CHECK_OK(kiln_size_predict(&s, p, &u, &b));
    CHECK(b.flops.attn > 3.9 * a.flops.attn && b.kv_gib_b64 > 3.9 * a.kv_gib_b64);
    free(p);
}

static size_t count_sub(const char *s, const char *sub) {
    size_t n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub)) n++;
    return n;
}

/* The HTML page: one circle per candidate, the reference marked, two plots; and headless Chromium
 * (a CI test dependency, as for kiln bench report) parses it into the same DOM without console errors. */
TEST(size_html_page) {
    kiln_hw_profile *p = malloc(sizeof *p);
    CHECK_OK(kiln_hw_profile_load("mi300x", p));
    kiln_size_budget b;
    kiln_size_budget_default(&b, KILN_ARCH_ZAYA);
    b.total = 8.3e9; b.active = 760e6; b.vocab = 262272;
    kiln_size_result r;
    CHECK_OK(kiln_size_search(&b, p, &r));
    kiln_size_shape z;
    kiln_size_shape_zaya_default(&z);
    int64_t ref = kiln_size_find(&r, &z);
    CHECK(ref >= 0);
    for (int i = 0; i < 3; i++) kiln_size_explain_candidate(p, &b, &r.c[i]);
    const char *d = test_tmpdir();
    char html[512];
    snprintf(html, sizeof html, "%s", test_join(d, "size.html"));
    CHECK_OK(kiln_size_write_html(html, p, &b, &r, 3, ref));
    char *t = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(html, &t, &len));
    if (t) {
        CHECK(count_sub(t, "<svg") == 2 && count_sub(t, "</svg>") == 2);
        CHECK_MSG(count_sub(t, "class=\"cand\"") == (size_t)r.n, "%zu circles for %lld candidates",
                  count_sub(t, "class=\"cand\""), (long long)r.n);
        CHECK(count_sub(t, "class=\"bar\"") == 3 * (ref >= 3 ? 4 : 3));
        CHECK(strstr(t, "head dim 128: attention") || strstr(t, "head dim 64: attention") ||
              strstr(t, "head dim 256: attention"));
        CHECK(count_sub(t, "<script") == 0 && count_sub(t, "http://") == count_sub(t, "xmlns=\"http://www.w3.org/2000/svg\""));
    }
    free(t);
    kiln_size_result_free(&r);
    free(p);
    char *l = NULL;
    CHECK(test_chromium_dom(html, &t, &l) == 0);
    if (t) CHECK_MSG(count_sub(t, "<svg") == 2 && count_sub(t, "<circle") >= 19, "DOM: %zu svg, %zu circles",
                     count_sub(t, "<svg"), count_sub(t, "<circle"));
    if (l) CHECK_MSG(!strstr(l, "Uncaught") && !strstr(l, ":CONSOLE(") && !strstr(l, "net::ERR_"), "%s", l);
    free(t);
    free(l);
}

/* How well the GEMM model predicts a shape it was not given: every measured H200 shape predicted from
 * the others (docs/perf.md reports the numbers; run-to-run noise on the H200 is about +-7%). */
TEST(size_gemm_leave_one_out) {
    kiln_hw_profile *p = malloc(sizeof *p), *q = malloc(sizeof *q);
    CHECK_OK(kiln_hw_profile_load("h200", p));
    double worst = 0;
    for (int i = 0; i < p->ngemm; i++) {
        *q = *p;
        q->ngemm = 0;
        for (int j = 0; j < p->ngemm; j++)
            if (j != i) q->gemm[q->ngemm++] = p->gemm[j];
        kiln_hw_gemm_why w;
        kiln_hw_gemm_time(q, p->gemm[i].m, p->gemm[i].n, p->gemm[i].k, &w);
        double err = fabs(w.tflops / p->gemm[i].tflops - 1);
        if (err > worst) worst = err;
    }
    CHECK_MSG(worst < 0.20, "worst leave-one-out error %.1f%%", 100 * worst);
    free(p);
    free(q);
}
