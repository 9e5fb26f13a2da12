/* kiln bench gemm: achieved FLOP/s of C = A·B through OpenBLAS cblas_sgemm (fp32), the GEMM path
 * of the CPU trainer, over lists/ranges of M, N, K; a sweep of one dimension (tile and wave
 * quantization); or the exact GEMM shapes of one training micro-step of a model config. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <omp.h>

#include "bench_util.h"
#include "gemm_shapes.h"
#include "kiln/bench.h"
#include "kiln/cuda.h"
#include "kiln/json.h"
#include "kiln/train.h"

#define MAX_DIM ((int64_t)1 << 20)
#define MAX_VALS 4096

double kiln_gemm_flops(int64_t m, int64_t n, int64_t k) { return 2.0 * (double)m * (double)n * (double)k; }

static kiln_error *push(int64_t **v, size_t *n, size_t *cap, int64_t x, const char *what) {
    if (*n >= MAX_VALS) return kiln_errorf(KILN_EINVAL, "%s: more than %d values", what, MAX_VALS);
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 16;
        int64_t *nv = realloc(*v, nc * sizeof *nv);
        if (!nv) return kiln_errorf(KILN_ENOMEM, "%s", what);
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = x;
    return NULL;
}

/* A decimal integer spanning exactly [s, e). */
static int parse_int(const char *s, const char *e, int64_t *out) {
    if (s == e || e - s > 18) return -1;
    int64_t v = 0;
    for (const char *p = s; p < e; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    *out = v;
    return 0;
}

static kiln_error *parse_item(const char *s, const char *e, const char *what, int64_t **v, size_t *n, size_t *cap) {
    const char *c1 = memchr(s, ':', (size_t)(e - s));
    int len = (int)(e - s);
    if (!c1) {
        int64_t x;
        if (parse_int(s, e, &x) || x < 1 || x > MAX_DIM)
            return kiln_errorf(KILN_EINVAL, "%s: '%.*s' is not an integer in 1..%lld", what, len, s, (long long)MAX_DIM);
        return push(v, n, cap, x, what);
    }
    const char *c2 = memchr(c1 + 1, ':', (size_t)(e - c1 - 1));
    if (!c2)
        return kiln_errorf(KILN_EINVAL, "%s: range '%.*s' must be START:END:xF or START:END:+S", what, len, s);
    int64_t a, b, step;
    if (parse_int(s, c1, &a) || parse_int(c1 + 1, c2, &b) || a < 1 || b > MAX_DIM || b < 1 || a > MAX_DIM)
        return kiln_errorf(KILN_EINVAL, "%s: range '%.*s': START and END must be integers in 1..%lld", what, len, s,
                           (long long)MAX_DIM);
    if (a > b) return kiln_errorf(KILN_EINVAL, "%s: range '%.*s': START exceeds END", what, len, s);
    const char *st = c2 + 1;
    if (st >= e || (*st != 'x' && *st != '+') || parse_int(st + 1, e, &step))
        return kiln_errorf(KILN_EINVAL, "%s: range '%.*s': step must be xF (multiply) or +S (add), e.g. x2 or +8", what,
                           len, s);
    if (step > MAX_DIM)
        return kiln_errorf(KILN_EINVAL, "%s: range '%.*s': step exceeds %lld", what, len, s, (long long)MAX_DIM);
    if (*st == 'x') {
        if (step < 2) return kiln_errorf(KILN_EINVAL, "%s: range '%.*s': factor must be >= 2", what, len, s);
        for (int64_t x = a; x <= b; x *= step) KILN_TRY(push(v, n, cap, x, what));
    } else {
        if (step < 1) return kiln_errorf(KILN_EINVAL, "%s: range '%.*s': step must be >= 1", what, len, s);
        for (int64_t x = a; x <= b; x += step) KILN_TRY(push(v, n, cap, x, what));
    }
    return NULL;
}

kiln_error *kiln_gemm_parse_dims(const char *spec, const char *what, int64_t **vals, size_t *n) {
    *vals = NULL;
    *n = 0;
    if (!spec || !*spec) return kiln_errorf(KILN_EINVAL, "%s: empty list", what);
    size_t cap = 0;
    const char *s = spec;
    for (;;) {
        const char *e = strchr(s, ',');
        if (!e) e = s + strlen(s);
        kiln_error *err = s == e ? kiln_errorf(KILN_EINVAL, "%s: empty item in '%s'", what, spec)
                                 : parse_item(s, e, what, vals, n, &cap);
        if (err) {
            free(*vals);
            *vals = NULL;
            *n = 0;
            return err;
        }
        if (!*e) break;
        s = e + 1;
    }
    return NULL;
}

/* ---- model expansion ---- */

typedef struct {
    kiln_gemm_shape *v;
    size_t n, cap;
} shape_list;

static kiln_error *add_shape(shape_list *L, const char *label, int64_t m, int64_t n, int64_t k, int64_t count,
                             const char *layout) {
    for (size_t i = 0; i < L->n; i++) {
        kiln_gemm_shape *s = &L->v[i];
        if (s->m == m && s->n == n && s->k == k && !strcmp(s->layout, layout)) {
            s->count += count;
            size_t used = strlen(s->label);
            if (used + 3 + strlen(label) < sizeof s->label)
                snprintf(s->label + used, sizeof s->label - used, " + %s", label);
            else if (used + 4 < sizeof s->label && strcmp(s->label + used - 3, "..."))
                snprintf(s->label + used, sizeof s->label - used, " ...");
            return NULL;
        }
    }
    if (L->n == L->cap) {
        size_t nc = L->cap ? 2 * L->cap : 32;
        kiln_gemm_shape *nv = realloc(L->v, nc * sizeof *nv);
        if (!nv) return kiln_errorf(KILN_ENOMEM, "gemm shapes");
        L->v = nv;
        L->cap = nc;
    }
    kiln_gemm_shape *s = &L->v[L->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->label, sizeof s->label, "%s", label);
    s->m = m;
    s->n = n;
    s->k = k;
    s->count = count;
    snprintf(s->layout, sizeof s->layout, "%s", layout);
    return NULL;
}

/* A linear layer y[T,out] = x[T,in] W[out,in]^T: forward, dX and dW, `count` times. */
static kiln_error *add_linear(shape_list *L, const char *name, int64_t tokens, int64_t in, int64_t out,
                              int64_t count) {
    char lab[200];
    snprintf(lab, sizeof lab, "%s fwd", name);
    KILN_TRY(add_shape(L, lab, tokens, out, in, count, "NT"));
    snprintf(lab, sizeof lab, "%s dX", name);
    KILN_TRY(add_shape(L, lab, tokens, in, out, count, "NN"));
    snprintf(lab, sizeof lab, "%s dW", name);
    return add_shape(L, lab, out, in, tokens, count, "TN");
}

kiln_error *kiln_gemm_model_shapes(const kiln_zaya_config *c, int64_t tokens, kiln_gemm_shape **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (tokens < 1) return kiln_errorf(KILN_EINVAL, "gemm: tokens per micro-batch must be >= 1");
    const int64_t H = c->hidden_size, Q = c->num_heads * c->head_dim, K = c->num_kv_heads * c->head_dim;
    const int64_t R = c->router_hidden, E = c->num_experts, Im = c->moe_intermediate, Ly = c->num_layers;
    if (H < 1 || Q < 1 || K < 2 || R < 1 || E < 1 || Im < 1 || Ly < 1 || c->top_k < 1 || c->vocab_size < 1)
        return kiln_errorf(KILN_EINVAL, "gemm: model config has a non-positive dimension");
    int64_t ne = (int64_t)llround((double)tokens * (double)c->top_k / (double)E);
    if (ne < 1) ne = 1;
    shape_list L = {0};
    kiln_error *e = NULL;
    if (!e) e = add_linear(&L, "L*.q_proj", tokens, H, Q, Ly);
    if (!e) e = add_linear(&L, "L*.k_proj", tokens, H, K, Ly);
    if (!e) e = add_linear(&L, "L*.v_current", tokens, H, K / 2, Ly);
    if (!e) e = add_linear(&L, "L*.v_delayed", tokens, H, K / 2, Ly);
    if (!e) e = add_linear(&L, "L*.o_proj", tokens, Q, H, Ly);
    if (!e) e = add_linear(&L, "L*.router.down", tokens, H, R, Ly);
    if (!e) e = add_linear(&L, "L*.router.fc1", tokens, R, R, Ly);
    if (!e) e = add_linear(&L, "L*.router.fc2", tokens, R, R, Ly);
    if (!e) e = add_linear(&L, "L*.router.out", tokens, R, E + 1, Ly);
    if (!e) e = add_linear(&L, "L*.E*.gate_up", ne, H, 2 * Im, Ly * E);
    if (!e) e = add_linear(&L, "L*.E*.down", ne, Im, H, Ly * E);
    if (!e) e = add_linear(&L, "lm_head", tokens, H, c->vocab_size, 1);
    if (e) {
        free(L.v);
        return e;
    }
    *out = L.v;
    *n = L.n;
    return NULL;
}

kiln_error *kiln_gemm_model_load(const char *path, kiln_gemm_model *out) {
    cJSON *root = NULL;
    KILN_TRY(kiln_json_parse_file(path, &root));
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_errorf(KILN_EFORMAT, "%s: top level must be a JSON object", path);
    }
    int hf = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) if (strcmp(it->string, "model") && kiln_zaya_config_known_key(it->string)) hf = 1;
    cJSON_Delete(root);
    if (hf) {
        out->is_train_config = 0;
        return kiln_zaya_config_load(path, &out->model);
    }
    kiln_train_config *tc = malloc(sizeof *tc);
    if (!tc) return kiln_errorf(KILN_ENOMEM, "%s", path);
    kiln_train_config_default(tc);
    kiln_error *e = kiln_train_config_load(path, tc);
    if (!e) {
        out->model = tc->model;
        out->micro_batch = tc->micro_batch;
        out->seq_len = tc->seq_len;
        out->grad_accum = tc->grad_accum;
        out->is_train_config = 1;
    }
    free(tc);
    return e;
}

