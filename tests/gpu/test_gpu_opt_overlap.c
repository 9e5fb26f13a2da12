/* The optimizer step overlapped with the next forward (one rank, AdamW): the sliced step on the optimizer's stream,
 * zeroing the gradients as it reads them (but the experts', which the next backward overwrites), gives the bits of
 * the serial step followed by the gradients' memset (and so does the serial zeroing step), and the forward right
 * after it reads the updated weights (the same loss bits); the trainer without the overlap (the default) and with
 * it (KILN_OPT_OVERLAP=1) writes the same checkpoints and the same final model, byte for byte. No tolerance
 * anywhere: the per-element arithmetic is the same kernel's. */
#include <string.h>

#include "ckpt_testutil.h"
#include "gpu_testutil.h"
#include "kiln/optim.h"
#include "kiln/zaya.h"
#include "kiln/zaya_cuda.h"

/* Four steps of each kind on the same fresh gradients, a forward after the first three (serial + the gradients'
 * memset; overlapped; overlapped in launches of 3 blocks; serial zeroing the gradients as it reads them,
 * kiln_zaya_cuda_opt_step_zeroing);
 * then weights, their bf16 copy, the state, the gradients left (zero, but for the experts' weights, which the next
 * backward overwrites) and the losses compared bit for bit, and a backward after the last step in each way. */
