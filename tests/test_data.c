/* Token shards and the loader: round trips (u16 and u32), every kind of damaged shard (each error
 * names the file), index.json checks, and the loader's windows, permutation, rank sharding and
 * saved state. kiln_data_prepare is tested in test_data_prepare.c (it needs the tokenizer). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/data.h"
#include "kiln/fsutil.h"
#include "test.h"

/* ---- helpers ---- */

static unsigned char *slurp(const char *path, size_t *n) {
    char *d = NULL;
    kiln_error *e = kiln_read_file(path, &d, n);
    if (e) {
        test_fail(__FILE__, __LINE__, "%s", kiln_error_msg(e));
        kiln_error_free(e);
        return NULL;
    }
    return (unsigned char *)d;
}

static void spit(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) test_fail(__FILE__, __LINE__, "cannot write %s", path);
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A shard of n tokens, token i = (first + i) % vocab, documents starting every doc_len tokens. */
static void write_seq_shard(const char *path, uint64_t first, uint64_t n, uint64_t vocab, uint64_t doc_len) {
    uint32_t tb = kiln_shard_token_bytes(vocab);
    unsigned char *tok = malloc(n * tb + 1);
    uint64_t *starts = malloc((n / doc_len + 1) * sizeof *starts), nd = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = (first + i) % vocab;
        if (tb == 2) ((uint16_t *)tok)[i] = (uint16_t)v;
        else ((uint32_t *)tok)[i] = (uint32_t)v;
        if (i % doc_len == 0) starts[nd++] = i;
    }
    CHECK_OK(kiln_shard_write(path, tok, n, starts, nd, vocab));
    free(tok);
    free(starts);
}

/* A data directory whose split `split` has shards of the given sizes; token at stream position p
 * is p % vocab. Writes index.json (a "train" split and, unless split is "train", that one too). */
static void make_split(const char *dir, const char *split, const uint64_t *sizes, size_t nshards, uint64_t vocab) {
    kiln_data_index ix = {0};
    ix.version = KILN_DATA_INDEX_VERSION;
    ix.tokenizer_path = "tok.json";
    ix.tokenizer_checksum = 0x1234;
    ix.vocab_size = (int64_t)vocab;
    ix.eos_id = -1;
    kiln_data_split_info sp = {0};
    sp.name = (char *)split;
    sp.nshards = nshards;
    sp.shards = calloc(nshards + 1, sizeof *sp.shards);
    char names[16][32];
    uint64_t pos = 0;
    for (size_t k = 0; k < nshards; k++) {
        snprintf(names[k], sizeof names[k], "%s_%06zu.bin", split, k);
        const char *path = test_join(dir, names[k]);
        write_seq_shard(path, pos, sizes[k], vocab, 7);
        kiln_shard s;
        CHECK_OK(kiln_shard_open(path, &s));
        sp.shards[k] = (kiln_data_shard_info){names[k], s.h.ntokens, s.h.ndocs, s.h.checksum};
        sp.tokens += s.h.ntokens;
        sp.documents += s.h.ndocs;
        kiln_shard_close(&s);
        pos += sizes[k];
    }
    ix.splits = &sp;
    ix.nsplits = 1;
    CHECK_OK(kiln_data_index_write(dir, &ix));
    free(sp.shards);
}

/* ---- shards ---- */

