/* Optimizers, schedules, the ZeRO-1 partition and the balance controller. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/optim.h"
#include "kiln/rng.h"
#include "kiln/train.h"
#include "kiln/zaya_cuda.h"
#include "../src/train/train_internal.h"
#include "test.h"
#include "zaya_testutil.h"

/* AdamW against the textbook formula evaluated in double, over several steps. */
TEST(adamw_matches_formula) {
    const int n = 7, steps = 5;
    kiln_optim_hparams hp = {0.9, 0.95, 1e-8, 0.1, 0.95, 5, 0, KILN_NS_FP32};
    float w[7], g[7], st[14] = {0};
    double W[7], M[7] = {0}, V[7] = {0};
    kiln_rng r;
    kiln_rng_seed(&r, 3);
    for (int i = 0; i < n; i++) W[i] = w[i] = (float)kiln_rng_normal(&r);
    for (int t = 1; t <= steps; t++) {
        double lr = 0.01 * t;
        for (int i = 0; i < n; i++) g[i] = (float)kiln_rng_normal(&r);
        kiln_adamw_step(w, g, st, n, &hp, lr, t, 1);
        for (int i = 0; i < n; i++) {
            M[i] = 0.9 * M[i] + 0.1 * g[i];
            V[i] = 0.95 * V[i] + 0.05 * (double)g[i] * g[i];
            double mh = M[i] / (1 - pow(0.9, t)), vh = V[i] / (1 - pow(0.95, t));
            W[i] = W[i] * (1 - lr * 0.1) - lr * mh / (sqrt(vh) + 1e-8);
        }
    }
    for (int i = 0; i < n; i++) CHECK_NEAR(w[i], W[i], 1e-5);
}

/* Newton-Schulz gives (approximately) the polar factor U V^T of G: compare with the exact polar
 * factor from many cubic Newton-Schulz iterations, for tall and wide matrices. */
static void ns_check(int64_t rows, int64_t cols) {
    kiln_opt_param p = {0, rows * cols, KILN_OPT_MUON, 1, rows, cols, 0};
    float *x = malloc((size_t)(rows * cols) * sizeof(float)), *ws = malloc(kiln_muon_workspace(&p) * sizeof(float));
    double *P = malloc((size_t)(rows * cols) * sizeof(double)), *T = malloc((size_t)(rows * cols) * sizeof(double));
    double *A = malloc((size_t)(cols * cols) * sizeof(double));
    kiln_rng r;
    kiln_rng_seed(&r, (uint64_t)(rows * 31 + cols));
    double nrm = 0;
    for (int64_t i = 0; i < rows * cols; i++) {
        x[i] = (float)kiln_rng_normal(&r);
        nrm += (double)x[i] * x[i];
    }
    for (int64_t i = 0; i < rows * cols; i++) P[i] = x[i] / sqrt(nrm);
    /* cubic iteration X <- 1.5 X - 0.5 X (X^T X), converging to the polar factor */
    for (int it = 0; it < 200; it++) {
        for (int64_t a = 0; a < cols; a++)
            for (int64_t b = 0; b < cols; b++) {
                double s = 0;
                for (int64_t k = 0; k < rows; k++) s += P[k * cols + a] * P[k * cols + b];
                A[a * cols + b] = s;
            }
        for (int64_t i = 0; i < rows; i++)
            for (int64_t b = 0; b < cols; b++) {
                double s = 0;
                for (int64_t a = 0; a < cols; a++) s += P[i * cols + a] * A[a * cols + b];
                T[i * cols + b] = 1.5 * P[i * cols + b] - 0.5 * s;
            }
        for (int64_t i = 0; i < rows * cols; i++) P[i] = T[i];
    }
    kiln_newton_schulz(x, rows, cols, 5, ws);
    double dot = 0, nx = 0, np = 0;
    for (int64_t i = 0; i < rows * cols; i++) {
        dot += x[i] * P[i];
        nx += (double)x[i] * x[i];
        np += P[i] * P[i];
    }
    double cosv = dot / sqrt(nx * np);
    CHECK_MSG(cosv > 0.97, "%lldx%lld: cosine to the polar factor %.4f", (long long)rows, (long long)cols, cosv);
    /* singular values land in Muon's band around 1: mean square near 1 */
    double ms = nx / (double)(rows < cols ? rows : cols);
    CHECK_MSG(ms > 0.5 && ms < 1.3, "%lldx%lld: mean squared singular value %.3f", (long long)rows, (long long)cols, ms);
    free(x), free(ws), free(P), free(T), free(A);
}