static void overlap_step_case(int tied) {
    kiln_zaya_config c;
    kiln_zaya_config_default(&c);
    c.vocab_size = 50, c.hidden_size = 24, c.num_layers = 2, c.num_heads = 2, c.num_kv_heads = 1, c.head_dim = 8;
    c.num_experts = 3, c.top_k = 1, c.moe_intermediate = 12, c.router_hidden = 8;
    c.layer_types[0] = c.layer_types[1] = KILN_LAYER_HYBRID;
    c.tie_word_embeddings = tied;
    c.lm_head_bias = !tied;
    kiln_zaya *m = NULL;
    CHECK_OK(kiln_zaya_create(&c, &m));
    if (!m) return;
    kiln_zaya_init_random(m, 3);
    const kiln_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                                   .muon_momentum = 0.95, .muon_ns_steps = 5, .use_muon = 0};
    kiln_opt_param *op = calloc((size_t)m->nparams, sizeof *op);
    kiln_optim_classify(m, &hp, op);
    kiln_zaya_cuda *g = NULL;
    kiln_zaya_cuda_opt *o = NULL, *part = NULL;
    const int64_t B = 2, T = 8;
    CHECK_OK(kiln_zaya_cuda_create(m, B, T, 0, &g));
    if (g) CHECK_OK(kiln_zaya_cuda_opt_create(g, op, 0, m->nparams, &o));
    if (g) CHECK_OK(kiln_zaya_cuda_opt_create(g, op, 1, m->nparams, &part));
    if (!g || !o || !part) goto done;
    CHECK_MSG(kiln_zaya_cuda_opt_can_overlap(o), "AdamW on every tensor of one rank: the step should overlap");
    CHECK_MSG(!kiln_zaya_cuda_opt_can_overlap(part), "a rank that does not own every tensor cannot overlap");
    {
        kiln_error *e = kiln_zaya_cuda_opt_step_overlapped(part, 1.0f, &hp, 1e-2, 1);
        CHECK_MSG(e != NULL, "an overlapped step on part of the model was accepted");
        kiln_error_free(e);
        e = kiln_zaya_cuda_opt_step_zeroing(part, 1.0f, &hp, 1e-2, 1);
        CHECK_MSG(e != NULL, "a zeroing step on part of the model was accepted");
        kiln_error_free(e);
    }
    /* the slices: every tensor once, in order; two per layer, the embedding's, the final norm's */
    const int *first = NULL;
    const int ns = kiln_zaya_cuda_overlap_slices(g, &first);
    CHECK_MSG(ns == 2 * c.num_layers + 2, "%d slices for %lld layers", ns, (long long)c.num_layers);
    CHECK(first[0] == 0 && first[ns] == m->nparams);
    for (int k = 0; k < ns; k++) CHECK_MSG(first[k] < first[k + 1], "slice %d is empty", k);
    CHECK_MSG(!strcmp(m->params[first[1]].name, "model.layers.0.input_layernorm.weight"), "slice 1 starts at %s",
              m->params[first[1]].name);
    CHECK_MSG(!strcmp(m->params[first[ns - 1]].name, "model.norm.weight"), "the last slice starts at %s",
              m->params[first[ns - 1]].name);

    const size_t nd = kiln_zaya_cuda_numel(g), nstate = kiln_zaya_cuda_opt_state_numel(o);
    int64_t *ids = malloc((size_t)(B * T) * sizeof *ids);
    for (int64_t i = 0; i < B * T; i++) ids[i] = (i * 7 + 3) % c.vocab_size;
    float *w0 = malloc(m->numel * sizeof *w0), *zeros = calloc(nstate + 1, sizeof *zeros);
    memcpy(w0, m->w, m->numel * sizeof *w0);
    float *w[4], *st[4], *wb[4], *gr[4], *gb[4];
    double loss[4][3] = {{0}};
    for (int mode = 0; mode < 4; mode++) {
        kiln_zaya_cuda_opt_set_overlap_blocks(o, mode == 2 ? 3 : 0);
        CHECK_OK(kiln_zaya_cuda_upload_params(g, w0));
        CHECK_OK(kiln_zaya_cuda_opt_state_upload(o, zeros));
        kiln_rng rng;
        kiln_rng_seed(&rng, 5);
        for (int64_t t = 1; t <= 4; t++) { /* the last step with no forward after it */
            float *h = gt_rand(&rng, (int64_t)m->numel, 0.1f);
            float *hd = calloc(nd + 1, sizeof *hd); /* the device layout: zeros between tensors */
            for (int i = 0; i < m->nparams; i++)
                memcpy(hd + kiln_zaya_cuda_param_offset(g, i), h + m->params[i].offset,
                       (size_t)m->params[i].numel * sizeof *hd);
            CHECK_OK(kiln_zaya_cuda_sync(g)); /* nothing still reads or zeroes the gradients */
            CHECK_OK(kiln_cuda_copy(kiln_zaya_cuda_grads(g), hd, nd * sizeof *hd, KILN_CUDA_H2D));
            free(h), free(hd);
            if (mode == 0) {
                CHECK_OK(kiln_zaya_cuda_opt_step(o, kiln_zaya_cuda_grads(g), 0, 0.5f, &hp, 1e-2, t, 1));
                CHECK_OK(kiln_zaya_cuda_grads_zero(g));
            } else if (mode == 3) {
                CHECK_OK(kiln_zaya_cuda_opt_step_zeroing(o, 0.5f, &hp, 1e-2, t));
            } else {
                CHECK_OK(kiln_zaya_cuda_opt_step_overlapped(o, 0.5f, &hp, 1e-2, t));
            }
            /* queued right behind the step: each layer waits for its own slice */
            if (t <= 3) CHECK_OK(kiln_zaya_cuda_forward(g, ids, &loss[mode][t - 1]));
        }
        if (mode > 0) { /* the stream's users wait for the last step: the sum of the gradients it zeroed */
            double ss = 0;
            for (int i = 0; i < m->nparams; i++) {
                double x = -1;
                if (kiln_zaya_cuda_grad_overwritten(g, i)) continue;
                CHECK_OK(kiln_zaya_cuda_sumsq(g, kiln_zaya_cuda_grads(g) + kiln_zaya_cuda_param_offset(g, i),
                                              (size_t)m->params[i].numel, &x));
                ss += x;
            }
            CHECK_MSG(ss == 0, "gradients after the %s step: sum of squares %g", mode == 3 ? "zeroing" : "overlapped", ss);
        }
        w[mode] = malloc(m->numel * sizeof(float));
        st[mode] = calloc(nstate + 1, sizeof(float));
        gr[mode] = malloc(m->numel * sizeof(float));
        gb[mode] = malloc(m->numel * sizeof(float));
        CHECK_OK(kiln_zaya_cuda_download_params(g, w[mode]));
        CHECK_OK(kiln_zaya_cuda_opt_state_download(o, st[mode]));
        CHECK_OK(kiln_zaya_cuda_download_grads(g, gr[mode]));
        CHECK_OK(kiln_zaya_cuda_sync(g));
        wb[mode] = gt_down_bf16(kiln_zaya_cuda_params_bf16(g), (int64_t)nd);
        /* the next backward: from the memset's zeros (mode 0) or from what the zeroing steps left (the experts'
         * gradients, which it overwrites): the same gradients */
        CHECK_OK(kiln_zaya_cuda_forward(g, ids, NULL));
        CHECK_OK(kiln_zaya_cuda_backward(g));
        CHECK_OK(kiln_zaya_cuda_download_grads(g, gb[mode]));
    }
    CHECK_MSG(memcmp(w[0], w0, m->numel * sizeof *w0), "the steps changed no weight");
    for (int k = 1; k < 4; k++) {
        const char *how = k == 1 ? "overlapped" : k == 2 ? "overlapped (3 blocks a launch)" : "zeroing";
        CHECK_MSG(!memcmp(w[0], w[k], m->numel * sizeof(float)), "%s and serial steps: the weights differ", how);
        CHECK_MSG(!memcmp(wb[0], wb[k], nd * sizeof(float)), "%s and serial steps: the bf16 copies differ", how);
        CHECK_MSG(!memcmp(st[0], st[k], nstate * sizeof(float)), "%s and serial steps: the AdamW state differs", how);
        CHECK_MSG(!memcmp(loss[0], loss[k], sizeof loss[0]),
                  "the forward after the %s step: losses %.9g %.9g %.9g, serial %.9g %.9g %.9g", how, loss[k][0],
                  loss[k][1], loss[k][2], loss[0][0], loss[0][1], loss[0][2]);
    }
    /* every gradient zero after the steps but those the next backward overwrites (the experts' weights: zero after
     * the memset, left as they were by the zeroing steps), and that backward gives the same bits every way */
    size_t nz = 0, kept = 0;
    for (int i = 0; i < m->nparams; i++) {
        const int ow = kiln_zaya_cuda_grad_overwritten(g, i);
        kept += ow ? (size_t)m->params[i].numel : 0;
        for (size_t j = m->params[i].offset; j < m->params[i].offset + (size_t)m->params[i].numel; j++)
            nz += gr[0][j] != 0 || (!ow && (gr[3][j] != 0 || gr[2][j] != 0 || gr[1][j] != 0));
    }
    CHECK_MSG(nz == 0, "%zu gradient elements not zero after the steps", nz);
    CHECK_MSG(kept > 0 && kept < m->numel, "%zu of %zu gradient elements overwritten by the backward", kept, m->numel);
    for (int k = 1; k < 4; k++)
        CHECK_MSG(!memcmp(gb[0], gb[k], m->numel * sizeof(float)), "the backward after the %s steps: gradients differ",
                  k == 3 ? "zeroing" : "overlapped");
    printf("    %s LM head: %d slices, losses %.6f %.6f %.6f, the same bits both ways\n", tied ? "tied" : "untied", ns,
           loss[1][0], loss[1][1], loss[1][2]);
    for (int k = 0; k < 4; k++) free(w[k]), free(st[k]), free(wb[k]), free(gr[k]), free(gb[k]);
    free(ids), free(w0), free(zeros);