static void roundtrip(uint64_t vocab) {
    const char *path = test_join(test_tmpdir(), "s.bin");
    uint32_t vals[11] = {0, 1, 2, 255, 256, 1000, (uint32_t)vocab - 1, 7, 7, 3, (uint32_t)vocab / 2};
    uint32_t tb = kiln_shard_token_bytes(vocab);
    unsigned char buf[44];
    for (int i = 0; i < 11; i++) {
        if (tb == 2) ((uint16_t *)buf)[i] = (uint16_t)vals[i];
        else ((uint32_t *)buf)[i] = vals[i];
    }
    uint64_t starts[3] = {0, 4, 9};
    uint64_t sum = 0;
    CHECK_OK(kiln_shard_write_ex(path, buf, 11, starts, 3, vocab, &sum));
    CHECK(sum == kiln_fnv1a64(KILN_FNV1A64_INIT, buf, 11 * tb));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (uint64_t)sb.st_size == 48 + 11 * tb + 3 * 8);
    kiln_shard s;
    CHECK_OK(kiln_shard_open(path, &s));
    CHECK(s.h.version == 1 && s.h.token_bytes == tb && s.h.ntokens == 11 && s.h.ndocs == 3);
    CHECK(s.h.vocab_size == vocab);
    CHECK(s.h.checksum == kiln_fnv1a64(KILN_FNV1A64_INIT, buf, 11 * tb));
    for (int i = 0; i < 11; i++) CHECK_MSG(kiln_shard_token(&s, (uint64_t)i) == vals[i], "token %d", i);
    for (int i = 0; i < 3; i++) CHECK(kiln_shard_doc_start(&s, (uint64_t)i) == starts[i]);
    int64_t got[11];
    kiln_shard_read(&s, 2, 9, got);
    for (int i = 0; i < 9; i++) CHECK(got[i] == (int64_t)vals[i + 2]);
    CHECK(!strcmp(s.path, path));
    kiln_shard_close(&s);
    kiln_shard_close(&s); /* twice is fine */
}

TEST(data_shard_roundtrip_u16) {
    CHECK(kiln_shard_token_bytes(65536) == 2);
    CHECK(kiln_shard_token_bytes(65537) == 4);
    roundtrip(50257);
    roundtrip(65536);
}

TEST(data_shard_roundtrip_u32) {
    roundtrip(65537);
    roundtrip(262144);
}

TEST(data_shard_empty) {
    const char *path = test_join(test_tmpdir(), "e.bin");
    CHECK_OK(kiln_shard_write(path, NULL, 0, NULL, 0, 100));
    kiln_shard s;
    CHECK_OK(kiln_shard_open(path, &s));
    CHECK(s.h.ntokens == 0 && s.h.ndocs == 0);
    kiln_shard_close(&s);
}

TEST(data_fnv1a64_known_values) {
    /* reference values of FNV-1a 64 */
    CHECK(kiln_fnv1a64(KILN_FNV1A64_INIT, "", 0) == 0xcbf29ce484222325ULL);
    CHECK(kiln_fnv1a64(KILN_FNV1A64_INIT, "a", 1) == 0xaf63dc4c8601ec8cULL);
    CHECK(kiln_fnv1a64(KILN_FNV1A64_INIT, "foobar", 6) == 0x85944171f73967e8ULL);
    CHECK(kiln_fnv1a64(kiln_fnv1a64(KILN_FNV1A64_INIT, "foo", 3), "bar", 3) == 0x85944171f73967e8ULL);
}

TEST(data_shard_writer_rejects_bad_input) {
    const char *dir = test_tmpdir(), *path = test_join(dir, "w.bin");
    uint16_t t[4] = {1, 2, 300, 4};
    uint64_t ok[2] = {0, 2}, dup[2] = {0, 0}, past[2] = {0, 4};
    CHECK_ERR(kiln_shard_write(path, t, 4, ok, 2, 300), "token 300 at position 2 is outside the vocabulary");
    CHECK_ERR(kiln_shard_write(path, t, 4, dup, 2, 1000), "not strictly increasing");
    CHECK_ERR(kiln_shard_write(path, t, 4, past, 2, 1000), "starts at 4, not below the token count 4");
    CHECK_ERR(kiln_shard_write(path, t, 4, ok, 2, 0), "vocab size 0");
    struct stat sb;
    CHECK(stat(path, &sb) != 0); /* nothing written */
}

