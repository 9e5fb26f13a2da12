/* tokenizer.json: loading, and the encode / decode pipelines of HF `tokenizers`:
 *
 *   encode: added tokens are cut out of the raw text (non-normalized ones), each remaining piece is
 *           normalized, normalized added tokens are cut out of that, the pre-tokenizers split what
 *           is left into words, and the BPE model turns each word into ids;
 *   decode: ids -> token strings (added tokens first) -> the decoder chain -> joined text.
 *
 * Anything in tokenizer.json this does not implement is an error naming the field and the type. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/json.h"
#include "tokenizer_internal.h"

static kiln_error *nomem(const char *what) { return kiln_errorf(KILN_ENOMEM, "%s: out of memory", what); }

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* ---------------------------------------------------------------- JSON helpers */

/* "type" of a component object. */
static kiln_error *type_of(const cJSON *o, const char *field, const char *path, const char **type) {
    if (!cJSON_IsObject(o))
        return kiln_errorf(KILN_EFORMAT, "%s: field '%s' must be an object or null, got %s", path, field,
                           kiln_json_type_name(o));
    char ctx[1200];
    snprintf(ctx, sizeof ctx, "%s: %s", path, field);
    return kiln_json_get_string(o, "type", type, NULL, 1, ctx);
}

/* A Replace/Split pattern {"String": s}; a {"Regex": r} is returned through *regex. */
static kiln_error *pattern_of(const cJSON *o, const char *field, const char *path, const char **str,
                              const char **regex) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const cJSON *s = p ? cJSON_GetObjectItemCaseSensitive(p, "String") : NULL;
    const cJSON *r = p ? cJSON_GetObjectItemCaseSensitive(p, "Regex") : NULL;
    *str = NULL;
    *regex = NULL;
    if (cJSON_IsString(s)) *str = s->valuestring;
    else if (cJSON_IsString(r)) *regex = r->valuestring;
    else
        return kiln_errorf(KILN_EFORMAT, "%s: field '%s.pattern' must be {\"String\": ...} or {\"Regex\": ...}", path,
                           field);
    return NULL;
}

/* A string field that must hold exactly one character. */
static kiln_error *one_char(const cJSON *o, const char *name, const char *field, const char *path, const char *dflt,
                            const char **out) {
    char ctx[1200];
    snprintf(ctx, sizeof ctx, "%s: %s", path, field);
    KILN_TRY(kiln_json_get_string(o, name, out, dflt, dflt == NULL, ctx));
    size_t l = strlen(*out);
    if (l == 0 || kiln_utf8_valid_prefix(*out, l) != l || kiln_utf8_len((unsigned char)**out) != l)
        return kiln_errorf(KILN_EFORMAT, "%s: field '%s.%s' must be one character, got \"%s\"", path, field, name,
                           *out);
    return NULL;
}

static kiln_error *prepend_scheme_of(const cJSON *o, const char *field, const char *path, int *scheme) {
    char ctx[1200];
    snprintf(ctx, sizeof ctx, "%s: %s", path, field);
    const char *ps = NULL;
    int aps = 1;
    KILN_TRY(kiln_json_get_string(o, "prepend_scheme", &ps, NULL, 0, ctx));
    KILN_TRY(kiln_json_get_bool(o, "add_prefix_space", &aps, 1, 0, ctx));
    *scheme = KILN_PREPEND_ALWAYS;
    if (ps) {
        if (!strcmp(ps, "always")) *scheme = KILN_PREPEND_ALWAYS;
        else if (!strcmp(ps, "first")) *scheme = KILN_PREPEND_FIRST;
        else if (!strcmp(ps, "never")) *scheme = KILN_PREPEND_NEVER;
        else
            return kiln_errorf(KILN_EFORMAT, "%s: field '%s.prepend_scheme': unknown value \"%s\" (always, first, never)",
                               path, field, ps);
    }
    if (!aps) *scheme = KILN_PREPEND_NEVER; /* legacy add_prefix_space: false */
    return NULL;
}

/* A Replace normalizer or decoder: its {"String": ...} pattern and content, copied into *a and *b
 * (both freed again on failure); a Regex pattern is not supported. ctx: "path: field". */