TEST(newton_schulz_approximates_polar_factor) {
    ns_check(16, 16);
    ns_check(24, 10);
    ns_check(10, 24);
}

TEST(schedules) {
    kiln_schedule s = {KILN_SCHED_COSINE, 1.0, 0.1, 10, 110, 0.2};
    CHECK_NEAR(kiln_schedule_lr(&s, 0), 0.1, 1e-12);   /* warm-up from lr/warmup */
    CHECK_NEAR(kiln_schedule_lr(&s, 9), 1.0, 1e-12);
    CHECK_NEAR(kiln_schedule_lr(&s, 10), 1.0, 1e-12);  /* cosine starts at the peak */
    CHECK_NEAR(kiln_schedule_lr(&s, 60), 0.55, 1e-12); /* half way: the mean of peak and floor */
    CHECK_NEAR(kiln_schedule_lr(&s, 110), 0.1, 1e-12);
    s.kind = KILN_SCHED_WSD;
    CHECK_NEAR(kiln_schedule_lr(&s, 50), 1.0, 1e-12);  /* stable */
    CHECK_NEAR(kiln_schedule_lr(&s, 90), 1.0, 1e-12);  /* decay starts at 80% */
    CHECK_NEAR(kiln_schedule_lr(&s, 100), 0.55, 1e-12);
    CHECK_NEAR(kiln_schedule_lr(&s, 110), 0.1, 1e-12);
}

TEST(zero1_partition_covers_whole_tensors) {
    kiln_zaya_config c;
    tiny_config(&c, 0);
    kiln_zaya *m = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    for (int world = 1; world <= 5; world++) {
        zero1_partition p;
        CHECK_OK(zero1_partition_make(m, world, &p));
        size_t total = 0;
        for (int r = 0; r < world; r++) {
            CHECK(p.first[r] <= p.first[r + 1]);
            CHECK(p.displs[r] == total);
            total += p.counts[r];
            /* a rank's range starts at a tensor boundary */
            if (p.first[r] < m->nparams) CHECK(p.displs[r] == m->params[p.first[r]].offset);
        }
        CHECK(total == m->numel);
        /* reasonably even: no rank holds more than the fair share plus the largest tensor */
        int64_t biggest = 0;
        for (int i = 0; i < m->nparams; i++) biggest = m->params[i].numel > biggest ? m->params[i].numel : biggest;
        for (int r = 0; r < world; r++) CHECK(p.counts[r] <= m->numel / (size_t)world + (size_t)biggest);
        zero1_partition_free(&p);
    }
    kiln_zaya_free(m);
}

/* The GPU model's read precision by tensor (kiln_zaya_cuda_reads_f32, from its pointer fields) against an oracle
 * written from the HF names: the GEMMs' weights and biases only as bf16; everything else (the value shift's delayed
 * bias too, a tied LM head's embedding) as f32. */
static int bf16_only_by_name(const char *name) {
    static const char *gemm[] = {"q_proj.", "k_proj.", "v_proj_current.", "v_proj_delayed.weight", "o_proj.",
                                 "gate.down_proj.", "router_mlp.fc1.", "router_mlp.fc2.", "router_mlp.out_proj.",
                                 "experts.", "lm_head."};
    for (size_t k = 0; k < sizeof gemm / sizeof gemm[0]; k++)
        if (strstr(name, gemm[k])) return 1;
    return 0;
}

TEST(zaya_cuda_reads_f32_by_tensor) {
    for (int tied = 0; tied <= 1; tied++) {
        kiln_zaya_config c;
        tiny_config(&c, tied); /* the sliding-window layout with the tied head */
        c.tie_word_embeddings = tied;
        kiln_zaya *m = NULL;
        CHECK_OK(kiln_zaya_create(&c, &m));
        unsigned char *f32 = malloc((size_t)m->nparams);
        CHECK_OK(kiln_zaya_cuda_reads_f32(m, f32));
        int nb = 0;
        for (int i = 0; i < m->nparams; i++) {
            CHECK_MSG(f32[i] == !bf16_only_by_name(m->params[i].name), "%s: read as %s", m->params[i].name,
                      f32[i] ? "f32" : "bf16 only");
            nb += !f32[i];
        }
        CHECK(nb >= 13 * c.num_layers); /* every GEMM of every layer (attention biases on) */
        CHECK(f32[0] == 1);             /* the embedding, tied or not */
        free(f32);
        kiln_zaya_free(m);
    }
}

