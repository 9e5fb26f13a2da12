/* Pieces shared inside src/sizing. */
#ifndef KILN_SIZING_INTERNAL_H
#define KILN_SIZING_INTERNAL_H

#include <stdint.h>

#include "kiln/sizing.h"

/* One parameter tensor: its elements and, when src/train/optim.c gives it Muon, its matrices. */
typedef struct {
    int64_t numel, mats, rows, cols;
    int muon;
} kiln_size_tensor;

/* Every parameter tensor of a ZAYA shape in src/models/zaya_params.c's order (trainer_mem.c). */
void kiln_size_tensor_walk(const kiln_size_shape *s, void (*fn)(void *ctx, const kiln_size_tensor *t), void *ctx);

/* The largest run a prediction takes (docs/sizing.md; kiln size's flags are bounded by the same numbers). Far
 * past any real run, and small enough that no count overflows int64 (tokens per micro-batch x GPUs, micro-batches
 * x tokens) and no byte count turns negative. */
#define KILN_SIZE_MAX_SEQ ((int64_t)1 << 24)             /* sequence length */
#define KILN_SIZE_MAX_GPUS ((int64_t)1 << 20)            /* data-parallel GPUs */
#define KILN_SIZE_MAX_MICRO_BATCH ((int64_t)1 << 20)     /* sequences per micro-batch */
#define KILN_SIZE_MAX_MICRO_TOKENS ((int64_t)1 << 32)    /* micro-batch x sequence */
#define KILN_SIZE_MAX_TOKENS_PER_STEP ((int64_t)1 << 40) /* global batch in tokens */
#define KILN_SIZE_MAX_VOCAB ((int64_t)INT32_MAX)         /* vocabulary (before padding to 128) */

/* An error naming the first of gpus, micro-batch, sequence and tokens per step (tokens_per_step < 0: not
 * checked) outside 1..its maximum above, or micro-batch x sequence past KILN_SIZE_MAX_MICRO_TOKENS; what names
 * the caller ("predict"). NULL when all are in range. */
kiln_error *kiln_size_check_run(const char *what, int64_t gpus, int64_t micro_batch, int64_t seq,
                                int64_t tokens_per_step);

#endif
