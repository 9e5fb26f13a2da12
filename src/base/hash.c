/* FNV-1a 64 and XXH64 over bytes and files. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kiln/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t kiln_fnv1a64(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Every byte of the file at path through feed(ctx, bytes, n), 64 KiB at a time; *size the bytes read. The one
 * read loop of the file hashes below. */
static kiln_error *feed_file(const char *path, void (*feed)(void *ctx, const void *p, size_t n), void *ctx,
                             uint64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char buf[1 << 16];
    uint64_t n = 0;
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        feed(ctx, buf, k);
        n += k;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return kiln_errorf(KILN_EIO, "%s: read error", path);
    *size = n;
    return NULL;
}

static void feed_fnv1a64(void *ctx, const void *p, size_t n) {
    uint64_t *h = ctx;
    *h = kiln_fnv1a64(*h, p, n);
}

kiln_error *kiln_fnv1a64_file(const char *path, uint64_t *hash, uint64_t *size) {
    uint64_t h = KILN_FNV1A64_INIT, n = 0;
    KILN_TRY(feed_file(path, feed_fnv1a64, &h, &n));
    *hash = h;
    *size = n;
    return NULL;
}

/* ---- XXH64: libxxhash's, compiled in from its header (XXH_INLINE_ALL: no run-time library needed) ---- */

_Static_assert(sizeof(XXH64_state_t) <= sizeof(((kiln_xxh64_state *)0)->opaque), "kiln_xxh64_state too small");
_Static_assert(_Alignof(XXH64_state_t) <= _Alignof(kiln_xxh64_state), "kiln_xxh64_state under-aligned");

static XXH64_state_t *xs(kiln_xxh64_state *s) { return (XXH64_state_t *)(void *)s->opaque; }

void kiln_xxh64_init(kiln_xxh64_state *s, uint64_t seed) { XXH64_reset(xs(s), seed); }

void kiln_xxh64_update(kiln_xxh64_state *s, const void *data, size_t n) { XXH64_update(xs(s), data, n); }

uint64_t kiln_xxh64_digest(const kiln_xxh64_state *s) { return XXH64_digest((const XXH64_state_t *)(const void *)s->opaque); }

uint64_t kiln_xxh64(const void *data, size_t n, uint64_t seed) { return XXH64(data, n, seed); }

static void feed_xxh64(void *ctx, const void *p, size_t n) { kiln_xxh64_update(ctx, p, n); }

kiln_error *kiln_xxh64_file(const char *path, uint64_t *hash, uint64_t *size) {
    kiln_xxh64_state s;
    kiln_xxh64_init(&s, 0);
    uint64_t n = 0;
    KILN_TRY(feed_file(path, feed_xxh64, &s, &n));
    *hash = kiln_xxh64_digest(&s);
    *size = n;
    return NULL;
}
