/* The BPE model of tokenizer.json ("model": {"type": "BPE", ...}) and HF's encoding of one word:
 *
 *  1. each character becomes its vocab id; an unknown one becomes its <0xNN> byte tokens with
 *     byte_fallback, else the unk token (consecutive ones fused with fuse_unk), else nothing;
 *  2. adjacent pairs are merged lowest merge rank first (ties: leftmost), with a priority queue
 *     that is checked lazily against the current symbols, exactly as tokenizers' Word::merge_all;
 *  3. with ignore_merges a word that is itself in the vocabulary is one token.
 *
 * Words are cached (sharded, each shard under its own mutex) so encoding is thread-safe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/json.h"
#include "heap.h"
#include "tokenizer_internal.h"

#define CACHE_SHARDS 64
#define CACHE_SHARD_CAP 4096
#define CACHE_MAX_WORD 256

typedef struct {
    char *key;
    size_t klen;
    int64_t *ids;
    size_t n;
} cache_entry;

typedef struct {
    pthread_mutex_t mu;
    kiln_strmap map; /* key -> index into entries */
    cache_entry *entries;
    size_t n;
} cache_shard;

struct kiln_bpe_cache {
    cache_shard shard[CACHE_SHARDS];
};

static void shard_clear(cache_shard *s) {
    for (size_t i = 0; i < s->n; i++) {
        free(s->entries[i].key);
        free(s->entries[i].ids);
    }
    s->n = 0;
    if (s->map.slots) memset(s->map.slots, 0, s->map.cap * sizeof *s->map.slots);
    s->map.n = 0;
}

static kiln_bpe_cache *cache_new(void) {
    kiln_bpe_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    for (int i = 0; i < CACHE_SHARDS; i++) pthread_mutex_init(&c->shard[i].mu, NULL);
    return c;
}

static void cache_free(kiln_bpe_cache *c) {
    if (!c) return;
    for (int i = 0; i < CACHE_SHARDS; i++) {
        shard_clear(&c->shard[i]);
        kiln_strmap_free(&c->shard[i].map);
        free(c->shard[i].entries);
        pthread_mutex_destroy(&c->shard[i].mu);
    }
    free(c);
}