/* A small valid shard's bytes (u16, 5 tokens, 2 documents: 48 + 10 + 16 = 74 bytes). */
static unsigned char *small_shard(const char *dir, size_t *n) {
    const char *path = test_join(dir, "small.bin");
    uint16_t t[5] = {10, 20, 30, 40, 50};
    uint64_t starts[2] = {0, 3};
    CHECK_OK(kiln_shard_write(path, t, 5, starts, 2, 100));
    return slurp(path, n);
}

/* Open must fail with a message that names the file and contains needle. */
static void expect_error_at(const char *path, const char *needle, int line) {
    kiln_shard s;
    kiln_error *e = kiln_shard_open(path, &s);
    if (!e) {
        test_fail(__FILE__, line, "%s opened, expected an error containing '%s'", path, needle);
        kiln_shard_close(&s);
        return;
    }
    const char *m = kiln_error_msg(e);
    if (strncmp(m, path, strlen(path)) != 0) test_fail(__FILE__, line, "error '%s' does not start with %s", m, path);
    if (!strstr(m, needle)) test_fail(__FILE__, line, "error '%s' lacks '%s'", m, needle);
    CHECK(s.map == NULL && s.path == NULL);
    kiln_error_free(e);
}
#define EXPECT_ERROR(path, needle) expect_error_at(path, needle, __LINE__)
/* Write the n bytes at b to path, then expect as above. */
static void expect_bytes_error_at(const char *path, const void *b, size_t n, const char *needle, int line) {
    spit(path, b, n);
    expect_error_at(path, needle, line);
}
#define EXPECT_BYTES_ERROR(path, b, n, needle) expect_bytes_error_at(path, b, n, needle, __LINE__)

TEST(data_shard_every_truncation_fails) {
    const char *dir = test_tmpdir(), *path = test_join(dir, "t.bin");
    size_t n = 0;
    unsigned char *b = small_shard(dir, &n);
    CHECK(n == 74);
    for (size_t len = 0; b && len < n; len++) {
        spit(path, b, len);
        char needle[128];
        if (len == 0) snprintf(needle, sizeof needle, "empty file");
        else if (len < 48) snprintf(needle, sizeof needle, "truncated: %zu bytes, shorter than the 48-byte", len);
        else snprintf(needle, sizeof needle, "truncated: file is %zu bytes, the header implies 74", len);
        EXPECT_ERROR(path, needle);
    }
    /* one byte too many */
    unsigned char *big = calloc(n + 1, 1);
    if (b) memcpy(big, b, n);
    EXPECT_BYTES_ERROR(path, big, n + 1, "wrong size: file is 75 bytes, the header implies 74");
    free(big);
    free(b);
}

