/* CRC-32C, reflected polynomial 0x82F63B78 (see crc32c.h). */
#include "crc32c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t table[256];
static int table_ready;

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
    table_ready = 1;
}

static uint32_t sw(uint32_t c, const unsigned char *p, size_t n) {
    if (!table_ready) make_table(); /* idempotent: a race writes the same values */
    while (n--) c = table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

uint32_t kiln_crc32c_sw(uint32_t crc, const void *data, size_t n) { return ~sw(~crc, data, n); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t hw(uint32_t c, const unsigned char *p, size_t n) {
    uint64_t c64 = c;
    while (n && ((uintptr_t)p & 7)) c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++), n--;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
    }
    while (n--) c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
    return (uint32_t)c64;
}

uint32_t kiln_crc32c(uint32_t crc, const void *data, size_t n) {
    static int have = -1;
    if (have < 0) have = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    return ~(have ? hw(~crc, data, n) : sw(~crc, data, n));
}
#else
uint32_t kiln_crc32c(uint32_t crc, const void *data, size_t n) { return ~sw(~crc, data, n); }
#endif

/* Combining two CRCs (zlib's crc32_combine, for the Castagnoli polynomial): appending len2 zero
 * bytes to the first message is a linear map on its CRC, applied by repeated squaring of the
 * one-zero-bit operator. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) sq[n] = gf2_times(mat, mat[n]);
}

uint32_t kiln_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
    if (!len2) return crc1;
    uint32_t even[32], odd[32];
    odd[0] = 0x82F63B78u; /* the operator for one zero bit */
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    do { /* the first square gives one zero byte */
        gf2_square(even, odd);
        if (len2 & 1) crc1 = gf2_times(even, crc1);
        len2 >>= 1;
        if (!len2) break;
        gf2_square(odd, even);
        if (len2 & 1) crc1 = gf2_times(odd, crc1);
        len2 >>= 1;
    } while (len2);
    return crc1 ^ crc2;
}

kiln_error *kiln_crc32c_file(const char *path, uint32_t *crc, uint64_t *size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kiln_errorf(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
    enum { BUF = 1 << 20 };
    unsigned char *buf = malloc(BUF);
    if (!buf) {
        close(fd);
        return kiln_errorf(KILN_ENOMEM, "%s", path);
    }
    uint32_t c = 0;
    uint64_t total = 0;
    kiln_error *e = NULL;
    for (;;) {
        ssize_t r = read(fd, buf, BUF);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            e = kiln_errorf(KILN_EIO, "%s: read error at byte %llu: %s", path, (unsigned long long)total, strerror(errno));
            break;
        }
        if (!r) break;
        c = kiln_crc32c(c, buf, (size_t)r);
        total += (uint64_t)r;
    }
    free(buf);
    close(fd);
    if (!e) *crc = c, *size = total;
    return e;
}
