/* Decoders: token strings -> text, as HF's decoders do it (each decoder maps the list of token
 * strings to a new list; the result is joined). Supported: ByteLevel, Replace (literal pattern),
 * ByteFallback, Fuse, Strip and Metaspace, alone or in a Sequence. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

#define TOK(ps, i) ((ps)->text.p + (ps)->v[i].off)

static int dec_bytelevel(const kiln_pieces *in, kiln_pieces *out) {
    kiln_buf raw = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        const char *s = TOK(in, i);
        size_t len = in->v[i].len, start = raw.n;
        int all = 1;
        for (size_t k = 0; k < len && all;) {
            size_t w;
            int b = kiln_bytelevel_byte(kiln_utf8_next(s + k, &w));
            if (b < 0) all = 0;
            else rc = kiln_buf_putc(&raw, (char)b);
            k += w;
        }
        if (!all) { /* not all byte-level characters: the token's own bytes */
            raw.n = start;
            rc = kiln_buf_put(&raw, s, len);
        }
    }
    if (!rc) {
        size_t before = out->text.n;
        rc = kiln_utf8_lossy(raw.p ? raw.p : "", raw.n, &out->text);
        if (!rc) rc = kiln_pieces_add_tail(out, out->text.n - before, -1, 0);
    }
    kiln_buf_free(&raw);
    return rc;
}

static int dec_replace(const kiln_dec *d, const kiln_pieces *in, kiln_pieces *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = TOK(in, i);
        size_t len = in->v[i].len, before = out->text.n, prev = 0, pos;
        if (d->alen) {
            while ((pos = kiln_find_next(s, len, prev, d->a, d->alen)) < len) {
                if (kiln_buf_put(&out->text, s + prev, pos - prev) || kiln_buf_put(&out->text, d->b, d->blen)) return -1;
                prev = pos + d->alen;
            }
        }
        if (kiln_buf_put(&out->text, s + prev, len - prev)) return -1;
        if (kiln_pieces_add_tail(out, out->text.n - before, -1, 0)) return -1;
    }
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xNN>" -> its byte (as Rust's u8::from_str_radix(&t[3..5], 16), which takes "+F" too), else -1. */
static int byte_token(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    if (s[3] == '+' && lo >= 0) return lo;
    return hi >= 0 && lo >= 0 ? hi * 16 + lo : -1;
}

static int flush_bytes(kiln_buf *bytes, kiln_pieces *out) {
    if (!bytes->n) return 0;
    int rc = 0;
    if (kiln_utf8_valid_prefix(bytes->p, bytes->n) == bytes->n) {
        rc = kiln_pieces_add(out, bytes->p, bytes->n, -1, 0);
    } else {
        for (size_t k = 0; k < bytes->n && !rc; k++) rc = kiln_pieces_add(out, "\xEF\xBF\xBD", 3, -1, 0);
    }
    bytes->n = 0;
    return rc;
}

static int dec_bytefallback(const kiln_pieces *in, kiln_pieces *out) {
    kiln_buf bytes = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        int b = byte_token(TOK(in, i), in->v[i].len);
        if (b >= 0) {
            rc = kiln_buf_putc(&bytes, (char)b);
        } else {
            rc = flush_bytes(&bytes, out);
            if (!rc) rc = kiln_pieces_add(out, TOK(in, i), in->v[i].len, -1, 0);
        }
    }
    if (!rc) rc = flush_bytes(&bytes, out);
    kiln_buf_free(&bytes);
    return rc;
}

static int dec_fuse(const kiln_pieces *in, kiln_pieces *out) {
    size_t before = out->text.n;
    for (size_t i = 0; i < in->n; i++)
        if (kiln_buf_put(&out->text, TOK(in, i), in->v[i].len)) return -1;
    if (kiln_buf_put(&out->text, "", 0)) return -1;
    return kiln_pieces_add_tail(out, out->text.n - before, -1, 0);
}

static int dec_strip(const kiln_dec *d, const kiln_pieces *in, kiln_pieces *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = TOK(in, i);
        size_t len = in->v[i].len, a = 0, b = len, w;
        for (int64_t k = 0; k < d->start && a < len; k++) {
            if (kiln_utf8_next(s + a, &w) != d->content) break;
            a += w;
        }
        for (int64_t k = 0; k < d->stop && b > a; k++) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
            if (kiln_utf8_next(s + j, &w) != d->content) break;
            b = j;
        }
        if (kiln_pieces_add(out, s + a, b - a, -1, 0)) return -1;
    }
    return 0;
}

static int dec_metaspace(const kiln_dec *d, const kiln_pieces *in, kiln_pieces *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = TOK(in, i);
        size_t len = in->v[i].len, before = out->text.n, prev = 0, pos;
        int drop = i == 0 && d->prepend_scheme != KILN_PREPEND_NEVER;
        while ((pos = kiln_find_next(s, len, prev, d->a, d->alen)) < len) {
            if (kiln_buf_put(&out->text, s + prev, pos - prev)) return -1;
            if (!drop && kiln_buf_putc(&out->text, ' ')) return -1;
            prev = pos + d->alen;
        }
        if (kiln_buf_put(&out->text, s + prev, len - prev)) return -1;
        if (kiln_pieces_add_tail(out, out->text.n - before, -1, 0)) return -1;
    }
    return 0;
}

int kiln_decode_chain(const kiln_dec *steps, size_t nsteps, kiln_pieces *tokens, kiln_buf *out) {
    kiln_pieces a = *tokens, b = {0};
    int rc = 0;
    for (size_t i = 0; i < nsteps && !rc; i++) {
        kiln_pieces_clear(&b);
        const kiln_dec *d = &steps[i];
        switch (d->kind) {
        case KILN_DEC_BYTELEVEL: rc = dec_bytelevel(&a, &b); break;
        case KILN_DEC_REPLACE: rc = dec_replace(d, &a, &b); break;
        case KILN_DEC_BYTEFALLBACK: rc = dec_bytefallback(&a, &b); break;
        case KILN_DEC_FUSE: rc = dec_fuse(&a, &b); break;
        case KILN_DEC_STRIP: rc = dec_strip(d, &a, &b); break;
        case KILN_DEC_METASPACE: rc = dec_metaspace(d, &a, &b); break;
        default: rc = -1;
        }
        kiln_pieces t = a;
        a = b;
        b = t;
    }
    out->n = 0;
    /* a piece may be empty with no text behind it at all (a.text.p NULL): skipped, not offset from NULL */
    for (size_t i = 0; i < a.n && !rc; i++)
        if (a.v[i].len) rc = kiln_buf_put(out, a.text.p + a.v[i].off, a.v[i].len);
    if (!rc) rc = kiln_buf_put(out, "", 0);
    /* the caller owns *tokens: hand back whichever buffers are left */
    *tokens = a;
    kiln_pieces_free(&b);
    return rc;
}
