/* kiln data prepare and the `kiln data` command, against the real tokenizer: a byte-level BPE
 * tokenizer.json without merges, written here, so that token ids are the text's bytes (id = byte
 * value) and "<|endoftext|>" (id 256) ends every document. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/data.h"
#include "kiln/fsutil.h"
#include "kiln/tokenizer.h"
#include "test.h"

#define EOS 256

/* ---- fixtures ---- */

static void spit(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) test_fail(__FILE__, __LINE__, "cannot write %s", path);
}
static void spit_str(const char *path, const char *s) { spit(path, s, strlen(s)); }

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* GPT-2's byte -> unicode code point map (ByteLevel). */
static void byte_chars(unsigned cp[256]) {
    int n = 0;
    for (unsigned b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? b : 256 + (unsigned)n++;
    }
}

/* test_join and test_tmpdir rotate 8 static buffers: keep paths used across many calls here. */
static const char *keep(const char *s) {
    static char bufs[16][1024];
    static int k;
    char *b = bufs[k++ & 15];
    snprintf(b, sizeof bufs[0], "%s", s);
    return b;
}

/* A byte-level BPE tokenizer.json with no merges: byte b has id b, "<|endoftext|>" id 256, and
 * `vocab` - 257 padding tokens that the model never produces (for a vocabulary past u16). */
