/* kiln bench attention --device cuda: the CUDA attention kernels (src/cuda/attention*.cu) timed as the
 * CPU path times the reference: forward, then forward + backward, bf16 tensors on GPU 0, each pass
 * bracketed by device syncs around `iters` back-to-back calls. */
#include "attention_gpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kiln/cuda.h"
#include "kiln/dtype.h"

#ifdef KILN_HAVE_CUDA
#include "kiln/cuda_attention.h"
#include "kiln/cuda_ops.h"

/* n deterministic values in [-scale, scale) as bf16 on the device */
static kiln_error *upload(kiln_bf16 **d, int64_t n, uint32_t salt, float scale) {
    float *x = malloc((size_t)n * sizeof *x);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    kiln_error *e = NULL;
    if (!x || !h) {
        e = kiln_errorf(KILN_ENOMEM, "cannot allocate %lld host values", (long long)n);
        goto done;
    }
    kiln_bench_fill(x, n, salt, scale);
    for (int64_t i = 0; i < n; i++) h[i] = kiln_f32_to_bf16(x[i]);
    if (!(e = kiln_cuda_alloc((void **)d, (size_t)n * 2))) e = kiln_cuda_copy(*d, h, (size_t)n * 2, KILN_CUDA_H2D);
done:
    free(x), free(h);
    return e;
}

/* whether a sample of the first n values of device bf16 x is finite */
static kiln_error *all_finite(const kiln_bf16 *d, int64_t n, int *ok) {
    int64_t m = n < 65536 ? n : 65536;
    uint16_t *h = malloc((size_t)m * 2);
    float *f = malloc((size_t)m * sizeof *f);
    kiln_error *e = NULL;
    if (!h || !f) {
        e = kiln_errorf(KILN_ENOMEM, "cannot allocate %lld host values", (long long)m);
        goto done;
    }
    if ((e = kiln_cuda_copy(h, d, (size_t)m * 2, KILN_CUDA_D2H))) goto done;
    for (int64_t i = 0; i < m; i++) f[i] = kiln_bf16_to_f32(h[i]);
    *ok = kiln_bench_all_finite(f, m);
done:
    free(h), free(f);
    return e;
}

static kiln_error *run(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t window, int iters, int warmup,
                       double us[2], char *ran, size_t ran_size) {
    const int64_t nq = B * T * H * D, nk = B * T * KV * D;
    kiln_attn_shape s = {B, T, T, T, H, KV, D, window, 1.0f / sqrtf((float)D)};
    kiln_bf16 *q = NULL, *k = NULL, *v = NULL, *dout = NULL, *out = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    float *lse = NULL;
    void *work = NULL;
    kiln_error *e = NULL;
    if ((e = upload(&q, nq, 1, 1.0f)) || (e = upload(&k, nk, 2, 1.0f)) || (e = upload(&v, nk, 3, 1.0f)) ||
        (e = upload(&dout, nq, 4, 1.0f)) || (e = kiln_cuda_alloc((void **)&out, (size_t)nq * 2)) ||
        (e = kiln_cuda_alloc((void **)&dq, (size_t)nq * 2)) || (e = kiln_cuda_alloc((void **)&dk, (size_t)nk * 2)) ||
        (e = kiln_cuda_alloc((void **)&dv, (size_t)nk * 2)) ||
        (e = kiln_cuda_alloc((void **)&lse, (size_t)(B * H * T) * sizeof(float))) ||
        (e = kiln_cuda_alloc(&work, kiln_attention_backward_cuda_work(&s))))
        goto done;
    for (int pass = 0; pass < 2; pass++) {
        double t0 = 0;
        for (int i = 0; i < warmup + iters; i++) {
            if (i == warmup) {
                if ((e = kiln_cuda_sync())) goto done;
                t0 = kiln_bench_now_s();
            }
            if ((e = kiln_attention_forward_cuda(out, lse, q, k, v, &s, NULL))) goto done;
            if (pass && (e = kiln_attention_backward_cuda(dq, dk, dv, dout, out, lse, q, k, v, &s, work, NULL)))
                goto done;
        }
        if ((e = kiln_cuda_sync())) goto done;
        us[pass] = (kiln_bench_now_s() - t0) / iters * 1e6;
    }
    const char *f = kiln_attention_cuda_last_impl(0), *b = kiln_attention_cuda_last_impl(1);
    if (!strcmp(f, "own") == !strcmp(b, "own"))
        snprintf(ran, ran_size, "%s", b); /* the backward names the variant */
    else
        snprintf(ran, ran_size, "%s+%s", f, b); /* one pass fell back to kiln's kernels */
    int ok1 = 0, ok2 = 0, ok3 = 0;
    if ((e = all_finite(out, nq, &ok1)) || (e = all_finite(dq, nq, &ok2)) || (e = all_finite(dk, nk, &ok3))) goto done;
    if (!ok1 || !ok2 || !ok3) e = kiln_errorf(KILN_EINVAL, "result is not finite");
done:
    kiln_cuda_free(q), kiln_cuda_free(k), kiln_cuda_free(v), kiln_cuda_free(dout), kiln_cuda_free(out);
    kiln_cuda_free(dq), kiln_cuda_free(dk), kiln_cuda_free(dv), kiln_cuda_free(lse), kiln_cuda_free(work);
    return e;
}
#endif

kiln_error *kiln_bench_attention_cuda(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t window,
                                      const char *impl, int iters, int warmup, double us[2], char *ran,
                                      size_t ran_size) {
    kiln_error *e = NULL;
#ifdef KILN_HAVE_CUDA
    if (!(e = kiln_attention_cuda_set_impl(impl))) {
        e = run(B, T, H, KV, D, window, iters, warmup, us, ran, ran_size);
        kiln_error_free(kiln_attention_cuda_set_impl(NULL));
    }
#else
    (void)impl, (void)iters, (void)warmup, (void)us, (void)ran, (void)ran_size;
    e = kiln_errorf(KILN_EUNSUPPORTED, "this kiln was built without CUDA (nvcc was not found at build time)");
#endif
    return kiln_error_wrap(e, "attention B=%lld T=%lld H=%lld KV=%lld D=%lld window=%lld on the GPU", (long long)B,
                           (long long)T, (long long)H, (long long)KV, (long long)D, (long long)window);
}
