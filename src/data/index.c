/* index.json of a prepared data directory: what splits and shards exist, their counts and
 * checksums, the vocabulary and the tokenizer they came from. See docs/data-format.md. */
#include "kiln/data.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/fsutil.h"
#include "kiln/json.h"

#define FORMAT_NAME "kiln-tokens"

static kiln_error *oom(const char *what) { return kiln_errorf(KILN_ENOMEM, "%s: out of memory", what); }

void kiln_data_index_free(kiln_data_index *ix) {
    if (!ix) return;
    for (size_t i = 0; i < ix->nsplits; i++) {
        kiln_data_split_info *sp = &ix->splits[i];
        for (size_t k = 0; k < sp->nshards; k++) free(sp->shards[k].file);
        free(sp->shards);
        free(sp->name);
    }
    free(ix->splits);
    free(ix->tokenizer_path);
    free(ix);
}

const kiln_data_split_info *kiln_data_index_split(const kiln_data_index *ix, const char *name) {
    for (size_t i = 0; i < ix->nsplits; i++)
        if (!strcmp(ix->splits[i].name, name)) return &ix->splits[i];
    return NULL;
}

/* ---- reading ---- */

/* A count: an integer in 0..2^53. */
static kiln_error *get_count(const cJSON *obj, const char *field, uint64_t *out, const char *ctx) {
    int64_t v = 0;
    KILN_TRY(kiln_json_get_int(obj, field, &v, 0, 1, ctx));
    if (v < 0) return kiln_errorf(KILN_EFORMAT, "%s: field '%s' must not be negative, got %" PRId64, ctx, field, v);
    *out = (uint64_t)v;
    return NULL;
}

/* A 64-bit checksum written as 16 hex digits. */
static kiln_error *get_hex64(const cJSON *obj, const char *field, uint64_t *out, const char *ctx) {
    const char *s = NULL;
    KILN_TRY(kiln_json_get_string(obj, field, &s, NULL, 1, ctx));
    uint64_t v = 0;
    int ok = strlen(s) == 16;
    for (int i = 0; ok && i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) ok = 0;
        v = v << 4 | (uint64_t)(d < 0 ? 0 : d);
    }
    if (!ok) return kiln_errorf(KILN_EFORMAT, "%s: field '%s' must be 16 hex digits, got \"%s\"", ctx, field, s);
    *out = v;
    return NULL;
}

/* Shard files are plain names inside the data directory. */
static int plain_name(const char *s) {
    return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static kiln_error *read_split(const cJSON *node, const char *path, kiln_data_split_info *sp) {
    char ctx[1024];
    snprintf(ctx, sizeof ctx, "%s: splits.%s", path, sp->name);
    if (!cJSON_IsObject(node))
        return kiln_errorf(KILN_EFORMAT, "%s must be an object, got %s", ctx, kiln_json_type_name(node));
    const cJSON *arr = NULL;
    KILN_TRY(get_count(node, "tokens", &sp->tokens, ctx));
    KILN_TRY(get_count(node, "documents", &sp->documents, ctx));
    KILN_TRY(kiln_json_get_array(node, "shards", &arr, 1, ctx));
    if (!cJSON_IsArray(arr)) return kiln_errorf(KILN_EFORMAT, "%s: field 'shards' must be an array", ctx);
    int n = cJSON_GetArraySize(arr);
    sp->shards = calloc((size_t)n + 1, sizeof *sp->shards);
    if (!sp->shards) return oom(path);
    uint64_t tokens = 0, docs = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *it = cJSON_GetArrayItem(arr, i);
        kiln_data_shard_info *si = &sp->shards[i];
        char sctx[1100];
        snprintf(sctx, sizeof sctx, "%s.shards[%d]", ctx, i);
        if (!cJSON_IsObject(it))
            return kiln_errorf(KILN_EFORMAT, "%s must be an object, got %s", sctx, kiln_json_type_name(it));
        const char *file = NULL;
        KILN_TRY(kiln_json_get_string(it, "file", &file, NULL, 1, sctx));
        if (!plain_name(file))
            return kiln_errorf(KILN_EFORMAT, "%s: file \"%s\" must be a plain file name in the data directory", sctx,
                               file);
        si->file = strdup(file);
        if (!si->file) return oom(path);
        sp->nshards++;
        KILN_TRY(get_count(it, "tokens", &si->tokens, sctx));
        KILN_TRY(get_count(it, "documents", &si->documents, sctx));
        KILN_TRY(get_hex64(it, "fnv1a64", &si->checksum, sctx));
        tokens += si->tokens;
        docs += si->documents;
    }
    if (tokens != sp->tokens)
        return kiln_errorf(KILN_EFORMAT, "%s: tokens is %" PRIu64 " but its shards hold %" PRIu64, ctx, sp->tokens,
                           tokens);
    if (docs != sp->documents)
        return kiln_errorf(KILN_EFORMAT, "%s: documents is %" PRIu64 " but its shards hold %" PRIu64, ctx,
                           sp->documents, docs);
    return NULL;
}

