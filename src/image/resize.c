/* PIL-equivalent bicubic resampling (Pillow's ImagingResample for 8-bit images).
 *
 * For each output pixel the filter is centred at in0 + (i + 0.5) * scale; when shrinking, the
 * kernel support (2 for bicubic) is stretched by the scale so every input pixel contributes
 * (antialiasing). Weights are normalised to sum 1, then turned into 22-bit fixed point (rounded
 * away from zero); sums start at half an LSB and are clipped to 0..255. The horizontal pass runs
 * first over only the rows the vertical pass will read, and its output is rounded to 8 bits -
 * these details are what make the result match PIL byte for byte. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "image/image_internal.h"

#define PRECISION_BITS (32 - 8 - 2)

static double bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

typedef struct {
    int ksize;
    int *bounds;  /* [out][2]: first input index, count */
    int32_t *kk;  /* [out][ksize] fixed-point weights */
} coeffs;

static int make_coeffs(coeffs *c, int in_size, int out_size) {
    double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *k = malloc(sizeof(double) * ksize);
    c->ksize = ksize;
    c->bounds = malloc(sizeof(int) * 2 * (size_t)out_size);
    c->kk = malloc(sizeof(int32_t) * (size_t)ksize * out_size);
    if (!k || !c->bounds || !c->kk) {
        free(k);
        return -1;
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            double w = bicubic((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        int32_t *dst = c->kk + (size_t)xx * ksize;
        for (int x = 0; x < ksize; x++) {
            double w = x < xmax ? (ww != 0.0 ? k[x] / ww : k[x]) : 0.0;
            dst[x] = w < 0 ? (int32_t)(-0.5 + w * (1 << PRECISION_BITS)) : (int32_t)(0.5 + w * (1 << PRECISION_BITS));
        }
        c->bounds[2 * xx] = xmin;
        c->bounds[2 * xx + 1] = xmax;
    }
    free(k);
    return 0;
}

static void free_coeffs(coeffs *c) {
    free(c->bounds);
    free(c->kk);
}

static inline uint8_t clip8(int64_t v) {
    if (v >= ((int64_t)1 << PRECISION_BITS << 8)) return 255;
    if (v <= 0) return 0;
    return (uint8_t)(v >> PRECISION_BITS);
}

/* out rows [0, rows) from input rows [row0, row0 + rows) */
static void horizontal(uint8_t *out, int out_w, const uint8_t *in, int in_w, int row0, int rows, const coeffs *c) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * out_w * c->ksize > 200000)
    for (int y = 0; y < rows; y++) {
        const uint8_t *src = in + (size_t)(y + row0) * in_w * 3;
        uint8_t *dst = out + (size_t)y * out_w * 3;
        for (int xx = 0; xx < out_w; xx++) {
            int xmin = c->bounds[2 * xx], n = c->bounds[2 * xx + 1];
            const int32_t *k = c->kk + (size_t)xx * c->ksize;
            int64_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int x = 0; x < n; x++) {
                const uint8_t *p = src + (size_t)(x + xmin) * 3;
                s0 += p[0] * (int64_t)k[x];
                s1 += p[1] * (int64_t)k[x];
                s2 += p[2] * (int64_t)k[x];
            }
            dst[3 * xx] = clip8(s0);
            dst[3 * xx + 1] = clip8(s1);
            dst[3 * xx + 2] = clip8(s2);
        }
    }
}

/* bounds are relative to the first row of `in` (shifted by the caller) */
static void vertical(uint8_t *out, int out_h, const uint8_t *in, int w, const coeffs *c, int shift) {
#pragma omp parallel for schedule(static) if ((int64_t)out_h * w * c->ksize > 200000)
    for (int yy = 0; yy < out_h; yy++) {
        int ymin = c->bounds[2 * yy] - shift, n = c->bounds[2 * yy + 1];
        const int32_t *k = c->kk + (size_t)yy * c->ksize;
        uint8_t *dst = out + (size_t)yy * w * 3;
        for (int xx = 0; xx < w * 3; xx++) {
            int64_t s = 1 << (PRECISION_BITS - 1);
            for (int y = 0; y < n; y++) s += in[(size_t)(y + ymin) * w * 3 + xx] * (int64_t)k[y];
            dst[xx] = clip8(s);
        }
    }
}

kiln_error *kiln_image_resize_bicubic(const kiln_image *src, int w, int h, kiln_image *out) {
    out->width = out->height = 0;
    out->rgb = NULL;
    if (!src || !src->rgb || src->width <= 0 || src->height <= 0)
        return kiln_errorf(KILN_EINVAL, "image resize: no source image");
    if (w <= 0 || h <= 0) return kiln_errorf(KILN_EINVAL, "image resize: target size %dx%d is empty", w, h);
    int need_h = w != src->width, need_v = h != src->height;
    if (!need_h && !need_v) {
        KILN_TRY(kiln_image_alloc(out, w, h, "image resize"));
        memcpy(out->rgb, src->rgb, (size_t)w * h * 3);
        return NULL;
    }
    coeffs ch = {0}, cv = {0};
    if (make_coeffs(&ch, src->width, w) || make_coeffs(&cv, src->height, h)) {
        free_coeffs(&ch);
        free_coeffs(&cv);
        return kiln_errorf(KILN_ENOMEM, "image resize: out of memory");
    }
    kiln_error *e = kiln_image_alloc(out, w, h, "image resize");
    if (e) {
        free_coeffs(&ch);
        free_coeffs(&cv);
        return e;
    }
    if (need_h && need_v) {
        int first = cv.bounds[0], last = cv.bounds[2 * h - 2] + cv.bounds[2 * h - 1];
        uint8_t *tmp = malloc((size_t)w * (last - first) * 3);
        if (!tmp) {
            free_coeffs(&ch);
            free_coeffs(&cv);
            kiln_image_free(out);
            return kiln_errorf(KILN_ENOMEM, "image resize: out of memory");
        }
        horizontal(tmp, w, src->rgb, src->width, first, last - first, &ch);
        vertical(out->rgb, h, tmp, w, &cv, first);
        free(tmp);
    } else if (need_h) {
        horizontal(out->rgb, w, src->rgb, src->width, 0, h, &ch);
    } else {
        vertical(out->rgb, h, src->rgb, w, &cv, 0);
    }
    free_coeffs(&ch);
    free_coeffs(&cv);
    return NULL;
}