TEST(data_shard_bad_magic) {
    const char *dir = test_tmpdir(), *path = test_join(dir, "foreign.bin");
    const char *text = "This is a plain text file, certainly not a shard; it is long enough to hold a header.\n";
    EXPECT_BYTES_ERROR(path, text, strlen(text), "not a kiln token shard (bad magic)");
    /* a safetensors file: 8-byte length then JSON */
    unsigned char st[64] = {16, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    EXPECT_BYTES_ERROR(path, st, sizeof st, "not a kiln token shard (bad magic)");
    EXPECT_BYTES_ERROR(path, "KILNTOX", 7, "bad magic"); /* short and wrong */
    EXPECT_BYTES_ERROR(path, "KILN", 4, "truncated"); /* short but a prefix of the magic: truncated */
    EXPECT_ERROR(test_join(dir, "missing.bin"), "cannot open");
    EXPECT_ERROR(dir, "not a regular file");
}

TEST(data_shard_versions_and_widths) {
    const char *dir = test_tmpdir(), *path = test_join(dir, "v.bin");
    size_t n = 0;
    unsigned char *b = small_shard(dir, &n);
    if (!b) return;
    b[8] = 2;
    EXPECT_BYTES_ERROR(path, b, n, "shard format version 2 is newer than this kiln reads (version 1)");
    b[8] = 0;
    EXPECT_BYTES_ERROR(path, b, n, "invalid shard format version 0");
    b[8] = 1;
    b[12] = 3;
    EXPECT_BYTES_ERROR(path, b, n, "token width 3 bytes; expected 2 or 4");
    b[12] = 4;
    EXPECT_BYTES_ERROR(path, b, n, "token width 4 bytes does not match vocab size 100 (expected 2)");
    b[12] = 2;
    put_u64(b + 32, 0);
    EXPECT_BYTES_ERROR(path, b, n, "vocab size 0");
    put_u64(b + 32, 100);
    put_u64(b + 16, UINT64_MAX / 2); /* token count whose size overflows */
    EXPECT_BYTES_ERROR(path, b, n, "file is 74 bytes");
    put_u64(b + 16, 5);
    put_u64(b + 24, 6); /* more documents than tokens */
    EXPECT_BYTES_ERROR(path, b, n, "6 documents but only 5 tokens");
    free(b);
}

TEST(data_shard_flipped_byte_fails_checksum) {
    const char *dir = test_tmpdir(), *path = test_join(dir, "flip.bin");
    size_t n = 0;
    unsigned char *b = small_shard(dir, &n);
    if (!b) return;
    for (size_t pos = 48; pos < 58; pos++) {
        b[pos] ^= 0x01;
        EXPECT_BYTES_ERROR(path, b, n, "checksum mismatch");
        b[pos] ^= 0x01;
    }
    b[44] ^= 0x80; /* the stored checksum itself */
    EXPECT_BYTES_ERROR(path, b, n, "checksum mismatch");
    free(b);
}

TEST(data_shard_token_outside_vocab) {
    const char *dir = test_tmpdir(), *path = test_join(dir, "oov.bin");
    size_t n = 0;
    unsigned char *b = small_shard(dir, &n);
    if (!b) return;
    b[48 + 2 * 3] = 100; /* token 3 := 100 = vocab size, with a matching checksum */
    put_u64(b + 40, kiln_fnv1a64(KILN_FNV1A64_INIT, b + 48, 10));
    EXPECT_BYTES_ERROR(path, b, n, "token 100 at position 3 is outside the vocabulary (size 100)");
    free(b);
}

TEST(data_shard_bad_offsets) {
    const char *dir = test_tmpdir(), *path = test_join(dir, "off.bin");
    size_t n = 0;
    unsigned char *b = small_shard(dir, &n);
    if (!b) return;
    put_u64(b + 66, 0); /* second start == first */
    EXPECT_BYTES_ERROR(path, b, n, "document offsets not increasing at document 1");
    put_u64(b + 66, 5);
    EXPECT_BYTES_ERROR(path, b, n, "document 1 starts at 5, not below the token count 5");
    free(b);
}

/* ---- index.json ---- */

TEST(data_index_roundtrip_and_errors) {
    const char *dir = test_tmpdir();
    uint64_t sizes[2] = {30, 20};
    make_split(dir, "train", sizes, 2, 1000);
    kiln_data_index *ix = NULL;
    CHECK_OK(kiln_data_index_read(dir, &ix));
    if (ix) {
        CHECK(ix->version == 1 && ix->vocab_size == 1000 && ix->eos_id == -1 && ix->token_bytes == 2);
        CHECK(ix->tokenizer_checksum == 0x1234 && !strcmp(ix->tokenizer_path, "tok.json"));
        const kiln_data_split_info *sp = kiln_data_index_split(ix, "train");
        CHECK(sp && sp->nshards == 2 && sp->tokens == 50 && sp->documents == 5 + 3);
        CHECK(sp && !strcmp(sp->shards[1].file, "train_000001.bin") && sp->shards[1].tokens == 20);
        CHECK(kiln_data_index_split(ix, "val") == NULL);
        kiln_data_index_free(ix);
    }
    const char *ip = test_join(dir, "index.json");
    char *orig = NULL;
    size_t olen = 0;
    CHECK_OK(kiln_read_file(ip, &orig, &olen));
    struct {
        const char *from, *to, *needle;
    } cases[] = {
        {"\"version\":\t1", "\"version\":\t2", "index version 2 is newer"},
        {"\"kiln-tokens\"", "\"other\"", "format is \"other\""},
        {"\"tokens\":\t50", "\"tokens\":\t51", "splits.train: tokens is 51 but its shards hold 50"},
        {"\"train_000001.bin\"", "\"../x.bin\"", "splits.train.shards[1]: file \"../x.bin\" must be a plain"},
        {"\"fnv1a64\":\t\"0000000000001234\"", "\"fnv1a64\":\t\"12\"", "tokenizer: field 'fnv1a64' must be 16 hex"},
        {"\"token_bytes\":\t2", "\"token_bytes\":\t4", "token_bytes 4 does not match vocab_size 1000"},
    };
    for (size_t i = 0; orig && i < sizeof cases / sizeof cases[0]; i++) {
        char *at = strstr(orig, cases[i].from);
        CHECK_MSG(at, "index.json lacks %s:\n%s", cases[i].from, orig);
        if (!at) continue;
        char buf[8192];
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - orig), orig, cases[i].to, at + strlen(cases[i].from));
        spit(ip, buf, strlen(buf));
        CHECK_ERR(kiln_data_index_read(dir, &ix), cases[i].needle);
    }
    free(orig);
    CHECK_ERR(kiln_data_index_read(test_tmpdir(), &ix), "index.json");
}

