/* kiln bench linear --device cuda: the CUDA trainer's "other linears" backward of one ZAYA layer (the calls of
 * layer_backward in src/models/zaya_cuda.c, in its order and shapes: router out/fc2/fc1/down, o_proj, v
 * current/delayed, q, k) through kiln_linear_backward_ex_cuda, each call timed under KILN_LINEAR_BWD=old and
 * =new in the same process, whole and by part (dX, dW, db alone), beside its ideal time: FLOPs at
 * --tflops and the bytes it must move at --tbps, whichever is larger. The outputs of the two paths are
 * compared (max |new - old| / max |old|). Time is wall clock around --iters calls after a device sync (the
 * host work each call needs included, as the trainer pays it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kiln/bench.h"
#include "kiln/cuda.h"

#ifndef KILN_HAVE_CUDA
int kiln_bench_linear_main(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "kiln bench linear: error: this kiln was built without CUDA (the benchmark is --device cuda only)\n");
    return 2;
}
#else
#include "kiln/cuda_ops.h"

static const char usage[] =
    "usage: kiln bench linear --device cuda [options]\n\n"
    "The CUDA trainer's linear-layer backward of one ZAYA layer (kiln_linear_backward_ex_cuda, the calls and\n"
    "shapes of layer_backward), each call under KILN_LINEAR_BWD=old and =new (src/cuda/linear.cu): whole, and\n"
    "dX / dW / db alone, against its ideal time (max of FLOPs / --tflops and bytes / --tbps). Defaults: the\n"
    "[cuda] benchmark config (16384 tokens, hidden 2048, 8 query / 2 KV heads of 128, router 256, 16 experts,\n"
    "no attention biases).\n\n"
    "  --tokens N        rows per call (default 16384)\n"
    "  --hidden N        (default 2048)\n"
    "  --q N             query width, heads x head_dim (default 1024)\n"
    "  --kv N            key width (default 256; each value half kv/2)\n"
    "  --router N        router hidden (default 256)\n"
    "  --classes N       router classes, experts + 1 (default 17)\n"
    "  --attn-bias 0|1   q/k/v/o biases (default 0)\n"
    "  --layers N        layers, for the per-step total (default 8)\n"
    "  --iters N         timed calls (default 20)\n"
    "  --warmup N        untimed calls first (default 3)\n"
    "  --tflops X        the ideal's math rate (default 700)\n"
    "  --tbps X          the ideal's memory rate, TB/s (default 3.5)\n";

typedef struct {
    const char *name;
    int64_t in, out;
    int bias, dx; /* dx: 0 none, 1 written (KILN_LINEAR_DX_WRITE), 2 added */
    int f32_dx;   /* r_down's dX: kiln_gemm_bf16_cuda into the f32 dln2f, accumulated (a GEMM alone) */
} lin;

enum { PART_ALL, PART_DX, PART_DW, PART_DB, NPARTS };
static const char *const part_names[NPARTS] = {"all", "dX", "dW", "db"};

static double now_synced(kiln_error **e) {
    if (!*e) *e = kiln_cuda_sync();
    return kiln_bench_now_s();
}

static kiln_error *dev_fill_bf16(kiln_bf16 *d, int64_t n, uint32_t salt, float scale, float *tmp) {
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) return kiln_errorf(KILN_ENOMEM, "%lld values", (long long)n);
    kiln_bench_fill(h, n, salt, scale);
    kiln_error *e = kiln_cuda_copy(tmp, h, (size_t)n * sizeof *h, KILN_CUDA_H2D);
    if (!e) e = kiln_f32_to_bf16_cuda(d, tmp, n, NULL);
    if (!e) e = kiln_cuda_sync();
    free(h);
    return e;
}

typedef struct {
    kiln_bf16 *dx, *dy, *x, *w;
    float *dw, *db, *dxf;
} bufs;

static kiln_error *call(const lin *l, const bufs *b, int64_t n, int part) {
    if (l->f32_dx) return part == PART_ALL || part == PART_DX
                              ? kiln_gemm_bf16_cuda(b->dxf, 1, b->dy, b->w, n, l->in, l->out, "NN", 1, NULL)
                              : NULL;
    kiln_bf16 *dx = l->dx && (part == PART_ALL || part == PART_DX) ? b->dx : NULL;
    float *dw = part == PART_ALL || part == PART_DW ? b->dw : NULL;
    float *db = l->bias && (part == PART_ALL || part == PART_DB) ? b->db : NULL;
    if (!dx && !dw && !db) return NULL;
    return kiln_linear_backward_ex_cuda(dx, dw, db, b->dy, b->x, b->w, n, l->in, l->out,
                                        l->dx == 1 ? KILN_LINEAR_DX_WRITE : 0, NULL);
}

