/* kiln bench gemm's pieces, exposed for tests/test_bench.c: FLOP counts, the dimension-list
 * parser, and the expansion of a model config into one training micro-step's GEMM shapes. */
#ifndef KILN_BENCH_GEMM_SHAPES_H
#define KILN_BENCH_GEMM_SHAPES_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kiln/zaya.h"

/* One GEMM C[M,N] = op(A)[M,K] op(B)[K,N], `count` times per step. layout: op(A) op(B) as
 * cblas_sgemm receives them ("NN", "NT", "TN"), which is how the CPU trainer calls it. */
typedef struct {
    char label[256];
    int64_t m, n, k, count;
    char layout[3];
} kiln_gemm_shape;

/* 2*M*N*K. */
double kiln_gemm_flops(int64_t m, int64_t n, int64_t k);

/* "512", "512,1024", "256:4096:x2" (geometric), "2048:2304:+8" (arithmetic), or a comma list of
 * those. Values must be in 1..2^20; at most 4096 of them. *vals is malloc'd. `what` names the
 * flag in errors. */
kiln_error *kiln_gemm_parse_dims(const char *spec, const char *what, int64_t **vals, size_t *n);

/* The GEMMs of one forward + backward over `tokens` tokens (micro_batch * seq_len), through the
 * same cblas_sgemm calls as the CPU trainer (kiln_linear_*): per layer q/k/v_current/v_delayed/o,
 * router down/fc1/fc2/out, the experts' gate_up and down at tokens*top_k/num_experts tokens each
 * (balanced routing, rounded to nearest, at least 1), and the LM head. Each forward
 * [M,K]x[K,N] ("fwd", NT) gives dX = [M,N]x[N,K] ("dX", NN) and dW = [N,M]x[M,K] ("dW", TN).
 * Identical (M,N,K,layout) are collapsed into one entry with the summed count and the labels
 * joined by " + ". *out is malloc'd. */
kiln_error *kiln_gemm_model_shapes(const kiln_zaya_config *c, int64_t tokens, kiln_gemm_shape **out, size_t *n);

/* Load a kiln train config (sections model/data/...) or a HF config.json (detected by its
 * top-level keys). For a HF config, micro_batch/seq_len/grad_accum keep the values passed in. */
typedef struct {
    kiln_zaya_config model;
    int64_t micro_batch, seq_len, grad_accum;
    int is_train_config;
} kiln_gemm_model;
kiln_error *kiln_gemm_model_load(const char *path, kiln_gemm_model *out);

#endif
