/* safetensors reader/writer: round trips, every kind of malformed file (each
 * error must name the file and the tensor/field/numbers involved), sharded
 * directories, atomic writes, and a byte-flipping fuzz loop. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/fsutil.h"
#include "kiln/safetensors.h"
#include "test.h"

/* ---- helpers ---- */


static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) test_fail(__FILE__, __LINE__, "cannot write %s", path);
}

/* A file written by hand: 8-byte little-endian length, header, then
 * data_len bytes of data (0, 1, 2, ...). Used to build malformed files. */
static void write_raw(const char *path, const char *header, size_t data_len) {
    size_t hl = strlen(header), n = 8 + hl + data_len;
    unsigned char *b = malloc(n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (unsigned char)i;
    write_bytes(path, b, n);
    free(b);
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Number of entries in dir other than . and .. */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Open must fail; the message must start with the file's path and contain needle. */
static void expect_open_error_at(const char *path, const char *needle, const char *file, int line) {
    kiln_st *st = NULL;
    kiln_error *e = kiln_st_open(path, &st);
    if (!e) {
        test_fail(file, line, "opening %s succeeded, expected error containing '%s'", path, needle);
        kiln_st_close(st);
        return;
    }
    const char *msg = kiln_error_msg(e);
    if (strncmp(msg, path, strlen(path)) != 0) test_fail(file, line, "error '%s' does not start with the path", msg);
    if (!strstr(msg, needle)) test_fail(file, line, "error '%s' lacks '%s'", msg, needle);
    if (st) test_fail(file, line, "*out not NULL after an error");
    kiln_error_free(e);
}

/* Write header + data_len bytes to a fresh file and expect open to fail. */
static void expect_bad_header_at(const char *header, size_t data_len, const char *needle, const char *file,
                                 int line) {
    const char *path = test_join(test_tmpdir(), "x.safetensors");
    write_raw(path, header, data_len);
    expect_open_error_at(path, needle, file, line);
}
#define EXPECT_BAD(header, data_len, needle) expect_bad_header_at(header, data_len, needle, __FILE__, __LINE__)

/* A small valid file with two F32 tensors, for the truncation and fuzz tests. */
static void write_small_valid(const char *path) {
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    int64_t sa[2] = {2, 2}, sb[1] = {2};
    kiln_st_entry e[2] = {{"a", KILN_DT_F32, 2, sa, a}, {"bb", KILN_DT_F32, 1, sb, b}};
    const char *meta[] = {"format", "pt", NULL};
    CHECK_OK(kiln_st_write(path, e, 2, meta));
}

/* ---- round trips ---- */

TEST(st_roundtrip_many_dtypes_with_metadata) {
    const char *path = test_join(test_tmpdir(), "rt.safetensors");
    float f32[6] = {1.5f, -2, 0, 3.25f, 1e-3f, -7};
    uint16_t f16[4] = {0x3c00, 0xc000, 0x3800, 0x7bff};   /* 1, -2, 0.5, 65504 */
    uint16_t bf16[4] = {0x3f80, 0xc040, 0x0000, 0x4049}; /* 1, -3, 0, 3.140625 */
    double f64[3] = {0.1, -1e300, 2.5};
    int64_t i64[2] = {-5, 1LL << 40};
    int32_t i32[1] = {-123456};
    uint8_t u8[5] = {0, 1, 127, 200, 255}; /* odd size: everything after is unaligned */
    uint8_t boolv[3] = {1, 0, 1};
    int16_t i16[3] = {-32768, 0, 32767};
    uint16_t u16[2] = {0, 65535};
    int8_t i8[2] = {-128, 127};
    uint32_t u32[2] = {0, 4000000000u};
    uint64_t u64[2] = {0, 1ULL << 62};
    uint8_t f8[2] = {0x38, 0xb8}; /* F8_E4M3: 1.0, -1.0 */
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s22[2] = {2, 2}, s3[1] = {3}, s2[1] = {2}, s5[1] = {5}, s03[2] = {0, 3};
    kiln_st_entry e[] = {
        {"w.f32", KILN_DT_F32, 2, s23, f32},    {"h.f16", KILN_DT_F16, 1, s4, f16},
        {"b.bf16", KILN_DT_BF16, 2, s22, bf16}, {"u8", KILN_DT_U8, 1, s5, u8},
        {"d.f64", KILN_DT_F64, 1, s3, f64},     {"i64", KILN_DT_I64, 1, s2, i64},
        {"scalar", KILN_DT_I32, 0, NULL, i32},  {"empty", KILN_DT_F32, 2, s03, NULL},
        {"mask", KILN_DT_BOOL, 1, s3, boolv},   {"i16", KILN_DT_I16, 1, s3, i16},
        {"u16", KILN_DT_U16, 1, s2, u16},       {"i8", KILN_DT_I8, 1, s2, i8},
        {"u32", KILN_DT_U32, 1, s2, u32},       {"u64", KILN_DT_U64, 1, s2, u64},
        {"f8", KILN_DT_F8_E4M3, 1, s2, f8},
    };
    size_t n = sizeof e / sizeof e[0];
    const char *meta[] = {"format", "pt", "note", "h\xc3\xa9llo \"quoted\"", NULL};
    CHECK_OK(kiln_st_write(path, e, n, meta));

    /* Data starts at a multiple of 8. */
    char *raw;
    size_t rawlen;
    CHECK_OK(kiln_read_file(path, &raw, &rawlen));
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)raw[i] << (8 * i);
    CHECK((8 + hlen) % 8 == 0);
    CHECK(raw[8] == '{');
    free(raw);

    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(path, &st));
    if (!st) return;
    CHECK(kiln_st_count(st) == n);
    for (size_t i = 0; i < n; i++) {
        const kiln_st_tensor *t = kiln_st_at(st, i);
        CHECK_MSG(t && strcmp(t->name, e[i].name) == 0, "tensor %zu is '%s', want '%s'", i, t ? t->name : "?",
                  e[i].name);
        if (!t) continue;
        CHECK(kiln_st_find(st, e[i].name) == t);
        CHECK(t->dtype == e[i].dtype);
        CHECK(t->ndim == e[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] == e[i].shape[d]);
            numel *= e[i].shape[d];
        }
        CHECK(t->numel == numel);
        CHECK(t->nbytes == (size_t)numel * kiln_dtype_size(e[i].dtype));
        CHECK(t->nbytes == 0 || memcmp(t->data, e[i].data, t->nbytes) == 0);
        CHECK(strcmp(t->file, path) == 0);
    }
    CHECK(kiln_st_at(st, n) == NULL);
    CHECK(kiln_st_find(st, "nope") == NULL);
    CHECK(kiln_st_find(st, "") == NULL);
    CHECK(kiln_st_metadata(st, "format") && strcmp(kiln_st_metadata(st, "format"), "pt") == 0);
    CHECK(kiln_st_metadata(st, "note") && strcmp(kiln_st_metadata(st, "note"), meta[3]) == 0);
    CHECK(kiln_st_metadata(st, "missing") == NULL);

    /* Conversions to f32 and int64. */
    float out[6];
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "h.f16"), out, 4));
    CHECK(out[0] == 1 && out[1] == -2 && out[2] == 0.5f && out[3] == 65504);
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "b.bf16"), out, 4));
    CHECK(out[0] == 1 && out[1] == -3 && out[2] == 0 && out[3] == 3.140625f);
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "d.f64"), out, 3));
    CHECK(out[0] == 0.1f && isinf(out[1]) && out[1] < 0 && out[2] == 2.5f);
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "w.f32"), out, 6));
    CHECK(memcmp(out, f32, sizeof f32) == 0);
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "i16"), out, 3));
    CHECK(out[0] == -32768 && out[2] == 32767);
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "u32"), out, 2));
    CHECK(out[1] == 4000000000.0f);
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "mask"), out, 3));
    CHECK(out[0] == 1 && out[1] == 0 && out[2] == 1);
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "f8"), out, 2));
    CHECK(out[0] == 1 && out[1] == -1);
    CHECK_OK(kiln_st_read_f32(kiln_st_find(st, "empty"), out, 0));
    int64_t iv[5];
    CHECK_OK(kiln_st_read_i64(kiln_st_find(st, "scalar"), iv, 1));
    CHECK(iv[0] == -123456);
    CHECK_OK(kiln_st_read_i64(kiln_st_find(st, "u8"), iv, 5));
    CHECK(iv[0] == 0 && iv[3] == 200 && iv[4] == 255);
    CHECK_OK(kiln_st_read_i64(kiln_st_find(st, "i64"), iv, 2));
    CHECK(iv[0] == -5 && iv[1] == (1LL << 40));
    CHECK_OK(kiln_st_read_i64(kiln_st_find(st, "i8"), iv, 2));
    CHECK(iv[0] == -128 && iv[1] == 127);
    CHECK_OK(kiln_st_read_i64(kiln_st_find(st, "u64"), iv, 2));
    CHECK(iv[1] == (int64_t)(1ULL << 62));
    CHECK_OK(kiln_st_read_i64(kiln_st_find(st, "u16"), iv, 2));
    CHECK(iv[1] == 65535);
    CHECK_ERR(kiln_st_read_i64(kiln_st_find(st, "w.f32"), iv, 6), "tensor 'w.f32': dtype F32 is not an integer type");
    CHECK_ERR(kiln_st_read_i64(kiln_st_find(st, "b.bf16"), iv, 4), "'b.bf16'");
    CHECK_ERR(kiln_st_read_f32(kiln_st_find(st, "w.f32"), out, 5),
              "tensor 'w.f32': has 6 elements but the caller expects 5");
    CHECK_ERR(kiln_st_read_i64(kiln_st_find(st, "u8"), iv, 4), "'u8'");
    kiln_st_close(st);
}

