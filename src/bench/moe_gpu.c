/* kiln bench moe --device cuda: the CUDA trainer's expert op (kiln_experts_forward_cuda / _backward_cuda:
 * dispatch, gather, grouped GEMMs, SwiGLU, gated sum), forward and forward + backward, bf16 with f32
 * accumulation, for balanced and skewed routing; then each of its six grouped GEMMs alone against ONE
 * dense cuBLASLt GEMM of the same total size (all routed rows as one matrix): what grouping by expert
 * costs. Time is wall-clock around `iters` calls after a device sync: it includes the host work the op
 * needs (the offsets' device-to-host copy, the grouped GEMM's pointer arrays), as the trainer pays it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kernel_formulas.h"
#include "kiln/bench.h"
#include "kiln/cuda.h"
#include "kiln/rng.h"

#ifdef KILN_HAVE_CUDA
#include "kiln/cuda_ops.h"
#endif

/* Zipf: with 16 experts the busiest gets 30% of the slots, the idlest 1.8%. */
int kiln_moe_route_skewed(int32_t *choice, int64_t tokens, int64_t experts, int64_t top_k, uint64_t seed) {
    if (tokens < 1 || experts < 1 || top_k < 1 || top_k > experts) return -1;
    double *cdf = malloc((size_t)experts * sizeof *cdf);
    int32_t *perm = malloc((size_t)experts * sizeof *perm);
    if (!cdf || !perm) {
        free(cdf), free(perm);
        return -1;
    }
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int64_t e = 0; e < experts; e++) perm[e] = (int32_t)e;
    for (int64_t e = experts - 1; e > 0; e--) {
        int64_t j = (int64_t)(kiln_rng_u64(&r) % (uint64_t)(e + 1));
        int32_t t = perm[e];
        perm[e] = perm[j], perm[j] = t;
    }
    double tot = 0;
    for (int64_t e = 0; e < experts; e++) cdf[e] = (tot += 1.0 / (double)(e + 1));
    for (int64_t n = 0; n < tokens; n++)
        for (int64_t j = 0; j < top_k; j++) {
            int32_t pick;
            int dup;
            do {
                double u = kiln_rng_uniform(&r) * tot;
                int64_t e = 0;
                while (e + 1 < experts && cdf[e] <= u) e++;
                pick = perm[e];
                dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= choice[n * top_k + i] == pick;
            } while (dup);
            choice[n * top_k + j] = pick;
        }
    free(cdf), free(perm);
    return 0;
}

/* The routing of the CUDA trainer's first ~200 steps (run r17): one expert takes `share` of the slots, the rest
 * spread uniformly over the others. */
int kiln_moe_route_concentrated(int32_t *choice, int64_t tokens, int64_t experts, int64_t top_k, double share,
                                uint64_t seed) {
    if (tokens < 1 || experts < 1 || top_k < 1 || top_k > experts || !(share >= 0.0 && share <= 1.0)) return -1;
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    const int32_t hot = (int32_t)(kiln_rng_u64(&r) % (uint64_t)experts);
    for (int64_t n = 0; n < tokens; n++)
        for (int64_t j = 0; j < top_k; j++) {
            int32_t pick;
            int dup;
            do {
                if (kiln_rng_uniform(&r) < share) pick = hot;
                else if (experts > 1) {
                    pick = (int32_t)(kiln_rng_u64(&r) % (uint64_t)(experts - 1));
                    pick += pick >= hot; /* any expert but the hot one */
                } else pick = hot;
                dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= choice[n * top_k + i] == pick;
            } while (dup);
            choice[n * top_k + j] = pick;
        }
    return 0;
}

#ifndef KILN_HAVE_CUDA
int kiln_bench_moe_gpu(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "kiln bench moe: error: --device cuda: this kiln was built without CUDA\n");
    return 2;
}
#else