static kiln_error *replace_of(const cJSON *o, const char *field, const char *path, const char *ctx, char **a,
                              size_t *alen, char **b, size_t *blen) {
    const char *s, *re, *content;
    KILN_TRY(pattern_of(o, field, path, &s, &re));
    if (re)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: field '%s.pattern': Regex pattern \"%s\" is not supported "
                                              "(only {\"String\": ...})",
                           path, field, re);
    KILN_TRY(kiln_json_get_string(o, "content", &content, NULL, 1, ctx));
    *a = strdup(s);
    *b = strdup(content);
    *alen = strlen(s);
    *blen = strlen(content);
    if (!*a || !*b) {
        free(*a);
        free(*b);
        *a = *b = NULL;
        return nomem(path);
    }
    return NULL;
}

/* Loads one normalizer, pre-tokenizer or decoder into t (the post-processor is only checked). */
typedef kiln_error *component_loader(kiln_tokenizer *t, const cJSON *o, const char *field, const char *path);

/* A "Sequence" component: load each element of its array `key` as "field.key[i]". ctx: "path: field". */
static kiln_error *load_sequence(kiln_tokenizer *t, const cJSON *o, const char *key, const char *field,
                                 const char *path, const char *ctx, component_loader *load) {
    const cJSON *list;
    char sub[256];
    KILN_TRY(kiln_json_get_array(o, key, &list, 1, ctx));
    int i = 0;
    for (const cJSON *it = list->child; it; it = it->next, i++) {
        snprintf(sub, sizeof sub, "%s.%s[%d]", field, key, i);
        KILN_TRY(load(t, it, sub, path));
    }
    return NULL;
}

/* ---------------------------------------------------------------- normalizer */

static kiln_error *load_normalizer(kiln_tokenizer *t, const cJSON *o, const char *field, const char *path) {
    if (!o || cJSON_IsNull(o)) return NULL;
    const char *type;
    KILN_TRY(type_of(o, field, path, &type));
    char ctx[1200];
    snprintf(ctx, sizeof ctx, "%s: %s", path, field);
    if (!strcmp(type, "Sequence")) return load_sequence(t, o, "normalizers", field, path, ctx, load_normalizer);
    kiln_norm n = {0};
    if (!strcmp(type, "Replace")) {
        const char *s, *re, *content;
        KILN_TRY(pattern_of(o, field, path, &s, &re));
        if (re && !strcmp(re, "\\s+")) {
            /* CLIP's whitespace collapsing: the one regex Replace we know */
            KILN_TRY(kiln_json_get_string(o, "content", &content, NULL, 1, ctx));
            n.kind = KILN_NORM_REPLACE_WS;
            if (!(n.b = strdup(content))) return nomem(path);
            n.blen = strlen(content);
        } else {
            n.kind = KILN_NORM_REPLACE;
            KILN_TRY(replace_of(o, field, path, ctx, &n.a, &n.alen, &n.b, &n.blen));
        }
    } else if (!strcmp(type, "Lowercase")) {
        n.kind = KILN_NORM_LOWERCASE;
    } else if (!strcmp(type, "Prepend")) {
        const char *p;
        KILN_TRY(kiln_json_get_string(o, "prepend", &p, NULL, 1, ctx));
        n = (kiln_norm){KILN_NORM_PREPEND, strdup(p), NULL, strlen(p), 0};
        if (!n.a) return nomem(path);
    } else if (!strcmp(type, "NFC")) {
        n.kind = KILN_NORM_NFC;
    } else {
        return kiln_errorf(KILN_EUNSUPPORTED,
                           "%s: field '%s': normalizer type \"%s\" is not supported (Sequence, Replace, Prepend, NFC, "
                           "Lowercase)",
                           path, field, type);
    }
    kiln_norm *v = realloc(t->norm, (t->nnorm + 1) * sizeof *v);
    if (!v) {
        free(n.a);
        free(n.b);
        return nomem(path);
    }
    t->norm = v;
    t->norm[t->nnorm++] = n;
    return NULL;
}

/* ---------------------------------------------------------------- pre-tokenizer */

static kiln_error *split_regex(const char *re, const char *field, const char *path, int *kind) {
    *kind = kiln_regex_kind(re);
    if (!*kind)
        return kiln_errorf(KILN_EUNSUPPORTED,
                           "%s: field '%s.pattern': regex \"%s\" is not supported (only the GPT-2, Llama-3 and "
                           "CLIP split patterns are)",
                           path, field, re);
    return NULL;
}