TEST(st_u64_beyond_int64_is_an_error) {
    const char *path = test_join(test_tmpdir(), "u.safetensors");
    uint64_t v[2] = {1, UINT64_MAX};
    int64_t s[1] = {2};
    kiln_st_entry e = {"big", KILN_DT_U64, 1, s, v};
    CHECK_OK(kiln_st_write(path, &e, 1, NULL));
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(path, &st));
    if (!st) return;
    int64_t out[2];
    CHECK_ERR(kiln_st_read_i64(kiln_st_at(st, 0), out, 2), "tensor 'big': element 1 is 18446744073709551615");
    CHECK(kiln_st_metadata(st, "format") == NULL);
    kiln_st_close(st);
}

TEST(st_find_with_many_tensors) {
    const char *path = test_join(test_tmpdir(), "many.safetensors");
    enum { N = 300 };
    static char names[N][16];
    static uint8_t vals[N];
    kiln_st_entry e[N];
    int64_t one = 1;
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "t%03d", N - 1 - i); /* written in reverse name order */
        vals[i] = (uint8_t)i;
        e[i] = (kiln_st_entry){names[i], KILN_DT_U8, 1, &one, &vals[i]};
    }
    CHECK_OK(kiln_st_write(path, e, N, NULL));
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(path, &st));
    if (!st) return;
    CHECK(kiln_st_count(st) == N);
    for (int i = 0; i < N; i++) {
        const kiln_st_tensor *t = kiln_st_find(st, names[i]);
        CHECK_MSG(t && *(const uint8_t *)t->data == (uint8_t)i, "find(%s)", names[i]);
        CHECK(kiln_st_at(st, (size_t)i) == t); /* file order is the written order */
    }
    CHECK(kiln_st_find(st, "t300") == NULL && kiln_st_find(st, "t") == NULL && kiln_st_find(st, "t0000") == NULL);
    kiln_st_close(st);
}

TEST(st_no_tensors) {
    const char *path = test_join(test_tmpdir(), "none.safetensors");
    CHECK_OK(kiln_st_write(path, NULL, 0, NULL));
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(path, &st));
    if (!st) return;
    CHECK(kiln_st_count(st) == 0);
    CHECK(kiln_st_find(st, "a") == NULL);
    CHECK(kiln_st_at(st, 0) == NULL);
    kiln_st_close(st);
    kiln_st_close(NULL);
}

