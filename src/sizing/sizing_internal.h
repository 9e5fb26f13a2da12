/* Pieces shared inside src/sizing. */
#ifndef KILN_SIZING_INTERNAL_H
#define KILN_SIZING_INTERNAL_H

#include <stdint.h>

#include "kiln/sizing.h"

/* Every parameter tensor of a ZAYA shape in src/models/zaya_params.c's order: its element count and
 * whether src/train/optim.c gives it Muon (trainer_mem.c). */
void kiln_size_tensor_walk(const kiln_size_shape *s, void (*fn)(void *ctx, int64_t numel, int muon), void *ctx);

#endif
