/* kiln ckpt reshape: a checkpoint written by N ranks -> one for M ranks.
 *
 * What moves: ZeRO-1 gives each rank whole tensors (parameters and their optimizer state), so the
 * new shards are the same tensors regrouped by the M-rank partition (src/train/zero1.c), written
 * straight from the mapped input shards: tensor by tensor through the page cache, the model never
 * held in memory. Rank 0 keeps the balance controller's state.
 *
 * What must stay the same: the global batch and the data position. The loader deals windows to
 * ranks in blocks of the micro-batch B (src/data/loader.c), so a step of N ranks x A micro-batches
 * reads the same N*A*B windows as M ranks x (N*A/M) micro-batches, provided M divides N*A. Every
 * rank of N has read `cursor` windows of the epoch, N*cursor globally; the M ranks continue at
 * N*cursor/M each. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ckpt.h"
#include "kiln/progress.h"
#include "output.h"
#include "source.h"
#include "train/train_internal.h"

/* Windows per rank and epoch, and the loader fingerprint, for `world` ranks on this config's data. */
static kiln_error *data_layout(const kiln_train_config *c, int world, uint64_t *per_rank, uint64_t *fp) {
    kiln_loader *l = NULL;
    KILN_TRY(kiln_loader_open(c->data_dir, "train", c->seq_len, c->data_seed, 0, world, &l));
    kiln_error *e = kiln_loader_set_block(l, c->micro_batch);
    if (!e) {
        *per_rank = kiln_loader_windows(l);
        *fp = kiln_loader_get_state(l).fingerprint;
    }
    kiln_loader_close(l);
    return e;
}

/* The loader positions for M ranks, or an error saying why the position cannot be mapped. */
static kiln_error *map_position(const ckpt_src *s, int M, FILE *log, kiln_train_config *nc, kiln_loader_state *out) {
    const kiln_train_config *c = &s->cfg;
    const int N = s->world;
    const int64_t A = c->grad_accum, B = c->micro_batch;
    const kiln_loader_state *l0 = &s->loaders[0];
    for (int r = 1; r < N; r++)
        if (s->loaders[r].seed != l0->seed || s->loaders[r].epoch != l0->epoch || s->loaders[r].cursor != l0->cursor)
            return kiln_errorf(KILN_EFORMAT, "%s/manifest.json: ranks 0 and %d are at different data positions "
                               "(epoch %" PRIu64 " window %" PRIu64 " vs epoch %" PRIu64 " window %" PRIu64
                               "): not a checkpoint the trainer wrote", s->dir, r, l0->epoch, l0->cursor,
                               s->loaders[r].epoch, s->loaders[r].cursor);
    if ((N * A) % M)
        return kiln_errorf(KILN_EINVAL, "cannot reshape %d ranks to %d: the global batch is %d ranks x %lld micro-batches "
                           "(grad_accum) x %lld windows = %lld windows, and %lld micro-batches of %lld cannot be dealt "
                           "evenly to %d ranks; choose a world size that divides %lld, or train with a grad_accum that "
                           "makes %d x grad_accum divisible by %d", N, M, N, (long long)A, (long long)B,
                           (long long)(N * A * B), (long long)(N * A), (long long)B, M, (long long)(N * A), N, M);
    if (c->batch_ramp_start > 0 && c->batch_ramp_steps > 0 && s->step < c->batch_ramp_steps)
        return kiln_errorf(KILN_EINVAL, "cannot reshape at step %lld: the batch-size ramp (data.batch_ramp_steps = %lld) "
                           "is still running and its per-rank micro-batch counts do not scale exactly; reshape a "
                           "checkpoint from step %lld or later", (long long)s->step, (long long)c->batch_ramp_steps,
                           (long long)c->batch_ramp_steps);
    const uint64_t global = (uint64_t)N * l0->cursor;
    if (global % ((uint64_t)M * (uint64_t)B))
        return kiln_errorf(KILN_EINVAL, "cannot reshape %d ranks to %d: the data position (%" PRIu64 " windows into epoch %"
                           PRIu64 ") is not a whole number of %d-rank micro-batch blocks", N, M, global, l0->epoch, M);
    *nc = *c;
    nc->grad_accum = N * A / M;
    if (c->batch_ramp_start > 0) nc->batch_ramp_start = c->batch_ramp_start * N / M > 0 ? c->batch_ramp_start * N / M : 1;
    if (nc->batch_ramp_start > nc->grad_accum) nc->batch_ramp_start = nc->grad_accum;
    const uint64_t cursor = global / (uint64_t)M;
    uint64_t fp = 0, perN = 0, perM = 0, fpN = 0;
    kiln_error *e = data_layout(c, M, &perM, &fp);
    if (!e) e = data_layout(c, N, &perN, &fpN);
    if (e) {
        /* no data here (another machine): positions are exact, the layout is checked at resume */
        if (log) fprintf(log, "note: data not checked (%s); the position is carried over unchecked\n", kiln_error_msg(e));
        kiln_error_free(e);
        fp = 0;
    } else {
        if (l0->fingerprint && l0->fingerprint != fpN)
            return kiln_errorf(KILN_EINVAL, "%s: the data at %s is not the data this checkpoint was trained on "
                               "(loader fingerprint %016" PRIx64 ", the data gives %016" PRIx64 ")", s->dir,
                               c->data_dir, l0->fingerprint, fpN);
        if (cursor >= perM)
            return kiln_errorf(KILN_EINVAL, "cannot reshape %d ranks to %d: the position %" PRIu64 " windows into the "
                               "epoch is past the %" PRIu64 " windows an epoch has for %d ranks x blocks of %lld", N, M,
                               global, perM * (uint64_t)M, M, (long long)B);
        if (perN * (uint64_t)N != perM * (uint64_t)M && log)
            fprintf(log, "note: an epoch is %" PRIu64 " windows for %d ranks and %" PRIu64 " for %d (the data does not "
                    "divide evenly into blocks); the order is identical until the end of this epoch\n",
                    perN * (uint64_t)N, N, perM * (uint64_t)M, M);
    }
    for (int r = 0; r < M; r++) out[r] = (kiln_loader_state){l0->seed, l0->epoch, cursor, fp};
    return NULL;
}