/* The stage of the GPU backward after which each tensor's gradient is complete (kiln_zaya_cuda_grad_stages, from its
 * pointer fields), which the several-rank trainer hands to the reduce-scatter there, against an oracle from the HF
 * names: the LM head and the final norm first (0), then layer l's tensors after layer l (nl - l) but its experts'
 * weights a stage later (the next layer down joins them), the input scale and bias with layer 0, the embedding (a
 * tied LM head's too) at the end. */
static int stage_by_name(const char *name, int nl) {
    int l = -1;
    if (sscanf(name, "model.layers.%d.", &l) == 1) return nl - l + (strstr(name, ".mlp.experts.") != NULL);
    if (!strncmp(name, "model.norm.", 11) || !strncmp(name, "lm_head.", 8)) return 0;
    if (!strncmp(name, "model.input_hidden_states_", 26)) return nl;
    return nl + 1;
}

TEST(zaya_cuda_grad_stages_by_tensor) {
    for (int tied = 0; tied <= 1; tied++) {
        kiln_zaya_config c;
        tiny_config(&c, tied);
        c.tie_word_embeddings = tied;
        kiln_zaya *m = NULL;
        CHECK_OK(kiln_zaya_create(&c, &m));
        const int nl = (int)c.num_layers;
        int *stage = malloc((size_t)m->nparams * sizeof *stage), seen[16] = {0};
        kiln_zaya_cuda_grad_stages(m, stage);
        for (int i = 0; i < m->nparams; i++) {
            CHECK_MSG(stage[i] == stage_by_name(m->params[i].name, nl), "%s: stage %d, expected %d", m->params[i].name,
                      stage[i], stage_by_name(m->params[i].name, nl));
            if (stage[i] >= 0 && stage[i] < 16) seen[stage[i]]++;
        }
        for (int k = 0; k <= nl + 1; k++) CHECK_MSG(seen[k] > 0, "no tensor at stage %d", k);
        CHECK(stage[0] == nl + 1); /* the embedding, tied or not */
        free(stage);
        kiln_zaya_free(m);
    }
}

/* zero1_gather_runs: for each rank, its tensors exactly, each in one run of its kind from a tensor's start to a
 * tensor's end; runs of one rank in offset order, neighbours of one rank of different kinds (merged otherwise). */
static void check_runs(const zero1_partition *p, const size_t *off, const int64_t *numel, const unsigned char *f32,
                       const zero1_run *r, int nr) {
    int k = 0;
    for (int root = 0; root < p->world; root++) {
        for (int i = p->first[root]; i < p->first[root + 1]; i++) {
            while (k < nr && r[k].root == root && off[i] >= r[k].off + r[k].n) k++;
            CHECK_MSG(k < nr && r[k].root == root && r[k].off <= off[i] && off[i] + (size_t)numel[i] <= r[k].off + r[k].n,
                      "rank %d: tensor %d [%zu, +%lld) in no run of its own", root, i, off[i], (long long)numel[i]);
            if (k >= nr) return;
            CHECK(r[k].f32 == (f32[i] != 0));
            if (off[i] == r[k].off) CHECK(i == p->first[root] || k == 0 || r[k - 1].root != root || r[k - 1].f32 != r[k].f32);
            if (i + 1 < p->first[root + 1] && off[i] + (size_t)numel[i] == r[k].off + r[k].n)
                CHECK(k + 1 < nr && r[k + 1].off == off[i + 1]); /* the next run starts at the next tensor */
        }
        if (p->first[root] < p->first[root + 1]) k++;
    }
    CHECK(k == nr); /* no run beyond the ranks' tensors */
}