done:
    kiln_zaya_cuda_opt_free(part);
    kiln_zaya_cuda_opt_free(o);
    kiln_zaya_cuda_free(g);
    free(op);
    kiln_zaya_free(m);
}

TEST(gpu_zaya_opt_overlap_step) {
    overlap_step_case(1);
    overlap_step_case(0);
}

/* kiln train --device cuda with the step overlapped (KILN_OPT_OVERLAP=1), serial with only the gradients the backward
 * adds to zeroed (KILN_OPT_ZERO_GRADS=1, the default: kiln_zaya_cuda_grads_zero_added), serial zeroing them as it
 * reads them (KILN_OPT_ZERO_GRADS=fused) and serial with the whole memset (=0): two micro-batches a step, the
 * overlapped optimizer in launches of 7 blocks, checkpoints every 3 steps (their snapshots read the device while an
 * overlapped step may still run), per-op profiling of the last step on the overlapped run (its events on both
 * streams): the same losses, checkpoints and final model, byte for byte. */
static const char *ov_out(const char *name) {
    static char keep[4][1200];
    static int k;
    char *p = keep[k++ & 3]; /* at most 4 alive */
    snprintf(p, sizeof keep[0], "%s/%s", test_tmpdir(), name);
    return p;
}

static int ov_train(const char *data, const char *out) {
    const char *cfg = ck_config(data, out, 9, 2, 32,
                                "\"ckpt_every\": 3, \"keep_last\": 10, \"device\": \"cuda\", \"async_ckpt\": false");
    char args[4096];
    snprintf(args, sizeof args, "train --config '%s' --out '%s' --quiet", cfg, out);
    return ck_kiln(args);
}