kiln_error *kiln_ckpt_reshape(const char *from, const char *to, int M, int force, FILE *log) {
    if (M < 1 || M > KILN_CKPT_MAX_WORLD)
        return kiln_errorf(KILN_EINVAL, "--world-size must be in 1..%d, got %d", KILN_CKPT_MAX_WORLD, M);
    /* before the input's checksums are read (minutes for a large checkpoint): a refusal comes at once */
    const char *const writes[] = {"config.json", NULL};
    KILN_TRY(ckpt_out_check_target(to, writes, 1, force, "reshape"));
    ckpt_src s;
    KILN_TRY(ckpt_src_open(from, log, &s));
    kiln_train_config nc;
    kiln_loader_state *pos = calloc((size_t)M, sizeof *pos);
    int *owner = calloc((size_t)s.table.nparams + 1, sizeof *owner);
    zero1_partition part = {0};
    ckpt_out o = {0};
    cJSON *man = NULL;
    kiln_error *e = pos && owner ? NULL : kiln_errorf(KILN_ENOMEM, "reshape");
    if (!e) e = map_position(&s, M, log, &nc, pos);
    if (!e) e = zero1_partition_make(&s.table, M, &part);
    if (!e && log)
        fprintf(log, "reshaping %s (step %lld, %d ranks x grad_accum %lld) -> %s/ckpt/step_%08lld (%d ranks x grad_accum %lld)\n",
                s.dir, (long long)s.step, s.world, (long long)s.cfg.grad_accum, to, (long long)s.step, M,
                (long long)nc.grad_accum);
    if (!e) e = ckpt_out_begin(&o, to, s.step, M);
    kiln_progress pr;
    if (!e) kiln_progress_start(&pr, "reshape", (uint64_t)s.table.nparams, "tensor");
    for (int r = 0; !e && r < M; r++) {
        const int first = part.first[r], last = part.first[r + 1];
        const size_t cap = 2 * (size_t)(last - first) + 3;
        kiln_st_entry *ent = calloc(cap, sizeof *ent);
        char(*names)[112] = calloc(cap, sizeof *names);
        size_t n = 0;
        if (!ent || !names) e = kiln_errorf(KILN_ENOMEM, "reshape");
        for (int t = first; !e && t < last; t++) {
            owner[t] = r;
            for (int k = 0; k < 2; k++) {
                const char *kind = k ? "opt" : "param";
                const kiln_st_tensor *x = ckpt_src_tensor(&s, kind, t);
                snprintf(names[n], sizeof names[n], "%s.%s", kind, s.table.params[t].name);
                ent[n] = (kiln_st_entry){names[n], x->dtype, x->ndim, x->shape, x->data};
                n++;
            }
        }
        if (!e && r == 0) {
            const char *keep[] = {"balancing_biases", "balance.integral", "balance.prev_err"};
            for (int k = 0; k < 3; k++) {
                const kiln_st_tensor *x = kiln_st_find(s.st[0], keep[k]);
                ent[n++] = (kiln_st_entry){keep[k], x->dtype, x->ndim, x->shape, x->data};
            }
        }
        if (!e) e = ckpt_out_shard(&o, r, ent, n);
        if (!e) kiln_progress_update(&pr, (uint64_t)last);
        free(ent);
        free(names);
    }
    if (!e) kiln_progress_finish(&pr);
    if (!e) {
        double tokens = 0;
        int have_prev = 0;
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(s.man, "tokens_seen");
        if (cJSON_IsNumber(x)) tokens = x->valuedouble;
        have_prev = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s.man, "balance_have_prev"));
        snprintf(nc.out_dir, sizeof nc.out_dir, "%s", o.abs); /* as DIR/config.json says (ckpt_out_config) */
        man = ckpt_manifest_new(&nc, &s.table, s.op, owner, M, s.step, tokens, have_prev, pos);
        cJSON *prov = man ? cJSON_AddObjectToObject(man, "reshaped_from") : NULL;
        if (prov) {
            cJSON_AddStringToObject(prov, "dir", s.dir);
            cJSON_AddNumberToObject(prov, "world_size", s.world);
            cJSON_AddNumberToObject(prov, "grad_accum", (double)s.cfg.grad_accum);
        }
        e = man ? ckpt_out_commit(&o, man) : kiln_errorf(KILN_ENOMEM, "manifest");
    }
    if (!e) e = ckpt_out_config(&o, &nc);
    /* the output is read back and checked like any checkpoint before we call it done */
    if (!e) e = kiln_error_wrap(kiln_ckpt_verify(o.fin), "verifying the reshaped checkpoint");
    if (!e && log)
        fprintf(log, "wrote %s and %s/config.json; continue with: mpirun -np %d kiln train --config %s/config.json --resume\n",
                o.fin, o.abs, M, o.abs);
    ckpt_out_end(&o);
    cJSON_Delete(man);
    zero1_partition_free(&part);
    free(owner);
    free(pos);
    ckpt_src_close(&s);
    return e;
}
