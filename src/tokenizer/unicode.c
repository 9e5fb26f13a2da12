/* UTF-8 helpers and the Unicode operations the tokenizer needs: case folding onto ASCII letters
 * (the Llama-3 regex's (?i:...)), canonical combining classes and NFC. The tables live in the
 * generated unicode_tables.c (tools/gen_unicode_tables.py). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

int kiln_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at s[i] (1..4), or 0 if it is not one, following the
 * well-formed byte sequences of Unicode table 3-7 (no overlongs, surrogates or > U+10FFFF). With
 * `partial` set, instead returns how many bytes of a maximal invalid subsequence to skip (>= 1),
 * as Rust's from_utf8_lossy does. */
static size_t utf8_seq(const unsigned char *s, size_t len, size_t i, int partial) {
    unsigned char c = s[i];
    if (c < 0x80) return 1;
    size_t width = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (!width) return partial ? 1 : 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    for (size_t k = 1; k < width; k++) {
        if (i + k >= len) return partial ? k : 0;
        unsigned char d = s[i + k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return partial ? k : 0;
    }
    return partial ? 0 : width;
}

size_t kiln_utf8_valid_prefix(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t w = utf8_seq(s, len, i, 0);
        if (!w) return i;
        i += w;
    }
    return len;
}

int kiln_utf8_lossy(const char *str, size_t len, kiln_buf *out) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        size_t start = i;
        while (i < len && s[i] < 0x80) i++;
        if (i > start && kiln_buf_put(out, s + start, i - start)) return -1;
        if (i >= len) break;
        size_t w = utf8_seq(s, len, i, 0);
        if (w) {
            if (kiln_buf_put(out, s + i, w)) return -1;
            i += w;
        } else {
            if (kiln_buf_put(out, "\xEF\xBF\xBD", 3)) return -1;
            i += utf8_seq(s, len, i, 1);
        }
    }
    return 0;
}

int kiln_uni_fold_ascii_letter(uint32_t cp) {
    if (cp < 0x80) {
        if (cp >= 'A' && cp <= 'Z') return (int)(cp - 'A' + 'a');
        if (cp >= 'a' && cp <= 'z') return (int)cp;
        return 0;
    }
    for (size_t i = 0; i < kiln_uni_fold_ascii_n; i++)
        if (kiln_uni_fold_ascii[i][0] == cp) return (int)kiln_uni_fold_ascii[i][1];
    return 0;
}

unsigned kiln_uni_ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = kiln_uni_ccc_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < kiln_uni_ccc[mid][0]) hi = mid;
        else if (cp > kiln_uni_ccc[mid][1]) lo = mid + 1;
        else return kiln_uni_ccc[mid][2];
    }
    return 0;
}

/* Hangul syllable constants (Unicode 3.12). */
enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21, TCOUNT = 28,
       NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

static const uint32_t *decomp_of(uint32_t cp, size_t *n) {
    if (cp < 0xC0) return NULL;
    size_t lo = 0, hi = kiln_uni_decomp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < kiln_uni_decomp[mid][0]) hi = mid;
        else if (cp > kiln_uni_decomp[mid][0]) lo = mid + 1;
        else {
            *n = kiln_uni_decomp[mid][2];
            return kiln_uni_decomp_pool + kiln_uni_decomp[mid][1];
        }
    }
    return NULL;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = kiln_uni_comp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = kiln_uni_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1])) hi = mid;
        else if (a > e[0] || b > e[1]) lo = mid + 1;
        else return e[2];
    }
    return 0;
}

int kiln_uni_nfc(const char *s, size_t len, kiln_buf *out, size_t *first_len) {
    size_t start_n = out->n;
    int ascii = 1;
    for (size_t i = 0; i < len && ascii; i++) ascii = (unsigned char)s[i] < 0x80;
    if (ascii) {
        if (first_len) *first_len = len ? 1 : 0;
        return kiln_buf_put(out, s, len);
    }
    /* 1. full canonical decomposition */
    uint32_t *cp = malloc((len * 4 + 4) * sizeof *cp);
    unsigned char *cc = malloc(len * 4 + 4);
    if (!cp || !cc) {
        free(cp);
        free(cc);
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t w;
        uint32_t c = kiln_utf8_next(s + i, &w);
        i += w;
        size_t dn;
        const uint32_t *d;
        if (c >= SBASE && c < SBASE + SCOUNT) {
            uint32_t si = c - SBASE;
            cp[n++] = LBASE + si / NCOUNT;
            cp[n++] = VBASE + (si % NCOUNT) / TCOUNT;
            if (si % TCOUNT) cp[n++] = TBASE + si % TCOUNT;
        } else if ((d = decomp_of(c, &dn)) != NULL) {
            for (size_t k = 0; k < dn; k++) cp[n++] = d[k];
        } else {
            cp[n++] = c;
        }
    }
    /* 2. canonical ordering: stable sort of each run of non-starters by class */
    for (size_t i = 0; i < n; i++) cc[i] = (unsigned char)kiln_uni_ccc_of(cp[i]);
    for (size_t i = 1; i < n; i++) {
        if (!cc[i]) continue;
        for (size_t j = i; j > 0 && cc[j - 1] > cc[j]; j--) {
            uint32_t t = cp[j];
            cp[j] = cp[j - 1];
            cp[j - 1] = t;
            unsigned char tc = cc[j];
            cc[j] = cc[j - 1];
            cc[j - 1] = tc;
        }
    }
    /* 3. canonical composition (UAX #15) */
    size_t m = 0;
    if (n) {
        size_t starter = 0;
        int last_cc = cc[0] ? 256 : 0;
        int have_starter = cc[0] == 0;
        m = 1;
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cp[i];
            int ccl = cc[i];
            uint32_t comp = have_starter ? compose(cp[starter], c) : 0;
            if (comp && (last_cc < ccl || last_cc == 0)) {
                cp[starter] = comp;
                continue;
            }
            if (ccl == 0) {
                starter = m;
                have_starter = 1;
            }
            last_cc = ccl;
            cp[m] = c;
            cc[m] = cc[i];
            m++;
        }
    }
    int rc = 0;
    if (first_len) *first_len = 0;
    for (size_t i = 0; i < m && !rc; i++) {
        rc = kiln_buf_put_cp(out, cp[i]);
        if (i == 0 && first_len) *first_len = out->n - start_n;
    }
    free(cp);
    free(cc);
    return rc;
}

int kiln_uni_to_lower(uint32_t cp, uint32_t out[3]) {
    size_t lo = 0, hi = kiln_uni_lower_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (kiln_uni_lower[mid][0] < cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo < kiln_uni_lower_n && kiln_uni_lower[lo][0] == cp) {
        int n = (int)kiln_uni_lower[lo][1];
        for (int i = 0; i < n; i++) out[i] = kiln_uni_lower[lo][2 + i];
        return n;
    }
    out[0] = cp;
    return 1;
}
