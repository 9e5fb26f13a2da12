/* The tokenizer (src/tokenizer): HF `tokenizers` semantics on hand-made tokenizer.json files
 * whose expected ids are derived by hand from HF's algorithm, the split regexes on tricky text,
 * malformed files, the BPE trainer, and (test tok_fixture_*) the reference fixtures made by
 * tests/fixtures/make_tokenizer_fixtures.py with HF tokenizers: those tests fail while the
 * fixture files are missing. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/fsutil.h"
#include "kiln/json.h"
#include "kiln/tokenizer.h"
#include "test.h"
#include "../src/tokenizer/tokenizer_internal.h"

/* ---------------------------------------------------------------- helpers */

static void put(const char *path, const char *text) { CHECK_OK(kiln_write_file_atomic(path, text, strlen(text))); }

/* A JSON string literal for s (into a rotating static buffer). */
static const char *jstr(const char *s) {
    static char bufs[4][256];
    static int k;
    char *b = bufs[k++ & 3], *o = b;
    *o++ = '"';
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') *o++ = '\\';
        *o++ = *s;
    }
    *o++ = '"';
    *o = 0;
    return b;
}

/* The vocab entries of the 256 byte-level characters, id = byte (as a JSON object body). */
static void bytelevel_vocab(kiln_buf *b) {
    for (int i = 0; i < 256; i++) {
        size_t l;
        const char *u = kiln_bytelevel_utf8((unsigned char)i, &l);
        char tok[8] = {0}, line[64];
        memcpy(tok, u, l);
        snprintf(line, sizeof line, "%s%s: %d", i ? ", " : "", jstr(tok), i);
        kiln_buf_put(b, line, strlen(line));
    }
}

static kiln_tokenizer *load_text(const char *json) {
    const char *path = test_join(test_tmpdir(), "tokenizer.json");
    put(path, json);
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(path, &t));
    return t;
}

/* encode(text) must give exactly want (n ids). */
static void check_ids(const kiln_tokenizer *t, const char *text, const int64_t *want, size_t n, int line) {
    int64_t *ids = NULL;
    size_t got = 0;
    kiln_error *e = kiln_tokenizer_encode(t, text, strlen(text), &ids, &got);
    if (e) {
        test_fail(__FILE__, line, "encode(\"%s\"): %s", text, kiln_error_msg(e));
        kiln_error_free(e);
        return;
    }
    int same = got == n;
    for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    if (!same) {
        char g[512] = "", w[512] = "";
        for (size_t i = 0; i < got && strlen(g) < 480; i++) snprintf(g + strlen(g), sizeof g - strlen(g), "%lld,", (long long)ids[i]);
        for (size_t i = 0; i < n && strlen(w) < 480; i++) snprintf(w + strlen(w), sizeof w - strlen(w), "%lld,", (long long)want[i]);
        test_fail(__FILE__, line, "encode(\"%s\") = [%s], want [%s]", text, g, w);
    }
    free(ids);
}
#define CHECK_IDS(t, text, ...)                                                  \
    do {                                                                         \
        static const int64_t want_[] = {__VA_ARGS__};                            \
        check_ids(t, text, want_, sizeof want_ / sizeof want_[0], __LINE__);     \
    } while (0)

static void check_decode(const kiln_tokenizer *t, const int64_t *ids, size_t n, const char *want, int line) {
    char *s = NULL;
    size_t len = 0;
    kiln_error *e = kiln_tokenizer_decode(t, ids, n, &s, &len);
    if (e) {
        test_fail(__FILE__, line, "decode: %s", kiln_error_msg(e));
        kiln_error_free(e);
        return;
    }
    if (len != strlen(want) || memcmp(s, want, len) != 0) test_fail(__FILE__, line, "decode = \"%s\", want \"%s\"", s, want);
    free(s);
}
#define CHECK_DECODE(t, want, ...)                                                     \
    do {                                                                               \
        static const int64_t ids_[] = {__VA_ARGS__};                                   \
        check_decode(t, ids_, sizeof ids_ / sizeof ids_[0], want, __LINE__);           \
    } while (0)

/* pretokenize(text) must give exactly the NULL-terminated list want. */
static void check_pieces(const kiln_tokenizer *t, const char *text, const char *const *want, int line) {
    char **p = NULL;
    size_t n = 0;
    kiln_error *e = kiln_tokenizer_pretokenize(t, text, strlen(text), &p, &n);
    if (e) {
        test_fail(__FILE__, line, "pretokenize: %s", kiln_error_msg(e));
        kiln_error_free(e);
        return;
    }
    size_t nw = 0;
    while (want[nw]) nw++;
    int same = n == nw;
    for (size_t i = 0; same && i < n; i++) same = strcmp(p[i], want[i]) == 0;
    if (!same) {
        char g[1024] = "";
        for (size_t i = 0; i < n && strlen(g) < 900; i++) snprintf(g + strlen(g), sizeof g - strlen(g), "[%s]", p[i]);
        test_fail(__FILE__, line, "pretokenize(\"%s\") = %s (%zu pieces, want %zu)", text, g, n, nw);
    }
    free(p);
}
#define CHECK_PIECES(t, text, ...)                                   \
    do {                                                             \
        static const char *const want_[] = {__VA_ARGS__, NULL};      \
        check_pieces(t, text, want_, __LINE__);                      \
    } while (0)

static char *read_text(const char *path, size_t *len) {
    char *d = NULL;
    CHECK_OK(kiln_read_file(path, &d, len));
    return d;
}

/* ---------------------------------------------------------------- split regexes */

typedef struct {
    const char *text;
    const char *pieces[32];
} split_case;

/* Expected pieces: the regexes' leftmost-first semantics (as Oniguruma runs them in HF), checked
 * against an independent regex engine when these cases were written. */
