/* Linear layer through OpenBLAS: y = x @ w^T + b, w stored [out, in] as in PyTorch. */
#include <cblas.h>
#include <string.h>

#include "kiln/nn.h"

void kiln_linear_forward(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t in,
                         int64_t out) {
    if (n == 0) return;
    if (b) { /* the bias as C (beta = 1); on threads: for CLIP's qkv it is 50 MB per layer */
#pragma omp parallel for schedule(static) if (n * out > 262144)
        for (int64_t i = 0; i < n; i++) memcpy(y + i * out, b, (size_t)out * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)in, 1.0f, x, (int)in, w,
                (int)in, b ? 1.0f : 0.0f, y, (int)out);
}

void kiln_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                          int64_t n, int64_t in, int64_t out) {
    if (n == 0) return;
    if (dx)  /* dx[n,in] += dy[n,out] @ w[out,in] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)in, (int)out, 1.0f, dy, (int)out, w,
                    (int)in, 1.0f, dx, (int)in);
    if (dw)  /* dw[out,in] += dy^T @ x */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)out, (int)in, (int)n, 1.0f, dy, (int)out, x,
                    (int)in, 1.0f, dw, (int)in);
    if (db) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t o = 0; o < out; o++) db[o] += dy[i * out + o];
    }
}
