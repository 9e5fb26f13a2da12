/* Token shards and the training-data loader.
 *
 * Shard format (little-endian; documented in docs/data-format.md):
 *   magic "KILNTOK\0" (8 bytes), u32 version (1), u32 token bytes (2 or 4),
 *   u64 token count, u64 document count, u64 vocab size, u64 FNV-1a 64 checksum of the token bytes,
 *   then the tokens, then u64 document start offsets (document i starts at token offsets[i]).
 * Every document ends with the tokenizer's eos token when the tokenizer has one.
 */
#ifndef KILN_DATA_H
#define KILN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

/* kiln data prepare: tokenize files into shards of about shard_tokens tokens in out_dir
 * (shard_000000.bin, ...), plus out_dir/index.json (shards, counts, vocab size, tokenizer file
 * checksum). Multithreaded; progress bar. Atomic per file. */
typedef struct {
    const char *tokenizer_path;
    const char *const *inputs;
    size_t ninputs;
    const char *out_dir;
    int64_t shard_tokens; /* 0: 64M */
    int threads;          /* 0: all cores */
    double val_fraction;  /* documents held out into val_*.bin shards (0..1) */
} kiln_data_prepare_opts;
kiln_error *kiln_data_prepare(const kiln_data_prepare_opts *o);

/* The loader: memory-maps every shard of a split ("train" or "val") in a directory, validates
 * headers and checksums, and serves windows of T tokens: the token stream is cut into
 * non-overlapping windows, each epoch visits them in a permutation drawn from (seed, epoch), and
 * rank r of `world` takes every world-th window of it, so ranks read disjoint streams. Its
 * position is a small struct that can be saved and restored exactly. */
typedef struct kiln_loader kiln_loader;
typedef struct {
    uint64_t seed, epoch, cursor; /* the exact position; saved in checkpoints */
} kiln_loader_state;

kiln_error *kiln_loader_open(const char *dir, const char *split, int64_t T, uint64_t seed, int rank, int world,
                             kiln_loader **out);
void kiln_loader_close(kiln_loader *l);
int64_t kiln_loader_vocab_size(const kiln_loader *l);
uint64_t kiln_loader_tokens(const kiln_loader *l);
/* Next B windows for this rank: ids [B, T] (the model predicts token t+1 from 0..t). */
kiln_error *kiln_loader_next(kiln_loader *l, int64_t B, int64_t *ids);
kiln_loader_state kiln_loader_get_state(const kiln_loader *l);
kiln_error *kiln_loader_set_state(kiln_loader *l, const kiln_loader_state *s);

#endif
