/* Pre-tokenizers: the GPT-2 and Llama-3 split regexes as hand-written scanners, and HF's Split,
 * ByteLevel and Metaspace pre-tokenizers over a list of pieces.
 *
 * The regexes are run by HF `tokenizers` with Oniguruma: alternation is leftmost-first (the first
 * alternative that matches at a position wins, with backtracking inside it), \s is White_Space,
 * \p{L} and \p{N} are general categories. Each scanner below tries the alternatives in order at
 * a position; both patterns match at every position, so find_iter is "scan, then continue at the
 * end of the match".
 *
 *   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *
 * \s+(?!\S): the greedy run of white space, backtracking so that the next character is not a
 * non-space: a run that reaches the end matches whole; a run followed by a non-space gives up its
 * last character (if it has two or more), and a single space there falls through to \s+.
 * \s*[\r\n]+: the run of white space up to and including its last \r or \n. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

const char kiln_regex_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char kiln_regex_llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* CLIP (openai/clip-*, applied after its Lowercase normalizer, so without the original's IGNORECASE) */
const char kiln_regex_clip[] = "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|"
                               "[^\\s\\p{L}\\p{N}]+";

int kiln_regex_kind(const char *pattern) {
    if (!strcmp(pattern, kiln_regex_gpt2)) return KILN_RE_GPT2;
    if (!strcmp(pattern, kiln_regex_llama3)) return KILN_RE_LLAMA3;
    if (!strcmp(pattern, kiln_regex_clip)) return KILN_RE_CLIP;
    return 0;
}

#define CL KILN_UNI_L
#define CN KILN_UNI_N
#define CWS KILN_UNI_WS

/* Flags of the character at s[i] (i < len); *w gets its byte length, *cp the code point. */
static inline unsigned char_at(const char *s, size_t i, size_t *w, uint32_t *cp) {
    uint32_t c = kiln_utf8_next(s + i, w);
    if (cp) *cp = c;
    return kiln_uni_flags(c);
}

static inline int is_other(unsigned f) { return !(f & (CL | CN | CWS)); }

/* End of the run of characters whose flags satisfy the class, from i. */
enum { RUN_L, RUN_N, RUN_OTHER, RUN_WS };
static size_t run(const char *s, size_t len, size_t i, int cls) {
    while (i < len) {
        size_t w;
        unsigned f = char_at(s, i, &w, NULL);
        int ok = cls == RUN_L ? (f & CL) != 0 : cls == RUN_N ? (f & CN) != 0 : cls == RUN_WS ? (f & CWS) != 0 : is_other(f);
        if (!ok) break;
        i += w;
    }
    return i;
}

/* \s+(?!\S) then \s+ at pos (s[pos] is white space). */
static size_t ws_tail(const char *s, size_t len, size_t pos) {
    size_t i = pos, last = pos;
    while (i < len) {
        size_t w;
        unsigned f = char_at(s, i, &w, NULL);
        if (!(f & CWS)) break;
        last = i;
        i += w;
    }
    if (i == len) return i;  /* (?!\S) holds at the end */
    if (last > pos) return last; /* give up the last character */
    return i;                /* \s+ */
}

