/* Token shards and the training-data loader.
 *
 * Shard format (little-endian; documented in docs/data-format.md):
 *   magic "KILNTOK\0" (8 bytes), u32 version (1), u32 token bytes (2 or 4),
 *   u64 token count, u64 document count, u64 vocab size, u64 FNV-1a 64 checksum of the token bytes,
 *   then the tokens, then u64 document start offsets (document i starts at token offsets[i]).
 * Every document ends with the tokenizer's eos token when the tokenizer has one.
 * Tokens are u16 when the vocab size is <= 65536, else u32.
 */
#ifndef KILN_DATA_H
#define KILN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kiln/hash.h" /* kiln_fnv1a64: shard checksums, the tokenizer checksum */

/* ---- one shard file (src/data/shard.c) ---- */

#define KILN_SHARD_MAGIC "KILNTOK" /* plus its NUL: 8 bytes */
#define KILN_SHARD_VERSION 1
#define KILN_SHARD_HEADER_BYTES 48

typedef struct {
    uint32_t version, token_bytes;
    uint64_t ntokens, ndocs, vocab_size, checksum;
} kiln_shard_header;

/* 2 for vocab sizes <= 65536, else 4. */
uint32_t kiln_shard_token_bytes(uint64_t vocab_size);

/* Write a shard atomically. tokens: ntokens values of kiln_shard_token_bytes(vocab_size) bytes
 * each (uint16_t or uint32_t, host order = little-endian); doc_starts: ndocs strictly increasing
 * offsets < ntokens (tokens before doc_starts[0] continue a document of the previous shard).
 * Every token must be < vocab_size. The checksum is computed here. */
kiln_error *kiln_shard_write(const char *path, const void *tokens, uint64_t ntokens, const uint64_t *doc_starts,
                             uint64_t ndocs, uint64_t vocab_size);
/* The same, also returning the checksum written into the header (for index.json). */
kiln_error *kiln_shard_write_ex(const char *path, const void *tokens, uint64_t ntokens, const uint64_t *doc_starts,
                                uint64_t ndocs, uint64_t vocab_size, uint64_t *checksum);

/* An open, fully validated shard: magic, version, token width, exact file size, checksum, every
 * token < vocab size, offsets strictly increasing and < token count. Errors name the file. */
typedef struct {
    char *path;
    kiln_shard_header h;
    const unsigned char *tokens;  /* h.ntokens tokens of h.token_bytes bytes, in the mapping */
    const unsigned char *offsets; /* h.ndocs u64, in the mapping (may be unaligned: use the accessor) */
    void *map;
    size_t map_len;
} kiln_shard;

kiln_error *kiln_shard_open(const char *path, kiln_shard *out);
void kiln_shard_close(kiln_shard *s); /* safe on a zeroed or closed shard */
uint32_t kiln_shard_token(const kiln_shard *s, uint64_t i);
uint64_t kiln_shard_doc_start(const kiln_shard *s, uint64_t i);
/* Copy tokens [start, start + n) into dst as int64 (the range must lie in the shard). */
void kiln_shard_read(const kiln_shard *s, uint64_t start, uint64_t n, int64_t *dst);

/* ---- index.json (src/data/index.c) ---- */

#define KILN_DATA_INDEX_VERSION 1

typedef struct {
    char *file; /* name relative to the data directory, e.g. "train_000000.bin" */
    uint64_t tokens, documents, checksum;
} kiln_data_shard_info;

typedef struct {
    char *name; /* "train", "val" */
    uint64_t tokens, documents;
    size_t nshards;
    kiln_data_shard_info *shards;
} kiln_data_split_info;

typedef struct {
    int64_t version;
    char *tokenizer_path;
    uint64_t tokenizer_checksum; /* FNV-1a 64 of the tokenizer file's bytes */
    int64_t vocab_size;
    int64_t eos_id; /* -1: none */
    uint32_t token_bytes;
    size_t nsplits;
    kiln_data_split_info *splits;
} kiln_data_index;