/* the ideal of one part: FLOPs at tflops, or the bytes it must move (operands read once, outputs written,
 * accumulated outputs read too) at tbps */
static double ideal_us(const lin *l, int64_t n, int part, double tflops, double tbps) {
    const double N = (double)n, I = (double)l->in, O = (double)l->out;
    double fl = 0, by = 0;
    if (l->f32_dx) {
        if (part != PART_ALL && part != PART_DX) return 0;
        fl = 2 * N * I * O, by = N * O * 2 + O * I * 2 + N * I * 8;
    } else {
        const int dx = l->dx && (part == PART_ALL || part == PART_DX), dw = part == PART_ALL || part == PART_DW;
        const int db = l->bias && (part == PART_ALL || part == PART_DB);
        if (dx) fl += 2 * N * I * O, by += N * O * 2 + O * I * 2 + N * I * (l->dx == 1 ? 2 : 4);
        if (dw) fl += 2 * N * I * O, by += N * O * 2 + N * I * 2 + O * I * 8;
        if (db) by += N * O * 2 + O * 8;
        if (dx && dw) by -= N * O * 2; /* dy read once would do */
    }
    const double t_math = fl / (tflops * 1e12), t_mem = by / (tbps * 1e12);
    return (t_math > t_mem ? t_math : t_mem) * 1e6;
}

static double rel_diff(const float *x, const float *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        const double a = fabs((double)x[i] - (double)ref[i]), c = fabs((double)ref[i]);
        if (a > d) d = a;
        if (c > r) r = c;
    }
    return r > 0 ? d / r : d;
}

/* the outputs of one whole call from fixed starting values, to the host (dx as f32) */
static kiln_error *outputs(const lin *l, const bufs *b, int64_t n, float *h_dx, float *h_dw, float *h_db, float *zeros,
                           float *tmp) {
    kiln_error *e = NULL;
    const int64_t nx = n * l->in, nw = l->out * l->in;
    if ((e = kiln_cuda_copy(b->dw, zeros, (size_t)nw * 4, KILN_CUDA_H2D)) ||
        (e = kiln_cuda_copy(b->db, zeros, (size_t)l->out * 4, KILN_CUDA_H2D)) ||
        (e = kiln_cuda_copy(tmp, zeros, (size_t)nx * 4, KILN_CUDA_H2D)) ||
        (e = kiln_f32_to_bf16_cuda(b->dx, tmp, nx, NULL)) || (e = kiln_cuda_copy(b->dxf, zeros, (size_t)nx * 4, KILN_CUDA_H2D)))
        return e;
    if ((e = call(l, b, n, PART_ALL)) || (e = kiln_cuda_sync())) return e;
    if (l->f32_dx) e = kiln_cuda_copy(h_dx, b->dxf, (size_t)nx * 4, KILN_CUDA_D2H);
    else if (!(e = kiln_bf16_to_f32_cuda(tmp, b->dx, nx, NULL)) && !(e = kiln_cuda_sync()))
        e = kiln_cuda_copy(h_dx, tmp, (size_t)nx * 4, KILN_CUDA_D2H);
    if (!e) e = kiln_cuda_copy(h_dw, b->dw, (size_t)nw * 4, KILN_CUDA_D2H);
    if (!e) e = kiln_cuda_copy(h_db, b->db, (size_t)l->out * 4, KILN_CUDA_D2H);
    return e;
}