static const char usage[] =
    "usage: kiln bench moe --device cuda [options]\n\n"
    "The CUDA trainer's expert op (kiln_experts_forward_cuda/_backward_cuda), forward and forward +\n"
    "backward, bf16 activations and weights, f32 accumulation and f32 weight gradients, for each routing\n"
    "and each grouped-GEMM path; then each grouped GEMM of the op alone against one dense cuBLASLt GEMM of\n"
    "the same total size (the weight gradients also written, beta = 0, as *_dw_write: not in the sums).\n"
    "Every path's output and input gradient are checked against the first path's.\n"
    "Defaults: the [cuda] benchmark layer (16384 tokens = micro-batch 4 x 4096, hidden 2048, 16 experts\n"
    "top-1, moe_intermediate 2048). FLOPs as the CPU benchmark: forward 6*tokens*top_k*hidden*inter,\n"
    "fwd+bwd 3 x forward. Time: wall clock over --iters calls between device syncs.\n\n"
    "  --hidden N        hidden size (default 2048)\n"
    "  --inter N         expert intermediate width (default 2048)\n"
    "  --experts N       number of experts (default 16)\n"
    "  --top-k N         experts per token (default 1)\n"
    "  --tokens N        tokens per call (default 16384)\n"
    "  --routing LIST    balanced (every expert tokens*top_k/experts slots), skewed (Zipf: expert ranks\n"
    "                    weighted 1/rank) and/or concentrated (98% of the slots to one expert, the rest\n"
    "                    uniform: the trainer's first ~200 steps) (default balanced,skewed)\n"
    "  --paths LIST      grouped-GEMM paths (src/cuda/experts_gemm.cu): grouped, lt_loop, lt_chunks,\n"
    "                    lt_streams, lt_mixed, 'default' (the one in effect: KILN_GROUPED_GEMM or the\n"
    "                    built-in default) or 'all' (default all)\n"
    "  --iters N         timed calls (default 20)\n"
    "  --warmup N        untimed calls first (default 3)\n"
    "  --json FILE       the JSON profile (section \"moe\")\n"
    "  --csv FILE        the numbers as CSV\n";

#define ROUTE_SEED 0x6b696c6eu /* "kiln", as the CPU benchmark */
#define CONCENTRATED_SHARE 0.98
#define PATH_TOL 5e-2          /* paths differ in bf16 roundings of intermediate tiles, nothing more */

/* op fwd, op fwd_bwd, the six GEMMs, then the two weight gradients again written (beta = 0) instead of
 * accumulated, as a first micro-batch after zeroing could do (not in the sums) */
enum { NPART = 10, NSUM = 8, MAX_PATHS = 8 };
static const char *const part_names[NPART] = {"op",         "op",          "gate_up_fwd",  "down_fwd",
                                              "down_dx",    "down_dw",     "gate_up_dx",   "gate_up_dw",
                                              "down_dw_write", "gate_up_dw_write"};
typedef struct {
    const char *routing, *path;
    int is_default;
    int64_t N, H, I, E, top, slots, max_rows;
    double us[NPART], dense_us[NPART], flops[NPART];
    int looped[NPART];
    double out_err, dx_err; /* max |x - reference path's| / max |reference path's| */
    double pass_us[KILN_EXPERTS_NPASS]; /* one profiled forward + backward: each pass that is not a GEMM */
    const char *ref;        /* the reference: the first path that ran */
    int failed;             /* this path failed (its error printed): left out of the tables and files */
} moe_gpu_case;

typedef struct { /* one GEMM of the op: grouped over experts, or the dense equivalent */
    void *c;
    int c_f32;
    const kiln_bf16 *a, *b;
    int64_t m, n, k; /* as kiln_grouped_gemm_cuda takes them */
    const char *layout;
    int acc;
} gemm_job;

static kiln_error *job_run(const gemm_job *j, const int32_t *offs, int64_t E, int64_t S, int dense, int *looped) {
    if (!dense) return kiln_grouped_gemm_cuda(j->c, j->c_f32, j->a, j->b, offs, E, j->m, j->n, j->k, j->layout, j->acc,
                                              looped, NULL);
    /* the same rows as one matrix against expert 0's weights */
    if (!strcmp(j->layout, "TN")) return kiln_gemm_bf16_cuda(j->c, j->c_f32, j->a, j->b, j->m, j->n, S, "TN", j->acc, NULL);
    return kiln_gemm_bf16_cuda(j->c, j->c_f32, j->a, j->b, S, j->n, j->k, j->layout, j->acc, NULL);
}

static double now_synced(kiln_error **e) {
    if (!*e) *e = kiln_cuda_sync();
    return kiln_bench_now_s();
}

static kiln_error *dev_fill_bf16(kiln_bf16 *d, int64_t n, uint32_t salt, float scale) {
    float *h = malloc((size_t)n * sizeof *h), *tmp = NULL;
    if (!h) return kiln_errorf(KILN_ENOMEM, "%lld values", (long long)n);
    kiln_bench_fill(h, n, salt, scale);
    kiln_error *e = kiln_cuda_alloc((void **)&tmp, (size_t)n * sizeof *tmp);
    if (!e) e = kiln_cuda_copy(tmp, h, (size_t)n * sizeof *h, KILN_CUDA_H2D);
    if (!e) e = kiln_f32_to_bf16_cuda(d, tmp, n, NULL);
    if (!e) e = kiln_cuda_sync();
    kiln_cuda_free(tmp);
    free(h);
    return e;
}