static kiln_error *load_pretokenizer(kiln_tokenizer *t, const cJSON *o, const char *field, const char *path) {
    if (!o || cJSON_IsNull(o)) return NULL;
    const char *type;
    KILN_TRY(type_of(o, field, path, &type));
    char ctx[1200];
    snprintf(ctx, sizeof ctx, "%s: %s", path, field);
    if (!strcmp(type, "Sequence")) return load_sequence(t, o, "pretokenizers", field, path, ctx, load_pretokenizer);
    kiln_pretok p = {0};
    if (!strcmp(type, "ByteLevel")) {
        p.kind = KILN_PRE_BYTELEVEL;
        KILN_TRY(kiln_json_get_bool(o, "add_prefix_space", &p.add_prefix_space, 1, 0, ctx));
        KILN_TRY(kiln_json_get_bool(o, "use_regex", &p.use_regex, 1, 0, ctx));
    } else if (!strcmp(type, "Split")) {
        const char *s, *re, *behavior;
        p.kind = KILN_PRE_SPLIT;
        KILN_TRY(pattern_of(o, field, path, &s, &re));
        if (re) KILN_TRY(split_regex(re, field, path, &p.regex));
        KILN_TRY(kiln_json_get_string(o, "behavior", &behavior, NULL, 1, ctx));
        KILN_TRY(kiln_json_get_bool(o, "invert", &p.invert, 0, 0, ctx));
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        p.behavior = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(behavior, names[i])) p.behavior = i;
        if (p.behavior < 0)
            return kiln_errorf(KILN_EFORMAT, "%s: field '%s.behavior': unknown value \"%s\"", path, field, behavior);
        if (s && !(p.str = strdup(s))) return nomem(path);
        p.str_len = s ? strlen(s) : 0;
    } else if (!strcmp(type, "Metaspace")) {
        const char *r;
        p.kind = KILN_PRE_METASPACE;
        KILN_TRY(one_char(o, "replacement", field, path, NULL, &r));
        KILN_TRY(prepend_scheme_of(o, field, path, &p.prepend_scheme));
        KILN_TRY(kiln_json_get_bool(o, "split", &p.split, 1, 0, ctx));
        if (!(p.str = strdup(r))) return nomem(path);
        p.str_len = strlen(r);
    } else {
        return kiln_errorf(KILN_EUNSUPPORTED,
                           "%s: field '%s': pre-tokenizer type \"%s\" is not supported (Sequence, ByteLevel, Split, "
                           "Metaspace)",
                           path, field, type);
    }
    kiln_pretok *v = realloc(t->pretok, (t->npretok + 1) * sizeof *v);
    if (!v) {
        free(p.str);
        return nomem(path);
    }
    t->pretok = v;
    t->pretok[t->npretok++] = p;
    return NULL;
}

/* ---------------------------------------------------------------- decoder, post-processor */

static kiln_error *load_decoder(kiln_tokenizer *t, const cJSON *o, const char *field, const char *path) {
    if (!o || cJSON_IsNull(o)) return NULL;
    const char *type;
    KILN_TRY(type_of(o, field, path, &type));
    char ctx[1200];
    snprintf(ctx, sizeof ctx, "%s: %s", path, field);
    if (!strcmp(type, "Sequence")) return load_sequence(t, o, "decoders", field, path, ctx, load_decoder);
    kiln_dec d = {0};
    if (!strcmp(type, "ByteLevel")) {
        d.kind = KILN_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d.kind = KILN_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d.kind = KILN_DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        d.kind = KILN_DEC_REPLACE;
        KILN_TRY(replace_of(o, field, path, ctx, &d.a, &d.alen, &d.b, &d.blen));
    } else if (!strcmp(type, "Strip")) {
        const char *c;
        size_t w;
        d.kind = KILN_DEC_STRIP;
        KILN_TRY(one_char(o, "content", field, path, NULL, &c));
        d.content = kiln_utf8_next(c, &w);
        KILN_TRY(kiln_json_get_int(o, "start", &d.start, 0, 1, ctx));
        KILN_TRY(kiln_json_get_int(o, "stop", &d.stop, 0, 1, ctx));
        if (d.start < 0 || d.stop < 0)
            return kiln_errorf(KILN_EFORMAT, "%s: field '%s': start and stop must be >= 0", path, field);
    } else if (!strcmp(type, "Metaspace")) {
        const char *r;
        d.kind = KILN_DEC_METASPACE;
        KILN_TRY(one_char(o, "replacement", field, path, NULL, &r));
        KILN_TRY(prepend_scheme_of(o, field, path, &d.prepend_scheme));
        if (!(d.a = strdup(r))) return nomem(path);
        d.alen = strlen(r);
    } else {
        return kiln_errorf(KILN_EUNSUPPORTED,
                           "%s: field '%s': decoder type \"%s\" is not supported (Sequence, ByteLevel, Replace, "
                           "ByteFallback, Fuse, Strip, Metaspace)",
                           path, field, type);
    }
    kiln_dec *v = realloc(t->dec, (t->ndec + 1) * sizeof *v);
    if (!v) {
        free(d.a);
        free(d.b);
        return nomem(path);
    }
    t->dec = v;
    t->dec[t->ndec++] = d;
    return NULL;
}

