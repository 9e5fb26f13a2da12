/* Multi-head attention forward for inference (CLIP's text and vision towers): every head of every
 * sequence is softmax(q kᵀ · scale [+ causal mask]) v with its own q, k, v columns read in place
 * from [B, T, stride] activations (the fused-projection layout), through OpenBLAS per head. The
 * training op with saved probabilities, GQA and windows is attention.c; this one keeps nothing. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "kiln/nn.h"

int kiln_mha_forward(float *out, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                     int64_t heads, int64_t hd, int64_t stride, int64_t out_stride, float scale, int causal) {
    int64_t jobs = B * heads;
    int fail = 0;
#pragma omp parallel reduction(| : fail) if (jobs > 1 && T * T * hd * jobs > 100000)
    {
        float *s = malloc(sizeof(float) * (size_t)(T * T));
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
            for (int64_t r = 0; r < T; r++) {
                float *row = s + r * T;
                int64_t n = causal ? r + 1 : T;
                float mx = row[0];
                for (int64_t c = 1; c < n; c++) mx = row[c] > mx ? row[c] : mx;
                double sum = 0;
                for (int64_t c = 0; c < n; c++) {
                    row[c] = expf(row[c] - mx);
                    sum += row[c];
                }
                float inv = (float)(1.0 / sum);
                for (int64_t c = 0; c < n; c++) row[c] *= inv;
                for (int64_t c = n; c < T; c++) row[c] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hd, (int)T, 1.0f, s, (int)T, vh,
                        (int)stride, 0.0f, oh, (int)out_stride);
        }
        free(s);
    }
    return fail ? -1 : 0;
}
