/* Internals of the tokenizer area (src/tokenizer): shared by its files and the tests, not public.
 *
 *   unicode.c / unicode_tables.c  UTF-8, \p{L} \p{N} \s flags, ASCII case folding, NFC
 *   unicode_lower.c               per-character lowercase mappings (the Lowercase normalizer)
 *   strmap.c                      hash maps: byte strings -> int64, uint64 -> uint64
 *   heap.h                        a binary heap of fixed-size elements (the merge queues)
 *   bytelevel.c                   GPT-2's byte <-> unicode map
 *   pretokenize.c                 the GPT-2 / Llama-3 regexes as scanners, Split, ByteLevel, Metaspace
 *   normalize.c                   Replace, Prepend, NFC normalizers
 *   added_tokens.c                added/special tokens: leftmost-longest matching, lstrip/rstrip
 *   bpe.c                         the BPE model: vocab, merge ranks, HF's merge loop, a word cache
 *   buffers.c                     growable byte buffers, piece lists, id lists
 *   decode.c                      decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace
 *   tokenizer.c                   tokenizer.json loading and the encode/decode pipelines
 *   train_bpe.c                   the byte-level BPE trainer
 */
#ifndef KILN_TOKENIZER_INTERNAL_H
#define KILN_TOKENIZER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

/* ---------------------------------------------------------------- growable byte buffer */

typedef struct {
    char *p;
    size_t n, cap;
} kiln_buf;

/* All return 0 on success, -1 when out of memory (the buffer is unchanged then). */
int kiln_buf_reserve(kiln_buf *b, size_t extra);
int kiln_buf_put(kiln_buf *b, const void *data, size_t n);
int kiln_buf_putc(kiln_buf *b, char c);
/* Append the UTF-8 encoding of cp. */
int kiln_buf_put_cp(kiln_buf *b, uint32_t cp);
void kiln_buf_free(kiln_buf *b);

/* ---------------------------------------------------------------- unicode */

enum { KILN_UNI_L = 1, KILN_UNI_N = 2, KILN_UNI_WS = 4 };

extern const char kiln_uni_version[];
extern const uint16_t kiln_uni_stage1[8704];
extern const uint8_t kiln_uni_stage2[][128];
extern const uint32_t kiln_uni_fold_ascii[][2];
extern const size_t kiln_uni_fold_ascii_n;
extern const uint32_t kiln_uni_ccc[][3];
extern const size_t kiln_uni_ccc_n;
extern const uint32_t kiln_uni_decomp[][3];
extern const size_t kiln_uni_decomp_n;
extern const uint32_t kiln_uni_decomp_pool[];
extern const uint32_t kiln_uni_comp[][3];
extern const size_t kiln_uni_comp_n;

/* KILN_UNI_* flags of a code point. */
static inline unsigned kiln_uni_flags(uint32_t cp) {
    return cp < 0x110000 ? kiln_uni_stage2[kiln_uni_stage1[cp >> 7]][cp & 127] : 0;
}

/* Decode the character at s (valid UTF-8, at least one byte); *n gets its length in bytes. */
static inline uint32_t kiln_utf8_next(const char *str, size_t *n) {
    const unsigned char *s = (const unsigned char *)str;
    if (s[0] < 0x80) { *n = 1; return s[0]; }
    if (s[0] < 0xE0) { *n = 2; return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); }
    if (s[0] < 0xF0) {
        *n = 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *n = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}
/* Length in bytes of the UTF-8 character starting with byte c (valid UTF-8). */
static inline size_t kiln_utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Bytes in the UTF-8 encoding of cp (1..4); writes them to out. */
int kiln_utf8_encode(uint32_t cp, char out[4]);
/* Length of the longest valid UTF-8 prefix of s (== len when all of s is valid). */
size_t kiln_utf8_valid_prefix(const char *s, size_t len);
/* Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD. */
int kiln_utf8_lossy(const char *s, size_t len, kiln_buf *out);
/* The ASCII lowercase letter cp case-folds to, or 0. */
int kiln_uni_fold_ascii_letter(uint32_t cp);
/* Canonical combining class. */
unsigned kiln_uni_ccc_of(uint32_t cp);
/* Append NFC(s) to out (s valid UTF-8). *first_len (may be NULL) gets the byte length of the first
 * output character (0 for empty output). */
int kiln_uni_nfc(const char *s, size_t len, kiln_buf *out, size_t *first_len);
/* Rust's char::to_lowercase of cp into out (1 to 3 code points); returns the count. */
extern const uint32_t kiln_uni_lower[][5];
extern const size_t kiln_uni_lower_n;
int kiln_uni_to_lower(uint32_t cp, uint32_t out[3]);

/* ---------------------------------------------------------------- hash maps */

uint64_t kiln_hash_bytes(const void *data, size_t len);