/* ---- timing ---- */

/* Mean microseconds of one sgemm of shape s over `iters` runs after `warmup` runs. */
static kiln_error *time_gemm(const kiln_gemm_shape *s, int iters, int warmup, double *us) {
    size_t na = (size_t)s->m * (size_t)s->k, nb = (size_t)s->k * (size_t)s->n, nc = (size_t)s->m * (size_t)s->n;
    float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = calloc(nc, sizeof *C);
    if (!A || !B || !C) {
        free(A); free(B); free(C);
        return kiln_errorf(KILN_ENOMEM, "gemm %lldx%lldx%lld: cannot allocate %.3g GiB", (long long)s->m,
                           (long long)s->n, (long long)s->k, (double)(na + nb + nc) * 4.0 / (1 << 30));
    }
    for (size_t i = 0; i < na; i++) A[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
    const int ta = s->layout[0] == 'T', tb = s->layout[1] == 'T';
    const int lda = (int)(ta ? s->m : s->k), ldb = (int)(tb ? s->k : s->n);
    double total = 0;
    for (int i = 0; i < warmup + iters; i++) {
        double t0 = kiln_bench_now_s();
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)s->m,
                    (int)s->n, (int)s->k, 1.0f, A, lda, B, ldb, 0.0f, C, (int)s->n);
        double t = kiln_bench_now_s() - t0;
        if (i >= warmup) total += t;
    }
    int finite = isfinite(C[0]) && isfinite(C[nc - 1]);
    free(A); free(B); free(C);
    if (!finite) return kiln_errorf(KILN_EINVAL, "gemm %lldx%lldx%lld: result is not finite", (long long)s->m,
                                    (long long)s->n, (long long)s->k);
    *us = total / iters * 1e6;
    return NULL;
}

