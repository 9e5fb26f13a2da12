// The experts' dispatch (src/cuda/router.cu) in its two halves, for the experts' forward (src/cuda/experts.cu): the
// offsets are final after the first, so the host's copy of them can start while the scatter and the gather run.
#ifndef KILN_CUDA_DISPATCH_H
#define KILN_CUDA_DISPATCH_H

#include <stdint.h>

#include "kiln/cuda_ops.h"

// histograms + scan: x->exp_off final; *cnt (NULL without slots) is the second half's input
kiln_error *kiln_experts_dispatch_offsets_cuda(kiln_experts_cuda *x, int32_t **cnt, void *stream);
// the scatter (slot_tok, slot_k, tok_slot); frees cnt
kiln_error *kiln_experts_dispatch_scatter_cuda(kiln_experts_cuda *x, int32_t *cnt, void *stream);

#endif