static const char *write_tokenizer(const char *dir, int64_t vocab) {
    const char *path = keep(test_join(dir, "tokenizer.json"));
    FILE *f = fopen(path, "w");
    if (!f) {
        test_fail(__FILE__, __LINE__, "cannot write %s", path);
        return path;
    }
    unsigned cp[256];
    byte_chars(cp);
    fprintf(f, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[{\"id\":%d,\"content\":"
               "\"<|endoftext|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
               "\"special\":true}],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":"
               "false,\"trim_offsets\":true,\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":"
               "\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},\"model\":{\"type\":"
               "\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,\"end_of_word_suffix\":"
               "null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{", EOS);
    for (int b = 0; b < 256; b++) fprintf(f, "\"\\u%04x\":%d,", cp[b], b);
    fprintf(f, "\"<|endoftext|>\":%d", EOS);
    for (int64_t i = EOS + 1; i < vocab; i++) fprintf(f, ",\"pad%lld\":%lld", (long long)i, (long long)i);
    fprintf(f, "},\"merges\":[]}}\n");
    fclose(f);
    return path;
}

/* The tokenizer must encode text as its bytes; say so clearly when it does not. */
static int tokenizer_is_bytes(const char *tok) {
    kiln_tokenizer *t = NULL;
    kiln_error *e = kiln_tokenizer_load(tok, &t);
    if (e) {
        test_fail(__FILE__, __LINE__, "test tokenizer does not load: %s", kiln_error_msg(e));
        kiln_error_free(e);
        return 0;
    }
    const char *text = "hi there\n\xc3\xa9!";
    int64_t *ids = NULL;
    size_t n = 0;
    int ok = 1;
    e = kiln_tokenizer_encode(t, text, strlen(text), &ids, &n);
    if (e || n != strlen(text)) ok = 0;
    for (size_t i = 0; ok && i < n; i++) ok = ids[i] == (unsigned char)text[i];
    CHECK_MSG(ok, "the byte-level test tokenizer does not encode text as its bytes");
    CHECK(kiln_tokenizer_token_id(t, "<|endoftext|>") == EOS);
    kiln_error_free(e);
    free(ids);
    kiln_tokenizer_free(t);
    return ok;
}

static kiln_error *prepare(const char *tok, const char *const *inputs, size_t n, const char *out, int64_t shard_tokens,
                           int threads, double val) {
    setenv("KILN_PROGRESS", "0", 1); /* no progress lines in the test log */
    kiln_data_prepare_opts o = {tok, inputs, n, out, shard_tokens, threads, val};
    return kiln_data_prepare(&o);
}

/* All tokens of a split, in shard order, and the documents' starting positions in that stream. */
typedef struct {
    int64_t tok[4096];
    uint64_t n;
    uint64_t starts[512];
    uint64_t ndocs;
    size_t nshards;
} stream;

static void read_split(const char *dir, const char *split, stream *s) {
    memset(s, 0, sizeof *s);
    kiln_data_index *ix = NULL;
    CHECK_OK(kiln_data_index_read(dir, &ix));
    if (!ix) return;
    const kiln_data_split_info *sp = kiln_data_index_split(ix, split);
    CHECK_MSG(sp, "no split %s", split);
    for (size_t k = 0; sp && k < sp->nshards; k++) {
        kiln_shard sh;
        kiln_error *e = kiln_data_open_shard(dir, ix, &sp->shards[k], &sh);
        CHECK_OK(e);
        if (e) break;
        CHECK(sh.h.ntokens + s->n <= 4096 && sh.h.ndocs + s->ndocs <= 512);
        for (uint64_t d = 0; d < sh.h.ndocs && s->ndocs < 512; d++) s->starts[s->ndocs++] = s->n + kiln_shard_doc_start(&sh, d);
        uint64_t m = sh.h.ntokens <= 4096 - s->n ? sh.h.ntokens : 4096 - s->n;
        kiln_shard_read(&sh, 0, m, s->tok + s->n);
        s->n += m;
        kiln_shard_close(&sh);
    }
    s->nshards = sp ? sp->nshards : 0;
    kiln_data_index_free(ix);
}

/* Expected stream of documents: each text's bytes then EOS. */
static void expect_docs(const stream *s, const char *const *texts, size_t n, int line) {
    uint64_t pos = 0;
    int ok = s->ndocs == n;
    for (size_t d = 0; ok && d < n; d++) {
        ok = s->starts[d] == pos;
        for (size_t i = 0; ok && texts[d][i]; i++) ok = s->tok[pos++] == (unsigned char)texts[d][i];
        ok = ok && s->tok[pos++] == EOS;
    }
    ok = ok && pos == s->n;
    if (!ok) test_fail(__FILE__, line, "split holds %llu documents / %llu tokens, not the %zu expected documents",
                       (unsigned long long)s->ndocs, (unsigned long long)s->n, n);
}

/* ---- tests ---- */

TEST(data_prepare_val_rule) {
    CHECK(!kiln_data_is_val_doc(0, 0.5) && kiln_data_is_val_doc(1, 0.5) && !kiln_data_is_val_doc(2, 0.5));
    CHECK(kiln_data_is_val_doc(1, 0.001)); /* the second document, whatever the fraction */
    for (int i = 0; i < 100; i++) CHECK(!kiln_data_is_val_doc((uint64_t)i, 0));
    const double fr[5] = {0.1, 0.02, 0.25, 0.5, 0.9};
    for (int k = 0; k < 5; k++) {
        int nval = 0, gaps_ok = 1, last = -1;
        for (int i = 0; i < 1001; i++)
            if (kiln_data_is_val_doc((uint64_t)i, fr[k])) {
                nval++;
                if (last >= 0 && fr[k] <= 0.5 && i - last < (int)(1 / fr[k]) - 1) gaps_ok = 0;
                last = i;
            }
        CHECK_MSG(nval == (int)(1000 * fr[k] + 0.5), "fraction %g: %d of 1001 documents in val", fr[k], nval);
        CHECK_MSG(gaps_ok, "fraction %g: val documents are not evenly spread", fr[k]);
    }
}

TEST(data_prepare_documents_and_eos) {
    const char *dir = keep(test_tmpdir()), *out = keep(test_join(dir, "out/data"));
    const char *tok = write_tokenizer(dir, 257);
    if (!tokenizer_is_bytes(tok)) return;
    const char *a = test_join(dir, "a.txt"), *b = test_join(dir, "b.jsonl"), *c = test_join(dir, "c.txt"),
               *d = test_join(dir, "d.md");
    spit_str(a, "hello world\n\nsecond paragraph\n");
    spit_str(b, "{\"text\": \"ab\"}\n\n   \n{\"text\": \"\", \"id\": 3}\r\n{\"text\": \"c\\u00e9\\n\"}");
    spit_str(c, "");
    spit_str(d, "xyz");
    const char *inputs[4] = {a, b, c, d};
    CHECK_OK(prepare(tok, inputs, 4, out, 0, 2, 0));
    stream s;
    read_split(out, "train", &s);
    const char *texts[4] = {"hello world\n\nsecond paragraph\n", "ab", "c\xc3\xa9\n", "xyz"};
    expect_docs(&s, texts, 4, __LINE__);
    CHECK(s.nshards == 1 && file_exists(test_join(out, "train_000000.bin")));
    read_split(out, "val", &s);
    CHECK(s.nshards == 0 && s.n == 0);

    kiln_data_index *ix = NULL;
    CHECK_OK(kiln_data_index_read(out, &ix));
    if (ix) {
        uint64_t h = 0, size = 0;
        CHECK_OK(kiln_fnv1a64_file(tok, &h, &size));
        CHECK(ix->vocab_size == 257 && ix->eos_id == EOS && ix->token_bytes == 2 && ix->tokenizer_checksum == h);
        CHECK(ix->tokenizer_path[0] == '/' && strstr(ix->tokenizer_path, "tokenizer.json"));
        const kiln_data_split_info *tr = kiln_data_index_split(ix, "train");
        CHECK(tr && tr->documents == 4 && tr->tokens == 31 + 3 + 5 + 4);
        kiln_data_index_free(ix);
    }
    /* the loader reads it */
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(out, "train", 6, 1, 0, 1, &l));
    if (l) {
        CHECK(kiln_loader_vocab_size(l) == 257 && kiln_loader_tokens(l) == 43 && kiln_loader_windows(l) == 7);
        kiln_loader_close(l);
    }
}

/* Pseudo-random texts: documents of 0..120 bytes in .jsonl files and whole .txt files. */
static size_t make_corpus(const char *dir, const char **inputs) {
    static char names[6][64];
    uint64_t x = 12345;
    size_t n = 0;
    for (int f = 0; f < 6; f++) {
        int jsonl = f % 2 == 0;
        snprintf(names[f], sizeof names[f], "in%d.%s", f, jsonl ? "jsonl" : "txt");
        const char *path = test_join(dir, names[f]);
        FILE *fp = fopen(path, "w");
        int ndoc = jsonl ? 40 + f * 7 : 1;
        for (int d = 0; fp && d < ndoc; d++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            int len = (int)((x >> 33) % 121);
            if (jsonl) fputs("{\"text\": \"", fp);
            for (int i = 0; i < len; i++) {
                x = x * 6364136223846793005ULL + 1442695040888963407ULL;
                fputc("abcdefgh ijklmnop.,"[(x >> 40) % 19], fp);
            }
            if (jsonl) fputs("\"}\n", fp);
        }
        if (fp) fclose(fp);
        inputs[n++] = strdup(path);
    }
    return n;
}

static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    kiln_error *e1 = kiln_read_file(a, &x, &nx), *e2 = kiln_read_file(b, &y, &ny);
    int same = !e1 && !e2 && nx == ny && !memcmp(x, y, nx);
    kiln_error_free(e1);
    kiln_error_free(e2);
    free(x);
    free(y);
    return same;
}