static const char usage[] =
    "usage: kiln bench gemm [options]\n\n"
    "Achieved FLOP/s of C = A·B (2·M·N·K FLOPs) through the trainer's GEMM path: OpenBLAS cblas_sgemm on\n"
    "the CPU (fp32), cuBLASLt on the GPU (--device cuda: fp32, tf32, bf16, fp16, fp8; fp32 accumulation).\n"
    "fp8 is E4M3 in, bf16 out, unit scales (torch._scaled_mm's call), timed as y = x·Wᵀ (layout NT), the\n"
    "only layout cuBLASLt's FP8 kernels take: every shape, --model's dX/dW included, runs as NT.\n\n"
    "Shapes (lists \"512,1024\", geometric ranges \"256:4096:x2\", arithmetic ranges \"2048:2304:+8\"):\n"
    "  -m LIST, -n LIST, -k LIST   the cartesian product of the lists; -n and -k left out follow -m\n"
    "                              (square shapes). Default: -m 256:4096:x2\n"
    "  --sweep DIM=RANGE           vary one of m/n/k over RANGE, the others fixed at the first value of\n"
    "                              -m/-n/-k (default 2048): shows tile and wave quantization\n"
    "  --model CONFIG              the GEMMs of one micro-batch's forward + backward of a model: a kiln\n"
    "                              train config (kiln train --help-config) or a HF config.json. Per layer\n"
    "                              q/k/v_current/v_delayed/o, router down/fc1/fc2/out, experts at\n"
    "                              tokens*top_k/num_experts tokens each (balanced routing), the LM head;\n"
    "                              fwd [M,K]x[K,N], dX [M,N]x[N,K], dW [N,M]x[M,K]; identical shapes collapse\n"
    "  --micro-batch N, --seq-len N  tokens = micro_batch*seq_len (default: the config's, else 8 x 512)\n\n"
    "  --device D        cpu (default) or cuda (GPU 0, cuBLASLt; timed with CUDA events)\n"
    "  --dtype T         cpu: fp32; cuda: fp32, tf32, bf16 (default on cuda), fp16, fp8 (E4M3)\n"
    "  --iters N         timed runs per shape (default 10); time_us is their mean\n"
    "  --warmup N        untimed runs first (default 2)\n"
    "  --threads N       OpenBLAS/OpenMP threads (default: all cores)\n"
    "  --json FILE       write the JSON profile (section \"gemm\")\n"
    "  --csv FILE        write the numbers as CSV\n";

