/* FNV-1a 64 over bytes and files. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kiln/hash.h"

uint64_t kiln_fnv1a64(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

kiln_error *kiln_fnv1a64_file(const char *path, uint64_t *hash, uint64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char buf[1 << 16];
    uint64_t h = KILN_FNV1A64_INIT, n = 0;
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        h = kiln_fnv1a64(h, buf, k);
        n += k;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return kiln_errorf(KILN_EIO, "%s: read error", path);
    *hash = h;
    *size = n;
    return NULL;
}
