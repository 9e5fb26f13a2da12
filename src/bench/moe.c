/* kiln bench moe: time and achieved TFLOP/s of the trainer's expert path, forward and forward +
 * backward: routed slots grouped by expert, per expert SwiGLU gate_up then down through kiln_linear_*
 * and kiln_swiglu_*, the gate-weighted scatter back to the tokens; the same steps as
 * src/models/zaya_forward.c and zaya_backward.c. Routing is balanced and random from a fixed seed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_util.h"
#include "gemm_shapes.h"
#include "kernel_formulas.h"
#include "kiln/bench.h"
#include "kiln/nn.h"
#include "kiln/rng.h"

#define MAX_CASES 4096
#define ROUTE_SEED 0x6b696c6eu /* "kiln" */

double kiln_moe_flops_fwd(int64_t tokens, int64_t top_k, int64_t hidden, int64_t inter) {
    return 6.0 * (double)tokens * (double)top_k * (double)hidden * (double)inter;
}

double kiln_moe_flops_fwd_bwd(int64_t tokens, int64_t top_k, int64_t hidden, int64_t inter) {
    return 3.0 * kiln_moe_flops_fwd(tokens, top_k, hidden, inter);
}

double kiln_moe_bytes(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t top_k) {
    double N = (double)tokens, H = (double)hidden, Iw = (double)inter, S = N * (double)top_k;
    double floats = 2.0 * (double)experts * 3.0 * H * Iw + 4.0 * N * H + S * (4.0 * H + 6.0 * Iw) + 2.0 * S;
    double ints = 3.0 * S + 2.0 * ((double)experts + 1) + N + (double)experts;
    return 4.0 * floats + 4.0 * ints + 8.0 * ((double)experts + 1) * 2;
}

