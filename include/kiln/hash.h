/* FNV-1a 64: the checksum of token shards and checkpoint files (fast, dependency-free; it
 * detects corruption, it is not a cryptographic hash). Streamable: h = kiln_fnv1a64(h, p, n),
 * starting from KILN_FNV1A64_INIT. */
#ifndef KILN_HASH_H
#define KILN_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_FNV1A64_INIT 0xcbf29ce484222325ULL
uint64_t kiln_fnv1a64(uint64_t h, const void *data, size_t n);
/* Checksum and size of a whole file. */
kiln_error *kiln_fnv1a64_file(const char *path, uint64_t *hash, uint64_t *size);

#ifdef __cplusplus
}
#endif
#endif
