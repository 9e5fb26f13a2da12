/* A binary heap of fixed-size elements ordered by a "before" function: the priority queue of the
 * BPE merge loop (bpe.c) and of the BPE trainer (train_bpe.c). Internal to src/tokenizer.
 *
 * The functions are static inline on purpose: in the hot BPE merge loop the compiler then sees the
 * element size and the comparison as constants and compiles them like a hand-written heap. */
#ifndef KILN_TOKENIZER_HEAP_H
#define KILN_TOKENIZER_HEAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Nonzero when a must come out before b. */
typedef int (*kiln_heap_before)(const void *a, const void *b);

typedef struct {
    unsigned char *v; /* n elements of size bytes, in heap order */
    size_t n, cap;
    size_t size, first_cap; /* bytes per element; capacity of the first allocation */
    kiln_heap_before before;
} kiln_heap;

/* An empty heap; nothing is allocated until the first push. */
static inline kiln_heap kiln_heap_make(size_t size, size_t first_cap, kiln_heap_before before) {
    return (kiln_heap){NULL, 0, 0, size, first_cap, before};
}

/* Element i in storage order (0 <= i < n), e.g. to free what the elements own. */
static inline void *kiln_heap_at(const kiln_heap *h, size_t i) { return h->v + i * h->size; }

/* Insert a copy of *item (which must not point into the heap). 0, or -1 when out of memory (the heap
 * is unchanged then). */
static inline int kiln_heap_push(kiln_heap *h, const void *item) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : h->first_cap;
        if (cap <= h->cap || cap > SIZE_MAX / h->size) return -1;
        unsigned char *v = realloc(h->v, cap * h->size);
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    /* sift up: parents move down into the hole until item's place is found */
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!h->before(item, kiln_heap_at(h, p))) break;
        memcpy(kiln_heap_at(h, i), kiln_heap_at(h, p), h->size);
        i = p;
    }
    memcpy(kiln_heap_at(h, i), item, h->size);
    return 0;
}

/* Remove the first element into *out (the heap must not be empty). */
static inline void kiln_heap_pop(kiln_heap *h, void *out) {
    memcpy(out, h->v, h->size);
    const void *last = kiln_heap_at(h, --h->n); /* stays put: the sift below writes below n */
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->before(kiln_heap_at(h, c + 1), kiln_heap_at(h, c))) c++;
        if (!h->before(kiln_heap_at(h, c), last)) break;
        memcpy(kiln_heap_at(h, i), kiln_heap_at(h, c), h->size);
        i = c;
    }
    if (h->n) memcpy(kiln_heap_at(h, i), last, h->size);
}

static inline void kiln_heap_free(kiln_heap *h) {
    free(h->v);
    h->v = NULL;
    h->n = h->cap = 0;
}

#endif
