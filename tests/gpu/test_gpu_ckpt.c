/* The CUDA trainer's checkpoints (src/models/zaya_cuda_snapshot.c, src/train/checkpoint.c): the device
 * snapshot's stream is byte for byte the host data it copied, for every place a snapshot can go and for
 * chunks that cut tensors anywhere, and it does not see the training that goes on after it; the shard the
 * GPU writer streams is the file the CPU writer writes from the same numbers; GPU and CPU checkpoints
 * resume on the other device. Exact comparisons throughout: a checkpoint is copied, never computed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_testutil.h"
#include "gpu_testutil.h"
#include "kiln/ckpt.h"
#include "kiln/comm.h"
#include "kiln/optim.h"
#include "kiln/zaya.h"
#include "kiln/zaya_cuda.h"
#include "kiln/zaya_cuda_snapshot.h"
#include "train/train_internal.h"

/* A small model with AdamW and Muon tensors, its GPU twin, and every tensor's optimizer class. */
typedef struct {
    kiln_zaya *m;
    kiln_zaya_cuda *g;
    kiln_opt_param *op;
    kiln_optim_hparams hp;
} ck_gpu;

static int ck_gpu_make(ck_gpu *x) {
    memset(x, 0, sizeof *x);
    kiln_zaya_config c;
    kiln_zaya_config_default(&c);
    c.vocab_size = 50, c.hidden_size = 24, c.num_layers = 2, c.num_heads = 2, c.num_kv_heads = 1, c.head_dim = 8;
    c.num_experts = 3, c.top_k = 1, c.moe_intermediate = 12, c.router_hidden = 8, c.eos_token_id = -1;
    CHECK_OK(kiln_zaya_create(&c, &x->m));
    if (!x->m) return 0;
    kiln_zaya_init_random(x->m, 3);
    x->hp = (kiln_optim_hparams){0.9, 0.95, 1e-8, 0.1, 0.95, 5, 1, KILN_NS_FP32};
    x->op = calloc((size_t)x->m->nparams, sizeof *x->op);
    kiln_optim_classify(x->m, &x->hp, x->op);
    CHECK_OK(kiln_zaya_cuda_create(x->m, 1, 4, 0, &x->g));
    return x->g != NULL;
}

static void ck_gpu_free(ck_gpu *x) {
    kiln_zaya_cuda_free(x->g);
    free(x->op);
    kiln_zaya_free(x->m);
}

/* The optimizer of tensors [first,last) with random state (host copy in *state). */
static kiln_zaya_cuda_opt *opt_with_state(ck_gpu *x, int first, int last, uint64_t seed, float **state) {
    kiln_zaya_cuda_opt *o = NULL;
    CHECK_OK(kiln_zaya_cuda_opt_create(x->g, x->op, first, last, &o));
    if (!o) return NULL;
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    *state = gt_rand(&rng, (int64_t)kiln_zaya_cuda_opt_state_numel(o), 1.0f);
    CHECK_OK(kiln_zaya_cuda_opt_state_upload(o, *state));
    return o;
}

/* What the shard's data section holds for tensors [first,last): param then opt of each, from the host. */
static unsigned char *expected_stream(const ck_gpu *x, int first, int last, const float *w, const float *state,
                                      size_t *bytes) {
    size_t n = 0;
    for (int t = first; t < last; t++) n += (size_t)(x->m->params[t].numel + kiln_optim_state_numel(&x->op[t]));
    unsigned char *b = malloc(n * 4 + 1), *p = b;
    for (int t = first; t < last; t++) {
        const size_t ns = (size_t)kiln_optim_state_numel(&x->op[t]), np = (size_t)x->m->params[t].numel;
        memcpy(p, w + x->m->params[t].offset, np * 4), p += np * 4;
        memcpy(p, state, ns * 4), p += ns * 4;
        state += ns;
    }
    *bytes = n * 4;
    return b;
}