TEST(st_reads_hand_written_file_with_padding_and_zero_size_tensors) {
    /* As other writers produce: whitespace in the JSON, trailing spaces,
     * zero-size tensors sharing an offset, tensors listed out of offset order. */
    const char *path = test_join(test_tmpdir(), "h.safetensors");
    write_raw(path,
              "{ \"b\" : {\"dtype\":\"U8\", \"shape\":[2], \"data_offsets\":[4,6]},\n"
              "  \"z\" : {\"dtype\":\"F32\", \"shape\":[0], \"data_offsets\":[4,4]},\n"
              "  \"a\" : {\"data_offsets\":[0,4], \"shape\":[1], \"dtype\":\"F32\"} }   ",
              6);
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(path, &st));
    if (!st) return;
    CHECK(kiln_st_count(st) == 3);
    CHECK(strcmp(kiln_st_at(st, 0)->name, "a") == 0); /* offset order */
    CHECK(strcmp(kiln_st_at(st, 1)->name, "z") == 0);
    CHECK(strcmp(kiln_st_at(st, 2)->name, "b") == 0);
    CHECK(((const uint8_t *)kiln_st_find(st, "b")->data)[1] == 5);
    kiln_st_close(st);
}

static void check_file_bytes_at(const char *path, const unsigned char *want, size_t n, const char *file, int line) {
    char *got = NULL;
    size_t ng = 0;
    kiln_error *e = kiln_read_file(path, &got, &ng);
    if (e) {
        test_fail(file, line, "%s", kiln_error_msg(e));
        kiln_error_free(e);
        return;
    }
    if (ng != n || memcmp(got, want, n) != 0)
        test_fail(file, line, "%s: %zu bytes differ from the expected %zu", path, ng, n);
    free(got);
}

/* Expected file: 8-byte length, JSON padded with spaces to `hlen`, data. */
static size_t expected_file(unsigned char *out, const char *json, size_t hlen, const void *data, size_t dlen) {
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memset(out + 8, ' ', hlen);
    memcpy(out + 8, json, strlen(json));
    if (dlen) memcpy(out + 8 + hlen, data, dlen);
    return 8 + hlen + dlen;
}

TEST(st_writer_output_is_byte_exact) {
    /* The layout the reference writer produces: compact JSON with the keys
     * dtype, shape, data_offsets; __metadata__ first; spaces up to a multiple
     * of 8. Files we write are then identical to theirs (for the same order). */
    const char *dir = test_tmpdir();
    unsigned char want[256];
    float v[6] = {0, 1, 2, 3, 4, 5};
    int64_t s123[3] = {1, 2, 3}, s1123[4] = {1, 1, 2, 3};

    kiln_st_entry e1 = {"attn.0", KILN_DT_F32, 3, s123, v};
    CHECK_OK(kiln_st_write(test_join(dir, "a.safetensors"), &e1, 1, NULL));
    size_t n =
        expected_file(want, "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}", 64, v, 24);
    check_file_bytes_at(test_join(dir, "a.safetensors"), want, n, __FILE__, __LINE__);

    kiln_st_entry e2 = {"attn0", KILN_DT_F32, 4, s1123, v};
    CHECK_OK(kiln_st_write(test_join(dir, "b.safetensors"), &e2, 1, NULL));
    n = expected_file(want, "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}", 72, v, 24);
    check_file_bytes_at(test_join(dir, "b.safetensors"), want, n, __FILE__, __LINE__);

    CHECK_OK(kiln_st_write(test_join(dir, "c.safetensors"), NULL, 0, NULL));
    n = expected_file(want, "{}", 8, NULL, 0);
    check_file_bytes_at(test_join(dir, "c.safetensors"), want, n, __FILE__, __LINE__);

    const char *meta[] = {"framework", "pt", NULL};
    CHECK_OK(kiln_st_write(test_join(dir, "d.safetensors"), NULL, 0, meta));
    n = expected_file(want, "{\"__metadata__\":{\"framework\":\"pt\"}}", 40, NULL, 0);
    check_file_bytes_at(test_join(dir, "d.safetensors"), want, n, __FILE__, __LINE__);
}

/* ---- malformed files ---- */

TEST(st_truncated_at_every_length) {
    const char *dir = test_tmpdir();
    const char *good = test_join(dir, "good.safetensors");
    write_small_valid(good);
    char *full;
    size_t n;
    CHECK_OK(kiln_read_file(good, &full, &n));
    const char *path = test_join(dir, "cut.safetensors");
    for (size_t len = 0; len < n; len++) {
        write_bytes(path, full, len);
        kiln_st *st = NULL;
        kiln_error *e = kiln_st_open(path, &st);
        CHECK_MSG(e != NULL, "truncated to %zu of %zu bytes, open succeeded", len, n);
        if (e) {
            CHECK_MSG(strncmp(kiln_error_msg(e), path, strlen(path)) == 0, "message '%s'", kiln_error_msg(e));
            kiln_error_free(e);
        }
        kiln_st_close(st);
    }
    write_bytes(path, full, 0);
    expect_open_error_at(path, "file is empty (0 bytes)", __FILE__, __LINE__);
    write_bytes(path, full, 5);
    expect_open_error_at(path, "file is only 5 bytes, too short for the 8-byte header length", __FILE__, __LINE__);
    write_bytes(path, full, 20);
    expect_open_error_at(path, "runs past the end of the file (20 bytes", __FILE__, __LINE__);
    write_bytes(path, full, n - 1);
    expect_open_error_at(path, "extend past the end of the data buffer", __FILE__, __LINE__);
    write_bytes(path, full, n);
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(path, &st));
    kiln_st_close(st);
    free(full);
}