TEST(data_prepare_same_bytes_for_any_thread_count) {
    const char *dir = keep(test_tmpdir());
    const char *tok = write_tokenizer(dir, 257);
    if (!tokenizer_is_bytes(tok)) return;
    const char *inputs[6];
    size_t n = make_corpus(dir, inputs);
    const int threads[3] = {1, 3, 8};
    char outs[3][600];
    for (int t = 0; t < 3; t++) {
        snprintf(outs[t], sizeof outs[t], "%s/out%d", dir, threads[t]);
        CHECK_OK(prepare(tok, inputs, n, outs[t], 700, threads[t], 0.1));
    }
    kiln_data_index *ix = NULL;
    CHECK_OK(kiln_data_index_read(outs[0], &ix));
    for (size_t s = 0; ix && s < ix->nsplits; s++) {
        const kiln_data_split_info *sp = &ix->splits[s];
        CHECK(sp->nshards >= 2);
        for (size_t k = 0; k < sp->nshards; k++)
            for (int t = 1; t < 3; t++)
                CHECK_MSG(same_file(test_join(outs[0], sp->shards[k].file), test_join(outs[t], sp->shards[k].file)),
                          "%s differs between 1 and %d threads", sp->shards[k].file, threads[t]);
    }
    for (int t = 1; t < 3; t++)
        CHECK(same_file(test_join(outs[0], "index.json"), test_join(outs[t], "index.json")));
    /* about a tenth of the documents are in val, every shard at most 700 tokens */
    const kiln_data_split_info *tr = ix ? kiln_data_index_split(ix, "train") : NULL,
                               *va = ix ? kiln_data_index_split(ix, "val") : NULL;
    if (tr && va) {
        uint64_t all = tr->documents + va->documents;
        CHECK(all >= 150 && va->documents * 10 >= all - 10 && va->documents * 10 <= all + 10);
        for (size_t k = 0; k < tr->nshards; k++) CHECK(tr->shards[k].tokens <= 700);
    }
    kiln_data_index_free(ix);
    for (size_t i = 0; i < n; i++) free((void *)inputs[i]);
}

