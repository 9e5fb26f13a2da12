/* CPU throughput of kiln's CLIP image embedder (kiln_clip_embed_images: patch embedding, vision
 * tower, projection, L2 normalisation) on pixels from a safetensors file, and its agreement with a
 * reference (the torch peer's embeddings of the same pixels). Prints one JSON line.
 * With --device cuda the vision tower runs on the GPU (bf16): timed from host pixels (page-locked, from
 * kiln_clip_pixels_alloc, as the torch peer's pinned tensor) to host embeddings, and again with the pixels
 * already in device memory ("resident", as the peer's second number).
 * usage: kiln_bench_clip --clip DIR --pixels FILE [--batch B] [--iters N] [--ref FILE] [--device cpu|cuda] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "kiln/clip.h"
#include "kiln/cuda.h"
#include "kiln/nn.h"
#include "kiln/safetensors.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(kiln_error *e) {
    fprintf(stderr, "kiln_bench_clip: %s\n", kiln_error_msg(e));
    kiln_error_free(e);
    return 1;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *pixels = NULL, *ref = NULL, *device = "cpu";
    int batch = 16, iters = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--clip")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--pixels")) pixels = argv[i + 1];
        else if (!strcmp(argv[i], "--ref")) ref = argv[i + 1];
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    }
    if (!dir || !pixels || batch < 1 || iters < 1) {
        fprintf(stderr, "usage: kiln_bench_clip --clip DIR --pixels FILE [--batch B] [--iters N] [--ref FILE]\n");
        return 2;
    }
    kiln_clip *m = NULL;
    kiln_error *e = kiln_clip_load(dir, &m);
    if (!e) e = kiln_clip_set_device(m, device);
    if (e) return fail(e);
    int S = kiln_clip_image_size(m), D = kiln_clip_dim(m);
    kiln_st *st = NULL;
    if ((e = kiln_st_open(pixels, &st))) return fail(e);
    const kiln_st_tensor *pv = kiln_st_find(st, "pixel_values");
    if (!pv || pv->ndim != 4 || pv->shape[1] != 3 || pv->shape[2] != S || pv->shape[3] != S || pv->shape[0] < batch) {
        fprintf(stderr, "kiln_bench_clip: %s: pixel_values must be [>=%d,3,%d,%d]\n", pixels, batch, S, S);
        return 1;
    }
    float *all = NULL, *emb = malloc(sizeof(float) * (size_t)batch * D);
    if ((e = kiln_clip_pixels_alloc(m, pv->shape[0], &all))) return fail(e);
    if ((e = kiln_st_read_f32(pv, all, (size_t)pv->numel))) return fail(e);
    if ((e = kiln_clip_embed_images(m, all, batch, emb, NULL))) return fail(e); /* warm-up */
    double *t = malloc(sizeof(double) * iters), resident = -1;
    for (int i = 0; i < iters; i++) {
        double t0 = now();
        if ((e = kiln_clip_embed_images(m, all, batch, emb, NULL))) return fail(e);
        t[i] = now() - t0;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp);
    if (!strcmp(device, "cuda")) {
        /* the pixels already on the device: the tower alone (embeddings still come back to the host) */
        size_t bytes = sizeof(float) * (size_t)batch * 3 * S * S;
        void *dev = NULL;
        float *emb2 = malloc(sizeof(float) * (size_t)batch * D);
        double *t2 = malloc(sizeof(double) * iters);
        if ((e = kiln_cuda_alloc(&dev, bytes)) || (e = kiln_cuda_copy(dev, all, bytes, KILN_CUDA_H2D)) ||
            (e = kiln_clip_embed_images(m, dev, batch, emb2, NULL)))
            return fail(e);
        for (int i = 0; i < iters; i++) {
            double t0 = now();
            if ((e = kiln_clip_embed_images(m, dev, batch, emb2, NULL))) return fail(e);
            t2[i] = now() - t0;
        }
        qsort(t2, (size_t)iters, sizeof *t2, cmp);
        resident = batch / t2[iters / 2];
        if (memcmp(emb, emb2, sizeof(float) * (size_t)batch * D))
            fprintf(stderr, "kiln_bench_clip: device-resident pixels gave other embeddings than host pixels\n");
        kiln_cuda_free(dev);
        free(emb2);
        free(t2);
    }
    double relerr = -1, worst_cos = -1;
    if (ref) {
        kiln_st *rs = NULL;
        if ((e = kiln_st_open(ref, &rs))) return fail(e);
        const kiln_st_tensor *re = kiln_st_find(rs, "image_embeds");
        /* the first rows the reference has (the CPU peer embeds fewer images than the GPU runs) */
        int rows = re && re->ndim == 2 ? (int)(re->shape[0] < batch ? re->shape[0] : batch) : 0;
        if (re && re->ndim == 2 && re->shape[1] == D && rows > 0) {
            float *r = malloc(sizeof(float) * (size_t)re->numel);
            if ((e = kiln_st_read_f32(re, r, (size_t)re->numel))) return fail(e);
            double md = 0, mx = 0;
            for (int i = 0; i < rows * D; i++) {
                md = fmax(md, fabs(emb[i] - r[i]));
                mx = fmax(mx, fabs(r[i]));
            }
            relerr = md / mx;
            worst_cos = 1;
            for (int b = 0; b < rows; b++) {
                double dot = 0, na = 0, nb = 0;
                for (int j = 0; j < D; j++) {
                    dot += (double)emb[b * D + j] * r[b * D + j];
                    na += (double)emb[b * D + j] * emb[b * D + j];
                    nb += (double)r[b * D + j] * r[b * D + j];
                }
                worst_cos = fmin(worst_cos, dot / sqrt(na * nb + 1e-30));
            }
            free(r);
        }
        kiln_st_close(rs);
    }
    printf("{\"side\": \"kiln\", \"device\": \"%s\", \"batch\": %d, \"iters\": %d, \"images_per_s_median\": %.3f, "
           "\"images_per_s_best\": %.3f, \"rel_err_vs_ref\": %.3g, \"worst_cosine_vs_ref\": %.6f, \"image_size\": %d, "
           "\"grid\": %d, \"dim\": %d, \"openblas_core\": \"%s\", \"openblas_threads\": %d, "
           "\"images_per_s_resident\": %.3f, \"chunk_env\": \"%s\", \"simd\": \"%s\"}\n",
           device, batch, iters, batch / t[iters / 2], batch / t[0], relerr, worst_cos, S, kiln_clip_grid(m), D,
           openblas_get_corename(), openblas_get_num_threads(), resident,
           getenv("KILN_CLIP_CHUNK") ? getenv("KILN_CLIP_CHUNK") : "", kiln_simd_isa());
    free(t);
    kiln_clip_pixels_free(all);
    free(emb);
    kiln_st_close(st);
    kiln_clip_free(m);
    return 0;
}