static double rel_diff(const float *x, const float *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        const double a = fabs((double)x[i] - (double)ref[i]), b = fabs((double)ref[i]);
        if (a > d) d = a;
        if (b > r) r = b;
    }
    return r > 0 ? d / r : d;
}

/* one routing, every path in cs[0..np-1] (the same routing): the buffers are set up once, the dense GEMMs
 * timed once (with the first path) and shared */
static kiln_error *run_routing(moe_gpu_case *cs, int np, int iters, int warmup, int *nfailed) {
    moe_gpu_case *c0 = &cs[0];
    const int64_t N = c0->N, H = c0->H, I = c0->I, E = c0->E, top = c0->top, S = N * top, nw = E * 2 * I * H,
                  nd = E * H * I;
    kiln_error *e = NULL;
    int32_t *choice = malloc((size_t)S * sizeof *choice), *off_h = malloc((size_t)(E + 2) * sizeof *off_h);
    float *gate = malloc((size_t)S * sizeof *gate), *chk = malloc((size_t)(N * H) * sizeof *chk);
    float *ref_out = malloc((size_t)(N * H) * sizeof *ref_out), *ref_dx = malloc((size_t)(N * H) * sizeof *ref_dx);
    float *zeros = calloc((size_t)(N * H), sizeof *zeros);
    enum { NBUF = 20 };
    void *d[NBUF] = {0};
    const size_t sz[NBUF] = {(size_t)S * 4, (size_t)S * 4, (size_t)(E + 2) * 4, (size_t)S * 4, (size_t)S * 4,
                             (size_t)S * 4, (size_t)(S * H) * 2, (size_t)(S * 2 * I) * 2, (size_t)(S * I) * 2,
                             (size_t)(S * H) * 2, (size_t)(S * H) * 2, (size_t)(S * I) * 2, (size_t)(S * 2 * I) * 2,
                             (size_t)(S * H) * 2, (size_t)(N * H) * 2, (size_t)nw * 2, (size_t)nd * 2,
                             (size_t)(N * H) * 4 * 3 + (size_t)S * 4, (size_t)nw * 4, (size_t)nd * 4};
    if (!choice || !off_h || !gate || !chk || !ref_out || !ref_dx || !zeros) {
        e = kiln_errorf(KILN_ENOMEM, "moe: host arrays for %lld tokens", (long long)N);
        goto done;
    }
    if (!strcmp(c0->routing, "skewed") ? kiln_moe_route_skewed(choice, N, E, top, ROUTE_SEED)
        : !strcmp(c0->routing, "concentrated") ? kiln_moe_route_concentrated(choice, N, E, top, CONCENTRATED_SHARE, ROUTE_SEED)
                                               : kiln_moe_route(choice, N, E, top, ROUTE_SEED)) {
        e = kiln_errorf(KILN_ENOMEM, "moe: routing %lld tokens", (long long)N);
        goto done;
    }
    kiln_rng r;
    kiln_rng_seed(&r, ROUTE_SEED + 1);
    for (int64_t s = 0; s < S; s++) gate[s] = (float)(0.1 + 0.9 * kiln_rng_uniform(&r));
    for (int i = 0; i < NBUF && !e; i++) e = kiln_cuda_alloc(&d[i], sz[i]);
    if (e) goto done;
    float *out = d[17], *dout = out + N * H, *dx = dout + N * H, *dgate = dx + N * H;
    kiln_experts_cuda x = {N, H, I, E, top, d[0], d[1], d[2], off_h, d[3], d[4], d[5], 0, d[6], d[7], d[8], d[9]};
    /* dx written, as the trainer's backward does (its first writer); the weight gradients accumulated */
    kiln_experts_cuda_scratch w = {d[10], d[11], d[12], d[13], 0, 0, 1, 0, 0, NULL, 0};
    kiln_bf16 *in = d[14], *wgu = d[15], *wdn = d[16];
    float *dwgu = d[18], *dwdn = d[19];
    if ((e = kiln_cuda_copy(d[0], choice, (size_t)S * 4, KILN_CUDA_H2D)) ||
        (e = kiln_cuda_copy(d[1], gate, (size_t)S * 4, KILN_CUDA_H2D)) || (e = dev_fill_bf16(in, N * H, 3, 1.0f)) ||
        (e = dev_fill_bf16(wgu, nw, 1, 1.0f / sqrtf((float)H))) || (e = dev_fill_bf16(wdn, nd, 2, 1.0f / sqrtf((float)I))))
        goto done;
    kiln_bench_fill(chk, N * H, 4, 1.0f);
    if ((e = kiln_cuda_copy(dout, chk, (size_t)(N * H) * 4, KILN_CUDA_H2D))) goto done;

    int ref_path = -1, dense_src = -1; /* the reference path's index; whose dense timings are shared */
    for (int p = 0; p < np; p++) {
        moe_gpu_case *c = &cs[p];
        double t0 = 0;
        do { /* one path; `break` leaves it with e set */
        if ((e = kiln_grouped_gemm_set_path(c->path))) break;
        /* one checked call: out and dx (from zero) against the first path's */
        if ((e = kiln_cuda_copy(dx, zeros, (size_t)(N * H) * 4, KILN_CUDA_H2D)) ||
            (e = kiln_experts_forward_cuda(&x, out, in, wgu, wdn, NULL)) ||
            (e = kiln_experts_backward_cuda(&x, dx, dgate, dwgu, dwdn, dout, wgu, wdn, &w, NULL)) ||
            (e = kiln_cuda_sync()))
            break;
        for (int which = 0; which < 2 && !e; which++) {
            float *ref = which ? ref_dx : ref_out;
            float *dst = ref_path >= 0 ? chk : ref;
            if ((e = kiln_cuda_copy(dst, which ? dx : out, (size_t)(N * H) * 4, KILN_CUDA_D2H))) break;
            if (!kiln_bench_all_finite(dst, N * H)) {
                e = kiln_errorf(KILN_EINVAL, "path %s: the experts' %s is not finite", c->path,
                                which ? "input gradient" : "output");
                break;
            }
            const double err = ref_path >= 0 ? rel_diff(chk, ref, N * H) : 0.0;
            if (which) c->dx_err = err;
            else c->out_err = err;
            if (err > PATH_TOL)
                e = kiln_errorf(KILN_EINVAL, "path %s: the experts' %s differs from path %s's by %.3g (max |diff| / "
                                "max |x|; tolerance %g)", c->path, which ? "input gradient" : "output",
                                ref_path >= 0 ? cs[ref_path].path : c->path, err, PATH_TOL);
        }
        if (e) break;
        if (ref_path < 0) ref_path = p;
        c->ref = cs[ref_path].path;

        /* the op, forward */
        for (int i = 0; i < warmup + iters && !e; i++) {
            if (i == warmup) t0 = now_synced(&e);
            if (!e) e = kiln_experts_forward_cuda(&x, out, in, wgu, wdn, NULL);
        }
        c->us[0] = (now_synced(&e) - t0) / iters * 1e6;
        /* forward + backward (gradients accumulate across calls: the values do not matter for timing) */
        for (int i = 0; i < warmup + iters && !e; i++) {
            if (i == warmup) t0 = now_synced(&e);
            if (!e) e = kiln_experts_forward_cuda(&x, out, in, wgu, wdn, NULL);
            if (!e) e = kiln_experts_backward_cuda(&x, dx, dgate, dwgu, dwdn, dout, wgu, wdn, &w, NULL);
        }
        c->us[1] = (now_synced(&e) - t0) / iters * 1e6;
        if (e) break;
        /* one more forward + backward with events around each pass that is not a GEMM */
        if ((e = kiln_experts_profile_cuda(1)) || (e = kiln_experts_forward_cuda(&x, out, in, wgu, wdn, NULL)) ||
            (e = kiln_experts_backward_cuda(&x, dx, dgate, dwgu, dwdn, dout, wgu, wdn, &w, NULL)) ||
            (e = kiln_experts_profile_read_cuda(c->pass_us)) || (e = kiln_experts_profile_cuda(0)))
            break;
        c->slots = x.nslots;
        c->max_rows = 0;
        for (int64_t k = 0; k < E; k++)
            if (off_h[k + 1] - off_h[k] > c->max_rows) c->max_rows = off_h[k + 1] - off_h[k];
        c->flops[0] = kiln_moe_flops_fwd(N, top, H, I);
        c->flops[1] = kiln_moe_flops_fwd_bwd(N, top, H, I);

        /* the six GEMMs alone, on the op's own buffers; the dense ones once per routing */
        const gemm_job jobs[NPART - 2] = {
            {x.gu, 0, x.xe, wgu, 0, 2 * I, H, "NT", 0},   {x.ye, 0, x.act, wdn, 0, H, I, "NT", 0},
            {w.dact, 0, w.dye, wdn, 0, I, H, "NN", 0},    {dwdn, 1, w.dye, x.act, H, I, 0, "TN", 1},
            {w.dxe, 0, w.dgu, wgu, 0, H, 2 * I, "NN", 0}, {dwgu, 1, w.dgu, x.xe, 2 * I, H, 0, "TN", 1},
            {dwdn, 1, w.dye, x.act, H, I, 0, "TN", 0},    {dwgu, 1, w.dgu, x.xe, 2 * I, H, 0, "TN", 0},
        };
        const double fl[NPART - 2] = {4.0 * S * H * I, 2.0 * S * H * I, 2.0 * S * H * I, 2.0 * S * H * I,
                                      4.0 * S * H * I, 4.0 * S * H * I, 2.0 * S * H * I, 4.0 * S * H * I};
        const int measure_dense = dense_src < 0;
        for (int j = 0; j < NPART - 2 && !e; j++) {
            c->flops[2 + j] = fl[j] * (double)x.nslots / (double)S;
            for (int dense = 0; dense < (measure_dense ? 2 : 1) && !e; dense++) {
                for (int i = 0; i < warmup + iters && !e; i++) {
                    if (i == warmup) t0 = now_synced(&e);
                    if (!e) e = job_run(&jobs[j], off_h, E, x.nslots, dense, &c->looped[2 + j]);
                }
                (dense ? c->dense_us : c->us)[2 + j] = (now_synced(&e) - t0) / iters * 1e6;
            }
            if (!measure_dense) c->dense_us[2 + j] = cs[dense_src].dense_us[2 + j];
        }
        if (!e && measure_dense) dense_src = p;
        } while (0);
        if (e) { /* report, leave the path out, go on with the others */
            e = kiln_error_wrap(e, "path %s", c->path);
            kiln_bench_fail("moe", NULL, e);
            e = NULL;
            c->failed = 1;
            (*nfailed)++;
        }
    }
done:
    {
        kiln_error *e2 = kiln_grouped_gemm_set_path(NULL);
        if (e2) kiln_error_free(e2);
    }
    for (int i = 0; i < NBUF; i++) kiln_cuda_free(d[i]);
    free(choice), free(off_h), free(gate), free(chk), free(ref_out), free(ref_dx), free(zeros);
    if (e) e = kiln_error_wrap(e, "moe --device cuda tokens=%lld hidden=%lld inter=%lld experts=%lld top_k=%lld "
                               "routing %s", (long long)N, (long long)H, (long long)I, (long long)E, (long long)top,
                               c0->routing);
    return e;
}

