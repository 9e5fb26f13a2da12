/* kiln ckpt export-hf / import-hf: between training checkpoints and HF ZAYA directories.
 *
 * export-hf streams the parameters out of the mapped shards into one model.safetensors with HF's
 * names and order, exactly what kiln_zaya_save_dir writes (src/models/zaya.c), plus config.json;
 * the optimizer state stays behind. import-hf loads a HF directory once and writes a step-0
 * checkpoint (fresh optimizer and balance state, data at the start) in the trainer's layout for
 * any world size, with the training config beside it, so that `kiln train --config TO/config.json
 * --resume` starts training from the HF weights. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/ckpt.h"
#include "kiln/fsutil.h"
#include "output.h"
#include "source.h"
#include "train/train_internal.h"

static int failed(kiln_error *e) {
    kiln_error_free(e);
    return e != NULL;
}

static kiln_error *mkdir_to(const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST) return kiln_errorf(KILN_EIO, "%s: cannot create: %s", dir, strerror(errno));
    return NULL;
}

/* The data's tokenizer.json, when this machine has it (malloc'd path; NULL: none, nothing to copy). */
static char *tokenizer_of(const kiln_train_config *c) {
    kiln_data_index *ix = NULL;
    if (failed(kiln_data_index_read(c->data_dir, &ix))) return NULL;
    char *p = ix->tokenizer_path && access(ix->tokenizer_path, R_OK) == 0 ? strdup(ix->tokenizer_path) : NULL;
    kiln_data_index_free(ix);
    return p;
}

/* The data's tokenizer beside the model (as `kiln train` does). */
static void copy_tokenizer(const char *src, const char *to, FILE *log) {
    char *text = NULL, *dst = kiln_path_join(to, "tokenizer.json");
    size_t len = 0;
    if (src && dst && !failed(kiln_read_file(src, &text, &len)) && !failed(kiln_write_file_atomic(dst, text, len)) && log)
        fprintf(log, "copied the data's tokenizer %s -> %s\n", src, dst);
    free(text);
    free(dst);
}

/* The weights of another model that --force leaves in `to` beside the new model.safetensors: a sharded model's
 * model-*.safetensors and model.safetensors.index.json. A loader would take one or the other model depending on
 * what it looks for first; removed after the new model is in place, so a failed export loses nothing more. */
static kiln_error *remove_other_weights(const char *to, FILE *log) {
    DIR *d = opendir(to);
    if (!d) return kiln_errorf(KILN_EIO, "%s: cannot list: %s", to, strerror(errno));
    kiln_error *e = NULL;
    struct dirent *de;
    const size_t ext = strlen(".safetensors");
    while (!e && (de = readdir(d))) {
        const char *n = de->d_name;
        const size_t len = strlen(n);
        const int shard = !strncmp(n, "model", 5) && len >= 5 + ext && !strcmp(n + len - ext, ".safetensors") &&
                          strcmp(n, "model.safetensors");
        if (!shard && strcmp(n, "model.safetensors.index.json")) continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", to, n);
        if (unlink(path)) e = kiln_errorf(KILN_EIO, "%s: cannot remove: %s", path, strerror(errno));
        else if (log) fprintf(log, "removed %s (--force: the exported model.safetensors replaces it)\n", path);
    }
    closedir(d);
    return e;
}