static const split_case gpt2_cases[] = {
    {"I'm here, they'll say it's 'quoted' and we've WE'VE I'M 'S", {"I", "'m", " here", ",", " they", "'ll", " say", " it", "'s", " '", "quoted", "'", " and", " we", "'ve", " WE", "'", "VE", " I", "'", "M", " '", "S", NULL}},
    {"  \n\n  x", {"  \n\n ", " x", NULL}},
    {"1234567 and 12 345", {"1234567", " and", " 12", " 345", NULL}},
    {"Hello world!!! ...  \t\tend  ", {"Hello", " world", "!!!", " ...", "  \t", "\t", "end", "  ", NULL}},
    {"a\r\nb\r\n\r\n  c\n", {"a", "\r", "\n", "b", "\r\n\r\n ", " c", "\n", NULL}},
    {"naïve café Zürich किताब", {"naïve", " cafe", "́", " Zu", "̈", "rich", " क", "ि", "त", "ा", "ब", NULL}},
    {"日本語のテキスト、中文！한국어 ok", {"日本語のテキスト", "、", "中文", "！", "한국어", " ok", NULL}},
    {"x y　z w", {"x", " ", "y", "　", "z", " ", "w", NULL}},
    {"emoji 👍🏽 and 👨‍👩‍👧 ok", {"emoji", " 👍🏽", " and", " 👨‍👩‍👧", " ok", NULL}},
    {"don't DON'T it'S she'd x'll x'ſ y'Re 'tis", {"don", "'t", " DON", "'", "T", " it", "'", "S", " she", "'d", " x", "'ll", " x", "'", "ſ", " y", "'", "Re", " '", "tis", NULL}},
    {"١٢٣٤ Ⅻ² ½ 3rd", {"١٢٣٤", " Ⅻ²", " ½", " 3", "rd", NULL}},
    {"   ", {"   ", NULL}},
    {"tail spaces   ", {"tail", " spaces", "   ", NULL}},
    {"?!\n\n\nfoo", {"?!", "\n\n", "\n", "foo", NULL}},
};
static const split_case llama3_cases[] = {
    {"I'm here, they'll say it's 'quoted' and we've WE'VE I'M 'S", {"I", "'m", " here", ",", " they", "'ll", " say", " it", "'s", " '", "quoted", "'", " and", " we", "'ve", " WE", "'VE", " I", "'M", " '", "S", NULL}},
    {"  \n\n  x", {"  \n\n", " ", " x", NULL}},
    {"1234567 and 12 345", {"123", "456", "7", " and", " ", "12", " ", "345", NULL}},
    {"Hello world!!! ...  \t\tend  ", {"Hello", " world", "!!!", " ...", "  \t", "\tend", "  ", NULL}},
    {"a\r\nb\r\n\r\n  c\n", {"a", "\r\n", "b", "\r\n\r\n", " ", " c", "\n", NULL}},
    {"naïve café Zürich किताब", {"naïve", " cafe", "́", " Zu", "̈rich", " क", "ित", "ाब", NULL}},
    {"日本語のテキスト、中文！한국어 ok", {"日本語のテキスト", "、中文", "！한국어", " ok", NULL}},
    {"x y　z w", {"x", " y", "　z", " w", NULL}},
    {"emoji 👍🏽 and 👨‍👩‍👧 ok", {"emoji", " 👍🏽", " and", " 👨‍👩‍👧", " ok", NULL}},
    {"don't DON'T it'S she'd x'll x'ſ y'Re 'tis", {"don", "'t", " DON", "'T", " it", "'S", " she", "'d", " x", "'ll", " x", "'ſ", " y", "'Re", " '", "tis", NULL}},
    {"١٢٣٤ Ⅻ² ½ 3rd", {"١٢٣", "٤", " ", "Ⅻ²", " ", "½", " ", "3", "rd", NULL}},
    {"   ", {"   ", NULL}},
    {"tail spaces   ", {"tail", " spaces", "   ", NULL}},
    {"?!\n\n\nfoo", {"?!\n\n\n", "foo", NULL}},
};

static kiln_tokenizer *split_only(int llama3) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Split\", "
             "\"pattern\": {\"Regex\": %s}, \"behavior\": \"Isolated\", \"invert\": false}, \"post_processor\": null, "
             "\"decoder\": null, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
             "\"@@\"");
    kiln_buf b = {0};
    char *at = strstr(json, "\"@@\"");
    kiln_buf_put(&b, json, (size_t)(at - json));
    const char *re = llama3 ? kiln_regex_llama3 : kiln_regex_gpt2;
    kiln_buf_putc(&b, '"');
    for (const char *s = re; *s; s++) {
        if (*s == '\\' || *s == '"') kiln_buf_putc(&b, '\\');
        kiln_buf_putc(&b, *s);
    }
    kiln_buf_putc(&b, '"');
    kiln_buf_put(&b, at + 4, strlen(at + 4));
    kiln_tokenizer *t = load_text(b.p);
    kiln_buf_free(&b);
    return t;
}

static void run_split_cases(int llama3, const split_case *cases, size_t n) {
    kiln_tokenizer *t = split_only(llama3);
    if (!t) return;
    for (size_t i = 0; i < n; i++) check_pieces(t, cases[i].text, cases[i].pieces, __LINE__);
    kiln_tokenizer_free(t);
}

TEST(tok_regex_gpt2_split) { run_split_cases(0, gpt2_cases, sizeof gpt2_cases / sizeof gpt2_cases[0]); }
TEST(tok_regex_llama3_split) { run_split_cases(1, llama3_cases, sizeof llama3_cases / sizeof llama3_cases[0]); }

TEST(tok_regex_scanner_edges) {
    /* \s+(?!\S): a run that ends the text is one piece; one followed by a word gives up a char */
    const char *s = "a \t \nb";
    CHECK(kiln_scan_gpt2(s, strlen(s), 1) == 4);
    CHECK(kiln_scan_gpt2(s, strlen(s), 4) == 5);
    CHECK(kiln_scan_gpt2("  ", 2, 0) == 2);
    /* Llama-3 digits come in threes, never with a space */
    CHECK(kiln_scan_llama3("1234567", 7, 0) == 3);
    CHECK(kiln_scan_llama3("1234567", 7, 6) == 7);
    CHECK(kiln_scan_llama3(" 12", 3, 0) == 1);
    /* (?i:'s...) folds case, U+017F LONG S included; GPT-2's contractions are case-sensitive */
    CHECK(kiln_scan_llama3("'S", 2, 0) == 2);
    CHECK(kiln_scan_llama3("'\xC5\xBF", 3, 0) == 3);
    CHECK(kiln_scan_gpt2("'S", 2, 0) == 1);
    CHECK(kiln_regex_kind(kiln_regex_gpt2) == KILN_RE_GPT2);
    CHECK(kiln_regex_kind(kiln_regex_llama3) == KILN_RE_LLAMA3);
    CHECK(kiln_regex_kind("\\s+") == 0);
}

