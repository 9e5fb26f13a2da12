/* CRC-32C (Castagnoli, the iSCSI/ext4 checksum) of checkpoint shards. The SSE4.2 crc32 instruction
 * makes it run at several GB/s, so checksumming a shard costs a fraction of writing it (FNV-1a 64,
 * which older checkpoints carry, does one byte per multiply: under 1 GB/s). */
#ifndef KILN_CKPT_CRC32C_H
#define KILN_CKPT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

/* Continue a CRC: crc = kiln_crc32c(0, a, na); crc = kiln_crc32c(crc, b, nb) == the CRC of a||b. */
uint32_t kiln_crc32c(uint32_t crc, const void *data, size_t n);
/* The CRC of a||b from crc(a), crc(b) and b's length: pieces checksummed apart, on other threads. */
uint32_t kiln_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* The table-driven path alone (what runs without SSE4.2); for tests. */
uint32_t kiln_crc32c_sw(uint32_t crc, const void *data, size_t n);
/* CRC and size of a whole file. */
kiln_error *kiln_crc32c_file(const char *path, uint32_t *crc, uint64_t *size);

#endif