/* Encoding never adds special tokens, so the post-processor only has to be one HF knows. */
static kiln_error *check_post_processor(kiln_tokenizer *t, const cJSON *o, const char *field, const char *path) {
    if (!o || cJSON_IsNull(o)) return NULL;
    const char *type;
    KILN_TRY(type_of(o, field, path, &type));
    if (!strcmp(type, "Sequence")) {
        char ctx[1200];
        snprintf(ctx, sizeof ctx, "%s: %s", path, field);
        return load_sequence(t, o, "processors", field, path, ctx, check_post_processor);
    }
    static const char *const known[] = {"TemplateProcessing", "ByteLevel", "BertProcessing", "RobertaProcessing"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(type, known[i])) return NULL;
    return kiln_errorf(KILN_EUNSUPPORTED,
                       "%s: field '%s': post-processor type \"%s\" is not supported (TemplateProcessing, ByteLevel, "
                       "BertProcessing, RobertaProcessing, Sequence)",
                       path, field, type);
}

/* ---------------------------------------------------------------- added tokens */

/* HF assigns an added token the id of its content if the vocabulary (added or model) has it,
 * else the next free id after the model's vocabulary; the id written in the file must agree. */
static kiln_error *load_added(kiln_tokenizer *t, const cJSON *list, const char *path) {
    if (!list || cJSON_IsNull(list)) return NULL;
    if (!cJSON_IsArray(list))
        return kiln_errorf(KILN_EFORMAT, "%s: field 'added_tokens' must be an array, got %s", path,
                           kiln_json_type_name(list));
    int n = cJSON_GetArraySize(list);
    t->added = calloc((size_t)(n ? n : 1), sizeof *t->added);
    if (!t->added || kiln_strmap_init(&t->added_map, (size_t)n)) return nomem(path);
    int64_t max_added = -1, nvocab = t->model.nvocab;
    int i = 0;
    for (const cJSON *it = list->child; it; it = it->next, i++) {
        char ctx[1200];
        snprintf(ctx, sizeof ctx, "%s: added_tokens[%d]", path, i);
        if (!cJSON_IsObject(it)) return kiln_errorf(KILN_EFORMAT, "%s must be an object", ctx);
        const char *content;
        int64_t id;
        int special, single_word, lstrip, rstrip, normalized;
        KILN_TRY(kiln_json_get_string(it, "content", &content, NULL, 1, ctx));
        KILN_TRY(kiln_json_get_int(it, "id", &id, 0, 1, ctx));
        KILN_TRY(kiln_json_get_bool(it, "special", &special, 0, 0, ctx));
        KILN_TRY(kiln_json_get_bool(it, "single_word", &single_word, 0, 0, ctx));
        KILN_TRY(kiln_json_get_bool(it, "lstrip", &lstrip, 0, 0, ctx));
        KILN_TRY(kiln_json_get_bool(it, "rstrip", &rstrip, 0, 0, ctx));
        KILN_TRY(kiln_json_get_bool(it, "normalized", &normalized, !special, 0, ctx));
        size_t len = strlen(content);
        if (len == 0) continue; /* HF ignores empty added tokens */
        if (single_word)
            return kiln_errorf(KILN_EUNSUPPORTED, "%s (\"%s\"): single_word: true is not supported", ctx, content);
        if (id < 0 || id > INT32_MAX) return kiln_errorf(KILN_EFORMAT, "%s (\"%s\"): id %lld is out of range", ctx,
                                                         content, (long long)id);
        int64_t *prev = kiln_strmap_get(&t->added_map, content, len);
        int64_t *mid = kiln_strmap_get(&t->model.vocab, content, len), want;
        if (prev) want = *prev; /* listed again: same id, the later flags win (as HF) */
        else if (mid) want = *mid;
        else if (max_added < 0) want = nvocab;
        else want = (max_added >= nvocab || nvocab == 0) ? max_added + 1 : nvocab;
        if (want != id)
            return kiln_errorf(KILN_EFORMAT,
                               "%s (\"%s\"): id %lld disagrees with the id HF `tokenizers` gives it (%lld: %s)", ctx,
                               content, (long long)id, (long long)want,
                               prev ? "its earlier entry" : mid ? "its id in model.vocab" : "the next id after the vocabulary");
        if (prev) {
            for (size_t k = 0; k < t->nadded; k++)
                if (t->added[k].id == want) {
                    t->added[k].special = special;
                    t->added[k].lstrip = lstrip;
                    t->added[k].rstrip = rstrip;
                    t->added[k].normalized = normalized;
                }
            continue;
        }
        kiln_added *a = &t->added[t->nadded];
        *a = (kiln_added){strdup(content), len, id, special, lstrip, rstrip, normalized};
        if (!a->content) return nomem(path);
        if (kiln_strmap_put(&t->added_map, a->content, len, id, NULL) < 0) return nomem(path);
        t->nadded++;
        if (id > max_added) max_added = id;
    }
    return NULL;
}