TEST(st_header_length_past_end_of_file) {
    const char *path = test_join(test_tmpdir(), "x.safetensors");
    unsigned char b[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(path, b, 10);
    expect_open_error_at(path, "header length 200 runs past the end of the file (10 bytes, so at most 2)", __FILE__,
                         __LINE__);
}

TEST(st_header_length_over_100mb) {
    const char *path = test_join(test_tmpdir(), "x.safetensors");
    uint64_t len = 100000001; /* one byte over KILN_ST_MAX_HEADER */
    unsigned char b[16] = {0};
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(len >> (8 * i));
    b[8] = '{';
    b[9] = '}';
    write_bytes(path, b, 16);
    expect_open_error_at(path, "header length 100000001 exceeds the limit of 100000000 bytes", __FILE__, __LINE__);
    memset(b, 0xff, 8); /* 2^64-1: must not overflow any size computation */
    write_bytes(path, b, 16);
    expect_open_error_at(path, "header length 18446744073709551615 exceeds", __FILE__, __LINE__);
}

TEST(st_header_not_json) {
    EXPECT_BAD("{\"a\": {\"dtype\": ", 0, "header: invalid JSON");
    EXPECT_BAD("not json at all", 0, "header: invalid JSON at line 1, column 1");
    EXPECT_BAD("", 0, "header: invalid JSON");
    EXPECT_BAD("{} {}", 0, "unexpected data after the value");
}

TEST(st_header_json_not_object) {
    EXPECT_BAD("[1,2]", 0, "header must be a JSON object, got array");
    EXPECT_BAD("\"F32\"", 0, "header must be a JSON object, got \"F32\"");
    EXPECT_BAD("3", 0, "header must be a JSON object, got 3");
    EXPECT_BAD("null", 0, "header must be a JSON object, got null");
}

TEST(st_unknown_dtype) {
    EXPECT_BAD("{\"w\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w': unknown dtype 'F31'");
    EXPECT_BAD("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w': dtype must be a string, got 32");
}

TEST(st_shape_and_offsets_disagree) {
    const char *path = test_join(test_tmpdir(), "x.safetensors");
    write_raw(path, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12);
    char want[1200];
    snprintf(want, sizeof want, "%s: tensor 'w': data_offsets [0,12] hold 12 bytes but F32 shape [2,2] needs 16", path);
    expect_open_error_at(path, want, __FILE__, __LINE__);
}

TEST(st_offsets_past_end_of_data) {
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
               "tensor 'w': data_offsets [0,16] extend past the end of the data buffer (8 bytes)");
    EXPECT_BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[5,1]}}", 8,
               "tensor 'w': data_offsets [5,1] end before they begin");
}

TEST(st_overlapping_tensors) {
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, "tensor 'b' data_offsets [4,12] overlap tensor 'a' [0,8]");
    /* the very same range twice */
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               8, "tensor 'b' data_offsets [0,8] overlap tensor 'a' [0,8]");
}

TEST(st_hole_between_tensors) {
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               12, "bytes [4,8) belong to no tensor (between tensor 'a' and tensor 'b')");
    EXPECT_BAD("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
               "bytes [0,4) belong to no tensor (before tensor 'b')");
    EXPECT_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 7,
               "data buffer is 7 bytes but the tensors cover only [0,4): 3 trailing bytes belong to no tensor");
    EXPECT_BAD("{}", 3, "data buffer is 3 bytes but the tensors cover only [0,0)");
}

TEST(st_duplicate_tensor_name) {
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "duplicate tensor name 'w'");
}

TEST(st_negative_shape) {
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,0]}}", 0,
               "tensor 'w': shape[1] must be a non-negative integer, got -3");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,0]}}", 0,
               "tensor 'w': shape[0] must be a non-negative integer, got 1.5");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
               "tensor 'w': shape[0] must be a non-negative integer, got \"2\"");
}

TEST(st_metadata_with_non_string_value) {
    EXPECT_BAD("{\"__metadata__\":{\"format\":\"pt\",\"step\":100}}", 0,
               "__metadata__ key 'step' must have a string value, got 100");
    EXPECT_BAD("{\"__metadata__\":[\"a\"]}", 0, "__metadata__ must be an object of strings, got array");
    EXPECT_BAD("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "__metadata__ key 'k' appears twice");
    EXPECT_BAD("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ appears twice");
}

TEST(st_other_malformed_entries) {
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4,
               "tensor 'w': unknown field 'extra'");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w': missing field 'data_offsets'");
    EXPECT_BAD("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': missing field 'dtype'");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w': field 'dtype' appears twice");
    EXPECT_BAD("{\"w\":[1,2]}", 0, "tensor 'w': entry must be a JSON object, got array");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":5,\"data_offsets\":[0,4]}}", 4,
               "tensor 'w': shape must be an array, got 5");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4,
               "tensor 'w': data_offsets must be [begin, end], got 3 numbers");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4,
               "tensor 'w': data_offsets must be an array [begin, end], got object");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4,
               "tensor 'w': data_offsets must be non-negative integers, got [0,-4]");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w': shape has 9 dimensions, at most 8 are supported");
    /* 2^48 * 2^48 elements: the product overflows 64 bits */
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[281474976710656,281474976710656],\"data_offsets\":[0,4]}}", 4,
               "tensor 'w': shape [281474976710656,281474976710656] has more elements than fit in 64 bits");
    /* 2^62 elements fit an int64, but not once multiplied by 4 bytes */
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[2097152,2097152,1048576],\"data_offsets\":[0,4]}}", 4,
               "has more bytes than fit in 64 bits");
    EXPECT_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 4,
               "data_offsets must be non-negative integers");
    EXPECT_BAD("{\"w\xff\":{}}", 0, "header is not valid UTF-8 at file byte 11 (byte 0xff)");
    EXPECT_BAD("{\"\xc0\xaf\":{}}", 0, "not valid UTF-8"); /* overlong '/' */
    EXPECT_BAD("{\"\xed\xa0\x80\":{}}", 0, "not valid UTF-8"); /* surrogate */
    EXPECT_BAD("{\"a\xe2\x82", 0, "not valid UTF-8 at file byte 11"); /* cut-off sequence */
    EXPECT_BAD("{\"a\x01\":{}}", 0, "header has control byte 0x01 at file byte 11");
}

TEST(st_open_errors_from_the_os) {
    const char *dir = test_tmpdir();
    expect_open_error_at(test_join(dir, "missing.safetensors"), "cannot open: No such file or directory", __FILE__,
                         __LINE__);
    expect_open_error_at(dir, "not a regular file", __FILE__, __LINE__);
}