typedef struct {
    const moe_gpu_case *cs;
} moe_gpu_out;

static const char *pass_of(int p) { return p == 0 ? "fwd" : p == 1 ? "fwd_bwd" : p < 4 ? "fwd" : "bwd"; }

static void json_record(cJSON *r, size_t i, const void *ctx) {
    const moe_gpu_case *c = &((const moe_gpu_out *)ctx)->cs[i / NPART];
    const int p = (int)(i % NPART);
    cJSON_AddStringToObject(r, "backend", "cuda");
    cJSON_AddStringToObject(r, "dtype", "bf16");
    cJSON_AddStringToObject(r, "routing", c->routing);
    cJSON_AddStringToObject(r, "path", c->path);
    cJSON_AddBoolToObject(r, "default_path", c->is_default);
    cJSON_AddStringToObject(r, "part", part_names[p]);
    cJSON_AddStringToObject(r, "pass", pass_of(p));
    cJSON_AddNumberToObject(r, "tokens", (double)c->N);
    cJSON_AddNumberToObject(r, "hidden", (double)c->H);
    cJSON_AddNumberToObject(r, "inter", (double)c->I);
    cJSON_AddNumberToObject(r, "experts", (double)c->E);
    cJSON_AddNumberToObject(r, "top_k", (double)c->top);
    cJSON_AddNumberToObject(r, "slots", (double)c->slots);
    cJSON_AddNumberToObject(r, "max_expert_slots", (double)c->max_rows);
    cJSON_AddNumberToObject(r, "flops", c->flops[p]);
    cJSON_AddNumberToObject(r, "time_us", c->us[p]);
    cJSON_AddNumberToObject(r, "tflops", c->flops[p] / (c->us[p] * 1e-6) / 1e12);
    cJSON_AddNumberToObject(r, "tokens_per_s", (double)c->N / (c->us[p] * 1e-6));
    if (p < 2) {
        cJSON_AddNumberToObject(r, "rel_diff_vs_first_path", p ? c->dx_err : c->out_err);
    } else {
        cJSON_AddNumberToObject(r, "dense_time_us", c->dense_us[p]);
        cJSON_AddNumberToObject(r, "dense_tflops", c->flops[p] / (c->dense_us[p] * 1e-6) / 1e12);
        cJSON_AddNumberToObject(r, "ratio_vs_dense", c->dense_us[p] / c->us[p]);
        cJSON_AddBoolToObject(r, "looped", c->looped[p]);
    }
}

