/* Token embedding lookup. As nn.Embedding(padding_idx=pad), the pad row gets no gradient. */
#include <string.h>

#include "kiln/nn.h"

void kiln_embedding_forward(float *y, const float *table, const int64_t *ids, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) memcpy(y + i * d, table + ids[i] * d, (size_t)d * sizeof(float));
}

void kiln_embedding_backward(float *dtable, const float *dy, const int64_t *ids, int64_t n, int64_t d,
                             int64_t pad) {
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] == pad) continue;
        float *row = dtable + ids[i] * d;
        for (int64_t j = 0; j < d; j++) row[j] += dy[i * d + j];
    }
}
