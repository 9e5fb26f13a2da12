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
/* Decode ids to UTF-8 (HF: skip_special_tokens=False); *text is malloc'd and NUL-terminated. */
kiln_error *kiln_tokenizer_decode(const kiln_tokenizer *t, const int64_t *ids, size_t n, char **text, size_t *len);

/* Train a byte-level BPE (GPT-2 regex pre-tokenizer, ByteLevel decoder) on files; the result is
 * written as a tokenizer.json that HF `tokenizers` loads. special: NULL-terminated list of
 * special tokens added first (ids 0..). */
typedef struct {
    int64_t vocab_size;
    const char *const *special;
    int threads; /* 0: all cores */
} kiln_bpe_train_opts;
kiln_error *kiln_tokenizer_train_bpe(const char *const *files, size_t nfiles, const kiln_bpe_train_opts *o,
                                     const char *out_path);

#endif