static kiln_error *build_added(kiln_tokenizer *t, const char *path) {
    t->nids = t->model.nids;
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].id + 1 > t->nids) t->nids = t->added[i].id + 1;
    t->added_rev = malloc((size_t)(t->nids ? t->nids : 1) * sizeof *t->added_rev);
    t->norm_patterns = calloc(t->nadded ? t->nadded : 1, sizeof *t->norm_patterns);
    if (!t->added_rev || !t->norm_patterns) return nomem(path);
    for (int64_t i = 0; i < t->nids; i++) t->added_rev[i] = -1;
    kiln_buf nb = {0};
    /* special tokens first, then the others, as HF's refresh_added_tokens */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < t->nadded; i++) {
            kiln_added *a = &t->added[i];
            if (a->special != (pass == 0)) continue;
            t->added_rev[a->id] = (int64_t)i;
            int rc;
            if (!a->normalized) {
                rc = kiln_trie_add(&t->trie_raw, a->content, a->len, (int32_t)i);
            } else {
                size_t z = 0;
                rc = kiln_normalize(t->norm, t->nnorm, a->content, a->len, &nb, &z);
                if (!rc && !(t->norm_patterns[i] = dupn(nb.p ? nb.p : "", nb.n))) rc = -1;
                if (!rc) rc = kiln_trie_add(&t->trie_norm, t->norm_patterns[i], nb.n, (int32_t)i);
            }
            if (rc) {
                kiln_buf_free(&nb);
                return nomem(path);
            }
        }
    kiln_buf_free(&nb);
    return NULL;
}

/* ---------------------------------------------------------------- load / free */

kiln_error *kiln_tokenizer_load(const char *path, kiln_tokenizer **out) {
    *out = NULL;
    cJSON *root = NULL;
    KILN_TRY(kiln_json_parse_file(path, &root));
    kiln_error *e = NULL;
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) e = nomem(path);
    const char *version = NULL, *mtype = NULL;
    const cJSON *model = NULL;
    if (!e && !cJSON_IsObject(root))
        e = kiln_errorf(KILN_EFORMAT, "%s: must be a JSON object, got %s", path, kiln_json_type_name(root));
    if (!e) e = kiln_json_get_string(root, "version", &version, "1.0", 0, path);
    if (!e && strcmp(version, "1.0"))
        e = kiln_errorf(KILN_EUNSUPPORTED, "%s: field 'version': unknown tokenizer.json version \"%s\"", path, version);
    if (!e) e = kiln_json_get_object(root, "model", &model, 1, path);
    if (!e) {
        char ctx[1200];
        snprintf(ctx, sizeof ctx, "%s: model", path);
        e = kiln_json_get_string(model, "type", &mtype, NULL, 1, ctx);
    }
    if (!e && strcmp(mtype, "BPE"))
        e = kiln_errorf(KILN_EUNSUPPORTED, "%s: field 'model.type': model type \"%s\" is not supported (only BPE)", path,
                        mtype);
    if (!e) e = kiln_bpe_load(&t->model, model, path);
    if (!e) e = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer", path);
    if (!e) e = load_pretokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer", path);
    if (!e) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
        t->has_decoder = d && !cJSON_IsNull(d);
        e = load_decoder(t, d, "decoder", path);
    }
    if (!e)
        e = check_post_processor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor", path);
    if (!e) e = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), path);
    if (!e) e = build_added(t, path);
    cJSON_Delete(root);
    if (e) {
        kiln_tokenizer_free(t);
        return e;
    }
    *out = t;
    return NULL;
}