/* ---- sharded directories ---- */

static void write_index(const char *dir, const char *weight_map_json) {
    char text[4096];
    snprintf(text, sizeof text, "{\"metadata\": {\"total_size\": 28}, \"weight_map\": %s}\n", weight_map_json);
    CHECK_OK(kiln_write_file_atomic(test_join(dir, "model.safetensors.index.json"), text, strlen(text)));
}

/* shard1 = {a[2], b[1]} (F32), shard2 = {c[4]} (U8) plus optionally "x". */
static const char *make_shards(int shard2_extra) {
    const char *dir = test_tmpdir();
    float a[2] = {1, 2}, b[1] = {3};
    uint8_t c[4] = {9, 8, 7, 6}, x[1] = {1};
    int64_t s2[1] = {2}, s1[1] = {1}, s4[1] = {4};
    kiln_st_entry e1[] = {{"a", KILN_DT_F32, 1, s2, a}, {"b", KILN_DT_F32, 1, s1, b}};
    kiln_st_entry e2[] = {{"c", KILN_DT_U8, 1, s4, c}, {"x", KILN_DT_U8, 1, s1, x}};
    const char *meta[] = {"format", "pt", NULL};
    CHECK_OK(kiln_st_write(test_join(dir, "model-00001-of-00002.safetensors"), e1, 2, meta));
    CHECK_OK(kiln_st_write(test_join(dir, "model-00002-of-00002.safetensors"), e2, shard2_extra ? 2 : 1, NULL));
    return dir;
}

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static void expect_dir_error_at(const char *dir, const char *needle, const char *file, int line) {
    kiln_st *st = NULL;
    kiln_error *e = kiln_st_open_dir(dir, &st);
    if (!e) {
        test_fail(file, line, "opening %s succeeded, expected error containing '%s'", dir, needle);
        kiln_st_close(st);
        return;
    }
    if (!strstr(kiln_error_msg(e), needle)) test_fail(file, line, "error '%s' lacks '%s'", kiln_error_msg(e), needle);
    if (strncmp(kiln_error_msg(e), dir, strlen(dir)) != 0)
        test_fail(file, line, "error '%s' does not start with the directory", kiln_error_msg(e));
    kiln_error_free(e);
}
#define EXPECT_DIR_ERR(dir, needle) expect_dir_error_at(dir, needle, __FILE__, __LINE__)

TEST(st_dir_single_file) {
    const char *dir = test_tmpdir();
    write_small_valid(test_join(dir, "model.safetensors"));
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open_dir(dir, &st));
    if (!st) return;
    CHECK(kiln_st_count(st) == 2 && kiln_st_find(st, "bb"));
    CHECK(kiln_st_metadata(st, "format") && strcmp(kiln_st_metadata(st, "format"), "pt") == 0);
    kiln_st_close(st);
}

TEST(st_dir_without_model_files) {
    const char *dir = test_tmpdir();
    char want[1024];
    snprintf(want, sizeof want, "%s: no model.safetensors or model.safetensors.index.json", dir);
    EXPECT_DIR_ERR(dir, want);
    EXPECT_DIR_ERR(test_join(dir, "nonexistent"), "cannot open model directory: No such file or directory");
    write_small_valid(test_join(dir, "model.safetensors"));
    EXPECT_DIR_ERR(test_join(dir, "model.safetensors"), "not a directory");
}

TEST(st_dir_sharded) {
    const char *dir = make_shards(0);
    write_index(dir, "{\"a\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\", \"b\": \"" SHARD1 "\"}");
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open_dir(dir, &st));
    if (!st) return;
    CHECK(kiln_st_count(st) == 3);
    /* file order: shards by name, tensors by offset */
    CHECK(strcmp(kiln_st_at(st, 0)->name, "a") == 0);
    CHECK(strcmp(kiln_st_at(st, 1)->name, "b") == 0);
    CHECK(strcmp(kiln_st_at(st, 2)->name, "c") == 0);
    const kiln_st_tensor *c = kiln_st_find(st, "c");
    CHECK(c && c->numel == 4 && ((const uint8_t *)c->data)[3] == 6);
    CHECK(c && strcmp(c->file, test_join(dir, SHARD2)) == 0);
    const kiln_st_tensor *b = kiln_st_find(st, "b");
    float v = 0;
    CHECK(b && strcmp(b->file, test_join(dir, SHARD1)) == 0);
    CHECK_OK(kiln_st_read_f32(b, &v, 1));
    CHECK(v == 3);
    CHECK(kiln_st_metadata(st, "format") && strcmp(kiln_st_metadata(st, "format"), "pt") == 0);
    kiln_st_close(st);
}

TEST(st_dir_missing_shard_file) {
    const char *dir = make_shards(0);
    write_index(dir, "{\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1 "\", \"c\": \"model-00003-of-00002.safetensors\"}");
    EXPECT_DIR_ERR(dir, "weight_map names shard 'model-00003-of-00002.safetensors', but");
}

TEST(st_dir_tensor_missing_from_shard) {
    const char *dir = make_shards(0);
    write_index(dir, "{\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\", \"d\": \"" SHARD2 "\"}");
    EXPECT_DIR_ERR(dir, "weight_map maps tensor 'd' to shard '" SHARD2 "', which does not contain it");
}

TEST(st_dir_tensor_not_in_weight_map) {
    const char *dir = make_shards(1);
    write_index(dir, "{\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\"}");
    EXPECT_DIR_ERR(dir, "tensor 'x' in shard '" SHARD2 "' is not listed in weight_map");
}

TEST(st_dir_tensor_mapped_to_wrong_shard) {
    const char *dir = make_shards(0);
    write_index(dir, "{\"a\": \"" SHARD1 "\", \"b\": \"" SHARD2 "\", \"c\": \"" SHARD2 "\"}");
    EXPECT_DIR_ERR(dir, "tensor 'b' is in shard '" SHARD1 "' but weight_map maps it to '" SHARD2 "'");
}

