/* Multi-head attention forward for inference (CLIP's text and vision towers): every head of every
 * sequence is softmax(q kᵀ · scale [+ causal mask]) v with its own q, k, v columns read in place
 * from [B, T, stride] activations (the fused-projection layout), through OpenBLAS per head. The
 * training op with saved probabilities, GQA and windows is attention.c; this one keeps nothing.
 *
 * One thread takes one (sequence, head) at a time: QKᵀ into its own T×T scores (257² floats = 264 KB
 * for ViT-L/14, which stay in its L2 cache), the softmax over them, PV. The softmax runs on vector lanes
 * with kiln_vexpf (vexp.h): with libm's expf it took ~3x the time of the two GEMMs (T = 257, head 64). */
#include <cblas.h>
#include <stdlib.h>

#include "kiln/nn.h"
#include "nn/vexp.h"

/* The unnormalised softmax of every row of the T×T scores s: s[r][0..n) = exp(s[r][c] - max of the
 * row), s[r][n..T) = 0 (n = r + 1 when causal, else T), inv[r] = 1 / the row's sum (float lanes). The
 * normalisation is left to the PV output (T×hd multiplies instead of T×T). All maxima first, then the
 * exponentials: a row's exp pass then never waits on its own max, which keeps the short rows (T = 50
 * for ViT-B/32) from stalling on the reduction. */
KILN_SIMD_INLINE void softmax_body(float *s, float *inv, int64_t T, int causal) {
    for (int64_t r = 0; r < T; r++) {
        const float *row = s + r * T;
        int64_t n = causal ? r + 1 : T;
        float mx = row[0];
#pragma omp simd reduction(max : mx)
        for (int64_t c = 1; c < n; c++) mx = row[c] > mx ? row[c] : mx;
        inv[r] = mx;
    }
    for (int64_t r = 0; r < T; r++) {
        float *row = s + r * T, mx = inv[r], sum = 0;
        int64_t n = causal ? r + 1 : T;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < n; c++) {
            float e = kiln_vexpf(row[c] - mx);
            row[c] = e;
            sum += e;
        }
        inv[r] = 1.0f / sum;
        for (int64_t c = n; c < T; c++) row[c] = 0.0f;
    }
}

KILN_SIMD_VARIANTS(softmax_rows, (float *s, float *inv, int64_t T, int causal), (s, inv, T, causal), softmax_body)

/* o[r][0..hd) *= inv[r] for T rows ld apart */
KILN_SIMD_INLINE void scale_body(float *o, const float *inv, int64_t T, int64_t hd, int64_t ld) {
    for (int64_t r = 0; r < T; r++) {
        float f = inv[r];
        float *orow = o + r * ld;
#pragma omp simd
        for (int64_t c = 0; c < hd; c++) orow[c] *= f;
    }
}

KILN_SIMD_VARIANTS(scale_rows, (float *o, const float *inv, int64_t T, int64_t hd, int64_t ld), (o, inv, T, hd, ld),
                   scale_body)

int kiln_mha_forward(float *out, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                     int64_t heads, int64_t hd, int64_t stride, int64_t out_stride, float scale, int causal) {
    int64_t jobs = B * heads;
    int fail = 0;
#pragma omp parallel reduction(| : fail) if (jobs > 1 && T * T * hd * jobs > 100000)
    {
        float *s = malloc(sizeof(float) * (size_t)(T * T + T)), *inv = s ? s + T * T : NULL;
        if (!s) fail = 1;
#pragma omp for schedule(dynamic)
        for (int64_t j = 0; j < jobs; j++) {
            if (!s) continue;
            int64_t bi = j / heads, h = j % heads;
            const float *qh = q + bi * T * stride + h * hd, *kh = k + bi * T * stride + h * hd,
                        *vh = v + bi * T * stride + h * hd;
            float *oh = out + bi * T * out_stride + h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hd, scale, qh, (int)stride, kh,
                        (int)stride, 0.0f, s, (int)T);
            softmax_rows(s, inv, T, causal);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, s, (int)T, vh,
                        (int)stride, 0.0f, oh, (int)out_stride);
            scale_rows(oh, inv, T, hd, out_stride);
        }
        free(s);
    }
    return fail ? -1 : 0;
}
