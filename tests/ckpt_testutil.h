/* Helpers for the checkpoint tests: learnable synthetic shards, a tiny training config, the
 * losses of a run, and running kiln under mpirun. */
#ifndef KILN_CKPT_TESTUTIL_H
#define KILN_CKPT_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/data.h"
#include "kiln/fsutil.h"
#include "kiln/hash.h"
#include "kiln/rng.h"
#include "kiln/zaya.h"
#include "test.h"

#define CK_VOCAB 64

/* Runs of an arithmetic progression mod V whose step changes every 40-token document. */
static inline void ck_split(const char *dir, const char *name, uint64_t ntok, uint64_t seed, kiln_data_split_info *si) {
    uint16_t *tok = malloc(ntok * sizeof *tok);
    uint64_t docs[4096], nd = 0, stepv = 1;
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (uint64_t i = 0; i < ntok; i++) {
        if (i % 40 == 0) {
            if (nd < 4096) docs[nd++] = i;
            stepv = 1 + kiln_rng_u64(&r) % 5;
            tok[i] = (uint16_t)(kiln_rng_u64(&r) % CK_VOCAB);
        } else {
            tok[i] = (uint16_t)((tok[i - 1] + stepv) % CK_VOCAB);
        }
    }
    char file[64], path[1200];
    snprintf(file, sizeof file, "%s_000000.bin", name);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    CHECK_OK(kiln_shard_write(path, tok, ntok, docs, nd, CK_VOCAB));
    si->name = strdup(name);
    si->tokens = ntok;
    si->documents = nd;
    si->nshards = 1;
    si->shards = calloc(1, sizeof *si->shards);
    si->shards[0].file = strdup(file);
    si->shards[0].tokens = ntok;
    si->shards[0].documents = nd;
    si->shards[0].checksum = kiln_fnv1a64(KILN_FNV1A64_INIT, tok, ntok * sizeof *tok);
    free(tok);
}

/* Synthetic token shards under a fresh temporary directory: a train split of 40,000 tokens and, with val, a val
 * split of 4,000. The returned path lives until the next call. */
static inline const char *ck_data_splits(int val) {
    static char keep[1024];
    snprintf(keep, sizeof keep, "%s", test_tmpdir());
    const char *dir = keep;
    const int ns = val ? 2 : 1;
    kiln_data_index ix = {0};
    ix.version = KILN_DATA_INDEX_VERSION;
    ix.tokenizer_path = "none";
    ix.vocab_size = CK_VOCAB;
    ix.eos_id = -1;
    ix.token_bytes = 2;
    ix.nsplits = ns;
    kiln_data_split_info sp[2];
    memset(sp, 0, sizeof sp);
    ck_split(dir, "train", 40000, 1, &sp[0]);
    if (val) ck_split(dir, "val", 4000, 2, &sp[1]);
    ix.splits = sp;
    CHECK_OK(kiln_data_index_write(dir, &ix));
    for (int i = 0; i < ns; i++) {
        free(sp[i].name);
        free(sp[i].shards[0].file);
        free(sp[i].shards);
    }
    return dir;
}
static inline const char *ck_data(void) { return ck_data_splits(0); }

/* A config file for a tiny model; hidden: the model width; extra: more fields for "run". */
static inline const char *ck_config(const char *data, const char *out, int64_t steps, int64_t accum, int hidden,
                             const char *extra) {
    /* a file of its own per call (16 in turn): a test that writes two configs before running them ran both with
     * the second's contents when they shared one path */
    static char keep[16][1200];
    static int k;
    char name[32];
    snprintf(name, sizeof name, "cfg_%02d.json", k & 15);
    char *p = kiln_path_join(test_tmpdir(), name);
    char *slot = keep[k++ & 15];
    snprintf(slot, sizeof keep[0], "%s", p);
    free(p);
    char text[4096];
    snprintf(text, sizeof text,
             "{\"model\": {\"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
             " \"num_key_value_heads\": 2, \"head_dim\": 8, \"num_experts\": 4, \"moe_intermediate_size\": 32,"
             " \"router_hidden_size\": 16, \"eos_token_id\": null},"
             " \"data\": {\"dir\": \"%s\", \"seq_len\": 32, \"micro_batch\": 4, \"grad_accum\": %lld},"
             " \"optim\": {\"lr\": 0.01, \"min_lr\": 0.001, \"warmup\": 5},"
             " \"run\": {\"steps\": %lld, \"out_dir\": \"%s\", \"log_every\": 1, \"eval_every\": 0, \"threads\": 1%s%s}}",
             CK_VOCAB, hidden, data, (long long)accum, (long long)steps, out, extra ? ", " : "", extra ? extra : "");
    CHECK_OK(kiln_write_file_atomic(slot, text, strlen(text)));
    return slot;
}

/* Losses by step (1-based) from metrics.jsonl; returns the largest step seen. */
static inline int ck_losses(const char *out, double *loss, int cap) {
    char path[1400], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    kiln_error *e = kiln_read_file(path, &text, &len);
    if (e) {
        kiln_error_free(e);
        return 0;
    }
    int n = 0;
    for (char *p = text; (p = strstr(p, "\"step\":"));) {
        int step = atoi(p + 7);
        char *l = strstr(p, "\"loss\":");
        if (l && step >= 1 && step <= cap) loss[step - 1] = atof(l + 7), n = step > n ? step : n;
        p += 7;
    }
    free(text);
    return n;
}

