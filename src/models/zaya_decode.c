/* Cached decoding: K/V per layer, the last (k0-1)+(k1-1) CCA convolution inputs and the last
 * delayed-value projection, so that each new token costs one position, not the whole prefix.
 * The forward is the training forward (zaya_forward.c) told where the cache is. */
#include <stdlib.h>
#include <string.h>

#include "zaya_internal.h"

kiln_error *kiln_zaya_cache_create(const kiln_zaya *m, int64_t B, int64_t capacity, kiln_zaya_cache **out) {
    const kiln_zaya_config *c = &m->cfg;
    *out = NULL;
    if (B <= 0 || capacity <= 0)
        return kiln_errorf(KILN_EINVAL, "decode cache: batch %lld and capacity %lld must be positive", (long long)B,
                           (long long)capacity);
    kiln_zaya_cache *k = calloc(1, sizeof *k);
    if (!k) return kiln_errorf(KILN_ENOMEM, "decode cache");
    const int64_t L = c->num_layers, K = c->num_kv_heads * c->head_dim, C = c->num_heads * c->head_dim + K;
    k->B = B;
    k->cap = capacity;
    k->P = (c->cca_time0 - 1) + (c->cca_time1 - 1);
    k->hist = calloc((size_t)(L * B * k->P * C + 1), sizeof(float));
    k->vprev = calloc((size_t)(L * B * K / 2 + 1), sizeof(float));
    k->kc = calloc((size_t)(L * B * capacity * K + 1), sizeof(float));
    k->vc = calloc((size_t)(L * B * capacity * K + 1), sizeof(float));
    if (!k->hist || !k->vprev || !k->kc || !k->vc) {
        kiln_zaya_cache_free(k);
        return kiln_errorf(KILN_ENOMEM, "decode cache for batch %lld x %lld positions", (long long)B,
                           (long long)capacity);
    }
    *out = k;
    return NULL;
}

void kiln_zaya_cache_free(kiln_zaya_cache *k) {
    if (!k) return;
    free(k->hist);
    free(k->vprev);
    free(k->kc);
    free(k->vc);
    kiln_zaya_acts_free(k->acts);
    free(k);
}

int64_t kiln_zaya_cache_pos(const kiln_zaya_cache *k) { return k->pos; }

kiln_error *kiln_zaya_decode(kiln_zaya *m, kiln_zaya_cache *k, const int64_t *ids, int64_t T, float *logits) {
    if (T <= 0) return kiln_errorf(KILN_EINVAL, "decode: %lld new tokens", (long long)T);
    if (k->pos + T > k->cap)
        return kiln_errorf(KILN_EINVAL, "decode: %lld + %lld tokens exceed the cache capacity %lld", (long long)k->pos,
                           (long long)T, (long long)k->cap);
    if (!k->acts || k->acts->T != T) {
        kiln_zaya_acts_free(k->acts);
        k->acts = NULL;
        KILN_TRY(kiln_zaya_acts_create_ex(m, k->B, T, 0, &k->acts));
    }
    return kiln_zaya_forward_impl(m, k->acts, ids, logits, k);
}