TEST(data_prepare_shards_cut_at_documents) {
    const char *dir = keep(test_tmpdir()), *out = keep(test_join(dir, "out"));
    const char *tok = write_tokenizer(dir, 257);
    if (!tokenizer_is_bytes(tok)) return;
    const char *in = test_join(dir, "docs.jsonl");
    /* documents of 5, 4, 3, 26 and 2 tokens (with EOS); shards of at most 10 */
    spit_str(in, "{\"text\":\"aaaa\"}\n{\"text\":\"bbb\"}\n{\"text\":\"cc\"}\n"
                 "{\"text\":\"ABCDEFGHIJKLMNOPQRSTUVWXY\"}\n{\"text\":\"d\"}\n");
    const char *inputs[1] = {in};
    CHECK_OK(prepare(tok, inputs, 1, out, 10, 1, 0));
    kiln_data_index *ix = NULL;
    CHECK_OK(kiln_data_index_read(out, &ix));
    const kiln_data_split_info *sp = ix ? kiln_data_index_split(ix, "train") : NULL;
    CHECK(sp && sp->nshards == 5);
    /* [aaaa. bbb.] [cc.] [ABCDEFGHIJ] [KLMNOPQRST] [UVWXY. d.]: the long document fills shards,
     * its tail continues in the next one, whose first document then starts at 6 */
    const uint64_t ntok[5] = {9, 3, 10, 10, 8}, ndoc[5] = {2, 1, 1, 0, 1};
    const uint64_t starts[5][2] = {{0, 5}, {0}, {0}, {0}, {6}};
    for (size_t k = 0; sp && k < sp->nshards && k < 5; k++) {
        kiln_shard sh;
        kiln_error *e = kiln_data_open_shard(out, ix, &sp->shards[k], &sh);
        CHECK_OK(e);
        if (e) continue;
        CHECK_MSG(sh.h.ntokens == ntok[k] && sh.h.ndocs == ndoc[k], "shard %zu: %llu tokens, %llu documents", k,
                  (unsigned long long)sh.h.ntokens, (unsigned long long)sh.h.ndocs);
        for (uint64_t d = 0; d < sh.h.ndocs && d < 2; d++) CHECK(kiln_shard_doc_start(&sh, d) == starts[k][d]);
        kiln_shard_close(&sh);
    }
    stream s;
    read_split(out, "train", &s);
    const char *texts[5] = {"aaaa", "bbb", "cc", "ABCDEFGHIJKLMNOPQRSTUVWXY", "d"};
    /* the continuation is not a document start: the stream's document starts are 0,5,9,12,38 */
    CHECK(s.ndocs == 5);
    uint64_t pos = 0;
    for (int d = 0; d < 5 && s.ndocs == 5; d++) {
        CHECK(s.starts[d] == pos);
        pos += strlen(texts[d]) + 1;
    }
    CHECK(s.n == pos && s.tok[37] == EOS && s.tok[39] == EOS && s.tok[12] == 'A');
    kiln_data_index_free(ix);
}

