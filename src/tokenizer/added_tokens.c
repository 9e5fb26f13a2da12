/* Added tokens (special or not) are cut out of the text before the model sees it, as HF's
 * AddedVocabulary does: a leftmost-longest match over all contents (an Aho-Corasick automaton
 * there, a byte trie here), then lstrip/rstrip widen the match over neighbouring white space. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static int32_t new_node(kiln_trie *t, unsigned char byte) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        kiln_trie_node *v = realloc(t->nodes, cap * sizeof *v);
        if (!v) return -1;
        t->nodes = v;
        t->cap = cap;
    }
    t->nodes[t->n] = (kiln_trie_node){-1, -1, -1, byte};
    return (int32_t)t->n++;
}

int kiln_trie_add(kiln_trie *t, const char *s, size_t len, int32_t match) {
    if (len == 0) return 0; /* an empty pattern never splits anything */
    if (t->n == 0 && new_node(t, 0) < 0) return -1;
    t->first[(unsigned char)s[0] >> 3] |= (unsigned char)(1u << ((unsigned char)s[0] & 7));
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int32_t ch = t->nodes[node].child;
        while (ch >= 0 && t->nodes[ch].byte != c) ch = t->nodes[ch].sibling;
        if (ch < 0) {
            if ((ch = new_node(t, c)) < 0) return -1;
            t->nodes[ch].sibling = t->nodes[node].child;
            t->nodes[node].child = ch;
        }
        node = ch;
    }
    if (t->nodes[node].match < 0) t->nodes[node].match = match; /* the first of equal patterns wins */
    return 0;
}

void kiln_trie_free(kiln_trie *t) {
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

int kiln_trie_find(const kiln_trie *t, const char *s, size_t len, size_t from, size_t *start, size_t *end,
                   int32_t *match) {
    if (t->n == 0) return 0;
    for (size_t i = from; i < len; i++) {
        unsigned char c0 = (unsigned char)s[i];
        if (!(t->first[c0 >> 3] & (1u << (c0 & 7)))) continue;
        int32_t node = 0, best = -1;
        size_t best_end = 0;
        for (size_t k = i; k < len; k++) {
            unsigned char c = (unsigned char)s[k];
            int32_t ch = t->nodes[node].child;
            while (ch >= 0 && t->nodes[ch].byte != c) ch = t->nodes[ch].sibling;
            if (ch < 0) break;
            node = ch;
            if (t->nodes[node].match >= 0) {
                best = t->nodes[node].match;
                best_end = k + 1;
            }
        }
        if (best >= 0) {
            *start = i;
            *end = best_end;
            *match = best;
            return 1;
        }
    }
    return 0;
}

static int is_ws_at(const char *s, size_t i, size_t *w) {
    return (kiln_uni_flags(kiln_utf8_next(s + i, w)) & KILN_UNI_WS) != 0;
}

/* Start of the white-space run that ends s[0..end) (Rust regex \s*$). */
static size_t ws_run_before(const char *s, size_t end) {
    size_t i = end;
    while (i > 0) {
        size_t j = i - 1, w;
        while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        if (!is_ws_at(s, j, &w)) break;
        i = j;
    }
    return i;
}

static size_t slice_z(size_t z, size_t a, size_t b) { return a < z ? (z < b ? z : b) - a : 0; }

int kiln_added_split(const kiln_trie *t, const kiln_added *tokens, const kiln_pieces *in, kiln_pieces *out) {
    for (size_t i = 0; i < in->n; i++) {
        const kiln_piece *p = &in->v[i];
        const char *s = in->text.p + p->off;
        size_t len = p->len;
        if (p->id >= 0 || t->n == 0) {
            if (kiln_pieces_add(out, s, len, p->id, p->z)) return -1;
            continue;
        }
        size_t start_offset = 0, pos = 0, a, b;
        int32_t m;
        while (kiln_trie_find(t, s, len, pos, &a, &b, &m)) {
            const kiln_added *tok = &tokens[m];
            size_t start = a, stop = b;
            pos = b;
            if (tok->lstrip) {
                size_t ns = ws_run_before(s, start);
                start = ns > start_offset ? ns : start_offset;
            }
            if (tok->rstrip) {
                size_t w;
                while (stop < len && is_ws_at(s, stop, &w)) stop += w;
            }
            if (start_offset < start && kiln_pieces_add(out, s + start_offset, start - start_offset, -1,
                                                        slice_z(p->z, start_offset, start)))
                return -1;
            if (kiln_pieces_add(out, s + start, stop > start ? stop - start : 0, tok->id, 0)) return -1;
            start_offset = stop;
        }
        if (start_offset < len &&
            kiln_pieces_add(out, s + start_offset, len - start_offset, -1, slice_z(p->z, start_offset, len)))
            return -1;
    }
    return 0;
}