/* ---- the loader ---- */

static kiln_loader *open_loader(const char *dir, const char *split, int64_t T, uint64_t seed, int rank, int world) {
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(dir, split, T, seed, rank, world, &l));
    return l;
}

/* The data directory most loader tests use: 4 train shards of 37, 0, 50 and 13 tokens (100 in
 * all, an empty shard in the middle), token at stream position p = p (vocab 70000, u32). */
static const char *std_dir(uint64_t vocab) {
    const char *dir = test_tmpdir();
    uint64_t sizes[4] = {37, 0, 50, 13};
    make_split(dir, "train", sizes, 4, vocab);
    return dir;
}

TEST(data_loader_windows_cross_shard_boundaries) {
    uint64_t vocabs[2] = {70000, 1000}; /* u32 and u16 shards */
    for (int v = 0; v < 2; v++) {
        const char *dir = std_dir(vocabs[v]);
        const int64_t T = 16; /* 6 windows; window 2 = 32..47 crosses 37, window 5 = 80..95 crosses 87 */
        kiln_loader *l = open_loader(dir, "train", T, 5, 0, 1);
        if (!l) return;
        CHECK(kiln_loader_vocab_size(l) == (int64_t)vocabs[v]);
        CHECK(kiln_loader_tokens(l) == 100);
        CHECK(kiln_loader_windows(l) == 6);
        int seen[6] = {0};
        int64_t ids[3 * 16];
        for (int step = 0; step < 4; step++) { /* 12 windows: two epochs */
            CHECK_OK(kiln_loader_next(l, 3, ids));
            for (int b = 0; b < 3; b++) {
                int64_t w = ids[b * T] / T;
                CHECK_MSG(ids[b * T] % T == 0 && w >= 0 && w < 6, "window starts at %lld", (long long)ids[b * T]);
                if (w >= 0 && w < 6) seen[w]++;
                for (int64_t t = 0; t < T; t++)
                    CHECK_MSG(ids[b * T + t] == w * T + t, "window %lld token %lld = %lld", (long long)w, (long long)t,
                              (long long)ids[b * T + t]);
            }
        }
        for (int w = 0; w < 6; w++) CHECK_MSG(seen[w] == 2, "window %d seen %d times in two epochs", w, seen[w]);
        kiln_loader_state s = kiln_loader_get_state(l);
        CHECK(s.epoch == 2 && s.cursor == 0 && s.seed == 5);
        kiln_loader_close(l);
    }
}