/* 1 and the ids appended to out on a hit, 0 on a miss, -1 when out of memory. */
static int cache_get(kiln_bpe_cache *c, const char *w, size_t len, uint64_t h, kiln_ids *out) {
    cache_shard *s = &c->shard[h % CACHE_SHARDS];
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    int64_t *idx = kiln_strmap_get(&s->map, w, len);
    if (idx) {
        const cache_entry *e = &s->entries[*idx];
        rc = 1;
        for (size_t i = 0; i < e->n && rc == 1; i++)
            if (kiln_ids_push(out, e->ids[i])) rc = -1;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void cache_put(kiln_bpe_cache *c, const char *w, size_t len, uint64_t h, const int64_t *ids, size_t n) {
    cache_shard *s = &c->shard[h % CACHE_SHARDS];
    cache_entry e = {malloc(len + 1), len, malloc((n ? n : 1) * sizeof *ids), n};
    if (!e.key || !e.ids) {
        free(e.key);
        free(e.ids);
        return;
    }
    memcpy(e.key, w, len);
    if (n) memcpy(e.ids, ids, n * sizeof *ids); /* a word may encode to nothing (ids NULL then) */
    pthread_mutex_lock(&s->mu);
    if (!s->entries) s->entries = malloc(CACHE_SHARD_CAP * sizeof *s->entries);
    if (s->entries && !kiln_strmap_get(&s->map, w, len)) {
        if (s->n == CACHE_SHARD_CAP) shard_clear(s);
        if (kiln_strmap_put(&s->map, e.key, len, (int64_t)s->n, NULL) == 1) {
            s->entries[s->n++] = e;
            e.key = NULL;
            e.ids = NULL;
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(e.key);
    free(e.ids);
}

/* ---------------------------------------------------------------- loading */

const char *kiln_bpe_token(const kiln_bpe *m, int64_t id, size_t *len) {
    if (id < 0 || id >= m->nids || m->tok_off[id] == SIZE_MAX) return NULL;
    *len = m->tok_len[id];
    return m->strings.p + m->tok_off[id];
}

static kiln_error *nomem(const char *path) { return kiln_errorf(KILN_ENOMEM, "%s: out of memory", path); }

/* A merge entry: "a b" (exactly one space, as tokenizers' legacy format) or ["a", "b"]. */
static kiln_error *merge_parts(const cJSON *it, size_t i, const char *path, const char **a, size_t *alen,
                               const char **b, size_t *blen) {
    if (cJSON_IsString(it)) {
        const char *s = it->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return kiln_errorf(KILN_EFORMAT, "%s: model.merges[%zu]: \"%s\" is not two tokens separated by one space",
                               path, i, s);
        *a = s;
        *alen = (size_t)(sp - s);
        *b = sp + 1;
        *blen = strlen(sp + 1);
        return NULL;
    }
    if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
        cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
        *a = cJSON_GetArrayItem(it, 0)->valuestring;
        *b = cJSON_GetArrayItem(it, 1)->valuestring;
        *alen = strlen(*a);
        *blen = strlen(*b);
        return NULL;
    }
    return kiln_errorf(KILN_EFORMAT, "%s: model.merges[%zu] must be a string \"a b\" or a pair [\"a\", \"b\"], got %s",
                       path, i, kiln_json_type_name(it));
}

kiln_error *kiln_bpe_load(kiln_bpe *m, const cJSON *model, const char *path) {
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    for (int b = 0; b < 256; b++) m->byte_ids[b] = -1;

    const cJSON *vocab = NULL, *merges = NULL;
    const char *unk = NULL, *prefix = NULL, *suffix = NULL;
    double dropout = 0;
    char ctx[1100];
    snprintf(ctx, sizeof ctx, "%s: model", path);
    KILN_TRY(kiln_json_get_object(model, "vocab", &vocab, 1, ctx));
    KILN_TRY(kiln_json_get_array(model, "merges", &merges, 1, ctx));
    KILN_TRY(kiln_json_get_string(model, "unk_token", &unk, NULL, 0, ctx));
    KILN_TRY(kiln_json_get_string(model, "continuing_subword_prefix", &prefix, NULL, 0, ctx));
    KILN_TRY(kiln_json_get_string(model, "end_of_word_suffix", &suffix, NULL, 0, ctx));
    KILN_TRY(kiln_json_get_double(model, "dropout", &dropout, 0, 0, ctx));
    KILN_TRY(kiln_json_get_bool(model, "byte_fallback", &m->byte_fallback, 0, 0, ctx));
    KILN_TRY(kiln_json_get_bool(model, "fuse_unk", &m->fuse_unk, 0, 0, ctx));
    KILN_TRY(kiln_json_get_bool(model, "ignore_merges", &m->ignore_merges, 0, 0, ctx));
    if (dropout != 0)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: model.dropout %g is not supported (BPE dropout is random)", path,
                           dropout);
    if (prefix && *prefix)
        return kiln_errorf(KILN_EUNSUPPORTED, "%s: model.continuing_subword_prefix \"%s\" is not supported", path,
                           prefix);
    if (suffix && *suffix) {
        /* CLIP: the last character of each word is looked up as char + suffix ("e</w>") */
        if (!(m->suffix = strdup(suffix))) return nomem(path);
        m->suffix_len = strlen(suffix);
    }

    /* vocab */
    int nv = cJSON_GetArraySize(vocab);
    kiln_error *e = NULL;
    int64_t max_id = -1;
    for (const cJSON *it = vocab->child; it; it = it->next) {
        int64_t id = -1;
        if (!kiln_json_int_value(it, &id) || id < 0) {
            char d[64];
            return kiln_errorf(KILN_EFORMAT, "%s: model.vocab[\"%s\"]: id must be a non-negative integer, got %s",
                               path, it->string, kiln_json_describe(it, d, sizeof d));
        }
        if (id >= (int64_t)nv * 4 + 65536)
            return kiln_errorf(KILN_EFORMAT,
                               "%s: model.vocab[\"%s\"]: id %lld is out of range for a vocabulary of %d tokens", path,
                               it->string, (long long)id, nv);
        if (id > max_id) max_id = id;
    }
    m->nids = max_id + 1;
    m->nvocab = nv;
    m->tok_off = malloc((size_t)(m->nids ? m->nids : 1) * sizeof *m->tok_off);
    m->tok_len = malloc((size_t)(m->nids ? m->nids : 1) * sizeof *m->tok_len);
    if (!m->tok_off || !m->tok_len || kiln_strmap_init(&m->vocab, (size_t)nv)) return nomem(path);
    for (int64_t i = 0; i < m->nids; i++) m->tok_off[i] = SIZE_MAX;
    for (const cJSON *it = vocab->child; it; it = it->next) {
        size_t l = strlen(it->string);
        if (l > UINT32_MAX) return kiln_errorf(KILN_EFORMAT, "%s: model.vocab: token too long", path);
        if (kiln_buf_put(&m->strings, it->string, l) || kiln_buf_putc(&m->strings, 0)) return nomem(path);
    }
    size_t off = 0;
    for (const cJSON *it = vocab->child; it; it = it->next) {
        int64_t id = (int64_t)it->valuedouble;
        size_t l = strlen(it->string);
        if (m->tok_off[id] != SIZE_MAX)
            return kiln_errorf(KILN_EFORMAT, "%s: model.vocab: id %lld is given to both \"%s\" and \"%s\"", path,
                               (long long)id, m->strings.p + m->tok_off[id], it->string);
        int r = kiln_strmap_put(&m->vocab, m->strings.p + off, l, id, NULL);
        if (r < 0) return nomem(path);
        if (r == 0) return kiln_errorf(KILN_EFORMAT, "%s: model.vocab: token \"%s\" appears twice", path, it->string);
        m->tok_off[id] = off;
        m->tok_len[id] = (uint32_t)l;
        off += l + 1;
    }

    /* merges: (a, b) -> (rank, id of a+b); a later duplicate pair overrides, as HF's HashMap */
    int nm = cJSON_GetArraySize(merges);
    if (kiln_u64map_init(&m->merges, (size_t)nm)) return nomem(path);
    kiln_buf cat = {0};
    size_t i = 0;
    for (const cJSON *it = merges->child; it && !e; it = it->next, i++) {
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if ((e = merge_parts(it, i, path, &a, &alen, &b, &blen))) break;
        int64_t *ia = kiln_strmap_get(&m->vocab, a, alen), *ib = kiln_strmap_get(&m->vocab, b, blen);
        cat.n = 0;
        if (kiln_buf_put(&cat, a, alen) || kiln_buf_put(&cat, b, blen)) {
            e = nomem(path);
            break;
        }
        int64_t *inew = kiln_strmap_get(&m->vocab, cat.p, cat.n);
        if (!ia || !ib || !inew) {
            e = kiln_errorf(KILN_EFORMAT, "%s: model.merges[%zu]: token \"%.*s\" is not in model.vocab", path, i,
                            (int)(!ia ? alen : !ib ? blen : cat.n), !ia ? a : !ib ? b : cat.p);
            break;
        }
        uint64_t key = ((uint64_t)*ia << 32) | (uint64_t)*ib, val = ((uint64_t)i << 32) | (uint64_t)*inew;
        uint64_t *slot;
        if (kiln_u64map_put(&m->merges, key, val, &slot) < 0) {
            e = nomem(path);
            break;
        }
        *slot = val;
    }
    kiln_buf_free(&cat);
    if (e) return e;

    if (unk) {
        m->unk_token = strdup(unk);
        if (!m->unk_token) return nomem(path);
        int64_t *u = kiln_strmap_get(&m->vocab, unk, strlen(unk));
        m->unk_id = u ? *u : -1;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int64_t *u = kiln_strmap_get(&m->vocab, name, 6);
        m->byte_ids[b] = u ? *u : -1;
    }
    m->cache = cache_new();
    if (!m->cache) return nomem(path);
    return NULL;
}

void kiln_bpe_free(kiln_bpe *m) {
    kiln_buf_free(&m->strings);
    kiln_strmap_free(&m->vocab);
    free(m->tok_off);
    free(m->tok_len);
    kiln_u64map_free(&m->merges);
    free(m->unk_token);
    free(m->suffix);
    cache_free(m->cache);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- the merge loop */

typedef struct {
    uint32_t rank;
    int32_t pos;
    int64_t new_id;
} merge_item;

static int item_before(const void *x, const void *y) {
    const merge_item *a = x, *b = y;
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

typedef struct {
    int64_t *id;
    int32_t *prev, *next;
    size_t *len;
    size_t n, cap;
} word;

static int word_add(word *w, int64_t id, size_t len) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 32;
        int64_t *a = realloc(w->id, cap * sizeof *a);
        if (a) w->id = a;
        int32_t *b = realloc(w->prev, cap * sizeof *b);
        if (b) w->prev = b;
        int32_t *c = realloc(w->next, cap * sizeof *c);
        if (c) w->next = c;
        size_t *d = realloc(w->len, cap * sizeof *d);
        if (d) w->len = d;
        if (!a || !b || !c || !d) return -1;
        w->cap = cap;
    }
    w->id[w->n] = id;
    w->prev[w->n] = (int32_t)w->n - 1;
    w->next[w->n] = -1;
    if (w->n) w->next[w->n - 1] = (int32_t)w->n;
    w->len[w->n] = len;
    w->n++;
    return 0;
}

static void word_free(word *w) {
    free(w->id);
    free(w->prev);
    free(w->next);
    free(w->len);
}

static inline const uint64_t *merge_of(const kiln_bpe *m, int64_t a, int64_t b) {
    return kiln_u64map_get(&m->merges, ((uint64_t)a << 32) | (uint64_t)b);
}

static int merge_all(const kiln_bpe *m, word *w) {
    kiln_heap h = kiln_heap_make(sizeof(merge_item), 64, item_before);
    int rc = 0;
    for (size_t i = 0; i + 1 < w->n && !rc; i++) {
        const uint64_t *mg = merge_of(m, w->id[i], w->id[i + 1]);
        if (mg) rc = kiln_heap_push(&h, &(merge_item){(uint32_t)(*mg >> 32), (int32_t)i, (int64_t)(*mg & 0xFFFFFFFFu)});
    }
    while (h.n && !rc) {
        merge_item top;
        kiln_heap_pop(&h, &top);
        int32_t p = top.pos;
        if (w->len[p] == 0 || w->next[p] < 0) continue;
        int32_t nx = w->next[p];
        const uint64_t *mg = merge_of(m, w->id[p], w->id[nx]);
        if (!mg || (int64_t)(*mg & 0xFFFFFFFFu) != top.new_id) continue; /* stale */
        w->id[p] = top.new_id;
        w->len[p] += w->len[nx];
        w->next[p] = w->next[nx];
        w->len[nx] = 0;
        if (w->next[nx] >= 0) w->prev[w->next[nx]] = p;
        if (w->prev[p] >= 0) {
            int32_t pv = w->prev[p];
            if ((mg = merge_of(m, w->id[pv], w->id[p])))
                rc = kiln_heap_push(&h, &(merge_item){(uint32_t)(*mg >> 32), pv, (int64_t)(*mg & 0xFFFFFFFFu)});
        }
        if (!rc && w->next[p] >= 0) {
            if ((mg = merge_of(m, w->id[p], w->id[w->next[p]])))
                rc = kiln_heap_push(&h, &(merge_item){(uint32_t)(*mg >> 32), p, (int64_t)(*mg & 0xFFFFFFFFu)});
        }
    }
    kiln_heap_free(&h);
    return rc;
}

kiln_error *kiln_bpe_tokenize(const kiln_bpe *m, const char *s, size_t len, kiln_ids *out) {
    if (len == 0) return NULL;
    if (m->ignore_merges) {
        int64_t *id = kiln_strmap_get(&m->vocab, s, len);
        if (id) return kiln_ids_push(out, *id) ? kiln_errorf(KILN_ENOMEM, "encode: out of memory") : NULL;
    }
    uint64_t h = 0;
    int cacheable = len <= CACHE_MAX_WORD && m->cache;
    if (cacheable) {
        h = kiln_hash_bytes(s, len);
        int r = cache_get(m->cache, s, len, h >> 7, out);
        if (r < 0) return kiln_errorf(KILN_ENOMEM, "encode: out of memory");
        if (r == 1) return NULL;
    }
    word w = {0};
    kiln_error *e = NULL;
    int64_t unk = -1;
    size_t unk_len = 0;
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t cl = kiln_utf8_len((unsigned char)s[i]);
        if (i + cl > len) cl = len - i;
        int64_t *id;
        if (m->suffix && i + cl >= len) {
            /* HF merge_word: the word's last character carries end_of_word_suffix */
            kiln_buf t = {0};
            if (kiln_buf_put(&t, s + i, cl) || kiln_buf_put(&t, m->suffix, m->suffix_len)) {
                kiln_buf_free(&t);
                rc = -1;
                break;
            }
            id = kiln_strmap_get(&m->vocab, t.p, t.n);
            kiln_buf_free(&t);
        } else {
            id = kiln_strmap_get(&m->vocab, s + i, cl);
        }
        if (id) {
            if (unk >= 0) {
                rc = word_add(&w, unk, unk_len);
                unk = -1;
            }
            if (!rc) rc = word_add(&w, *id, cl);
        } else {
            int done = 0;
            if (m->byte_fallback) {
                done = 1;
                for (size_t k = 0; k < cl; k++)
                    if (m->byte_ids[(unsigned char)s[i + k]] < 0) done = 0;
                for (size_t k = 0; k < cl && done && !rc; k++) rc = word_add(&w, m->byte_ids[(unsigned char)s[i + k]], 1);
            }
            if (!done && m->unk_token) {
                if (m->unk_id < 0) {
                    e = kiln_errorf(KILN_EINVAL, "encode: model.unk_token \"%s\" is not in the vocabulary", m->unk_token);
                    break;
                }
                if (unk >= 0 && m->fuse_unk) {
                    unk_len += cl;
                } else {
                    if (unk >= 0) rc = word_add(&w, unk, unk_len);
                    unk = m->unk_id;
                    unk_len = cl;
                }
            }
        }
        i += cl;
    }
    if (!e && !rc && unk >= 0) rc = word_add(&w, unk, unk_len);
    if (!e && !rc) rc = merge_all(m, &w);
    if (!e && !rc) {
        size_t start = out->n;
        for (size_t i = 0; i < w.n && !rc; i++)
            if (w.len[i]) rc = kiln_ids_push(out, w.id[i]);
        /* no ids at all (every piece empty): out->v may still be NULL, not to be offset */
        if (!rc && cacheable) cache_put(m->cache, s, len, h >> 7, out->n > start ? out->v + start : NULL, out->n - start);
    }
    if (!e && rc) e = kiln_errorf(KILN_ENOMEM, "encode: out of memory");
    word_free(&w);
    return e;
}