TEST(tok_unicode_tables) {
    CHECK(kiln_uni_flags('a') == KILN_UNI_L);
    CHECK(kiln_uni_flags('7') == KILN_UNI_N);
    CHECK(kiln_uni_flags(' ') == KILN_UNI_WS);
    CHECK(kiln_uni_flags(0x85) == KILN_UNI_WS);
    CHECK(kiln_uni_flags(0x1C) == 0); /* not White_Space, though Python's isspace() says so */
    CHECK(kiln_uni_flags(0x3000) == KILN_UNI_WS);
    CHECK(kiln_uni_flags(0x200B) == 0); /* ZERO WIDTH SPACE is not white space */
    CHECK(kiln_uni_flags(0x4E2D) == KILN_UNI_L); /* 中 */
    CHECK(kiln_uni_flags(0x0301) == 0);          /* combining acute: Mn */
    CHECK(kiln_uni_flags(0x2167) == KILN_UNI_N); /* Ⅷ: Nl */
    CHECK(kiln_uni_flags(0x00B2) == KILN_UNI_N); /* ²: No */
    CHECK(kiln_uni_flags(0x1F600) == 0);         /* emoji: So */
    CHECK(kiln_uni_flags(0x110000) == 0);
    CHECK(kiln_uni_fold_ascii_letter('S') == 's');
    CHECK(kiln_uni_fold_ascii_letter(0x17F) == 's');
    CHECK(kiln_uni_fold_ascii_letter(0x212A) == 'k');
    CHECK(kiln_uni_fold_ascii_letter(0xE9) == 0);
    CHECK(kiln_uni_ccc_of(0x0301) == 230);
    CHECK(kiln_uni_ccc_of('a') == 0);
    /* NFC: composition, reordering, Hangul, singletons, exclusions */
    struct { const char *in, *out; } nfc[] = {
        {"e\xCC\x81", "\xC3\xA9"},                         /* e + acute -> é */
        {"a\xCC\xA3\xCC\x82", "\xE1\xBA\xAD"},             /* a + dot below + circumflex -> ậ */
        {"a\xCC\x82\xCC\xA3", "\xE1\xBA\xAD"},             /* other order, same result */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* jamo -> 각 */
        {"\xE2\x84\xAB", "\xC3\x85"},                      /* ANGSTROM SIGN -> Å (singleton) */
        {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"},      /* U+0958 is excluded: stays decomposed */
        {"plain ascii", "plain ascii"},
    };
    for (size_t i = 0; i < sizeof nfc / sizeof nfc[0]; i++) {
        kiln_buf b = {0};
        CHECK(kiln_uni_nfc(nfc[i].in, strlen(nfc[i].in), &b, NULL) == 0);
        CHECK_MSG(b.n == strlen(nfc[i].out) && memcmp(b.p, nfc[i].out, b.n) == 0, "NFC case %zu", i);
        kiln_buf_free(&b);
    }
    /* from_utf8_lossy: one U+FFFD per maximal invalid subsequence */
    kiln_buf b = {0};
    CHECK(kiln_utf8_lossy("a\xE2\x82" "b\xFF\xF0\x9F\x98" "c", 9, &b) == 0);
    CHECK(b.n == 12 && memcmp(b.p, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD" "c", 12) == 0);
    kiln_buf_free(&b);
    CHECK(kiln_utf8_valid_prefix("ok\xC0\x80", 4) == 2); /* overlong */
    CHECK(kiln_utf8_valid_prefix("\xED\xA0\x80", 3) == 0); /* surrogate */
    CHECK(kiln_utf8_valid_prefix("\xF4\x90\x80\x80", 4) == 0); /* > U+10FFFF */
}

TEST(tok_bytelevel_map) {
    int seen[0x200] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = kiln_bytelevel_cp[b];
        CHECK(cp < 0x200 && !seen[cp]);
        seen[cp] = 1;
        CHECK(kiln_bytelevel_byte(cp) == b);
        /* printable bytes map to themselves, the rest to U+0100.. */
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        CHECK(printable ? cp == (uint32_t)b : cp >= 0x100);
    }
    CHECK(kiln_bytelevel_cp[' '] == 0x120); /* Ġ */
    CHECK(kiln_bytelevel_cp['\n'] == 0x10A); /* Ċ */
    CHECK(kiln_bytelevel_byte('A') == 'A');
    CHECK(kiln_bytelevel_byte(0x20) == -1);
    CHECK(kiln_bytelevel_byte(0x144) == -1);
    kiln_buf out = {0};
    CHECK(kiln_bytelevel_encode("a \xC3\xA9", 4, &out) == 0);
    CHECK(out.n == 7 && memcmp(out.p, "a\xC4\xA0\xC3\x83\xC2\xA9", 7) == 0); /* aĠÃ© */
    kiln_buf_free(&out);
}

/* ---------------------------------------------------------------- byte-level BPE (GPT-2 style) */

static kiln_tokenizer *tiny_gpt2(void) {
    kiln_buf b = {0};
    const char *head = "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": ["
                       "{\"id\": 261, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, "
                       "\"rstrip\": false, \"normalized\": false, \"special\": true},"
                       "{\"id\": 262, \"content\": \"<mask>\", \"single_word\": false, \"lstrip\": true, "
                       "\"rstrip\": true, \"normalized\": false, \"special\": true}],"
                       "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                       " \"trim_offsets\": true, \"use_regex\": true},"
                       "\"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false},"
                       "\"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true},"
                       "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
                       "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": false, "
                       "\"byte_fallback\": false, \"vocab\": {";
    kiln_buf_put(&b, head, strlen(head));
    bytelevel_vocab(&b);
    const char *tail = ", \"\xC4\xA0t\": 256, \"he\": 257, \"\xC4\xA0the\": 258, \"ll\": 259, \"ell\": 260},"
                       " \"merges\": [\"\xC4\xA0 t\", [\"h\", \"e\"], [\"\xC4\xA0t\", \"he\"], \"l l\", [\"e\", \"ll\"]]}}";
    kiln_buf_put(&b, tail, strlen(tail));
    kiln_tokenizer *t = load_text(b.p);
    kiln_buf_free(&b);
    return t;
}

TEST(tok_bytelevel_bpe_by_hand) {
    kiln_tokenizer *t = tiny_gpt2();
    if (!t) return;
    CHECK(kiln_tokenizer_vocab_size(t) == 263);
    CHECK(kiln_tokenizer_token_id(t, "<|endoftext|>") == 261);
    CHECK(kiln_tokenizer_token_id(t, "he") == 257);
    CHECK(kiln_tokenizer_token_id(t, "nope") == -1);
    CHECK(strcmp(kiln_tokenizer_id_to_token(t, 258), "\xC4\xA0the") == 0);
    CHECK(kiln_tokenizer_is_special(t, 261) && !kiln_tokenizer_is_special(t, 257));
    /* "Ġthe": Ġ t -> Ġt (rank 0), h e -> he (1), Ġt he -> Ġthe (2) */
    CHECK_IDS(t, " the", 258);
    /* "Ġhello": he (1) takes the e before l l (3) can; e ll (4) never applies */
    CHECK_IDS(t, " hello", 32, 257, 259, 111);
    CHECK_IDS(t, "ell", 260);
    CHECK_IDS(t, "the hell", 116, 257, 32, 257, 259); /* "the" | "Ġhell": t he | Ġ he ll */
    /* added tokens are cut out first; <mask> strips the white space around it */
    CHECK_IDS(t, "a<|endoftext|>b", 97, 261, 98);
    CHECK_IDS(t, " x <mask> y", 32, 120, 262, 121);
    CHECK_IDS(t, "<|endoftext|><|endoftext|>", 261, 261);
    /* bytes: é is C3 A9 */
    CHECK_IDS(t, "\xC3\xA9", 0xC3, 0xA9);
    int64_t *none = NULL;
    size_t nnone = 1;
    CHECK_OK(kiln_tokenizer_encode(t, "", 0, &none, &nnone));
    CHECK(nnone == 0 && none != NULL);
    free(none);
    /* decode: byte-level characters back to bytes, added tokens as their text, invalid UTF-8 lossy */
    CHECK_DECODE(t, " the hello", 258, 32, 257, 259, 111);
    CHECK_DECODE(t, " x<mask>y", 32, 120, 262, 121);
    CHECK_DECODE(t, "\xEF\xBF\xBD" "a", 0xE2, 0x82, 97);
    char *empty = NULL;
    size_t elen = 1;
    CHECK_OK(kiln_tokenizer_decode(t, NULL, 0, &empty, &elen));
    CHECK(empty && elen == 0 && empty[0] == 0);
    free(empty);
    int64_t bad[] = {5, 263};
    char *s = NULL;
    size_t len;
    CHECK_ERR(kiln_tokenizer_decode(t, bad, 2, &s, &len), "id 263 at position 1 has no token");
    int64_t neg[] = {-1};
    CHECK_ERR(kiln_tokenizer_decode(t, neg, 1, &s, &len), "id -1");
    /* invalid UTF-8 input is refused */
    int64_t *ids = NULL;
    size_t n = 0;
    CHECK_ERR(kiln_tokenizer_encode(t, "ab\xFF", 3, &ids, &n), "not valid UTF-8 (at byte 2)");
    kiln_tokenizer_free(t);
}

TEST(tok_bytelevel_roundtrip_all_bytes) {
    kiln_tokenizer *t = tiny_gpt2();
    if (!t) return;
    size_t len;
    char *text = read_text(test_src_path("tests/fixtures/tokenizer/multilingual.txt"), &len);
    if (!text) {
        kiln_tokenizer_free(t);
        return;
    }
    int64_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tokenizer_encode(t, text, len, &ids, &n));
    CHECK(n > len / 2);
    char *back = NULL;
    size_t blen = 0;
    CHECK_OK(kiln_tokenizer_decode(t, ids, n, &back, &blen));
    CHECK(back && blen == len && memcmp(back, text, len) == 0);
    free(back);
    free(ids);
    free(text);
    kiln_tokenizer_free(t);
}

/* ---------------------------------------------------------------- Llama-3 style */

TEST(tok_llama3_ignore_merges) {
    kiln_buf b = {0};
    char head[2048];
    snprintf(head, sizeof head,
             "{\"added_tokens\": [{\"id\": 259, \"content\": \"<|begin_of_text|>\", \"special\": true, "
             "\"normalized\": false}],"
             "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
             "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", \"invert\": false},"
             "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}]},"
             "\"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, "
             "{\"type\": \"TemplateProcessing\"}]},"
             "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {",
             "@@");
    char *at = strstr(head, "@@");
    kiln_buf_put(&b, head, (size_t)(at - head));
    for (const char *s = kiln_regex_llama3; *s; s++) {
        if (*s == '\\' || *s == '"') kiln_buf_putc(&b, '\\');
        kiln_buf_putc(&b, *s);
    }
    kiln_buf_put(&b, at + 2, strlen(at + 2));
    bytelevel_vocab(&b);
    const char *tail = ", \"hello\": 256, \"\xC4\xA0world\": 257, \"he\": 258}, \"merges\": [[\"h\", \"e\"]]}}";
    kiln_buf_put(&b, tail, strlen(tail));
    kiln_tokenizer *t = load_text(b.p);
    kiln_buf_free(&b);
    if (!t) return;
    /* whole words in the vocabulary are one token even without the merges to build them */
    CHECK_IDS(t, "hello world help", 256, 257, 32, 258, 108, 112);
    CHECK_IDS(t, "<|begin_of_text|>hello", 259, 256);
    /* digits in threes, each byte-level encoded */
    CHECK_IDS(t, "12345", '1', '2', '3', '4', '5');
    CHECK_PIECES(t, "1234567 it'S", "123", "456", "7", "\xC4\xA0it", "'S");
    CHECK_DECODE(t, "<|begin_of_text|>hello world", 259, 256, 257);
    kiln_tokenizer_free(t);
}

/* ---------------------------------------------------------------- SentencePiece style (Gemma) */

static kiln_tokenizer *tiny_gemma(int byte_fallback, int fuse_unk) {
    kiln_buf b = {0};
    char head[2048];
    snprintf(head, sizeof head,
             "{\"added_tokens\": [{\"id\": 264, \"content\": \"<eos>\", \"special\": true, \"normalized\": false,"
             " \"lstrip\": false, \"rstrip\": false, \"single_word\": false},"
             " {\"id\": 265, \"content\": \"a b\", \"special\": false, \"normalized\": true}],"
             "\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"},"
             "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": "
             "\"MergedWithPrevious\", \"invert\": false},"
             "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": []},"
             "\"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
             "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"}, \"content\": \" \"},"
             "{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", "
             "\"start\": 1, \"stop\": 0}]},"
             "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"fuse_unk\": %s, "
             "\"byte_fallback\": %s, \"ignore_merges\": false, \"vocab\": {\"<unk>\": 0",
             fuse_unk ? "true" : "false", byte_fallback ? "true" : "false");
    kiln_buf_put(&b, head, strlen(head));
    for (int i = 0; i < 256; i++) {
        char e[32];
        snprintf(e, sizeof e, ", \"<0x%02X>\": %d", i, i + 1);
        kiln_buf_put(&b, e, strlen(e));
    }
    const char *tail = ", \"\xE2\x96\x81\": 257, \"a\": 258, \"b\": 259, \"\xE2\x96\x81" "a\": 260, \"ab\": 261,"
                       " \"\xE2\x96\x81" "ab\": 262, \"c\": 263}, \"merges\": [\"\xE2\x96\x81 a\", \"a b\", "
                       "\"\xE2\x96\x81" "a b\"]}}";
    kiln_buf_put(&b, tail, strlen(tail));
    kiln_tokenizer *t = load_text(b.p);
    kiln_buf_free(&b);
    return t;
}