/* Read and validate dir/index.json (fields, types, totals = sums over shards). */
kiln_error *kiln_data_index_read(const char *dir, kiln_data_index **out);
/* Write dir/index.json atomically. */
kiln_error *kiln_data_index_write(const char *dir, const kiln_data_index *ix);
void kiln_data_index_free(kiln_data_index *ix);
const kiln_data_split_info *kiln_data_index_split(const kiln_data_index *ix, const char *name); /* NULL if absent */
/* Open one shard listed in the index and check it against the index: vocab size, token, document
 * counts and checksum. */
kiln_error *kiln_data_open_shard(const char *dir, const kiln_data_index *ix, const kiln_data_shard_info *si,
                                 kiln_shard *out);

/* ---- kiln data prepare (src/data/prepare.c) ---- */

/* Tokenize files into shards of about shard_tokens tokens in out_dir (train_000000.bin, ...,
 * val_000000.bin, ...), plus out_dir/index.json (shards, counts, vocab size, tokenizer file
 * checksum). A .jsonl input holds one document per line (its "text" field); any other file is
 * one document. Documents keep input order whatever the thread count, so the output is the same
 * bytes for any `threads`. Multithreaded; progress bar. Atomic per file; index.json last. */
typedef struct {
    const char *tokenizer_path;
    const char *const *inputs;
    size_t ninputs;
    const char *out_dir;
    int64_t shard_tokens; /* 0: 64M */
    int threads;          /* 0: all cores */
    double val_fraction;  /* documents held out into val_*.bin shards, [0, 1) */
} kiln_data_prepare_opts;
kiln_error *kiln_data_prepare(const kiln_data_prepare_opts *o);
/* Is document i (0-based, input order) a validation document? The val count among the first n
 * documents is ceil((n-1) * f) (so document 1 is the first, when f > 0). */
int kiln_data_is_val_doc(uint64_t i, double val_fraction);

/* ---- the loader (src/data/loader.c) ---- */

/* The loader: memory-maps every shard of a split ("train" or "val") in a directory, validates
 * headers and checksums, and serves windows of T tokens: the token stream is cut into
 * non-overlapping windows, each epoch visits them in a permutation drawn from (seed, epoch), and
 * rank r of `world` takes every world-th window of it, so ranks read disjoint streams. Its
 * position is a small struct that can be saved and restored exactly. */
typedef struct kiln_loader kiln_loader;
typedef struct {
    uint64_t seed, epoch, cursor; /* the exact position; saved in checkpoints */
    /* Hash of the layout (T, world, window count, shard checksums); set_state refuses a state
     * from another layout. 0 = unknown: not checked (for states saved without it). */
    uint64_t fingerprint;
} kiln_loader_state;

kiln_error *kiln_loader_open(const char *dir, const char *split, int64_t T, uint64_t seed, int rank, int world,
                             kiln_loader **out);
void kiln_loader_close(kiln_loader *l);
/* Deal windows to ranks in blocks of `block` (call before the first next; resets the position).
 * With block = the micro-batch, N ranks see step for step the windows that one rank accumulating
 * N micro-batches would see, so data-parallel runs match single-process runs. */
kiln_error *kiln_loader_set_block(kiln_loader *l, int64_t block);
int64_t kiln_loader_vocab_size(const kiln_loader *l);
uint64_t kiln_loader_tokens(const kiln_loader *l);  /* tokens in the split */
uint64_t kiln_loader_windows(const kiln_loader *l); /* windows this rank takes per epoch */
/* Next B windows for this rank: ids [B, T] (the model predicts token t+1 from 0..t). */
kiln_error *kiln_loader_next(kiln_loader *l, int64_t B, int64_t *ids);
kiln_loader_state kiln_loader_get_state(const kiln_loader *l);
/* Restore a position (seed included). Errors: cursor past the windows per epoch, a fingerprint
 * from another layout. */
kiln_error *kiln_loader_set_state(kiln_loader *l, const kiln_loader_state *s);

#endif
