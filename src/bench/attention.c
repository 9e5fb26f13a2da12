/* kiln bench attention: time and achieved GFLOP/s of the trainer's attention kernel, forward and
 * forward + backward, over head dim, heads, KV heads and sequence length (causal GQA, optional
 * sliding window): the CPU reference kiln_attention_forward/backward (src/nn/attention.c), or with
 * --device cuda the CUDA kernels (src/cuda/attention*.cu, timed by src/bench/attention_gpu.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "attention_gpu.h"
#include "bench_util.h"
#include "gemm_shapes.h"
#include "kernel_formulas.h"
#include "kiln/bench.h"
#include "kiln/cuda.h"
#include "kiln/nn.h"

#define MAX_CASES 4096

double kiln_attn_pairs(int64_t T, int64_t window) {
    double t = (double)T;
    if (window <= 0 || window >= T) return t * (t + 1) / 2;
    double w = (double)window;
    return w * (w + 1) / 2 + (t - w) * w;
}

double kiln_attn_flops_fwd(int64_t B, int64_t H, int64_t D, int64_t T, int64_t window) {
    return 4.0 * (double)B * (double)H * (double)D * kiln_attn_pairs(T, window);
}

double kiln_attn_flops_fwd_bwd(int64_t B, int64_t H, int64_t D, int64_t T, int64_t window) {
    return KILN_ATTN_FWD_BWD_FACTOR * kiln_attn_flops_fwd(B, H, D, T, window);
}

double kiln_attn_bytes(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    double b = (double)B, t = (double)T;
    return 4.0 * (4.0 * b * t * (double)H * (double)D + 4.0 * b * t * (double)KV * (double)D + b * (double)H * t * t);
}

typedef struct {
    int64_t B, T, H, KV, D, window;
    const char *impl; /* --device cuda: the implementation asked for (NULL: the trainer's default) */
    char ran[32];     /* --device cuda: what ran ("cudnn", "cudnn-nondet" or "own"; "a+b" when the passes differ) */
    double us[2];     /* mean microseconds: fwd, fwd_bwd */
} attn_case;

static double case_flops(const attn_case *c, int pass) {
    return pass ? kiln_attn_flops_fwd_bwd(c->B, c->H, c->D, c->T, c->window)
                : kiln_attn_flops_fwd(c->B, c->H, c->D, c->T, c->window);
}