kiln_error *kiln_ckpt_export_hf(const char *from, const char *to, int force, FILE *log) {
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/model.safetensors", to);
    /* the files always written, checked before the input's checksums are read (minutes for a large checkpoint) */
    const char *const writes[] = {"config.json", "model.safetensors", NULL};
    KILN_TRY(ckpt_out_check_target(to, writes, 0, force, "export-hf"));
    ckpt_src s;
    KILN_TRY(ckpt_src_open(from, log, &s));
    /* tokenizer.json only where the data's is found: known once the checkpoint's config is; still nothing written */
    char *tok = tokenizer_of(&s.cfg);
    const char *const writes_tok[] = {"tokenizer.json", NULL};
    kiln_error *te = tok ? ckpt_out_check_target(to, writes_tok, 0, force, "export-hf") : NULL;
    if (te) {
        free(tok);
        ckpt_src_close(&s);
        return te;
    }
    const kiln_zaya *m = &s.table;
    const int64_t L = m->cfg.num_layers, E1 = m->cfg.num_experts + 1;
    const size_t n = (size_t)m->nparams + (size_t)L;
    kiln_st_entry *ent = calloc(n, sizeof *ent);
    char(*names)[128] = calloc((size_t)L + 1, sizeof *names);
    int64_t e1 = E1;
    kiln_error *e = ent && names ? mkdir_to(to) : kiln_errorf(KILN_ENOMEM, "export");
    for (int t = 0; !e && t < m->nparams; t++) {
        const kiln_st_tensor *x = ckpt_src_tensor(&s, "param", t);
        ent[t] = (kiln_st_entry){m->params[t].name, KILN_DT_F32, m->params[t].ndim, m->params[t].shape, x->data};
    }
    const kiln_st_tensor *bias = kiln_st_find(s.st[0], "balancing_biases");
    for (int64_t l = 0; !e && l < L; l++) {
        snprintf(names[l], sizeof names[l], "model.layers.%lld.mlp.gate.balancing_biases", (long long)l);
        ent[m->nparams + l] = (kiln_st_entry){names[l], KILN_DT_F32, 1, &e1, (const float *)bias->data + l * E1};
    }
    const char *meta[] = {"format", "pt", NULL};
    if (!e) e = kiln_st_write(probe, ent, n, meta);
    if (!e) {
        char cp[1200];
        snprintf(cp, sizeof cp, "%s/config.json", to);
        e = kiln_zaya_config_save(&m->cfg, cp);
    }
    if (!e) copy_tokenizer(tok, to, log);
    if (!e && force) e = remove_other_weights(to, log);
    if (!e && log)
        fprintf(log, "exported %s (step %lld, %zu parameters) -> %s (config.json, model.safetensors)\n", s.dir,
                (long long)s.step, m->numel, to);
    free(ent);
    free(names);
    free(tok);
    ckpt_src_close(&s);
    return e;
}

