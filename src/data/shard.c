/* Token shard files: the binary format, its writer, and its fully validating mmap reader.
 * See include/kiln/data.h and docs/data-format.md for the layout. */
#include "kiln/data.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kiln/fsutil.h"

/* The writer hands the caller's token and offset arrays to write() as they are. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln's shard writer assumes a little-endian host"
#endif

#define FNV_PRIME 0x100000001b3ULL /* the checksum pass inlines kiln_fnv1a64 */

uint32_t kiln_shard_token_bytes(uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

/* ---- little-endian fields ---- */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

uint32_t kiln_shard_token(const kiln_shard *s, uint64_t i) {
    const unsigned char *p = s->tokens + i * s->h.token_bytes;
    return s->h.token_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : get_u32(p);
}

uint64_t kiln_shard_doc_start(const kiln_shard *s, uint64_t i) { return get_u64(s->offsets + 8 * i); }

void kiln_shard_read(const kiln_shard *s, uint64_t start, uint64_t n, int64_t *dst) {
    const unsigned char *p = s->tokens + start * s->h.token_bytes;
    if (s->h.token_bytes == 2)
        for (uint64_t i = 0; i < n; i++) dst[i] = (int64_t)((uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8);
    else
        for (uint64_t i = 0; i < n; i++) dst[i] = (int64_t)get_u32(p + 4 * i);
}

/* Bytes a shard with this header must have, or 0 when the header's counts overflow 64 bits. */
static uint64_t expected_size(const kiln_shard_header *h) {
    uint64_t tok, off, sum;
    if (__builtin_mul_overflow(h->ntokens, (uint64_t)h->token_bytes, &tok) ||
        __builtin_mul_overflow(h->ndocs, (uint64_t)8, &off) || __builtin_add_overflow(tok, off, &sum) ||
        __builtin_add_overflow(sum, (uint64_t)KILN_SHARD_HEADER_BYTES, &sum))
        return 0;
    return sum;
}

/* ---- writer ---- */

kiln_error *kiln_shard_write_ex(const char *path, const void *tokens, uint64_t ntokens, const uint64_t *doc_starts,
                                uint64_t ndocs, uint64_t vocab_size, uint64_t *checksum) {
    if (vocab_size == 0 || vocab_size > ((uint64_t)1 << 32))
        return kiln_errorf(KILN_EINVAL, "%s: vocab size %" PRIu64 " is outside 1..2^32", path, vocab_size);
    const uint32_t tb = kiln_shard_token_bytes(vocab_size);
    /* one pass: the checksum, and every token < vocab_size */
    const unsigned char *tp = tokens;
    uint64_t hash = KILN_FNV1A64_INIT;
    for (uint64_t i = 0; i < ntokens; i++, tp += tb) {
        uint32_t v = tb == 2 ? (uint32_t)tp[0] | (uint32_t)tp[1] << 8 : get_u32(tp);
        for (uint32_t k = 0; k < tb; k++) hash = (hash ^ tp[k]) * FNV_PRIME;
        if (v >= vocab_size)
            return kiln_errorf(KILN_EINVAL, "%s: token %" PRIu32 " at position %" PRIu64
                               " is outside the vocabulary (size %" PRIu64 ")", path, v, i, vocab_size);
    }
    for (uint64_t i = 0; i < ndocs; i++) {
        if (doc_starts[i] >= ntokens)
            return kiln_errorf(KILN_EINVAL, "%s: document %" PRIu64 " starts at %" PRIu64
                               ", not below the token count %" PRIu64, path, i, doc_starts[i], ntokens);
        if (i > 0 && doc_starts[i] <= doc_starts[i - 1])
            return kiln_errorf(KILN_EINVAL, "%s: document starts not strictly increasing at document %" PRIu64
                               " (%" PRIu64 " after %" PRIu64 ")", path, i, doc_starts[i], doc_starts[i - 1]);
    }
    const size_t tok_bytes = (size_t)ntokens * tb, off_bytes = (size_t)ndocs * 8;
    unsigned char hdr[KILN_SHARD_HEADER_BYTES];
    memcpy(hdr, KILN_SHARD_MAGIC, 8); /* 7 characters and the NUL */
    put_u32(hdr + 8, KILN_SHARD_VERSION);
    put_u32(hdr + 12, tb);
    put_u64(hdr + 16, ntokens);
    put_u64(hdr + 24, ndocs);
    put_u64(hdr + 32, vocab_size);
    put_u64(hdr + 40, hash);

    kiln_atomic_file f;
    KILN_TRY(kiln_atomic_begin(&f, path));
    kiln_error *e = kiln_atomic_write(&f, hdr, sizeof hdr);
    if (!e && tok_bytes) e = kiln_atomic_write(&f, tokens, tok_bytes);
    if (!e && off_bytes) e = kiln_atomic_write(&f, doc_starts, off_bytes);
    if (e) {
        kiln_atomic_abort(&f);
        return e;
    }
    KILN_TRY(kiln_atomic_commit(&f));
    if (checksum) *checksum = hash;
    return NULL;
}

kiln_error *kiln_shard_write(const char *path, const void *tokens, uint64_t ntokens, const uint64_t *doc_starts,
                             uint64_t ndocs, uint64_t vocab_size) {
    return kiln_shard_write_ex(path, tokens, ntokens, doc_starts, ndocs, vocab_size, NULL);
}

/* ---- reader ---- */

void kiln_shard_close(kiln_shard *s) {
    if (!s) return;
    if (s->map) munmap(s->map, s->map_len);
    free(s->path);
    memset(s, 0, sizeof *s);
}

/* Header checks that need only the first min(size, 48) bytes. */
static kiln_error *check_header(const char *path, const unsigned char *b, uint64_t size, kiln_shard_header *h) {
    size_t have = size < KILN_SHARD_HEADER_BYTES ? (size_t)size : KILN_SHARD_HEADER_BYTES;
    size_t nm = have < 8 ? have : 8;
    if (memcmp(b, KILN_SHARD_MAGIC, nm) != 0)
        return kiln_errorf(KILN_EFORMAT, "%s: not a kiln token shard (bad magic)", path);
    if (size == 0)
        return kiln_errorf(KILN_EFORMAT, "%s: empty file (0 bytes), not a kiln token shard", path);
    if (size < KILN_SHARD_HEADER_BYTES)
        return kiln_errorf(KILN_EFORMAT, "%s: truncated: %" PRIu64 " bytes, shorter than the %d-byte shard header",
                           path, size, KILN_SHARD_HEADER_BYTES);
    h->version = get_u32(b + 8);
    h->token_bytes = get_u32(b + 12);
    h->ntokens = get_u64(b + 16);
    h->ndocs = get_u64(b + 24);
    h->vocab_size = get_u64(b + 32);
    h->checksum = get_u64(b + 40);
    if (h->version > KILN_SHARD_VERSION)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: shard format version %" PRIu32
                           " is newer than this kiln reads (version %d); upgrade kiln", path, h->version,
                           KILN_SHARD_VERSION);
    if (h->version < 1)
        return kiln_errorf(KILN_EFORMAT, "%s: invalid shard format version %" PRIu32, path, h->version);
    if (h->token_bytes != 2 && h->token_bytes != 4)
        return kiln_errorf(KILN_EFORMAT, "%s: token width %" PRIu32 " bytes; expected 2 or 4", path, h->token_bytes);
    if (h->vocab_size == 0 || h->vocab_size > ((uint64_t)1 << 32))
        return kiln_errorf(KILN_EFORMAT, "%s: vocab size %" PRIu64 " is outside 1..2^32", path, h->vocab_size);
    if (h->token_bytes != kiln_shard_token_bytes(h->vocab_size))
        return kiln_errorf(KILN_EFORMAT, "%s: token width %" PRIu32 " bytes does not match vocab size %" PRIu64
                           " (expected %" PRIu32 ")", path, h->token_bytes, h->vocab_size,
                           kiln_shard_token_bytes(h->vocab_size));
    if (h->ndocs > h->ntokens)
        return kiln_errorf(KILN_EFORMAT, "%s: %" PRIu64 " documents but only %" PRIu64 " tokens", path, h->ndocs,
                           h->ntokens);
    uint64_t want = expected_size(h);
    if (want == 0 || want != size)
        return kiln_errorf(KILN_EFORMAT, "%s: %s: file is %" PRIu64 " bytes, the header implies %" PRIu64
                           " (%d-byte header + %" PRIu64 " tokens x %" PRIu32 " bytes + %" PRIu64
                           " document offsets x 8 bytes)", path,
                           want && size < want ? "truncated" : "wrong size", size, want,
                           KILN_SHARD_HEADER_BYTES, h->ntokens, h->token_bytes, h->ndocs);
    return NULL;
}

/* One pass over the tokens: the checksum, and the first token outside the vocabulary. */
static kiln_error *check_tokens(const kiln_shard *s) {
    const kiln_shard_header *h = &s->h;
    const unsigned char *p = s->tokens;
    uint64_t hash = KILN_FNV1A64_INIT, bad_pos = UINT64_MAX;
    uint32_t bad = 0;
    if (h->token_bytes == 2) {
        for (uint64_t i = 0; i < h->ntokens; i++, p += 2) {
            hash = (hash ^ p[0]) * FNV_PRIME;
            hash = (hash ^ p[1]) * FNV_PRIME;
            uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8;
            if (v >= h->vocab_size && bad_pos == UINT64_MAX) bad_pos = i, bad = v;
        }
    } else {
        for (uint64_t i = 0; i < h->ntokens; i++, p += 4) {
            for (int k = 0; k < 4; k++) hash = (hash ^ p[k]) * FNV_PRIME;
            uint32_t v = get_u32(p);
            if (v >= h->vocab_size && bad_pos == UINT64_MAX) bad_pos = i, bad = v;
        }
    }
    if (hash != h->checksum)
        return kiln_errorf(KILN_EFORMAT, "%s: checksum mismatch: header says %016" PRIx64 ", the tokens hash to %016"
                           PRIx64 " (corrupt shard)", s->path, h->checksum, hash);
    if (bad_pos != UINT64_MAX)
        return kiln_errorf(KILN_EFORMAT, "%s: token %" PRIu32 " at position %" PRIu64
                           " is outside the vocabulary (size %" PRIu64 ")", s->path, bad, bad_pos, h->vocab_size);
    for (uint64_t i = 0; i < h->ndocs; i++) {
        uint64_t o = kiln_shard_doc_start(s, i);
        if (o >= h->ntokens)
            return kiln_errorf(KILN_EFORMAT, "%s: document %" PRIu64 " starts at %" PRIu64
                               ", not below the token count %" PRIu64, s->path, i, o, h->ntokens);
        if (i > 0 && o <= kiln_shard_doc_start(s, i - 1))
            return kiln_errorf(KILN_EFORMAT, "%s: document offsets not increasing at document %" PRIu64
                               " (%" PRIu64 " after %" PRIu64 ")", s->path, i, o, kiln_shard_doc_start(s, i - 1));
    }
    return NULL;
}

kiln_error *kiln_shard_open(const char *path, kiln_shard *out) {
    memset(out, 0, sizeof *out);
    int fd;
    uint64_t size;
    KILN_TRY(kiln_open_regular(path, &fd, &size));
    unsigned char hdr[KILN_SHARD_HEADER_BYTES] = {0};
    size_t want = size < sizeof hdr ? (size_t)size : sizeof hdr, got = 0;
    while (got < want) {
        /* the explicit bound is for gcc 13's -Wstringop-overflow, which cannot see got < want <= 48 */
        size_t n = want - got > sizeof hdr - got ? sizeof hdr - got : want - got;
        ssize_t r = pread(fd, hdr + got, n, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            close(fd);
            return kiln_errorf(KILN_EIO, "%s: cannot read the header: %s", path, strerror(err));
        }
        got += (size_t)r;
    }
    kiln_shard_header h;
    kiln_error *e = check_header(path, hdr, size, &h);
    if (e) {
        close(fd);
        return e;
    }
    void *map;
    KILN_TRY(kiln_mmap_close(fd, path, (size_t)size, &map));
    out->map = map;
    out->map_len = (size_t)size;
    out->h = h;
    out->tokens = (const unsigned char *)map + KILN_SHARD_HEADER_BYTES;
    out->offsets = out->tokens + h.ntokens * h.token_bytes;
    out->path = strdup(path);
    if (!out->path) {
        kiln_shard_close(out);
        return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path);
    }
    /* The checksum pass reads every page once, front to back. */
    madvise(map, (size_t)size, MADV_SEQUENTIAL);
    e = check_tokens(out);
    madvise(map, (size_t)size, MADV_NORMAL);
    if (e) kiln_shard_close(out);
    return e;
}
