/* Open-addressing hash maps for the tokenizer: byte strings -> int64 (vocabularies) and
 * uint64 -> uint64 (merge ranks, pair counts). Linear probing, power-of-two capacity, load <= 1/2. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t kiln_hash_bytes(const void *data, size_t len) {
    const unsigned char *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (len * 0x100000001B3ULL);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ mix64(w)) * 0x100000001B3ULL;
        h = (h << 29) | (h >> 35);
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < len; i++) w |= (uint64_t)p[i] << (8 * i);
    return mix64(h ^ w ^ 0x632BE59BD9B4E019ULL);
}

static size_t cap_for(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 2) cap *= 2;
    return cap;
}

int kiln_strmap_init(kiln_strmap *m, size_t expected) {
    m->cap = cap_for(expected);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

void kiln_strmap_free(kiln_strmap *m) {
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

static kiln_strmap_slot *strmap_find(const kiln_strmap *m, const char *key, size_t len) {
    size_t mask = m->cap - 1, i = (size_t)kiln_hash_bytes(key, len) & mask;
    for (;;) {
        kiln_strmap_slot *s = &m->slots[i];
        if (!s->used || (s->len == len && (len == 0 || memcmp(s->key, key, len) == 0))) return s;
        i = (i + 1) & mask;
    }
}

int64_t *kiln_strmap_get(const kiln_strmap *m, const char *key, size_t len) {
    if (!m->slots) return NULL;
    kiln_strmap_slot *s = strmap_find(m, key, len);
    return s->used ? &s->value : NULL;
}

static int strmap_grow(kiln_strmap *m) {
    kiln_strmap old = *m;
    m->cap *= 2;
    m->slots = calloc(m->cap, sizeof *m->slots);
    if (!m->slots) {
        *m = old;
        return -1;
    }
    for (size_t i = 0; i < old.cap; i++)
        if (old.slots[i].used) *strmap_find(m, old.slots[i].key, old.slots[i].len) = old.slots[i];
    free(old.slots);
    return 0;
}

int kiln_strmap_put(kiln_strmap *m, const char *key, size_t len, int64_t v, int64_t **slot) {
    if (!m->slots && kiln_strmap_init(m, 16)) return -1;
    if (len > UINT32_MAX) return -1;
    kiln_strmap_slot *s = strmap_find(m, key, len);
    if (s->used) {
        if (slot) *slot = &s->value;
        return 0;
    }
    if ((m->n + 1) * 2 > m->cap) {
        if (strmap_grow(m)) return -1;
        s = strmap_find(m, key, len);
    }
    *s = (kiln_strmap_slot){key, (uint32_t)len, 1, v};
    m->n++;
    if (slot) *slot = &s->value;
    return 1;
}

int kiln_u64map_init(kiln_u64map *m, size_t expected) {
    m->cap = cap_for(expected);
    m->n = 0;
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    m->used = calloc(m->cap, 1);
    if (!m->keys || !m->vals || !m->used) {
        kiln_u64map_free(m);
        return -1;
    }
    return 0;
}

void kiln_u64map_free(kiln_u64map *m) {
    free(m->keys);
    free(m->vals);
    free(m->used);
    m->keys = m->vals = NULL;
    m->used = NULL;
    m->cap = m->n = 0;
}

static size_t u64_find(const kiln_u64map *m, uint64_t key) {
    size_t mask = m->cap - 1, i = (size_t)mix64(key) & mask;
    while (m->used[i] && m->keys[i] != key) i = (i + 1) & mask;
    return i;
}

uint64_t *kiln_u64map_get(const kiln_u64map *m, uint64_t key) {
    if (!m->used) return NULL;
    size_t i = u64_find(m, key);
    return m->used[i] ? &m->vals[i] : NULL;
}

int kiln_u64map_put(kiln_u64map *m, uint64_t key, uint64_t v, uint64_t **slot) {
    if (!m->used && kiln_u64map_init(m, 16)) return -1;
    size_t i = u64_find(m, key);
    if (m->used[i]) {
        if (slot) *slot = &m->vals[i];
        return 0;
    }
    if ((m->n + 1) * 2 > m->cap) {
        kiln_u64map old = *m, nm;
        if (kiln_u64map_init(&nm, old.cap)) return -1;
        for (size_t k = 0; k < old.cap; k++)
            if (old.used[k]) {
                size_t j = u64_find(&nm, old.keys[k]);
                nm.used[j] = 1;
                nm.keys[j] = old.keys[k];
                nm.vals[j] = old.vals[k];
            }
        nm.n = old.n;
        kiln_u64map_free(&old);
        *m = nm;
        i = u64_find(m, key);
    }
    m->used[i] = 1;
    m->keys[i] = key;
    m->vals[i] = v;
    m->n++;
    if (slot) *slot = &m->vals[i];
    return 1;
}
