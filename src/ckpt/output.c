/* Writing checkpoints outside the trainer (see output.h). */
#define _XOPEN_SOURCE 700
#include "output.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/ckpt.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "crc32c.h"

/* What a HF model directory holds: config.json, model.safetensors or its shards (model-00001-of-00002.safetensors)
 * and their index. */
static int is_model_file(const char *name) {
    const size_t n = strlen(name), ext = strlen(".safetensors");
    if (!strcmp(name, "config.json") || !strcmp(name, "model.safetensors.index.json")) return 1;
    return !strncmp(name, "model", 5) && n >= 5 + ext && !strcmp(name + n - ext, ".safetensors");
}

/* The first entry of dir that match() accepts, as "dir/name" in hit (left empty when none). */
static kiln_error *first_entry(const char *dir, int (*match)(const char *), char *hit, size_t cap) {
    hit[0] = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? NULL : kiln_errorf(KILN_EIO, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *de;
    kiln_error *e = NULL;
    while ((de = readdir(d)))
        if (match(de->d_name)) {
            if (snprintf(hit, cap, "%s/%s", dir, de->d_name) >= (int)cap)
                e = kiln_errorf(KILN_EINVAL, "%s: path too long", dir);
            break;
        }
    closedir(d);
    return e;
}

/* A checkpoint of any step, step_N; not step_N.tmp, which no resume reads (a save or a conversion that was killed:
 * the next one of that step replaces it). */
static int is_step_dir(const char *name) {
    const size_t n = strlen(name);
    return !strncmp(name, "step_", 5) && !(n >= 4 && !strcmp(name + n - 4, ".tmp"));
}

kiln_error *ckpt_out_check_target(const char *to, const char *const *writes, int ckpt, int force, const char *cmd) {
    struct stat sb;
    if (stat(to, &sb)) {
        if (errno == ENOENT) return NULL; /* a new directory: nothing to lose */
        return kiln_errorf(KILN_EIO, "--to %s: %s", to, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) return kiln_errorf(KILN_EINVAL, "--to %s exists and is not a directory (nothing was written)", to);
    if (force) return NULL;
    char hit[1400] = "", why[320] = "";
    for (int i = 0; writes && writes[i] && !hit[0]; i++) {
        snprintf(hit, sizeof hit, "%s/%s", to, writes[i]);
        if (access(hit, F_OK)) hit[0] = 0;
        else snprintf(why, sizeof why, "kiln ckpt %s would overwrite it", cmd);
    }
    /* a model: another command's output, or the --from of an import given as --to; its files may be named otherwise
     * than the ones this command writes (a sharded export), and mixing would leave a directory no loader reads right */
    if (!hit[0]) {
        KILN_TRY(first_entry(to, is_model_file, hit, sizeof hit));
        if (hit[0]) snprintf(why, sizeof why, "--to holds a model");
    }
    if (!hit[0] && ckpt) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/ckpt", to);
        KILN_TRY(first_entry(dir, is_step_dir, hit, sizeof hit));
        if (hit[0])
            snprintf(why, sizeof why, "--to holds checkpoints: kiln train --resume there would continue from the newest "
                     "of them, and run.keep_last may delete them");
    }
    if (!hit[0]) return NULL;
    return kiln_errorf(KILN_EINVAL, "%s already exists (%s): write into a new or empty --to directory, or pass --force "
                       "to write there anyway (nothing was written)", hit, why);
}

kiln_error *ckpt_out_begin(ckpt_out *o, const char *to, int64_t step, int world) {
    memset(o, 0, sizeof *o);
    o->world = world;
    snprintf(o->root, sizeof o->root, "%s/ckpt", to);
    snprintf(o->fin, sizeof o->fin, "%s/step_%08lld", o->root, (long long)step);
    const int made = mkdir(to, 0755) == 0;
    if (!made && errno != EEXIST) return kiln_errorf(KILN_EIO, "%s: cannot create: %s", to, strerror(errno));
    char abs[PATH_MAX];
    const char *why = NULL;
    if (!realpath(to, abs)) why = strerror(errno);
    else if (strlen(abs) >= sizeof o->abs) why = "its absolute path is longer than run.out_dir holds (1023 bytes)";
    if (why) {
        kiln_error *e = kiln_errorf(KILN_EINVAL, "--to %s: %s", to, why);
        if (made) rmdir(to); /* leave no trace of a refused command */
        return e;
    }
    memcpy(o->abs, abs, strlen(abs) + 1); /* fits: checked above (snprintf here trips -Wformat-truncation at -O1) */
    KILN_TRY(kiln_mkdir(o->root));
    if (access(o->fin, F_OK) == 0)
        return kiln_errorf(KILN_EINVAL, "%s already exists: choose another --to (nothing was overwritten)", o->fin);
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp", o->fin);
    kiln_rm_tree(o->tmp); /* a stale attempt */
    o->sums = calloc((size_t)world, sizeof *o->sums);
    o->sizes = calloc((size_t)world, sizeof *o->sizes);
    if (!o->sums || !o->sizes) return kiln_errorf(KILN_ENOMEM, "%s", o->tmp);
    return kiln_mkdir(o->tmp);
}

kiln_error *ckpt_out_shard(ckpt_out *o, int rank, const kiln_st_entry *ent, size_t n) {
    char path[1400];
    kiln_ckpt_shard_path(path, sizeof path, o->tmp, rank);
    KILN_TRY(kiln_st_write(path, ent, n, NULL));
    uint32_t crc = 0;
    KILN_TRY(kiln_crc32c_file(path, &crc, &o->sizes[rank]));
    o->sums[rank] = crc;
    return NULL;
}

kiln_error *ckpt_out_commit(ckpt_out *o, cJSON *man) {
    cJSON_DeleteItemFromObjectCaseSensitive(man, "files");
    cJSON *fs = cJSON_AddArrayToObject(man, "files");
    for (int r = 0; r < o->world; r++) {
        cJSON *f = cJSON_CreateObject();
        char name[64], hex[32];
        cJSON_AddStringToObject(f, "name", kiln_ckpt_shard_path(name, sizeof name, NULL, r));
        cJSON_AddNumberToObject(f, "bytes", (double)o->sizes[r]);
        snprintf(hex, sizeof hex, "%08x", (unsigned)o->sums[r]);
        cJSON_AddStringToObject(f, "crc32c", hex);
        cJSON_AddItemToArray(fs, f);
    }
    char path[1400];
    char *text = kiln_json_print(man, 1);
    if (!text) return kiln_errorf(KILN_ENOMEM, "%s: manifest", o->tmp);
    snprintf(path, sizeof path, "%s/manifest.json", o->tmp);
    kiln_error *e = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    snprintf(path, sizeof path, "%s/COMMITTED", o->tmp);
    if (!e) e = kiln_write_file_atomic(path, "ok\n", 3);
    if (!e) e = kiln_fsync_path(o->tmp);
    if (!e && rename(o->tmp, o->fin)) e = kiln_errorf(KILN_EIO, "%s: rename to %s: %s", o->tmp, o->fin, strerror(errno));
    if (!e) e = kiln_fsync_path(o->root);
    if (!e) o->tmp[0] = 0;
    return e;
}

void ckpt_out_end(ckpt_out *o) {
    if (o->tmp[0]) kiln_rm_tree(o->tmp);
    free(o->sums);
    free(o->sizes);
    o->sums = o->sizes = NULL;
}

cJSON *ckpt_manifest_new(const kiln_train_config *cfg, const kiln_zaya *table, const kiln_opt_param *op,
                         const int *owner, int world, int64_t step, double tokens_seen, int have_prev,
                         const kiln_loader_state *loaders) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "format", 1);
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "world_size", world);
    cJSON_AddNumberToObject(o, "tokens_seen", tokens_seen);
    cJSON_AddBoolToObject(o, "balance_have_prev", have_prev);
    char *c = kiln_train_config_to_json(cfg);
    cJSON_AddItemToObject(o, "config", c ? cJSON_Parse(c) : cJSON_CreateNull());
    free(c);
    cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
    for (int t = 0; t < table->nparams; t++) {
        const kiln_param_info *p = &table->params[t];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", p->name);
        cJSON *sh = cJSON_AddArrayToObject(x, "shape");
        for (int d = 0; d < p->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)p->shape[d]));
        cJSON_AddNumberToObject(x, "offset", (double)p->offset);
        cJSON_AddNumberToObject(x, "owner", owner[t]);
        cJSON_AddStringToObject(x, "optimizer", op[t].kind == KILN_OPT_MUON ? "muon" : "adamw");
        cJSON_AddNumberToObject(x, "state_numel", (double)kiln_optim_state_numel(&op[t]));
        cJSON_AddItemToArray(ts, x);
    }
    cJSON *ld = cJSON_AddArrayToObject(o, "loaders");
    for (int r = 0; r < world; r++) {
        cJSON *x = cJSON_CreateObject();
        char hex[32];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)loaders[r].seed);
        cJSON_AddStringToObject(x, "seed", hex);
        cJSON_AddNumberToObject(x, "epoch", (double)loaders[r].epoch);
        cJSON_AddNumberToObject(x, "cursor", (double)loaders[r].cursor);
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)loaders[r].fingerprint);
        cJSON_AddStringToObject(x, "fingerprint", hex);
        cJSON_AddItemToArray(ld, x);
    }
    return o;
}

kiln_error *ckpt_out_config(const ckpt_out *o, const kiln_train_config *cfg) {
    kiln_train_config c = *cfg;
    snprintf(c.out_dir, sizeof c.out_dir, "%s", o->abs); /* fits: ckpt_out_begin checked */
    char *text = kiln_train_config_to_json(&c);
    if (!text) return kiln_errorf(KILN_ENOMEM, "%s/config.json", o->abs);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", o->abs);
    kiln_error *e = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    return e;
}