TEST(tok_sentencepiece_byte_fallback) {
    kiln_tokenizer *t = tiny_gemma(1, 1);
    if (!t) return;
    /* " ab €" -> "▁ab▁€": ▁ a (rank 0), then ▁a b (2); the stale a b (1) is skipped; € has no
     * token: its three UTF-8 bytes as <0xE2> <0x82> <0xAC> */
    CHECK_IDS(t, " ab \xE2\x82\xAC", 262, 257, 1 + 0xE2, 1 + 0x82, 1 + 0xAC);
    CHECK_IDS(t, "ab<eos>c", 261, 264, 263);
    /* the normalized added token "a b" matches the normalized text "a▁b" */
    CHECK_IDS(t, "ca bc", 263, 265, 263);
    CHECK_PIECES(t, "ab cd", "ab\xE2\x96\x81" "cd");
    /* decode: ▁ -> space, byte runs -> UTF-8 (invalid: one U+FFFD per byte), fuse, strip one space */
    CHECK_DECODE(t, "ab \xE2\x82\xAC", 262, 257, 1 + 0xE2, 1 + 0x82, 1 + 0xAC);
    CHECK_DECODE(t, "\xEF\xBF\xBD\xEF\xBF\xBD" "a", 1 + 0xE2, 1 + 0x82, 258);
    CHECK_DECODE(t, "a<eos> c", 258, 264, 257, 263);
    kiln_tokenizer_free(t);
}