TEST(data_prepare_val_split) {
    const char *dir = keep(test_tmpdir()), *out = keep(test_join(dir, "out"));
    const char *tok = write_tokenizer(dir, 257);
    if (!tokenizer_is_bytes(tok)) return;
    const char *in = test_join(dir, "ten.jsonl");
    spit_str(in, "{\"text\":\"d0\"}\n{\"text\":\"d1\"}\n{\"text\":\"d2\"}\n{\"text\":\"d3\"}\n{\"text\":\"d4\"}\n"
                 "{\"text\":\"d5\"}\n{\"text\":\"d6\"}\n{\"text\":\"d7\"}\n{\"text\":\"d8\"}\n{\"text\":\"d9\"}\n");
    const char *inputs[1] = {in};
    CHECK_OK(prepare(tok, inputs, 1, out, 0, 4, 0.2));
    stream s;
    read_split(out, "val", &s);
    const char *val[2] = {"d1", "d6"};
    expect_docs(&s, val, 2, __LINE__);
    read_split(out, "train", &s);
    const char *train[8] = {"d0", "d2", "d3", "d4", "d5", "d7", "d8", "d9"};
    expect_docs(&s, train, 8, __LINE__);
    CHECK(file_exists(test_join(out, "val_000000.bin")));

    /* two documents and a tiny fraction: still one val document; one document: none */
    const char *two = test_join(dir, "two.jsonl"), *one = test_join(dir, "one.txt");
    spit_str(two, "{\"text\":\"first\"}\n{\"text\":\"second\"}\n");
    spit_str(one, "only");
    const char *in2[1] = {two}, *in1[1] = {one};
    CHECK_OK(prepare(tok, in2, 1, out, 0, 1, 0.001));
    const char *v2[1] = {"second"}, *t2[1] = {"first"};
    read_split(out, "val", &s);
    expect_docs(&s, v2, 1, __LINE__);
    read_split(out, "train", &s);
    expect_docs(&s, t2, 1, __LINE__);
    CHECK_OK(prepare(tok, in1, 1, out, 0, 1, 0.5));
    read_split(out, "val", &s);
    CHECK(s.nshards == 0);
    CHECK(!file_exists(test_join(out, "val_000000.bin"))); /* the earlier run's val shard is gone */
    kiln_loader *l = NULL;
    CHECK_ERR(kiln_loader_open(out, "val", 2, 1, 0, 1, &l), "split 'val' has too little data: 0 tokens");
}

TEST(data_prepare_u32_vocab) {
    const char *dir = keep(test_tmpdir()), *out = keep(test_join(dir, "out"));
    const char *tok = write_tokenizer(dir, 70000);
    if (!tokenizer_is_bytes(tok)) return;
    const char *in = test_join(dir, "t.txt");
    spit_str(in, "wide tokens");
    const char *inputs[1] = {in};
    CHECK_OK(prepare(tok, inputs, 1, out, 0, 0, 0));
    kiln_shard sh;
    CHECK_OK(kiln_shard_open(test_join(out, "train_000000.bin"), &sh));
    CHECK(sh.h.token_bytes == 4 && sh.h.vocab_size == 70000 && sh.h.ntokens == 12);
    CHECK(sh.h.ntokens == 12 && kiln_shard_token(&sh, 0) == 'w' && kiln_shard_token(&sh, 11) == EOS);
    kiln_shard_close(&sh);
}

TEST(data_prepare_rerun_replaces_shards) {
    const char *dir = keep(test_tmpdir()), *out = keep(test_join(dir, "out"));
    const char *tok = write_tokenizer(dir, 257);
    if (!tokenizer_is_bytes(tok)) return;
    const char *inputs[6];
    size_t n = make_corpus(dir, inputs);
    CHECK_OK(prepare(tok, inputs, n, out, 200, 2, 0));
    CHECK(file_exists(test_join(out, "train_000010.bin")));
    CHECK_OK(prepare(tok, inputs, n, out, 100000, 2, 0));
    CHECK(file_exists(test_join(out, "train_000000.bin")) && !file_exists(test_join(out, "train_000001.bin")));
    CHECK(!file_exists(test_join(out, "train_000010.bin")));
    for (size_t i = 0; i < n; i++) free((void *)inputs[i]);
}