TEST(zero1_gather_runs_cover_each_rank) {
    kiln_zaya_config c;
    tiny_config(&c, 0);
    kiln_zaya *m = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    const int n = m->nparams;
    size_t *off = malloc(((size_t)n + 1) * sizeof *off);
    int64_t *numel = malloc((size_t)n * sizeof *numel);
    unsigned char *f32 = malloc((size_t)n), *rnd = malloc((size_t)n);
    size_t end = 0;
    for (int i = 0; i < n; i++) { /* the GPU's layout: each tensor 64-element aligned */
        off[i] = (end + 63) / 64 * 64, numel[i] = m->params[i].numel, end = off[i] + (size_t)numel[i];
    }
    CHECK_OK(kiln_zaya_cuda_reads_f32(m, f32));
    kiln_rng g;
    kiln_rng_seed(&g, 11);
    for (int world = 1; world <= 6; world++)
        for (int pass = 0; pass < 2; pass++) {
            const unsigned char *kind = f32;
            if (pass) { /* kinds at random: merges and splits anywhere */
                for (int i = 0; i < n; i++) rnd[i] = kiln_rng_uniform(&g) < 0.5;
                kind = rnd;
            }
            zero1_partition p;
            CHECK_OK(zero1_partition_make(m, world, &p));
            zero1_run *r = NULL;
            int nr = 0;
            CHECK_OK(zero1_gather_runs(&p, off, numel, kind, &r, &nr));
            check_runs(&p, off, numel, kind, r, nr);
            int changes = 0; /* as many runs as kind changes within a rank, plus one a non-empty rank */
            for (int q = 0; q < world; q++)
                for (int i = p.first[q]; i < p.first[q + 1]; i++) changes += i == p.first[q] || kind[i] != kind[i - 1];
            CHECK(nr == changes);
            free(r);
            zero1_partition_free(&p);
        }
    free(off), free(numel), free(f32), free(rnd);
    kiln_zaya_free(m);
}

/* The reduce-scatter inside the backward, on the host: the tiny model in the GPU's layout (64-element aligned), its
 * tensors handed over in the backward's stages as grads_ready does (runs of one stage, the padding after each), each
 * span cut into the owners' blocks by zero1_span_blocks. Over a backward every element must reach its owner exactly
 * once and no other rank; each span's blocks lie in their owners' ranges, contiguous in rank order (as MPI's and
 * the staged backend's reduce-scatter read them) and covering the span. Also random spans. */
static void check_span(const zero1_partition *p, const size_t *dcounts, const size_t *ddispls, size_t lo, size_t hi,
                       unsigned char *times, unsigned char *who) {
    size_t cnt[8], dsp[8], at = 0;
    zero1_span_blocks(dcounts, ddispls, p->world, lo, hi, cnt, dsp);
    for (int r = 0; r < p->world; r++) {
        CHECK_MSG(dsp[r] == at, "world %d span [%zu, %zu): rank %d's block starts at %zu, not %zu", p->world, lo, hi,
                  r, dsp[r], at);
        if (cnt[r]) CHECK(lo + dsp[r] >= ddispls[r] && lo + dsp[r] + cnt[r] <= ddispls[r] + dcounts[r]);
        for (size_t e = lo + dsp[r]; times && e < lo + dsp[r] + cnt[r]; e++) times[e]++, who[e] = (unsigned char)r;
        at = dsp[r] + cnt[r];
    }
    CHECK_MSG(at == hi - lo, "world %d span [%zu, %zu): the blocks cover %zu", p->world, lo, hi, at);
}

TEST(zero1_span_blocks_reach_each_owner_once) {
    kiln_zaya_config c;
    tiny_config(&c, 0);
    kiln_zaya *m = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    const int n = m->nparams;
    size_t *off = malloc(((size_t)n + 1) * sizeof *off), end = 0;
    int *stage = malloc((size_t)n * sizeof *stage);
    for (int i = 0; i < n; i++) off[i] = (end + 63) / 64 * 64, end = off[i] + (size_t)m->params[i].numel;
    off[n] = end = (end + 63) / 64 * 64;
    kiln_zaya_cuda_grad_stages(m, stage);
    unsigned char *times = malloc(end), *who = malloc(end);
    kiln_rng g;
    kiln_rng_seed(&g, 5);
    for (int world = 1; world <= 6; world++) {
        zero1_partition p;
        CHECK_OK(zero1_partition_make(m, world, &p));
        size_t dcounts[8], ddispls[8];
        for (int r = 0; r < world; r++) ddispls[r] = off[p.first[r]], dcounts[r] = off[p.first[r + 1]] - ddispls[r];
        memset(times, 0, end);
        int spans = 0;
        for (int st = 0; st <= (int)c.num_layers + 1; st++)
            for (int i = 0; i < n;) {
                if (stage[i] != st) {
                    i++;
                    continue;
                }
                int j = i + 1;
                while (j < n && stage[j] == st) j++;
                check_span(&p, dcounts, ddispls, off[i], off[j], times, who);
                spans++;
                i = j;
            }
        CHECK(spans > (int)c.num_layers + 1); /* the experts split each layer's run */
        for (size_t e = 0, bad = 0; e < end && bad < 3; e++) {
            int owner = 0;
            while (owner + 1 < world && e >= ddispls[owner + 1]) owner++;
            const int ok = times[e] == 1 && who[e] == owner;
            bad += !ok;
            CHECK_MSG(ok, "world %d: element %zu reached rank %d %d times, not its owner %d once", world, e, who[e],
                      times[e], owner);
        }
        for (int k = 0; k < 200; k++) { /* any span */
            size_t a = (size_t)(kiln_rng_uniform(&g) * (double)end), b = (size_t)(kiln_rng_uniform(&g) * (double)end);
            if (a > b) {
                const size_t t = a;
                a = b, b = t;
            }
            check_span(&p, dcounts, ddispls, a, b, NULL, NULL);
        }
        zero1_partition_free(&p);
    }
    free(times), free(who), free(stage), free(off);
    kiln_zaya_free(m);
}