static void shuffle(int32_t *p, int64_t n, kiln_rng *r) {
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(kiln_rng_u64(r) % (uint64_t)(i + 1));
        int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

int kiln_moe_route(int32_t *choice, int64_t tokens, int64_t experts, int64_t top_k, uint64_t seed) {
    if (tokens < 1 || experts < 1 || top_k < 1 || top_k > experts || tokens > INT32_MAX || experts > INT32_MAX)
        return -1;
    int32_t *pt = malloc((size_t)tokens * sizeof *pt), *pe = malloc((size_t)experts * sizeof *pe);
    if (!pt || !pe) {
        free(pt);
        free(pe);
        return -1;
    }
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    shuffle(pt, tokens, &r);
    shuffle(pe, experts, &r);
    for (int64_t n = 0; n < tokens; n++)
        for (int64_t j = 0; j < top_k; j++) choice[n * top_k + j] = pe[((int64_t)pt[n] * top_k + j) % experts];
    free(pt);
    free(pe);
    return 0;
}

typedef struct {
    int64_t N, H, Iw, E, top;
    double us[2]; /* mean microseconds: fwd, fwd_bwd */
} moe_case;

static double case_flops(const moe_case *c, int pass) {
    return pass ? kiln_moe_flops_fwd_bwd(c->N, c->top, c->H, c->Iw) : kiln_moe_flops_fwd(c->N, c->top, c->H, c->Iw);
}

static kiln_error *run_case(moe_case *c, int iters, int warmup) {
    const int64_t N = c->N, H = c->H, Iw = c->Iw, E = c->E, S = N * c->top, nw = E * 2 * Iw * H, nd = E * H * Iw;
    float *wgu = malloc((size_t)nw * sizeof(float)), *wdn = malloc((size_t)nd * sizeof(float));
    float *ggu = malloc((size_t)nw * sizeof(float)), *gdn = malloc((size_t)nd * sizeof(float));
    float *x = malloc((size_t)(N * H) * sizeof(float)), *out = malloc((size_t)(N * H) * sizeof(float));
    float *dout = malloc((size_t)(N * H) * sizeof(float)), *dx = malloc((size_t)(N * H) * sizeof(float));
    float *xe = malloc((size_t)(S * H) * sizeof(float)), *ye = malloc((size_t)(S * H) * sizeof(float));
    float *dye = malloc((size_t)(S * H) * sizeof(float)), *dxe = malloc((size_t)(S * H) * sizeof(float));
    float *gu = malloc((size_t)(S * 2 * Iw) * sizeof(float)), *dgu = malloc((size_t)(S * 2 * Iw) * sizeof(float));
    float *act = malloc((size_t)(S * Iw) * sizeof(float)), *dact = malloc((size_t)(S * Iw) * sizeof(float));
    float *gate = malloc((size_t)S * sizeof(float)), *dgate = malloc((size_t)S * sizeof(float));
    int32_t *choice = malloc((size_t)S * sizeof(int32_t)), *slot_tok = malloc((size_t)S * sizeof(int32_t));
    int32_t *slot_k = malloc((size_t)S * sizeof(int32_t));
    int32_t *exp_off = malloc((size_t)(E + 1) * sizeof(int32_t)), *fillv = malloc((size_t)E * sizeof(int32_t));
    kiln_error *e = NULL;
    if (!wgu || !wdn || !ggu || !gdn || !x || !out || !dout || !dx || !xe || !ye || !dye || !dxe || !gu || !dgu ||
        !act || !dact || !gate || !dgate || !choice || !slot_tok || !slot_k || !exp_off || !fillv) {
        e = kiln_errorf(KILN_ENOMEM, "moe tokens=%lld hidden=%lld inter=%lld experts=%lld: cannot allocate %.3g GiB",
                        (long long)N, (long long)H, (long long)Iw, (long long)E,
                        kiln_moe_bytes(N, H, Iw, E, c->top) / (1 << 30));
        goto done;
    }
    if (kiln_moe_route(choice, N, E, c->top, ROUTE_SEED)) {
        e = kiln_errorf(KILN_ENOMEM, "moe: routing %lld tokens", (long long)N);
        goto done;
    }
    kiln_rng r;
    kiln_rng_seed(&r, ROUTE_SEED + 1);
    for (int64_t s = 0; s < S; s++) gate[s] = (float)(0.1 + 0.9 * kiln_rng_uniform(&r));
    kiln_bench_fill(wgu, nw, 1, 1.0f / sqrtf((float)H));
    kiln_bench_fill(wdn, nd, 2, 1.0f / sqrtf((float)Iw));
    kiln_bench_fill(x, N * H, 3, 1.0f);
    kiln_bench_fill(dout, N * H, 4, 1.0f);
    /* the trainer's own expert op (src/nn/experts.c), as src/models/zaya_forward.c calls it */
    kiln_experts b = {N, H, Iw, E, c->top, choice, gate, exp_off, fillv, slot_tok, slot_k, 0, xe, gu, act, ye};
    kiln_experts_scratch w = {dye, dact, dgu, dxe};
    double tot = 0;
    for (int i = 0; i < warmup + iters; i++) {
        double t0 = kiln_bench_now_s();
        kiln_experts_forward(&b, out, x, wgu, wdn);
        double t = kiln_bench_now_s() - t0;
        if (i >= warmup) tot += t;
    }
    c->us[0] = tot / iters * 1e6;
    tot = 0;
    for (int i = 0; i < warmup + iters; i++) {
        memset(ggu, 0, (size_t)nw * sizeof(float)); /* the trainer's weight gradients start at zero */
        memset(gdn, 0, (size_t)nd * sizeof(float));
        double t0 = kiln_bench_now_s();
        kiln_experts_forward(&b, out, x, wgu, wdn);
        memset(dx, 0, (size_t)(N * H) * sizeof(float)); /* the op accumulates into dx */
        kiln_experts_backward(&b, dx, dgate, ggu, gdn, dout, wgu, wdn, &w);
        double t = kiln_bench_now_s() - t0;
        if (i >= warmup) tot += t;
    }
    c->us[1] = tot / iters * 1e6;
    if (b.nslots != S || !kiln_bench_all_finite(out, N * H) || !kiln_bench_all_finite(dx, N * H) || !kiln_bench_all_finite(ggu, nw) ||
        !kiln_bench_all_finite(gdn, nd))
        e = kiln_errorf(KILN_EINVAL, "moe tokens=%lld hidden=%lld inter=%lld experts=%lld: result is not finite",
                        (long long)N, (long long)H, (long long)Iw, (long long)E);
done:
    free(wgu); free(wdn); free(ggu); free(gdn); free(x); free(out); free(dout); free(dx);
    free(xe); free(ye); free(dye); free(dxe); free(gu); free(dgu); free(act); free(dact);
    free(gate); free(dgate); free(choice); free(slot_tok); free(slot_k); free(exp_off); free(fillv);
    return e;
}

static const char usage[] =
    "usage: kiln bench moe [options]\n\n"
    "Time and achieved TFLOP/s of the trainer's expert op (kiln_experts_forward/backward, the one the\n"
    "model calls), forward and forward + backward, fp32: the routed slots grouped by expert, per expert\n"
    "gate_up [hidden -> 2*inter], SwiGLU, down [inter -> hidden] through OpenBLAS, the gate-weighted\n"
    "scatter back to the tokens (weight gradients included). Routing\n"
    "is balanced (every expert gets tokens*top_k/experts slots, +-1) and random from a fixed seed.\n\n"
    "FLOPs: forward = 6*tokens*top_k*hidden*inter (gate_up 4*hidden*inter + down 2*hidden*inter per\n"
    "slot); backward = 2 x forward (dX and dW of both); forward + backward = 18*tokens*top_k*hidden*inter.\n"
    "SwiGLU, gather and scatter are timed but not counted. tokens/s = tokens / time.\n\n"
    "Lists (\"1024,2048\", geometric ranges \"512:4096:x2\", arithmetic ranges \"1:4:+1\"); every\n"
    "combination is run:\n"
    "  --hidden N        hidden size (default 2048)\n"
    "  --inter LIST      expert intermediate width (default 2048)\n"
    "  --experts LIST    number of experts (default 16)\n"
    "  --top-k LIST      experts per token, at most --experts (default 1)\n"
    "  --tokens LIST     tokens per step (default 4096)\n"
    "  --iters N         timed runs per shape and pass (default 5); time is their mean\n"
    "  --warmup N        untimed runs first (default 1)\n"
    "  --threads N       OpenMP/OpenBLAS threads (default: all cores)\n"
    "  --json FILE       write the JSON profile (section \"moe\")\n"
    "  --csv FILE        write the numbers as CSV\n"
    "  --device D        cpu (default) or cuda: the CUDA trainer's expert op (bf16, grouped GEMMs) and its\n"
    "                    grouped GEMMs against dense ones; `kiln bench moe --device cuda --help` for its flags\n";

/* Records and CSV rows: one per shape and pass. */
typedef struct {
    const moe_case *cs;
    int threads;
} moe_out;

static void json_record(cJSON *r, size_t i, const void *ctx) {
    const moe_out *o = ctx;
    const moe_case *c = &o->cs[i / 2];
    int pass = (int)(i % 2);
    double fl = case_flops(c, pass);
    cJSON_AddStringToObject(r, "backend", "openblas");
    cJSON_AddStringToObject(r, "dtype", "fp32");
    cJSON_AddStringToObject(r, "pass", kiln_bench_pass_names[pass]);
    cJSON_AddNumberToObject(r, "tokens", (double)c->N);
    cJSON_AddNumberToObject(r, "hidden", (double)c->H);
    cJSON_AddNumberToObject(r, "inter", (double)c->Iw);
    cJSON_AddNumberToObject(r, "experts", (double)c->E);
    cJSON_AddNumberToObject(r, "top_k", (double)c->top);
    cJSON_AddNumberToObject(r, "slots", (double)(c->N * c->top));
    cJSON_AddNumberToObject(r, "threads", o->threads);
    cJSON_AddNumberToObject(r, "flops", fl);
    cJSON_AddNumberToObject(r, "time_us", c->us[pass]);
    cJSON_AddNumberToObject(r, "tflops", fl / (c->us[pass] * 1e-6) / 1e12);
    cJSON_AddNumberToObject(r, "tokens_per_s", (double)c->N / (c->us[pass] * 1e-6));
}

static void csv_row(FILE *f, size_t i, const void *ctx) {
    const moe_out *o = ctx;
    const moe_case *c = &o->cs[i / 2];
    int pass = (int)(i % 2);
    double fl = case_flops(c, pass);
    fprintf(f, "openblas,fp32,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%.17g,%.3f,%.6g,%.6g\n", kiln_bench_pass_names[pass],
            (long long)c->N, (long long)c->H, (long long)c->Iw, (long long)c->E, (long long)c->top,
            (long long)(c->N * c->top), o->threads, fl, c->us[pass], fl / (c->us[pass] * 1e-6) / 1e12,
            (double)c->N / (c->us[pass] * 1e-6));
}

int kiln_bench_moe_gpu(int argc, char **argv); /* moe_gpu.c */

int kiln_bench_moe_main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device")) {
            if (!strcmp(argv[i + 1], "cuda")) return kiln_bench_moe_gpu(argc, argv);
            if (strcmp(argv[i + 1], "cpu"))
                return kiln_bench_usage_err("moe", "--device '%s': expected cpu or cuda", argv[i + 1]);
        }
    const char *is = "2048", *es = "16", *ks = "1", *ns = "4096", *json_path = NULL, *csv_path = NULL;
    long long hidden = 2048, iters = 5, warmup = 1, threads = 0;
    static const char *const valued[] = {"--hidden", "--inter",   "--experts", "--top-k", "--tokens", "--iters",
                                         "--warmup", "--threads", "--json",    "--csv",   "--device", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a, *v;
        int r = kiln_bench_flag(argc, argv, &i, "moe", usage, valued, &a, &v);
        if (r >= 0) return r;
        if (!strcmp(a, "--device")) continue; /* cpu */
        if (!strcmp(a, "--inter")) is = v;
        else if (!strcmp(a, "--experts")) es = v;
        else if (!strcmp(a, "--top-k")) ks = v;
        else if (!strcmp(a, "--tokens")) ns = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--csv")) csv_path = v;
        else {
            long long x;
            int zero_ok = !strcmp(a, "--warmup");
            long long hi = !strcmp(a, "--hidden") ? (1LL << 20) : 100000000LL;
            if ((r = kiln_bench_parse_int("moe", a, v, zero_ok ? 0 : 1, hi, &x)) >= 0) return r;
            if (!strcmp(a, "--hidden")) hidden = x;
            else if (!strcmp(a, "--iters")) iters = x;
            else if (!strcmp(a, "--warmup")) warmup = x;
            else threads = x;
        }
    }

    int64_t *iv = NULL, *ev = NULL, *kv = NULL, *nv = NULL;
    size_t in = 0, en = 0, kn = 0, nn = 0;
    kiln_error *e = kiln_gemm_parse_dims(is, "--inter", &iv, &in);
    if (!e) e = kiln_gemm_parse_dims(es, "--experts", &ev, &en);
    if (!e) e = kiln_gemm_parse_dims(ks, "--top-k", &kv, &kn);
    if (!e) e = kiln_gemm_parse_dims(ns, "--tokens", &nv, &nn);
    moe_case *cs = NULL;
    size_t ncase = 0;
    if (!e && in * en * kn * nn > MAX_CASES)
        e = kiln_errorf(KILN_EINVAL, "%zu shapes (more than %d)", in * en * kn * nn, MAX_CASES);
    if (!e && !(cs = calloc(in * en * kn * nn, sizeof *cs))) e = kiln_errorf(KILN_ENOMEM, "shapes");
    double avail = kiln_bench_avail_bytes();
    for (size_t a = 0; !e && a < en; a++)
        for (size_t b = 0; !e && b < kn; b++) {
            if (kv[b] > ev[a]) {
                e = kiln_errorf(KILN_EINVAL, "--top-k %lld exceeds --experts %lld (a token's experts are distinct)",
                                (long long)kv[b], (long long)ev[a]);
                break;
            }
            for (size_t c = 0; !e && c < in; c++)
                for (size_t d = 0; !e && d < nn; d++) {
                    moe_case *x = &cs[ncase++];
                    x->N = nv[d];
                    x->H = hidden;
                    x->Iw = iv[c];
                    x->E = ev[a];
                    x->top = kv[b];
                    double need = kiln_moe_bytes(x->N, x->H, x->Iw, x->E, x->top);
                    if (avail > 0 && need > 0.8 * avail)
                        e = kiln_errorf(KILN_EINVAL,
                                        "tokens=%lld hidden=%lld inter=%lld experts=%lld top_k=%lld needs %.3g GiB "
                                        "(weights and gradients: 6*experts*hidden*inter floats; activations: "
                                        "tokens*top_k*(4*hidden+6*inter) floats) but only %.3g GiB is available "
                                        "(80%% of MemAvailable)",
                                        (long long)x->N, (long long)x->H, (long long)x->Iw, (long long)x->E,
                                        (long long)x->top, need / (1 << 30), 0.8 * avail / (1 << 30));
                    else if ((double)x->N * (double)x->top > (double)INT32_MAX)
                        e = kiln_errorf(KILN_EINVAL, "tokens=%lld x top_k=%lld: more than 2^31-1 routed slots",
                                        (long long)x->N, (long long)x->top);
                }
        }
    free(iv); free(ev); free(kv); free(nv);
    if (e) {
        kiln_bench_fail("moe", NULL, e);
        free(cs);
        return 2;
    }
    if (kiln_bench_check_outputs("moe", json_path, csv_path)) {
        free(cs);
        return 1;
    }
    kiln_bench_set_threads(threads);
    int nthreads = omp_get_max_threads();
    printf("kiln bench moe: experts through kiln_linear_* (openblas sgemm) + kiln_swiglu_*, fp32, %d threads, "
           "%lld iterations after %lld warm-up\n",
           nthreads, iters, warmup);
    printf("TFLOP/s: forward 6*tokens*top_k*hidden*inter, fwd+bwd 3 x forward; tok/s = tokens / time; "
           "balanced routing\n");
    printf("%7s %6s %6s %7s %5s %8s", "tokens", "hidden", "inter", "experts", "top_k", "per_exp");
    kiln_bench_pass_header("TFLOP/s");
    int rc = 0;
    for (size_t i = 0; i < ncase; i++) {
        moe_case *c = &cs[i];
        e = run_case(c, (int)iters, (int)warmup);
        if (e) {
            kiln_bench_fail("moe", NULL, e);
            rc = 1;
            ncase = i;
            break;
        }
        printf("%7lld %6lld %6lld %7lld %5lld %8.1f", (long long)c->N, (long long)c->H, (long long)c->Iw,
               (long long)c->E, (long long)c->top, (double)(c->N * c->top) / (double)c->E);
        const double fl[2] = {case_flops(c, 0), case_flops(c, 1)};
        kiln_bench_pass_row(c->us, fl, (double)c->N, 1e12, 4);
        fflush(stdout);
    }
    moe_out out = {cs, nthreads};
    const kiln_bench_output o = {"moe", 2 * ncase, &out, json_record, NULL,
                                 "backend,dtype,pass,tokens,hidden,inter,experts,top_k,slots,threads,flops,time_us,"
                                 "tflops,tokens_per_s\n",
                                 csv_row};
    if (!rc) rc = kiln_bench_write_outputs(&o, json_path, csv_path);
    free(cs);
    return rc;
}