/* Read a snapshot's whole stream; the pieces must respect the chunk size. */
static unsigned char *read_stream(kiln_zaya_cuda_snap *s, size_t chunk, size_t *bytes, int *pieces) {
    const uint64_t total = kiln_zaya_cuda_snap_bytes(s);
    unsigned char *b = malloc(total + 1);
    size_t at = 0;
    *pieces = 0;
    CHECK_OK(kiln_zaya_cuda_snap_read_begin(s));
    while (at < total) {
        const void *p = NULL;
        size_t len = 0;
        kiln_error *e = kiln_zaya_cuda_snap_read(s, &p, &len);
        CHECK_OK(e);
        if (e || !len || at + len > total) {
            CHECK_MSG(0, "stream piece of %zu bytes at %zu of %llu", len, at, (unsigned long long)total);
            break;
        }
        CHECK_MSG(len <= chunk, "a piece of %zu bytes, chunk %zu", len, chunk);
        memcpy(b + at, p, len);
        at += len;
        ++*pieces;
    }
    const void *p = NULL;
    size_t len = 1;
    CHECK_OK(kiln_zaya_cuda_snap_read(s, &p, &len));
    CHECK_MSG(len == 0, "the stream goes on past its %llu bytes", (unsigned long long)total);
    kiln_zaya_cuda_snap_read_end(s);
    *bytes = at;
    return b;
}

/* Both ranks' shards of a 2-rank partition (rank 1's first tensor is not at device offset 0), every place,
 * a chunk of 4100 bytes (cuts tensors mid-way, not a multiple of a tensor) and the default; after a copied
 * snapshot is taken the device parameters and state are overwritten (the next steps), and the stream must
 * still give the numbers of the moment it was taken. */
TEST(gpu_ckpt_snapshot_stream) {
    ck_gpu x;
    if (!ck_gpu_make(&x)) {
        ck_gpu_free(&x);
        return;
    }
    zero1_partition part = {0};
    CHECK_OK(zero1_partition_make(x.m, 2, &part));
    float *junk = malloc(2 * x.m->numel * sizeof *junk); /* AdamW's state is 2 floats a parameter */
    for (size_t i = 0; i < 2 * x.m->numel; i++) junk[i] = -7.0f;
    static const kiln_snap_place places[] = {KILN_SNAP_AUTO, KILN_SNAP_DEVICE, KILN_SNAP_PINNED, KILN_SNAP_PAGEABLE};
    static const char *const where[] = {"device", "device", "pinned host", "pageable host"};
    for (int r = 0; r < 2; r++) {
        const int first = part.first[r], last = part.first[r + 1];
        for (int live = 1; live >= 0; live--)
            for (int pl = 0; pl < (live ? 1 : 4); pl++)
                for (int ch = 0; ch < 2; ch++) {
                    const size_t chunk = ch ? 4100 : 0;
                    float *state = NULL;
                    CHECK_OK(kiln_zaya_cuda_upload_params(x.g, x.m->w));
                    kiln_zaya_cuda_opt *o = opt_with_state(&x, first, last, 11 + (uint64_t)r, &state);
                    kiln_zaya_cuda_snap *s = NULL;
                    if (o) CHECK_OK(kiln_zaya_cuda_snap_create(x.g, o, x.m, x.op, first, last, chunk, &s));
                    if (s) {
                        size_t want_n = 0, got_n = 0;
                        unsigned char *want = expected_stream(&x, first, last, x.m->w, state, &want_n);
                        CHECK_OK(kiln_zaya_cuda_snap_take(s, !live, places[pl]));
                        const char *at = kiln_zaya_cuda_snap_where(s);
                        CHECK_MSG(!strcmp(at, live ? "live" : where[pl]), "snapshot in %s memory, expected %s", at,
                                  live ? "live" : where[pl]);
                        if (!live) { /* training goes on: the model's stream overwrites what was copied */
                            CHECK_OK(kiln_zaya_cuda_upload_params(x.g, junk));
                            CHECK_OK(kiln_zaya_cuda_opt_state_upload(o, junk));
                        }
                        int pieces = 0;
                        unsigned char *got = read_stream(s, chunk ? chunk : (size_t)256 << 20, &got_n, &pieces);
                        CHECK_MSG(got_n == want_n && kiln_zaya_cuda_snap_bytes(s) == want_n,
                                  "rank %d: %zu bytes streamed, %zu expected", r, got_n, want_n);
                        size_t bad = got_n;
                        for (size_t i = 0; i < got_n && i < want_n; i++)
                            if (got[i] != want[i]) {
                                bad = i;
                                break;
                            }
                        CHECK_MSG(bad == got_n, "rank %d, %s, chunk %zu: the stream differs at byte %zu of %zu", r, at,
                                  chunk, bad, got_n);
                        if (ch) CHECK_MSG(pieces >= (int)(want_n / 4100), "%d pieces for %zu bytes", pieces, want_n);
                        free(want), free(got);
                    }
                    kiln_zaya_cuda_snap_free(s);
                    kiln_zaya_cuda_opt_free(o);
                    free(state);
                }
    }
    printf("    2 ranks x {live, auto, device, pinned, pageable} x {4100-byte, 256 MiB chunks}: streams exact\n");
    free(junk);
    zero1_partition_free(&part);
    ck_gpu_free(&x);
}