/* Byte string -> int64. Keys are not copied: they must outlive the map. */
typedef struct {
    const char *key;
    uint32_t len;
    uint32_t used;
    int64_t value;
} kiln_strmap_slot;
typedef struct {
    kiln_strmap_slot *slots;
    size_t cap, n; /* cap: power of two */
} kiln_strmap;
int kiln_strmap_init(kiln_strmap *m, size_t expected);
void kiln_strmap_free(kiln_strmap *m);
/* Pointer to the value of key, or NULL. */
int64_t *kiln_strmap_get(const kiln_strmap *m, const char *key, size_t len);
/* Insert key (if absent) with value v; *slot (may be NULL) gets the value pointer, old or new.
 * Returns 1 if inserted, 0 if the key was there (value untouched), -1 when out of memory. */
int kiln_strmap_put(kiln_strmap *m, const char *key, size_t len, int64_t v, int64_t **slot);

/* uint64 -> uint64 (any key value allowed). */
typedef struct {
    uint64_t *keys, *vals;
    unsigned char *used;
    size_t cap, n;
} kiln_u64map;
int kiln_u64map_init(kiln_u64map *m, size_t expected);
void kiln_u64map_free(kiln_u64map *m);
uint64_t *kiln_u64map_get(const kiln_u64map *m, uint64_t key);
/* Like kiln_strmap_put. */
int kiln_u64map_put(kiln_u64map *m, uint64_t key, uint64_t v, uint64_t **slot);

/* ---------------------------------------------------------------- byte level */

/* GPT-2's map: byte b is the code point kiln_bytelevel_cp[b]; its UTF-8 is kiln_bytelevel_utf8(b). */
extern const uint16_t kiln_bytelevel_cp[256];
/* UTF-8 of the byte-level character of b: *len gets 1 or 2. */
const char *kiln_bytelevel_utf8(unsigned char b, size_t *len);
/* The byte of a byte-level code point, or -1. */
int kiln_bytelevel_byte(uint32_t cp);
/* Append the byte-level form of s to out. */
int kiln_bytelevel_encode(const char *s, size_t len, kiln_buf *out);

/* ---------------------------------------------------------------- pieces */

/* A list of strings (text in one buffer) with per-piece flags, passed between pipeline steps. */
typedef struct {
    size_t off, len;
    int64_t id; /* >= 0: an added token (final); -1: text still to process */
    size_t z;   /* leading bytes whose original offset is 0 (HF's offsets_original().0 == 0) */
} kiln_piece;
typedef struct {
    kiln_buf text;
    kiln_piece *v;
    size_t n, cap;
} kiln_pieces;
int kiln_pieces_add(kiln_pieces *p, const char *s, size_t len, int64_t id, size_t z);
/* Add a piece whose text is already at the end of p->text (the last len bytes). */
int kiln_pieces_add_tail(kiln_pieces *p, size_t len, int64_t id, size_t z);
void kiln_pieces_free(kiln_pieces *p);
void kiln_pieces_clear(kiln_pieces *p);

/* ---------------------------------------------------------------- pre-tokenizers */

enum { KILN_RE_GPT2 = 1, KILN_RE_LLAMA3 = 2, KILN_RE_CLIP = 3 };
/* The regex alternation as a scanner: end of the match that starts at s[pos] (pos < len, valid
 * UTF-8). GPT-2's and Llama-3's patterns match at every position, so this is also find_iter's next
 * match; CLIP's does not match white space, where its scanner returns pos. */
size_t kiln_scan_gpt2(const char *s, size_t len, size_t pos);
size_t kiln_scan_llama3(const char *s, size_t len, size_t pos);
size_t kiln_scan_clip(const char *s, size_t len, size_t pos);
/* KILN_RE_* for a pattern string, or 0. */
int kiln_regex_kind(const char *pattern);
extern const char kiln_regex_gpt2[];
extern const char kiln_regex_llama3[];
extern const char kiln_regex_clip[];

enum { KILN_SPLIT_REMOVED, KILN_SPLIT_ISOLATED, KILN_SPLIT_PREV, KILN_SPLIT_NEXT, KILN_SPLIT_CONTIGUOUS };
enum { KILN_PREPEND_ALWAYS, KILN_PREPEND_FIRST, KILN_PREPEND_NEVER };
enum { KILN_PRE_BYTELEVEL = 1, KILN_PRE_SPLIT, KILN_PRE_METASPACE };
typedef struct {
    int kind;
    int add_prefix_space, use_regex;       /* ByteLevel */
    int regex;                             /* Split: KILN_RE_*, or 0 for a literal string */
    char *str;                             /* Split literal / Metaspace replacement (UTF-8) */
    size_t str_len;
    int behavior, invert;                  /* Split */
    int prepend_scheme, split;             /* Metaspace */
} kiln_pretok;

/* Run one pre-tokenizer over the text pieces of in (added-token pieces pass through). */
int kiln_pretok_apply(const kiln_pretok *pt, const kiln_pieces *in, kiln_pieces *out);

/* ---------------------------------------------------------------- normalizers */