TEST(st_dir_shard_name_with_slash) {
    const char *dir = make_shards(0);
    write_index(dir, "{\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1 "\", \"c\": \"../" SHARD2 "\"}");
    EXPECT_DIR_ERR(dir, "weight_map['c']: shard '../" SHARD2 "' must be a plain file name");
    write_index(dir, "{\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1 "\", \"c\": \"..\"}");
    EXPECT_DIR_ERR(dir, "shard '..' must be a plain file name");
    write_index(dir, "{\"a\": \"/etc/passwd\"}");
    EXPECT_DIR_ERR(dir, "shard '/etc/passwd' must be a plain file name");
}

static void put_text(const char *path, const char *text) {
    CHECK_OK(kiln_write_file_atomic(path, text, strlen(text)));
}

TEST(st_dir_bad_index) {
    const char *dir = make_shards(0);
    const char *index = test_join(dir, "model.safetensors.index.json");
    put_text(index, "{\"weight_map\": {\"a\": 1}}");
    EXPECT_DIR_ERR(dir, "weight_map['a'] must be a shard file name, got 1");
    put_text(index, "{\"weight_map\": {}}");
    EXPECT_DIR_ERR(dir, "weight_map is empty");
    put_text(index, "{\"metadata\": {}}");
    EXPECT_DIR_ERR(dir, "missing required field 'weight_map'");
    put_text(index, "{\n\"weight_map\": {\"a\" \"x\"}}");
    EXPECT_DIR_ERR(dir, "model.safetensors.index.json: invalid JSON at line 2, column 20");
    put_text(index, "{\"weight_map\": {\"a\": \"x\"");
    EXPECT_DIR_ERR(dir, "model.safetensors.index.json: invalid JSON: unexpected end at line 1");
    put_text(index, "[]");
    EXPECT_DIR_ERR(dir, "must be a JSON object, got array");
    write_index(dir, "{\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\", \"a\": \"" SHARD1 "\"}");
    EXPECT_DIR_ERR(dir, "weight_map lists tensor 'a' twice");
}

/* ---- writer ---- */

TEST(st_write_rejects_bad_entries) {
    const char *dir = test_tmpdir();
    const char *path = test_join(dir, "w.safetensors");
    float v[4] = {0};
    int64_t s2[1] = {2}, neg[2] = {2, -1}, huge[3] = {1LL << 40, 1LL << 40, 1LL << 40};
    kiln_st_entry dup[2] = {{"a", KILN_DT_F32, 1, s2, v}, {"a", KILN_DT_F32, 1, s2, v}};
    CHECK_ERR(kiln_st_write(path, dup, 2, NULL), "duplicate tensor name 'a'");
    kiln_st_entry nul = {"n", KILN_DT_F32, 1, s2, NULL};
    CHECK_ERR(kiln_st_write(path, &nul, 1, NULL), "tensor 'n': data is NULL but F32 shape [2] needs 8 bytes");
    kiln_st_entry bad_shape = {"s", KILN_DT_F32, 2, neg, v};
    CHECK_ERR(kiln_st_write(path, &bad_shape, 1, NULL), "tensor 's': shape[1] is -1, must be non-negative");
    kiln_st_entry big = {"big", KILN_DT_F32, 3, huge, v};
    CHECK_ERR(kiln_st_write(path, &big, 1, NULL),
              "tensor 'big': shape [1099511627776,1099511627776,1099511627776] is too large");
    kiln_st_entry bad_dt = {"d", KILN_DT_INVALID, 1, s2, v};
    CHECK_ERR(kiln_st_write(path, &bad_dt, 1, NULL), "tensor 'd': invalid dtype 0");
    kiln_st_entry bad_nd = {"d", KILN_DT_F32, 9, huge, v};
    CHECK_ERR(kiln_st_write(path, &bad_nd, 1, NULL), "tensor 'd': ndim 9 is outside [0,8]");
    kiln_st_entry reserved = {"__metadata__", KILN_DT_F32, 1, s2, v};
    CHECK_ERR(kiln_st_write(path, &reserved, 1, NULL), "'__metadata__' is reserved");
    kiln_st_entry noname = {NULL, KILN_DT_F32, 1, s2, v};
    CHECK_ERR(kiln_st_write(path, &noname, 1, NULL), "tensor #0 has no name");
    kiln_st_entry badutf = {"a\xff", KILN_DT_F32, 1, s2, v};
    CHECK_ERR(kiln_st_write(path, &badutf, 1, NULL), "is not valid UTF-8");
    kiln_st_entry ok = {"a", KILN_DT_F32, 1, s2, v};
    const char *odd_meta[] = {"k", NULL};
    CHECK_ERR(kiln_st_write(path, &ok, 1, odd_meta), "metadata key 'k' has no value");
    const char *dup_meta[] = {"k", "1", "k", "2", NULL};
    CHECK_ERR(kiln_st_write(path, &ok, 1, dup_meta), "metadata key 'k' given twice");
    CHECK(count_entries(dir) == 0); /* nothing was created */

    /* NULL data is fine when there is nothing to write. */
    int64_t s0[1] = {0};
    kiln_st_entry empty = {"e", KILN_DT_F32, 1, s0, NULL};
    CHECK_OK(kiln_st_write(path, &empty, 1, NULL));
}

TEST(st_write_into_missing_directory) {
    const char *dir = test_tmpdir();
    const char *path = test_join(dir, "nope/x.safetensors");
    float v[1] = {1};
    int64_t s1[1] = {1};
    kiln_st_entry e = {"a", KILN_DT_F32, 1, s1, v};
    char want[1200];
    snprintf(want, sizeof want, "%s: cannot create temp file %s.tmp.", path, path);
    CHECK_ERR(kiln_st_write(path, &e, 1, NULL), want);
    CHECK_ERR(kiln_st_write(path, &e, 1, NULL), "No such file or directory");
    CHECK(!file_exists(test_join(dir, "nope")));
    CHECK(count_entries(dir) == 0);
}