static kiln_error *read_index(const cJSON *root, const char *path, kiln_data_index *ix) {
    if (!cJSON_IsObject(root))
        return kiln_errorf(KILN_EFORMAT, "%s: expected a JSON object, got %s", path, kiln_json_type_name(root));
    const char *format = NULL, *tok_path = NULL;
    KILN_TRY(kiln_json_get_string(root, "format", &format, NULL, 1, path));
    if (strcmp(format, FORMAT_NAME))
        return kiln_errorf(KILN_EFORMAT, "%s: format is \"%s\", expected \"" FORMAT_NAME "\"", path, format);
    KILN_TRY(kiln_json_get_int(root, "version", &ix->version, 0, 1, path));
    if (ix->version > KILN_DATA_INDEX_VERSION)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: index version %" PRId64
                           " is newer than this kiln reads (version %d); upgrade kiln", path, ix->version,
                           KILN_DATA_INDEX_VERSION);
    if (ix->version < 1) return kiln_errorf(KILN_EFORMAT, "%s: invalid index version %" PRId64, path, ix->version);
    const cJSON *tok = NULL, *splits = NULL;
    KILN_TRY(kiln_json_get_object(root, "tokenizer", &tok, 1, path));
    char ctx[1024];
    snprintf(ctx, sizeof ctx, "%s: tokenizer", path);
    KILN_TRY(kiln_json_get_string(tok, "path", &tok_path, NULL, 1, ctx));
    KILN_TRY(get_hex64(tok, "fnv1a64", &ix->tokenizer_checksum, ctx));
    ix->tokenizer_path = strdup(tok_path);
    if (!ix->tokenizer_path) return oom(path);
    int64_t tb = 0;
    KILN_TRY(kiln_json_get_int(root, "vocab_size", &ix->vocab_size, 0, 1, path));
    KILN_TRY(kiln_json_get_int(root, "eos_id", &ix->eos_id, -1, 0, path));
    KILN_TRY(kiln_json_get_int(root, "token_bytes", &tb, 0, 1, path));
    if (ix->vocab_size < 1 || ix->vocab_size > ((int64_t)1 << 32))
        return kiln_errorf(KILN_EFORMAT, "%s: vocab_size %" PRId64 " is outside 1..2^32", path, ix->vocab_size);
    if (ix->eos_id < -1 || ix->eos_id >= ix->vocab_size)
        return kiln_errorf(KILN_EFORMAT, "%s: eos_id %" PRId64 " is outside the vocabulary (size %" PRId64 ")", path,
                           ix->eos_id, ix->vocab_size);
    if (tb != kiln_shard_token_bytes((uint64_t)ix->vocab_size))
        return kiln_errorf(KILN_EFORMAT, "%s: token_bytes %" PRId64 " does not match vocab_size %" PRId64
                           " (expected %" PRIu32 ")", path, tb, ix->vocab_size,
                           kiln_shard_token_bytes((uint64_t)ix->vocab_size));
    ix->token_bytes = (uint32_t)tb;
    KILN_TRY(kiln_json_get_object(root, "splits", &splits, 1, path));
    int n = cJSON_GetArraySize(splits);
    ix->splits = calloc((size_t)n + 1, sizeof *ix->splits);
    if (!ix->splits) return oom(path);
    for (const cJSON *it = splits->child; it; it = it->next) {
        kiln_data_split_info *sp = &ix->splits[ix->nsplits];
        const char *name = it->string ? it->string : "";
        if (kiln_data_index_split(ix, name))
            return kiln_errorf(KILN_EFORMAT, "%s: split '%s' appears twice", path, name);
        sp->name = strdup(name);
        if (!sp->name) return oom(path);
        ix->nsplits++;
        KILN_TRY(read_split(it, path, sp));
    }
    return NULL;
}

kiln_error *kiln_data_index_read(const char *dir, kiln_data_index **out) {
    *out = NULL;
    char *path = kiln_path_join(dir, "index.json");
    if (!path) return oom(dir);
    cJSON *root = NULL;
    kiln_error *e = kiln_json_parse_file(path, &root);
    kiln_data_index *ix = NULL;
    if (!e) {
        ix = calloc(1, sizeof *ix);
        e = ix ? read_index(root, path, ix) : oom(path);
    }
    cJSON_Delete(root);
    free(path);
    if (e) {
        kiln_data_index_free(ix);
        return e;
    }
    *out = ix;
    return NULL;
}

