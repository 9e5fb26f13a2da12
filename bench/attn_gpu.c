/* kiln_bench_attn_gpu: time and TFLOP/s of the CUDA attention kernels (src/cuda/attention*.cu) on the
 * GPU machine, forward (with the logsumexp saved, as in training), backward, and both.
 *
 *   kiln_bench_attn_gpu [--shape B,T,H,KV,D,WINDOW]... [--iters N] [--warmup N] [--generic] [--json FILE]
 *
 * Default shape: the [cuda] benchmark's attention, B=4 T=4096 8 query / 2 KV heads of 128, causal.
 * FLOPs as `kiln bench attention` counts them (src/bench/kernel_formulas.h): forward 4·B·H·D·(visible
 * pairs), backward 2.5x that; the torch peer (bench/peers/torch_attn.py) uses the same formula, so the
 * ratio of TFLOP/s is the ratio of times. Timed with a device sync around `iters` back-to-back calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kernel_formulas.h"
#include "kiln/cuda.h"
#include "kiln/cuda_ops.h"
#include "kiln/dtype.h"
#include "kiln/fsutil.h"
#include "kiln/progress.h"

#define MAX_SHAPES 32

typedef struct {
    int64_t B, T, H, KV, D, W;
    double us[3]; /* forward, backward, forward + backward */
} shape;

static kiln_error *upload_random(kiln_bf16 **d, int64_t n, uint32_t salt, float scale) {
    float *x = malloc((size_t)n * sizeof *x);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    kiln_error *e = NULL;
    if (!x || !h) {
        e = kiln_errorf(KILN_ENOMEM, "attention bench: cannot allocate %lld host values", (long long)n);
        goto done;
    }
    kiln_bench_fill(x, n, salt, scale);
    for (int64_t i = 0; i < n; i++) h[i] = kiln_f32_to_bf16(x[i]);
    if ((e = kiln_cuda_alloc((void **)d, (size_t)n * 2))) goto done;
    e = kiln_cuda_copy(*d, h, (size_t)n * 2, KILN_CUDA_H2D);
done:
    free(x), free(h);
    return e;
}

static kiln_error *run_shape(shape *c, int iters, int warmup) {
    const int64_t nq = c->B * c->T * c->H * c->D, nk = c->B * c->T * c->KV * c->D;
    kiln_attn_shape s = {c->B, c->T, c->T, c->T, c->H, c->KV, c->D, c->W, 1.0f / sqrtf((float)c->D)};
    kiln_bf16 *q = NULL, *k = NULL, *v = NULL, *dout = NULL, *out = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    float *lse = NULL;
    void *work = NULL;
    kiln_error *e = NULL;
    if ((e = upload_random(&q, nq, 1, 2.0f)) || (e = upload_random(&k, nk, 2, 2.0f)) ||
        (e = upload_random(&v, nk, 3, 1.0f)) || (e = upload_random(&dout, nq, 4, 1.0f)))
        goto done;
    if ((e = kiln_cuda_alloc((void **)&out, (size_t)nq * 2)) || (e = kiln_cuda_alloc((void **)&dq, (size_t)nq * 2)) ||
        (e = kiln_cuda_alloc((void **)&dk, (size_t)nk * 2)) || (e = kiln_cuda_alloc((void **)&dv, (size_t)nk * 2)) ||
        (e = kiln_cuda_alloc((void **)&lse, (size_t)(c->B * c->H * c->T) * sizeof(float))) ||
        (e = kiln_cuda_alloc(&work, kiln_attention_backward_cuda_work(&s))))
        goto done;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = 0;
        for (int i = 0; i < warmup + iters; i++) {
            if (i == warmup) {
                if ((e = kiln_cuda_sync())) goto done;
                t0 = kiln_bench_now_s();
            }
            if (pass != 1 && (e = kiln_attention_forward_cuda(out, lse, q, k, v, &s, NULL))) goto done;
            if (pass != 0 &&
                (e = kiln_attention_backward_cuda(dq, dk, dv, dout, out, lse, q, k, v, &s, work, NULL)))
                goto done;
            if (i == 0 && pass == 0 && (e = kiln_cuda_sync())) goto done; /* a failing kernel shows up here */
        }
        if ((e = kiln_cuda_sync())) goto done;
        c->us[pass] = (kiln_bench_now_s() - t0) / iters * 1e6;
    }
done:
    kiln_cuda_free(q), kiln_cuda_free(k), kiln_cuda_free(v), kiln_cuda_free(dout), kiln_cuda_free(out);
    kiln_cuda_free(dq), kiln_cuda_free(dk), kiln_cuda_free(dv), kiln_cuda_free(lse), kiln_cuda_free(work);
    return e;
}