TEST(gpu_zaya_train_overlap) {
    char data[1200];
    snprintf(data, sizeof data, "%s", ck_data());
    const char *s = ov_out("serial"), *o = ov_out("overlap"), *z = ov_out("zeroing"), *f = ov_out("fused");
    setenv("KILN_OPT_OVERLAP", "0", 1);
    setenv("KILN_OPT_ZERO_GRADS", "0", 1);
    CHECK(ov_train(data, s) == 0);
    setenv("KILN_OPT_ZERO_GRADS", "1", 1);
    CHECK(ov_train(data, z) == 0);
    setenv("KILN_OPT_ZERO_GRADS", "fused", 1);
    CHECK(ov_train(data, f) == 0);
    unsetenv("KILN_OPT_ZERO_GRADS");
    setenv("KILN_OPT_OVERLAP", "1", 1);
    setenv("KILN_OPT_OVERLAP_BLOCKS", "7", 1); /* and its launches of 7 blocks */
    setenv("KILN_CUDA_PROFILE", "1", 1);
    CHECK(ov_train(data, o) == 0);
    unsetenv("KILN_CUDA_PROFILE");
    unsetenv("KILN_OPT_OVERLAP_BLOCKS");
    unsetenv("KILN_OPT_OVERLAP");
    double ls[9] = {0}, lo[9] = {0}, lz[9] = {0}, lf[9] = {0};
    CHECK(ck_losses(s, ls, 9) == 9 && ck_losses(o, lo, 9) == 9 && ck_losses(z, lz, 9) == 9 && ck_losses(f, lf, 9) == 9);
    CHECK_MSG(!memcmp(ls, lo, sizeof ls), "the logged losses differ (overlapped)");
    CHECK_MSG(!memcmp(ls, lz, sizeof ls), "the logged losses differ (zeroing the added gradients)");
    CHECK_MSG(!memcmp(ls, lf, sizeof ls), "the logged losses differ (fused zeroing)");
    for (int step = 3; step <= 9; step += 3) {
        CHECK_MSG(ck_same_shard(s, o, step), "step %d: the checkpoints differ (overlapped)", step);
        CHECK_MSG(ck_same_shard(s, z, step), "step %d: the checkpoints differ (zeroing the added gradients)", step);
        CHECK_MSG(ck_same_shard(s, f, step), "step %d: the checkpoints differ (fused zeroing)", step);
    }
    CHECK_MSG(ck_same_model_file(s, o), "the final models differ (overlapped)");
    CHECK_MSG(ck_same_model_file(s, z), "the final models differ (zeroing the added gradients)");
    CHECK_MSG(ck_same_model_file(s, f), "the final models differ (fused zeroing)");
    printf("    loss %.4f -> %.4f over 9 steps, both ways\n", lo[0], lo[8]);
}