size_t kiln_scan_gpt2(const char *s, size_t len, size_t pos) {
    size_t w;
    uint32_t c;
    unsigned f = char_at(s, pos, &w, &c);
    if (c == '\'' && pos + 1 < len) {
        char a = s[pos + 1], b = pos + 2 < len ? s[pos + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
    }
    if (c == ' ' && pos + 1 < len) {
        size_t w2;
        unsigned g = char_at(s, pos + 1, &w2, NULL);
        if (g & CL) return run(s, len, pos + 1, RUN_L);
        if (g & CN) return run(s, len, pos + 1, RUN_N);
        if (is_other(g)) return run(s, len, pos + 1, RUN_OTHER);
    }
    if (f & CL) return run(s, len, pos, RUN_L);
    if (f & CN) return run(s, len, pos, RUN_N);
    if (is_other(f)) return run(s, len, pos, RUN_OTHER);
    return ws_tail(s, len, pos);
}

size_t kiln_scan_llama3(const char *s, size_t len, size_t pos) {
    size_t w;
    uint32_t c;
    unsigned f = char_at(s, pos, &w, &c);
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (c == '\'' && pos + 1 < len) {
        size_t wa, wb;
        uint32_t ca, cb;
        char_at(s, pos + 1, &wa, &ca);
        int fa = kiln_uni_fold_ascii_letter(ca);
        if (fa == 's' || fa == 't' || fa == 'm' || fa == 'd') return pos + 1 + wa;
        if ((fa == 'r' || fa == 'v' || fa == 'l') && pos + 1 + wa < len) {
            char_at(s, pos + 1 + wa, &wb, &cb);
            int fb = kiln_uni_fold_ascii_letter(cb);
            if (((fa == 'r' || fa == 'v') && fb == 'e') || (fa == 'l' && fb == 'l')) return pos + 1 + wa + wb;
        }
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c != '\r' && c != '\n' && !(f & (CL | CN)) && pos + w < len) {
        size_t w2;
        unsigned g = char_at(s, pos + w, &w2, NULL);
        if (g & CL) return run(s, len, pos + w, RUN_L);
    }
    if (f & CL) return run(s, len, pos, RUN_L);
    /* \p{N}{1,3} */
    if (f & CN) {
        size_t i = pos + w;
        for (int k = 1; k < 3 && i < len; k++) {
            size_t w2;
            if (!(char_at(s, i, &w2, NULL) & CN)) break;
            i += w2;
        }
        return i;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t q = (size_t)-1;
    if (c == ' ' && pos + 1 < len) {
        size_t w2;
        if (is_other(char_at(s, pos + 1, &w2, NULL))) q = pos + 1;
    }
    if (q == (size_t)-1 && is_other(f)) q = pos;
    if (q != (size_t)-1) {
        size_t e = run(s, len, q, RUN_OTHER);
        while (e < len && (s[e] == '\r' || s[e] == '\n')) e++;
        return e;
    }
    /* \s*[\r\n]+ : up to and including the last \r or \n of the white-space run */
    size_t i = pos, nl = (size_t)-1;
    while (i < len) {
        size_t w2;
        uint32_t c2;
        if (!(char_at(s, i, &w2, &c2) & CWS)) break;
        if (c2 == '\r' || c2 == '\n') nl = i;
        i += w2;
    }
    if (nl != (size_t)-1) return nl + 1;
    return ws_tail(s, len, pos);
}

/* ---------------------------------------------------------------- splitting helpers */

size_t kiln_find_next(const char *s, size_t len, size_t from, const char *pat, size_t plen) {
    if (plen == 0 || len < plen) return len;
    for (size_t i = from; i + plen <= len;) {
        const char *p = memchr(s + i, pat[0], len - plen + 1 - i);
        if (!p) return len;
        i = (size_t)(p - s);
        if (memcmp(s + i, pat, plen) == 0) return i;
        i++;
    }
    return len;
}

/* CLIP: the special-token literals, the contractions, a run of letters, ONE digit, a run of other
 * non-space characters; white space matches nothing (returns pos). */
size_t kiln_scan_clip(const char *s, size_t len, size_t pos) {
    static const char *const lit[] = {"<|startoftext|>", "<|endoftext|>", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t i = 0; i < sizeof lit / sizeof lit[0]; i++) {
        size_t l = strlen(lit[i]);
        if (len - pos >= l && !memcmp(s + pos, lit[i], l)) return pos + l;
    }
    size_t w;
    unsigned f = char_at(s, pos, &w, NULL);
    if (f & CL) return run(s, len, pos, RUN_L);
    if (f & CN) return pos + w;
    if (is_other(f)) return run(s, len, pos, RUN_OTHER);
    return pos;
}

/* z of the slice [a, b) of a piece whose first z bytes are at original offset 0. */
static size_t slice_z(size_t z, size_t a, size_t b) { return a < z ? (z < b ? z : b) - a : 0; }

typedef struct {
    size_t a, b;
    int match;
} seg;
typedef struct {
    seg *v;
    size_t n, cap;
} segs;

static int segs_push(segs *s, size_t a, size_t b, int match) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        seg *v = realloc(s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (seg){a, b, match};
    return 0;
}

/* Pattern::find_matches: segments covering s, matches flagged. */
static int find_matches(const kiln_pretok *pt, const char *s, size_t len, segs *out) {
    out->n = 0;
    if (pt->regex) {
        size_t pos = 0, gap = 0;
        while (pos < len) {
            size_t e = pt->regex == KILN_RE_GPT2     ? kiln_scan_gpt2(s, len, pos)
                       : pt->regex == KILN_RE_LLAMA3 ? kiln_scan_llama3(s, len, pos)
                                                     : kiln_scan_clip(s, len, pos);
            if (e == pos) { /* no match here: the character joins the unmatched gap */
                pos += kiln_utf8_len((unsigned char)s[pos]);
                continue;
            }
            if (pos > gap && segs_push(out, gap, pos, 0)) return -1;
            if (segs_push(out, pos, e, 1)) return -1;
            pos = gap = e;
        }
        if (gap < len && segs_push(out, gap, len, 0)) return -1;
        return 0;
    }
    if (pt->str_len == 0) return segs_push(out, 0, len, 0);
    size_t prev = 0, pos = 0;
    while ((pos = kiln_find_next(s, len, pos, pt->str, pt->str_len)) < len) {
        if (pos > prev && segs_push(out, prev, pos, 0)) return -1;
        if (segs_push(out, pos, pos + pt->str_len, 1)) return -1;
        pos += pt->str_len;
        prev = pos;
    }
    if (prev < len && segs_push(out, prev, len, 0)) return -1;
    return 0;
}

/* NormalizedString::split's SplitDelimiterBehavior over the segments (in place): the result is
 * the list of kept ranges (match = 1 means "remove"). */
static void apply_behavior(segs *m, int behavior) {
    size_t n = 0;
    int prev = 0;
    switch (behavior) {
    case KILN_SPLIT_ISOLATED:
        for (size_t i = 0; i < m->n; i++) m->v[i].match = 0;
        return;
    case KILN_SPLIT_REMOVED:
        return;
    case KILN_SPLIT_PREV:
        for (size_t i = 0; i < m->n; i++) {
            seg s = m->v[i];
            if (s.match && !prev && n > 0) m->v[n - 1].b = s.b;
            else m->v[n++] = (seg){s.a, s.b, 0};
            prev = s.match;
        }
        break;
    case KILN_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < m->n; i++) {
            seg s = m->v[i];
            if (s.match == prev && n > 0) m->v[n - 1].b = s.b;
            else m->v[n++] = (seg){s.a, s.b, 0};
            prev = s.match;
        }
        break;
    case KILN_SPLIT_NEXT: {
        /* fold from the end, then reverse */
        size_t w = m->n; /* results are written downwards from the end */
        for (size_t k = m->n; k-- > 0;) {
            seg s = m->v[k];
            if (s.match && !prev && w < m->n) m->v[w].a = s.a;
            else m->v[--w] = (seg){s.a, s.b, 0};
            prev = s.match;
        }
        memmove(m->v, m->v + w, (m->n - w) * sizeof *m->v);
        n = m->n - w;
        break;
    }
    }
    m->n = n;
}

/* Emit the kept non-empty segments of piece text s (z as in kiln_piece) into out; with bytelevel,
 * each is mapped to GPT-2's byte-level characters. */
static int emit(const segs *m, const char *s, size_t z, int bytelevel, kiln_pieces *out) {
    for (size_t i = 0; i < m->n; i++) {
        const seg *g = &m->v[i];
        if (g->match || g->b == g->a) continue;
        size_t sz = slice_z(z, g->a, g->b);
        if (!bytelevel) {
            if (kiln_pieces_add(out, s + g->a, g->b - g->a, -1, sz)) return -1;
            continue;
        }
        size_t before = out->text.n, zb = 0;
        if (kiln_bytelevel_encode(s + g->a, g->b - g->a, &out->text)) return -1;
        for (size_t k = 0; k < sz; k++) {
            size_t l;
            kiln_bytelevel_utf8((unsigned char)s[g->a + k], &l);
            zb += l;
        }
        if (kiln_pieces_add_tail(out, out->text.n - before, -1, zb)) return -1;
    }
    return 0;
}

int kiln_pretok_apply(const kiln_pretok *pt, const kiln_pieces *in, kiln_pieces *out) {
    segs m = {0};
    kiln_buf tmp = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        const kiln_piece *p = &in->v[i];
        const char *s = in->text.p + p->off;
        size_t len = p->len, z = p->z;
        if (p->id >= 0) {
            rc = kiln_pieces_add(out, s, len, p->id, z);
            continue;
        }
        switch (pt->kind) {
        case KILN_PRE_BYTELEVEL:
            if (pt->add_prefix_space && len > 0 && s[0] != ' ') {
                tmp.n = 0;
                if ((rc = kiln_buf_putc(&tmp, ' ')) || (rc = kiln_buf_put(&tmp, s, len))) break;
                s = tmp.p;
                len = tmp.n;
                if (z) z++;
            }
            m.n = 0;
            if (pt->use_regex) {
                kiln_pretok re = {.regex = KILN_RE_GPT2};
                rc = find_matches(&re, s, len, &m);
                if (!rc) apply_behavior(&m, KILN_SPLIT_ISOLATED);
            } else {
                rc = segs_push(&m, 0, len, 0);
            }
            if (!rc) rc = emit(&m, s, z, 1, out);
            break;
        case KILN_PRE_SPLIT:
            rc = find_matches(pt, s, len, &m);
            if (rc) break;
            if (pt->invert)
                for (size_t k = 0; k < m.n; k++) m.v[k].match = !m.v[k].match;
            apply_behavior(&m, pt->behavior);
            rc = emit(&m, s, z, 0, out);
            break;
        case KILN_PRE_METASPACE: {
            /* replace ' ' by the replacement, then maybe prepend it, then split before each one */
            tmp.n = 0;
            size_t nz = 0;
            for (size_t k = 0; k < len && !rc; k++) {
                if (k == z) nz = tmp.n;
                rc = s[k] == ' ' ? kiln_buf_put(&tmp, pt->str, pt->str_len) : kiln_buf_putc(&tmp, s[k]);
            }
            if (rc) break;
            if (z >= len) nz = tmp.n;
            z = z ? nz : 0;
            int starts = tmp.n >= pt->str_len && memcmp(tmp.p, pt->str, pt->str_len) == 0;
            int pre = tmp.n > 0 && !starts &&
                      (pt->prepend_scheme == KILN_PREPEND_ALWAYS || (pt->prepend_scheme == KILN_PREPEND_FIRST && z > 0));
            if (pre) {
                size_t old = tmp.n;
                if ((rc = kiln_buf_reserve(&tmp, pt->str_len + 1))) break;
                memmove(tmp.p + pt->str_len, tmp.p, old);
                memcpy(tmp.p, pt->str, pt->str_len);
                tmp.n = old + pt->str_len;
                tmp.p[tmp.n] = 0;
                if (z) z += pt->str_len;
            }
            m.n = 0;
            if (pt->split) {
                kiln_pretok sp = {.str = pt->str, .str_len = pt->str_len};
                rc = find_matches(&sp, tmp.p ? tmp.p : "", tmp.n, &m);
                if (!rc) apply_behavior(&m, KILN_SPLIT_NEXT);
            } else {
                rc = segs_push(&m, 0, tmp.n, 0);
            }
            if (!rc) rc = emit(&m, tmp.p ? tmp.p : "", z, 0, out);
            break;
        }
        default:
            rc = -1;
        }
    }
    free(m.v);
    kiln_buf_free(&tmp);
    return rc;
}