void kiln_tokenizer_free(kiln_tokenizer *t) {
    if (!t) return;
    free(t->path);
    kiln_bpe_free(&t->model);
    for (size_t i = 0; i < t->nadded; i++) {
        free(t->added[i].content);
        if (t->norm_patterns) free(t->norm_patterns[i]);
    }
    free(t->added);
    free(t->norm_patterns);
    kiln_strmap_free(&t->added_map);
    free(t->added_rev);
    kiln_trie_free(&t->trie_raw);
    kiln_trie_free(&t->trie_norm);
    for (size_t i = 0; i < t->nnorm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    free(t->norm);
    for (size_t i = 0; i < t->npretok; i++) free(t->pretok[i].str);
    free(t->pretok);
    for (size_t i = 0; i < t->ndec; i++) {
        free(t->dec[i].a);
        free(t->dec[i].b);
    }
    free(t->dec);
    free(t);
}

int64_t kiln_tokenizer_vocab_size(const kiln_tokenizer *t) { return t->nids; }

int64_t kiln_tokenizer_token_id(const kiln_tokenizer *t, const char *token) {
    size_t len = strlen(token);
    int64_t *id = kiln_strmap_get(&t->added_map, token, len);
    if (!id) id = kiln_strmap_get(&t->model.vocab, token, len);
    return id ? *id : -1;
}

const char *kiln_tokenizer_id_to_token(const kiln_tokenizer *t, int64_t id) {
    if (id < 0 || id >= t->nids) return NULL;
    if (t->added_rev[id] >= 0) return t->added[t->added_rev[id]].content;
    size_t len;
    return kiln_bpe_token(&t->model, id, &len);
}

int kiln_tokenizer_is_special(const kiln_tokenizer *t, int64_t id) {
    return id >= 0 && id < t->nids && t->added_rev[id] >= 0 && t->added[t->added_rev[id]].special;
}

/* ---------------------------------------------------------------- encode */

/* Everything up to the model: the pieces, added tokens (id >= 0) and words (id -1), in order. */
static kiln_error *pre_tokenize(const kiln_tokenizer *t, const char *text, size_t len, kiln_pieces *out) {
    size_t valid = kiln_utf8_valid_prefix(text, len);
    if (valid != len) return kiln_errorf(KILN_EINVAL, "encode: the text is not valid UTF-8 (at byte %zu)", valid);
    kiln_pieces a = {0}, b = {0};
    int rc = 0;
    kiln_buf nb = {0};
    if (len) rc = kiln_pieces_add(&a, text, len, -1, kiln_utf8_len((unsigned char)text[0]));
    /* 1. non-normalized added tokens, on the raw text */
    if (!rc && t->trie_raw.n) {
        rc = kiln_added_split(&t->trie_raw, t->added, &a, &b);
        kiln_pieces t2 = a;
        a = b;
        b = t2;
    }
    /* 2. normalize each remaining piece, then cut out the normalized added tokens */
    if (!rc && t->nnorm) {
        kiln_pieces_clear(&b);
        for (size_t i = 0; i < a.n && !rc; i++) {
            const kiln_piece *p = &a.v[i];
            if (p->id >= 0) {
                rc = kiln_pieces_add(&b, a.text.p + p->off, p->len, p->id, 0);
                continue;
            }
            size_t z = p->z;
            rc = kiln_normalize(t->norm, t->nnorm, a.text.p + p->off, p->len, &nb, &z);
            if (!rc && nb.n) rc = kiln_pieces_add(&b, nb.p, nb.n, -1, z);
        }
        kiln_pieces t2 = a;
        a = b;
        b = t2;
    }
    if (!rc && t->trie_norm.n) {
        kiln_pieces_clear(&b);
        rc = kiln_added_split(&t->trie_norm, t->added, &a, &b);
        kiln_pieces t2 = a;
        a = b;
        b = t2;
    }
    /* 3. pre-tokenizers */
    for (size_t k = 0; k < t->npretok && !rc; k++) {
        kiln_pieces_clear(&b);
        rc = kiln_pretok_apply(&t->pretok[k], &a, &b);
        kiln_pieces t2 = a;
        a = b;
        b = t2;
    }
    kiln_buf_free(&nb);
    kiln_pieces_free(&b);
    if (rc) {
        kiln_pieces_free(&a);
        return kiln_errorf(KILN_ENOMEM, "encode: out of memory");
    }
    *out = a;
    return NULL;
}

kiln_error *kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, int64_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    kiln_pieces p = {0};
    KILN_TRY(pre_tokenize(t, text, len, &p));
    kiln_ids out = {0};
    kiln_error *e = NULL;
    for (size_t i = 0; i < p.n && !e; i++) {
        if (p.v[i].id >= 0) {
            if (kiln_ids_push(&out, p.v[i].id)) e = kiln_errorf(KILN_ENOMEM, "encode: out of memory");
        } else {
            e = kiln_bpe_tokenize(&t->model, p.text.p + p.v[i].off, p.v[i].len, &out);
        }
    }
    kiln_pieces_free(&p);
    if (e) {
        free(out.v);
        return e;
    }
    if (!out.v && !(out.v = malloc(sizeof *out.v))) return kiln_errorf(KILN_ENOMEM, "encode: out of memory");
    *ids = out.v;
    *n = out.n;
    return NULL;
}