/* Records and CSV rows: one per shape. */
typedef struct {
    const kiln_gemm_shape *shapes;
    const double *us;
    const char *backend, *dtype, *model;
    const kiln_gemm_model *gm;
    int64_t tokens;
    double tot_us, tot_flops;
} gemm_out;

static void json_record(cJSON *r, size_t i, const void *ctx) {
    const gemm_out *o = ctx;
    const kiln_gemm_shape *s = &o->shapes[i];
    cJSON_AddStringToObject(r, "backend", o->backend);
    cJSON_AddStringToObject(r, "dtype", o->dtype);
    cJSON_AddNumberToObject(r, "m", (double)s->m);
    cJSON_AddNumberToObject(r, "n", (double)s->n);
    cJSON_AddNumberToObject(r, "k", (double)s->k);
    cJSON_AddStringToObject(r, "layout", s->layout);
    cJSON_AddStringToObject(r, "label", s->label);
    cJSON_AddNumberToObject(r, "count", (double)s->count);
    cJSON_AddNumberToObject(r, "time_us", o->us[i]);
    cJSON_AddNumberToObject(r, "tflops", kiln_gemm_flops(s->m, s->n, s->k) / (o->us[i] * 1e-6) / 1e12);
}

/* With --model: the step's totals. */
static void json_model(cJSON *p, const void *ctx) {
    const gemm_out *o = ctx;
    if (!o->model) return;
    cJSON *mo = cJSON_AddObjectToObject(p, "gemm_model");
    if (mo) {
        cJSON_AddStringToObject(mo, "config", o->model);
        cJSON_AddNumberToObject(mo, "tokens", (double)o->tokens);
        cJSON_AddNumberToObject(mo, "micro_batch", (double)o->gm->micro_batch);
        cJSON_AddNumberToObject(mo, "seq_len", (double)o->gm->seq_len);
        cJSON_AddNumberToObject(mo, "step_time_us", o->tot_us);
        cJSON_AddNumberToObject(mo, "step_tflops", o->tot_flops / (o->tot_us * 1e-6) / 1e12);
    }
}