/* The first n window indices this loader serves. */
static void take(kiln_loader *l, int64_t T, int n, int64_t *win) {
    int64_t *ids = malloc((size_t)T * sizeof *ids);
    for (int i = 0; i < n; i++) {
        CHECK_OK(kiln_loader_next(l, 1, ids));
        win[i] = ids[0] / T;
    }
    free(ids);
}

TEST(data_loader_deterministic_per_seed) {
    const char *dir = test_tmpdir();
    uint64_t sizes[3] = {400, 333, 267};
    make_split(dir, "train", sizes, 3, 70000);
    const int64_t T = 10; /* 100 windows */
    int64_t a[300], b[300], c[300];
    kiln_loader *la = open_loader(dir, "train", T, 42, 0, 1), *lb = open_loader(dir, "train", T, 42, 0, 1),
                *lc = open_loader(dir, "train", T, 43, 0, 1);
    if (!la || !lb || !lc) return;
    take(la, T, 300, a);
    take(lb, T, 300, b);
    take(lc, T, 300, c);
    CHECK(!memcmp(a, b, sizeof a));
    int same_c = 0, same_epoch = 0, identity = 0;
    for (int i = 0; i < 100; i++) {
        same_c += a[i] == c[i];
        same_epoch += a[i] == a[100 + i];
        identity += a[i] == i;
    }
    CHECK_MSG(same_c < 20, "seeds 42 and 43 agree on %d of 100 positions", same_c);
    CHECK_MSG(same_epoch < 20, "epochs 0 and 1 agree on %d of 100 positions", same_epoch);
    CHECK_MSG(identity < 20, "the permutation leaves %d of 100 windows in place", identity);
    /* each epoch is a permutation */
    for (int ep = 0; ep < 3; ep++) {
        int seen[100] = {0};
        for (int i = 0; i < 100; i++) seen[a[ep * 100 + i]]++;
        for (int w = 0; w < 100; w++) CHECK(seen[w] == 1);
    }
    kiln_loader_close(la);
    kiln_loader_close(lb);
    kiln_loader_close(lc);
}

static void check_disjoint(int world) {
    const char *dir = test_tmpdir();
    uint64_t sizes[2] = {600, 405}; /* 1005 tokens, T = 10: 100 windows */
    make_split(dir, "train", sizes, 2, 70000);
    const int64_t T = 10;
    const int per = 100 / world;
    kiln_loader *l[3] = {0};
    int64_t win[3][200];
    for (int r = 0; r < world; r++) {
        l[r] = open_loader(dir, "train", T, 7, r, world);
        if (!l[r]) return;
        CHECK((int)kiln_loader_windows(l[r]) == per);
        take(l[r], T, 2 * per, win[r]);
    }
    for (int ep = 0; ep < 2; ep++) {
        int seen[100] = {0}, total = 0;
        for (int r = 0; r < world; r++)
            for (int i = 0; i < per; i++) seen[win[r][ep * per + i]]++, total++;
        int dup = 0, taken = 0;
        for (int w = 0; w < 100; w++) dup += seen[w] > 1, taken += seen[w] == 1;
        CHECK_MSG(dup == 0, "world %d epoch %d: %d windows taken twice", world, ep, dup);
        CHECK_MSG(taken == per * world, "world %d epoch %d: %d windows taken, expected %d", world, ep, taken,
                  per * world);
    }
    /* rank r's stream is entries r, r+world, ... of the single-rank permutation */
    kiln_loader *one = open_loader(dir, "train", T, 7, 0, 1);
    int64_t all[100];
    if (one) take(one, T, 100, all);
    for (int r = 0; one && r < world; r++)
        for (int i = 0; i < per; i++) CHECK(win[r][i] == all[r + i * world]);
    kiln_loader_close(one);
    for (int r = 0; r < world; r++) {
        kiln_loader_state s = kiln_loader_get_state(l[r]);
        CHECK(s.epoch == 2 && s.cursor == 0);
        kiln_loader_close(l[r]);
    }
}