int kiln_bench_linear_main(int argc, char **argv) {
    static const char *const valued[] = {"--device", "--tokens", "--hidden", "--q",     "--kv",    "--router",
                                         "--classes", "--attn-bias", "--layers", "--iters", "--warmup", "--tflops",
                                         "--tbps",   NULL};
    long long N = 16384, H = 2048, Q = 1024, K = 256, R = 256, E1 = 17, ab = 0, layers = 8, iters = 20, warmup = 3;
    double tflops = 700, tbps = 3.5;
    int device_cuda = 0;
    for (int i = 1; i < argc; i++) {
        const char *a, *v;
        int rc = kiln_bench_flag(argc, argv, &i, "linear", usage, valued, &a, &v);
        if (rc >= 0) return rc;
        if (!strcmp(a, "--device")) {
            if (strcmp(v, "cuda")) return kiln_bench_usage_err("linear", "--device '%s': only cuda", v);
            device_cuda = 1;
            continue;
        }
        if (!strcmp(a, "--tflops") || !strcmp(a, "--tbps")) {
            char *end = NULL;
            const double x = strtod(v, &end);
            if (!end || *end || !(x > 0)) return kiln_bench_usage_err("linear", "%s '%s': expected a positive number", a, v);
            *(!strcmp(a, "--tflops") ? &tflops : &tbps) = x;
            continue;
        }
        long long *dst = !strcmp(a, "--tokens") ? &N : !strcmp(a, "--hidden") ? &H : !strcmp(a, "--q") ? &Q
                         : !strcmp(a, "--kv") ? &K : !strcmp(a, "--router") ? &R : !strcmp(a, "--classes") ? &E1
                         : !strcmp(a, "--attn-bias") ? &ab : !strcmp(a, "--layers") ? &layers
                         : !strcmp(a, "--iters") ? &iters : &warmup;
        const long long lo = dst == &ab || dst == &warmup ? 0 : dst == &K ? 2 : 1, hi = dst == &ab ? 1 : 1 << 24;
        rc = kiln_bench_parse_int("linear", a, v, lo, hi, dst);
        if (rc >= 0) return rc;
    }
    if (!device_cuda) return kiln_bench_usage_err("linear", "--device cuda is required (the benchmark is the GPU's)");
    const lin ls[] = {
        {"router out", R, E1, 0, 1, 0},  {"router fc2", R, R, 1, 1, 0},         {"router fc1", R, R, 1, 1, 0},
        {"router down dX (f32 +=)", H, R, 0, 0, 1},                               {"router down", H, R, 1, 0, 0},
        {"o_proj", Q, H, (int)ab, 1, 0}, {"v current", H, K / 2, (int)ab, 1, 0}, {"v delayed", H, K / 2, (int)ab, 2, 0},
        {"q", H, Q, (int)ab, 2, 0},      {"k", H, K, (int)ab, 2, 0},
    };
    const int nl = (int)(sizeof ls / sizeof ls[0]);
    int64_t maxx = 0, maxw = 0, maxo = 0;
    for (int i = 0; i < nl; i++) {
        const lin *l = &ls[i];
        if (N * l->in > maxx) maxx = N * l->in;
        if (N * l->out > maxo) maxo = N * l->out;
        if (l->in * l->out > maxw) maxw = l->in * l->out;
    }
    kiln_error *e = NULL;
    bufs b = {0};
    float *tmp = NULL, *zeros = calloc((size_t)(maxx > maxo ? maxx : maxo), sizeof(float));
    float *h[2][3] = {{0}};
    for (int p = 0; p < 2; p++)
        for (int j = 0; j < 3; j++) h[p][j] = malloc((size_t)(j == 0 ? maxx : j == 1 ? maxw : maxo) * sizeof(float));
    double us[64][2][NPARTS] = {{{0}}};
    double diff[64][3] = {{0}};
    if (!zeros || nl > 64) {
        kiln_bench_fail("linear", NULL, kiln_errorf(KILN_ENOMEM, "host buffers"));
        return 1;
    }
    if ((e = kiln_cuda_alloc((void **)&b.dx, (size_t)maxx * 2)) || (e = kiln_cuda_alloc((void **)&b.x, (size_t)maxx * 2)) ||
        (e = kiln_cuda_alloc((void **)&b.dy, (size_t)maxo * 2)) || (e = kiln_cuda_alloc((void **)&b.w, (size_t)maxw * 2)) ||
        (e = kiln_cuda_alloc((void **)&b.dw, (size_t)maxw * 4)) || (e = kiln_cuda_alloc((void **)&b.db, (size_t)maxo * 4)) ||
        (e = kiln_cuda_alloc((void **)&b.dxf, (size_t)maxx * 4)) ||
        (e = kiln_cuda_alloc((void **)&tmp, (size_t)(maxx > maxo ? maxx : maxo) * 4)) ||
        (e = dev_fill_bf16(b.x, maxx, 1, 1.0f, tmp)) || (e = dev_fill_bf16(b.dy, maxo, 2, 1.0f, tmp)) ||
        (e = dev_fill_bf16(b.w, maxw, 3, 0.05f, tmp)))
        goto done;
    for (int i = 0; i < nl && !e; i++) {
        const lin *l = &ls[i];
        for (int p = 0; p < 2 && !e; p++) {
            if (setenv("KILN_LINEAR_BWD", p ? "new" : "old", 1)) {
                e = kiln_errorf(KILN_EIO, "setenv KILN_LINEAR_BWD");
                break;
            }
            if ((e = outputs(l, &b, N, h[p][0], h[p][1], h[p][2], zeros, tmp))) break;
            for (int part = 0; part < NPARTS && !e; part++) {
                double t0 = 0;
                for (long long it = 0; it < warmup + iters && !e; it++) {
                    if (it == warmup) t0 = now_synced(&e);
                    if (!e) e = call(l, &b, N, part);
                }
                us[i][p][part] = (now_synced(&e) - t0) / (double)iters * 1e6;
            }
        }
        if (!e) {
            diff[i][0] = rel_diff(h[1][0], h[0][0], N * l->in);
            diff[i][1] = rel_diff(h[1][1], h[0][1], l->in * l->out);
            diff[i][2] = l->bias ? rel_diff(h[1][2], h[0][2], l->out) : 0;
        }
    }
    unsetenv("KILN_LINEAR_BWD");
    if (e) goto done;
    printf("# kiln bench linear --device cuda: one layer's linear backward, %lld tokens, hidden %lld, q %lld, kv %lld, "
           "router %lld x %lld classes, attention biases %lld; µs per call (old = KILN_LINEAR_BWD=old, new = the default); "
           "ideal: max(FLOPs at %.0f TFLOP/s, bytes at %.2f TB/s)\n",
           N, H, Q, K, R, E1, ab, tflops, tbps);
    printf("%-24s %6s %6s %4s %5s |", "call", "in", "out", "bias", "dx");
    for (int part = 0; part < NPARTS; part++) printf(" %-5s old / new / ideal     |", part_names[part]);
    printf(" new vs old: dx dw db (max rel diff)\n");
    double tot[2][NPARTS] = {{0}}, tot_ideal[NPARTS] = {0};
    for (int i = 0; i < nl; i++) {
        const lin *l = &ls[i];
        printf("%-24s %6lld %6lld %4d %5s |", l->name, (long long)l->in, (long long)l->out, l->bias,
               l->f32_dx ? "f32+=" : l->dx == 1 ? "=" : l->dx == 2 ? "+=" : "-");
        for (int part = 0; part < NPARTS; part++) {
            const double id = ideal_us(l, N, part, tflops, tbps);
            printf(" %7.1f / %7.1f / %6.1f |", us[i][0][part], us[i][1][part], id);
            tot[0][part] += us[i][0][part], tot[1][part] += us[i][1][part], tot_ideal[part] += id;
        }
        printf(" %.2g %.2g %.2g\n", diff[i][0], diff[i][1], diff[i][2]);
    }
    printf("%-24s %6s %6s %4s %5s |", "layer total", "", "", "", "");
    for (int part = 0; part < NPARTS; part++) printf(" %7.1f / %7.1f / %6.1f |", tot[0][part], tot[1][part], tot_ideal[part]);
    printf("\n%-24s %6s %6s %4s %5s |", "x layers (ms)", "", "", "", "");
    for (int part = 0; part < NPARTS; part++)
        printf(" %7.2f / %7.2f / %6.2f |", tot[0][part] * layers / 1e3, tot[1][part] * layers / 1e3,
               tot_ideal[part] * layers / 1e3);
    printf("\n");
done:
    unsetenv("KILN_LINEAR_BWD");
    kiln_cuda_free(b.dx), kiln_cuda_free(b.x), kiln_cuda_free(b.dy), kiln_cuda_free(b.w), kiln_cuda_free(b.dw);
    kiln_cuda_free(b.db), kiln_cuda_free(b.dxf), kiln_cuda_free(tmp);
    for (int p = 0; p < 2; p++)
        for (int j = 0; j < 3; j++) free(h[p][j]);
    free(zeros);
    if (e) {
        kiln_bench_fail("linear", NULL, e);
        return 1;
    }
    return 0;
}
#endif
