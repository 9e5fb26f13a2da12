/* The fused cross-entropy on the device against kiln_cross_entropy. Tolerances:
 *   mean loss and per-row losses (f32): 1e-5 relative (f32 exp/sum over V terms instead of f64);
 *   dlogits (bf16): 5e-3 relative to its largest entry, one bf16 rounding (at most 2^-8) plus f32 math.
 * V = 50304 (the benchmark's vocabulary, 16-byte loads: the one-read kernel, rows in shared memory), an odd V
 * (the two-pass kernel's scalar path), V = 102408 (a row past the shared memory: the two-pass kernel's 16-byte
 * path), in place (dlogits == logits), T = 1 (nothing to predict), and the mean bitwise repeatable. */
#include <stdlib.h>
#include <string.h>

#include "gpu_testutil.h"
#include "kiln/nn.h"

#define TOL_BF16 5e-3
#define TOL_F32 1e-5

TEST(gpu_ops_cross_entropy) {
    static const struct {
        int64_t B, T, V;
        int inplace;
    } shapes[] = {{2, 65, 50304, 0}, {3, 17, 1001, 0}, {2, 33, 50304, 1}, {1, 40, 7, 1}, {2, 1, 64, 0},
                  {4, 9, 4096, 1}, {1, 300, 8, 0}, {1, 5, 102408, 0}};
    kiln_rng rng;
    kiln_rng_seed(&rng, 31);
    for (size_t sj = 0; sj < sizeof shapes / sizeof *shapes; sj++) {
        const int64_t B = shapes[sj].B, T = shapes[sj].T, V = shapes[sj].V, rows = B * T, n = rows * V;
        const int inplace = shapes[sj].inplace;
        printf("  B=%lld T=%lld V=%lld%s\n", (long long)B, (long long)T, (long long)V, inplace ? " in place" : "");
        float *logits = gt_rand(&rng, n, 6.0f);
        gt_round_bf16(logits, n);
        int64_t *ids = malloc((size_t)rows * sizeof *ids);
        for (int64_t i = 0; i < rows; i++) ids[i] = (int64_t)(kiln_rng_u64(&rng) % (uint64_t)V);
        float *dl = malloc((size_t)n * sizeof *dl);
        const float loss = (float)kiln_cross_entropy(dl, logits, ids, B, T, V);
        /* per-row reference: the same op on that row alone (B = 1, T = 2: one prediction) */
        float *ltok = calloc((size_t)rows, sizeof *ltok), *pair = calloc((size_t)(2 * V), sizeof *pair);
        for (int64_t r = 0; r < rows; r++) {
            if (r % T == T - 1) continue;
            memcpy(pair, logits + r * V, (size_t)V * sizeof *pair);
            int64_t two[2] = {ids[r], ids[r + 1]};
            ltok[r] = (float)kiln_cross_entropy(NULL, pair, two, 1, 2, V);
        }

        kiln_bf16 *dlog = gt_up_bf16(logits, n), *dgrad = inplace ? dlog : gt_dev((size_t)n * 2);
        int64_t *dids = gt_dev((size_t)rows * sizeof *dids);
        CHECK_OK(kiln_cuda_copy(dids, ids, (size_t)rows * sizeof *ids, KILN_CUDA_H2D));
        float *dtok = gt_dev((size_t)rows * 4), *dloss = gt_dev(4), *dloss2 = gt_dev(4);
        CHECK_OK(kiln_cross_entropy_cuda(dgrad, dtok, dloss, dlog, dids, B, T, V, NULL));
        float *gl = gt_down_f32(dloss, 1), *gtok = gt_down_f32(dtok, rows), *gd = gt_down_bf16(dgrad, n);
        GT_CLOSE("cross_entropy loss", gl, &loss, 1, TOL_F32);
        GT_CLOSE("cross_entropy loss per row", gtok, ltok, rows, TOL_F32);
        GT_CLOSE("cross_entropy dlogits", gd, dl, n, TOL_BF16);
        if (!inplace) { /* loss only, again: the same bits */
            CHECK_OK(kiln_cross_entropy_cuda(NULL, NULL, dloss2, dlog, dids, B, T, V, NULL));
            float *gl2 = gt_down_f32(dloss2, 1);
            CHECK_MSG(!memcmp(gl, gl2, sizeof *gl), "cross_entropy loss differs between two runs");
            free(gl2);
        }
        kiln_cuda_free(dlog), kiln_cuda_free(dids), kiln_cuda_free(dtok), kiln_cuda_free(dloss), kiln_cuda_free(dloss2);
        if (!inplace) kiln_cuda_free(dgrad);
        free(logits), free(ids), free(dl), free(ltok), free(pair), free(gl), free(gtok), free(gd);
    }
}