TEST(data_loader_ranks_disjoint_world2) { check_disjoint(2); }
TEST(data_loader_ranks_disjoint_world3) { check_disjoint(3); }

TEST(data_loader_state_restore) {
    const char *dir = std_dir(70000);
    const int64_t T = 8; /* 12 windows; world 2: 6 per rank per epoch */
    for (int at = 0; at <= 14; at++) { /* mid-epoch, at the boundary (6, 12), in the next epoch */
        kiln_loader *a = open_loader(dir, "train", T, 99, 1, 2), *b = open_loader(dir, "train", T, 1, 1, 2);
        if (!a || !b) return;
        int64_t skip[16], x[20], y[20];
        take(a, T, at, skip);
        kiln_loader_state s = kiln_loader_get_state(a);
        CHECK(s.epoch == (uint64_t)at / 6 && s.cursor == (uint64_t)at % 6 && s.seed == 99);
        take(a, T, 20, x);
        CHECK_OK(kiln_loader_set_state(b, &s));
        take(b, T, 20, y);
        CHECK_MSG(!memcmp(x, y, sizeof x), "restored at window %d: streams differ", at);
        /* a round trip through a saved state on the same loader */
        CHECK_OK(kiln_loader_set_state(a, &s));
        take(a, T, 20, y);
        CHECK(!memcmp(x, y, sizeof x));
        kiln_loader_close(a);
        kiln_loader_close(b);
    }
}

TEST(data_loader_set_state_validates) {
    const char *dir = std_dir(70000);
    kiln_loader *a = open_loader(dir, "train", 8, 1, 0, 2), *b = open_loader(dir, "train", 9, 1, 0, 2),
                *c = open_loader(dir, "train", 8, 1, 0, 1), *d = open_loader(dir, "train", 8, 1, 1, 2);
    if (!a || !b || !c || !d) return;
    kiln_loader_state s = kiln_loader_get_state(a);
    CHECK(s.fingerprint != 0);
    s.cursor = 6;
    CHECK_ERR(kiln_loader_set_state(a, &s), "cursor 6 is past the 6 windows");
    s.cursor = 5;
    CHECK_OK(kiln_loader_set_state(a, &s));
    CHECK_OK(kiln_loader_set_state(d, &s)); /* another rank, same layout */
    CHECK_ERR(kiln_loader_set_state(b, &s), "saved for another data layout");
    CHECK_ERR(kiln_loader_set_state(c, &s), "saved for another data layout");
    s.fingerprint = 0; /* unknown: accepted (b, T = 9, takes 5 windows per epoch) */
    s.cursor = 4;
    CHECK_OK(kiln_loader_set_state(b, &s));
    kiln_loader_state sb = kiln_loader_get_state(b);
    CHECK(sb.cursor == 4 && sb.seed == 1 && sb.fingerprint != 0 && sb.fingerprint != s.fingerprint);
    int64_t ids[8];
    CHECK_ERR(kiln_loader_next(a, 0, ids), "batch size must be >= 1");
    kiln_loader_close(a);
    kiln_loader_close(b);
    kiln_loader_close(c);
    kiln_loader_close(d);
}