TEST(tok_sentencepiece_unk) {
    kiln_tokenizer *t = tiny_gemma(0, 1);
    if (!t) return;
    CHECK_IDS(t, "a\xE2\x98\x83" "b", 258, 0, 259);           /* a ☃ b */
    CHECK_IDS(t, "\xE2\x98\x83\xE2\x98\x83" "c", 0, 263);     /* fused */
    kiln_tokenizer_free(t);
    t = tiny_gemma(0, 0);
    if (!t) return;
    CHECK_IDS(t, "\xE2\x98\x83\xE2\x98\x83" "c", 0, 0, 263);  /* not fused */
    kiln_tokenizer_free(t);
}

TEST(tok_metaspace_and_nfc) {
    const char *json =
        "{\"added_tokens\": [{\"id\": 5, \"content\": \"<eos>\", \"special\": true, \"normalized\": false}],"
        "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]},"
        "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"prepend_scheme\": \"first\","
        " \"split\": true},"
        "\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"prepend_scheme\": \"first\"},"
        "\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"\xE2\x96\x81hello\": 0, "
        "\"\xE2\x96\x81world\": 1, \"hello\": 2, \"\xE2\x96\x81\": 3, \"\xE2\x96\x81\xC3\xA9t\xC3\xA9\": 4}, \"merges\": []}}";
    kiln_tokenizer *t = load_text(json);
    if (!t) return;
    CHECK_PIECES(t, "hello world", "\xE2\x96\x81hello", "\xE2\x96\x81world");
    /* "first": only the piece at the start of the text gets the ▁ */
    CHECK_PIECES(t, "<eos>hello  world", "<eos>", "hello", "\xE2\x96\x81", "\xE2\x96\x81world");
    CHECK_IDS(t, "hello world", 0, 1);
    CHECK_IDS(t, "<eos>hello", 5, 2);
    /* NFC composes e + U+0301 before the model sees it */
    CHECK_IDS(t, "e\xCC\x81te\xCC\x81", 4);
    /* characters the vocabulary lacks, with neither unk nor byte fallback, are dropped (as HF) */
    CHECK_IDS(t, "xyz", 3);
    CHECK_DECODE(t, "hello world", 0, 1);
    CHECK_DECODE(t, "hello world", 2, 1);
    CHECK_DECODE(t, "hello", 3, 2); /* the first token loses every ▁ */
    kiln_tokenizer_free(t);

    json = "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
           "\"\xE2\x96\x81\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]},"
           "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"prepend_scheme\": "
           "\"always\", \"split\": false},"
           "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}";
    t = load_text(json);
    if (!t) return;
    CHECK_PIECES(t, "a b", "\xE2\x96\x81" "a\xE2\x96\x81" "b");
    CHECK_PIECES(t, " ", "\xE2\x96\x81\xE2\x96\x81");
    kiln_tokenizer_free(t);
}

TEST(tok_split_behaviors) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    static const char *const want[][8] = {
        {"a", "b", "c", NULL},
        {"a", "-", "b", "-", "-", "c", "-", NULL},
        {"a-", "b-", "-", "c-", NULL},
        {"a", "-b", "-", "-c", "-", NULL},
        {"a", "-", "b", "--", "c", "-", NULL},
    };
    for (int k = 0; k < 5; k++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\"}, "
                 "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
                 names[k]);
        kiln_tokenizer *t = load_text(json);
        if (!t) continue;
        check_pieces(t, "a-b--c-", want[k], __LINE__);
        kiln_tokenizer_free(t);
    }
    kiln_tokenizer *t = load_text("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, "
                                  "\"behavior\": \"Removed\", \"invert\": true}, "
                                  "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    if (t) {
        CHECK_PIECES(t, "a-b--c-", "-", "-", "-", "-");
        kiln_tokenizer_free(t);
    }
}

/* ---------------------------------------------------------------- malformed files */

static void check_load_err(const char *json, const char *needle, int line) {
    const char *path = test_join(test_tmpdir(), "bad.json");
    put(path, json);
    kiln_tokenizer *t = NULL;
    kiln_error *e = kiln_tokenizer_load(path, &t);
    if (!e) {
        test_fail(__FILE__, line, "load succeeded, expected error containing '%s'", needle);
        kiln_tokenizer_free(t);
        return;
    }
    if (!strstr(kiln_error_msg(e), needle) || !strstr(kiln_error_msg(e), "bad.json"))
        test_fail(__FILE__, line, "error '%s' lacks '%s' or the file name", kiln_error_msg(e), needle);
    kiln_error_free(e);
    CHECK(t == NULL);
}
#define CHECK_LOAD_ERR(json, needle) check_load_err(json, needle, __LINE__)

#define MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