static void csv_row(FILE *f, size_t i, const void *ctx) {
    const moe_gpu_case *c = &((const moe_gpu_out *)ctx)->cs[i / NPART];
    const int p = (int)(i % NPART);
    fprintf(f, "cuda,bf16,%s,%s,%d,%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%.17g,%.3f,%.6g,%.6g,", c->routing, c->path,
            c->is_default, part_names[p], pass_of(p), (long long)c->N, (long long)c->H, (long long)c->I,
            (long long)c->E, (long long)c->top, (long long)c->slots, (long long)c->max_rows, c->flops[p], c->us[p],
            c->flops[p] / (c->us[p] * 1e-6) / 1e12, (double)c->N / (c->us[p] * 1e-6));
    if (p >= 2)
        fprintf(f, "%.3f,%.6g,%.4f,%d\n", c->dense_us[p], c->flops[p] / (c->dense_us[p] * 1e-6) / 1e12,
                c->dense_us[p] / c->us[p], c->looped[p]);
    else fprintf(f, ",,,\n");
}

/* the grouped / dense sums of the forward (b = 0) and backward (b = 1) GEMMs */
static void gemm_sums(const moe_gpu_case *c, double g[2], double dn[2], double f[2]) {
    g[0] = g[1] = dn[0] = dn[1] = f[0] = f[1] = 0;
    for (int p = 2; p < NSUM; p++) {
        const int b = p >= 4;
        g[b] += c->us[p], dn[b] += c->dense_us[p], f[b] += c->flops[p];
    }
}