/* The GPU writer's shard (sync from the live buffers; async through a device, pinned or pageable
 * snapshot, with the device state overwritten right after the save began) is the CPU writer's shard of the
 * same numbers, byte for byte, and the checkpoint verifies. */
TEST(gpu_ckpt_writer_matches_cpu) {
    ck_gpu x;
    if (!ck_gpu_make(&x)) {
        ck_gpu_free(&x);
        return;
    }
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.model = x.m->cfg;
    c.optim = x.hp;
    c.keep_last = 10;
    kiln_comm *comm = NULL;
    CHECK_OK(kiln_comm_local(&comm));
    zero1_partition part = {0};
    CHECK_OK(zero1_partition_make(x.m, 1, &part));
    balance_ctl bal = {0};
    CHECK_OK(balance_init(&bal, x.m->cfg.num_layers, x.m->cfg.num_experts + 1));
    for (int64_t i = 0; i < x.m->cfg.num_layers * (x.m->cfg.num_experts + 1); i++) {
        x.m->balancing[i] = 0.01f * (float)i;
        bal.integral[i] = 0.5 * (double)i;
        bal.prev_err[i] = -0.25 * (double)i;
    }
    /* the cursor a whole number of micro-batches: kiln_ckpt_verify refuses a position the trainer never writes */
    kiln_loader_state ls = {c.data_seed, 1, 7 * (uint64_t)c.micro_batch, 9};
    float *state = NULL, *junk = malloc(2 * x.m->numel * sizeof *junk);
    for (size_t i = 0; i < 2 * x.m->numel; i++) junk[i] = 3.0f;
    kiln_zaya_cuda_opt *o = comm ? opt_with_state(&x, 0, x.m->nparams, 21, &state) : NULL;
    char ref[1400], got[1400];
    static const char *const modes[][2] = {{"sync", "auto"}, {"async", "auto"}, {"async", "pinned"}, {"async", "pageable"}};
    if (o) {
        snprintf(c.out_dir, sizeof c.out_dir, "%s/cpu", test_tmpdir());
        ckpt_view v = {5, &c, x.m, &part, x.op, state, &bal, &ls, 1234};
        CHECK_OK(ckpt_save(comm, &v)); /* the CPU writer, from the host numbers */
        snprintf(ref, sizeof ref, "%s/ckpt/step_00000005/rank_00000.safetensors", c.out_dir);
        for (int k = 0; k < 4; k++) {
            CHECK_OK(kiln_zaya_cuda_upload_params(x.g, x.m->w));
            CHECK_OK(kiln_zaya_cuda_opt_state_upload(o, state));
            setenv("KILN_CKPT_SNAPSHOT", modes[k][1], 1);
            const int async = !strcmp(modes[k][0], "async");
            ckpt_writer *w = NULL;
            kiln_zaya_cuda_snap *s = NULL;
            CHECK_OK(ckpt_writer_create(async, &w));
            CHECK_OK(kiln_zaya_cuda_snap_create(x.g, o, x.m, x.op, 0, x.m->nparams, 4100, &s));
            if (w && s) CHECK_OK(ckpt_writer_use_cuda(w, s));
            snprintf(c.out_dir, sizeof c.out_dir, "%s/gpu_%s_%s", test_tmpdir(), modes[k][0], modes[k][1]);
            ckpt_view gv = {5, &c, x.m, &part, x.op, junk /* the host state is not read */, &bal, &ls, 1234};
            if (w) CHECK_OK(ckpt_writer_save(w, comm, &gv, 0));
            if (async) { /* the next step changes everything on the device while the shard is written */
                CHECK_OK(kiln_zaya_cuda_upload_params(x.g, junk));
                CHECK_OK(kiln_zaya_cuda_opt_state_upload(o, junk));
            }
            if (w) CHECK_OK(ckpt_writer_poll(w, comm, 1));
            printf("    %-5s %-8s snapshot in %s memory\n", modes[k][0], modes[k][1], w ? ckpt_writer_snapshot_where(w) : "?");
            ckpt_writer_free(w);
            snprintf(got, sizeof got, "%s/ckpt/step_00000005/rank_00000.safetensors", c.out_dir);
            CHECK_MSG(ck_same_file(ref, got), "%s %s: the GPU shard differs from the CPU writer's", modes[k][0],
                      modes[k][1]);
            char dir[1400];
            snprintf(dir, sizeof dir, "%s/ckpt/step_00000005", c.out_dir);
            CHECK_OK(kiln_ckpt_verify(dir));
        }
        unsetenv("KILN_CKPT_SNAPSHOT");
    }
    kiln_zaya_cuda_opt_free(o);
    free(state), free(junk);
    balance_free(&bal);
    zero1_partition_free(&part);
    if (comm) comm->finalize(comm);
    ck_gpu_free(&x);
}