TEST(st_overwrite_leaves_no_temp_files) {
    const char *dir = test_tmpdir();
    const char *path = test_join(dir, "x.safetensors");
    float v1[1] = {1}, v2[3] = {4, 5, 6};
    int64_t s1[1] = {1}, s3[1] = {3};
    kiln_st_entry e1 = {"a", KILN_DT_F32, 1, s1, v1}, e2 = {"b", KILN_DT_F32, 1, s3, v2};
    CHECK_OK(kiln_st_write(path, &e1, 1, NULL));
    CHECK_OK(kiln_st_write(path, &e2, 1, NULL));
    CHECK(count_entries(dir) == 1);
    kiln_st *st = NULL;
    CHECK_OK(kiln_st_open(path, &st));
    if (!st) return;
    CHECK(kiln_st_count(st) == 1 && kiln_st_find(st, "b") && !kiln_st_find(st, "a"));
    kiln_st_close(st);
}

TEST(st_failed_write_keeps_old_file) {
    /* Make writes fail part-way with RLIMIT_FSIZE (EFBIG after a short
     * write): the temp file must go and the old file must be untouched. */
    const char *dir = test_tmpdir();
    const char *path = test_join(dir, "x.safetensors");
    write_small_valid(path);
    char *before;
    size_t nbefore;
    CHECK_OK(kiln_read_file(path, &before, &nbefore));

    enum { N = 16384 };
    static float big[N];
    int64_t s[1] = {N};
    kiln_st_entry e = {"big", KILN_DT_F32, 1, s, big};
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN); /* get EFBIG instead of being killed */
    struct rlimit lim = {4096, old.rlim_max};
    kiln_error *err = NULL;
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        err = kiln_st_write(path, &e, 1, NULL);
        setrlimit(RLIMIT_FSIZE, &old); /* restore before anything else writes */
        signal(SIGXFSZ, old_handler);
        CHECK_MSG(err != NULL, "write past RLIMIT_FSIZE succeeded");
        if (err) {
            const char *msg = kiln_error_msg(err);
            CHECK_MSG(strstr(msg, path) && strstr(msg, "File too large"), "message '%s'", msg);
            kiln_error_free(err);
        }
        char *after;
        size_t nafter;
        CHECK_OK(kiln_read_file(path, &after, &nafter));
        CHECK(nafter == nbefore && memcmp(before, after, nbefore) == 0);
        free(after);
        CHECK(count_entries(dir) == 1);
    } else {
        signal(SIGXFSZ, old_handler);
        test_fail(__FILE__, __LINE__, "setrlimit: %s", strerror(errno));
    }
    free(before);
}

/* ---- large files: allocated up front and written through a mapping by several threads ---- */

typedef struct {
    const unsigned char *data;
    size_t left, piece;
} piece_src;

static kiln_error *piece_next(void *ctx, const void **data, size_t *len) {
    piece_src *p = ctx;
    *len = p->left < p->piece ? p->left : p->piece;
    *data = p->data;
    p->data += *len, p->left -= *len;
    return NULL;
}

/* Where the mapped path can run: tmpfs at /dev/shm where there is one (CI's containers keep /tmp on an
 * overlay file system, which keeps the write() path), else the tests' own directory. */
static const char *map_dir(char *buf, size_t n) {
    snprintf(buf, n, "/dev/shm/kiln-test-XXXXXX");
    if (mkdtemp(buf)) return buf;
    snprintf(buf, n, "%s", test_tmpdir());
    return buf;
}

static void map_dir_done(const char *dir) {
    if (!strncmp(dir, "/dev/shm/", 9)) kiln_rm_tree(dir);
}

/* Mapped mode gives the bytes of the write() path, for tensors written whole and for a stream of pieces
 * (pieces not multiples of the threads' split, a last short piece). */
TEST(st_mapped_parallel_write_matches_plain_write) {
    char dbuf[600];
    const char *dir = map_dir(dbuf, sizeof dbuf);
    enum { N = 3 * 1024 * 1024 + 7 }; /* 12 MiB + 28 bytes: over the 8 MiB a write needs to be split */
    float *big = malloc(N * sizeof *big);
    if (!big) return;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < N; i++) x = x * 6364136223846793005ull + 1442695040888963407ull, big[i] = (float)(x >> 40);
    float small[5] = {1, 2, 3, 4, 5};
    int64_t sb[1] = {N}, ss[1] = {5};
    kiln_st_entry e[2] = {{"small", KILN_DT_F32, 1, ss, small}, {"big", KILN_DT_F32, 1, sb, big}};
    const char *plain = test_join(dir, "plain.safetensors"), *mapped = test_join(dir, "mapped.safetensors"),
               *streamed = test_join(dir, "streamed.safetensors");
    setenv("KILN_WRITE_MMAP_MIN", "1000000000000", 1);
    CHECK_OK(kiln_st_write(plain, e, 2, NULL));
    setenv("KILN_WRITE_MMAP_MIN", "0", 1);
    setenv("KILN_WRITE_THREADS", "3", 1);
    CHECK_OK(kiln_st_write(mapped, e, 2, NULL));
    /* the stream: the tensors' bytes back to back, in pieces of 9 MiB + 3 */
    unsigned char *cat = malloc(sizeof small + N * sizeof *big);
    if (cat) {
        memcpy(cat, small, sizeof small);
        memcpy(cat + sizeof small, big, N * sizeof *big);
        kiln_st_entry es[2] = {{"small", KILN_DT_F32, 1, ss, NULL}, {"big", KILN_DT_F32, 1, sb, NULL}};
        piece_src src = {cat, sizeof small + N * sizeof *big, (9u << 20) + 3};
        CHECK_OK(kiln_st_write_stream(streamed, es, 2, NULL, piece_next, &src));
    }
    unsetenv("KILN_WRITE_MMAP_MIN");
    unsetenv("KILN_WRITE_THREADS");
    char *a = NULL, *b = NULL, *c = NULL;
    size_t na = 0, nb = 0, nc = 0;
    CHECK_OK(kiln_read_file(plain, &a, &na));
    CHECK_OK(kiln_read_file(mapped, &b, &nb));
    CHECK_OK(kiln_read_file(streamed, &c, &nc));
    CHECK(a && b && na == nb && memcmp(a, b, na) == 0);
    CHECK(a && c && na == nc && memcmp(a, c, na) == 0);
    CHECK(count_entries(dir) == 3); /* no temp files left */
    free(a), free(b), free(c), free(cat), free(big);
    map_dir_done(dir);
}

