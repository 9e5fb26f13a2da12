/* Growable buffers of the tokenizer area: bytes (kiln_buf), string lists (kiln_pieces), ids. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

int kiln_buf_reserve(kiln_buf *b, size_t extra) {
    if (b->cap - b->n >= extra && b->p) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->n < extra) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int kiln_buf_put(kiln_buf *b, const void *data, size_t n) {
    if (kiln_buf_reserve(b, n + 1)) return -1;
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0; /* always NUL-terminated for convenience */
    return 0;
}

int kiln_buf_putc(kiln_buf *b, char c) { return kiln_buf_put(b, &c, 1); }

int kiln_buf_put_cp(kiln_buf *b, uint32_t cp) {
    char u[4];
    int n = kiln_utf8_encode(cp, u);
    return kiln_buf_put(b, u, (size_t)n);
}

void kiln_buf_free(kiln_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

int kiln_pieces_add_tail(kiln_pieces *p, size_t len, int64_t id, size_t z) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        kiln_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (kiln_piece){p->text.n - len, len, id, z};
    return 0;
}

int kiln_pieces_add(kiln_pieces *p, const char *s, size_t len, int64_t id, size_t z) {
    if (kiln_buf_put(&p->text, s, len)) return -1;
    return kiln_pieces_add_tail(p, len, id, z);
}

void kiln_pieces_clear(kiln_pieces *p) {
    p->n = 0;
    p->text.n = 0;
}

void kiln_pieces_free(kiln_pieces *p) {
    kiln_buf_free(&p->text);
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

int kiln_ids_push(kiln_ids *ids, int64_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int64_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return -1;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}