kiln_error *kiln_ckpt_import_hf(const char *hf_dir, const char *to, const char *config, int world, int force,
                                FILE *log) {
    if (world < 1 || world > KILN_CKPT_MAX_WORLD)
        return kiln_errorf(KILN_EINVAL, "--world-size must be in 1..%d, got %d", KILN_CKPT_MAX_WORLD, world);
    const char *const writes[] = {"config.json", NULL};
    KILN_TRY(ckpt_out_check_target(to, writes, 1, force, "import-hf"));
    kiln_train_config cfg;
    kiln_train_config_default(&cfg);
    if (config) KILN_TRY(kiln_train_config_load(config, &cfg));
    kiln_zaya *m = NULL;
    KILN_TRY(kiln_zaya_load_dir(hf_dir, &m));
    cfg.model = m->cfg; /* the model is the HF directory's, whatever the config's model section said */
    if (strlen(to) >= sizeof cfg.out_dir) {
        kiln_zaya_free(m);
        return kiln_errorf(KILN_EINVAL, "%s: path too long", to);
    }
    snprintf(cfg.out_dir, sizeof cfg.out_dir, "%s", to);
    zero1_partition part = {0};
    ckpt_out o = {0};
    cJSON *man = NULL;
    const int64_t L = m->cfg.num_layers, E1 = m->cfg.num_experts + 1;
    kiln_opt_param *op = calloc((size_t)m->nparams + 1, sizeof *op);
    int *owner = calloc((size_t)m->nparams + 1, sizeof *owner);
    kiln_loader_state *pos = calloc((size_t)world, sizeof *pos);
    double *zd = calloc((size_t)(L * E1) + 1, sizeof *zd);
    float *zero = NULL;
    kiln_error *e = op && owner && pos && zd ? kiln_train_config_validate(&cfg) : kiln_errorf(KILN_ENOMEM, "import");
    if (!e) e = zero1_partition_make(m, world, &part);
    if (!e) {
        kiln_optim_classify(m, &cfg.optim, op);
        int64_t most = 1;
        for (int t = 0; t < m->nparams; t++) most = kiln_optim_state_numel(&op[t]) > most ? kiln_optim_state_numel(&op[t]) : most;
        zero = calloc((size_t)most, sizeof *zero); /* fresh optimizer state: zeros, like the trainer's */
        if (!zero) e = kiln_errorf(KILN_ENOMEM, "import");
    }
    if (!e) e = ckpt_out_begin(&o, to, 0, world);
    if (!e) snprintf(cfg.out_dir, sizeof cfg.out_dir, "%s", o.abs); /* as DIR/config.json says (ckpt_out_config) */
    for (int r = 0; !e && r < world; r++) {
        const int first = part.first[r], last = part.first[r + 1];
        const size_t cap = 2 * (size_t)(last - first) + 3;
        kiln_st_entry *ent = calloc(cap, sizeof *ent);
        char(*names)[112] = calloc(cap, sizeof *names);
        int64_t(*shapes)[2] = calloc(cap, sizeof *shapes);
        size_t n = 0;
        if (!ent || !names || !shapes) e = kiln_errorf(KILN_ENOMEM, "import");
        for (int t = first; !e && t < last; t++) {
            const kiln_param_info *p = &m->params[t];
            owner[t] = r;
            snprintf(names[n], sizeof names[n], "param.%s", p->name);
            ent[n] = (kiln_st_entry){names[n], KILN_DT_F32, p->ndim, p->shape, m->w + p->offset};
            n++;
            snprintf(names[n], sizeof names[n], "opt.%s", p->name);
            shapes[n][0] = kiln_optim_state_numel(&op[t]);
            ent[n] = (kiln_st_entry){names[n], KILN_DT_F32, 1, shapes[n], zero};
            n++;
        }
        if (!e && r == 0) {
            shapes[n][0] = L;
            shapes[n][1] = E1;
            ent[n] = (kiln_st_entry){"balancing_biases", KILN_DT_F32, 2, shapes[n], m->balancing};
            ent[n + 1] = (kiln_st_entry){"balance.integral", KILN_DT_F64, 2, shapes[n], zd};
            ent[n + 2] = (kiln_st_entry){"balance.prev_err", KILN_DT_F64, 2, shapes[n], zd};
            n += 3;
        }
        if (!e) e = ckpt_out_shard(&o, r, ent, n);
        free(ent);
        free(names);
        free(shapes);
    }
    for (int r = 0; r < world && pos; r++) pos[r] = (kiln_loader_state){cfg.data_seed, 0, 0, 0};
    if (!e) {
        man = ckpt_manifest_new(&cfg, m, op, owner, world, 0, 0, 0, pos);
        cJSON *prov = man ? cJSON_AddObjectToObject(man, "imported_from") : NULL;
        if (prov) cJSON_AddStringToObject(prov, "hf_dir", hf_dir);
        e = man ? ckpt_out_commit(&o, man) : kiln_errorf(KILN_ENOMEM, "manifest");
    }
    if (!e) e = ckpt_out_config(&o, &cfg);
    if (!e) e = kiln_error_wrap(kiln_ckpt_verify(o.fin), "verifying the imported checkpoint");
    if (!e && log)
        fprintf(log, "imported %s (%zu parameters) -> %s for %d rank%s; train with: %skiln train --config %s/config.json "
                "--resume\n", hf_dir, m->numel, o.fin, world, world > 1 ? "s" : "", world > 1 ? "mpirun -np N " : "", o.abs);
    ckpt_out_end(&o);
    cJSON_Delete(man);
    zero1_partition_free(&part);
    free(op);
    free(owner);
    free(pos);
    free(zd);
    free(zero);
    kiln_zaya_free(m);
    return e;
}