static void csv_row(FILE *f, size_t i, const void *ctx) {
    const gemm_out *o = ctx;
    const kiln_gemm_shape *s = &o->shapes[i];
    fprintf(f, "%s,%s,%lld,%lld,%lld,%s,\"%s\",%lld,%.3f,%.6g\n", o->backend, o->dtype, (long long)s->m,
            (long long)s->n, (long long)s->k, s->layout, s->label, (long long)s->count, o->us[i],
            kiln_gemm_flops(s->m, s->n, s->k) / (o->us[i] * 1e-6) / 1e12);
}

int kiln_bench_gemm_main(int argc, char **argv) {
    const char *ms = NULL, *ns = NULL, *ks = NULL, *sweep = NULL, *model = NULL, *json_path = NULL, *csv_path = NULL;
    const char *dtype = NULL, *device = "cpu";
    long iters = 10, warmup = 2, threads = 0, mb = 0, sl = 0;
    static const char *const valued[] = {"-m", "-n", "-k", "--sweep", "--model", "--json", "--csv", "--dtype",
                                         "--device", "--iters", "--warmup", "--threads", "--micro-batch", "--seq-len", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a, *v;
        int r = kiln_bench_flag(argc, argv, &i, "gemm", usage, valued, &a, &v);
        if (r >= 0) return r;
        if (!strcmp(a, "-m")) ms = v;
        else if (!strcmp(a, "-n")) ns = v;
        else if (!strcmp(a, "-k")) ks = v;
        else if (!strcmp(a, "--sweep")) sweep = v;
        else if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--csv")) csv_path = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--device")) device = v;
        else {
            char *end;
            errno = 0;
            long x = strtol(v, &end, 10);
            int lo = !strcmp(a, "--warmup") ? 0 : 1;
            if (*end || end == v || errno || x < lo || x > 100000000) /* --warmup may be 0, the others not */
                return kiln_bench_usage_err("gemm", "%s '%s': expected %s integer in %d..100000000", a, v,
                                            lo ? "a positive" : "a non-negative", lo);
            if (!strcmp(a, "--iters")) iters = x;
            else if (!strcmp(a, "--warmup")) warmup = x;
            else if (!strcmp(a, "--threads")) threads = x;
            else if (!strcmp(a, "--micro-batch")) mb = x;
            else sl = x;
        }
    }
    const int gpu = !strcmp(device, "cuda");
    if (!gpu && strcmp(device, "cpu")) return kiln_bench_usage_err("gemm", "--device '%s': expected cpu or cuda", device);
    if (!dtype) dtype = gpu ? "bf16" : "fp32";
    kiln_cuda_gemm_type gtype = KILN_CUDA_BF16;
    if (gpu) {
        kiln_error *pe = kiln_cuda_gemm_type_parse(dtype, &gtype);
        if (pe) {
            kiln_bench_fail("gemm", NULL, pe);
            return 2;
        }
    } else if (strcmp(dtype, "fp32")) {
        if (!strcmp(dtype, "bf16") || !strcmp(dtype, "fp16") || !strcmp(dtype, "fp8"))
            return kiln_bench_usage_err("gemm", "--dtype %s: only fp32 on the CPU (OpenBLAS); use --device cuda for bf16/fp16",
                                        dtype);
        return kiln_bench_usage_err("gemm", "--dtype '%s': expected fp32", dtype);
    }
    const char *backend = gpu ? "cublaslt" : "openblas";
    if (model && sweep) return kiln_bench_usage_err("gemm", "%s", "--model and --sweep exclude each other");
    kiln_bench_set_threads(threads);

    kiln_gemm_shape *shapes = NULL;
    size_t nshapes = 0;
    kiln_error *e = NULL;
    int64_t *mv = NULL, *nv = NULL, *kv = NULL;
    size_t mn = 0, nn = 0, kn = 0;
    kiln_gemm_model gm;
    int64_t tokens = 0;
    if (model) {
        memset(&gm, 0, sizeof gm);
        gm.micro_batch = 8;
        gm.seq_len = 512;
        gm.grad_accum = 1;
        e = kiln_gemm_model_load(model, &gm);
        if (!e) {
            if (mb) gm.micro_batch = mb;
            if (sl) gm.seq_len = sl;
            tokens = gm.micro_batch * gm.seq_len;
            e = kiln_gemm_model_shapes(&gm.model, tokens, &shapes, &nshapes);
        }
        if (e) e = kiln_error_wrap(e, "--model");
    } else {
        if (ms) e = kiln_gemm_parse_dims(ms, "-m", &mv, &mn);
        if (!e && ns) e = kiln_gemm_parse_dims(ns, "-n", &nv, &nn);
        if (!e && ks) e = kiln_gemm_parse_dims(ks, "-k", &kv, &kn);
        if (!e && sweep) {
            char dim = sweep[0];
            if (!(dim == 'm' || dim == 'n' || dim == 'k' || dim == 'M' || dim == 'N' || dim == 'K') || sweep[1] != '=')
                e = kiln_errorf(KILN_EINVAL, "--sweep '%s': expected m=RANGE, n=RANGE or k=RANGE", sweep);
            int64_t *sv = NULL;
            size_t sn = 0;
            if (!e) e = kiln_gemm_parse_dims(sweep + 2, "--sweep", &sv, &sn);
            if (!e) {
                int64_t fm = mv ? mv[0] : 2048, fn = nv ? nv[0] : 2048, fk = kv ? kv[0] : 2048;
                shapes = calloc(sn, sizeof *shapes);
                if (!shapes) e = kiln_errorf(KILN_ENOMEM, "--sweep");
                for (size_t i = 0; !e && i < sn; i++) {
                    kiln_gemm_shape *s = &shapes[nshapes++];
                    char d = (char)(dim | 0x20);
                    s->m = d == 'm' ? sv[i] : fm;
                    s->n = d == 'n' ? sv[i] : fn;
                    s->k = d == 'k' ? sv[i] : fk;
                    s->count = 1;
                    snprintf(s->layout, sizeof s->layout, "NN");
                    snprintf(s->label, sizeof s->label, "sweep %c=%lld", d, (long long)sv[i]);
                }
            }
            free(sv);
        } else if (!e) {
            if (!mv) e = kiln_gemm_parse_dims("256:4096:x2", "-m", &mv, &mn);
            int tied_n = !nv, tied_k = !kv;
            size_t total = mn * (tied_n ? 1 : nn) * (tied_k ? 1 : kn);
            if (!e && total > MAX_VALS)
                e = kiln_errorf(KILN_EINVAL, "-m/-n/-k: %zu shapes (more than %d)", total, MAX_VALS);
            if (!e && !(shapes = calloc(total, sizeof *shapes))) e = kiln_errorf(KILN_ENOMEM, "shapes");
            for (size_t a = 0; !e && a < mn; a++)
                for (size_t b = 0; b < (tied_n ? 1 : nn); b++)
                    for (size_t c = 0; c < (tied_k ? 1 : kn); c++) {
                        kiln_gemm_shape *s = &shapes[nshapes++];
                        s->m = mv[a];
                        s->n = tied_n ? mv[a] : nv[b];
                        s->k = tied_k ? mv[a] : kv[c];
                        s->count = 1;
                        snprintf(s->layout, sizeof s->layout, "NN");
                        snprintf(s->label, sizeof s->label, "%lldx%lldx%lld", (long long)s->m, (long long)s->n,
                                 (long long)s->k);
                    }
        }
    }
    free(mv);
    free(nv);
    free(kv);
    if (e) {
        kiln_bench_fail("gemm", NULL, e);
        free(shapes);
        return 2;
    }
    if (gpu && gtype == KILN_CUDA_FP8) /* see the usage: FP8 GEMMs run as y = x·Wᵀ */
        for (size_t i = 0; i < nshapes; i++) snprintf(shapes[i].layout, sizeof shapes[i].layout, "NT");

    if (!gpu) { /* A, B and C in host memory: a shape past it was an OOM kill after the others' numbers (unwritten) */
        const double avail = kiln_bench_avail_bytes();
        for (size_t i = 0; avail > 0 && i < nshapes; i++) {
            const kiln_gemm_shape *s = &shapes[i];
            const double need = 4.0 * ((double)s->m * (double)s->k + (double)s->k * (double)s->n +
                                       (double)s->m * (double)s->n);
            if (need > 0.8 * avail) {
                kiln_bench_usage_err("gemm", "%lldx%lldx%lld needs %.3g GiB (A, B and C in fp32) but only %.3g GiB is "
                                     "available (80%% of MemAvailable); nothing was run", (long long)s->m,
                                     (long long)s->n, (long long)s->k, need / 1073741824.0, 0.8 * avail / 1073741824.0);
                free(shapes);
                return 2;
            }
        }
    }
    if (kiln_bench_check_outputs("gemm", json_path, csv_path)) {
        free(shapes);
        return 1;
    }
    double *us = calloc(nshapes, sizeof *us);
    if (!us) {
        free(shapes);
        return 1;
    }
    if (gpu) {
        kiln_cuda_info gi;
        kiln_error *ie = kiln_cuda_device_info(&gi);
        if (ie) {
            kiln_bench_fail("gemm", NULL, ie);
            free(shapes);
            free(us);
            return 1;
        }
        printf("kiln bench gemm: cuBLASLt %d on %s (%d SMs), %s, %ld iterations after %ld warm-up\n",
               gi.cublaslt_version, gi.name, gi.sms, dtype, iters, warmup);
    } else {
        printf("kiln bench gemm: openblas sgemm, fp32, %d threads, %ld iterations after %ld warm-up\n",
               omp_get_max_threads(), iters, warmup);
    }
    if (model)
        printf("model %s: %lld layers, %lld tokens per micro-batch (%lld x %lld), one forward + backward\n", model,
               (long long)gm.model.num_layers, (long long)tokens, (long long)gm.micro_batch, (long long)gm.seq_len);
    printf("%-44s %7s %7s %7s %3s %6s %12s %9s\n", "label", "M", "N", "K", "op", "count", "time_us", "TFLOP/s");
    double tot_us = 0, tot_flops = 0;
    int rc = 0;
    for (size_t i = 0; i < nshapes; i++) {
        const kiln_gemm_shape *s = &shapes[i];
        e = gpu ? kiln_cuda_gemm_time(gtype, s->m, s->n, s->k, s->layout, (int)iters, (int)warmup, &us[i])
                : time_gemm(s, (int)iters, (int)warmup, &us[i]);
        if (e) {
            kiln_bench_fail("gemm", NULL, e);
            rc = 1;
            nshapes = i;
            break;
        }
        double tf = kiln_gemm_flops(s->m, s->n, s->k) / (us[i] * 1e-6) / 1e12;
        char lab[45];
        snprintf(lab, sizeof lab, "%.44s", s->label);
        printf("%-44s %7lld %7lld %7lld %3s %6lld %12.1f %9.4f\n", lab, (long long)s->m, (long long)s->n,
               (long long)s->k, s->layout, (long long)s->count, us[i], tf);
        fflush(stdout);
        tot_us += us[i] * (double)s->count;
        tot_flops += kiln_gemm_flops(s->m, s->n, s->k) * (double)s->count;
    }
    if (model && !rc) {
        printf("step total (one micro-batch, fwd + bwd GEMMs): %.3f ms, %.4f TFLOP/s, %.4g TFLOP\n", tot_us / 1e3,
               tot_flops / (tot_us * 1e-6) / 1e12, tot_flops / 1e12);
        if (gm.grad_accum > 1)
            printf("per optimizer step (grad_accum %lld): %.3f ms of GEMMs\n", (long long)gm.grad_accum,
                   tot_us * (double)gm.grad_accum / 1e3);
    }
    gemm_out out = {shapes, us, backend, dtype, model, &gm, tokens, tot_us, tot_flops};
    const kiln_bench_output o = {"gemm", nshapes, &out, json_record, json_model,
                                 "backend,dtype,m,n,k,layout,label,count,time_us,tflops\n", csv_row};
    if (!rc) rc = kiln_bench_write_outputs(&o, json_path, csv_path);
    free(us);
    free(shapes);
    return rc;
}
