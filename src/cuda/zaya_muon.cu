// Muon's Newton-Schulz iteration on the GPU for the ZAYA trainer (src/models/zaya_cuda_train.c): the
// quintic of kiln_newton_schulz (src/train/optim.c) on every matrix of a tensor at once, each product one
// strided-batched f32 cuBLAS GEMM over the matrices (the experts' E matrices in one call). f32 like the CPU
// (the update is orthogonalised momentum; bf16 here would add noise the CPU reference does not have); the
// Gram matrix is taken on the short side without transposing: for a wide x [r, c] (r <= c) A = x xᵀ and
// x <- a x + B x, for a tall one A = xᵀ x and x <- a x + x B (B is symmetric).
#include <cublas_v2.h>
#include <pthread.h>

#include "cuda_check.h"
#include "kiln/cuda_ops.h"

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

namespace {
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
cublasHandle_t g_handle;

// Row-major C[m,n] = alpha op(A) op(B) + beta C over `batch` matrices: cuBLAS's column-major view of a
// row-major matrix is its transpose, so this is Cᵀ = op(B)ᵀ op(A)ᵀ with the operands swapped.
cublasStatus_t rm_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       int64_t sa, const float *b, int64_t ldb, int64_t sb, float beta, float *c, int64_t ldc,
                       int64_t sc, int64_t batch) {
    return cublasSgemmStridedBatched(g_handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
                                     (int)m, (int)k, &alpha, b, (int)ldb, sb, a, (int)lda, sa, &beta, c, (int)ldc, sc,
                                     (int)batch);
}
} // namespace

extern "C" size_t kiln_zaya_newton_schulz_cuda_ws(int64_t mats, int64_t rows, int64_t cols) {
    int64_t r = rows < cols ? rows : cols;
    return (size_t)(mats * (2 * r * r + rows * cols)); // A, B, BX
}

extern "C" kiln_error *kiln_zaya_newton_schulz_cuda(float *x, int64_t mats, int64_t rows, int64_t cols, int steps,
                                                    float *ws, void *stream) {
    kiln_error *err = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    const bool tall = rows > cols;
    const int64_t r = tall ? cols : rows, mn = rows * cols;
    float *A = ws, *B = A + mats * r * r, *BX = B + mats * r * r;
    kiln_opt_param p = {0, mats * mn, KILN_OPT_MUON, mats, rows, cols, 0};
    if (mats <= 0 || mn <= 0) return NULL;
    pthread_mutex_lock(&g_lock);
    if (!g_handle) CUBLAS_TRY(cublasCreate(&g_handle));
    CUBLAS_TRY(cublasSetStream(g_handle, st));
    CUBLAS_TRY(cublasSetMathMode(g_handle, CUBLAS_PEDANTIC_MATH)); // true f32, no TF32: the CPU's arithmetic
    err = kiln_muon_normalize_cuda(x, &p, stream);
    if (err) goto done;
    for (int s = 0; s < steps; s++) {
        // A = x xᵀ (wide) or xᵀ x (tall)
        if (tall) CUBLAS_TRY(rm_gemm(true, false, r, r, rows, 1.0f, x, cols, mn, x, cols, mn, 0.0f, A, r, r * r, mats));
        else CUBLAS_TRY(rm_gemm(false, true, r, r, cols, 1.0f, x, cols, mn, x, cols, mn, 0.0f, A, r, r * r, mats));
        // B = b A + c A A
        CUDA_TRY(cudaMemcpyAsync(B, A, (size_t)(mats * r * r) * sizeof(float), cudaMemcpyDeviceToDevice, st));
        CUBLAS_TRY(rm_gemm(false, false, r, r, r, NS_C, A, r, r * r, A, r, r * r, NS_B, B, r, r * r, mats));
        // x = a x + B x (wide) or a x + x B (tall)
        CUDA_TRY(cudaMemcpyAsync(BX, x, (size_t)(mats * mn) * sizeof(float), cudaMemcpyDeviceToDevice, st));
        if (tall) CUBLAS_TRY(rm_gemm(false, false, rows, cols, r, 1.0f, x, cols, mn, B, r, r * r, NS_A, BX, cols, mn, mats));
        else CUBLAS_TRY(rm_gemm(false, false, rows, cols, r, 1.0f, B, r, r * r, x, cols, mn, NS_A, BX, cols, mn, mats));
        CUDA_TRY(cudaMemcpyAsync(x, BX, (size_t)(mats * mn) * sizeof(float), cudaMemcpyDeviceToDevice, st));
    }
done:
    pthread_mutex_unlock(&g_lock);
    if (err) err = kiln_error_wrap(err, "Newton-Schulz on %lld matrices of %lldx%lld", (long long)mats, (long long)rows,
                                   (long long)cols);
    return err;
}