static void print_path(const moe_gpu_case *c, const char *first) {
    printf("\n  path %s%s: output / input gradient vs path %s: %.2g / %.2g\n", c->path, c->is_default ? " (default)" : "",
           c->ref ? c->ref : first, c->out_err, c->dx_err);
    printf("  %-16s %10s %9s %11s\n", "expert op", "ms", "TFLOP/s", "tok/s");
    for (int p = 0; p < 2; p++)
        printf("  %-16s %10.3f %9.1f %11.4g\n", p ? "fwd+bwd" : "fwd", c->us[p] / 1e3,
               c->flops[p] / (c->us[p] * 1e-6) / 1e12, (double)c->N / (c->us[p] * 1e-6));
    printf("  %-16s %10s %9s | %10s %9s | %6s\n", "GEMM", "grouped ms", "TFLOP/s", "dense ms", "TFLOP/s", "ratio");
    for (int p = 2; p < NPART; p++) {
        const double gt = c->flops[p] / (c->us[p] * 1e-6) / 1e12, dt = c->flops[p] / (c->dense_us[p] * 1e-6) / 1e12;
        printf("  %-16s %10.3f %9.1f | %10.3f %9.1f | %6.2f%s\n", part_names[p], c->us[p] / 1e3, gt,
               c->dense_us[p] / 1e3, dt, gt / dt, c->looped[p] ? "  (one GEMM per expert)" : "");
    }
    double g[2], dn[2], f[2];
    gemm_sums(c, g, dn, f);
    for (int b = 0; b < 2; b++) {
        const double gt = f[b] / (g[b] * 1e-6) / 1e12, dt = f[b] / (dn[b] * 1e-6) / 1e12;
        printf("  %-16s %10.3f %9.1f | %10.3f %9.1f | %6.2f\n", b ? "all bwd" : "all fwd", g[b] / 1e3, gt, dn[b] / 1e3,
               dt, gt / dt);
    }
    /* the passes that are not GEMMs (one profiled call): the bytes each must move at least (bf16 activations, f32
     * out/dout/dx; dx written, as the trainer's backward), their rate */
    static const char *const pass_names[KILN_EXPERTS_NPASS] = {"dispatch", "gather", "swiglu fwd", "gated sum",
                                                               "dye + dgate", "swiglu bwd", "dx sum"};
    const double S = (double)c->slots, N = (double)c->N, H = (double)c->H, I = (double)c->I;
    const double bytes[KILN_EXPERTS_NPASS] = {16 * S, 4 * S * H, 6 * S * I, 2 * S * H + 4 * N * H, 8 * S * H, 10 * S * I,
                                              2 * S * H + 4 * N * H};
    double tot_us = 0, tot_b = 0;
    printf("  %-16s %10s %9s %9s   (one profiled fwd + bwd; the op's other time is GEMMs and host waits)\n", "pass", "us",
           "MB", "GB/s");
    for (int p = 0; p < KILN_EXPERTS_NPASS; p++) {
        if (c->pass_us[p] < 0) continue;
        tot_us += c->pass_us[p], tot_b += bytes[p];
        printf("  %-16s %10.1f %9.1f %9.0f\n", pass_names[p], c->pass_us[p], bytes[p] / 1e6,
               bytes[p] / (c->pass_us[p] * 1e-6) / 1e9);
    }
    printf("  %-16s %10.1f %9.1f %9.0f\n", "all passes", tot_us, tot_b / 1e6, tot_us > 0 ? tot_b / (tot_us * 1e-6) / 1e9 : 0.0);
}