TEST(data_prepare_errors_name_the_input) {
    const char *dir = keep(test_tmpdir()), *out = keep(test_join(dir, "out"));
    const char *tok = write_tokenizer(dir, 257);
    const char *good = keep(test_join(dir, "good.txt")), *bad = keep(test_join(dir, "bad.jsonl"));
    spit_str(good, "fine");
    const char *inputs[2] = {good, bad};
    CHECK_ERR(prepare(tok, inputs, 2, out, 0, 1, 0), "bad.jsonl: cannot open");
    spit_str(bad, "{\"text\":\"ok\"}\n{\"text\": oops}\n");
    CHECK_ERR(prepare(tok, inputs, 2, out, 0, 1, 0), "bad.jsonl:2: invalid JSON");
    spit_str(bad, "{\"text\":\"ok\"}\n\n{\"body\":\"no text\"}\n");
    CHECK_ERR(prepare(tok, inputs, 2, out, 0, 3, 0), "bad.jsonl:3: missing required field 'text'");
    spit_str(bad, "[\"text\"]\n");
    CHECK_ERR(prepare(tok, inputs, 2, out, 0, 3, 0), "bad.jsonl:1: expected a JSON object");
    spit_str(bad, "{\"text\": 5}\n");
    CHECK_ERR(prepare(tok, inputs, 2, out, 0, 3, 0), "bad.jsonl:1: field 'text' must be a string");
    CHECK(!file_exists(test_join(out, "index.json")));
    const char *only_good[1] = {good};
    CHECK_ERR(prepare(test_join(dir, "missing.json"), only_good, 1, out, 0, 1, 0), "missing.json");
    CHECK_ERR(prepare(tok, only_good, 1, out, 0, 1, 1.0), "val_fraction must be in [0, 1)");
    CHECK_ERR(prepare(tok, only_good, 1, out, -5, 1, 0), "shard_tokens");
    CHECK_ERR(prepare(tok, only_good, 0, out, 0, 1, 0), "no input files");
    const char *empty = test_join(dir, "empty.txt");
    spit_str(empty, "");
    const char *only_empty[1] = {empty};
    CHECK_ERR(prepare(tok, only_empty, 1, out, 0, 1, 0), "hold no text");
    CHECK(!file_exists(test_join(out, "index.json")));
    CHECK_OK(prepare(tok, only_good, 1, out, 0, 1, 0));
    CHECK(file_exists(test_join(out, "index.json")));
}

/* A .jsonl text with an escaped NUL was cut there (cJSON's strings are NUL-terminated and the text's length
 * was taken with strlen): the text keeps its NULs, as a plain text file does; "\\\\u0000" (an escaped
 * backslash) is no NUL; a raw NUL byte (not JSON) and a line that leaves no control character free to stand
 * in for NUL are errors naming file:line. */
TEST(data_prepare_jsonl_keeps_escaped_nul) {
    const char *dir = keep(test_tmpdir()), *out = keep(test_join(dir, "out"));
    const char *tok = write_tokenizer(dir, 257);
    if (!tokenizer_is_bytes(tok)) return;
    const char *in = keep(test_join(dir, "nul.jsonl"));
    spit_str(in, "{\"text\": \"ab\\u0000cd\\u0000\"}\n"          /* a b NUL c d NUL */
                 "{\"text\": \"x\\u0001y\\u0000z\\u0002\"}\n"    /* \u0001 and \u0002 stay themselves */
                 "{\"text\": \"\\\\u0000!\"}\n"                  /* backslash u 0 0 0 0 ! */
                 "{\"text\": \"\\u0000\", \"text\\u0000\": \"no\"}\n"); /* a lone NUL; "text\0" is another key */
    const char *inputs[1] = {in};
    CHECK_OK(prepare(tok, inputs, 1, out, 0, 2, 0));
    stream st;
    read_split(out, "train", &st);
    static const unsigned char want[][9] = {{'a', 'b', 0, 'c', 'd', 0}, {'x', 1, 'y', 0, 'z', 2},
                                            {'\\', 'u', '0', '0', '0', '0', '!'}, {0}};
    const size_t wlen[4] = {6, 6, 7, 1};
    uint64_t pos = 0;
    int ok = st.ndocs == 4;
    for (size_t d = 0; ok && d < 4; d++) {
        ok = st.starts[d] == pos;
        for (size_t i = 0; ok && i < wlen[d]; i++) ok = st.tok[pos++] == want[d][i];
        ok = ok && st.tok[pos++] == EOS;
    }
    CHECK_MSG(ok && pos == st.n, "%llu documents / %llu tokens, not the texts with their NULs (document 0 has %llu "
              "tokens)", (unsigned long long)st.ndocs, (unsigned long long)st.n,
              (unsigned long long)(st.ndocs > 1 ? st.starts[1] : st.n));
    /* errors */
    const char *bad = keep(test_join(dir, "bad.jsonl"));
    const char *only_bad[1] = {bad};
    static const char raw_nul[] = "{\"text\": \"ok\"}\n{\"text\": \"a\0b\"}\n";
    spit(bad, raw_nul, sizeof raw_nul - 1);
    CHECK_ERR(prepare(tok, only_bad, 1, out, 0, 2, 0), "bad.jsonl:2: a raw NUL byte at column 12");
    char line[512] = "{\"text\": \"\\u0000";
    for (int c = 1; c < 32; c++) snprintf(line + strlen(line), sizeof line - strlen(line), "\\u%04x", c);
    snprintf(line + strlen(line), sizeof line - strlen(line), "\"}\n");
    spit_str(bad, line);
    CHECK_ERR(prepare(tok, only_bad, 1, out, 0, 2, 0), "bad.jsonl:1: the line escapes NUL");
    CHECK_ERR(prepare(tok, only_bad, 1, out, 0, 2, 0), "a NUL in the text of JSON Lines input is not supported");
    /* with one control character left free it reads */
    line[0] = 0;
    snprintf(line, sizeof line, "{\"text\": \"\\u0000");
    for (int c = 1; c < 32; c++)
        if (c != 0x1f) snprintf(line + strlen(line), sizeof line - strlen(line), "\\u%04x", c);
    snprintf(line + strlen(line), sizeof line - strlen(line), "\"}\n");
    spit_str(bad, line);
    CHECK_OK(prepare(tok, only_bad, 1, out, 0, 2, 0));
    read_split(out, "train", &st);
    ok = st.ndocs == 1 && st.n == 32 && st.tok[0] == 0 && st.tok[31] == EOS;
    for (int c = 1; ok && c < 31; c++) ok = st.tok[c] == c;
    CHECK_MSG(ok, "%llu tokens, want NUL, 0x01..0x1e and EOS", (unsigned long long)st.n);
}