/* The mapped mode is taken where the file system can allocate the file (checked by trying), and a
 * mapped file written short of its size is an error, not a file with a hole at the end. */
TEST(fs_sized_atomic_file_maps_and_checks_its_size) {
    char dbuf[600];
    const char *dir = map_dir(dbuf, sizeof dbuf);
    const char *probe = test_join(dir, "probe");
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int can = fd >= 0 && posix_fallocate(fd, 0, 1 << 20) == 0 && kiln_fs_maps_safely(fd);
    if (fd >= 0) close(fd);
    unlink(probe);
    setenv("KILN_WRITE_MMAP_MIN", "4096", 1);
    kiln_atomic_file f;
    const char *path = test_join(dir, "short.bin");
    CHECK_OK(kiln_atomic_begin_sized(&f, path, 1 << 20));
    if (can) CHECK_MSG(f.map != NULL, "fallocate works in %s but the file was not mapped", dir);
    static char buf[1 << 19];
    memset(buf, 7, sizeof buf);
    CHECK_OK(kiln_atomic_write(&f, buf, sizeof buf));
    kiln_error *err = kiln_atomic_commit(&f);
    if (f.map || can) {
        CHECK_MSG(err != NULL, "a mapped file committed with half of its bytes");
        if (err) CHECK_MSG(strstr(kiln_error_msg(err), "524288 bytes written of the 1048576"), "%s", kiln_error_msg(err));
        CHECK(access(path, F_OK) != 0 && count_entries(dir) == 0);
    }
    kiln_error_free(err);
    if (!can) unlink(path); /* written by the plain path: nothing to check there */
    /* a write past the size is refused (the file is then abandoned) */
    CHECK_OK(kiln_atomic_begin_sized(&f, path, 8192));
    if (f.map) {
        CHECK_ERR(kiln_atomic_write(&f, buf, 8193), "8193 bytes written at byte 0 of a file sized 8192");
    }
    kiln_atomic_abort(&f);
    CHECK(count_entries(dir) == 0);
    unsetenv("KILN_WRITE_MMAP_MIN");
    map_dir_done(dir);
}

/* A file-size limit (or a full disk) makes the allocation fail: the plain write path then reports it as
 * before, and the old file stays. */
TEST(st_mapped_write_past_file_size_limit_keeps_old_file) {
    setenv("KILN_WRITE_MMAP_MIN", "0", 1);
    st_failed_write_keeps_old_file();
    unsetenv("KILN_WRITE_MMAP_MIN");
}

/* ---- fuzz ---- */

static uint64_t fuzz_state = 0x5eed;
static uint64_t fuzz_rand(void) {
    fuzz_state ^= fuzz_state << 13;
    fuzz_state ^= fuzz_state >> 7;
    fuzz_state ^= fuzz_state << 17;
    return fuzz_state;
}

TEST(st_fuzz_random_byte_flips) {
    const char *dir = test_tmpdir();
    const char *good = test_join(dir, "good.safetensors");
    /* A richer file so flips hit many kinds of fields. */
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {0x3c00, 0x4000, 0x4200};
    int64_t ids[2] = {7, 9};
    uint8_t m[1] = {1};
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s2[1] = {2}, s1[1] = {1};
    kiln_st_entry e[] = {{"layer.0.w", KILN_DT_F32, 2, s23, a}, {"h", KILN_DT_F16, 1, s3, h},
                         {"ids", KILN_DT_I64, 1, s2, ids},      {"m", KILN_DT_BOOL, 1, s1, m}};
    const char *meta[] = {"format", "pt", "k", "v", NULL};
    CHECK_OK(kiln_st_write(good, e, 4, meta));
    char *orig;
    size_t n;
    CHECK_OK(kiln_read_file(good, &orig, &n));
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)orig[i] << (8 * i);

    const char *path = test_join(dir, "fuzz.safetensors");
    unsigned char *buf = malloc(n);
    int opened = 0;
    for (int iter = 0; iter < 2000; iter++) {
        memcpy(buf, orig, n);
        int flips = 1 + (int)(fuzz_rand() % 3);
        for (int k = 0; k < flips; k++) {
            /* Mostly the header, where the parsing happens; sometimes the
             * length prefix or anywhere at all. */
            uint64_t r = fuzz_rand() % 10;
            size_t pos = r < 7 ? 8 + fuzz_rand() % hlen : r < 8 ? fuzz_rand() % 8 : fuzz_rand() % n;
            if (fuzz_rand() & 1) buf[pos] ^= (unsigned char)(1u << (fuzz_rand() % 8));
            else buf[pos] = (unsigned char)fuzz_rand();
        }
        write_bytes(path, buf, n);
        kiln_st *st = NULL;
        kiln_error *err = kiln_st_open(path, &st);
        if (err) {
            CHECK_MSG(strncmp(kiln_error_msg(err), path, strlen(path)) == 0, "iteration %d: '%s'", iter,
                      kiln_error_msg(err));
            kiln_error_free(err);
            continue;
        }
        /* Whatever was accepted must be self-consistent: touch every byte. */
        opened++;
        unsigned sum = 0;
        for (size_t i = 0; i < kiln_st_count(st); i++) {
            const kiln_st_tensor *t = kiln_st_at(st, i);
            CHECK(kiln_st_find(st, t->name) == t);
            CHECK(t->nbytes == (size_t)t->numel * kiln_dtype_size(t->dtype));
            for (size_t b = 0; b < t->nbytes; b++) sum += ((const unsigned char *)t->data)[b];
            if (t->numel <= 64) {
                float tmp[64];
                kiln_error *ce = kiln_st_read_f32(t, tmp, (size_t)t->numel);
                kiln_error_free(ce); /* may be unsupported; must not crash */
            }
        }
        (void)sum;
        kiln_st_close(st);
    }
    /* Flips in tensor data or in spaces/digits that keep the header valid
     * leave the file loadable: make sure the loop exercised that path too. */
    CHECK(opened > 0);
    free(buf);
    free(orig);
}