TEST(tok_malformed_files) {
    CHECK_LOAD_ERR("{\"normalizer\": null}", "missing required field 'model'");
    CHECK_LOAD_ERR("[1, 2]", "must be a JSON object");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, ", "invalid JSON");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model type \"WordPiece\" is not supported");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "merges");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}",
                   "model.merges[0]: token \"c\" is not in model.vocab");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}",
                   "model.merges[0]: token \"ab\" is not in model.vocab");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b c\"]}}",
                   "model.merges[0]");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [7]}}",
                   "model.merges[0] must be");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
                   "id 0 is given to both \"a\" and \"b\"");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\": 1}, \"merges\": []}}",
                   "token \"a\" appears twice");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
                   "model.vocab[\"a\"]: id must be a non-negative integer");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}, \"merges\": []}}", "non-negative integer");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 4000000000}, \"merges\": []}}", "out of range");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}", "dropout");
    CHECK_LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", \"vocab\": {}, \"merges\": []}}",
                   "continuing_subword_prefix");
    CHECK_LOAD_ERR("{\"version\": \"2.0\", " MODEL "}", "version \"2.0\"");
    CHECK_LOAD_ERR("{\"normalizer\": {\"type\": \"NFKD\"}, " MODEL "}",
                   "field 'normalizer': normalizer type \"NFKD\" is not supported");
    CHECK_LOAD_ERR("{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}]}, " MODEL "}",
                   "field 'normalizer.normalizers[0]': normalizer type \"NFKC\"");
    CHECK_LOAD_ERR("{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \" \"}, " MODEL "}",
                   "Regex pattern \" +\" is not supported");
    CHECK_LOAD_ERR("{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, " MODEL "}", "pre-tokenizer type \"Whitespace\"");
    CHECK_LOAD_ERR("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": "
                   "\"Isolated\"}, " MODEL "}",
                   "regex \"\\w+\" is not supported");
    CHECK_LOAD_ERR("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": "
                   "\"Sideways\"}, " MODEL "}",
                   "unknown value \"Sideways\"");
    CHECK_LOAD_ERR("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, "
                   "{\"type\": \"Digits\"}]}, " MODEL "}",
                   "field 'pre_tokenizer.pretokenizers[1]': pre-tokenizer type \"Digits\"");
    CHECK_LOAD_ERR("{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}, " MODEL "}",
                   "must be one character");
    CHECK_LOAD_ERR("{\"decoder\": {\"type\": \"WordPiece\"}, " MODEL "}", "decoder type \"WordPiece\"");
    CHECK_LOAD_ERR("{\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": 1}, " MODEL "}", "stop");
    CHECK_LOAD_ERR("{\"post_processor\": {\"type\": \"Nonsense\"}, " MODEL "}", "post-processor type \"Nonsense\"");
    CHECK_LOAD_ERR("{\"pre_tokenizer\": 7, " MODEL "}", "field 'pre_tokenizer' must be an object or null");
    CHECK_LOAD_ERR("{\"added_tokens\": [{\"id\": 7, \"content\": \"<s>\", \"special\": true}], " MODEL "}",
                   "id 7 disagrees with the id HF `tokenizers` gives it (3");
    CHECK_LOAD_ERR("{\"added_tokens\": [{\"id\": 5, \"content\": \"ab\", \"special\": true}], " MODEL "}",
                   "its id in model.vocab");
    CHECK_LOAD_ERR("{\"added_tokens\": [{\"id\": 3, \"content\": \"<m>\", \"single_word\": true}], " MODEL "}",
                   "single_word");
    CHECK_LOAD_ERR("{\"added_tokens\": [{\"content\": \"<m>\"}], " MODEL "}", "added_tokens[0]: missing required field 'id'");
    /* listed twice: the same id, the later flags */
    kiln_tokenizer *t2 = load_text("{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\"}, {\"id\": 3, \"content\": "
                                   "\"<s>\", \"special\": true}], " MODEL "}");
    if (t2) {
        CHECK(kiln_tokenizer_vocab_size(t2) == 4 && kiln_tokenizer_is_special(t2, 3));
        kiln_tokenizer_free(t2);
    }
    CHECK_LOAD_ERR("{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\"}, {\"id\": 4, \"content\": \"<s>\"}], " MODEL "}",
                   "its earlier entry");
    /* a missing file names the path */
    kiln_tokenizer *t = NULL;
    CHECK_ERR(kiln_tokenizer_load(test_join(test_tmpdir(), "none.json"), &t), "none.json");
    /* the good one loads */
    t = load_text("{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}, {\"id\": 2, \"content\": "
                  "\"ab\"}, {\"id\": 4, \"content\": \"<t>\"}], " MODEL "}");
    if (t) {
        CHECK(kiln_tokenizer_vocab_size(t) == 5);
        CHECK_IDS(t, "ab<s>a<t>", 2, 3, 0, 4);
        kiln_tokenizer_free(t);
    }
    /* unk_token that is not in the vocabulary: an error only when an unknown character needs it, as HF */
    t = load_text("{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"a\": 0}, \"merges\": []}}");
    if (t) {
        CHECK_IDS(t, "aa", 0, 0);
        int64_t *ids = NULL;
        size_t n = 0;
        CHECK_ERR(kiln_tokenizer_encode(t, "ab", 2, &ids, &n), "model.unk_token \"<unk>\" is not in the vocabulary");
        kiln_tokenizer_free(t);
    }
}

/* ---------------------------------------------------------------- thread safety */

typedef struct {
    const kiln_tokenizer *t;
    const char *text;
    size_t len;
    const int64_t *want;
    size_t nwant;
    int ok;
} enc_job;

static void *enc_worker(void *arg) {
    enc_job *j = arg;
    j->ok = 1;
    for (int r = 0; r < 8; r++) {
        int64_t *ids = NULL;
        size_t n = 0;
        kiln_error *e = kiln_tokenizer_encode(j->t, j->text, j->len, &ids, &n);
        if (e || n != j->nwant || memcmp(ids, j->want, n * sizeof *ids)) j->ok = 0;
        kiln_error_free(e);
        free(ids);
    }
    return NULL;
}

static void check_concurrent(const kiln_tokenizer *t, const char *text, size_t len) {
    int64_t *want = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tokenizer_encode(t, text, len, &want, &n));
    enc_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (enc_job){t, text, len, want, n, 0};
        CHECK(pthread_create(&th[i], NULL, enc_worker, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(jobs[i].ok, "thread %d encoded differently", i);
    }
    free(want);
}

/* ---------------------------------------------------------------- trainer */

static const char *const WORDS[] = {"the", "of", "and", "to", "in", "is", "that", "for", "it", "was", "with", "be",
                                    "on", "not", "he", "this", "are", "or", "from", "at", "which", "but", "have",
                                    "an", "they", "you", "were", "her", "she", "there", "one", "all", "we", "their",
                                    "don't", "we're", "42", "1999", "3.14", "token", "tokenizer", "model", "Gr\xC3\xBC\xC3\x9F" "e",
                                    "\xE4\xB8\xAD\xE6\x96\x87", "\xD0\xBC\xD0\xB8\xD1\x80", "(x)", "--", "\xF0\x9F\x98\x80"};