/* ---- writing ---- */

static cJSON *add_hex64(cJSON *obj, const char *name, uint64_t v) {
    char buf[17];
    snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return cJSON_AddStringToObject(obj, name, buf);
}

static cJSON *build_index(const kiln_data_index *ix) {
    cJSON *root = cJSON_CreateObject(), *tok, *splits;
    int ok = root && cJSON_AddStringToObject(root, "format", FORMAT_NAME) &&
             cJSON_AddNumberToObject(root, "version", (double)KILN_DATA_INDEX_VERSION) &&
             (tok = cJSON_AddObjectToObject(root, "tokenizer")) &&
             cJSON_AddStringToObject(tok, "path", ix->tokenizer_path ? ix->tokenizer_path : "") &&
             add_hex64(tok, "fnv1a64", ix->tokenizer_checksum) &&
             cJSON_AddNumberToObject(root, "vocab_size", (double)ix->vocab_size) &&
             (ix->eos_id >= 0 ? cJSON_AddNumberToObject(root, "eos_id", (double)ix->eos_id) != NULL
                              : cJSON_AddNullToObject(root, "eos_id") != NULL) &&
             cJSON_AddNumberToObject(root, "token_bytes", (double)kiln_shard_token_bytes((uint64_t)ix->vocab_size)) &&
             (splits = cJSON_AddObjectToObject(root, "splits"));
    for (size_t i = 0; ok && i < ix->nsplits; i++) {
        const kiln_data_split_info *sp = &ix->splits[i];
        cJSON *s = cJSON_AddObjectToObject(splits, sp->name), *arr;
        ok = s && cJSON_AddNumberToObject(s, "tokens", (double)sp->tokens) &&
             cJSON_AddNumberToObject(s, "documents", (double)sp->documents) &&
             (arr = cJSON_AddArrayToObject(s, "shards"));
        for (size_t k = 0; ok && k < sp->nshards; k++) {
            const kiln_data_shard_info *si = &sp->shards[k];
            cJSON *o = cJSON_CreateObject();
            ok = o && cJSON_AddItemToArray(arr, o);
            if (!ok) cJSON_Delete(o);
            ok = ok && cJSON_AddStringToObject(o, "file", si->file) &&
                 cJSON_AddNumberToObject(o, "tokens", (double)si->tokens) &&
                 cJSON_AddNumberToObject(o, "documents", (double)si->documents) &&
                 add_hex64(o, "fnv1a64", si->checksum);
        }
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

kiln_error *kiln_data_index_write(const char *dir, const kiln_data_index *ix) {
    char *path = kiln_path_join(dir, "index.json");
    if (!path) return oom(dir);
    cJSON *root = build_index(ix);
    char *text = root ? kiln_json_print(root, 1) : NULL;
    kiln_error *e = NULL;
    if (!text) {
        e = oom(path);
    } else {
        size_t n = strlen(text);
        char *t2 = realloc(text, n + 2); /* end with a newline */
        if (t2) {
            text = t2;
            text[n++] = '\n';
            text[n] = 0;
        }
        e = kiln_write_file_atomic(path, text, n);
    }
    free(text);
    cJSON_Delete(root);
    free(path);
    return e;
}

/* ---- opening a listed shard ---- */

kiln_error *kiln_data_open_shard(const char *dir, const kiln_data_index *ix, const kiln_data_shard_info *si,
                                 kiln_shard *out) {
    memset(out, 0, sizeof *out);
    char *path = kiln_path_join(dir, si->file);
    if (!path) return oom(dir);
    kiln_error *e = kiln_shard_open(path, out);
    const kiln_shard_header *h = &out->h;
    if (e) {
    } else if (h->vocab_size != (uint64_t)ix->vocab_size) {
        e = kiln_errorf(KILN_EFORMAT, "%s: vocab size %" PRIu64 " differs from index.json's vocab_size %" PRId64, path,
                        h->vocab_size, ix->vocab_size);
    } else if (h->ntokens != si->tokens || h->ndocs != si->documents) {
        e = kiln_errorf(KILN_EFORMAT, "%s: holds %" PRIu64 " tokens and %" PRIu64 " documents, index.json says %" PRIu64
                        " and %" PRIu64, path, h->ntokens, h->ndocs, si->tokens, si->documents);
    } else if (h->checksum != si->checksum) {
        e = kiln_errorf(KILN_EFORMAT, "%s: checksum %016" PRIx64 " differs from index.json's %016" PRIx64
                        " (the shard was replaced?)", path, h->checksum, si->checksum);
    }
    if (e) kiln_shard_close(out);
    free(path);
    return e;
}
