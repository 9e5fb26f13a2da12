/* Tokenizers: HF tokenizer.json BPE models, encoded and decoded exactly as HF `tokenizers` does.
 *
 * Supported pipelines (what tokenizer.json says, not a guess by name):
 *  - byte-level BPE (GPT-2, Llama-3 style): ByteLevel pre-tokenizer and/or a Split pre-tokenizer
 *    with the GPT-2 or Llama-3 regex, ByteLevel decoder;
 *  - SentencePiece-style BPE with byte fallback (Gemma-3, ZAYA1's tokenizer): Replace(" ", "▁")
 *    normalizer or Metaspace pre-tokenizer, byte_fallback tokens <0xNN>, the matching decoders;
 *  - added/special tokens (matched before the model, as HF does).
 * Anything else in tokenizer.json is an error naming the field, never a silent approximation.
 */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

typedef struct kiln_tokenizer kiln_tokenizer;

kiln_error *kiln_tokenizer_load(const char *path, kiln_tokenizer **out);
void kiln_tokenizer_free(kiln_tokenizer *t);
/* Number of ids (base vocabulary plus added tokens): every id is < this. */
int64_t kiln_tokenizer_vocab_size(const kiln_tokenizer *t);
/* id of a token string (e.g. "<eos>"), or -1. */
int64_t kiln_tokenizer_token_id(const kiln_tokenizer *t, const char *token);

/* Encode UTF-8 text (len bytes) without adding special tokens (HF: add_special_tokens=False).
 * *ids is malloc'd; free() it. Thread-safe for concurrent calls on one tokenizer. */
kiln_error *kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, int64_t **ids, size_t *n);
/* Decode ids to UTF-8 (HF: skip_special_tokens=False); *text is malloc'd and NUL-terminated.
 * An id with no token (outside 0..vocab_size-1, or a gap in the vocabulary) is an error naming it
 * (HF would skip it silently). */
kiln_error *kiln_tokenizer_decode(const kiln_tokenizer *t, const int64_t *ids, size_t n, char **text, size_t *len);

/* The token string of an id (an added token's content, else the model's token), or NULL. The string
 * belongs to the tokenizer. */
const char *kiln_tokenizer_id_to_token(const kiln_tokenizer *t, int64_t id);
/* 1 if id is an added token marked "special" (HF skip_special_tokens would drop it), else 0. */
int kiln_tokenizer_is_special(const kiln_tokenizer *t, int64_t id);
/* What the model would see (HF: normalize + pre_tokenize, with added tokens cut out first): the
 * pieces in order, added tokens as their content. *pieces is one malloc'd, NULL-terminated array of
 * NUL-terminated strings: free(*pieces) frees it all. Thread-safe like encode. */
kiln_error *kiln_tokenizer_pretokenize(const kiln_tokenizer *t, const char *text, size_t len, char ***pieces,
                                       size_t *n);

/* Train a byte-level BPE (GPT-2 regex pre-tokenizer, ByteLevel decoder) on files; the result is
 * written as a tokenizer.json that HF `tokenizers` loads. special: NULL-terminated list of
 * special tokens added first (ids 0..).
 * The algorithm is HF's BpeTrainer behind ByteLevel(add_prefix_space=false), fed the files line by
 * line as Tokenizer.train(files) does; the 256 byte-level characters follow the special tokens
 * (by code point), then merges by highest pair count, ties to the smaller pair of ids. Word counting
 * runs on `threads` threads; a progress bar (kiln/progress.h) follows the merges. Deterministic:
 * the same input gives the same bytes. The file is written atomically. */
typedef struct {
    int64_t vocab_size;
    const char *const *special;
    int threads;           /* 0: all cores */
    int64_t min_frequency; /* stop when the best pair is rarer than this (HF BpeTrainer: 0) */
} kiln_bpe_train_opts;
kiln_error *kiln_tokenizer_train_bpe(const char *const *files, size_t nfiles, const kiln_bpe_train_opts *o,
                                     const char *out_path);

#endif