enum { KILN_NORM_REPLACE = 1, KILN_NORM_PREPEND, KILN_NORM_NFC, KILN_NORM_LOWERCASE, KILN_NORM_REPLACE_WS };
typedef struct {
    int kind;
    char *a, *b; /* Replace: pattern a -> content b; Prepend: a; Replace_WS: each run of \s -> b */
    size_t alen, blen;
} kiln_norm;
/* Normalize s through all steps into out (cleared first); *z is updated (see kiln_piece). */
int kiln_normalize(const kiln_norm *steps, size_t nsteps, const char *s, size_t len, kiln_buf *out, size_t *z);

/* Start of the first occurrence of pat in s[from..len), or len if none (or plen == 0). */
size_t kiln_find_next(const char *s, size_t len, size_t from, const char *pat, size_t plen);

/* ---------------------------------------------------------------- added tokens */

typedef struct {
    char *content;
    size_t len;
    int64_t id;
    int special, lstrip, rstrip, normalized;
} kiln_added;

/* A byte trie for leftmost-longest matching. */
typedef struct {
    int32_t child, sibling, match; /* match: index into the token list, or -1 */
    unsigned char byte;
} kiln_trie_node;
typedef struct {
    kiln_trie_node *nodes;
    size_t n, cap;
    unsigned char first[32]; /* bitset of first bytes */
} kiln_trie;
int kiln_trie_add(kiln_trie *t, const char *s, size_t len, int32_t match);
void kiln_trie_free(kiln_trie *t);
/* Leftmost-longest match in s[from..len): returns 1 and sets *start, *end, *match, else 0. */
int kiln_trie_find(const kiln_trie *t, const char *s, size_t len, size_t from, size_t *start, size_t *end,
                   int32_t *match);
/* Split the text pieces of in on the trie's tokens (HF AddedVocabulary::find_matches). */
int kiln_added_split(const kiln_trie *t, const kiln_added *tokens, const kiln_pieces *in, kiln_pieces *out);

/* ---------------------------------------------------------------- BPE model */

typedef struct kiln_bpe_cache kiln_bpe_cache;
typedef struct {
    kiln_buf strings;        /* every vocab token, back to back */
    kiln_strmap vocab;       /* token -> id */
    size_t *tok_off;         /* id -> offset in strings, or SIZE_MAX for a hole */
    uint32_t *tok_len;
    int64_t nids;            /* max id + 1 */
    int64_t nvocab;          /* entries */
    kiln_u64map merges;      /* (a << 32 | b) -> (rank << 32 | new id) */
    int byte_fallback, fuse_unk, ignore_merges;
    char *suffix;            /* end_of_word_suffix (CLIP's "</w>"), NULL: none */
    size_t suffix_len;
    char *unk_token;         /* NULL: none */
    int64_t unk_id;          /* -1: unk_token not in the vocab */
    int64_t byte_ids[256];   /* <0xNN> ids, -1 where absent */
    kiln_bpe_cache *cache;
} kiln_bpe;

kiln_error *kiln_bpe_load(kiln_bpe *m, const cJSON *model, const char *path);
void kiln_bpe_free(kiln_bpe *m);
/* Append the ids of one pre-token (HF BPE::tokenize). */
typedef struct {
    int64_t *v;
    size_t n, cap;
} kiln_ids;
int kiln_ids_push(kiln_ids *ids, int64_t id);
kiln_error *kiln_bpe_tokenize(const kiln_bpe *m, const char *word, size_t len, kiln_ids *out);
/* Token string of a model id, or NULL. */
const char *kiln_bpe_token(const kiln_bpe *m, int64_t id, size_t *len);

/* ---------------------------------------------------------------- decoders */

enum { KILN_DEC_BYTELEVEL = 1, KILN_DEC_REPLACE, KILN_DEC_BYTEFALLBACK, KILN_DEC_FUSE, KILN_DEC_STRIP,
       KILN_DEC_METASPACE };
typedef struct {
    int kind;
    char *a, *b; /* Replace: a -> b; Metaspace: replacement a */
    size_t alen, blen;
    uint32_t content; /* Strip */
    int64_t start, stop;
    int prepend_scheme; /* Metaspace */
} kiln_dec;
/* Run the decoder chain on tokens (a piece list with id -1) and join the result into out. */
int kiln_decode_chain(const kiln_dec *steps, size_t nsteps, kiln_pieces *tokens, kiln_buf *out);

/* ---------------------------------------------------------------- the tokenizer */

struct kiln_tokenizer {
    char *path;
    kiln_bpe model;
    kiln_added *added;
    size_t nadded;
    kiln_strmap added_map;   /* content -> id */
    int64_t *added_rev;      /* id -> index into added, or -1 (nids entries) */
    kiln_trie trie_raw, trie_norm;
    char **norm_patterns;    /* normalized contents of normalized added tokens */
    kiln_norm *norm;
    size_t nnorm;
    kiln_pretok *pretok;
    size_t npretok;
    kiln_dec *dec;
    size_t ndec;
    int has_decoder;
    int64_t nids;
};

#endif
