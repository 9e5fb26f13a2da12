/* Normalizers: Replace (literal pattern, or the regex \s+), Prepend, NFC and Lowercase, applied in
 * sequence to one piece of
 * text, as HF's normalizers::Sequence does. Each also carries the piece's `z` (how many leading
 * bytes sit at original offset 0; see kiln_piece), which Metaspace's prepend_scheme "first" reads. */
#include <string.h>

#include "tokenizer_internal.h"

/* Replace every non-overlapping occurrence of a by b (HF NormalizedString::replace). */
static int replace(const kiln_norm *n, const char *s, size_t len, kiln_buf *out, size_t *z) {
    size_t prev = 0, pos = 0, nz = 0, zin = *z;
    int zset = zin == 0;
    while ((pos = kiln_find_next(s, len, prev, n->a, n->alen)) < len) {
        if (!zset && zin <= pos) {
            nz = out->n + (zin - prev);
            zset = 1;
        }
        if (kiln_buf_put(out, s + prev, pos - prev) || kiln_buf_put(out, n->b, n->blen)) return -1;
        prev = pos + n->alen;
        if (!zset && zin <= prev) {
            nz = out->n;
            zset = 1;
        }
    }
    if (!zset) nz = out->n + (zin - prev);
    if (kiln_buf_put(out, s + prev, len - prev)) return -1;
    *z = zin ? nz : 0;
    return 0;
}

/* Each maximal run of White_Space characters becomes b (HF Replace with Regex("\s+"), CLIP's). */
static int replace_ws(const kiln_norm *n, const char *s, size_t len, kiln_buf *out) {
    size_t i = 0;
    while (i < len) {
        size_t w;
        uint32_t c = kiln_utf8_next(s + i, &w);
        if (!(kiln_uni_flags(c) & KILN_UNI_WS)) {
            if (kiln_buf_put(out, s + i, w)) return -1;
            i += w;
            continue;
        }
        while (i < len && (kiln_uni_flags(kiln_utf8_next(s + i, &w)) & KILN_UNI_WS)) i += w;
        if (kiln_buf_put(out, n->b, n->blen)) return -1;
    }
    return 0;
}

/* Rust's char::to_lowercase on every character (HF NormalizedString::lowercase). */
static int lowercase(const char *s, size_t len, kiln_buf *out) {
    for (size_t i = 0; i < len;) {
        size_t w;
        uint32_t c = kiln_utf8_next(s + i, &w), lo[3];
        int n = kiln_uni_to_lower(c, lo);
        for (int k = 0; k < n; k++)
            if (kiln_buf_put_cp(out, lo[k])) return -1;
        i += w;
    }
    return 0;
}

int kiln_normalize(const kiln_norm *steps, size_t nsteps, const char *s, size_t len, kiln_buf *out, size_t *z) {
    kiln_buf a = {0}, b = {0};
    int rc = 0;
    out->n = 0;
    if (kiln_buf_put(&a, s, len)) return -1;
    for (size_t i = 0; i < nsteps && !rc; i++) {
        const kiln_norm *n = &steps[i];
        b.n = 0;
        switch (n->kind) {
        case KILN_NORM_REPLACE:
            if (n->alen == 0) rc = kiln_buf_put(&b, a.p, a.n);
            else rc = replace(n, a.p, a.n, &b, z);
            break;
        case KILN_NORM_PREPEND:
            if (a.n > 0) {
                rc = kiln_buf_put(&b, n->a, n->alen) || kiln_buf_put(&b, a.p, a.n);
                if (*z) *z += n->alen;
            } else {
                rc = kiln_buf_put(&b, "", 0);
            }
            break;
        case KILN_NORM_REPLACE_WS:
            rc = replace_ws(n, a.p, a.n, &b);
            if (*z) *z = *z < b.n ? *z : b.n; /* only Metaspace reads z; CLIP has none */
            break;
        case KILN_NORM_LOWERCASE:
            rc = lowercase(a.p, a.n, &b);
            if (*z) *z = *z < b.n ? *z : b.n;
            break;
        case KILN_NORM_NFC:
            rc = kiln_uni_nfc(a.p, a.n, &b, NULL);
            if (!rc && *z) {
                /* the output of the leading bytes: close enough for composition across the edge */
                kiln_buf t = {0};
                rc = kiln_uni_nfc(a.p, *z < a.n ? *z : a.n, &t, NULL);
                *z = t.n < b.n ? t.n : b.n;
                kiln_buf_free(&t);
            }
            break;
        default:
            rc = -1;
        }
        kiln_buf t = a;
        a = b;
        b = t;
    }
    if (!rc) rc = kiln_buf_put(out, a.p, a.n);
    kiln_buf_free(&a);
    kiln_buf_free(&b);
    return rc;
}