static double tflops(const shape *c, int pass) {
    double f = kiln_attn_flops_fwd(c->B, c->H, c->D, c->T, c->W);
    double mult = pass == 0 ? 1.0 : pass == 1 ? KILN_ATTN_BWD_FACTOR : KILN_ATTN_FWD_BWD_FACTOR;
    return f * mult / (c->us[pass] * 1e-6) / 1e12;
}

static int usage(void) {
    fprintf(stderr, "usage: kiln_bench_attn_gpu [--shape B,T,H,KV,D,WINDOW]... [--iters N] [--warmup N] "
                    "[--generic] [--json FILE]\n");
    return 2;
}

int main(int argc, char **argv) {
    shape shapes[MAX_SHAPES];
    int n = 0, iters = 20, warmup = 3;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            shape c = {0};
            long long v[6];
            if (n == MAX_SHAPES ||
                sscanf(argv[++i], "%lld,%lld,%lld,%lld,%lld,%lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) {
                fprintf(stderr, "kiln_bench_attn_gpu: --shape wants B,T,H,KV,D,WINDOW (at most %d shapes), got '%s'\n",
                        MAX_SHAPES, argv[i]);
                return 2;
            }
            c.B = v[0], c.T = v[1], c.H = v[2], c.KV = v[3], c.D = v[4], c.W = v[5];
            shapes[n++] = c;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
            warmup = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--generic")) {
            setenv("KILN_ATTN_GENERIC", "1", 1);
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json = argv[++i];
        } else {
            return usage();
        }
    }
    if (iters < 1 || warmup < 0) return usage();
    if (n == 0) shapes[n++] = (shape){4, 4096, 8, 2, 128, 0, {0}};

    kiln_progress p;
    kiln_progress_start(&p, "attention", n, "shape");
    for (int i = 0; i < n; i++) {
        kiln_error *e = run_shape(&shapes[i], iters, warmup);
        if (e) {
            kiln_progress_finish(&p);
            fprintf(stderr, "kiln_bench_attn_gpu: B=%lld T=%lld H=%lld KV=%lld D=%lld window=%lld: %s\n",
                    (long long)shapes[i].B, (long long)shapes[i].T, (long long)shapes[i].H, (long long)shapes[i].KV,
                    (long long)shapes[i].D, (long long)shapes[i].W, kiln_error_msg(e));
            kiln_error_free(e);
            return 1;
        }
        kiln_progress_update(&p, i + 1);
    }
    kiln_progress_finish(&p);

    printf("# kiln CUDA attention (%s path), bf16, mean of %d calls\n",
           getenv("KILN_ATTN_GENERIC") ? "generic" : "default", iters);
    printf("%3s %6s %3s %3s %4s %6s %10s %9s %10s %9s %10s %9s\n", "B", "T", "H", "KV", "D", "window", "fwd ms",
           "TFLOP/s", "bwd ms", "TFLOP/s", "f+b ms", "TFLOP/s");
    for (int i = 0; i < n; i++) {
        const shape *c = &shapes[i];
        printf("%3lld %6lld %3lld %3lld %4lld %6lld %10.3f %9.1f %10.3f %9.1f %10.3f %9.1f\n", (long long)c->B,
               (long long)c->T, (long long)c->H, (long long)c->KV, (long long)c->D, (long long)c->W, c->us[0] / 1e3,
               tflops(c, 0), c->us[1] / 1e3, tflops(c, 1), c->us[2] / 1e3, tflops(c, 2));
    }
    if (json) {
        size_t cap = 256 + (size_t)n * 400, len = 0;
        char *buf = malloc(cap);
        len += (size_t)snprintf(buf + len, cap - len, "{\"path\": \"%s\", \"iters\": %d, \"attention\": [",
                                getenv("KILN_ATTN_GENERIC") ? "generic" : "default", iters);
        for (int i = 0; i < n; i++) {
            const shape *c = &shapes[i];
            len += (size_t)snprintf(buf + len, cap - len,
                                    "%s\n  {\"B\": %lld, \"T\": %lld, \"H\": %lld, \"KV\": %lld, \"D\": %lld, "
                                    "\"window\": %lld, \"fwd_us\": %.2f, \"bwd_us\": %.2f, \"fwd_bwd_us\": %.2f, "
                                    "\"fwd_tflops\": %.2f, \"bwd_tflops\": %.2f, \"fwd_bwd_tflops\": %.2f}",
                                    i ? "," : "", (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->KV,
                                    (long long)c->D, (long long)c->W, c->us[0], c->us[1], c->us[2], tflops(c, 0),
                                    tflops(c, 1), tflops(c, 2));
        }
        len += (size_t)snprintf(buf + len, cap - len, "\n]}\n");
        kiln_error *e = kiln_write_file_atomic(json, buf, len);
        free(buf);
        if (e) {
            fprintf(stderr, "kiln_bench_attn_gpu: %s\n", kiln_error_msg(e));
            kiln_error_free(e);
            return 1;
        }
    }
    return 0;
}
