/* ZAYA's routing decision, the CPU reference of the CUDA router (src/cuda/router.cu): top-k over the
 * router's E+1 classes (the last is the skip class) on probabilities plus balancing biases, ties to the
 * lower index as torch.topk on CPU; the gate is the unbiased probability, 0 for the skip class. The CPU
 * model (src/models/zaya_forward.c, zaya_backward.c) routes through these. */
#include <math.h>

#include "kiln/nn.h"

void kiln_route_topk(int32_t *choice, float *gate, const float *probs, const float *bias, int64_t n, int64_t e1,
                     int64_t top) {
    for (int64_t t = 0; t < n; t++) {
        const float *p = probs + t * e1;
        int32_t *ch = choice + t * top;
        for (int64_t s = 0; s < top; s++) {
            int32_t best = -1;
            float bv = -INFINITY;
            for (int64_t e = 0; e < e1; e++) {
                int taken = 0;
                for (int64_t q = 0; q < s; q++) taken |= ch[q] == e;
                float v = p[e] + bias[e];
                if (!taken && (best < 0 || v > bv)) best = (int32_t)e, bv = v;
            }
            ch[s] = best;
            gate[t * top + s] = best == e1 - 1 ? 0.0f : p[best];
        }
    }
}

void kiln_route_gate_backward(float *dprobs, const float *dgate, const int32_t *choice, int64_t n, int64_t e1,
                              int64_t top) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s < top; s++) {
            int32_t e = choice[t * top + s];
            if (e < e1 - 1) dprobs[t * e1 + e] += dgate[t * top + s];
        }
}