int kiln_bench_moe_gpu(int argc, char **argv) {
    long long hidden = 2048, inter = 2048, experts = 16, top = 1, tokens = 16384, iters = 20, warmup = 3;
    const char *routing = "balanced,skewed", *paths = "all", *json_path = NULL, *csv_path = NULL;
    static const char *const valued[] = {"--device", "--hidden", "--inter", "--experts", "--top-k", "--tokens",
                                         "--routing", "--paths", "--iters", "--warmup", "--json",   "--csv", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a, *v;
        int r = kiln_bench_flag(argc, argv, &i, "moe", usage, valued, &a, &v);
        if (r >= 0) return r;
        if (!strcmp(a, "--device")) continue; /* cuda: the caller checked */
        if (!strcmp(a, "--routing")) routing = v;
        else if (!strcmp(a, "--paths")) paths = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--csv")) csv_path = v;
        else {
            long long x;
            if ((r = kiln_bench_parse_int("moe", a, v, !strcmp(a, "--warmup") ? 0 : 1,
                                          !strcmp(a, "--iters") || !strcmp(a, "--warmup") ? 10000 : (1LL << 24), &x)) >= 0)
                return r;
            if (!strcmp(a, "--hidden")) hidden = x;
            else if (!strcmp(a, "--inter")) inter = x;
            else if (!strcmp(a, "--experts")) experts = x;
            else if (!strcmp(a, "--top-k")) top = x;
            else if (!strcmp(a, "--tokens")) tokens = x;
            else if (!strcmp(a, "--iters")) iters = x;
            else warmup = x;
        }
    }
    if (top > experts) return kiln_bench_usage_err("moe", "--top-k %lld exceeds --experts %lld", top, experts);
    if (kiln_bench_check_outputs("moe", json_path, csv_path)) return 1;
    if (experts > 8192) return kiln_bench_usage_err("moe", "--experts %lld: at most 8192 on the GPU", experts);
    if ((double)tokens * (double)top > (double)INT32_MAX)
        return kiln_bench_usage_err("moe", "--tokens %lld x --top-k %lld: more than 2^31-1 routed slots", tokens, top);
    const char *routings[3], *plist[MAX_PATHS], *def_path = NULL;
    int nr = 0, npath = 0;
    {
        kiln_error *pe = kiln_grouped_gemm_path(&def_path);
        if (pe) {
            kiln_bench_fail("moe", "--paths", pe);
            return 2;
        }
    }
    {
        char buf[128];
        if (strlen(routing) >= sizeof buf) return kiln_bench_usage_err("moe", "--routing '%s': too long", routing);
        strcpy(buf, routing);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            static const char *const known_r[3] = {"balanced", "skewed", "concentrated"};
            const char *kr = NULL;
            for (int q = 0; q < 3 && !kr; q++)
                if (!strcmp(t, known_r[q])) kr = known_r[q];
            if (!kr)
                return kiln_bench_usage_err("moe", "--routing '%s': expected balanced, skewed and/or concentrated",
                                            routing);
            for (int q = 0; q < nr; q++)
                if (routings[q] == kr) return kiln_bench_usage_err("moe", "--routing '%s': each at most once", routing);
            routings[nr++] = kr;
        }
        if (!nr)
            return kiln_bench_usage_err("moe", "--routing '%s': expected balanced, skewed and/or concentrated", routing);
        if (strlen(paths) >= sizeof buf) return kiln_bench_usage_err("moe", "--paths '%s': too long", paths);
        strcpy(buf, paths);
        const char *const *known = kiln_grouped_gemm_paths();
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            const char *one[2] = {NULL, NULL};
            const char *const *add = one;
            if (!strcmp(t, "all")) add = known;
            else if (!strcmp(t, "default")) one[0] = def_path;
            else {
                for (int k = 0; known[k] && !one[0]; k++)
                    if (!strcmp(known[k], t)) one[0] = known[k];
                if (!one[0])
                    return kiln_bench_usage_err("moe", "--paths '%s': '%s' is not a path (grouped, lt_loop, lt_chunks, "
                                                "lt_streams, lt_mixed, default, all)", paths, t);
            }
            for (int k = 0; add[k]; k++) {
                int dup = 0;
                for (int q = 0; q < npath; q++) dup |= !strcmp(plist[q], add[k]);
                if (dup) continue;
                if (npath == MAX_PATHS) return kiln_bench_usage_err("moe", "--paths '%s': too many", paths);
                plist[npath++] = add[k];
            }
        }
        if (!npath) return kiln_bench_usage_err("moe", "--paths '%s': no path", paths);
    }
    moe_gpu_case *cs = calloc((size_t)(nr * npath), sizeof *cs);
    if (!cs) return kiln_bench_usage_err("moe", "out of memory");
    for (int i = 0; i < nr * npath; i++) {
        moe_gpu_case *c = &cs[i];
        c->routing = routings[i / npath], c->path = plist[i % npath], c->is_default = !strcmp(c->path, def_path);
        c->N = tokens, c->H = hidden, c->I = inter, c->E = experts, c->top = top;
    }
    kiln_cuda_info gi;
    kiln_error *e = kiln_cuda_device_info(&gi);
    if (e) {
        kiln_bench_fail("moe", "--device cuda", e);
        free(cs);
        return 1;
    }
    printf("kiln bench moe --device cuda: %s; bf16, f32 accumulation; %lld iterations after %lld warm-up\n", gi.name,
           iters, warmup);
    printf("tokens %lld, hidden %lld, inter %lld, experts %lld, top_k %lld; TFLOP/s: forward "
           "6*tokens*top_k*hidden*inter, fwd+bwd 3 x forward; default grouped-GEMM path: %s\n",
           tokens, hidden, inter, experts, top, def_path);
    int rc = 0, ndone = 0, nfailed = 0;
    for (int ri = 0; ri < nr; ri++) {
        moe_gpu_case *c = &cs[ri * npath];
        if ((e = run_routing(c, npath, (int)iters, (int)warmup, &nfailed))) {
            kiln_bench_fail("moe", NULL, e);
            rc = 1;
            break;
        }
        ndone += npath;
        const moe_gpu_case *h = c; /* the first path that ran knows the routing's counts */
        for (int p = npath - 1; p >= 0; p--)
            if (!c[p].failed) h = &c[p];
        printf("\n%s routing: %lld slots, busiest expert %lld (mean %.0f)\n", c->routing, (long long)h->slots,
               (long long)h->max_rows, (double)h->slots / (double)c->E);
        for (int p = 0; p < npath; p++)
            if (!c[p].failed) print_path(&c[p], c[0].path);
        printf("\n  %-12s %9s %12s %14s %14s   (%s routing; ratio = dense time / grouped time)\n", "path", "op fwd ms",
               "op f+b ms", "GEMMs fwd", "GEMMs bwd", c->routing);
        for (int p = 0; p < npath; p++) {
            if (c[p].failed) {
                printf("  %-12s FAILED (the error is above)\n", c[p].path);
                continue;
            }
            double g[2], dn[2], f[2];
            gemm_sums(&c[p], g, dn, f);
            printf("  %-12s %9.3f %12.3f %8.3f ms %4.2fx %8.3f ms %4.2fx%s\n", c[p].path, c[p].us[0] / 1e3,
                   c[p].us[1] / 1e3, g[0] / 1e3, dn[0] / g[0], g[1] / 1e3, dn[1] / g[1],
                   c[p].is_default ? "  (default)" : "");
        }
        fflush(stdout);
    }
    if (nfailed) rc = 1;
    /* the files hold the paths that ran */
    int nok = 0;
    for (int i = 0; i < ndone; i++)
        if (!cs[i].failed) cs[nok++] = cs[i];
    moe_gpu_out o = {cs};
    const kiln_bench_output out = {"moe", (size_t)nok * NPART, &o, json_record, NULL,
                                   "backend,dtype,routing,path,default_path,part,pass,tokens,hidden,inter,experts,top_k,"
                                   "slots,max_expert_slots,flops,time_us,tflops,tokens_per_s,dense_time_us,dense_tflops,"
                                   "ratio_vs_dense,looped\n",
                                   csv_row};
    {
        const int wrc = kiln_bench_write_outputs(&out, json_path, csv_path);
        if (wrc) rc = wrc;
    }
    free(cs);
    return rc;
}
#endif