/* Deterministic generated text: n lines of pseudo-random words. */
static void gen_text(const char *path, int nlines) {
    kiln_buf b = {0};
    uint64_t s = 12345;
    size_t nw = sizeof WORDS / sizeof WORDS[0];
    for (int l = 0; l < nlines; l++) {
        int len = 3 + (int)(l % 11);
        for (int k = 0; k < len; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            const char *w = WORDS[(s >> 33) % nw];
            if (k) kiln_buf_putc(&b, (s >> 20) % 13 == 0 ? '\t' : ' ');
            kiln_buf_put(&b, w, strlen(w));
        }
        kiln_buf_put(&b, l % 7 == 3 ? ".\r\n" : ".\n", l % 7 == 3 ? 3 : 2);
    }
    CHECK_OK(kiln_write_file_atomic(path, b.p, b.n));
    kiln_buf_free(&b);
}

/* The merges of a trained tokenizer.json as "a b" strings. */
static int merges_of(const char *path, char out[][64], int cap) {
    cJSON *root = NULL;
    CHECK_OK(kiln_json_parse_file(path, &root));
    if (!root) return -1;
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "merges");
    int n = 0;
    for (const cJSON *it = m ? m->child : NULL; it && n < cap; it = it->next, n++)
        snprintf(out[n], 64, "%s %s", cJSON_GetArrayItem(it, 0)->valuestring, cJSON_GetArrayItem(it, 1)->valuestring);
    cJSON_Delete(root);
    return n;
}

TEST(tok_train_by_hand) {
    setenv("KILN_PROGRESS", "0", 1);
    const char *dir = test_tmpdir();
    const char *in = test_join(dir, "in.txt"), *out = test_join(dir, "tok.json");
    /* words: "ab" x1, "Ġab" x2, "Ċ" x1: (a,b) 3 times, then (Ġ,ab) twice */
    put(in, "ab ab ab\n");
    const char *special[] = {"<|endoftext|>", NULL};
    const char *files[] = {in};
    kiln_bpe_train_opts o = {.vocab_size = 259, .special = special, .threads = 2};
    CHECK_OK(kiln_tokenizer_train_bpe(files, 1, &o, out));
    char m[8][64];
    CHECK(merges_of(out, m, 8) == 2);
    CHECK(!strcmp(m[0], "a b") && !strcmp(m[1], "\xC4\xA0 ab"));
    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(out, &t));
    if (t) {
        CHECK(kiln_tokenizer_vocab_size(t) == 259);
        CHECK(kiln_tokenizer_token_id(t, "<|endoftext|>") == 0);
        CHECK(kiln_tokenizer_token_id(t, "!") == 1);        /* the alphabet by code point */
        CHECK(kiln_tokenizer_token_id(t, "a") == 1 + 'a' - '!');
        CHECK(kiln_tokenizer_token_id(t, "\xC4\x80") == 1 + 188); /* Ā (byte 0) after the 188 printable */
        CHECK(kiln_tokenizer_token_id(t, "ab") == 257);
        CHECK(kiln_tokenizer_token_id(t, "\xC4\xA0" "ab") == 258);
        CHECK(kiln_tokenizer_is_special(t, 0));
        CHECK_IDS(t, "ab ab<|endoftext|>", 257, 258, 0);
        kiln_tokenizer_free(t);
    }
    /* ties go to the smaller pair of ids: (a,b) < (c,d) < (Ġ,c); merging cd removes (Ġ,c) */
    put(in, "ab cd\n");
    o.vocab_size = 260;
    CHECK_OK(kiln_tokenizer_train_bpe(files, 1, &o, out));
    CHECK(merges_of(out, m, 8) == 3);
    CHECK(!strcmp(m[0], "a b") && !strcmp(m[1], "c d") && !strcmp(m[2], "\xC4\xA0 cd"));
    /* the vocabulary can end up smaller than asked when nothing is left to merge */
    o.vocab_size = 1000;
    CHECK_OK(kiln_tokenizer_train_bpe(files, 1, &o, out));
    CHECK(merges_of(out, m, 8) == 3); /* words "ab", "Ġcd", "Ċ": nothing after Ġcd */
    /* errors */
    const char *missing[] = {test_join(dir, "nope.txt")};
    CHECK_ERR(kiln_tokenizer_train_bpe(missing, 1, &o, out), "nope.txt");
    put(in, "ok\nbad \xFF here\n");
    CHECK_ERR(kiln_tokenizer_train_bpe(files, 1, &o, out), "line 2 is not valid UTF-8");
    o.vocab_size = 0;
    CHECK_ERR(kiln_tokenizer_train_bpe(files, 1, &o, out), "vocab_size");
}

/* Options the trainer used to take quietly: a vocab_size below the byte-level alphabet plus the special tokens
 * (it wrote 257 tokens for --vocab 100), an empty special token (dropped, and with it the default
 * <|endoftext|>), a negative min_frequency. Each is an error naming the option, before any input is read. */
TEST(tok_train_rejects_bad_options) {
    setenv("KILN_PROGRESS", "0", 1);
    const char *dir = test_tmpdir();
    char in[512], out[512];
    snprintf(in, sizeof in, "%s", test_join(dir, "in.txt"));
    snprintf(out, sizeof out, "%s", test_join(dir, "tok.json"));
    put(in, "ab ab ab\n");
    const char *files[] = {in};
    const char *one[] = {"<|endoftext|>", NULL}, *two[] = {"<|endoftext|>", "<|pad|>", NULL};
    const char *empty[] = {"<|endoftext|>", "", NULL}, *dup[] = {"<|endoftext|>", "<|endoftext|>", NULL};
    kiln_bpe_train_opts o = {.vocab_size = 100, .special = one, .threads = 1};
    CHECK_ERR(kiln_tokenizer_train_bpe(files, 1, &o, out), "vocab_size 100 is below the minimum 257");
    o.vocab_size = 257;
    o.special = two;
    CHECK_ERR(kiln_tokenizer_train_bpe(files, 1, &o, out), "vocab_size 257 is below the minimum 258");
    o.special = dup; /* the same token twice is one token */
    CHECK_OK(kiln_tokenizer_train_bpe(files, 1, &o, out));
    o.special = empty;
    o.vocab_size = 300;
    CHECK_ERR(kiln_tokenizer_train_bpe(files, 1, &o, out), "special token 2 is empty");
    o.special = one;
    o.min_frequency = -1;
    CHECK_ERR(kiln_tokenizer_train_bpe(files, 1, &o, out), "min_frequency -1");
    /* the minimum is checked before the inputs are read */
    o.min_frequency = 0;
    o.vocab_size = 256;
    const char *missing[] = {test_join(dir, "nope.txt")};
    CHECK_ERR(kiln_tokenizer_train_bpe(missing, 1, &o, out), "below the minimum 257");
    CHECK_MSG(access(out, F_OK) == 0, "the successful run above wrote no file");
    /* the command line */
    char args[2048], buf[4096];
    snprintf(args, sizeof args, "tokenizer train --vocab 100 --input '%s' --out '%s'", in, out);
    CHECK(test_run_kiln(args, buf, sizeof buf) == 1);
    CHECK_MSG(strstr(buf, "vocab_size 100 is below the minimum 257"), "%s", buf);
    snprintf(args, sizeof args, "tokenizer train --vocab 300 --special '' --input '%s' --out '%s'", in, out);
    CHECK(test_run_kiln(args, buf, sizeof buf) == 1);
    CHECK_MSG(strstr(buf, "--special: a special token cannot be empty"), "%s", buf);
    snprintf(args, sizeof args, "tokenizer train --vocab 300 --min-frequency -1 --input '%s' --out '%s'", in, out);
    CHECK(test_run_kiln(args, buf, sizeof buf) == 1);
    CHECK_MSG(strstr(buf, "--min-frequency: must be at least 0, got -1"), "%s", buf);
}