static inline int ck_kiln(const char *args) {
    char out[16384];
    int rc = test_run_kiln(args, out, sizeof out);
    if (rc) printf("    kiln %s -> %d\n%s\n", args, rc, out);
    return rc;
}

static inline int ck_have_mpirun(void) { return system("command -v mpirun >/dev/null 2>&1") == 0; }

/* kiln ARGS on `np` MPI ranks; 0 on success (output printed otherwise). */
static inline int ck_mpi(int np, const char *args) {
    char cmd[8192], out[16384];
    /* OpenMPI's dlopened components leak by design: no leak check for the MPI ranks */
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np %d '%s' "
             "%s 2>&1", np, KILN_BINARY, args);
    int rc = test_run_shell(cmd, out, sizeof out);
    if (rc) printf("    mpirun -np %d kiln %s -> %d\n%s\n", np, args, rc, out);
    return rc;
}

/* RUN_DIR/incidents.jsonl of a `kiln run` (malloc'd; "" where there is none yet). */
static inline char *ck_incidents(const char *run_dir) {
    char *text = NULL;
    size_t len = 0;
    kiln_error *e = kiln_read_file(test_join(run_dir, "incidents.jsonl"), &text, &len);
    kiln_error_free(e);
    return text ? text : strdup("");
}

/* Flips one byte of the data of a checkpoint's rank-0 shard: its checksum no longer matches. */
static inline void ck_flip_shard(const char *out, int step) {
    char shard[1300];
    snprintf(shard, sizeof shard, "%s/ckpt/step_%08d/rank_00000.safetensors", out, step);
    FILE *f = fopen(shard, "r+b");
    CHECK_MSG(f != NULL, "%s: cannot open", shard);
    if (!f) return;
    fseek(f, -17, SEEK_END);
    int c = fgetc(f);
    fseek(f, -17, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* Whole-file comparison. */
static inline int ck_same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    kiln_error *ea = kiln_read_file(a, &x, &nx), *eb = kiln_read_file(b, &y, &ny);
    int same = !ea && !eb && nx == ny && !memcmp(x, y, nx);
    kiln_error_free(ea);
    kiln_error_free(eb);
    free(x);
    free(y);
    return same;
}

/* Parameters and balancing biases of a run's saved model (out/model), for bit-identity checks; NULL (and a
 * test failure) when it does not load. */
static inline float *ck_model_weights(const char *out, size_t *n) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/model", out);
    kiln_zaya *m = NULL;
    kiln_error *e = kiln_zaya_load_dir(dir, &m);
    if (e) {
        test_fail(__FILE__, __LINE__, "%s", kiln_error_msg(e));
        kiln_error_free(e);
        return NULL;
    }
    const int64_t nb = m->cfg.num_layers * (m->cfg.num_experts + 1);
    float *w = malloc((m->numel + (size_t)nb) * sizeof(float));
    memcpy(w, m->w, m->numel * sizeof(float));
    memcpy(w + m->numel, m->balancing, (size_t)nb * sizeof(float));
    *n = m->numel + (size_t)nb;
    kiln_zaya_free(m);
    return w;
}

/* Two runs' checkpoint shards of one step (rank 0's) are the same file, byte for byte. */
static inline int ck_same_shard(const char *a, const char *b, int step) {
    char pa[1300], pb[1300];
    snprintf(pa, sizeof pa, "%s/ckpt/step_%08d/rank_00000.safetensors", a, step);
    snprintf(pb, sizeof pb, "%s/ckpt/step_%08d/rank_00000.safetensors", b, step);
    return ck_same_file(pa, pb);
}

/* Two runs' final saved models (out/model/model.safetensors) are the same file. */
static inline int ck_same_model_file(const char *a, const char *b) {
    char pa[1300], pb[1300];
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model/model.safetensors", b);
    return ck_same_file(pa, pb);
}

/* Two runs' final models (out/model) hold the same weights, bit for bit. */
static inline int ck_same_model(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    float *wa = ck_model_weights(a, &na), *wb = ck_model_weights(b, &nb);
    const int same = wa && wb && na == nb && !memcmp(wa, wb, na * sizeof(float));
    free(wa);
    free(wb);
    return same;
}

/* `kiln train --config cfg` in the background, stopped with SIGINT (Ctrl-C) once out/metrics.jsonl holds
 * min_bytes (some steps done; 30 s at most); returns its exit status (130 after a clean Ctrl-C). */
static inline int ck_train_until_sigint(const char *cfg, const char *out, long min_bytes) {
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl(KILN_BINARY, KILN_BINARY, "train", "--config", cfg, "--quiet", (char *)NULL);
        _exit(127);
    }
    char metrics[1200];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    struct stat sb;
    for (int i = 0; i < 600 && (stat(metrics, &sb) || sb.st_size < min_bytes); i++) usleep(50000);
    kill(pid, SIGINT);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