/* ---- the command line ---- */

TEST(data_cli_prepare_and_inspect) {
    const char *dir = keep(test_tmpdir()), *out = keep(test_join(dir, "out"));
    const char *tok = write_tokenizer(dir, 257);
    const char *inputs[6];
    size_t n = make_corpus(dir, inputs);
    char args[4096], buf[16384];
    int k = snprintf(args, sizeof args, "data prepare --tokenizer '%s' --out '%s' --shard-tokens 1000 --threads 2 "
                     "--val-fraction 0.1 --input", tok, out);
    for (size_t i = 0; i < n; i++) k += snprintf(args + k, sizeof args - (size_t)k, " '%s'", inputs[i]);
    int rc = test_run_kiln(args, buf, sizeof buf);
    CHECK_MSG(rc == 0, "kiln %s: exit %d\n%s", args, rc, buf);
    snprintf(args, sizeof args, "data inspect '%s'", out);
    rc = test_run_kiln(args, buf, sizeof buf);
    CHECK_MSG(rc == 0, "exit %d\n%s", rc, buf);
    CHECK_MSG(strstr(buf, "train_000000.bin") && strstr(buf, "val_000000.bin") && strstr(buf, "vocab 257") &&
                  strstr(buf, "verified"),
              "inspect printed:\n%s", buf);
    /* a corrupt shard: inspect names it and fails */
    const char *p = test_join(out, "train_000001.bin");
    char *b = NULL;
    size_t len = 0;
    CHECK_OK(kiln_read_file(p, &b, &len));
    if (b && len > 60) {
        b[60] ^= 1;
        spit(p, b, len);
        rc = test_run_kiln(args, buf, sizeof buf);
        CHECK_MSG(rc == 1 && strstr(buf, "train_000001.bin: checksum mismatch"), "exit %d\n%s", rc, buf);
    }
    free(b);
    CHECK(test_run_kiln("data", buf, sizeof buf) == 2);
    CHECK(test_run_kiln("data prepare --out x", buf, sizeof buf) == 2);
    CHECK(test_run_kiln("data frobnicate", buf, sizeof buf) == 2 && strstr(buf, "frobnicate"));
    snprintf(args, sizeof args, "data inspect '%s'", dir);
    CHECK(test_run_kiln(args, buf, sizeof buf) == 1 && strstr(buf, "index.json"));
    for (size_t i = 0; i < n; i++) free((void *)inputs[i]);
}
