/* FNV-1a 64: the checksum of token shards and checkpoint files (fast, dependency-free; it
 * detects corruption, it is not a cryptographic hash). Streamable: h = kiln_fnv1a64(h, p, n),
 * starting from KILN_FNV1A64_INIT.
 *
 * XXH64 (xxHash's 64-bit hash, from libxxhash): about 8x faster than byte-wise FNV-1a here, for
 * hashing gigabytes (the CLIP model's identity, src/clip/clip_id.c). Not cryptographic either. */
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

/* XXH64 of n bytes with a seed. */
uint64_t kiln_xxh64(const void *data, size_t n, uint64_t seed);
/* Streaming XXH64: init, update any number of times with any split of the bytes, digest (the same
 * value as kiln_xxh64 of the concatenation; the state may be updated further after a digest). */
typedef union {
    unsigned char opaque[128]; /* libxxhash's XXH64_state_t (hash.c checks that it fits) */
    uint64_t align_;
} kiln_xxh64_state;
void kiln_xxh64_init(kiln_xxh64_state *s, uint64_t seed);
void kiln_xxh64_update(kiln_xxh64_state *s, const void *data, size_t n);
uint64_t kiln_xxh64_digest(const kiln_xxh64_state *s);
/* XXH64 (seed 0) and size of a whole file. */
kiln_error *kiln_xxh64_file(const char *path, uint64_t *hash, uint64_t *size);

#ifdef __cplusplus
}
#endif
#endif
