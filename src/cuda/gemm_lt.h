/* One cuBLASLt GEMM "plan" for every GEMM user of the CUDA side (src/cuda/linear.cu, experts_gemm.cu,
 * clip_gemm.cu), defined in src/cuda/gemm_cublaslt.cu: the matmul descriptor, the three layouts, the
 * heuristic's candidates for the pointers' alignment and the workspace, optional timing of the candidates,
 * and a plan table to cache them. Building a plan costs tens of microseconds (more than a small GEMM), so
 * each user keeps its plans in a kiln_lt_cache and looks them up by key.
 *
 * Row-major C[m,n] = op(A)[m,k] op(B)[k,n] (ta/tb: the row-major operand is stored transposed) is run as
 * the column-major Cᵀ = op(B)ᵀ op(A)ᵀ, exactly PyTorch's call: cuBLASLt's A is our B. bf16 A and B, f32
 * accumulation, C bf16 or f32. Internal to the CUDA files (C++ only). */
#ifndef KILN_CUDA_GEMM_LT_H
#define KILN_CUDA_GEMM_LT_H

#include <stdint.h>
#include <stdio.h>

#include "cuda_check.h"

enum { KILN_LT_MAX_CANDS = 16 };

typedef enum {
    KILN_LT_SINGLE = 0,   /* one GEMM */
    KILN_LT_PTR_ARRAY,    /* batch: the A, B, C arguments are device arrays of `batch` pointers */
    KILN_LT_STRIDED       /* batch: matrix i starts i * stride elements after the argument (stride 0: shared) */
} kiln_lt_batch_mode;

/* What a plan is built for; a cache hit needs every field equal. Make one with kiln_lt_key_make. */
typedef struct {
    int64_t m, n, k, batch;      /* batch: 0 for KILN_LT_SINGLE */
    int64_t stride[3];           /* KILN_LT_STRIDED: elements between matrices of A, B, C (row-major operands) */
    int ta, tb, c_f32, mode;
    int bias;                    /* 1: CUBLASLT_EPILOGUE_BIAS, a bias per column of row-major C (set per call) */
    int bias_f32;                /* the bias's type: f32, else bf16 */
    int tag;                     /* the user's own distinction (its plans differ in something else) */
    uint32_t align[3];           /* bytes, of cuBLASLt's A (our B), B (our A) and C/D */
} kiln_lt_key;

typedef struct {
    kiln_lt_key key;
    int64_t cm, cn, ck, cbatch;  /* the sizes the layouts carry now (kiln_lt_plan_resize) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;   /* the one used: cand[0] unless timing chose another */
    cublasLtMatmulAlgo_t cand[KILN_LT_MAX_CANDS];
    int ncand, tuned;
    int user;                    /* the user's own per-plan flag */
} kiln_lt_plan;

/* A fixed table of plans; when full it starts over (a workload with that many shapes is not a training
 * step). Plans handed out stay valid until the table starts over. hash (cap entries): each plan's key
 * hash side by side, so that a lookup reads 8 bytes a plan instead of a plan's cache lines (the experts' grouped
 * GEMMs look up a plan per expert and call, hundreds of plans deep, on the host's path to each launch). */
typedef struct {
    kiln_lt_plan *plans;
    uint64_t *hash;
    int n, cap;
} kiln_lt_cache;

/* the process's cuBLASLt handle, created on first use (thread-safe) */
kiln_error *kiln_lt_handle(cublasLtHandle_t *out);
/* the largest power of two <= 256 that divides the address */
uint32_t kiln_lt_align(const void *p);
/* a key with every field (padding included) defined: SINGLE, no bias, tag 0 */
kiln_lt_key kiln_lt_key_make(int64_t m, int64_t n, int64_t k, int ta, int tb, int c_f32, const uint32_t align[3]);
/* Descriptors and layouts for key (at its sizes) and up to max_cands of the heuristic's algorithms for
 * ws_bytes of workspace. p->ncand == 0 (not an error) when cuBLASLt has none: the caller decides. */
kiln_error *kiln_lt_plan_create(kiln_lt_plan *p, const kiln_lt_key *key, size_t ws_bytes, int max_cands);
void kiln_lt_plan_destroy(kiln_lt_plan *p);
/* set the layouts to other sizes than the key's (the same leading-dimension rules; a cached plan chosen for a
 * bucket of sizes); a no-op when they already carry them */
kiln_error *kiln_lt_plan_resize(kiln_lt_plan *p, int64_t m, int64_t n, int64_t k, int64_t batch);
/* the bias pointer of a bias plan, for the next run */
kiln_error *kiln_lt_plan_set_bias(kiln_lt_plan *p, const void *bias);
/* C = alpha op(A) op(B) + beta C with algo (NULL: p->algo) */
cublasStatus_t kiln_lt_plan_run(const kiln_lt_plan *p, const cublasLtMatmulAlgo_t *algo, void *c, const void *a,
                                const void *b, float beta, void *ws, size_t ws_bytes, cudaStream_t st);
/* Time each candidate on these operands (1 warm-up + 3 timed calls; C is overwritten or accumulated per beta,
 * so callers pass a scratch C where the real one must not change) and keep the fastest in p->algo; candidates
 * that fail are skipped. Synchronizes the stream. Sets p->tuned. */
kiln_error *kiln_lt_plan_tune(kiln_lt_plan *p, void *c, const void *a, const void *b, float beta, void *ws,
                              size_t ws_bytes, cudaStream_t st);
/* the same with `calls` timed calls a candidate after one warm-up, each candidate's time (and its tile, stages,
 * split-K and cluster shape) written to log when not NULL */
kiln_error *kiln_lt_plan_tune_n(kiln_lt_plan *p, void *c, const void *a, const void *b, float beta, void *ws,
                                size_t ws_bytes, cudaStream_t st, int calls, FILE *log);

kiln_lt_plan *kiln_lt_cache_find(kiln_lt_cache *c, const kiln_lt_key *key);
/* moves *p into the table (p is zeroed) and returns its place */
kiln_lt_plan *kiln_lt_cache_add(kiln_lt_cache *c, kiln_lt_plan *p);

#endif