TEST(data_loader_too_little_data) {
    const char *dir = std_dir(70000);
    kiln_loader *l = NULL;
    CHECK_ERR(kiln_loader_open(dir, "train", 60, 1, 0, 2, &l),
              "split 'train' has too little data: 100 tokens make 1 windows of T=60, fewer than world=2 ranks "
              "(need at least 120 tokens)");
    CHECK_ERR(kiln_loader_open(dir, "train", 101, 1, 0, 1, &l), "100 tokens make 0 windows of T=101");
    CHECK(l == NULL);
    l = open_loader(dir, "train", 100, 1, 0, 1); /* exactly one window */
    int64_t ids[200];
    if (l) {
        CHECK_OK(kiln_loader_next(l, 2, ids));
        for (int i = 0; i < 200; i++) CHECK(ids[i] == i % 100);
    }
    kiln_loader_close(l);
}

TEST(data_loader_bad_arguments_and_splits) {
    const char *dir = std_dir(70000);
    kiln_loader *l = NULL;
    CHECK_ERR(kiln_loader_open(dir, "val", 8, 1, 0, 1, &l), "no split 'val' (it has: train)");
    CHECK_ERR(kiln_loader_open(dir, "train", 0, 1, 0, 1, &l), "T must be >= 1");
    CHECK_ERR(kiln_loader_open(dir, "train", 8, 1, 2, 2, &l), "rank 2 is not in 0..world-1");
    CHECK_ERR(kiln_loader_open(dir, "train", 8, 1, 0, 0, &l), "rank 0 is not in 0..world-1 (world 0)");
    CHECK(l == NULL);
}

TEST(data_loader_validates_shards) {
    /* a shard with another vocabulary than index.json */
    const char *dir = std_dir(70000);
    const char *p2 = test_join(dir, "train_000002.bin");
    write_seq_shard(p2, 37, 50, 80000, 7);
    kiln_loader *l = NULL;
    CHECK_ERR(kiln_loader_open(dir, "train", 8, 1, 0, 1, &l),
              "train_000002.bin: vocab size 80000 differs from index.json's vocab_size 70000");
    /* same vocabulary, other tokens: the index's checksum catches it */
    write_seq_shard(p2, 38, 50, 70000, 7);
    CHECK_ERR(kiln_loader_open(dir, "train", 8, 1, 0, 1, &l), "differs from index.json's");
    /* other counts */
    write_seq_shard(p2, 37, 49, 70000, 7);
    CHECK_ERR(kiln_loader_open(dir, "train", 8, 1, 0, 1, &l),
              "train_000002.bin: holds 49 tokens and 7 documents, index.json says 50 and 8");
    /* a corrupt shard */
    write_seq_shard(p2, 37, 50, 70000, 7);
    size_t n = 0;
    unsigned char *b = slurp(p2, &n);
    if (b) {
        b[60] ^= 4;
        spit(p2, b, n);
        CHECK_ERR(kiln_loader_open(dir, "train", 8, 1, 0, 1, &l), "train_000002.bin: checksum mismatch");
        free(b);
    }
    /* a missing shard */
    remove(p2);
    CHECK_ERR(kiln_loader_open(dir, "train", 8, 1, 0, 1, &l), "train_000002.bin: cannot open");
    CHECK(l == NULL);
}

TEST(data_loader_many_shards_threads) {
    /* more shards than open threads; windows spanning several small shards */
    const char *dir = test_tmpdir();
    uint64_t sizes[16];
    for (int i = 0; i < 16; i++) sizes[i] = 3 + (uint64_t)i % 5;
    make_split(dir, "train", sizes, 16, 1 << 16);
    uint64_t total = 0;
    for (int i = 0; i < 16; i++) total += sizes[i];
    const int64_t T = 13;
    kiln_loader *l = open_loader(dir, "train", T, 3, 0, 1);
    if (!l) return;
    uint64_t W = total / (uint64_t)T;
    CHECK(kiln_loader_windows(l) == W);
    int64_t ids[13];
    for (uint64_t i = 0; i < W; i++) {
        CHECK_OK(kiln_loader_next(l, 1, ids));
        for (int t = 0; t < T; t++) CHECK(ids[t] == ids[0] + t);
        CHECK(ids[0] % T == 0);
    }
    kiln_loader_close(l);
}