/* Feeding back the load of a skewed router moves the biases toward equal load. */
TEST(balance_controller_moves_toward_equal_load) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.bal_kp = 0.1;
    c.bal_ki = 0.02; /* the integral term removes the proportional controller's steady-state offset */
    c.bal_skip_target = 0.1;
    balance_ctl b;
    CHECK_OK(balance_init(&b, 1, 5));
    float bias[5] = {0, 0, 0, 0, -1};
    int64_t counts[5] = {70, 10, 10, 10, 0}; /* expert 0 overloaded, skip unused */
    double imb[1];
    balance_update(&b, &c, counts, bias, imb);
    CHECK(bias[0] < 0 && bias[1] > 0 && bias[4] > -1);
    CHECK_NEAR(imb[0], 70.0 / 25.0, 1e-12);
    /* a simulated router: probability ~ softmax(logit + bias) with fixed logits: imbalance falls */
    double logit[5] = {1.0, 0.0, 0.0, 0.0, -2.0};
    double first = 0, last = 0;
    for (int it = 0; it < 300; it++) {
        double z = 0, p[5];
        for (int e = 0; e < 5; e++) z += p[e] = exp(logit[e] + bias[e]);
        for (int e = 0; e < 5; e++) counts[e] = (int64_t)llround(1000 * p[e] / z);
        balance_update(&b, &c, counts, bias, imb);
        if (it == 0) first = imb[0];
        last = imb[0];
    }
    CHECK_MSG(last < 1.05 && last < first, "imbalance %.3f -> %.3f", first, last);
    CHECK_MSG(fabs(counts[4] / 1000.0 - 0.1) < 0.02, "skip share %.3f, target 0.1", counts[4] / 1000.0);
    balance_free(&b);
}

