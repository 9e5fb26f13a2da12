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

#endif