TEST(tok_train_roundtrip_deterministic) {
    setenv("KILN_PROGRESS", "0", 1);
    const char *dir = test_tmpdir();
    char in[512], in2[512], out1[512], out2[512], out3[512];
    snprintf(in, sizeof in, "%s", test_join(dir, "gen.txt"));
    snprintf(in2, sizeof in2, "%s", test_src_path("tests/fixtures/tokenizer/multilingual.txt"));
    snprintf(out1, sizeof out1, "%s", test_join(dir, "a.json"));
    snprintf(out2, sizeof out2, "%s", test_join(dir, "b.json"));
    snprintf(out3, sizeof out3, "%s", test_join(dir, "c.json"));
    gen_text(in, 3000);
    const char *files[] = {in, in2};
    const char *special[] = {"<|endoftext|>", "<|pad|>", NULL};
    kiln_bpe_train_opts o = {.vocab_size = 700, .special = special, .threads = 3};
    CHECK_OK(kiln_tokenizer_train_bpe(files, 2, &o, out1));
    CHECK_OK(kiln_tokenizer_train_bpe(files, 2, &o, out2));
    o.threads = 1;
    CHECK_OK(kiln_tokenizer_train_bpe(files, 2, &o, out3));
    size_t l1 = 0, l2 = 0, l3 = 0;
    char *a = read_text(out1, &l1), *b = read_text(out2, &l2), *c = read_text(out3, &l3);
    CHECK(a && b && c && l1 == l2 && l1 == l3 && !memcmp(a, b, l1) && !memcmp(a, c, l1));
    free(a);
    free(b);
    free(c);

    kiln_tokenizer *t = NULL;
    CHECK_OK(kiln_tokenizer_load(out1, &t));
    if (!t) return;
    CHECK(kiln_tokenizer_vocab_size(t) == 700);
    CHECK(kiln_tokenizer_token_id(t, "<|pad|>") == 1);
    size_t len = 0;
    char *text = read_text(in2, &len);
    if (text) {
        int64_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(kiln_tokenizer_encode(t, text, len, &ids, &n));
        CHECK(n > 0 && n < len);
        char *back = NULL;
        size_t blen = 0;
        CHECK_OK(kiln_tokenizer_decode(t, ids, n, &back, &blen));
        CHECK_MSG(back && blen == len && memcmp(back, text, len) == 0, "decode(encode(text)) != text");
        free(back);
        free(ids);
        check_concurrent(t, text, len);
        free(text);
    }
    kiln_tokenizer_free(t);
}

/* ---------------------------------------------------------------- HF reference fixtures */

static void run_fixture(const char *name) {
    char tp[256], ep[256];
    snprintf(tp, sizeof tp, "tests/fixtures/tokenizer/%s.json", name);
    snprintf(ep, sizeof ep, "tests/fixtures/tokenizer/%s.expected.json", name);
    kiln_tokenizer *t = NULL;
    cJSON *cases = NULL;
    kiln_error *e = kiln_tokenizer_load(test_src_path(tp), &t);
    if (!e) e = kiln_json_parse_file(test_src_path(ep), &cases);
    if (e) {
        test_fail(__FILE__, __LINE__, "%s (make it with tests/fixtures/make_tokenizer_fixtures.py and HF tokenizers)",
                  kiln_error_msg(e));
        kiln_error_free(e);
        kiln_tokenizer_free(t);
        return;
    }
    int i = 0, bad = 0;
    CHECK(cJSON_GetArraySize(cases) > 10);
    for (const cJSON *c = cases->child; c; c = c->next, i++) {
        const cJSON *jt = cJSON_GetObjectItem(c, "text"), *jids = cJSON_GetObjectItem(c, "ids"),
                    *jdec = cJSON_GetObjectItem(c, "decoded");
        if (!cJSON_IsString(jt) || !cJSON_IsArray(jids) || !cJSON_IsString(jdec)) {
            test_fail(__FILE__, __LINE__, "%s case %d is malformed", ep, i);
            break;
        }
        size_t nw = (size_t)cJSON_GetArraySize(jids), k = 0;
        int64_t *want = malloc((nw + 1) * sizeof *want);
        for (const cJSON *x = jids->child; x; x = x->next) want[k++] = (int64_t)x->valuedouble;
        int64_t *ids = NULL;
        size_t n = 0;
        kiln_error *ee = kiln_tokenizer_encode(t, jt->valuestring, strlen(jt->valuestring), &ids, &n);
        if (ee || n != nw || (n && memcmp(ids, want, n * sizeof *ids))) {
            size_t at = 0;
            while (!ee && at < n && at < nw && ids[at] == want[at]) at++;
            if (bad++ < 5)
                test_fail(__FILE__, __LINE__, "%s case %d (\"%.60s\"): %s; %zu ids, want %zu; first difference at %zu",
                          name, i, jt->valuestring, ee ? kiln_error_msg(ee) : "ids differ", n, nw, at);
        }
        kiln_error_free(ee);
        char *dec = NULL;
        size_t dl = 0;
        ee = kiln_tokenizer_decode(t, want, nw, &dec, &dl);
        if (ee || dl != strlen(jdec->valuestring) || memcmp(dec, jdec->valuestring, dl)) {
            if (bad++ < 5)
                test_fail(__FILE__, __LINE__, "%s case %d: decode %s", name, i,
                          ee ? kiln_error_msg(ee) : "differs from HF's");
        }
        kiln_error_free(ee);
        free(dec);
        free(ids);
        free(want);
    }
    cJSON_Delete(cases);
    kiln_tokenizer_free(t);
}

TEST(tok_fixture_gpt2) { run_fixture("gpt2"); }
TEST(tok_fixture_llama3) { run_fixture("llama3"); }
TEST(tok_fixture_gemma) { run_fixture("gemma"); }
TEST(tok_fixture_metaspace) { run_fixture("metaspace"); }