/* kiln train --device cuda end to end: asynchronous (device snapshot) and synchronous checkpoints of the
 * same run are the same files; a GPU checkpoint resumes on the CPU and a CPU checkpoint on the GPU, the
 * first step after the resume within bf16 noise (5%) of the run that did not change device. */
static const char *ck_out(const char *name) {
    static char keep[8][1200];
    static int k;
    char *p = keep[k++ & 7];
    snprintf(p, sizeof keep[0], "%s/%s", test_tmpdir(), name);
    return p;
}

static int train_in(const char *cfg, const char *out, const char *extra) {
    char args[4096];
    snprintf(args, sizeof args, "train --config '%s' --out '%s' --quiet %s", cfg, out, extra);
    return ck_kiln(args);
}

TEST(gpu_ckpt_train_async_sync_and_cross_device_resume) {
    char data[1200];
    snprintf(data, sizeof data, "%s", ck_data());
    const char *a = ck_out("async"), *s = ck_out("sync");
    const char *ca = ck_config(data, a, 6, 1, 32, "\"ckpt_every\": 2, \"keep_last\": 10, \"device\": \"cuda\", \"async_ckpt\": true, \"ckpt_busy\": \"wait\"");
    CHECK(train_in(ca, a, "") == 0);
    const char *cs = ck_config(data, s, 6, 1, 32, "\"ckpt_every\": 2, \"keep_last\": 10, \"device\": \"cuda\", \"async_ckpt\": false");
    CHECK(train_in(cs, s, "") == 0);
    for (int step = 2; step <= 6; step += 2)
        CHECK_MSG(ck_same_shard(a, s, step), "step %d: the async GPU checkpoint differs from the sync one", step);
    char args[2000], text[16384];
    snprintf(args, sizeof args, "ckpt verify '%s'", a);
    CHECK_MSG(test_run_kiln(args, text, sizeof text) == 0 && strstr(text, "3 checkpoints, 0 invalid"), "%s", text);

    /* GPU -> CPU: stop the GPU run at 3, go on to 6 on the CPU; the CPU run from 0 is the reference */
    const char *g2c = ck_out("g2c"), *c2g = ck_out("c2g"), *cpu = ck_out("cpu"), *gpu = ck_out("gpu");
    const char *cfg = ck_config(data, cpu, 6, 1, 32, "\"ckpt_every\": 0, \"async_ckpt\": true");
    CHECK(train_in(cfg, cpu, "--device cpu") == 0);
    CHECK(train_in(cfg, gpu, "--device cuda") == 0);
    CHECK(train_in(cfg, g2c, "--device cuda --stop-after 3") == 0);
    CHECK(train_in(cfg, g2c, "--device cpu --resume") == 0);
    CHECK(train_in(cfg, c2g, "--device cpu --stop-after 3") == 0);
    CHECK(train_in(cfg, c2g, "--device cuda --resume") == 0);
    double lc[6] = {0}, lg[6] = {0}, l1[6] = {0}, l2[6] = {0};
    CHECK(ck_losses(cpu, lc, 6) == 6 && ck_losses(gpu, lg, 6) == 6);
    CHECK(ck_losses(g2c, l1, 6) == 6 && ck_losses(c2g, l2, 6) == 6);
    /* step 4 is the first after the resume: it starts from the other device's step-3 state exactly */
    const double d1 = fabs(l1[3] - lg[3]) / lg[3], d2 = fabs(l2[3] - lc[3]) / lc[3];
    printf("    step 4: gpu %.5f, gpu->cpu %.5f (%.2g); cpu %.5f, cpu->gpu %.5f (%.2g)\n", lg[3], l1[3], d1, lc[3], l2[3], d2);
    CHECK_MSG(d1 <= 0.05 && d2 <= 0.05, "the resumed runs' losses are off: %.3g, %.3g", d1, d2);
    CHECK_MSG(l1[0] == lg[0] && l2[0] == lc[0], "the steps before the stop are not the device's own");
}