/* Times forward (with the probabilities saved, as in training) and forward + backward. */
static kiln_error *run_case(attn_case *c, int iters, int warmup) {
    const int64_t nq = c->B * c->T * c->H * c->D, nk = c->B * c->T * c->KV * c->D, np = c->B * c->H * c->T * c->T;
    float *q = malloc((size_t)nq * sizeof *q), *out = malloc((size_t)nq * sizeof *out);
    float *dq = malloc((size_t)nq * sizeof *dq), *dout = malloc((size_t)nq * sizeof *dout);
    float *k = malloc((size_t)nk * sizeof *k), *v = malloc((size_t)nk * sizeof *v);
    float *dk = malloc((size_t)nk * sizeof *dk), *dv = malloc((size_t)nk * sizeof *dv);
    float *probs = malloc((size_t)np * sizeof *probs);
    kiln_error *e = NULL;
    if (!q || !out || !dq || !dout || !k || !v || !dk || !dv || !probs) {
        e = kiln_errorf(KILN_ENOMEM, "attention B=%lld T=%lld H=%lld KV=%lld D=%lld: cannot allocate %.3g GiB",
                        (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->KV, (long long)c->D,
                        kiln_attn_bytes(c->B, c->T, c->H, c->KV, c->D) / (1 << 30));
        goto done;
    }
    kiln_bench_fill(q, nq, 1, 1.0f);
    kiln_bench_fill(k, nk, 2, 1.0f);
    kiln_bench_fill(v, nk, 3, 1.0f);
    kiln_bench_fill(dout, nq, 4, 1.0f);
    kiln_attn_shape s = {c->B, c->T, c->T, c->T, c->H, c->KV, c->D, c->window, 1.0f / sqrtf((float)c->D)};
    double tot = 0;
    for (int i = 0; i < warmup + iters; i++) {
        double t0 = kiln_bench_now_s();
        kiln_attention_forward(out, probs, q, k, v, &s);
        double t = kiln_bench_now_s() - t0;
        if (i >= warmup) tot += t;
    }
    c->us[0] = tot / iters * 1e6;
    tot = 0;
    for (int i = 0; i < warmup + iters; i++) {
        memset(dq, 0, (size_t)nq * sizeof *dq); /* the trainer's gradients start at zero */
        memset(dk, 0, (size_t)nk * sizeof *dk);
        memset(dv, 0, (size_t)nk * sizeof *dv);
        double t0 = kiln_bench_now_s();
        kiln_attention_forward(out, probs, q, k, v, &s);
        kiln_attention_backward(dq, dk, dv, dout, probs, q, k, v, &s);
        double t = kiln_bench_now_s() - t0;
        if (i >= warmup) tot += t;
    }
    c->us[1] = tot / iters * 1e6;
    if (!kiln_bench_all_finite(out, nq) || !kiln_bench_all_finite(dq, nq) || !kiln_bench_all_finite(dk, nk) ||
        !kiln_bench_all_finite(dv, nk))
        e = kiln_errorf(KILN_EINVAL, "attention B=%lld T=%lld H=%lld KV=%lld D=%lld: result is not finite",
                        (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->KV, (long long)c->D);
done:
    free(q); free(out); free(dq); free(dout); free(k); free(v); free(dk); free(dv); free(probs);
    return e;
}

static const char usage[] =
    "usage: kiln bench attention [options]\n\n"
    "Time and achieved GFLOP/s of the trainer's attention kernel (causal grouped-query attention with an\n"
    "optional sliding window), forward and forward + backward: on the CPU the fp32 reference\n"
    "kiln_attention_forward/backward (src/nn/attention.c, OpenMP); with --device cuda the flash-style CUDA\n"
    "kernels on GPU 0 in bf16 (the forward saves the logsumexp, the backward recomputes probabilities).\n\n"
    "FLOPs: forward = 4*B*H*D*pairs (QK^T and PV), pairs = T(T+1)/2 causal, or W(W+1)/2 + (T-W)*W with a\n"
    "window W < T; forward + backward = 3.5 x forward (FlashAttention's convention: backward 2.5 x,\n"
    "counting the recomputed QK^T). tokens/s = B*T / time.\n\n"
    "Lists (\"64,128\", geometric ranges \"512:4096:x2\", arithmetic ranges \"64:256:+64\"); every\n"
    "combination is run:\n"
    "  --head-dim LIST   head dimension D (default 128)\n"
    "  --heads LIST      query heads H (default 8)\n"
    "  --kv-heads LIST   key/value heads KV; H must be a multiple of KV (default 2)\n"
    "  --seq LIST        sequence length T (default 512,1024,2048)\n"
    "  --batch N         sequences per call B (default 1)\n"
    "  --window N        sliding window in tokens, 0 = full causal (default 0)\n"
    "  --device DEV      cpu or cuda (default cpu)\n"
    "  --impl LIST       with --device cuda: implementations to time, each a row: own (kiln's kernels),\n"
    "                    cudnn (cuDNN's fused flash attention, deterministic backward), cudnn-nondet (its\n"
    "                    atomic-dQ backward); default own,cudnn (the trainer's default last). The records'\n"
    "                    backend says what ran (cuda = kiln's kernels; cudnn falls back to them where\n"
    "                    cuDNN is not found or refuses the shape)\n"
    "  --iters N         timed runs per shape and pass (default 5); time is their mean\n"
    "  --warmup N        untimed runs first (default 1)\n"
    "  --threads N       OpenMP/OpenBLAS threads (default: all cores)\n"
    "  --json FILE       write the JSON profile (section \"attention\")\n"
    "  --csv FILE        write the numbers as CSV\n";

/* Records and CSV rows: one per shape and pass. */
typedef struct {
    const attn_case *cs;
    int threads;
    int cuda;
} attn_out;

/* the backend column of a device record: what ran; kiln's own kernels are "cuda" as before --impl existed */
static const char *backend_name(const attn_case *c) { return strcmp(c->ran, "own") ? c->ran : "cuda"; }

static void json_record(cJSON *r, size_t i, const void *ctx) {
    const attn_out *o = ctx;
    const attn_case *c = &o->cs[i / 2];
    int pass = (int)(i % 2);
    double fl = case_flops(c, pass);
    cJSON_AddStringToObject(r, "device", o->cuda ? "cuda" : "cpu");
    cJSON_AddStringToObject(r, "backend", o->cuda ? backend_name(c) : "cpu");
    cJSON_AddStringToObject(r, "dtype", o->cuda ? "bf16" : "fp32");
    cJSON_AddStringToObject(r, "pass", kiln_bench_pass_names[pass]);
    cJSON_AddNumberToObject(r, "batch", (double)c->B);
    cJSON_AddNumberToObject(r, "seq", (double)c->T);
    cJSON_AddNumberToObject(r, "heads", (double)c->H);
    cJSON_AddNumberToObject(r, "kv_heads", (double)c->KV);
    cJSON_AddNumberToObject(r, "head_dim", (double)c->D);
    cJSON_AddNumberToObject(r, "window", (double)c->window);
    cJSON_AddNumberToObject(r, "threads", o->threads);
    cJSON_AddNumberToObject(r, "flops", fl);
    cJSON_AddNumberToObject(r, "time_us", c->us[pass]);
    cJSON_AddNumberToObject(r, "gflops", fl / (c->us[pass] * 1e-6) / 1e9);
    cJSON_AddNumberToObject(r, "tokens_per_s", (double)(c->B * c->T) / (c->us[pass] * 1e-6));
}

static void csv_row(FILE *f, size_t i, const void *ctx) {
    const attn_out *o = ctx;
    const attn_case *c = &o->cs[i / 2];
    int pass = (int)(i % 2);
    double fl = case_flops(c, pass);
    fprintf(f, "%s,%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%.17g,%.3f,%.6g,%.6g\n", o->cuda ? backend_name(c) : "cpu",
            o->cuda ? "bf16" : "fp32", kiln_bench_pass_names[pass],
            (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->KV, (long long)c->D,
            (long long)c->window, o->threads, fl, c->us[pass], fl / (c->us[pass] * 1e-6) / 1e9,
            (double)(c->B * c->T) / (c->us[pass] * 1e-6));
}

int kiln_bench_attention_main(int argc, char **argv) {
    const char *ds = "128", *hs = "8", *kvs = "2", *ts = "512,1024,2048", *json_path = NULL, *csv_path = NULL;
    const char *impls = NULL;
    int cuda = 0;
    long long batch = 1, window = 0, iters = 5, warmup = 1, threads = 0;
    static const char *const valued[] = {"--head-dim", "--heads", "--kv-heads", "--seq", "--batch", "--window",
                                         "--iters", "--warmup", "--threads", "--json", "--csv", "--device",
                                         "--impl", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a, *v;
        int r = kiln_bench_flag(argc, argv, &i, "attention", usage, valued, &a, &v);
        if (r >= 0) return r;
        if (!strcmp(a, "--head-dim")) ds = v;
        else if (!strcmp(a, "--heads")) hs = v;
        else if (!strcmp(a, "--kv-heads")) kvs = v;
        else if (!strcmp(a, "--seq")) ts = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--csv")) csv_path = v;
        else if (!strcmp(a, "--impl")) impls = v;
        else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda"))
                return kiln_bench_usage_err("attention", "--device '%s': expected cpu or cuda", v);
            cuda = !strcmp(v, "cuda");
        } else {
            long long x;
            int zero_ok = !strcmp(a, "--window") || !strcmp(a, "--warmup");
            long long hi = !strcmp(a, "--window") ? (1LL << 40) : !strcmp(a, "--batch") ? (1LL << 20) : 100000000LL;
            if ((r = kiln_bench_parse_int("attention", a, v, zero_ok ? 0 : 1, hi, &x)) >= 0) return r;
            if (!strcmp(a, "--batch")) batch = x;
            else if (!strcmp(a, "--window")) window = x;
            else if (!strcmp(a, "--iters")) iters = x;
            else if (!strcmp(a, "--warmup")) warmup = x;
            else threads = x;
        }
    }

    /* --impl: a comma-separated list of own, cudnn, cudnn-nondet (device only) */
    static const char *const impl_names[3] = {"own", "cudnn", "cudnn-nondet"};
    const char *iv[8] = {NULL};
    size_t in = 1;
    if (cuda && !impls) impls = "own,cudnn";
    if (impls) {
        if (!cuda) return kiln_bench_usage_err("attention", "--impl needs --device cuda");
        in = 0;
        for (const char *p = impls; *p;) {
            size_t l = strcspn(p, ",");
            int found = -1;
            for (int j = 0; j < 3; j++)
                if (strlen(impl_names[j]) == l && !strncmp(p, impl_names[j], l)) found = j;
            if (found < 0 || in == 8)
                return kiln_bench_usage_err("attention", "--impl '%s': expected a list of own, cudnn, cudnn-nondet",
                                            impls);
            iv[in++] = impl_names[found];
            p += l + (p[l] == ',');
        }
        if (!in) return kiln_bench_usage_err("attention", "--impl '%s': empty", impls);
    }

    int64_t *dv = NULL, *hv = NULL, *kvv = NULL, *tv = NULL;
    size_t dn = 0, hn = 0, kvn = 0, tn = 0;
    kiln_error *e = kiln_gemm_parse_dims(ds, "--head-dim", &dv, &dn);
    if (!e) e = kiln_gemm_parse_dims(hs, "--heads", &hv, &hn);
    if (!e) e = kiln_gemm_parse_dims(kvs, "--kv-heads", &kvv, &kvn);
    if (!e) e = kiln_gemm_parse_dims(ts, "--seq", &tv, &tn);
    attn_case *cs = NULL;
    size_t ncase = 0;
    if (!e && dn * hn * kvn * tn * in > MAX_CASES)
        e = kiln_errorf(KILN_EINVAL, "%zu shapes (more than %d)", dn * hn * kvn * tn * in, MAX_CASES);
    if (!e && !(cs = calloc(dn * hn * kvn * tn * in, sizeof *cs))) e = kiln_errorf(KILN_ENOMEM, "shapes");
    double avail = kiln_bench_avail_bytes();
    for (size_t a = 0; !e && a < hn; a++)
        for (size_t b = 0; !e && b < kvn; b++) {
            if (hv[a] % kvv[b]) {
                e = kiln_errorf(KILN_EINVAL,
                                "--heads %lld is not a multiple of --kv-heads %lld (each KV head serves a whole "
                                "group of query heads)",
                                (long long)hv[a], (long long)kvv[b]);
                break;
            }
            for (size_t c = 0; !e && c < dn; c++)
                for (size_t d = 0; !e && d < tn * in; d++) {
                    attn_case *x = &cs[ncase++];
                    x->impl = iv[d % in];
                    x->B = batch;
                    x->H = hv[a];
                    x->KV = kvv[b];
                    x->D = dv[c];
                    x->T = tv[d / in];
                    x->window = window;
                    double need = kiln_attn_bytes(x->B, x->T, x->H, x->KV, x->D);
                    if (!cuda && avail > 0 && need > 0.8 * avail) /* the device path keeps no T x T matrix */
                        e = kiln_errorf(KILN_EINVAL,
                                        "B=%lld T=%lld H=%lld KV=%lld D=%lld needs %.3g GiB (the saved "
                                        "probabilities B*H*T^2 floats dominate) but only %.3g GiB is available "
                                        "(80%% of MemAvailable); lower --seq, --heads or --batch",
                                        (long long)x->B, (long long)x->T, (long long)x->H, (long long)x->KV,
                                        (long long)x->D, need / (1 << 30), 0.8 * avail / (1 << 30));
                }
        }
    free(dv); free(hv); free(kvv); free(tv);
    if (e) {
        kiln_bench_fail("attention", NULL, e);
        free(cs);
        return 2;
    }
    if (kiln_bench_check_outputs("attention", json_path, csv_path)) {
        free(cs);
        return 1;
    }
    kiln_bench_set_threads(threads);
    int nthreads = omp_get_max_threads();
    if (cuda) {
        kiln_cuda_info gi;
        if ((e = kiln_cuda_device_info(&gi))) {
            kiln_bench_fail("attention", "--device cuda", e);
            free(cs);
            return 1;
        }
        printf("kiln bench attention: cuda (kiln_attention_forward/backward_cuda) on %s, bf16, %lld iterations "
               "after %lld warm-up\n",
               gi.name, iters, warmup);
    } else {
        printf("kiln bench attention: cpu reference (kiln_attention_forward/backward), fp32, %d threads, %lld "
               "iterations after %lld warm-up\n",
               nthreads, iters, warmup);
    }
    printf("GFLOP/s: forward 4*B*H*D*pairs (causal pairs T(T+1)/2), fwd+bwd 3.5 x forward; tok/s = B*T / time\n");
    printf("%5s %7s %4s %4s %5s %7s", "B", "T", "H", "KV", "D", "window");
    if (cuda) printf(" %-12s", "impl");
    kiln_bench_pass_header("GFLOP/s");
    int rc = 0;
    for (size_t i = 0; i < ncase; i++) {
        attn_case *c = &cs[i];
        e = cuda ? kiln_bench_attention_cuda(c->B, c->T, c->H, c->KV, c->D, c->window, c->impl, (int)iters,
                                             (int)warmup, c->us, c->ran, sizeof c->ran)
                 : run_case(c, (int)iters, (int)warmup);
        if (e) {
            kiln_bench_fail("attention", NULL, e);
            rc = 1;
            ncase = i;
            break;
        }
        char win[24];
        if (c->window) snprintf(win, sizeof win, "%lld", (long long)c->window);
        else snprintf(win, sizeof win, "-");
        printf("%5lld %7lld %4lld %4lld %5lld %7s", (long long)c->B, (long long)c->T, (long long)c->H,
               (long long)c->KV, (long long)c->D, win);
        if (cuda) printf(" %-12s", c->ran);
        const double fl[2] = {case_flops(c, 0), case_flops(c, 1)};
        kiln_bench_pass_row(c->us, fl, (double)(c->B * c->T), 1e9, 2);
        fflush(stdout);
    }
    attn_out out = {cs, nthreads, cuda};
    const kiln_bench_output o = {"attention", 2 * ncase, &out, json_record, NULL,
                                 "backend,dtype,pass,batch,seq,heads,kv_heads,head_dim,window,threads,flops,time_us,"
                                 "gflops,tokens_per_s\n",
                                 csv_row};
    if (!rc) rc = kiln_bench_write_outputs(&o, json_path, csv_path);
    free(cs);
    return rc;
}