kiln_error *kiln_tokenizer_pretokenize(const kiln_tokenizer *t, const char *text, size_t len, char ***pieces,
                                       size_t *n) {
    *pieces = NULL;
    *n = 0;
    kiln_pieces p = {0};
    KILN_TRY(pre_tokenize(t, text, len, &p));
    size_t bytes = (p.n + 1) * sizeof(char *);
    for (size_t i = 0; i < p.n; i++) bytes += p.v[i].len + 1;
    char **v = malloc(bytes);
    if (!v) {
        kiln_pieces_free(&p);
        return kiln_errorf(KILN_ENOMEM, "pretokenize: out of memory");
    }
    char *s = (char *)(v + p.n + 1);
    for (size_t i = 0; i < p.n; i++) {
        v[i] = s;
        memcpy(s, p.text.p + p.v[i].off, p.v[i].len);
        s[p.v[i].len] = 0;
        s += p.v[i].len + 1;
    }
    v[p.n] = NULL;
    *pieces = v;
    *n = p.n;
    kiln_pieces_free(&p);
    return NULL;
}

/* ---------------------------------------------------------------- decode */

kiln_error *kiln_tokenizer_decode(const kiln_tokenizer *t, const int64_t *ids, size_t n, char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    kiln_pieces toks = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *s = kiln_tokenizer_id_to_token(t, ids[i]);
        if (!s) {
            kiln_pieces_free(&toks);
            return kiln_errorf(KILN_EINVAL, "decode: id %lld at position %zu has no token (vocabulary size %lld)",
                               (long long)ids[i], i, (long long)t->nids);
        }
        size_t l;
        if (t->added_rev[ids[i]] >= 0) l = t->added[t->added_rev[ids[i]]].len;
        else kiln_bpe_token(&t->model, ids[i], &l);
        rc = kiln_pieces_add(&toks, s, l, -1, 0);
    }
    kiln_buf out = {0};
    if (!rc) {
        if (t->has_decoder) {
            rc = kiln_decode_chain(t->dec, t->ndec, &toks, &out);
        } else { /* no decoder: HF joins the tokens with spaces */
            for (size_t i = 0; i < toks.n && !rc; i++) {
                if (i) rc = kiln_buf_putc(&out, ' ');
                if (!rc) rc = kiln_buf_put(&out, toks.text.p + toks.v[i].off, toks.v[i].len);
            }
            if (!rc) rc = kiln_buf_put(&out, "", 0);
        }
    }
    kiln_pieces_free(&toks);
    if (rc) {
        kiln_buf_free(&out);
        return kiln_errorf(KILN_ENOMEM, "decode: out of memory");
    }
    *text = out.p;
    if (len) *len = out.n;
    return NULL;
}