TEST(train_config_parse_and_errors) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK_OK(kiln_train_config_parse("{\"model\": {\"hidden_size\": 64, \"num_experts\": 8},"
                                     " \"optim\": {\"lr\": 0.01, \"schedule\": \"wsd\"}, \"run\": {\"steps\": 7}}",
                                     "t.json", &c));
    CHECK(c.model.hidden_size == 64 && c.model.num_experts == 8 && c.sched.lr == 0.01 &&
          c.sched.kind == KILN_SCHED_WSD && c.steps == 7 && c.seq_len == 128);
    kiln_train_config_default(&c);
    CHECK_ERR(kiln_train_config_parse("{\"optim\": {\"learning_rate\": 1}}", "t.json", &c),
              "t.json: optim: unknown field 'learning_rate'");
    CHECK_ERR(kiln_train_config_parse("{\"model\": {\"hiden_size\": 1}}", "t.json", &c), "unknown field 'hiden_size'");
    CHECK_ERR(kiln_train_config_parse("{\"trainer\": {}}", "t.json", &c), "unknown section 'trainer'");
    CHECK_ERR(kiln_train_config_parse("{\"run\": {\"steps\": \"ten\"}}", "t.json", &c), "field 'steps' must be an integer");
    CHECK_ERR(kiln_train_config_parse("{\"optim\": {\"schedule\": \"linear\"}}", "t.json", &c), "\"cosine\" or \"wsd\"");
    CHECK_ERR(kiln_train_config_parse("{\"data\": {\"micro_batch\": 0}}", "t.json", &c), "data.micro_batch");
    CHECK_ERR(kiln_train_config_parse("{\"model\": {\"num_attention_heads\": 3}}", "t.json", &c), "multiple of");
    /* the JSON the checkpoint stores parses back to the same config */
    kiln_train_config_default(&c);
    c.sched.kind = KILN_SCHED_WSD;
    c.steps = 123;
    char *js = kiln_train_config_to_json(&c);
    CHECK(js != NULL);
    kiln_train_config d;
    kiln_train_config_default(&d);
    if (js) CHECK_OK(kiln_train_config_parse(js, "roundtrip", &d));
    CHECK(d.steps == 123 && d.sched.kind == KILN_SCHED_WSD && d.model.hidden_size == c.model.hidden_size);
    free(js);
    /* ... bit for bit: values whose shortest exact text has 16-17 digits (cJSON alone writes 15 when they read back
     * "close enough": 0.1 + 0.2 came back as 0.3, a seed of 2^53 - 1 as 9007199254740990; found by fuzzing) */
    kiln_train_config_default(&c);
    c.sched.lr = 0.1 + 0.2;
    c.optim.beta2 = 0.95 + 1e-16;
    c.model.rope_theta[0] = 10000.000000000002;
    c.data_seed = 9007199254740991ull;
    c.init_seed = 6434445538011819ull;
    c.seq_len = 4097;
    js = kiln_train_config_to_json(&c);
    kiln_train_config_default(&d);
    if (js) CHECK_OK(kiln_train_config_parse(js, "roundtrip", &d));
    CHECK_MSG(d.sched.lr == c.sched.lr && d.optim.beta2 == c.optim.beta2 && d.model.rope_theta[0] == c.model.rope_theta[0],
              "%.17g %.17g %.17g", d.sched.lr, d.optim.beta2, d.model.rope_theta[0]);
    CHECK_MSG(d.data_seed == c.data_seed && d.init_seed == c.init_seed && d.seq_len == 4097, "%llu %llu",
              (unsigned long long)d.data_seed, (unsigned long long)d.init_seed);
    CHECK(js && strstr(js, "0.30000000000000004") && strstr(js, "9007199254740991"));
    free(js);
}

/* optim.muon_ns_precision: bf16 by default (the GPU's Newton-Schulz; the CPU ignores it), each name parses,
 * anything else is an error naming the field, and the checkpoint's JSON keeps it. */
TEST(train_config_muon_ns_precision) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK(c.optim.muon_ns_precision == KILN_NS_BF16);
    static const struct { const char *name; kiln_ns_precision p; } ok[] = {
        {"fp32", KILN_NS_FP32}, {"tf32", KILN_NS_TF32}, {"bf16", KILN_NS_BF16}};
    for (int i = 0; i < 3; i++) {
        char js[128];
        snprintf(js, sizeof js, "{\"optim\": {\"muon_ns_precision\": \"%s\"}}", ok[i].name);
        kiln_train_config_default(&c);
        CHECK_OK(kiln_train_config_parse(js, "t.json", &c));
        CHECK_MSG(c.optim.muon_ns_precision == ok[i].p, "%s parsed as %d", ok[i].name, (int)c.optim.muon_ns_precision);
        CHECK(!strcmp(kiln_ns_precision_name(ok[i].p), ok[i].name));
    }
    kiln_train_config_default(&c);
    CHECK_ERR(kiln_train_config_parse("{\"optim\": {\"muon_ns_precision\": \"fp16\"}}", "t.json", &c),
              "t.json: optim: field 'muon_ns_precision'");
    CHECK_ERR(kiln_train_config_parse("{\"optim\": {\"muon_ns_precision\": 16}}", "t.json", &c), "muon_ns_precision");
    c.optim.muon_ns_precision = (kiln_ns_precision)7;
    CHECK_ERR(kiln_train_config_validate(&c), "optim.muon_ns_precision");
    kiln_train_config_default(&c);
    c.optim.muon_ns_precision = KILN_NS_TF32;
    char *js = kiln_train_config_to_json(&c);
    kiln_train_config d;
    kiln_train_config_default(&d);
    if (js) CHECK_OK(kiln_train_config_parse(js, "roundtrip", &d));
    CHECK(d.optim.muon_ns_precision == KILN_NS_TF32);
    free(js);
}
